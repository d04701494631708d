"""Choosing questions: by source file, first N of each, never an excluded (evaluated) question — the one selector
that indexing, rollouts, SFT synthesis and RL share.

Each source's questions fall in two parts, by position in the source: the **tuning part** (its first
``ceil(n * tuning_fraction)`` questions) on which recipes are chosen, and the **reporting part** (the rest) on which
tables are reported (data/01_raw/README.md). The parts depend only on the order of the prepared questions, so any
file of the schema splits the same way.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from math import ceil
from typing import Any, Final, Literal

from pydantic import Field

from prorag.config import PositiveInt, StrictModel
from prorag.data.records import Question, normalize_text

logger = logging.getLogger(__name__)

QuestionPart = Literal["all", "tuning", "reporting"]
TUNING_FRACTION: Final = 0.5
"""Share of each source's questions (its first ones) in the tuning part."""


def question_parts(questions: Sequence[Question], tuning_fraction: float = TUNING_FRACTION) -> dict[str, str]:
    """Each question's key -> ``tuning`` or ``reporting``: the first ``ceil(n * tuning_fraction)`` of the ``n``
    questions of its source (in input order) are the tuning part, the rest the reporting part."""
    if not 0.0 < tuning_fraction < 1.0:
        raise ValueError(f"tuning_fraction must be between 0 and 1 (exclusive), not {tuning_fraction}")
    sizes = Counter(question.source for question in questions)
    seen: Counter[str] = Counter()
    parts = {}
    for question in questions:
        parts[question.key] = "tuning" if seen[question.source] < ceil(sizes[question.source] * tuning_fraction) \
            else "reporting"
        seen[question.source] += 1
    return parts


def question_text_key(question: Question) -> str:
    """The question text as compared for train/evaluation disjointness (case- and space-insensitive)."""
    return normalize_text(question.question).casefold()


def select_questions(questions: Iterable[Question], sources: Sequence[str] | None = None, *,
                     max_per_source: int | None = None, exclude: Iterable[Question] = (),
                     exclude_split_kinds: Collection[str] = (), setting: str = "sources",
                     part: QuestionPart = "all", tuning_fraction: float = TUNING_FRACTION) -> list[Question]:
    """The first ``max_per_source`` questions of each of ``sources`` (file stems; None: every source), in input
    order, leaving out every question of ``exclude`` (by key *and* by question text, so a training set stays
    disjoint from the evaluated questions even across files) and every question whose
    :attr:`~prorag.data.records.Question.split_kind` is in ``exclude_split_kinds``. ``part`` keeps only the tuning or
    the reporting part of each source (:func:`question_parts`, over every question of ``questions``).

    A source that no question comes from is an error naming ``setting`` (the parameter that listed it), and so is a
    listed source all of whose questions are of an excluded split kind.
    """
    pool = list(questions)
    parts = question_parts(pool, tuning_fraction) if part != "all" else {}
    if sources is not None:
        available = list(dict.fromkeys(question.source for question in pool))
        unknown = sorted(set(sources) - set(available))
        if unknown:
            raise ValueError(f"{setting} names {unknown}, not among the question sources {available}")
        emptied = sorted(source for source in sources
                         if all(q.split_kind in exclude_split_kinds for q in pool if q.source == source))
        if emptied:
            raise ValueError(f"{setting} names {emptied}, whose questions are all of split "
                             f"{sorted(exclude_split_kinds)}, which this selection leaves out")
    excluded = list(exclude)
    excluded_keys = {question.key for question in excluded}
    excluded_texts = {question_text_key(question) for question in excluded}
    taken: Counter[str] = Counter()
    selected = []
    for question in pool:
        if (sources is not None and question.source not in sources) or question.key in excluded_keys \
                or question.split_kind in exclude_split_kinds or question_text_key(question) in excluded_texts \
                or (part != "all" and parts[question.key] != part):
            continue
        if max_per_source is None or taken[question.source] < max_per_source:
            taken[question.source] += 1
            selected.append(question)
    return selected


class QuestionSelection(StrictModel):
    """Which prepared questions to roll out: by source file stem, first N of each (the ``questions`` block of the
    rollout and compare parameters)."""

    sources: list[str] | None = None
    max_per_source: PositiveInt | None = None
    include_train_split: bool = False
    """Evaluate on dev/test splits only (false): questions whose ``split`` is a train split are left out."""
    part: QuestionPart = "all"
    """``reporting``: only each source's reporting part (the questions no recipe was tuned on); ``tuning``: only
    its tuning part; ``all``: both (:func:`question_parts`)."""
    tuning_fraction: float = Field(default=TUNING_FRACTION, gt=0.0, lt=1.0)


def pick_questions(question_records: list[dict[str, Any]], selection: QuestionSelection, *,
                   setting: str, required: bool = True) -> list[dict[str, Any]]:
    """The records of the questions ``selection`` picks (in input order); ``setting`` names it in errors. An empty
    pick is an error when ``required``."""
    questions = [Question.from_dict(record) for record in question_records]
    chosen = {question.key for question in select_questions(
        questions, selection.sources, max_per_source=selection.max_per_source,
        exclude_split_kinds=() if selection.include_train_split else ("train",), setting=setting,
        part=selection.part, tuning_fraction=selection.tuning_fraction)}
    if not chosen and required:
        raise ValueError(f"{setting.rsplit('.', 1)[0]} selects no question")
    return [record for record, question in zip(question_records, questions, strict=True) if question.key in chosen]


def warn_non_train_splits(questions: Sequence[Question], setting: str) -> dict[str, int]:
    """Log a warning naming the sources of training questions that are not of a train split (the embedded default
    trains on HotpotQA dev questions the evaluation does not use, as no HotpotQA train split ships with the data);
    returns the count per split kind."""
    kinds = Counter(question.split_kind for question in questions)
    others = sorted({question.source for question in questions if question.split_kind != "train"})
    if others:
        logger.warning("%s: %d of %d training questions are not of a train split (sources %s); they are disjoint "
                       "from the evaluated questions, but a paper-scale run trains on train splits only",
                       setting, len(questions) - kinds["train"], len(questions), others)
    return dict(kinds)


def require_train_split(questions: Sequence[Question], setting: str) -> None:
    """Refuse training questions that are not of a train split: an SFT example (and any prompt example) must never
    hold a dev or test question (``ValueError`` naming the setting, the sources and a few keys)."""
    others = [question for question in questions if question.split_kind != "train"]
    if others:
        sources = sorted({question.source for question in others})
        keys = ", ".join(question.key for question in others[:5])
        raise ValueError(f"{setting}: {len(others)} of {len(questions)} questions are not of a train split "
                         f"(sources {sources}; e.g. {keys}); SFT examples come from train splits only — list "
                         "train-split question files there (split: train)")
