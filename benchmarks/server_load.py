"""Loopback load test of both servers with bad requests mixed in (issue 11, item 4).

``--clients`` threads each hold one keep-alive connection (an ``httpx.Client`` limited to one connection) to
``prorag serve`` (:func:`prorag.serving.create_app` over the tiny random Llama, 2 new tokens per request) and to the
retrieval server (:func:`prorag.retrieval.server.create_app` over BM25 on 500 real HotpotQA passages). Each
client sends ``--requests`` valid requests, and after each valid one a bad request on the same connection,
cycling through :data:`BAD_REQUESTS` (a lone surrogate, JSON nested 100 000 deep, 40 levels deep, invalid
UTF-8, a ``text/plain`` body, a foreign ``Host``, a 5,000-digit integer in the server's integer field: ``topk`` or
``max_tokens``). ``--serve-clients`` (default 16) load ``prorag serve``, ``--clients`` (default 32) the retrieval
server (issue 32's setting). Reported per server: valid requests that failed (must be 0), bad requests not answered
with a 4xx (must be 0), connections the server closed, and the latency p50/p99 of the valid requests.

Heavy clients (``--heavy-clients N``, issue 47): N more clients of ``prorag serve`` each send, over and over while
the load runs, a request that is within the limits but heavy (``--heavy-body``, default one prompt × ``n`` = 16 ×
``max_tokens`` = 1,024) and give up after ``--heavy-timeout-s`` (a client that leaves: the server must drop its
work before the next share, or the other clients' valid requests time out). Their outcomes (answered, abandoned)
are reported apart; they are not counted as failures.

Head of line (``--head-of-line``): the wait of one small request sent 50 ms after a maximum-size one (retrieval: the
most queries × the largest ``topk``; ``prorag serve``: 16 prompts × ``n`` = 16, the most sequences a request may
ask, ``max_request_sequences``), against its latency alone. Output: a table,
``data/08_reporting/server_load_benchmark.csv`` and ``.md``, and with ``--json`` the figures as JSON (the test
``tests/serving/test_request_guard.py`` runs a small version).

    .venv/bin/python benchmarks/server_load.py --clients 32 --serve-clients 16 --requests 20 --head-of-line
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
    ("5000-digit integer", b"INT:" + b"9" * 5000, JSON),
]
"""A body starting ``INT:`` puts the digits in the target's integer field instead of its string field."""


@dataclass
class Target:
    """One server under load: where to post and how to wrap a string value into a request body."""

    name: str
    url: str
    wrap: Callable[[bytes], bytes]
    valid: bytes
    wrap_int: Callable[[bytes], bytes]
    latencies: list[float] = field(default_factory=list)
    valid_failed: int = 0
    bad_not_4xx: int = 0
    bad_sent: int = 0
    reconnects: int = 0  # answers with "Connection: close"
    dropped: int = 0  # connections reset or closed without an answer
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
                with target.lock:
                    target.dropped += isinstance(error, httpx.TransportError)
            elapsed = time.perf_counter() - started
            name, value, headers = BAD_REQUESTS[(offset + number) % len(BAD_REQUESTS)]
            try:
                body = target.wrap_int(value[4:]) if value.startswith(b"INT:") else target.wrap(value)
                bad = client.post(target.url, content=body, headers=headers)
                bad_ok = 400 <= bad.status_code < 500
                closed = bad.headers.get("connection", "").lower() == "close"
                bad_detail = f"{name}: {bad.status_code} {bad.text[:120]}"
            except httpx.HTTPError as error:
                bad_ok, closed, bad_detail = False, False, f"{name}: {type(error).__name__}: {error}"
                with target.lock:
                    target.dropped += isinstance(error, httpx.TransportError)
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


@dataclass
class HeavyOutcome:
    """What the heavy clients' requests got."""

    answered: int = 0
    abandoned: int = 0
    refused: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def heavy_loop(url: str, body: bytes, timeout_s: float, stop: threading.Event, outcome: HeavyOutcome) -> None:
    """Send ``body`` again and again until ``stop``, leaving each request after ``timeout_s`` (a new connection
    each time: the abandoned one is closed)."""
    while not stop.is_set():
        try:
            with httpx.Client(timeout=timeout_s) as client:
                response = client.post(url, content=body, headers=JSON)
            with outcome.lock:
                if response.status_code == 200:
                    outcome.answered += 1
                else:
                    outcome.refused.append(f"{response.status_code} {response.text[:120]}")
        except httpx.TimeoutException:
            with outcome.lock:
                outcome.abandoned += 1


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


def head_of_line(url: str, big: dict[str, object], small: dict[str, object]) -> tuple[float, float, int, float]:
    """The small request's latency alone, then sent 50 ms after ``big`` (on its own connection); and the big
    request's status and duration."""
    with httpx.Client(timeout=600.0) as client:
        started = time.perf_counter()
        client.post(url, json=small).raise_for_status()
        alone = time.perf_counter() - started
    outcome: dict[str, float] = {}

    def send_big() -> None:
        began = time.perf_counter()
        with httpx.Client(timeout=600.0) as client:
            outcome["status"] = client.post(url, json=big).status_code
        outcome["seconds"] = time.perf_counter() - began

    thread = threading.Thread(target=send_big)
    thread.start()
    time.sleep(0.05)
    with httpx.Client(timeout=600.0) as client:
        started = time.perf_counter()
        client.post(url, json=small).raise_for_status()
        behind = time.perf_counter() - started
    thread.join()
    return alone, behind, int(outcome["status"]), outcome["seconds"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32, help="clients of the retrieval server")
    parser.add_argument("--serve-clients", type=int, default=16, help="clients of prorag serve")
    parser.add_argument("--head-of-line", action="store_true",
                        help="also measure a small request's wait behind a maximum-size one")
    parser.add_argument("--requests", type=int, default=20, help="valid requests per client (each with a bad one)")
    parser.add_argument("--heavy-clients", type=int, default=0,
                        help="more prorag serve clients sending a heavy request they abandon (default: none)")
    parser.add_argument("--heavy-body", default='{"model": "tiny", "prompt": "x", "n": 16, "max_tokens": 1024, '
                                                '"temperature": 1.0}', help="the heavy request")
    parser.add_argument("--heavy-timeout-s", type=float, default=10.0,
                        help="a heavy client leaves its request after this long (default: %(default)s)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    console = Console()

    generator = TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=32)
    heavy_tokens = int(json.loads(args.heavy_body).get("max_tokens", 8)) if args.heavy_clients else 8
    serve_url, stop_serve = serve_in_thread(create_app(generator, "tiny", max_batch_size=32, batch_wait_ms=5,
                                                       max_tokens_limit=max(8, heavy_tokens)))
    retriever = BM25Retriever.build(PassageStore(load_passages(CORPUS)))
    retrieval = BackgroundServer(create_retrieval_app(retriever)).start()
    targets = [
        Target("prorag serve /v1/completions", f"{serve_url}/completions",
               lambda value: b'{"model": "tiny", "max_tokens": 2, "temperature": 0, "prompt": ' + value + b"}",
               json.dumps({"model": "tiny", "prompt": "The capital of France is", "max_tokens": 2,
                           "temperature": 0}).encode(),
               lambda digits: b'{"model": "tiny", "prompt": "x", "max_tokens": ' + digits + b"}"),
        Target("retrieval server /retrieve", f"{retrieval.url}/retrieve",
               lambda value: b'{"topk": 3, "queries": [' + value + b"]}",
               json.dumps({"queries": ["Who wrote Hamlet?"], "topk": 3}).encode(),
               lambda digits: b'{"queries": ["x"], "topk": ' + digits + b"}"),
    ]
    rows, figures = [], {}
    try:
        with Progress(console=console, transient=True) as progress:
            for target, clients in zip(targets, (args.serve_clients, args.clients), strict=True):
                heavy = HeavyOutcome()
                stop_heavy = threading.Event()
                heavy_threads = [threading.Thread(target=heavy_loop, args=(target.url, args.heavy_body.encode(),
                                                                           args.heavy_timeout_s, stop_heavy, heavy))
                                 for _ in range(args.heavy_clients if target is targets[0] else 0)]
                for thread in heavy_threads:
                    thread.start()
                seconds = run_load(target, clients, args.requests, progress)
                stop_heavy.set()
                for thread in heavy_threads:
                    thread.join()
                if heavy_threads:
                    figures[f"{target.name}: heavy clients"] = {
                        "clients": len(heavy_threads), "body": args.heavy_body, "timeout_s": args.heavy_timeout_s,
                        "answered": heavy.answered, "abandoned": heavy.abandoned, "refused": heavy.refused[:5]}
                    rows.append(Row(f"{target.name}: heavy clients", f"{len(heavy_threads)} client(s) leaving after "
                                    f"{args.heavy_timeout_s:g} s", heavy.answered + heavy.abandoned, "requests",
                                    seconds, note=f"{args.heavy_body}: answered {heavy.answered}, abandoned "
                                                  f"{heavy.abandoned}, refused {len(heavy.refused)}"))
                valid = clients * args.requests
                p50, p99 = quantile(target.latencies, 0.5) * 1000, quantile(target.latencies, 0.99) * 1000
                figures[target.name] = {
                    "valid_sent": valid, "valid_failed": target.valid_failed, "bad_sent": target.bad_sent,
                    "bad_not_4xx": target.bad_not_4xx, "connections_closed_by_server": target.reconnects,
                    "connections_dropped": target.dropped,
                    "p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "seconds": round(seconds, 3),
                    "errors": target.errors[:10]}
                rows.append(Row(target.name, f"{clients} clients, keep-alive", valid + target.bad_sent,
                                "requests", seconds,
                                note=f"valid failed {target.valid_failed}/{valid}; bad not 4xx "
                                     f"{target.bad_not_4xx}/{target.bad_sent}; closed {target.reconnects}; "
                                     f"dropped {target.dropped}; "
                                     f"valid p50 {p50:.1f} ms, p99 {p99:.1f} ms"))
        if args.head_of_line:
            for name, url, big, small in (
                    ("retrieval server", f"{retrieval.url}/retrieve",
                     {"queries": [f"{word} history of the world" for word in range(256)], "topk": 100},
                     {"queries": ["Who wrote Hamlet?"], "topk": 3}),
                    ("prorag serve", f"{serve_url}/completions",
                     {"model": "tiny", "prompt": ["The capital of France is"] * 16, "n": 16, "max_tokens": 8,
                      "temperature": 1.0},
                     {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0})):
                alone, behind, big_status, big_seconds = head_of_line(url, big, small)
                figures[f"head of line: {name}"] = {"small_alone_ms": round(alone * 1000, 1),
                                                    "small_behind_max_ms": round(behind * 1000, 1),
                                                    "max_request_status": big_status,
                                                    "max_request_s": round(big_seconds, 2)}
                rows.append(Row(f"head of line: {name}", "small request behind a maximum-size one", 1, "requests",
                                behind, note=f"small alone {alone * 1000:.0f} ms, behind {behind * 1000:.0f} ms; "
                                             f"maximum-size request {big_status} in {big_seconds:.1f} s"))
    finally:
        stop_serve()
        retrieval.stop()
    write_report(rows, name="server_load", heading="Server load with bad requests mixed in",
                 title=f"{args.serve_clients} (serve) and {args.clients} (retrieval) loopback clients x "
                       f"{args.requests} valid + {args.requests} bad requests each"
                       + (f", plus {args.heavy_clients} heavy serve client(s)" if args.heavy_clients else "")
                       + " (2-core CPU)",
                 command=" ".join(["benchmarks/server_load.py", *(argv if argv is not None else sys.argv[1:])]),
                 output_dir=args.output_dir, console=console)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    failed = any(f.get("valid_failed") or f.get("bad_not_4xx") or f.get("connections_closed_by_server")
                 or f.get("connections_dropped") or f.get("refused") for f in figures.values())
    for name, figure in figures.items():
        for error in figure.get("errors", []):
            console.print(f"[red]{name}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
