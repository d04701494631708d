"""Methods compared on the same questions: per-question scores, macro averages over datasets with stratified
bootstrap intervals, and paired significance tests corrected for multiple comparisons."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from statistics import fmean

import numpy as np
import pandas as pd
from scipy.stats import bootstrap, norm, permutation_test

from prorag.agent.trajectory import Rollout
from prorag.metrics.qa import ANSWER_METRICS

SCORE_COLUMNS = tuple(ANSWER_METRICS)
"""``cem``, ``em``, ``f1``: the answer metrics every comparison reports."""


def question_scores(rollouts: Iterable[Rollout]) -> pd.DataFrame:
    """One row per (method, question): ``method, question_key, dataset, cem, em, f1`` — each the mean over the
    question's samples, so a method sampled several times per question weighs as one."""
    groups: dict[tuple[str, str], list[Rollout]] = {}
    for rollout in rollouts:
        groups.setdefault((rollout.method, rollout.question_key), []).append(rollout)
    rows = [{"method": method, "question_key": key, "dataset": items[0].dataset or "unknown",
             **{name: fmean(metric(item.answer, item.golden_answers) for item in items)
                for name, metric in ANSWER_METRICS.items()}}
            for (method, key), items in groups.items()]
    return pd.DataFrame(rows, columns=["method", "question_key", "dataset", *SCORE_COLUMNS])


def macro_mean(values: pd.Series, datasets: pd.Series) -> float:
    """The mean over datasets of each dataset's mean (every dataset weighs the same, as the papers average)."""
    return float(values.groupby(datasets.to_numpy()).mean().mean())


def macro_interval(values: pd.Series, datasets: pd.Series, *, confidence: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """Percentile interval of :func:`macro_mean` by a bootstrap stratified by dataset (questions resampled within
    each dataset, so every resample keeps each dataset's size). No interval for fewer than two questions."""
    if len(values) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    per_dataset = [group.to_numpy(dtype=float) for _, group in values.groupby(datasets.to_numpy())]
    means = np.zeros(resamples)
    for scores in per_dataset:
        means += scores[rng.integers(0, len(scores), size=(resamples, len(scores)))].mean(axis=1)
    means /= len(per_dataset)
    tail = (1.0 - confidence) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


@dataclass(frozen=True)
class PairedTest:
    """Method ``a`` against method ``b`` on the questions both answered, for one metric.

    ``difference`` is mean(a) − mean(b) with a paired bootstrap interval (``sd_difference``: the standard deviation
    of the per-question differences, for :func:`questions_needed`); ``p_value`` is a two-sided paired
    permutation test (the signs of the per-question differences flipped at random; exact when there are few
    enough distinct flips); ``p_holm`` is Holm's adjustment over every pair tested for the metric.
    """

    metric: str
    method_a: str
    method_b: str
    n: int
    mean_a: float
    mean_b: float
    difference: float
    sd_difference: float
    low: float
    high: float
    p_value: float
    p_holm: float
    wins: int
    losses: int
    ties: int


def paired_test(scores_a: Sequence[float], scores_b: Sequence[float], *, confidence: float = 0.95,
                bootstrap_resamples: int = 2000, permutation_resamples: int = 9999,
                seed: int = 0) -> dict[str, float | int]:
    """Paired comparison of two methods' per-question scores (same questions, same order)."""
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired scores differ in length: {a.size} and {b.size}")
    differences = a - b
    result: dict[str, float | int] = {
        "n": int(a.size), "mean_a": _mean(a), "mean_b": _mean(b), "difference": _mean(differences),
        "sd_difference": float(differences.std(ddof=1)) if a.size >= 2 else math.nan,
        "wins": int((differences > 0).sum()), "losses": int((differences < 0).sum()),
        "ties": int((differences == 0).sum())}
    if a.size < 2 or np.all(differences == differences[0]):
        value = float(differences[0]) if a.size else math.nan
        result.update(low=value, high=value, p_value=1.0 if a.size and value == 0 else math.nan)
        if a.size >= 2 and value != 0:  # every question moved the same way: as extreme as it gets
            result["p_value"] = _sign_flip_floor(a.size)
        return result
    rng = np.random.default_rng(seed)
    interval = bootstrap((differences,), np.mean, confidence_level=confidence, n_resamples=bootstrap_resamples,
                         method="percentile", rng=rng).confidence_interval
    test = permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
                            n_resamples=permutation_resamples, alternative="two-sided", vectorized=True, rng=rng)
    result.update(low=float(interval.low), high=float(interval.high), p_value=float(test.pvalue))
    return result


def paired_tests(scores: pd.DataFrame, *, metrics: Sequence[str] = SCORE_COLUMNS, confidence: float = 0.95,
                 bootstrap_resamples: int = 2000, permutation_resamples: int = 9999,
                 seed: int = 0) -> list[PairedTest]:
    """Every pair of methods in a :func:`question_scores` table, per metric, on the questions both answered;
    Holm-adjusted over the pairs of each metric."""
    methods = list(dict.fromkeys(scores["method"]))
    by_method = {method: scores[scores["method"] == method].set_index("question_key") for method in methods}
    tests: list[PairedTest] = []
    for metric in metrics:
        rows = []
        for first, second in itertools.combinations(methods, 2):
            common = by_method[first].index.intersection(by_method[second].index)
            figures = paired_test(by_method[first].loc[common, metric].to_numpy(),
                                  by_method[second].loc[common, metric].to_numpy(), confidence=confidence,
                                  bootstrap_resamples=bootstrap_resamples,
                                  permutation_resamples=permutation_resamples, seed=seed)
            rows.append({"metric": metric, "method_a": first, "method_b": second, **figures})
        adjusted = holm([float(row["p_value"]) for row in rows])
        tests.extend(PairedTest(**row, p_holm=p) for row, p in zip(rows, adjusted, strict=True))
    return tests


def paired_tests_table(tests: Sequence[PairedTest]) -> pd.DataFrame:
    """:func:`paired_tests` as a table (one row per metric and pair)."""
    columns = list(PairedTest.__dataclass_fields__)
    return pd.DataFrame([asdict(test) for test in tests], columns=columns)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (NaN stays NaN). Written here: scipy has only Benjamini–Hochberg
    (``false_discovery_control``) and statsmodels is a heavy dependency for six lines."""
    order = sorted((p, position) for position, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, position) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[position] = running
    return adjusted


def questions_needed(difference: float, spread: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Questions a paired test needs to detect a mean ``difference`` with ``power`` at level ``alpha``, when the
    per-question differences have standard deviation ``spread`` (normal approximation); -1 for no difference."""
    if math.isnan(difference) or math.isnan(spread) or difference == 0:
        return -1  # no difference to detect
    return math.ceil(((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * spread / abs(difference)) ** 2)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def _sign_flip_floor(n: int) -> float:
    """The two-sided sign-flip p-value when every difference has the same sign and size: 2 / 2^n."""
    return min(1.0, 2.0 / 2.0**n)
