"""The ``compare`` parameter block (conf/base/parameters_compare.yml): the questions, the arms, the retriever, the
statistics. In the library because two pipelines read it (compare, and sft_synthesis, which leaves the compared
questions out of its training data); :mod:`prorag.pipelines.compare.params` re-exports it."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

from pydantic import Field, model_validator

from prorag.config import StrictModel
from prorag.data.selection import QuestionSelection
from prorag.specs import JudgeSpec, MethodSettings, PositiveInt, RetrieverSpec, SamplingSpec

METHOD_KEY = r"^[a-z][a-z0-9_]*$"


class CompareArm(StrictModel):
    """One row of the comparison: a method run by a policy.

    ``method`` is either the name of a ``methods`` entry (the arm runs that method's agent — protocol, budgets —
    and retriever, exactly as the method trains it) or inline settings (a baseline, or a prompted agent with its
    own budgets). ``adapter`` names an adapter of the methods map (a catalog dataset that ``compare`` takes as an
    input, e.g. ``sft_adapter``): the arm runs its pinned version (the newest from a completed run, or
    ``--load-versions``), and is skipped — with the reason and the pipeline that makes it — while none is usable.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    method: MethodSettings | Annotated[str, Field(pattern=METHOD_KEY)]
    adapter: str | None = None
    few_shot: bool | None = None
    """Overrides the method agent's ``few_shot`` (e.g. the base policy prompted with the worked examples)."""
    retriever: RetrieverSpec | None = None
    """Overrides the method's retriever (or ``compare.retriever`` for inline methods)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        if isinstance(values, dict) and "agent" in values:
            raise ValueError(f"arm {values.get('name')!r}: `agent: {values['agent']}` is now `method: <name>`, the "
                             "name of a methods entry (conf/base/parameters_methods.yml)")
        return values

    @model_validator(mode="after")
    def _few_shot_placement(self) -> CompareArm:
        if isinstance(self.method, MethodSettings) and self.few_shot is not None:
            raise ValueError(f"arm {self.name!r}: few_shot goes inside method")
        return self

    @property
    def method_name(self) -> str | None:
        """The ``methods`` entry the arm runs; None for inline settings."""
        return self.method if isinstance(self.method, str) else None


class CompareParams(SamplingSpec):
    """``compare`` parameters: the questions, the arms, the retriever, the statistics and the optional LLM judge."""

    questions: QuestionSelection = QuestionSelection(max_per_source=5)
    arms: list[CompareArm] = Field(min_length=2)
    retriever: RetrieverSpec = RetrieverSpec()
    """The retriever of inline-method arms (baselines); the shared ``retriever`` unless set here."""
    reference: str = "standard_rag"
    """The arm every other arm is tested against in the report (the CSV has every pair)."""
    skip_untrained: bool = True
    """An arm whose adapter has no version yet is skipped and listed with the pipeline that makes it (false: an
    error)."""
    answer_judge: JudgeSpec | None = None
    """LLM-as-a-judge accuracy (``kind: llm``, any OpenAI-compatible endpoint) beside CEM; null: not judged."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    bootstrap_resamples: PositiveInt = 2000
    permutation_resamples: PositiveInt = 9999

    @model_validator(mode="after")
    def _names(self) -> CompareParams:
        names = [arm.name for arm in self.arms]
        repeated = sorted(name for name, count in Counter(names).items() if count > 1)
        if repeated:
            raise ValueError(f"arm names must be unique, repeated: {repeated}")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not an arm ({', '.join(names)})")
        if self.answer_judge is not None and self.answer_judge.kind != "llm":
            raise ValueError("answer_judge is the LLM judge (kind: llm); CEM, EM and F1 are always reported")
        return self
