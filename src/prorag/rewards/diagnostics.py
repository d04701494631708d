"""What a scored batch will teach a group-normalized trainer (GRPO and its variants), before any gradient:
groups with no signal, the advantages, and whether a reward's process term changes them.

Trainer-independent (numbers in, numbers out): the TRL backend logs them, a probe prints them, another backend
would log the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from prorag.rewards.base import Reward

if TYPE_CHECKING:
    from prorag.rewards.scoring import Ratio, ScoredBatch


def uniform_groups(totals: Sequence[float], size: int) -> list[int]:
    """Indices of the consecutive groups of ``size`` rewards whose rewards are all equal (zero advantage)."""
    return [group for group in range(len(totals) // size)
            if max(totals[group * size:(group + 1) * size]) - min(totals[group * size:(group + 1) * size]) < 1e-8]


def grpo_advantages(rewards: Sequence[float], size: int, scale_rewards: str) -> np.ndarray:
    """TRL's GRPO advantages for consecutive groups of ``size``: reward minus its group mean, divided by the
    group's (``group``) or the batch's (``batch``) standard deviation + 1e-4, or not divided (``none``)."""
    values = np.asarray(rewards, dtype=np.float64)[: len(rewards) // size * size].reshape(-1, size)
    centred = values - values.mean(axis=1, keepdims=True)
    if scale_rewards == "none":
        return centred.ravel()
    spread = (values.std(axis=1, ddof=1, keepdims=True) if scale_rewards == "group"
              else np.full((len(values), 1), values.std(ddof=1) if values.size > 1 else 0.0))
    return (centred / (spread + 1e-4)).ravel()


def process_shaped_groups(scored: ScoredBatch, reward: Reward, size: int, scale_rewards: str,
                          tolerance: float = 1e-3) -> Ratio | None:
    """Groups whose advantages the reward's process term changes, out of all groups.

    "The bonus fired" is not enough for HiPRAG's reward to teach something Search-R1's does not: when every
    correct rollout of a group has the same ``N_corr/N`` and the rest share one reward, the process term is an
    affine map of the outcome + format reward within the group, and the group-normalized advantages are the
    same (up to the 1e-4 in the denominator). This counts the groups where they differ by more than
    ``tolerance``, comparing the reward with and without the term (:meth:`Reward.process_terms`: a λp = 0
    Search-R1 run uses the paper's λp, so it reports what HiPRAG's term *would* have changed). None for a reward
    with no process term and when detection did not run; a group with a rollout whose term is unknown is left out,
    and so is a batch that is not whole groups (``(0, 0)``).
    """
    count = len(scored.totals)
    if scored.bonus_fired is None or type(reward).process_terms is Reward.process_terms:
        return None
    if count % size or len(scored.bonus_fired) != count or len(scored.optimal) != count:
        return 0.0, 0.0
    process = reward.process_terms(scored, scored.verdicts, scored.bonus_fired)  # type: ignore[arg-type]
    if process is None:
        return None
    terms, weight = process
    without = np.asarray(scored.totals) - np.asarray(scored.components.get("process", [0.0] * count))
    with_term = without + weight * np.asarray(terms)
    known = ~np.isnan(with_term.reshape(-1, size)).any(axis=1)
    if scale_rewards == "batch" and not known.all():  # one unknown term makes the batch's spread unknown
        return 0.0, 0.0
    difference = np.abs(grpo_advantages(with_term, size, scale_rewards)
                        - grpo_advantages(without, size, scale_rewards)).reshape(-1, size)
    shaped = (difference[known].max(axis=1) > tolerance).sum() if known.any() else 0
    return float(shaped), float(known.sum())
