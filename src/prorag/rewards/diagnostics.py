"""What a scored batch will teach a group-normalized trainer (GRPO and its variants), before any gradient:
groups with no signal, the advantages, and whether a reward's process term changes them.

Trainer-independent (numbers in, numbers out): the TRL backend logs them, a probe prints them, another backend
would log the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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
    rewards = _with_and_without(scored, reward, size)
    if rewards is None:
        return None
    if not rewards:
        return 0.0, 0.0
    without, with_term, _ = rewards
    known = ~np.isnan(with_term.reshape(-1, size)).any(axis=1)
    if scale_rewards == "batch" and not known.all():  # one unknown term makes the batch's spread unknown
        return 0.0, 0.0
    difference = np.abs(grpo_advantages(with_term, size, scale_rewards)
                        - grpo_advantages(without, size, scale_rewards)).reshape(-1, size)
    shaped = (difference[known].max(axis=1) > tolerance).sum() if known.any() else 0
    return float(shaped), float(known.sum())


def _with_and_without(scored: ScoredBatch, reward: Reward,
                      size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[()] | None:
    """Each rollout's reward without the process term, with it at the reward's (or the paper's) weight, and the
    term itself (NaN where unknown); None for a reward with no process term or without detection, ``()`` for a
    batch that is not whole groups."""
    count = len(scored.totals)
    if scored.bonus_fired is None or type(reward).process_terms is Reward.process_terms:
        return None
    if count % size or len(scored.bonus_fired) != count or len(scored.optimal) != count:
        return ()
    process = reward.process_terms(scored, scored.verdicts, scored.bonus_fired)  # type: ignore[arg-type]
    if process is None:
        return None
    terms, weight = process
    without = np.asarray(scored.totals, dtype=np.float64) - np.asarray(scored.components.get("process",
                                                                                              [0.0] * count))
    terms_array = np.asarray(terms, dtype=np.float64)
    return without, without + weight * terms_array, terms_array


@dataclass(frozen=True)
class ProcessSignal:
    """What a process term teaches a group-normalized trainer beyond the outcome (:func:`process_signal`)."""

    groups: int
    """Whole groups whose every term is known (the denominator of the two counts below)."""
    ratio_shaped: int
    """Groups with >= 2 correct, well-formed rollouts whose term (HiPRAG: ``N_corr/N``) differs: the process term
    ranks correct rollouts against each other, HiPRAG's own signal."""
    reweighted: int
    """Groups whose advantages the term changes (:func:`process_shaped_groups`) although they are not ratio-shaped:
    a re-weighting of the reward levels (correct / wrong / malformed) that carries no search information."""
    gap_with: float
    """Mean GRPO advantage of the correct rollouts that never searched minus that of the correct rollouts that
    searched, over the groups holding both, with the term (NaN: no such group)."""
    gap_without: float
    """The same without the term (λp = 0, Search-R1): 0 up to the 1e-4 in the denominator."""
    gap_groups: int
    """Groups holding both a correct rollout that never searched and one that searched."""


def process_signal(scored: ScoredBatch, reward: Reward, size: int, scale_rewards: str, *,
                   eligible: Sequence[bool], searched: Sequence[bool], tolerance: float = 1e-3) -> ProcessSignal | None:
    """Ratio-shaped groups, re-weighted groups and the no-search advantage gap of a scored batch of whole groups.

    ``eligible[i]``: rollout ``i`` is correct and well-formed (``A·F > 0``: the only rollouts whose term can be
    non-zero, so for them the term is ``N_corr/N`` even when it is 0); ``searched[i]``: it retrieved at least once.
    A group with a rollout whose term is unknown is left out. None for a reward with no process term or when
    detection did not run.
    """
    rewards = _with_and_without(scored, reward, size)
    if rewards is None:
        return None
    count = len(scored.totals)
    if len(eligible) != count or len(searched) != count:
        raise ValueError(f"eligible and searched need one entry per rollout ({count}), "
                         f"got {len(eligible)} and {len(searched)}")
    if not rewards:
        return ProcessSignal(0, 0, 0, math.nan, math.nan, 0)
    without, with_term, terms = rewards
    known = ~np.isnan(with_term.reshape(-1, size)).any(axis=1)
    if scale_rewards == "batch" and not known.all():
        return ProcessSignal(0, 0, 0, math.nan, math.nan, 0)
    good = np.asarray(eligible, dtype=bool).reshape(-1, size)
    searching = np.asarray(searched, dtype=bool).reshape(-1, size)
    term_groups = terms.reshape(-1, size)
    advantages = {name: grpo_advantages(values, size, scale_rewards).reshape(-1, size)
                  for name, values in (("with", with_term), ("without", without))}
    changed = np.abs(advantages["with"] - advantages["without"]).max(axis=1) > tolerance
    ratio_shaped = reweighted = 0
    gaps: dict[str, list[float]] = {"with": [], "without": []}
    gap_groups = 0
    for group in np.flatnonzero(known):
        correct = term_groups[group][good[group]]
        shaped = len(correct) >= 2 and float(correct.max() - correct.min()) > 1e-9
        ratio_shaped += int(shaped)
        reweighted += int(bool(changed[group]) and not shaped)
        direct, searching_ones = good[group] & ~searching[group], good[group] & searching[group]
        if direct.any() and searching_ones.any():
            gap_groups += 1
            for name, values in advantages.items():
                gaps[name].append(float(values[group][direct].mean() - values[group][searching_ones].mean()))
    return ProcessSignal(int(known.sum()), ratio_shaped, reweighted,
                         float(np.mean(gaps["with"])) if gaps["with"] else math.nan,
                         float(np.mean(gaps["without"])) if gaps["without"] else math.nan, gap_groups)
