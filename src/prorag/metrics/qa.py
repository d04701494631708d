"""Answer metrics with the SQuAD / FlashRAG answer normalization.

Each metric takes a prediction and the list of golden answers and returns the best score over the
golden answers, a float in [0, 1].
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
from scipy.stats import bootstrap

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse white space."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str | None, golden_answers: Iterable[str]) -> float:
    """1.0 if the normalized prediction equals a normalized golden answer."""
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(gold) for gold in _as_list(golden_answers)))


def cover_exact_match(prediction: str | None, golden_answers: Iterable[str]) -> float:
    """1.0 if a normalized golden answer is a substring of the normalized prediction (HiPRAG's CEM).

    Plain substring containment, as in the paper (§4.1) and the R1-Searcher / FlashRAG evaluators it cites,
    so the numbers are comparable; note that this lets "1990" cover "199". An empty normalized golden answer
    never matches.
    """
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    return float(any(gold and gold in predicted for gold in map(normalize_answer, _as_list(golden_answers))))


def f1_score(prediction: str | None, golden_answers: Iterable[str]) -> float:
    """Token-level F1 (SQuAD), best over the golden answers.

    As in the FlashRAG evaluator, a yes/no/noanswer answer only scores when the prediction is the same word.
    """
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    best = 0.0
    for gold in _as_list(golden_answers):
        normalized = normalize_answer(gold)
        special = {"yes", "no", "noanswer"}
        if (predicted in special or normalized in special) and predicted != normalized:
            continue
        common = Counter(predicted.split()) & Counter(normalized.split())
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(predicted.split())
        recall = overlap / len(normalized.split())
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def bootstrap_interval(scores: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-question ``scores`` (seeded: same input, same interval).

    The percentile method (not BCa) because answer scores are mostly 0/1 on a few dozen questions, where BCa's
    jackknife degenerates. Fewer than two scores have no interval: ``(nan, nan)``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    values = np.asarray(scores, dtype=float)
    if values.size < 2:
        return math.nan, math.nan
    if np.all(values == values[0]):  # every resample has the same mean
        return float(values[0]), float(values[0])
    result = bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=resamples,
                       method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


ANSWER_METRICS = {"cem": cover_exact_match, "em": exact_match, "f1": f1_score}


def answer_intervals(predictions: Sequence[str | None], golden_answers: Sequence[Iterable[str]], *,
                     confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict[str, float]:
    """``{cem_low, cem_high, em_low, em_high, f1_low, f1_high}``: bootstrap intervals over the questions."""
    if len(predictions) != len(golden_answers):
        raise ValueError(f"{len(predictions)} predictions for {len(golden_answers)} golden answer lists")
    intervals: dict[str, float] = {}
    for name, metric in ANSWER_METRICS.items():
        scores = [metric(prediction, gold) for prediction, gold in zip(predictions, golden_answers, strict=True)]
        low, high = bootstrap_interval(scores, confidence=confidence, resamples=resamples, seed=seed)
        intervals[f"{name}_low"], intervals[f"{name}_high"] = low, high
    return intervals


def _as_list(golden_answers: Iterable[str]) -> list[str]:
    if isinstance(golden_answers, str):
        return [golden_answers]
    return list(golden_answers)
