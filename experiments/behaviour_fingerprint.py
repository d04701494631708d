"""Greedy trajectories, SFT examples and rewards on the tiny random Llama with fixed seeds, dumped to one JSON file.

A refactor that should not change behaviour is checked by running this against the old and the new checkout and
comparing the two files byte for byte (issue 12)::

    git worktree add /tmp/baseline <old commit>
    PYTHONPATH=/tmp/baseline/src .venv/bin/python experiments/behaviour_fingerprint.py /tmp/before.json
    PYTHONPATH=src .venv/bin/python experiments/behaviour_fingerprint.py /tmp/after.json
    cmp /tmp/before.json /tmp/after.json

It rolls out the first 6 of 12 real questions (HotpotQA, MuSiQue, MuSiQue-train) with HiPRAG (with and without the
few-shot examples), Search-R1 and the multi-stage protocol over BM25; synthesizes gold trajectories for all 12 and
tokenizes them as SFT examples (both prompts); and scores the HiPRAG rollouts plus the gold trajectories with every
reward method (reference judges; a deterministic byte embedding for the multi-stage query similarity).
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prorag.agent import Rollout, RolloutEngine
from prorag.data import load_questions, read_corpus_files
from prorag.judges.reference import ReferenceJudge
from prorag.llm.factory import build_generator
from prorag.llm.registry import load_tokenizer
from prorag.protocol.registry import get_protocol
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.corpus import deduplicate_passages
from prorag.retrieval.store import PassageStore
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import RolloutScorer
from prorag.training import build_sft_example, synthesize_trajectories

RAW = Path(__file__).resolve().parents[1] / "data" / "01_raw"
TINY = "bundled:tiny-random-llama"
SOURCES = ("hotpotqa", "musique", "musique_train")
REWARDS = {  # the fingerprint's reward names, as before the reward registry, and their reward entries
    "hiprag": {"kind": "hiprag", "lambda_f": 0.2, "lambda_p": 0.4},
    "search_r1": {"kind": "search_r1", "lambda_f": 0.2},
    "over_only": {"kind": "hiprag", "lambda_f": 0.2, "lambda_p": 0.4, "check": "over_only"},
    "under_only": {"kind": "hiprag", "lambda_f": 0.2, "lambda_p": 0.4, "check": "under_only"},
    "multistage": {"kind": "multistage"},
}


def byte_embedding(texts: list[str]) -> np.ndarray:
    """A deterministic stand-in for the query embedder: the first 16 bytes of each text."""
    rows = [np.frombuffer(text.encode().ljust(16, b"_")[:16], dtype=np.uint8).astype(np.float32) for text in texts]
    return np.stack(rows) if rows else np.zeros((0, 16), np.float32)


def gold_rollout(template: Rollout, completion: str, question: str, answer: str, key: str,
                 queries: tuple[str, ...]) -> Rollout:
    """A gold trajectory as a HiPRAG rollout record (for scoring)."""
    adapter = get_protocol("hiprag")
    steps = adapter.steps(completion)
    record = template.to_dict()
    record.update(question_key=key, question=question, golden_answers=[answer], completion=completion, steps=steps,
                  format_ok=bool(adapter.check_format(completion)[0]), n_steps=len(steps or []),
                  answer=adapter.extract_answer(completion), queries=list(queries))
    return Rollout.from_dict(record)


def fingerprint() -> dict[str, Any]:
    torch.set_num_threads(1)
    questions = [question for name in SOURCES for question in load_questions(RAW / "qa" / f"{name}.jsonl")[:4]]
    passages, origins = read_corpus_files([RAW / "corpus" / f"{name}.jsonl" for name in SOURCES])
    retriever = BM25Retriever.build(PassageStore(deduplicate_passages(passages, origins)))
    generator = build_generator(TINY, batch_size=8)
    tokenizer = load_tokenizer(TINY)
    out: dict[str, Any] = {}

    rollouts: dict[str, list[Rollout]] = {}
    for protocol, few_shot in (("hiprag", True), ("hiprag", False), ("search_r1", True), ("multistage", True)):
        adapter = get_protocol(protocol, **({"few_shot": few_shot} if protocol == "hiprag" else {}))
        engine = RolloutEngine(generator, retriever, adapter, step_budget=2, top_k=2, max_new_tokens_per_turn=24,
                               max_total_new_tokens=64, temperature=0.0, seed=0, progress=False)
        rollouts[f"{protocol}/{few_shot}"] = engine.run(questions[:6], samples=1)
        out[f"rollouts/{protocol}/{few_shot}"] = [rollout.to_dict() for rollout in rollouts[f"{protocol}/{few_shot}"]]

    names_protocol = "protocol" in inspect.signature(build_sft_example).parameters  # the API after issue 12
    protocol_option = {"protocol": "hiprag"} if names_protocol else {}
    trajectories, skipped = synthesize_trajectories(questions, retriever, top_k=3, seed=0, **protocol_option)
    out["synthesis"] = [trajectory.to_dict() for trajectory in trajectories]
    out["synthesis_skipped"] = dict(skipped)
    out["sft_examples"] = [build_sft_example(tokenizer, item.question, item.completion, few_shot=few_shot,
                                             **protocol_option)
                           for item in trajectories for few_shot in (True, False)]

    template = rollouts["hiprag/True"][0]
    gold = [gold_rollout(template, item.completion, item.question, item.answer, item.question_key, item.queries)
            for item in trajectories]
    judge = ReferenceJudge(retriever, f1_threshold=0.8, top_k=5, grounding_threshold=0.6)
    for method, entry in REWARDS.items():
        reward = build_reward({**entry, "reask_max_new_tokens": 16})
        batch = (rollouts["multistage/True"] if method == "multistage"
                 else rollouts["hiprag/True"] + gold + rollouts["hiprag/False"])
        scored = RolloutScorer(reward, over_judge=judge, under_judge=judge, embed=byte_embedding,
                               judge_for_metrics=True).score(batch, generator, step=1)
        out[f"rewards/{method}"] = {"components": scored.components, "totals": scored.totals,
                                    "stats": {name: list(value) for name, value in scored.stats.items()},
                                    "verdicts": [verdict.to_dict() for verdict in scored.verdicts or []]}
    return out


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "data/08_reporting/behaviour_fingerprint.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(fingerprint(), indent=1, sort_keys=True, default=str), encoding="utf-8")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
