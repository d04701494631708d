"""Loopback load test of both servers with bad requests mixed in (issue 11, item 4).

``--clients`` threads each hold one keep-alive connection (an ``httpx.Client`` limited to one connection) to
``prorag serve`` (:func:`prorag.serving.create_app` over the tiny random Llama, 2 new tokens per request) and to the
retrieval server (:func:`prorag.retrieval.server.create_app` over BM25 on 500 real HotpotQA passages). Each
client sends ``--requests`` valid requests, and after each valid one a bad request on the same connection,
cycling through :data:`BAD_REQUESTS` (a lone surrogate, JSON nested 100 000 deep, 40 levels deep, invalid
UTF-8, a ``text/plain`` body, a foreign ``Host``). Reported per server: valid requests that failed (must be 0),
bad requests not answered with a 4xx (must be 0), connections the server closed, and the latency p50/p99 of the
valid requests. Output: a table, ``data/08_reporting/server_load_benchmark.csv`` and ``.md``, and with
``--json`` the figures as JSON (the test ``tests/serving/test_request_guard.py`` runs a small version).

    .venv/bin/python benchmarks/server_load.py --clients 32 --requests 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import torch
from rich.console import Console
from rich.progress import Progress

from prorag.data import load_passages
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.retrieval import BM25Retriever, PassageStore
from prorag.retrieval.server import BackgroundServer
from prorag.retrieval.server import create_app as create_retrieval_app
from prorag.serving import create_app, serve_in_thread
from report import ROOT, Row, write_report  # benchmarks/report.py

CORPUS = ROOT / "data" / "01_raw" / "corpus" / "hotpotqa.jsonl"
JSON = {"content-type": "application/json"}

BadRequest = tuple[str, bytes, dict[str, str]]
"""(name, body template with ``FIELD`` for the server's string field, extra headers)."""
BAD_REQUESTS: list[BadRequest] = [
    ("lone surrogate", b'"\\ud800 x"', JSON),
    ("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000, JSON),
    ("nested 40 deep", b"[" * 40 + b'"x"' + b"]" * 40, JSON),
    ("invalid UTF-8", b'"caf\xe9"', JSON),
    ("text/plain body", b'"hello"', {"content-type": "text/plain"}),
    ("foreign Host", b'"hello"', {**JSON, "host": "evil.example:80"}),
]


@dataclass
class Target:
    """One server under load: where to post and how to wrap a string value into a request body."""

    name: str
    url: str
    wrap: Callable[[bytes], bytes]
    valid: bytes
    latencies: list[float] = field(default_factory=list)
    valid_failed: int = 0
    bad_not_4xx: int = 0
    bad_sent: int = 0
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def client_loop(target: Target, requests: int, offset: int) -> None:
    """One client: valid and bad requests alternating on one keep-alive connection."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(timeout=60.0, limits=limits) as client:
        for number in range(requests):
            started = time.perf_counter()
            try:
                response = client.post(target.url, content=target.valid, headers=JSON)
                ok = response.status_code == 200
                detail = f"{response.status_code} {response.text[:120]}"
            except httpx.HTTPError as error:
                ok, detail = False, f"{type(error).__name__}: {error}"
            elapsed = time.perf_counter() - started
            name, value, headers = BAD_REQUESTS[(offset + number) % len(BAD_REQUESTS)]
            try:
                bad = client.post(target.url, content=target.wrap(value), headers=headers)
                bad_ok = 400 <= bad.status_code < 500
                closed = bad.headers.get("connection", "").lower() == "close"
                bad_detail = f"{name}: {bad.status_code} {bad.text[:120]}"
            except httpx.HTTPError as error:
                bad_ok, closed, bad_detail = False, True, f"{name}: {type(error).__name__}: {error}"
            with target.lock:
                if ok:
                    target.latencies.append(elapsed)
                else:
                    target.valid_failed += 1
                    target.errors.append(f"valid: {detail}")
                target.bad_sent += 1
                target.bad_not_4xx += not bad_ok
                target.reconnects += closed
                if not bad_ok:
                    target.errors.append(bad_detail)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_load(target: Target, clients: int, requests: int, progress: Progress) -> float:
    task = progress.add_task(target.name, total=clients)
    threads = [threading.Thread(target=lambda i=i: (client_loop(target, requests, i), progress.advance(task)))
               for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=20, help="valid requests per client (each with a bad one)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    console = Console()

    generator = TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=32)
    serve_url, stop_serve = serve_in_thread(create_app(generator, "tiny", max_batch_size=32, batch_wait_ms=5,
                                                       max_tokens_limit=8))
    retriever = BM25Retriever.build(PassageStore(load_passages(CORPUS)[:500]))
    retrieval = BackgroundServer(create_retrieval_app(retriever, max_topk=10)).start()
    targets = [
        Target("prorag serve /v1/completions", f"{serve_url}/completions",
               lambda value: b'{"model": "tiny", "max_tokens": 2, "temperature": 0, "prompt": ' + value + b"}",
               json.dumps({"model": "tiny", "prompt": "The capital of France is", "max_tokens": 2,
                           "temperature": 0}).encode()),
        Target("retrieval server /retrieve", f"{retrieval.url}/retrieve",
               lambda value: b'{"topk": 3, "queries": [' + value + b"]}",
               json.dumps({"queries": ["Who wrote Hamlet?"], "topk": 3}).encode()),
    ]
    rows, figures = [], {}
    try:
        with Progress(console=console, transient=True) as progress:
            for target in targets:
                seconds = run_load(target, args.clients, args.requests, progress)
                valid = args.clients * args.requests
                p50, p99 = quantile(target.latencies, 0.5) * 1000, quantile(target.latencies, 0.99) * 1000
                figures[target.name] = {
                    "valid_sent": valid, "valid_failed": target.valid_failed, "bad_sent": target.bad_sent,
                    "bad_not_4xx": target.bad_not_4xx, "connections_closed_by_server": target.reconnects,
                    "p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "seconds": round(seconds, 3),
                    "errors": target.errors[:10]}
                rows.append(Row(target.name, f"{args.clients} clients, keep-alive", valid + target.bad_sent,
                                "requests", seconds,
                                note=f"valid failed {target.valid_failed}/{valid}; bad not 4xx "
                                     f"{target.bad_not_4xx}/{target.bad_sent}; closed {target.reconnects}; "
                                     f"valid p50 {p50:.1f} ms, p99 {p99:.1f} ms"))
    finally:
        stop_serve()
        retrieval.stop()
    write_report(rows, name="server_load", heading="Server load with bad requests mixed in",
                 title=f"{args.clients} loopback clients x {args.requests} valid + {args.requests} bad requests "
                       "each, per server (2-core CPU)",
                 command=" ".join(["benchmarks/server_load.py", *(argv if argv is not None else sys.argv[1:])]),
                 output_dir=args.output_dir, console=console)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    failed = any(f["valid_failed"] or f["bad_not_4xx"] or f["connections_closed_by_server"]
                 for f in figures.values())
    for name, figure in figures.items():
        for error in figure["errors"]:
            console.print(f"[red]{name}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
