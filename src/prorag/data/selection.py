"""Choosing questions: by source file, first N of each, never an excluded (evaluated) question — the one selector
that indexing, rollouts, SFT synthesis and RL share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from prorag.data.records import Question


def select_questions(questions: Iterable[Question], sources: Sequence[str] | None = None, *,
                     max_per_source: int | None = None, exclude_keys: Iterable[str] = (),
                     setting: str = "sources") -> list[Question]:
    """The first ``max_per_source`` questions of each of ``sources`` (file stems; None: every source) whose key
    is not excluded, in input order.

    A source that no question comes from is an error naming ``setting`` (the parameter that listed it).
    """
    pool = list(questions)
    if sources is not None:
        available = list(dict.fromkeys(question.source for question in pool))
        unknown = sorted(set(sources) - set(available))
        if unknown:
            raise ValueError(f"{setting} names {unknown}, not among the question sources {available}")
    excluded = set(exclude_keys)
    taken: Counter[str] = Counter()
    selected = []
    for question in pool:
        if (sources is not None and question.source not in sources) or question.key in excluded:
            continue
        if max_per_source is None or taken[question.source] < max_per_source:
            taken[question.source] += 1
            selected.append(question)
    return selected
