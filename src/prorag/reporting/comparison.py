"""The method comparison as a researcher reads it: a table per arm and dataset with intervals, paired tests, a
Markdown report and three plots (accuracy with intervals, the efficiency frontier, search behaviour)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prorag.agent.trajectory import Rollout
from prorag.metrics.compare import (
    SCORE_COLUMNS,
    macro_interval,
    macro_mean,
    paired_tests,
    paired_tests_table,
    question_scores,
    questions_needed,
)
from prorag.metrics.qa import bootstrap_interval
from prorag.metrics.rollout import summarize_rollouts
from prorag.protocol.registry import is_protocol
from prorag.redaction import redact_text
from prorag.reporting.cells import missing, percent, with_interval

MACRO = "macro"
BEHAVIOUR_COLUMNS = ("format_rate", "avg_steps", "avg_retrieval_count", "avg_generated_tokens",
                     "context_tokens_per_retrieval")
SEARCH_COLUMNS = ("osr", "usr", "unknown_rate", "search_ratio")


@dataclass(frozen=True)
class ComparisonInputs:
    """What the comparison is computed from: the arms' rollouts on the same questions, the arms table (what ran,
    what was skipped), the reward-judging metrics (OSR/USR per method and dataset), the LLM judge's answer
    verdicts (may be empty), the reference arm, and the statistics settings."""

    rollouts: Sequence[Rollout]
    arms: pd.DataFrame
    judge_metrics: dict[str, Any]
    answer_verdicts: pd.DataFrame
    reference: str
    answer_judge: dict[str, Any] | None = None
    confidence: float = 0.95
    bootstrap_resamples: int = 2000
    permutation_resamples: int = 9999
    seed: int = 0

    def methods(self) -> list[str]:
        """The arms that ran, in the configured order."""
        present = {rollout.method for rollout in self.rollouts}
        ordered = [arm for arm in self.arms.loc[self.arms["status"] == "ran", "arm"] if arm in present]
        return ordered + sorted(present - set(ordered))


def comparison_table(inputs: ComparisonInputs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per arm and dataset plus a ``macro`` row per arm (every dataset weighs the same): EM, F1 and CEM
    with bootstrap intervals (stratified by dataset for ``macro``), behaviour and token cost, OSR/USR with the
    unknown rate and search ratio (reward judging; empty for the single-shot baselines), LLM-judge accuracy
    (``lasj``, unknown verdicts excluded, their share in ``lasj_unknown``). And the paired tests of every pair."""
    scores = question_scores(inputs.rollouts)
    lasj = _lasj_by_question(inputs.answer_verdicts)
    rows: list[dict[str, Any]] = []
    for method in inputs.methods():
        method_scores = scores[scores["method"] == method]
        mine = [rollout for rollout in inputs.rollouts if rollout.method == method]
        by_dataset = {dataset: [r for r in mine if (r.dataset or "unknown") == dataset]
                      for dataset in sorted(set(method_scores["dataset"]))}
        judged = inputs.judge_metrics.get(method, {})
        dataset_rows = []
        for dataset, items in by_dataset.items():
            subset = method_scores[method_scores["dataset"] == dataset]
            summary = summarize_rollouts(items)
            row: dict[str, Any] = {"method": method, "dataset": dataset, "n": len(subset)}
            for metric in SCORE_COLUMNS:
                row[metric] = float(subset[metric].mean())
                row[f"{metric}_low"], row[f"{metric}_high"] = bootstrap_interval(
                    subset[metric].tolist(), confidence=inputs.confidence, resamples=inputs.bootstrap_resamples,
                    seed=inputs.seed)
            row.update({column: summary[column] for column in BEHAVIOUR_COLUMNS})
            if not any(is_protocol(item.protocol) for item in items):
                row["format_rate"] = math.nan  # a single-shot baseline has no protocol format to follow
            search = judged.get("by_dataset", {}).get(dataset, {})
            row.update({column: search.get(column, math.nan) for column in SEARCH_COLUMNS})
            row.update(_lasj(lasj, method, dataset))
            dataset_rows.append(row)
        rows.extend(dataset_rows)
        rows.append(_macro_row(method, method_scores, dataset_rows, judged, inputs))
    table = pd.DataFrame(rows)
    tests = paired_tests_table(paired_tests(
        scores[scores["method"].isin(inputs.methods())], confidence=inputs.confidence,
        bootstrap_resamples=inputs.bootstrap_resamples, permutation_resamples=inputs.permutation_resamples,
        seed=inputs.seed))
    return table, tests


def _macro_row(method: str, scores: pd.DataFrame, dataset_rows: list[dict[str, Any]], judged: dict[str, Any],
               inputs: ComparisonInputs) -> dict[str, Any]:
    row: dict[str, Any] = {"method": method, "dataset": MACRO, "n": len(scores)}
    for metric in SCORE_COLUMNS:
        row[metric] = macro_mean(scores[metric], scores["dataset"])
        row[f"{metric}_low"], row[f"{metric}_high"] = macro_interval(
            scores[metric], scores["dataset"], confidence=inputs.confidence, resamples=inputs.bootstrap_resamples,
            seed=inputs.seed)
    for column in (*BEHAVIOUR_COLUMNS, "lasj", "lasj_unknown"):
        values = [r[column] for r in dataset_rows if not missing(r.get(column))]
        row[column] = float(np.mean(values)) if values else math.nan
    row.update({column: judged.get(column, math.nan) for column in SEARCH_COLUMNS})
    return row


def _lasj_by_question(verdicts: pd.DataFrame) -> pd.DataFrame:
    if verdicts.empty:
        return verdicts
    frame = verdicts.copy()
    frame["known"] = frame["correct"].notna()
    frame["value"] = frame["correct"].map(
        lambda value: float(value) if isinstance(value, bool | np.bool_) else math.nan)
    return frame


def _lasj(frame: pd.DataFrame, method: str, dataset: str) -> dict[str, float]:
    if frame.empty:
        return {"lasj": math.nan, "lasj_unknown": math.nan}
    subset = frame[(frame["method"] == method) & (frame["dataset"] == dataset)]
    if subset.empty:
        return {"lasj": math.nan, "lasj_unknown": math.nan}
    known = subset[subset["known"]]
    return {"lasj": float(known["value"].mean()) if len(known) else math.nan,
            "lasj_unknown": float(1.0 - subset["known"].mean())}


# ------------------------------------------------------------------------------------------------ the report


def render_report(inputs: ComparisonInputs, table: pd.DataFrame, tests: pd.DataFrame) -> str:
    """``comparison.md``: what was compared, the macro table, CEM per dataset, paired tests against the
    reference arm, the LLM judge's settings, and how to read each column."""
    macro = table[table["dataset"] == MACRO].set_index("method")
    datasets = [d for d in dict.fromkeys(table["dataset"]) if d != MACRO]
    counts = table[table["dataset"] != MACRO].groupby("dataset")["n"].max()
    pct = round(inputs.confidence * 100)
    lines = ["# Method comparison", "",
             f"Every arm answered the same {int(counts.sum())} questions ("
             + ", ".join(f"{dataset} {int(counts[dataset])}" for dataset in datasets)
             + f"). Intervals are {pct}% percentile bootstraps over questions (stratified by dataset for the macro "
             "average, which weighs every dataset the same).", "", "## Arms", "",
             "| arm | status | adapter (version) | note |", "|---|---|---|---|"]
    for arm in inputs.arms.astype(object).where(inputs.arms.notna(), "").to_dict("records"):
        adapter = f"{arm['adapter']} ({arm['adapter_version']})" if arm["adapter"] else "base policy"
        lines.append(f"| {arm['arm']} | {arm['status']} | {adapter} | {arm['reason']} |")
    lines += ["", "## Results, macro-averaged over datasets", "", *macro_table_lines(table)]
    lines += ["", "## CEM per dataset", "", "| arm | " + " | ".join(datasets) + " | macro |",
              "|---" * (len(datasets) + 2) + "|"]
    per_dataset = table.set_index(["method", "dataset"])
    for method in macro.index:
        cells = [with_interval(per_dataset.loc[(method, dataset)], "cem") if (method, dataset) in per_dataset.index
                 else "–" for dataset in datasets]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {with_interval(macro.loc[method], 'cem')} |")
    lines += _tests_section(tests, inputs.reference, pct)
    if inputs.answer_judge is not None:
        judge = inputs.answer_judge
        lines += ["", "## LLM judge", "",
                  f"Answers judged by `{judge['model']}` at `{judge['base_url']}` (timeout {judge['timeout']} s, "
                  f"{judge['max_retries']} retries). A timeout, an error or an unparsable reply is an *unknown* "
                  "verdict: it is left out of the accuracy and counted in the unknown share, never as correct."]
    lines += ["", "## How to read this", "",
              "- **CEM** (cover exact match): the normalized golden answer appears in the normalized answer "
              "(HiPRAG's metric); **EM**: they are equal; **F1**: token overlap. 0–1, higher is better.",
              "- **format**: share of trajectories that follow their protocol's format to the end.",
              "- **steps / retrievals**: reasoning steps and search calls per question; **output tokens**: tokens "
              "the policy wrote; **context tokens / retrieval**: retrieved text fed back per search call.",
              "- **OSR** (over-search rate): share of search steps whose answer the policy already knew without "
              "searching; **USR** (under-search rate): share of non-search steps that were wrong (HiPRAG eq. 2). "
              "**unknown**: share of steps the judge could not decide. Empty for the single-shot baselines.",
              "- **Δ**: difference of means on the questions both arms answered; **p**: two-sided paired "
              "permutation test; **p (Holm)**: adjusted over every pair of arms; **questions for 80% power**: "
              "how many questions a paired test would need to call the observed Δ significant at 5%.",
              "", "## Plots", "",
              "`comparison_accuracy.png` (CEM per dataset with intervals), `comparison_efficiency.png` (CEM against "
              "output tokens and against retrievals: the efficiency frontier), `comparison_search.png` (OSR and USR "
              "per arm). They are attached to the MLflow run too.", ""]
    return redact_text("\n".join(lines))  # a judge's base_url may carry credentials


def macro_table_lines(table: pd.DataFrame) -> list[str]:
    """The Markdown table of :func:`comparison_table`'s macro rows: per arm CEM, EM, F1 with intervals, format,
    steps, retrievals, tokens, OSR, USR, the unknown rate (and the LLM judge's accuracy when it ran)."""
    macro = table[table["dataset"] == MACRO].set_index("method")
    has_lasj = "lasj" in macro and macro["lasj"].notna().any()
    header = ("| arm | CEM | EM | F1 | format | steps | retrievals | output tokens | context tokens / retrieval "
              "| OSR | USR | unknown |" + (" LLM judge |" if has_lasj else ""))
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for method, row in macro.iterrows():
        cells = [with_interval(row, "cem"), with_interval(row, "em"), with_interval(row, "f1"),
                 percent(row["format_rate"]), f"{row['avg_steps']:.2f}", f"{row['avg_retrieval_count']:.2f}",
                 f"{row['avg_generated_tokens']:.0f}", f"{row['context_tokens_per_retrieval']:.0f}",
                 percent(row["osr"]), percent(row["usr"]), percent(row["unknown_rate"])]
        if has_lasj:
            cells.append(f"{percent(row['lasj'])} ({percent(row['lasj_unknown'])} unknown)")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _tests_section(tests: pd.DataFrame, reference: str, pct: int) -> list[str]:
    lines = ["", f"## Against {reference} (paired, CEM)", ""]
    rows = tests[(tests["metric"] == "cem") & ((tests["method_a"] == reference) | (tests["method_b"] == reference))]
    if rows.empty:
        return [*lines, f"{reference} did not run, or no other arm did: nothing to test.", ""]
    lines += [f"| arm | Δ CEM vs {reference} [{pct}% CI] | better / worse / tied | p | p (Holm) "
              "| questions for 80% power |", "|---|---|---|---|---|---|"]
    for row in rows.to_dict("records"):
        flip = row["method_a"] == reference  # report arm − reference
        arm = row["method_b"] if flip else row["method_a"]
        sign = -1.0 if flip else 1.0
        low, high = sorted((sign * row["low"], sign * row["high"]))
        better, worse = (row["losses"], row["wins"]) if flip else (row["wins"], row["losses"])
        needed = questions_needed(sign * row["difference"], row["sd_difference"])
        lines.append(f"| {arm} | {sign * row['difference']:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     f"{better} / {worse} / {row['ties']} | {row['p_value']:.3g} | {row['p_holm']:.3g} | "
                     f"{needed if needed >= 0 else '–'} |")
    return [*lines, "", "Every pair and metric (EM, F1 too) is in `comparison_tests.csv`."]


# ------------------------------------------------------------------------------------------------- the plots


def accuracy_figure(table: pd.DataFrame) -> Figure:
    """CEM per dataset (and macro) per arm, with the bootstrap intervals as error bars."""
    datasets = list(dict.fromkeys(table["dataset"]))
    methods = list(dict.fromkeys(table["method"]))
    figure = Figure(figsize=(max(6.0, 1.2 * len(datasets) * max(1, len(methods)) / 3), 4.0), layout="constrained")
    axes = figure.subplots()
    width = 0.8 / max(1, len(methods))
    for offset, method in enumerate(methods):
        rows = table[table["method"] == method].set_index("dataset").reindex(datasets)
        centers = np.arange(len(datasets)) + (offset - (len(methods) - 1) / 2) * width
        errors = np.array([(rows["cem"] - rows["cem_low"]).clip(lower=0).fillna(0),
                           (rows["cem_high"] - rows["cem"]).clip(lower=0).fillna(0)])
        axes.bar(centers, rows["cem"].fillna(0), width, yerr=errors, capsize=2, label=method)
    axes.set_xticks(np.arange(len(datasets)), datasets, rotation=20)
    axes.set_ylabel("CEM")
    axes.set_ylim(0, 1)
    axes.set_title("Accuracy per dataset (95% bootstrap intervals)")
    axes.legend(fontsize="small", ncols=2)
    return figure


def efficiency_figure(table: pd.DataFrame) -> Figure:
    """Macro CEM against output tokens and against retrievals per question: the efficiency frontier. One marker
    and colour per arm, named in a legend (labels written beside the points overlapped where arms coincide)."""
    macro = table[table["dataset"] == MACRO]
    figure = Figure(figsize=(10.0, 4.5), layout="constrained")
    markers = "osD^vP*Xh<>p"
    for axes, column, label in zip(figure.subplots(1, 2), ("avg_generated_tokens", "avg_retrieval_count"),
                                   ("output tokens per question", "retrievals per question"), strict=True):
        for index, (_, row) in enumerate(macro.iterrows()):
            errors = [[max(row["cem"] - row["cem_low"], 0) if not missing(row["cem_low"]) else 0],
                      [max(row["cem_high"] - row["cem"], 0) if not missing(row["cem_high"]) else 0]]
            axes.errorbar([row[column]], [row["cem"]], yerr=errors, fmt=markers[index % len(markers)], capsize=3,
                          color=f"C{index % 10}", alpha=0.85, label=row["method"])
        axes.set_xlabel(label)
        axes.set_ylabel("CEM (macro)")
        axes.set_ylim(0, 1)
    figure.legend(*figure.axes[0].get_legend_handles_labels(), loc="outside lower center",
                  ncols=min(len(macro), 5), fontsize="small")
    figure.suptitle("Accuracy against cost")
    return figure


def search_figure(table: pd.DataFrame) -> Figure:
    """Over- and under-search rates per arm (macro), with the share of unknown verdicts."""
    macro = table[(table["dataset"] == MACRO) & table["osr"].notna()]
    figure = Figure(figsize=(max(5.0, 0.9 * len(macro) + 2), 4.0), layout="constrained")
    axes = figure.subplots()
    centers = np.arange(len(macro))
    axes.bar(centers - 0.2, macro["osr"], 0.4, label="OSR (over-search)")
    axes.bar(centers + 0.2, macro["usr"].fillna(0), 0.4, label="USR (under-search)")
    for center, unknown in zip(centers, macro["unknown_rate"], strict=True):
        if not missing(unknown):
            axes.annotate(f"{100 * unknown:.0f}% unknown", (center, 0.02), ha="center", fontsize="x-small")
    axes.set_xticks(centers, list(macro["method"]), rotation=20)
    axes.set_ylim(0, 1)
    axes.set_ylabel("rate")
    axes.set_title("Search behaviour (agent arms)")
    axes.legend(fontsize="small")
    return figure
