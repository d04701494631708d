"""The judge interface: a :class:`Verdict` per item and the :class:`Judge` protocol with three batch checks.

Meaning of ``Verdict.value`` for each check (``None`` always means *unknown*: the judge failed, timed out or
answered unparsably — never read it as a yes or a no):

* :meth:`Judge.equivalent` — ``True`` when the two statements are semantically equivalent (HiPRAG Figure 5).
  Applied to a search step's conclusion ``o`` and the policy's re-generated answer ``o′``, ``True`` means
  *over-search*.
* :meth:`Judge.verify_steps` — ``True`` when a non-search step is factually correct and its conclusion follows
  from its reasoning (HiPRAG Figure 6). ``False`` means *under-search*.
* :meth:`Judge.answer_correct` — ``True`` when the prediction matches one of the golden answers (the
  multi-stage paper's LLM-as-a-judge answer check, "LasJ").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

EquivalencePair = tuple[str, str]
"""``(statement_a, statement_b)``."""

StepItem = tuple[str, str, str]
"""``(question, reasoning, conclusion)`` of one non-search step."""

AnswerItem = tuple[str, Sequence[str], str]
"""``(question, golden_answers, prediction)``."""


@dataclass(frozen=True)
class Verdict:
    """One judgement: ``value`` (None = unknown), the judge's ``raw`` reply, an ``error`` message when the
    judge could not answer, and whether the reply came from the cache."""

    value: bool | None
    raw: str = ""
    error: str | None = None
    cached: bool = False

    @property
    def known(self) -> bool:
        """True when the verdict is a yes or a no."""
        return self.value is not None


@runtime_checkable
class Judge(Protocol):
    """Batched judgements; every method returns one :class:`Verdict` per input item, in order.

    Implementations never raise for a single item that cannot be judged: they return an unknown verdict with
    ``error`` set. They raise only for invalid arguments.
    """

    def equivalent(self, pairs: Sequence[EquivalencePair]) -> list[Verdict]:
        """Are the two statements of each pair semantically equivalent? (HiPRAG Figure 5)"""
        ...

    def verify_steps(self, steps: Sequence[StepItem], *,
                     contexts: Sequence[Sequence[str]] | None = None) -> list[Verdict]:
        """Is each non-search step factually correct and internally logical? (HiPRAG Figure 6)

        ``contexts`` optionally gives, per step, evidence the agent had already seen (passages retrieved by
        earlier steps of the same trajectory). The paper's verifier judges the step in isolation and ignores it;
        a grounding judge may use it.
        """
        ...

    def answer_correct(self, items: Sequence[AnswerItem]) -> list[Verdict]:
        """Does each prediction match one of its golden answers? (multi-stage paper, LLM-as-a-judge)"""
        ...


def check_pairs(pairs: Sequence[EquivalencePair]) -> list[tuple[str, str]]:
    """Validate :meth:`Judge.equivalent` input; returns it as a list."""
    items = _as_list(pairs, "pairs")
    for position, pair in enumerate(items):
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise TypeError(f"pairs[{position}] must be a (str, str) pair, got {pair!r}")
    return [(a, b) for a, b in items]


def check_steps(steps: Sequence[StepItem],
                contexts: Sequence[Sequence[str]] | None = None) -> tuple[list[StepItem], list[list[str]]]:
    """Validate :meth:`Judge.verify_steps` input; returns the steps and one (possibly empty) context list each."""
    items = _as_list(steps, "steps")
    for position, step in enumerate(items):
        if not (isinstance(step, tuple | list) and len(step) == 3 and all(isinstance(x, str) for x in step)):
            raise TypeError(f"steps[{position}] must be a (question, reasoning, conclusion) triple of str, "
                            f"got {step!r}")
    if contexts is None:
        return [tuple(step) for step in items], [[] for _ in items]  # type: ignore[misc]
    context_lists = _as_list(contexts, "contexts")
    if len(context_lists) != len(items):
        raise ValueError(f"{len(context_lists)} context lists for {len(items)} steps")
    checked: list[list[str]] = []
    for position, passages in enumerate(context_lists):
        passages = _as_list(passages, f"contexts[{position}]")
        if not all(isinstance(text, str) for text in passages):
            raise TypeError(f"contexts[{position}] must hold strings")
        checked.append(list(passages))
    return [tuple(step) for step in items], checked  # type: ignore[misc]


def check_answers(items: Sequence[AnswerItem]) -> list[tuple[str, tuple[str, ...], str]]:
    """Validate :meth:`Judge.answer_correct` input; golden answers become a tuple (a lone string is one answer)."""
    checked = []
    for position, item in enumerate(_as_list(items, "items")):
        if not (isinstance(item, tuple | list) and len(item) == 3):
            raise TypeError(f"items[{position}] must be a (question, golden_answers, prediction) triple")
        question, golden, prediction = item
        golden_tuple = (golden,) if isinstance(golden, str) else tuple(golden)
        if not isinstance(question, str) or not isinstance(prediction, str) \
                or not all(isinstance(answer, str) for answer in golden_tuple):
            raise TypeError(f"items[{position}]: question, golden answers and prediction must be strings")
        checked.append((question, golden_tuple, prediction))
    return checked


def _as_list(values: Sequence[object], name: str) -> list:  # type: ignore[type-arg]
    if isinstance(values, str | bytes):
        raise TypeError(f"{name} must be a sequence, not a single string")
    return list(values)


def judge_kind(judge: object) -> str:
    """``reference`` or ``llm`` (the ``kind`` of :func:`prorag.judges.factory.build_judge`) for the project's
    judges (or a judge's own ``kind`` attribute), else its class name: what progress bars and MLflow labels call
    it."""
    if isinstance(kind := getattr(judge, "kind", None), str):
        return kind
    name = type(judge).__name__
    return {"ReferenceJudge": "reference", "LLMJudge": "llm"}.get(name, name)
