"""Shortest-Path Reward Estimation (ReasonRAG §2.2.1, eq. 1): a Monte-Carlo value with a step-length decay.

``Q_t = 1/k · Σ_i v(rollout_i) · α^{step(rollout_i)}``: the mean over the ``k`` simulated completions of a partial
trajectory of their correctness ``v ∈ [0, 1]`` (F1 to the gold answers) times ``α`` to the power of the number of
reasoning steps (rounds) of the whole completed trajectory, ``α ∈ (0, 1]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def spre_value(values: Sequence[float], steps: Sequence[int], alpha: float) -> float:
    """Eq. 1: ``mean_i values[i] · alpha ** steps[i]``.

    ``values`` are the rollouts' correctness scores in ``[0, 1]``, ``steps`` their total step counts (≥ 0), in the
    same order. An empty set of rollouts, mismatched lengths or out-of-range inputs are a ``ValueError``.
    """
    values, steps = list(values), list(steps)
    if not values:
        raise ValueError("spre_value needs at least one rollout")
    if len(values) != len(steps):
        raise ValueError(f"{len(values)} values but {len(steps)} step counts")
    if isinstance(alpha, bool) or not (0.0 < float(alpha) <= 1.0):
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    total = 0.0
    for position, (value, step) in enumerate(zip(values, steps, strict=True)):
        if not (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                and 0.0 <= value <= 1.0):
            raise ValueError(f"values[{position}] must be a number in [0, 1], got {value!r}")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"steps[{position}] must be a non-negative int, got {step!r}")
        total += float(value) * float(alpha) ** step
    return total / len(values)
