"""Rewards as pure functions returning their components: HiPRAG's hierarchical process reward (eq. 1), the
Search-R1 outcome + format reward (eq. 1 with λp = 0), and the multi-stage reward of "Learning When to Search"."""

from prorag.rewards.hiprag import (
    OptimalCount,
    RewardBreakdown,
    RolloutReward,
    count_optimal,
    hierarchical_reward,
    process_bonus_fires,
    rollout_reward,
    search_r1_reward,
)
from prorag.rewards.multistage import (
    MultistageBreakdown,
    answer_reward,
    avg_pairwise_similarity,
    format_reward,
    is_concise,
    multistage_reward,
    search_reward,
)

__all__ = [
    "MultistageBreakdown",
    "OptimalCount",
    "RewardBreakdown",
    "RolloutReward",
    "answer_reward",
    "avg_pairwise_similarity",
    "count_optimal",
    "format_reward",
    "hierarchical_reward",
    "is_concise",
    "multistage_reward",
    "process_bonus_fires",
    "rollout_reward",
    "search_r1_reward",
    "search_reward",
]
