"""Parameter schema of the reward-judging pipeline (``reward_judging``; see conf/base/parameters_reward_judging.yml).

The reward, its judges and the re-ask budget are the shared ``reward`` block that RL trains with (validated by the
settings of its registered reward, :mod:`prorag.rewards.registry`), so evaluation measures what training optimized.
"""

from __future__ import annotations

from prorag.config import StrictModel
from prorag.specs import PolicySpec


class RewardJudgingParams(StrictModel):
    """``reward_judging`` parameters."""

    reask_policy: PolicySpec | None = None
    """The policy that re-answers search queries; null: the ``policy`` block (the rollout policy, as the paper)."""
