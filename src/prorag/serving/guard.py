"""Request checks shared by the project's two HTTP servers (``prorag serve`` and the retrieval server).

Every bad request gets a 4xx answer and never an exception that would become a 500 and drop the keep-alive
connection: a body that is not ``application/json`` (415), malformed JSON, JSON nested deeper than
:data:`MAX_JSON_DEPTH`, an integer longer than :data:`MAX_INT_DIGITS` digits (Python refuses to convert one over
4,300 digits with a bare ``ValueError``), or a string holding a lone surrogate such as ``"\\ud800"`` (400; such a
string cannot be encoded, tokenized or echoed back). :func:`read_body` reads a body chunk by chunk and stops at the
size limit (413) however the body is sent (``Content-Length`` or chunked), and at ``timeout_s`` without a chunk
(408: a half-sent request does not hold a connection and its buffer forever). The limits are documented in
``docs/serving.md``. A server bound to a loopback address answers only requests whose ``Host`` is a
loopback name (Starlette's ``TrustedHostMiddleware``), so a web page cannot drive an unkeyed local server through
the browser (DNS rebinding).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
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


async def read_body(request: Request, *, max_bytes: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The request body, read chunk by chunk: :class:`BadRequestBody` 413 as soon as it (declared or received)
    exceeds ``max_bytes`` — a chunked body is never buffered past the limit — and 408 when no chunk arrives for
    ``timeout_s`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BadRequestBody(413, f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes "
                                  "(max_body_bytes)")
    chunks: list[bytes] = []
    received = 0
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout_s)
        except StopAsyncIteration:
            break
        except TimeoutError:
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
        raise BadRequestBody(400, f"JSON nested too deeply (more than {max_depth} levels)") from None
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
                                      f"{max_int_digits} digits")
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise BadRequestBody(400, f"JSON nested too deeply (more than {max_depth} levels) at {where}")
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


def timed_http_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol class (httptools when installed, else h11) with a header timeout: the connection
    is closed when a request's headers are not complete ``header_timeout_s`` after the connection opened or the
    previous reply ended. Pass the class as ``uvicorn.Config(http=…)``."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s}")
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
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

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

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
    """The command-line options of :func:`server_config`'s connection timeouts, shared by both servers."""
    parser.add_argument("--keep-alive-timeout-s", type=float, default=KEEP_ALIVE_TIMEOUT_S,
                        help="close a keep-alive connection idle this long after a reply (default: %(default)s)")
    parser.add_argument("--header-timeout-s", type=float, default=HEADER_TIMEOUT_S,
                        help="close a connection whose request headers are not complete this long after it opened "
                             "or after its previous reply (default: %(default)s)")


def server_config(app: Any, *, host: str, port: int, log_level: str = "info", access_log: bool = True,
                  keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S, header_timeout_s: float = HEADER_TIMEOUT_S,
                  **options: Any) -> Any:
    """The ``uvicorn.Config`` both servers run with: redacted logs (:func:`redacted_log_config`), the keep-alive
    timeout and the header timeout (:func:`timed_http_protocol`)."""
    import uvicorn

    if not keep_alive_timeout_s > 0:
        raise ValueError(f"keep_alive_timeout_s must be > 0, got {keep_alive_timeout_s}")
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                          log_config=redacted_log_config(), timeout_keep_alive=keep_alive_timeout_s,  # type: ignore[arg-type]
                          http=timed_http_protocol(header_timeout_s), **options)
