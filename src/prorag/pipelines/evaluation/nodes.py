"""Nodes of the evaluation pipeline."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

from prorag.agent import Rollout
from prorag.metrics.qa import answer_intervals
from prorag.metrics.rollout import summarize_by_method_and_dataset
from prorag.reporting.summary import render_summary, result_summary

BOOTSTRAP_SEED = 0  # fixed: the same trajectories always give the same intervals


def evaluate_trajectories(trajectory_records: list[dict[str, Any]]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One row per (method, dataset) and per method overall; the same numbers as metrics for MLflow.

    CEM, EM and F1 come with seeded percentile-bootstrap 95% intervals over the questions of the row
    (``cem_low``/``cem_high``, …): with a few dozen dev questions a difference inside them is noise.
    """
    rollouts = [Rollout.from_dict(record) for record in trajectory_records]
    summaries = summarize_by_method_and_dataset(rollouts)
    groups: dict[str, dict[str, list[Rollout]]] = defaultdict(lambda: defaultdict(list))
    for rollout in rollouts:
        groups[rollout.method][rollout.dataset or "unknown"].append(rollout)
        groups[rollout.method]["all"].append(rollout)
    for method, by_dataset in summaries.items():
        for dataset, summary in by_dataset.items():
            items = groups[method][dataset]
            summary.update(answer_intervals([r.answer for r in items], [r.golden_answers for r in items],
                                            seed=BOOTSTRAP_SEED))
    rows = [{"method": method, "dataset": dataset, **summary}
            for method, by_dataset in summaries.items() for dataset, summary in by_dataset.items()]
    metrics = {method: {**by_dataset, "macro": _macro(by_dataset)} for method, by_dataset in summaries.items()}
    return pd.DataFrame(rows), metrics


def _macro(by_dataset: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The mean over datasets of each number (the papers' average; ``compare`` logs the same keys)."""
    datasets = [summary for name, summary in by_dataset.items() if name != "all"]
    keys = [key for key, value in datasets[0].items() if isinstance(value, (int, float))] if datasets else []
    return {key: float(np.nanmean([float(summary.get(key, np.nan)) for summary in datasets])) for key in keys
            if key != "n"}


def summarize_results(trajectory_records: list[dict[str, Any]]) -> str:
    """The run's result on one screen (:func:`prorag.reporting.summary.result_summary`): per method CEM with its 95%
    interval, format, retrievals, tokens and the paired Δ CEM against standard RAG, as Markdown."""
    rollouts = [Rollout.from_dict(record) for record in trajectory_records]
    return render_summary(result_summary(rollouts, seed=BOOTSTRAP_SEED))
