"""The result of a run on one screen: per method CEM with its interval, format, retrievals, tokens, and the paired
difference in CEM against a reference method (standard RAG) on the questions both answered."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from prorag.agent.baselines import PROTOCOL as SHORT_ANSWER
from prorag.agent.trajectory import Rollout
from prorag.metrics.compare import paired_test, question_scores
from prorag.metrics.qa import bootstrap_interval
from prorag.metrics.rollout import summarize_rollouts
from prorag.reporting.cells import missing

SUMMARY_COLUMNS = ("method", "n", "cem", "cem_low", "cem_high", "format_rate", "avg_retrieval_count",
                   "avg_generated_tokens", "delta_cem", "delta_low", "delta_high", "wins", "losses")


def result_summary(rollouts: Sequence[Rollout], *, reference: str = "standard_rag", seed: int = 0,
                   resamples: int = 2000) -> pd.DataFrame:
    """One row per method in the order methods first appear: CEM over its questions with a percentile-bootstrap
    95% interval, format rate, mean retrievals and generated tokens, and — when ``reference`` ran — the paired
    difference CEM(method) − CEM(reference) with its paired-bootstrap interval and the questions won / lost."""
    methods = list(dict.fromkeys(rollout.method for rollout in rollouts))
    scores = question_scores(rollouts)
    by_method = {method: scores[scores["method"] == method].set_index("question_key") for method in methods}
    rows = []
    for method in methods:
        items = [rollout for rollout in rollouts if rollout.method == method]
        summary = summarize_rollouts(items)
        cem = by_method[method]["cem"].to_numpy()
        low, high = bootstrap_interval(cem, resamples=resamples, seed=seed)
        stepwise = any(rollout.protocol != SHORT_ANSWER for rollout in items)  # baselines have no step format
        row = {"method": method, "n": len(cem), "cem": float(cem.mean()) if len(cem) else math.nan,
               "cem_low": low, "cem_high": high,
               "format_rate": summary.get("format_rate", math.nan) if stepwise else math.nan,
               "avg_retrieval_count": summary.get("avg_retrieval_count", math.nan),
               "avg_generated_tokens": summary.get("avg_generated_tokens", math.nan)}
        if reference in by_method and method != reference:
            common = by_method[method].index.intersection(by_method[reference].index)
            test = paired_test(by_method[method].loc[common, "cem"].to_numpy(),
                               by_method[reference].loc[common, "cem"].to_numpy(), bootstrap_resamples=resamples,
                               permutation_resamples=999, seed=seed)
            row.update(delta_cem=test["difference"], delta_low=test["low"], delta_high=test["high"],
                       wins=test["wins"], losses=test["losses"])
        rows.append(row)
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def render_summary(table: pd.DataFrame, *, reference: str = "standard_rag") -> str:
    """:func:`result_summary` as a short Markdown table (CEM and Δ with 95% intervals)."""
    lines = [f"| method | n | CEM [95% CI] | format | retrievals | tokens | Δ CEM vs {reference} [95% CI] |",
             "|---|---:|---|---:|---:|---:|---|"]
    for row in table.to_dict("records"):
        lines.append(f"| {row['method']} | {row['n']} | {_interval(row, 'cem')} | "
                     f"{_percent(row['format_rate'])} | {_number(row['avg_retrieval_count'], 2)} | "
                     f"{_number(row['avg_generated_tokens'], 0)} | {_delta(row)} |")
    return "\n".join(lines) + "\n"


def _interval(row: dict, metric: str) -> str:
    value, low, high = row[metric], row[f"{metric}_low"], row[f"{metric}_high"]
    if missing(value):
        return "–"
    return f"{value:.3f}" if missing(low) else f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _delta(row: dict) -> str:
    if missing(row.get("delta_cem")):
        return "–"
    sign = "+" if row["delta_cem"] >= 0 else ""
    return (f"{sign}{row['delta_cem']:.3f} [{row['delta_low']:.3f}, {row['delta_high']:.3f}] "
            f"({int(row['wins'])} won, {int(row['losses'])} lost)")


def _percent(value: float) -> str:
    return "–" if missing(value) else f"{100 * value:.0f}%"


def _number(value: float, digits: int) -> str:
    return "–" if missing(value) else f"{value:.{digits}f}"
