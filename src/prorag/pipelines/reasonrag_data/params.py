"""Parameter schema of the ReasonRAG data pipeline (``reasonrag_data``; see conf/base/parameters_reasonrag_data.yml).

The policy that explores the trees is the shared ``policy`` unless ``reasonrag_data.policy`` names another (the
paper's explorer is "an advanced large language model", the anchor code's GPT-4o). The value the trees are searched
for (SPRE or eq. 6's judgment, with its judge) is not here: it is the method's, ``methods.<name>.value``
(:class:`prorag.training.mcts.MCTSValue`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from prorag.config import StrictModel
from prorag.data.selection import QuestionPart
from prorag.specs import PolicySpec, PositiveInt, RetrieverSpec
from prorag.training.mcts import MIN_REWARD_GAP, VALUE_FIELDS, MCTSSearchParams


class TrainingQuestionSelection(StrictModel):
    """Training questions by source file stem (first N of each); the evaluated questions are never among them."""

    sources: list[str] = Field(min_length=1)
    max_per_source: PositiveInt | None = None
    part: QuestionPart = "all"
    """``tuning``: only each source's tuning part (:func:`prorag.data.selection.question_parts`)."""


class ReasonRAGDataParams(StrictModel):
    """``reasonrag_data`` parameters."""

    questions: TrainingQuestionSelection
    policy: PolicySpec | None = None
    """The explorer; None: the shared ``policy``."""
    retriever: RetrieverSpec = RetrieverSpec()
    mcts: MCTSSearchParams = MCTSSearchParams()  # type: ignore[valid-type]
    min_reward_gap: float = Field(default=MIN_REWARD_GAP, ge=0)
    """§2.2.3: pairs whose Q difference is below this are dropped."""
    work_dir: str = "data/02_intermediate/reasonrag_mcts"
    """Incremental per-question results (resume after a crash), one file per settings fingerprint."""

    @model_validator(mode="before")
    @classmethod
    def _value_moved(cls, values: Any) -> Any:
        if not isinstance(values, Mapping):
            return values
        mcts = values.get("mcts")
        moved = [f"mcts.{key}" for key in ("value", *VALUE_FIELDS) if isinstance(mcts, Mapping) and key in mcts]
        moved += ["judge"] * ("judge" in values)
        if moved:
            target = "kind (spre | judge)" if moved[0] == "mcts.value" else moved[0].removeprefix("mcts.")
            raise ValueError(f"reasonrag_data.{moved[0]} moved: the value the trees are searched for is the "
                             f"method's; set methods.<name>.value.{target} (methods.reasonrag.value in "
                             "conf/base/parameters_methods.yml)")
        return values
