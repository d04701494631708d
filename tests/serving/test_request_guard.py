"""Both servers answer bad requests with a 4xx on a connection that stays open (issue 11, item 4): a lone
surrogate, JSON nested too deeply, a body that is not application/json, a foreign Host."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from prorag.data import load_passages
from prorag.retrieval import BM25Retriever, PassageStore
from prorag.retrieval.server import BackgroundServer
from prorag.retrieval.server import create_app as create_retrieval_app
from prorag.serving.guard import allowed_hosts_for, is_loopback

ROOT = Path(__file__).resolve().parents[2]
JSON = {"Content-Type": "application/json"}
# (name, raw body with FIELD standing for the server's string field, headers, expected status)
BAD = [
    ("lone surrogate", b'"\\ud800"', JSON, 400),
    ("surrogate in a key", None, JSON, 400),
    ("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000, JSON, 400),
    ("nested 40 deep", b"[" * 40 + b'"x"' + b"]" * 40, JSON, 400),
    ("text/plain", b'"hello"', {"Content-Type": "text/plain"}, 415),
    ("no content type", b'"hello"', {}, 415),
    ("foreign Host", b'"hello"', {**JSON, "Host": "attacker.example"}, 400),
    ("5000-digit integer", b"9" * 5000, JSON, 400),  # in the string field: still refused before field checks
]


@pytest.fixture(scope="module")
def retrieval_url() -> Iterator[str]:
    passages = load_passages(ROOT / "data" / "01_raw" / "corpus" / "hotpotqa.jsonl")[:50]
    with BackgroundServer(create_retrieval_app(BM25Retriever.build(PassageStore(passages)))) as server:
        yield server.url


def _post(connection: http.client.HTTPConnection, path: str, body: bytes,
          headers: dict[str, str]) -> tuple[int, bytes, str | None]:
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, response.read(), response.getheader("connection")


def _check_server(url: str, path: str, wrap: bytes, valid: dict) -> None:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        status, _, _ = _post(connection, path, json.dumps(valid).encode(), JSON)
        assert status == 200
        socket = connection.sock
        for name, value, headers, expected in BAD:
            body = wrap.replace(b"FIELD", value) if value is not None else b'{"\\udfff": 1}'
            status, answer, closing = _post(connection, path, body, headers)
            assert status == expected, (name, answer)
            assert closing != "close" and connection.sock is socket, f"{name}: the connection was dropped"
            status, answer, _ = _post(connection, path, json.dumps(valid).encode(), JSON)
            assert status == 200 and connection.sock is socket, (name, answer)
    finally:
        connection.close()


def test_openai_server_refuses_bad_requests_with_4xx_and_keeps_the_connection(base_url):
    path = urlsplit(base_url).path + "/completions"
    _check_server(base_url, path, b'{"max_tokens": 1, "prompt": FIELD}',
                  {"prompt": "hello", "max_tokens": 1, "temperature": 0})


def test_retrieval_server_refuses_bad_requests_with_4xx_and_keeps_the_connection(retrieval_url):
    _check_server(retrieval_url, "/retrieve", b'{"queries": [FIELD]}', {"queries": ["Hamlet"], "topk": 2})


def test_errors_name_the_problem(base_url, retrieval_url):
    parts = urlsplit(retrieval_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    status, answer, _ = _post(connection, "/retrieve", b'{"queries": ["\\ud800"]}', JSON)
    assert status == 400 and "body.queries[0]: invalid Unicode (lone surrogate U+D800" in answer.decode()
    status, answer, _ = _post(connection, "/retrieve", b"[" * 50 + b"]" * 50, JSON)
    assert status == 400 and "nested too deeply" in answer.decode()
    connection.close()


def test_loopback_binding_decides_the_allowed_hosts():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("127.evil.example")
    assert allowed_hosts_for("0.0.0.0") is None and "localhost" in allowed_hosts_for("127.0.0.1")


@pytest.mark.integration
@pytest.mark.slow
def test_32_client_load_with_bad_requests_mixed_in_fails_no_valid_request(tmp_path):
    figures_path = tmp_path / "figures.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "server_load.py"), "--clients", "32", "--serve-clients", "32",
         "--requests", "2",
         "--output-dir", str(tmp_path), "--json", str(figures_path)],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    figures = json.loads(figures_path.read_text(encoding="utf-8"))
    assert len(figures) == 2
    for figure in figures.values():
        assert figure["valid_sent"] == 64 and figure["valid_failed"] == 0
        assert figure["bad_sent"] == 64 and figure["bad_not_4xx"] == 0
        assert figure["connections_closed_by_server"] == 0 and figure["connections_dropped"] == 0
    assert (tmp_path / "server_load_benchmark.csv").is_file()
