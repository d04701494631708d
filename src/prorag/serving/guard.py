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
