"""Limits both servers enforce while they read a request (issue 32, bugs 4 and 5, half-sent requests): a JSON integer
over Python's 4,300-digit limit is a 400 naming the field on a connection that stays open; a chunked body is refused
with 413 as soon as it passes the size limit, not after it was buffered whole; a body that stops arriving gets a
408 after ``body_timeout_s``."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from prorag.data import load_passages
from prorag.retrieval import BM25Retriever, PassageStore
from prorag.retrieval.server import BackgroundServer
from prorag.retrieval.server import create_app as create_retrieval_app
from prorag.serving import create_app, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
JSON = {"Content-Type": "application/json"}
DIGITS = "9" * 5000


@pytest.fixture(scope="module")
def retrieval_url() -> Iterator[str]:
    passages = load_passages(ROOT / "data" / "01_raw" / "corpus" / "hotpotqa.jsonl")[:50]
    with BackgroundServer(create_retrieval_app(BM25Retriever.build(PassageStore(passages)), max_body_bytes=1 << 20,
                                               **_timeout(1.0))) as server:
        yield server.url


def _timeout(seconds: float) -> dict[str, float]:
    """``body_timeout_s`` where the server takes it (the test then fails on the missing 408, not a TypeError)."""
    import inspect

    return {"body_timeout_s": seconds} if "body_timeout_s" in inspect.signature(create_app).parameters else {}


@pytest.fixture(scope="module")
def strict_serve_url(tiny_generator) -> Iterator[str]:
    url, stop = serve_in_thread(create_app(tiny_generator, "tiny", max_tokens_limit=8, max_body_bytes=1 << 20,
                                           **_timeout(1.0)))
    yield url
    stop()


def _post(connection: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, str]:
    connection.request("POST", path, body=body, headers=JSON)
    response = connection.getresponse()
    return response.status, response.read().decode()


@pytest.mark.parametrize("server", ["serve", "retrieval"])
def test_a_5000_digit_integer_is_a_400_naming_the_field_and_the_connection_stays(server, strict_serve_url,
                                                                               retrieval_url):
    if server == "serve":
        url, path = strict_serve_url, urlsplit(strict_serve_url).path + "/completions"
        bad, valid, field = f'{{"prompt": "hi", "max_tokens": {DIGITS}}}', '{"prompt": "hi", "max_tokens": 1}', \
            "max_tokens"
        nested, where = f'{{"prompt": [[1, {DIGITS}]]}}', "body.prompt[0][1]"
    else:
        url, path = retrieval_url, "/retrieve"
        bad, valid, field = f'{{"queries": ["Hamlet"], "topk": {DIGITS}}}', '{"queries": ["Hamlet"]}', "topk"
        nested, where = f'{{"queries": ["Hamlet"], "options": [[-{DIGITS}]]}}', "body.options[0][0]"
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        assert _post(connection, path, valid.encode())[0] == 200
        sock = connection.sock
        status, answer = _post(connection, path, bad.encode())
        assert status == 400 and f"body.{field}" in answer and "5000 digits" in answer, answer
        assert _post(connection, path, valid.encode())[0] == 200 and connection.sock is sock
        status, answer = _post(connection, path, nested.encode())
        assert status == 400 and f"{where}: an integer of 5000 digits" in answer, answer
    finally:
        connection.close()


def _raw_request(url: str, path: str, head: dict[str, str]) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.hostname}", "Content-Type: application/json",
             *(f"{key}: {value}" for key, value in head.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _status(sock: socket.socket) -> int:
    reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    return int(reply.split()[1])


@pytest.mark.parametrize("server", ["serve", "retrieval"])
def test_a_chunked_body_is_refused_once_it_passes_the_limit_not_after_it_was_read_whole(server, strict_serve_url,
                                                                                      retrieval_url):
    url, path = ((strict_serve_url, urlsplit(strict_serve_url).path + "/completions") if server == "serve"
                 else (retrieval_url, "/retrieve"))
    sock = _raw_request(url, path, {"Transfer-Encoding": "chunked"})
    chunk = b"x" * (256 << 10)
    try:
        for _ in range(6):  # 1.5 MiB over a 1 MiB limit; the body never ends
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        sock.settimeout(5)
        assert _status(sock) == 413  # the server answered without waiting for the end of the body
    finally:
        sock.close()


@pytest.mark.parametrize("server", ["serve", "retrieval"])
def test_a_half_sent_body_gets_a_408_after_the_body_timeout(server, strict_serve_url, retrieval_url):
    url, path = ((strict_serve_url, urlsplit(strict_serve_url).path + "/completions") if server == "serve"
                 else (retrieval_url, "/retrieve"))
    sock = _raw_request(url, path, {"Content-Length": "100"})
    try:
        sock.sendall(b'{"prompt": ')
        started = time.monotonic()
        sock.settimeout(8)
        assert _status(sock) == 408
        assert time.monotonic() - started < 5
    finally:
        sock.close()


def test_limits_answers_name_the_setting(strict_serve_url):
    parts = urlsplit(strict_serve_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    status, answer = _post(connection, urlsplit(strict_serve_url).path + "/completions",
                           json.dumps({"prompt": "x" * (2 << 20)}).encode())
    connection.close()
    assert status == 413 and "max_body_bytes" in answer
