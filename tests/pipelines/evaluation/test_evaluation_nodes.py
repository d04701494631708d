"""Evaluation node: per-dataset and overall rows with seeded bootstrap intervals for CEM, EM and F1."""

from __future__ import annotations

import math

import pytest

from prorag.agent import Rollout
from prorag.pipelines.evaluation.nodes import evaluate_trajectories


def rollout(key: str, dataset: str, answer: str | None, gold: str) -> dict:
    return Rollout(question_key=key, question_id=key, dataset=dataset, question="q", golden_answers=(gold,),
                   method="hiprag", protocol="hiprag", prompt="p", prompt_token_ids=[1], completion="",
                   segments=[], steps=None, format_ok=False, n_steps=-1, answer=answer, stop_reason="answer",
                   retrieval_count=0, queries=[], retrieved_ids=[], generated_tokens=0, context_tokens=0,
                   tag_tokens=0, turns=1).to_dict()


def test_rows_carry_intervals_per_dataset_and_overall():
    records = [rollout(f"h{i}", "hotpotqa", "Paris" if i % 2 else "Rome", "Paris") for i in range(10)]
    records += [rollout(f"p{i}", "popqa", "Oslo", "Oslo") for i in range(10)]
    table, metrics = evaluate_trajectories(records)
    assert list(table["dataset"]) == ["all", "hotpotqa", "popqa"]
    for column in ("cem", "em", "f1"):
        assert (table[f"{column}_low"] <= table[column]).all() and (table[column] <= table[f"{column}_high"]).all()
    hotpot = metrics["hiprag"]["hotpotqa"]
    assert hotpot["cem"] == 0.5 and 0.1 < hotpot["cem_low"] < 0.5 < hotpot["cem_high"] < 0.9
    assert metrics["hiprag"]["popqa"]["em_low"] == metrics["hiprag"]["popqa"]["em_high"] == 1.0
    macro = metrics["hiprag"]["macro"]  # the mean over datasets, the key compare's method runs log too
    assert macro["cem"] == pytest.approx((0.5 + 1.0) / 2) and "n" not in macro
    again, _ = evaluate_trajectories(records)
    assert again.equals(table)  # seeded
    single, _ = evaluate_trajectories(records[:1])
    assert math.isnan(single["f1_low"].iloc[0])
