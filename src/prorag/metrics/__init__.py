"""Evaluation metrics: answer matching (CEM, EM, F1) and search behaviour (OSR, USR, search ratio, LasJ)."""

from prorag.metrics.qa import (
    answer_intervals,
    bootstrap_interval,
    cover_exact_match,
    exact_match,
    f1_score,
    normalize_answer,
)
from prorag.metrics.search import (
    SearchBehaviour,
    judge_agreement,
    lasj_accuracy,
    over_search_rate,
    search_behaviour,
    search_ratio,
    under_search_rate,
    unknown_rate,
    unknown_share,
)

__all__ = [
    "SearchBehaviour",
    "answer_intervals",
    "bootstrap_interval",
    "cover_exact_match",
    "exact_match",
    "f1_score",
    "judge_agreement",
    "lasj_accuracy",
    "normalize_answer",
    "over_search_rate",
    "search_behaviour",
    "search_ratio",
    "under_search_rate",
    "unknown_rate",
    "unknown_share",
]
