"""Parameter schema of the reward-judging pipeline (``reward_judging``; see conf/base/parameters_reward_judging.yml).

The reward, its judges and the re-ask budget are the shared ``reward`` block (:class:`prorag.specs.RewardSpec`)
that RL trains with, so evaluation measures exactly what training optimized.
"""

from __future__ import annotations

from prorag.config import StrictModel
from prorag.specs import PolicySpec


class RewardJudgingParams(StrictModel):
    """``reward_judging`` parameters."""

    reask_policy: PolicySpec | None = None
    """The policy that re-answers search queries; null: the ``policy`` block (the rollout policy, as the paper)."""
