"""LLM-judge benchmark: ratios measured side by side in one run, never a timed test.

:class:`prorag.judges.LLMJudge` judges ``--pairs`` distinct equivalence pairs (Figure 5 prompts built from
real HotpotQA questions and answers) against loopback servers on 127.0.0.1 that add a fixed ``--latency-ms``:

* **concurrency** — ``max_concurrency`` 1 vs 32 (``--concurrency``), no cache: items/s and the ratio, against
  - a minimal FastAPI endpoint that sleeps ``--latency-ms`` per request (a remote API: requests overlap
    freely, so the ceiling is ``concurrency / latency``);
  - ``prorag serve`` (:func:`prorag.serving.create_app`) over a deterministic ``Generator`` test double that
    sleeps ``--latency-ms`` per ``generate`` call (a local model: the server's micro-batcher groups
    concurrent requests into one call, so the latency is paid per batch);
* **persistent cache** — a :class:`prorag.judges.JudgeCache` in a temporary directory: the first run (every
  pair sent) vs a re-run by a fresh judge over the same cache (every pair a cache hit, no HTTP call — checked
  with ``judge.stats`` and the server's request counter).

Correctness checks in the notes: every verdict ``True`` with no error, one HTTP call per distinct pair, none
on the re-run, verdicts identical across runs. Output: a rich table, ``data/08_reporting/judging_benchmark.csv``
and ``.md``. Runs in about 30 s with the defaults.

    .venv/bin/python benchmarks/judging.py --pairs 128 --latency-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fastapi import FastAPI, Request
from rich.console import Console
from rich.progress import Progress

from prorag.data import load_questions
from prorag.judges import JudgeCache, LLMJudge, Verdict
from prorag.llm.generation import Completion, SamplingParams
from prorag.serving import create_app, serve_in_thread
from prorag.testing import ScriptedModel
from report import ROOT, Row, write_report  # benchmarks/report.py

QUESTIONS = ROOT / "data" / "01_raw" / "qa" / "hotpotqa.jsonl"
MODEL = "judge"
REPLY = "<answer>True</answer>"
HOST = "127.0.0.1"


# ------------------------------------------------------------------------------------------ servers


def sleeping_endpoint(latency_s: float) -> FastAPI:
    """``POST /v1/chat/completions`` answering :data:`REPLY` after ``latency_s``; counts requests and the peak
    number in flight."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.requests = 0
    app.state.in_flight = 0
    app.state.max_in_flight = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        app.state.requests += 1
        app.state.in_flight += 1
        app.state.max_in_flight = max(app.state.max_in_flight, app.state.in_flight)
        try:
            await asyncio.sleep(latency_s)
        finally:
            app.state.in_flight -= 1
        return {"id": f"chatcmpl-{app.state.requests}", "object": "chat.completion", "created": 0,
                "model": body.get("model", MODEL),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": REPLY}}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}}

    return app


class SleepingJudgeModel(ScriptedModel):
    """A deterministic ``Generator`` test double: sleeps ``latency_s`` per ``generate`` call (whatever the
    batch size) and answers :data:`REPLY` to every prompt."""

    def __init__(self, latency_s: float) -> None:
        super().__init__()
        self.latency_s = latency_s

    def reply(self, prompt: str) -> str:
        return REPLY

    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams) -> list[list[Completion]]:
        time.sleep(self.latency_s)
        return super().generate(prompts, params)


@dataclass
class Server:
    label: str
    app: FastAPI
    url: str
    stop: Callable[[], None]

    def requests(self) -> int:
        stats = getattr(self.app.state, "stats", None)
        return stats.requests if stats is not None else self.app.state.requests

    def describe(self, before: dict[str, Any]) -> str:
        """What the server saw since ``before`` (a :meth:`mark`)."""
        stats = getattr(self.app.state, "stats", None)
        if stats is None:
            return f"peak in flight {self.app.state.max_in_flight}"
        calls = stats.generate_calls - before["generate_calls"]
        prompts = stats.prompts - before["prompts"]
        return f"{calls} generate calls, mean batch {prompts / max(calls, 1):.1f}, largest {stats.largest_batch}"

    def mark(self) -> dict[str, Any]:
        stats = getattr(self.app.state, "stats", None)
        if stats is None:
            self.app.state.max_in_flight = 0
            return {}
        stats.largest_batch = 0
        return {"generate_calls": stats.generate_calls, "prompts": stats.prompts}


def start_servers(kind: str, latency_s: float, max_batch: int) -> list[Server]:
    servers = []
    if kind in ("endpoint", "both"):
        app = sleeping_endpoint(latency_s)
        url, stop = serve_in_thread(app, HOST)
        servers.append(Server(f"FastAPI endpoint, {latency_s * 1000:g} ms per request", app, url, stop))
    if kind in ("prorag", "both"):
        app = create_app(SleepingJudgeModel(latency_s), MODEL, max_batch_size=max_batch, batch_wait_ms=2,
                         max_tokens_limit=4096)
        url, stop = serve_in_thread(app, HOST)
        servers.append(Server(f"prorag serve, {latency_s * 1000:g} ms per generate call (batch {max_batch})",
                              app, url, stop))
    return servers


# ------------------------------------------------------------------------------------------ inputs


def equivalence_pairs(count: int) -> list[tuple[str, str]]:
    """``count`` distinct (statement, statement) pairs from HotpotQA questions, in file order."""
    questions = load_questions(QUESTIONS)
    pairs = []
    for index in range(count):
        question = questions[index % len(questions)]
        answer = question.golden_answers[0]
        suffix = f" (variant {index // len(questions)})" if index >= len(questions) else ""
        pairs.append((f"The answer to \"{question.question}\" is {answer}.{suffix}",
                      f"{answer} answers the question \"{question.question}\"{suffix}"))
    return pairs


def check_verdicts(verdicts: list[Verdict], count: int) -> list[str]:
    problems = []
    if len(verdicts) != count:
        problems.append(f"{len(verdicts)} verdicts for {count} pairs")
    if errors := sum(verdict.error is not None for verdict in verdicts):
        problems.append(f"{errors} errors (first: {next(v.error for v in verdicts if v.error)})")
    if wrong := sum(verdict.value is not True for verdict in verdicts):
        problems.append(f"{wrong} verdicts not True")
    return problems


# ------------------------------------------------------------------------------------------ runs


def concurrency_run(server: Server, pairs: list[tuple[str, str]], level: int, latency_s: float,
                    failures: list[str]) -> Row:
    """One judge with ``max_concurrency=level`` and no cache over every pair (the ratio is set by the caller)."""
    section = f"concurrency, no cache ({server.label})"
    with LLMJudge(server.url, MODEL, max_concurrency=level, cache=None, max_retries=0, timeout=60) as judge:
        judge.equivalent([("warm-up statement", "warm-up statement")])  # connection, event loop, client
        judge.stats = type(judge.stats)()
        requests, mark = server.requests(), server.mark()
        started = time.perf_counter()
        verdicts = judge.equivalent(pairs)
        seconds = time.perf_counter() - started
        sent, stats = server.requests() - requests, judge.stats
    problems = check_verdicts(verdicts, len(pairs))
    if stats.http_calls != len(pairs) or sent != len(pairs):
        problems.append(f"{stats.http_calls} judge calls / {sent} server requests for {len(pairs)} pairs")
    failures += [f"{section}, concurrency {level}: {problem}" for problem in problems]
    ceiling = level / latency_s if latency_s > 0 else float("inf")
    return Row(section, f"max_concurrency={level}", len(pairs), "items", seconds, "",
               f"{'OK' if not problems else 'FAILED'}: {stats.http_calls} HTTP calls, {server.describe(mark)}; "
               f"latency-bound ceiling {ceiling:,.0f} items/s ({len(pairs) / seconds / ceiling:.0%} of it)")


def cache_section(server: Server, pairs: list[tuple[str, str]], level: int, rows: list[Row],
                  failures: list[str]) -> None:
    section = f"persistent cache, max_concurrency={level} ({server.label})"
    with tempfile.TemporaryDirectory(prefix="prorag-judge-bench-") as folder:
        cache = JudgeCache(Path(folder) / "judge_cache.sqlite")
        with LLMJudge(server.url, MODEL, max_concurrency=level, cache=cache, max_retries=0, timeout=60) as judge:
            judge.equivalent([("warm-up statement", "warm-up statement")])
            judge.stats = type(judge.stats)()
            requests = server.requests()
            started = time.perf_counter()
            first = judge.equivalent(pairs)
            first_seconds = time.perf_counter() - started
            first_sent, first_stats = server.requests() - requests, judge.stats
        problems = check_verdicts(first, len(pairs))
        if first_stats.http_calls != len(pairs) or first_sent != len(pairs) or first_stats.cache_hits:
            problems.append(f"first run: {first_stats.http_calls} calls, {first_sent} requests, "
                            f"{first_stats.cache_hits} hits")
        if len(cache) != len(pairs) + 1:
            problems.append(f"{len(cache)} cached replies, expected {len(pairs) + 1}")
        failures += [f"{section}, first run: {problem}" for problem in problems]
        first_rate = len(pairs) / first_seconds
        rows.append(Row(section, "first run (every pair sent, reply cached)", len(pairs), "items", first_seconds,
                        "1.00x", f"{'OK' if not problems else 'FAILED'}: {first_stats.http_calls} HTTP calls, "
                        f"{first_sent} server requests, {len(cache)} rows in the cache"))

        # A fresh judge (a re-run of the pipeline) over the same cache file; repeated for a stable time.
        with LLMJudge(server.url, MODEL, max_concurrency=level, cache=cache, max_retries=0, timeout=60) as judge:
            requests, repeats, verdicts = server.requests(), 0, []
            started = time.perf_counter()
            while True:
                verdicts = judge.equivalent(pairs)
                repeats += 1
                if time.perf_counter() - started >= 0.5 or repeats >= 1000:
                    break
            seconds = time.perf_counter() - started
            sent, stats = server.requests() - requests, judge.stats
        cache.close()
    problems = check_verdicts(verdicts, len(pairs))
    if stats.http_calls or sent or stats.cache_hits != len(pairs) * repeats:
        problems.append(f"re-run: {stats.http_calls} calls, {sent} requests, {stats.cache_hits} hits")
    if [v.value for v in verdicts] != [v.value for v in first] or not all(v.cached for v in verdicts):
        problems.append("re-run verdicts differ from the first run or are not marked cached")
    failures += [f"{section}, re-run: {problem}" for problem in problems]
    rate = len(pairs) * repeats / seconds
    rows.append(Row(section, f"re-run, fresh judge, same cache (x{repeats})", len(pairs) * repeats, "items",
                    seconds, f"{rate / first_rate:.2f}x",
                    f"{'OK' if not problems else 'FAILED'}: {stats.cache_hits} cache hits, {stats.http_calls} HTTP "
                    f"calls, {sent} server requests, verdicts identical to the first run"))


# ------------------------------------------------------------------------------------------ report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=128, help="distinct equivalence pairs judged (default 128)")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="added latency (default 50 ms)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32],
                        help="max_concurrency levels compared, the first is the baseline (default: 1 32)")
    parser.add_argument("--server", choices=("endpoint", "prorag", "both"), default="both",
                        help="which loopback server(s): a FastAPI endpoint sleeping per request, prorag serve "
                             "over a Generator sleeping per generate call, or both (default)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.latency_ms < 0 or min(args.concurrency) < 1:
        parser.error("--pairs and --concurrency must be >= 1, --latency-ms >= 0")
    console = Console(width=None if sys.stdout.isatty() else 220)
    latency_s = args.latency_ms / 1000.0
    pairs = equivalence_pairs(args.pairs)
    rows: list[Row] = []
    failures: list[str] = []
    started = time.perf_counter()
    servers = start_servers(args.server, latency_s, max(args.concurrency))
    console.print(f"{len(pairs)} distinct equivalence pairs; servers: "
                  + "; ".join(f"{server.label} at {server.url}" for server in servers))
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("judging", total=len(servers) * (len(args.concurrency) + 1))
            for server in servers:
                section_rows = []
                for level in args.concurrency:
                    progress.update(task, description=f"{server.label}: max_concurrency={level}")
                    section_rows.append(concurrency_run(server, pairs, level, latency_s, failures))
                    progress.advance(task)
                for row in section_rows:
                    row.ratio = f"{row.rate / section_rows[0].rate:.2f}x"
                rows += section_rows
                progress.update(task, description=f"{server.label}: cache first run and re-run")
                cache_section(server, pairs, max(args.concurrency), rows, failures)
                progress.advance(task)
    finally:
        for server in servers:
            server.stop()
    elapsed = time.perf_counter() - started
    title = (f"LLM-judge benchmark — {len(pairs)} equivalence pairs, {args.latency_ms:g} ms added latency, "
             f"loopback {HOST}, {elapsed:.0f} s")
    command = " ".join(["python", "benchmarks/judging.py", *(sys.argv[1:] if argv is None else argv)])
    write_report(rows, name="judging", heading="LLM-judge benchmark", title=title, command=command,
                 output_dir=args.output_dir, console=console)
    if failures:
        console.print("[bold red]correctness checks failed:[/]\n  " + "\n  ".join(failures))
        return 1
    console.print("[green]correctness checks passed[/]: every verdict True, one HTTP call per pair, "
                  "none on the cached re-run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
