"""Parameter schema of the ReasonRAG data pipeline (``reasonrag_data``; see conf/base/parameters_reasonrag_data.yml).

The policy that explores the trees is the shared ``policy`` unless ``reasonrag_data.policy`` names another (the
paper's explorer is "an advanced large language model", the anchor code's GPT-4o); the judge is used only when
``mcts.value`` is ``judge`` (eq. 6).
"""

from __future__ import annotations

from pydantic import Field

from prorag.config import StrictModel
from prorag.data.selection import QuestionPart
from prorag.specs import JudgeSpec, PolicySpec, PositiveInt, RetrieverSpec
from prorag.training.mcts import MIN_REWARD_GAP, MCTSConfig


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
    mcts: MCTSConfig = MCTSConfig()
    judge: JudgeSpec = JudgeSpec()
    min_reward_gap: float = Field(default=MIN_REWARD_GAP, ge=0)
    """§2.2.3: pairs whose Q difference is below this are dropped."""
    work_dir: str = "data/02_intermediate/reasonrag_mcts"
    """Incremental per-question results (resume after a crash), one file per settings fingerprint."""
