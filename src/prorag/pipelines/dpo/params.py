"""Parameter schema of the DPO pipeline (``dpo``; see conf/base/parameters_dpo.yml).

The trained model is the shared ``policy.model``. How the DPO policy is rolled out is the agent of the method whose
pairs it learns from (the ``reasonrag`` method's agent for ReasonRAG's MCTS pairs).
"""

from __future__ import annotations

from prorag.config import StrictModel
from prorag.training.dpo import DPOTrainingConfig


class DPOParams(StrictModel):
    """``dpo`` parameters."""

    trainer: DPOTrainingConfig = DPOTrainingConfig()
