"""Client deadlines and undecodable replies (issue 47, bugs 2 and 8).

Bug 2: ``timeout`` bounds a whole attempt of every HTTP client — the LLM judge, the OpenAI-compatible backend (policy,
KG extraction) and ``RetrievalClient`` — not only each read: a server that sends its headers and then one body byte
per second fails the attempt at the deadline (it used to be waited on forever).

Bug 8: a 200 reply declared JSON that does not decode (HTML, bytes that are no UTF-8, a 5,000-digit integer,
100,000-deep nesting) is a :class:`GenerationError` naming the endpoint in KG extraction, and a ``RetrievalError``
naming the URL in ``RetrievalClient`` — never a raw ``JSONDecodeError`` / ``RecursionError``.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from prorag.data.records import Passage
from prorag.judges.llm_judge import LLMJudge
from prorag.kg import ExtractionSettings, extract_triplets
from prorag.llm.generation import GenerationError, GenerationTimeoutError, SamplingParams
from prorag.llm.openai_backend import OpenAICompatibleGenerator
from prorag.retrieval.base import RetrievalError
from prorag.retrieval.client import RetrievalClient

BODIES: dict[str, bytes] = {
    "htmljson": b"<!doctype html><html><body>Please sign in</body></html>",
    "garbage": bytes(range(128, 256)) * 4,
    "bigint": b'{"id": "x", "object": "chat.completion", "created": ' + b"7" * 5000 + b', "choices": []}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
}


class LoopbackHandler(socketserver.BaseRequestHandler):
    """``/trickle/…``: 200 with headers at once, then one body byte per second (until the client leaves or 60 s);
    ``/<name>/…`` for a name of :data:`BODIES`: 200 ``application/json`` with that body."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                return
            head += data
        headers, _, body = head.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in headers.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            data = sock.recv(65536)
            if not data:
                return
            body += data
        name = headers.split(b" ", 2)[1].split(b"/")[1].decode()
        try:
            if name == "trickle":
                sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{")
                for _ in range(60):
                    time.sleep(1.0)
                    sock.sendall(b" ")
                return
            reply = BODIES[name]
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(reply)).encode() + b"\r\nconnection: close\r\n\r\n" + reply)
        except OSError:  # the client gave up: what a deadline does
            return


class LoopbackServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    running = LoopbackServer(("127.0.0.1", 0), LoopbackHandler)
    threading.Thread(target=running.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{running.server_address[1]}"
    running.shutdown()
    running.server_close()


# ------------------------------------------------------------------------------------------------------ bug 2


def test_a_judge_on_a_trickling_server_gives_an_unknown_verdict_at_its_deadline(server):
    started = time.monotonic()
    with LLMJudge(f"{server}/trickle/v1", "m", timeout=1.0, max_retries=1) as judge:
        (verdict,) = judge.answer_correct([("q", ["a"], "a")])
    elapsed = time.monotonic() - started
    assert verdict.value is None and verdict.error.startswith("timeout"), verdict
    assert elapsed < 5.0, elapsed  # 2 attempts × 1 s + one backoff (≤ 0.5 s); was: never


@pytest.mark.parametrize("mode", ["chat", "completions"])
def test_the_openai_backend_on_a_trickling_server_times_out_at_its_deadline(server, mode):
    url = f"{server}/trickle/v1"
    started = time.monotonic()
    with OpenAICompatibleGenerator(url, "m", mode=mode, timeout=1.0, max_retries=1) as generator, \
            pytest.raises(GenerationTimeoutError) as raised:
        generator.generate(["hello"], SamplingParams(max_new_tokens=4))
    elapsed = time.monotonic() - started
    assert url in str(raised.value) and elapsed < 5.0, (elapsed, raised.value)


def test_kg_extraction_on_a_trickling_server_times_out_at_its_deadline(server):
    url = f"{server}/trickle/v1"
    chunk = Passage(id="p1", title="Town 1", text="Town 1 lies on river R1.")
    settings = ExtractionSettings(model="m", endpoint=url, show_progress=False)
    started = time.monotonic()
    with OpenAICompatibleGenerator(url, "m", mode="chat", timeout=1.0, max_retries=0) as generator, \
            pytest.raises(GenerationTimeoutError):
        extract_triplets(generator, [chunk], settings)
    assert time.monotonic() - started < 4.0


def test_the_retrieval_client_on_a_trickling_server_times_out_at_its_deadline(server):
    started = time.monotonic()
    with RetrievalClient(f"{server}/trickle", timeout=1.0, max_queries_per_request=8) as client, \
            pytest.raises(RetrievalError, match="timed out"):
        client.search(["q"], 3)
    assert time.monotonic() - started < 4.0


# ------------------------------------------------------------------------------------------------------ bug 8


@pytest.mark.parametrize("name", sorted(BODIES))
def test_kg_extraction_given_an_undecodable_json_reply_names_the_endpoint(server, name):
    url = f"{server}/{name}/v1"
    chunk = Passage(id="p1", title="Town 1", text="Town 1 lies on river R1.")
    settings = ExtractionSettings(model="m", endpoint=url, show_progress=False)
    with OpenAICompatibleGenerator(url, "m", mode="chat", timeout=10, max_retries=0) as generator, \
            pytest.raises(GenerationError) as raised:
        extract_triplets(generator, [chunk], settings)
    message = str(raised.value)
    assert url in message and "(chat)" in message and "malformed reply" in message, message
    assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_completions_backend_given_an_undecodable_json_reply_names_the_endpoint(server, name):
    url = f"{server}/{name}/v1"
    with OpenAICompatibleGenerator(url, "m", timeout=10, max_retries=0) as generator, \
            pytest.raises(GenerationError, match="malformed reply") as raised:
        generator.generate(["hello"], SamplingParams(max_new_tokens=4))
    assert url in str(raised.value)


@pytest.mark.parametrize("name", sorted(BODIES))
def test_a_judge_given_an_undecodable_json_reply_returns_an_unknown_verdict(server, name):
    with LLMJudge(f"{server}/{name}/v1", "m", timeout=10, max_retries=0) as judge:
        (verdict,) = judge.answer_correct([("q", ["a"], "a")])
    assert verdict.value is None and verdict.error


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_retrieval_client_given_an_undecodable_json_reply_names_the_url(server, name):
    with RetrievalClient(f"{server}/{name}", timeout=10, max_queries_per_request=8) as client, \
            pytest.raises(RetrievalError, match="malformed response") as raised:
        client.search(["q"], 3)
    assert f"{server}/{name}/retrieve" in str(raised.value)
