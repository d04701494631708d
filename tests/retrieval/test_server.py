"""The retrieval server on a free loopback port (uvicorn.Server on a thread), queried by client and httpx."""

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from prorag.retrieval import BM25Retriever, PassageStore, RetrievalClient, RetrievalError, RetrievalServerError
from prorag.retrieval.server import BackgroundServer, create_app, start_background_server


class Counting:
    """Wraps a retriever, counting search calls; optionally slow, optionally failing on a magic query."""

    def __init__(self, inner, delay: float = 0.0) -> None:
        self.inner = inner
        self.delay = delay
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.inner)

    def search(self, queries, k):
        with self.lock:
            self.calls.append((len(queries), k))
        if any(query == "EXPLODE" for query in queries):
            raise RuntimeError("index on fire")
        time.sleep(self.delay)
        return self.inner.search(queries, k)


@pytest.fixture(scope="module")
def bm25(hotpot_passages):
    return BM25Retriever.build(PassageStore(hotpot_passages[:500]))


@pytest.fixture(scope="module")
def server(bm25):
    retriever = Counting(bm25)
    with BackgroundServer(
        create_app(retriever, max_queries=8, max_topk=50, default_topk=3, max_body_bytes=4096)
    ) as running:
        running.retriever = retriever
        yield running


@pytest.fixture(scope="module")
def client(server):
    with RetrievalClient(server.url, timeout=10) as remote:
        yield remote


def test_binds_loopback_on_a_free_port(server):
    assert server.host == "127.0.0.1" and server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["passages"] == 500 and health["max_topk"] == 50


def test_client_matches_the_local_retriever(client, bm25):
    queries = ["Harvey Pekar comic book", "Denise Levertov poet", "zzqxv"]
    remote, local = client.search(queries, 4), bm25.search(queries, 4)
    assert remote == [[hit for hit in row] for row in local]  # ids, titles, texts and scores survive the trip
    assert remote[2] == []
    assert client.search([], 3) == []
    many = [f"film {index}" for index in range(20)]  # more than max_queries=8: the client splits requests
    assert [[hit.id for hit in row] for row in client.search(many, 2)] == [
        [hit.id for hit in row] for row in bm25.search(many, 2)
    ]


def test_search_r1_wire_format(server, bm25):
    with_scores = httpx.post(
        f"{server.url}/retrieve", json={"queries": ["Harvey Pekar"], "topk": 2, "return_scores": True}
    )
    assert with_scores.status_code == 200
    [[first, second]] = with_scores.json()["result"]
    expected = bm25.search(["Harvey Pekar"], 2)[0]
    assert first["document"]["id"] == expected[0].id and first["document"]["contents"] == expected[0].contents
    assert first["score"] == pytest.approx(expected[0].score) and first["score"] >= second["score"]
    bare = httpx.post(f"{server.url}/retrieve", json={"queries": ["Harvey Pekar", "Levertov"]}).json()
    assert len(bare["result"]) == 2 and len(bare["result"][0]) == 3  # default topk
    assert "score" not in bare["result"][0][0] and bare["result"][0][0]["id"] == expected[0].id


BAD_REQUESTS = [
    ({"queries": []}, 422, "non-empty list"),
    ({"queries": [""]}, 422, r"queries\[0\]: empty query"),
    ({"queries": ["ok", "   "]}, 422, r"queries\[1\]: empty query"),
    ({"queries": ["q"], "topk": 0}, 422, "topk: must be between 1 and 50"),
    ({"queries": ["q"], "topk": -3}, 422, "topk: must be between 1 and 50"),
    ({"queries": ["q"], "topk": 10**12}, 422, "topk: must be between 1 and 50"),
    ({"queries": "just a string"}, 422, "queries: Input should be a valid list"),
    ({"queries": [1, 2]}, 422, r"queries\[0\]: Input should be a valid string"),
    ({"queries": ["q"], "topk": "3"}, 422, "topk: Input should be a valid integer"),
    ({"queries": ["q"], "topk": 2.5}, 422, "topk: Input should be a valid integer"),
    ({"queries": ["q"], "topk": True}, 422, "topk: Input should be a valid integer"),
    ({"queries": ["q"], "return_scores": "yes"}, 422, "return_scores: Input should be a valid boolean"),
    ({"topk": 3}, 422, "queries: Field required"),
    ([["q"]], 422, "body must be a JSON object"),
    ({"queries": ["q"] * 9}, 413, "9 queries exceed the limit of 8"),
    ({"queries": ["x" * 5000]}, 413, "exceeds the limit of 4096 bytes"),
]


@pytest.mark.parametrize(("payload", "status", "message"), BAD_REQUESTS)
def test_bad_requests_get_clear_4xx_and_the_server_stays_up(server, payload, status, message):
    response = httpx.post(f"{server.url}/retrieve", json=payload)
    assert response.status_code == status
    assert re.search(message, response.json()["detail"]), response.json()["detail"]
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["film"], "topk": 1}).status_code == 200


@pytest.mark.parametrize("body", [b"{not json", b"", b"\xff\xfe", b'{"queries": ["a"]'])
def test_malformed_json_is_400(server, body):
    response = httpx.post(f"{server.url}/retrieve", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "malformed JSON" in response.json()["detail"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_streamed_oversized_body_is_413(server):
    def chunks():
        yield b'{"queries": ["'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"]}'

    response = httpx.post(f"{server.url}/retrieve", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "exceeds the limit of 4096 bytes" in response.json()["detail"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_client_raises_with_the_server_message(client, server):
    with pytest.raises(RetrievalServerError, match="422: topk: must be between 1 and 50, got 500") as caught:
        client.search(["film"], 500)
    assert caught.value.status_code == 422
    with pytest.raises(RetrievalServerError, match=r"queries\[0\]: empty query"):
        client.search([""], 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        client.search(["film"], 0)  # rejected locally, before any request
    assert client.health()["status"] == "ok"


def test_retriever_failure_is_500_and_the_server_survives(server):
    response = httpx.post(f"{server.url}/retrieve", json={"queries": ["EXPLODE"]})
    assert response.status_code == 500 and "index on fire" in response.json()["detail"]
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["film"]}).status_code == 200


def test_a_failing_request_does_not_fail_the_requests_batched_with_it(bm25):
    retriever = Counting(bm25, delay=0.05)
    with BackgroundServer(create_app(retriever, batch_window_ms=30)) as running:
        payloads = [{"queries": ["EXPLODE" if index == 3 else f"film {index}"]} for index in range(8)]
        with ThreadPoolExecutor(8) as pool:
            statuses = list(
                pool.map(lambda body: httpx.post(f"{running.url}/retrieve", json=body).status_code, payloads)
            )
    assert statuses == [200, 200, 200, 500, 200, 200, 200, 200]
    assert max(size for size, _ in retriever.calls) > 1  # they were batched, then retried one by one


def test_unreachable_server_is_a_clear_error():
    with BackgroundServer(create_app(Counting(None))) as short_lived:
        url = short_lived.url
    with RetrievalClient(url, timeout=2, retries=0) as dead, pytest.raises(RetrievalError, match="cannot reach"):
        dead.search(["q"], 1)


def test_concurrent_requests_are_micro_batched(bm25):
    retriever = Counting(bm25, delay=0.05)
    running = start_background_server(retriever, batch_window_ms=20)
    try:
        queries = [f"film number {index}" for index in range(32)]
        expected = bm25.search(queries, 3)
        with RetrievalClient(running.url) as remote, ThreadPoolExecutor(16) as pool:
            topks = [3 if index % 4 else 5 for index in range(32)]  # two different topk in flight
            answers = list(pool.map(lambda pair: remote.search([pair[0]], pair[1]), zip(queries, topks, strict=True)))
            stats = remote.health()["batching"]
        for query_index, (answer, k) in enumerate(zip(answers, topks, strict=True)):
            assert [hit.id for hit in answer[0]] == [hit.id for hit in bm25.search([queries[query_index]], k)[0]]
        assert [hit.id for hit in answers[1][0]] == [hit.id for hit in expected[1]]
        assert stats["requests"] == 32 and stats["queries"] == 32
        assert stats["search_calls"] == len(retriever.calls) < 32  # requests were gathered into batches
        assert max(size for size, _ in retriever.calls) > 1
        assert all(k in (3, 5) for _, k in retriever.calls)
    finally:
        running.stop()


def test_command_line_server_serves_an_index_directory(tmp_path, hotpot_passages):
    import socket
    import subprocess
    import sys

    from prorag.retrieval import HashingEmbedder, build_retrieval_index, save_index_dir

    index = build_retrieval_index(
        hotpot_passages[:50], embedder=HashingEmbedder(64, show_progress=False), show_progress=False
    )
    save_index_dir(tmp_path / "index", index)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prorag.retrieval.server",
            "--index-dir",
            str(tmp_path / "index"),
            "--retriever",
            "hybrid",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with RetrievalClient(f"http://127.0.0.1:{port}", timeout=5) as remote:
            deadline = time.monotonic() + 60
            while True:
                try:
                    health = remote.health()
                    break
                except RetrievalServerError:
                    raise
                except RetrievalError:
                    assert process.poll() is None, process.stdout.read().decode()
                    assert time.monotonic() < deadline, "server did not come up"
                    time.sleep(0.2)
            assert health["retriever"] == "HybridRetriever" and health["info"]["passage_count"] == 50
            assert remote.search(["Harvey Pekar American Splendor"], 3)[0][0].id == "hotpotqa-1"
    finally:
        process.terminate()
        process.wait(10)


def test_access_log_hides_a_key_in_the_query_string_and_idle_connections_are_closed(bm25):
    """Issue 47: bug 10 (the access log showed ``?api_key=…`` in clear) and the weak point "idle connections and
    unfinished headers are held forever"."""
    import io
    import logging
    import socket

    app = create_app(Counting(bm25), header_timeout_s=1.0, keep_alive_timeout_s=1.0)
    with BackgroundServer(app, log_level="info", access_log=True) as running:
        log = io.StringIO()
        for handler in logging.getLogger("uvicorn.access").handlers:
            handler.setStream(log)
        reply = httpx.post(running.url + "/retrieve?api_key=sk-secret-QUERY-3", json={"queries": ["a"]}, timeout=10)
        assert reply.status_code == 200
        with socket.create_connection(("127.0.0.1", running.port)) as sock:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # half a header, then silence
            sock.settimeout(6)
            started = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 4
    line = log.getvalue()
    assert "POST /retrieve?api_key=*** HTTP/1.1" in line and "sk-secret" not in line, line


FD_LIMITED_SERVER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from prorag.data.records import Passage
from prorag.retrieval import BM25Retriever, PassageStore
from prorag.retrieval.server import start_background_server
passages = [Passage(f"p{i}", f"T{i}", f"passage number {i} about topic {i % 7}") for i in range(50)]
server = start_background_server(BM25Retriever.build(PassageStore(passages)))
print(server.port, flush=True)
sys.stdin.read()
"""


def test_400_idle_connections_do_not_lock_clients_out_of_a_server_with_256_descriptors():
    """Issue 47's weak point, reproduced as the review did (``ulimit -n 256``, 400 idle TCP connections): every new
    client got ``ConnectionResetError``. The default connection cap (the descriptor limit less 64) makes the
    longest-idle connection room for a newcomer."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    process = subprocess.Popen([sys.executable, "-c", FD_LIMITED_SERVER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": src})
    idle: list[socket.socket] = []
    try:
        port = int(process.stdout.readline())
        for _ in range(400):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.0)
        answers = []
        for _ in range(5):
            try:
                answers.append(httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["topic 3"]},
                                          timeout=5).status_code)
            except httpx.TransportError as error:
                answers.append(type(error).__name__)
        assert answers == [200] * 5, answers
    finally:
        for sock in idle:
            sock.close()
        process.kill()
        process.wait(10)
