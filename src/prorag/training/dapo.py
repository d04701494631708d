"""DAPO's dynamic sampling with refill, for any trainer that samples GRPO-style groups.

A group whose rewards are all equal has zero advantage and teaches nothing; :func:`refill_uniform_groups` replaces
each such group by the group of a newly drawn training question (one not tried for this batch), for a bounded
number of rounds; what is still uniform then is left to the trainer's filter (``drop_uniform_groups``). It needs
only a way to roll questions out and a way to score rollouts — the engine and the scorer — so the TRL backend and
any other backend share it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prorag.rewards.diagnostics import uniform_groups
from prorag.rewards.scoring import ScoredBatch, batch_stats

if TYPE_CHECKING:
    from prorag.agent.trajectory import Rollout
    from prorag.data.records import Question

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefillResult:
    """The final batch, its scores and what refill did (``dapo/*`` metrics)."""

    rollouts: list[Rollout]
    scored: ScoredBatch
    metrics: dict[str, float]


def refill_uniform_groups(questions: Sequence[Question], rollouts: Sequence[Rollout], scored: ScoredBatch, *,
                          pool: Sequence[Question], size: int, rounds: int, seed: int,
                          roll_out: Callable[[list[Question]], list[Rollout]],
                          score: Callable[[list[Rollout]], ScoredBatch]) -> RefillResult:
    """Replace uniform groups of ``size`` consecutive rollouts by freshly drawn questions' groups (module docstring).

    ``questions`` are the batch's prompts (whole groups of one question each); ``pool`` the training questions to
    draw from; ``roll_out`` and ``score`` run and score new groups. A batch that is not whole groups is returned as
    it is (logged). The returned statistics (``bonus_fired`` and the answer statistics included) describe the final,
    refilled batch.
    """
    groups = len(questions) // size
    if len(questions) % size or any(len({q.key for q in questions[g * size:(g + 1) * size]}) != 1
                                    for g in range(groups)):
        logger.warning("DAPO refill skipped: %d local prompts are not whole groups of %d", len(questions), size)
        return RefillResult(list(rollouts), scored, {})
    rng = random.Random(seed)
    rollouts, totals = list(rollouts), list(scored.totals)
    components = {name: list(values) for name, values in scored.components.items()}
    # what else is per rollout travels with it, so the statistics describe the final batch
    per_rollout: dict[str, list[Any] | None] = {
        name: list(values) if values is not None and len(values) == len(rollouts) else None
        for name, values in (("verdicts", scored.verdicts), ("optimal", scored.optimal),
                             ("bonus_fired", scored.bonus_fired), ("answer_correct", scored.answer_correct))}
    uniform_at_start = refilled = rounds_run = 0
    uniform: list[int] = []
    tried: set[str] = set()  # a question whose group was drawn once is not drawn again for this batch
    for round_index in range(rounds + 1):
        uniform = uniform_groups(totals, size)
        if round_index == 0:
            uniform_at_start = len(uniform)
        tried.update(rollout.question_key for rollout in rollouts)
        candidates = [question for question in pool if question.key not in tried]
        if not uniform or round_index == rounds or not candidates:
            break
        rounds_run += 1
        drawn = rng.sample(candidates, min(len(uniform), len(candidates)))
        uniform = uniform[:len(drawn)]
        new_rollouts = roll_out([question for question in drawn for _ in range(size)])
        new_scored = score(new_rollouts)
        for slot, group in enumerate(uniform):
            for offset in range(size):
                target, source = group * size + offset, slot * size + offset
                rollouts[target] = new_rollouts[source]
                totals[target] = new_scored.totals[source]
                for name in components:
                    components[name][target] = new_scored.components[name][source]
                for name, values in per_rollout.items():
                    new_values = getattr(new_scored, name)
                    if values is not None:
                        values[target] = (new_values[source] if new_values is not None
                                          and source < len(new_values) else None)
        refilled += len(uniform)
    metrics = {"dapo/uniform_groups_drawn": float(uniform_at_start), "dapo/refilled_groups": float(refilled),
               "dapo/refill_rounds": float(rounds_run),
               "dapo/uniform_groups_left": float(len(uniform_groups(totals, size)))}
    verdicts, optimal = per_rollout["verdicts"], per_rollout["optimal"]
    bonus_fired, answer_correct = per_rollout["bonus_fired"], per_rollout["answer_correct"]
    stats = {**scored.stats, **batch_stats(rollouts, verdicts, bonus_fired=bonus_fired,
                                           answer_correct=answer_correct, stage=scored.stage)}
    final = ScoredBatch(components, totals, stats, verdicts,
                        optimal if optimal is not None else [None] * len(rollouts), bonus_fired, answer_correct,
                        scored.stage)
    return RefillResult(rollouts, final, metrics)
