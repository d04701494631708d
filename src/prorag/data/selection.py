"""Choosing training questions: by source file, first N of each, never an evaluated question."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from prorag.data.records import Question


def select_training_questions(questions: Iterable[Question], sources: Sequence[str], *,
                              max_per_source: int | None = None, exclude_keys: Iterable[str] = (),
                              setting: str = "sources") -> list[Question]:
    """The first ``max_per_source`` questions of each of ``sources`` (file stems) whose key is not excluded.

    A source that no question comes from is an error naming ``setting`` (the parameter that listed it).
    """
    pool = list(questions)
    unknown = sorted(set(sources) - {question.source or question.dataset for question in pool})
    if unknown:
        raise ValueError(f"{setting} names {unknown}, not among the question sources")
    excluded = set(exclude_keys)
    taken: Counter[str] = Counter()
    selected = []
    for question in pool:
        source = question.source or question.dataset
        if source not in sources or question.key in excluded:
            continue
        if max_per_source is None or taken[source] < max_per_source:
            taken[source] += 1
            selected.append(question)
    return selected
