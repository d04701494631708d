"""Rollout, serving and GRPO-step benchmark (issue 14's table): ratios measured side by side in one run.

On the same ``--questions`` real questions (HotpotQA / MuSiQue / PopQA, sampled with ``--seed``) with a BM25
retriever over their context passages and the policy ``--model`` (default ``bundled:tiny-random-llama``,
in-process transformers, greedy decoding). Every timed run starts from an empty KV cache.

* **(a) batched engine vs one question at a time** — ``RolloutEngine(...).run(all questions)`` vs the same
  engine's ``.run([question])`` in a loop: trajectories/s and the ratio; check: identical trajectories (text,
  every segment's token ids, stop reason) under greedy decoding;
* **(a') one question at a time, drafts vs none** — the loop of (a) again with ``draft_tokens=0``: a call of one
  row (``prorag ask``) decoding one token a step vs with prompt-lookup drafts; check: identical trajectories;
* **(b) engine vs raw generation** — the engine's generated tokens/s (multi-turn, stop strings, retrieval,
  bookkeeping; the KV cache carried across turns) vs one raw batched ``generator.generate`` of the same number
  of new tokens on the same first-turn prompts (a generator without the prefix cache): the ceiling the engine
  should approach, ratio engine/raw; check: each engine first turn is a prefix of the raw generation;
* **(b') KV reuse vs re-prefill** — the same batched engine run with ``prefix_cache_mb=0`` (every turn
  re-prefills the whole transcript, the engine before issue 14): ratio, prefill / reused / decoded tokens and
  the cache hit rate; check: token-identical trajectories;
* **(c) prorag serve** — :func:`prorag.serving.create_app` + :func:`~prorag.serving.serve_in_thread` on
  127.0.0.1, ``/v1/completions`` with a fixed short prompt and ``max_tokens`` through the ``openai`` client:
  16 concurrent clients vs 1, requests/s, ratio, the server's batching counters and its prefix-cache hit rate
  (``app.state.stats``); check: every reply equals the direct greedy generation;
* **(d) GRPO step** (``--grpo``) — one TRL GRPO step of :func:`prorag.training.trl_grpo.build_grpo_trainer` on
  ``--grpo-model`` (default SmolLM2-135M) with a fresh LoRA, 4 completions of one question (``make train``'s
  agent budgets: B=3, 96 tokens per turn, 288 in all, temperature 0.8; HiPRAG reward with the reference
  judges), wall time of the step (rollouts, re-asks, loss, backward) with KV reuse vs re-prefill; check: the
  rollouts are token-identical (same seed, same weights).

The issue's setting is ``--questions 32 --grpo``. The tiny random model never writes a protocol tag, so its
trajectories run to the token budget in ``max_total_new_tokens / max_new_tokens_per_turn`` turns (no
searches); ``--model bundled:smollm2-135m-instruct`` exercises real boundaries and searches but is slow on 2
shared cores. Torch uses ``--threads`` (default 1: steadier than 2 on a shared 2-core machine). Output: a rich
table, ``data/08_reporting/rollout_benchmark.csv`` and ``.md``.

    .venv/bin/python benchmarks/rollout.py --questions 32 --grpo
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch and faiss each load an OpenMP runtime; passive waiting keeps their idle threads off the 2 shared cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from rich.console import Console
from tqdm.auto import tqdm

from prorag.agent import Rollout, RolloutEngine, stop_reason_counts
from prorag.data import Passage, Question, load_corpus, load_questions
from prorag.llm import BUNDLED_SMOLLM2, BUNDLED_TINY_LLAMA, SamplingParams
from prorag.llm.prefix_cache import PROCESS_GENERATION_STATS
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.retrieval import build_retrieval_index
from prorag.serving import create_app, serve_in_thread
from report import ROOT, Row, write_report  # benchmarks/report.py

RAW = ROOT / "data" / "01_raw"
HOST = "127.0.0.1"
SERVED_NAME = "policy"
SERVE_PROMPT = "Question: Who wrote the novel Moby-Dick?\nAnswer:"


# ------------------------------------------------------------------------------------------ inputs


def sample_questions(datasets: Sequence[str], count: int, seed: int) -> tuple[list[Question], list[Passage]]:
    """``count`` questions drawn round-robin from ``datasets`` (seeded) and the context passages of each."""
    rng = random.Random(seed)
    pools = []
    for name in datasets:
        candidates = [q for q in load_questions(RAW / "qa" / f"{name}.jsonl") if q.context_passage_ids]
        pools.append(rng.sample(candidates, min(len(candidates), count)))
    questions: list[Question] = []
    for position in range(count):
        pool = pools[position % len(pools)]
        if position // len(pools) < len(pool):
            questions.append(pool[position // len(pools)])
    if len(questions) < count:
        raise SystemExit(f"only {len(questions)} questions with context passages in {list(datasets)}")
    wanted = {identifier for question in questions for identifier in question.context_passage_ids}
    corpus = load_corpus([RAW / "corpus" / f"{name}.jsonl" for name in dict.fromkeys(datasets)])
    passages = [passage for passage in corpus if passage.id in wanted]
    return questions, passages


def trajectory_signature(rollout: Rollout) -> tuple[Any, ...]:
    return (rollout.completion, rollout.stop_reason, tuple(rollout.prompt_token_ids),
            tuple(tuple(segment.token_ids) for segment in rollout.segments))


# ------------------------------------------------------------------------------------------ sections


def cache_note(stats: dict[str, float]) -> str:
    return (f"{stats['prefill_tokens']:,.0f} prefill / {stats['cached_tokens']:,.0f} reused / "
            f"{stats['decode_tokens']:,.0f} decoded tokens, cache hit rate {stats['cache_hit_rate']:.2f}")


def timed_run(engine: RolloutEngine, generator: TransformersGenerator,
              questions: list[Question]) -> tuple[list[Rollout], float, dict[str, float]]:
    """One engine run from an empty KV cache: rollouts, seconds, the generator's counters of the run."""
    if generator.prefix_cache is not None:
        generator.prefix_cache.clear()
    before = generator.stats.snapshot()
    started = time.perf_counter()
    rollouts = engine.run(questions)
    return rollouts, time.perf_counter() - started, generator.stats.since(before)


def engine_sections(generator: TransformersGenerator, retriever: Any, questions: list[Question],
                    args: argparse.Namespace, rows: list[Row], failures: list[str]) -> None:
    options = dict(step_budget=args.step_budget, top_k=args.top_k, max_new_tokens_per_turn=args.tokens_per_turn,
                   max_total_new_tokens=args.max_tokens)
    # the same model without the prefix cache: re-prefill every turn (b'), and the raw ceiling (b)
    uncached = TransformersGenerator((generator.model, generator.tokenizer), batch_size=args.batch_size,
                                     prefix_cache_mb=0)
    engine = RolloutEngine(generator, retriever, "hiprag", progress=True, **options)
    quiet = RolloutEngine(generator, retriever, "hiprag", progress=False, **options)
    reprefill = RolloutEngine(uncached, retriever, "hiprag", progress=True, **options)
    quiet.run(questions[:1])  # warm-up: chat template, tokenizer, the model's first forward passes

    batched, batched_seconds, batched_stats = timed_run(engine, generator, questions)
    generator.prefix_cache.clear()
    sequential: list[Rollout] = []
    started = time.perf_counter()
    for question in tqdm(questions, desc="rollout, one question at a time", unit="question", leave=False):
        sequential += quiet.run([question])
    sequential_seconds = time.perf_counter() - started
    baseline, baseline_seconds, baseline_stats = timed_run(reprefill, uncached, questions)
    # (a') one question at a time again, one token a step: a call of one row (prorag ask) without drafts
    undrafted = TransformersGenerator((generator.model, generator.tokenizer), batch_size=args.batch_size,
                                      draft_tokens=0)
    one_token = RolloutEngine(undrafted, retriever, "hiprag", progress=False, **options)
    one_at_a_time: list[Rollout] = []
    started = time.perf_counter()
    for question in tqdm(questions, desc="rollout, one question at a time, no drafts", unit="question", leave=False):
        one_at_a_time += one_token.run([question])
    undrafted_seconds = time.perf_counter() - started

    same = sum(trajectory_signature(a) == trajectory_signature(b) for a, b in zip(batched, sequential, strict=True))
    if same != len(questions):
        failures.append(f"(a) {len(questions) - same}/{len(questions)} batched trajectories differ from the "
                        "one-at-a-time ones")
    tokens = sum(rollout.generated_tokens for rollout in batched)
    turns = [rollout.turns for rollout in batched]
    reasons = {reason: n for reason, n in stop_reason_counts(batched).items() if n}
    section = (f"(a) rollout engine, hiprag, {len(questions)} questions (B={args.step_budget}, "
               f"{args.tokens_per_turn} tokens/turn, {args.max_tokens} max)")
    rows.append(Row(section, "one question per engine.run (loop)", len(questions), "trajectories",
                    sequential_seconds, "1.00x",
                    f"{sum(r.generated_tokens for r in sequential) / sequential_seconds:,.0f} generated tokens/s"))
    rows.append(Row(section, f"all questions in one engine.run (generator batch {args.batch_size})", len(questions),
                    "trajectories", batched_seconds, f"{sequential_seconds / batched_seconds:.2f}x",
                    f"identical trajectories (greedy): {same}/{len(questions)}; {tokens:,} generated tokens, "
                    f"turns {min(turns)}-{max(turns)}, searches {sum(r.retrieval_count for r in batched)}, "
                    f"stop reasons {reasons}"))

    drafted_same = sum(trajectory_signature(a) == trajectory_signature(b)
                       for a, b in zip(sequential, one_at_a_time, strict=True))
    if drafted_same != len(questions):
        failures.append(f"(a') {len(questions) - drafted_same}/{len(questions)} one-at-a-time trajectories with "
                        "prompt-lookup drafts differ from those without")
    section = f"(a') one question per engine.run, {len(questions)} questions: calls of one row"
    rows.append(Row(section, "one token a step (draft_tokens=0: transformers' generate)", len(questions),
                    "trajectories", undrafted_seconds, "1.00x",
                    f"{sum(r.generated_tokens for r in one_at_a_time) / undrafted_seconds:,.0f} generated tokens/s"))
    rows.append(Row(section, f"prompt-lookup drafts (draft_tokens={generator.draft_tokens}, the default)",
                    len(questions), "trajectories", sequential_seconds,
                    f"{undrafted_seconds / sequential_seconds:.2f}x",
                    f"identical trajectories (greedy): {drafted_same}/{len(questions)}"))

    # (b) the same first-turn prompts, one raw batched generate of the same number of new tokens.
    prompts = [[*rollout.prompt_token_ids, *rollout.segments[0].token_ids] for rollout in batched]
    new_tokens = max(1, round(tokens / len(batched)))
    started = time.perf_counter()
    raw = uncached.generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    raw_seconds = time.perf_counter() - started
    raw_tokens = sum(len(samples[0].token_ids) for samples in raw)
    prefix = 0
    for rollout, samples in zip(batched, raw, strict=True):
        first = next((segment.token_ids for segment in rollout.segments if segment.generated), [])
        prefix += samples[0].token_ids[: len(first)] == list(first)
    if prefix != len(batched):
        failures.append(f"(b) {len(batched) - prefix}/{len(batched)} engine first turns are not a prefix of the "
                        "raw generation")
    engine_rate, raw_rate = tokens / batched_seconds, raw_tokens / raw_seconds
    section = f"(b) engine vs raw batched generate, {len(questions)} prompts ({generator.name})"
    rows.append(Row(section, f"raw generator.generate, max_new_tokens={new_tokens}, no stop strings", raw_tokens,
                    "tokens", raw_seconds, "1.00x",
                    f"mean prompt {statistics.mean(len(p) for p in prompts):,.0f} tokens; the ceiling"))
    rows.append(Row(section, "rollout engine (batched run of (a), KV cache across turns)", tokens, "tokens",
                    batched_seconds, f"{engine_rate / raw_rate:.2f}x",
                    f"engine/raw; engine first turn a prefix of the raw generation: {prefix}/{len(batched)}"))

    # (b') the engine before issue 14: no KV reuse, every turn re-prefills the transcript.
    identical = sum(trajectory_signature(a) == trajectory_signature(b) for a, b in zip(batched, baseline, strict=True))
    if identical != len(batched):
        failures.append(f"(b') {len(batched) - identical}/{len(batched)} trajectories with KV reuse differ from "
                        "the re-prefill ones")
    section = f"(b') KV reuse across turns vs re-prefill, batched engine, {len(questions)} questions"
    rows.append(Row(section, "re-prefill every turn (prefix_cache_mb=0)", tokens, "tokens", baseline_seconds,
                    "1.00x", f"{cache_note(baseline_stats)}; engine/raw {tokens / baseline_seconds / raw_rate:.2f}x"))
    rows.append(Row(section, "KV cache carried across turns (default)", tokens, "tokens", batched_seconds,
                    f"{baseline_seconds / batched_seconds:.2f}x",
                    f"{cache_note(batched_stats)}; identical trajectories {identical}/{len(batched)}"))


def serve_section(generator: TransformersGenerator, args: argparse.Namespace, rows: list[Row],
                  failures: list[str]) -> None:
    import openai

    if generator.prefix_cache is not None:
        generator.prefix_cache.clear()
    generator.stats.reset()
    app = create_app(generator, SERVED_NAME, max_batch_size=max(args.clients), batch_wait_ms=args.batch_wait_ms)
    url, stop = serve_in_thread(app, HOST)
    stats = app.state.stats
    reference = generator.generate([SERVE_PROMPT], SamplingParams(max_new_tokens=args.serve_tokens))[0][0].text
    section = (f"(c) prorag serve /v1/completions, {HOST}, max_tokens={args.serve_tokens}, "
               f"max_batch_size={max(args.clients)}")
    try:
        with openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=300) as client:

            def request(_: int) -> str:
                reply = client.completions.create(model=SERVED_NAME, prompt=SERVE_PROMPT,
                                                  max_tokens=args.serve_tokens, temperature=0)
                return reply.choices[0].text

            request(0)  # warm-up: connection, batcher task
            rates: list[float] = []
            for clients in args.clients:
                calls, prompts, tokens = stats.generate_calls, stats.prompts, stats.completion_tokens
                stats.largest_batch = 0
                with ThreadPoolExecutor(clients) as pool, \
                        tqdm(total=args.requests, desc=f"serve, {clients} clients", unit="request",
                             leave=False) as bar:
                    started = time.perf_counter()
                    texts = []
                    for text in pool.map(request, range(args.requests)):
                        texts.append(text)
                        bar.update(1)
                    seconds = time.perf_counter() - started
                calls, prompts = stats.generate_calls - calls, stats.prompts - prompts
                tokens = stats.completion_tokens - tokens
                matching = sum(text == reference for text in texts)  # no stop strings: nothing is dropped
                if matching != len(texts):
                    failures.append(f"(c) {clients} clients: {len(texts) - matching}/{len(texts)} replies differ "
                                    "from the direct greedy generation")
                rates.append(args.requests / seconds)
                rows.append(Row(section, f"{clients} concurrent client{'s' if clients > 1 else ''}", args.requests,
                                "requests", seconds, f"{rates[-1] / rates[0]:.2f}x",
                                f"{calls} generate calls, mean batch {prompts / max(calls, 1):.1f}, largest "
                                f"{stats.largest_batch}, {tokens / seconds:,.0f} completion tokens/s; replies equal "
                                f"to direct generation {matching}/{len(texts)}"))
    finally:
        stop()
    snapshot = app.state.stats.snapshot()
    if "prefix_cache" in snapshot:
        rows[-1].note += f"; server prefix cache: {cache_note(snapshot['prefix_cache'])}"
    rows[-1].note += (f"; server totals: {snapshot['requests']} requests, {snapshot['generate_calls']} generate "
                      f"calls, {snapshot['completion_tokens']} completion tokens, "
                      f"{snapshot['generate_seconds']} s generating, {snapshot['rejected']} rejected, "
                      f"{snapshot['errors']} errors")


def grpo_section(questions: list[Question], retriever: Any, args: argparse.Namespace, rows: list[Row],
                 failures: list[str]) -> None:
    """(d): one GRPO step, KV reuse vs re-prefill (the rollout function builds its generator in grpo.py)."""
    from transformers import TrainerCallback

    from prorag.judges import ReferenceJudge
    from prorag.llm.registry import load_causal_lm
    from prorag.rewards.registry import build_reward
    from prorag.rewards.scoring import RolloutScorer
    from prorag.specs import AgentSpec
    from prorag.training import grpo
    from prorag.training.config import GRPOSettings

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)

    class TimedRolloutFunction(grpo.AgentRolloutFunction):
        """The rollout function, timing its calls (rollouts, over-search re-asks, judges, rewards)."""

        seconds = 0.0

        def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
            started = time.perf_counter()
            try:
                return super().__call__(prompts, trainer)
            finally:
                self.seconds += time.perf_counter() - started

    agent = AgentSpec(few_shot=False, step_budget=3, max_new_tokens_per_turn=96, max_total_new_tokens=288)
    judge = ReferenceJudge(retriever)
    settings = GRPOSettings(max_steps=1, per_device_train_batch_size=4, num_generations=4, learning_rate=5e-5,
                            temperature=0.8, gradient_checkpointing=True, save_steps=10, use_cpu=True,
                            dtype="float32", resume=False)
    question = questions[:1]
    section = (f"(d) GRPO step, {args.grpo_model} + fresh LoRA, 4 completions of 1 question (B=3, 96/288 tokens, "
               "T=0.8, HiPRAG reward, reference judges)")
    results: dict[str, tuple[float, float, list[Rollout], dict[str, float]]] = {}
    original = grpo.TransformersGenerator
    for label, megabytes in (("re-prefill every turn (prefix_cache_mb=0)", 0.0), ("KV reuse + shared prefill", 1024.0)):
        grpo.TransformersGenerator = partial(original, prefix_cache_mb=megabytes)  # what policy_generator builds
        before = PROCESS_GENERATION_STATS.snapshot()
        try:
            function = TimedRolloutFunction(question, retriever,
                                            RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge,
                                                          under_judge=judge),
                                                 agent, temperature=0.8, seed=0, batch_size=8)
            clock = StepClock()
            with tempfile.TemporaryDirectory() as folder:
                trainer = grpo.build_grpo_trainer(load_causal_lm(args.grpo_model), question, function, folder,
                                                  settings, callbacks=[clock])
                trainer.train()
        finally:
            grpo.TransformersGenerator = original
        results[label] = (clock.seconds[0], function.seconds, function.last_rollouts,
                          PROCESS_GENERATION_STATS.since(before))
    (slow_label, (slow, slow_rollout_s, slow_rollouts, slow_stats)), \
        (fast_label, (fast, fast_rollout_s, fast_rollouts, fast_stats)) = results.items()
    identical = sum(trajectory_signature(a) == trajectory_signature(b)
                    for a, b in zip(slow_rollouts, fast_rollouts, strict=True))
    if identical != len(fast_rollouts):
        failures.append(f"(d) {len(fast_rollouts) - identical}/{len(fast_rollouts)} GRPO rollouts with KV reuse "
                        "differ from the re-prefill ones")
    generated = sum(r.generated_tokens for r in fast_rollouts)
    reasons = {reason: count for reason, count in stop_reason_counts(fast_rollouts).items() if count}
    rows.append(Row(section, slow_label, 1, "steps", slow, "1.00x",
                    f"rollout function (engine, re-asks, judges) {slow_rollout_s:.1f} s of the step; "
                    f"{cache_note(slow_stats)}"))
    rows.append(Row(section, fast_label, 1, "steps", fast, f"{slow / fast:.2f}x",
                    f"rollout function {fast_rollout_s:.1f} s of the step ({slow_rollout_s / fast_rollout_s:.2f}x); "
                    f"{cache_note(fast_stats)}; identical rollouts {identical}/{len(fast_rollouts)}; "
                    f"{generated} generated tokens, stop reasons {reasons}"))


# ------------------------------------------------------------------------------------------ report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=16,
                        help="questions rolled out (default 16 for time; the issue's setting is 32)")
    parser.add_argument("--datasets", nargs="+", default=["hotpotqa", "musique", "popqa"],
                        help="question files of data/01_raw/qa, drawn round-robin (default: hotpotqa musique popqa)")
    parser.add_argument("--model", default=BUNDLED_TINY_LLAMA,
                        help=f"policy model spec (default {BUNDLED_TINY_LLAMA}; e.g. bundled:smollm2-135m-instruct)")
    parser.add_argument("--batch-size", type=int, default=16, help="generator batch size (default 16)")
    parser.add_argument("--step-budget", type=int, default=4, help="HiPRAG step budget B (default 4)")
    parser.add_argument("--top-k", type=int, default=3, help="documents per search (default 3)")
    parser.add_argument("--tokens-per-turn", type=int, default=64, help="max_new_tokens_per_turn (default 64)")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_total_new_tokens (default 256)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16],
                        help="concurrent serve clients compared, the first is the baseline (default: 1 16)")
    parser.add_argument("--requests", type=int, default=48, help="requests per serve run (default 48)")
    parser.add_argument("--serve-tokens", type=int, default=16, help="max_tokens of each serve request (default 16)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="server micro-batching wait (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="question sampling seed (default 0)")
    parser.add_argument("--skip-serve", action="store_true", help="leave out (c)")
    parser.add_argument("--grpo", action="store_true", help="add (d): one GRPO step, KV reuse vs re-prefill (minutes)")
    parser.add_argument("--grpo-model", default=BUNDLED_SMOLLM2, help=f"policy of (d) (default {BUNDLED_SMOLLM2})")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    if min(args.questions, args.batch_size, args.threads, args.requests, args.serve_tokens, *args.clients) < 1:
        parser.error("counts must be >= 1")
    torch.set_num_threads(args.threads)
    console = Console(width=None if sys.stdout.isatty() else 220)
    rows: list[Row] = []
    failures: list[str] = []
    started = time.perf_counter()

    questions, passages = sample_questions(args.datasets, args.questions, args.seed)
    retriever = build_retrieval_index(passages, "hashing:64", build_bm25=True, show_progress=False).bm25
    generator = TransformersGenerator(args.model, batch_size=args.batch_size)
    console.print(f"{len(questions)} questions ({', '.join(args.datasets)}), BM25 over their {len(passages)} "
                  f"context passages; policy {generator.name}, batch {args.batch_size}, "
                  f"{torch.get_num_threads()} torch thread(s), {os.cpu_count()} CPUs")

    engine_sections(generator, retriever, questions, args, rows, failures)
    if not args.skip_serve:
        serve_section(generator, args, rows, failures)
    if args.grpo:
        grpo_section(questions, retriever, args, rows, failures)

    elapsed = time.perf_counter() - started
    title = (f"Rollout and serving benchmark — {len(questions)} questions, {generator.name}, greedy, "
             f"{torch.get_num_threads()} torch thread(s), {elapsed:.0f} s")
    command = " ".join(["python", "benchmarks/rollout.py", *(sys.argv[1:] if argv is None else argv)])
    write_report(rows, name="rollout", heading="Rollout and serving benchmark", title=title, command=command,
                 output_dir=args.output_dir, console=console)
    if failures:
        console.print("[bold red]correctness checks failed:[/]\n  " + "\n  ".join(failures))
        return 1
    console.print("[green]correctness checks passed[/]: batched = sequential trajectories, engine first turns "
                  "= raw generation prefixes, KV reuse = re-prefill trajectories, served replies = direct "
                  "generation" + (", GRPO rollouts with = without KV reuse" if args.grpo else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
