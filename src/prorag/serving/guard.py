"""Request checks shared by the project's two HTTP servers (``prorag serve`` and the retrieval server).

Every bad request gets a 4xx answer and never an exception that would become a 500 and drop the keep-alive
connection: a body that is not ``application/json`` (415), malformed JSON, JSON nested deeper than
:data:`MAX_JSON_DEPTH`, an integer longer than :data:`MAX_INT_DIGITS` digits (Python refuses to convert one over
4,300 digits with a bare ``ValueError``), or a string holding a lone surrogate such as ``"\\ud800"`` (400; such a
string cannot be encoded, tokenized or echoed back). :func:`read_body` reads a body chunk by chunk and stops at the
size limit (413) however the body is sent (``Content-Length`` or chunked), at ``timeout_s`` without a chunk, and
at ``deadline_s`` after its first byte was awaited however it trickles (408: a half-sent request does not hold a
connection and its buffer forever). Every limit is a setting: a ``create_app`` argument of each server and a
command-line option (:func:`add_request_limit_options`, :func:`add_connection_options`); they are documented in
``docs/serving.md``. A server bound to a loopback address answers only requests whose ``Host`` is a
loopback name (Starlette's ``TrustedHostMiddleware``), so a web page cannot drive an unkeyed local server through
the browser (DNS rebinding).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import resource
from dataclasses import dataclass
from typing import Any, Final

from fastapi import FastAPI, Request
from starlette.middleware.trustedhost import TrustedHostMiddleware

LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "::1", "[::1]")
"""Names a loopback-bound server answers to (``Host`` header, port ignored)."""
MAX_JSON_DEPTH: Final = 32
"""Deepest nesting of arrays and objects accepted in a request body (the real requests need 4)."""
MAX_INT_DIGITS: Final = 20
"""Longest integer accepted in a request body, in digits: every 64-bit integer fits (a seed is one; vLLM and the
OpenAI API take no wider integer)."""
BODY_TIMEOUT_S: Final = 30.0
"""Default longest wait for the next chunk of a request body (nginx's ``client_body_timeout`` is 60 s)."""
BODY_DEADLINE_S: Final = 60.0
"""Default longest time to receive a whole request body, however it trickles (a body sent one byte every few
seconds never trips the per-chunk timeout; 8 MiB in 60 s is 140 KB/s)."""


class _LongInt:
    """Stands in for an integer literal longer than the limit until :func:`_check_tree` names its field."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


class BadRequestBody(Exception):
    """A request body that is refused with ``status`` (400 or 415) and ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def is_loopback(host: str) -> bool:
    """Whether the bind address ``host`` is a loopback one (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def restrict_hosts(app: FastAPI, allowed_hosts: tuple[str, ...] | list[str] | None) -> None:
    """Answer 400 to requests whose ``Host`` is not in ``allowed_hosts`` (``None``: any host)."""
    if allowed_hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts), www_redirect=False)


def allowed_hosts_for(bind_host: str) -> tuple[str, ...] | None:
    """The ``Host`` names to accept for a server bound to ``bind_host``: loopback names when it is loopback."""
    return LOOPBACK_HOSTS if is_loopback(bind_host) else None


def check_content_type(content_type: str | None) -> None:
    """Refuse (415) a body that is not declared ``application/json`` (``+json`` media types accepted)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise BadRequestBody(415, f"Content-Type must be application/json, got {media_type or 'none'!r}")


async def read_body(request: Request, *, max_bytes: int, timeout_s: float = BODY_TIMEOUT_S,
                    deadline_s: float = BODY_DEADLINE_S) -> bytes:
    """The request body, read chunk by chunk: :class:`BadRequestBody` 413 as soon as it (declared or received)
    exceeds ``max_bytes`` — a chunked body is never buffered past the limit — and 408 when no chunk arrives for
    ``timeout_s`` seconds or the whole body has not arrived ``deadline_s`` seconds after reading began."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BadRequestBody(413, f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes "
                                  "(max_body_bytes)")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    chunks: list[bytes] = []
    received = 0
    stream = request.stream().__aiter__()
    while True:
        left = deadline - loop.time()
        try:
            if left <= 0:
                raise TimeoutError
            chunk = await asyncio.wait_for(stream.__anext__(), min(timeout_s, left))
        except StopAsyncIteration:
            break
        except TimeoutError:
            if deadline - loop.time() <= 0:
                raise BadRequestBody(408, f"request body not complete within {deadline_s:g} s "
                                          f"(body_deadline_s; {received} bytes received)") from None
            raise BadRequestBody(408, f"request body not received within {timeout_s:g} s of its last chunk "
                                      "(body_timeout_s)") from None
        received += len(chunk)
        if received > max_bytes:
            raise BadRequestBody(413, f"request body exceeds the limit of {max_bytes} bytes (max_body_bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_body(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH, max_int_digits: int = MAX_INT_DIGITS) -> Any:
    """The decoded JSON value of ``raw``, or :class:`BadRequestBody` (400) for malformed JSON, nesting deeper
    than ``max_depth``, an integer longer than ``max_int_digits`` digits or a string (key or value) holding a lone
    surrogate; the message names the field."""

    def parse_int(text: str) -> int | _LongInt:
        digits = len(text) - text.startswith("-")
        return _LongInt(digits) if digits > max_int_digits else int(text)

    try:
        value = json.loads(raw, parse_int=parse_int)
    except RecursionError:
        raise BadRequestBody(400, f"JSON nested too deeply (more than {max_depth} levels, max_json_depth)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadRequestBody(400, f"malformed JSON body: {error}") from None
    _check_tree(value, max_depth, max_int_digits)
    return value


def _check_tree(value: Any, max_depth: int, max_int_digits: int = MAX_INT_DIGITS) -> None:
    """Walk the decoded value without recursion (it may be deep); see :func:`parse_json_body`."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "body")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, _LongInt):
            raise BadRequestBody(400, f"{where[:200]}: an integer of {item.digits} digits exceeds the limit of "
                                      f"{max_int_digits} digits (max_int_digits)")
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise BadRequestBody(400, f"JSON nested too deeply (more than {max_depth} levels, max_json_depth) "
                                          f"at {where}")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key, f"{where} key")
                    stack.append((child, depth + 1, f"{where}.{_printable(key)}"))
            else:
                stack.extend((child, depth + 1, f"{where}[{index}]") for index, child in enumerate(item))


def _printable(text: str) -> str:
    return text[:80].encode("utf-8", "backslashreplace").decode("utf-8")


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise BadRequestBody(400, f"{where[:200]}: invalid Unicode (lone surrogate U+{ord(text[error.start]):04X} "
                                  f"at character {error.start})") from None


# ------------------------------------------------------------------------------ connections and access logs

KEEP_ALIVE_TIMEOUT_S: Final = 5.0
"""Default longest idle time of a keep-alive connection between a reply and the next request (uvicorn's own
default; nginx's ``keepalive_timeout`` is 75 s)."""
HEADER_TIMEOUT_S: Final = 30.0
"""Default longest time from a connection's opening (or its previous reply) to the end of the next request's
headers: a connection that sends nothing, or half a header, is closed after it (nginx's ``client_header_timeout``
is 60 s). uvicorn has no such timeout: its keep-alive timer starts only after a reply and stops at the first byte."""
RESERVED_FDS: Final = 64
"""File descriptors kept free for the server's own files when ``max_connections`` defaults to the process's limit."""


def default_max_connections() -> int:
    """The connection cap when none is set: the soft ``RLIMIT_NOFILE`` less :data:`RESERVED_FDS` (at least 16), so
    connections can never take the last descriptors (``accept`` would then fail for every new client)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(16, soft - RESERVED_FDS)


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection settings of a server, given to its ``create_app`` and applied by :func:`server_config`."""

    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int | None = None
    """Open connections at most; at the cap a new one closes the longest-waiting connection that has no request
    under way (idle keep-alive, or headers unfinished), or is refused with 503 when every one has (None:
    :func:`default_max_connections`)."""

    def __post_init__(self) -> None:
        if not self.keep_alive_timeout_s > 0:
            raise ValueError(f"keep_alive_timeout_s must be > 0, got {self.keep_alive_timeout_s}")
        if not self.header_timeout_s > 0:
            raise ValueError(f"header_timeout_s must be > 0, got {self.header_timeout_s}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


_BUSY_BODY: Final = b'{"detail": "too many connections, each with a request under way; retry later"}'
_BUSY_REPLY: Final = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
                      + f"content-length: {len(_BUSY_BODY)}\r\n\r\n".encode() + _BUSY_BODY)


def timed_http_protocol(header_timeout_s: float, max_connections: int | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol class (httptools when installed, else h11) with a header timeout and a connection
    cap. The connection is closed when a request's headers are not complete ``header_timeout_s`` after the
    connection opened or the previous reply ended. With more than ``max_connections`` open, a new connection closes
    the one waiting longest for its next request's headers (as nginx reuses idle keep-alive connections when it
    runs out), so idle or half-header connections cannot lock clients out; when every other connection has a
    request under way the new one gets 503. Pass the class as ``uvicorn.Config(http=…)``."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s}")
    if max_connections is not None and max_connections < 1:
        raise ValueError(f"max_connections must be >= 1, got {max_connections}")
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _waiting_since = 0.0

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._waiting_since = self.loop.time()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            idle = self.cycle is None or self.cycle.response_complete  # no request under way: idle or half a header
            if idle and not self.transport.is_closing():
                self.transport.close()

        def _headers_done(self) -> None:
            self._disarm_header_timer()

        def _make_room(self) -> None:
            """Over the cap: close the longest-waiting connection without a request under way, else refuse this
            one."""
            waiting = [connection for connection in self.connections
                       if connection is not self and getattr(connection, "_header_timer", None) is not None
                       and not connection.transport.is_closing()]
            if waiting:
                min(waiting, key=lambda connection: connection._waiting_since).transport.close()
            else:
                self._disarm_header_timer()
                self.transport.write(_BUSY_REPLY)
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()
            open_connections = sum(not connection.transport.is_closing() for connection in self.connections)
            if max_connections is not None and open_connections > max_connections:
                self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm_header_timer()  # waiting for the next request (a pipelined one already has its headers)

        # httptools: the parser's callback when a request's headers are complete
        def on_headers_complete(self) -> None:
            self._headers_done()
            super().on_headers_complete()

        # h11: a request's headers are complete when the cycle of a new request starts
        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:
                self._headers_done()

    HeaderTimeoutProtocol.__name__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol


def redacted_log_config() -> dict[str, Any]:
    """uvicorn's logging configuration with :class:`prorag.redaction.RedactingFilter` on each of its handlers, so
    the access log shows ``?api_key=***`` (``uvicorn.run`` installs its own handlers after the command line's
    :func:`~prorag.redaction.install_log_redaction`, which therefore never reaches them)."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact"] = {"()": "prorag.redaction.RedactingFilter"}
    for handler in config.get("handlers", {}).values():
        handler["filters"] = [*handler.get("filters", []), "redact"]
    return config


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The command-line options of :class:`ConnectionLimits`, shared by both servers."""
    parser.add_argument("--keep-alive-timeout-s", type=float, default=KEEP_ALIVE_TIMEOUT_S,
                        help="close a keep-alive connection idle this long after a reply (default: %(default)s)")
    parser.add_argument("--header-timeout-s", type=float, default=HEADER_TIMEOUT_S,
                        help="close a connection whose request headers are not complete this long after it opened "
                             "or after its previous reply (default: %(default)s)")
    parser.add_argument("--max-connections", type=int, default=None,
                        help="open connections at most; at the cap a new one closes the longest-idle one (default: "
                             f"the open-file limit less {RESERVED_FDS})")


def add_request_limit_options(parser: argparse.ArgumentParser) -> None:
    """The command-line options of the JSON and body-deadline limits both servers share (``create_app``'s
    ``max_json_depth``, ``max_int_digits``, ``body_deadline_s``)."""
    parser.add_argument("--max-json-depth", type=int, default=MAX_JSON_DEPTH,
                        help="deepest nesting of a request body (default: %(default)s)")
    parser.add_argument("--max-int-digits", type=int, default=MAX_INT_DIGITS,
                        help="longest integer in a request body, in digits (default: %(default)s)")
    parser.add_argument("--body-deadline-s", type=float, default=BODY_DEADLINE_S,
                        help="longest time to receive a whole request body (default: %(default)s)")


def check_request_limits(*, max_json_depth: int, max_int_digits: int, body_timeout_s: float,
                         body_deadline_s: float) -> None:
    """Refuse request limits no request could meet (``ValueError`` naming the setting)."""
    if max_json_depth < 1 or max_int_digits < 1:
        raise ValueError(f"max_json_depth and max_int_digits must be >= 1, got {max_json_depth}, {max_int_digits}")
    if not body_timeout_s > 0 or not body_deadline_s > 0:
        raise ValueError(f"body_timeout_s and body_deadline_s must be > 0, got {body_timeout_s}, {body_deadline_s}")


def server_config(app: Any, *, host: str, port: int, log_level: str = "info", access_log: bool = True,
                  **options: Any) -> Any:
    """The ``uvicorn.Config`` both servers run with: redacted logs (:func:`redacted_log_config`) and the app's
    :class:`ConnectionLimits` (``app.state.connection_limits``, set by each server's ``create_app``; defaults for
    another ASGI app): the keep-alive timeout, the header timeout and the connection cap
    (:func:`timed_http_protocol`)."""
    import uvicorn

    limits = getattr(getattr(app, "state", None), "connection_limits", None) or ConnectionLimits()
    cap = limits.max_connections if limits.max_connections is not None else default_max_connections()
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                          log_config=redacted_log_config(), timeout_keep_alive=limits.keep_alive_timeout_s,  # type: ignore[arg-type]
                          http=timed_http_protocol(limits.header_timeout_s, cap), **options)
