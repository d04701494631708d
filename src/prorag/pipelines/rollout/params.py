"""Parameter schema of the rollout pipeline (``rollout``; see conf/base/parameters_rollout.yml).

The policy (``policy``) and the trained agent (``agent``) are shared specs (:mod:`prorag.specs`), read from
their own top-level blocks.
"""

from __future__ import annotations

from collections import Counter

from pydantic import Field, model_validator

from prorag.data.selection import QuestionSelection
from prorag.specs import MethodSpec, PositiveInt, RetrieverSpec, SamplingSpec

__all__ = ["QuestionSelection", "RolloutParams"]


class RolloutParams(SamplingSpec):
    """``rollout`` parameters: the questions, the methods side by side, the retriever and the sampling."""

    questions: QuestionSelection = QuestionSelection()
    methods: list[MethodSpec] = Field(min_length=1)
    retriever: RetrieverSpec = RetrieverSpec()
    samples: PositiveInt = 1
    """Trajectories per question for agent methods (GRPO-style groups); baselines answer once."""

    @model_validator(mode="after")
    def _unique_names(self) -> RolloutParams:
        repeated = [name for name, count in Counter(method.name for method in self.methods).items() if count > 1]
        if repeated:
            raise ValueError(f"method names must be unique, repeated: {repeated}")
        return self
