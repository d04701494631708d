"""Probe a GRPO configuration before paying for it: what its first step would see, sampled and scored exactly as a
training backend would, with no trainer (so it serves every backend)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from prorag.agent.runner import build_engine
from prorag.metrics.qa import cover_exact_match
from prorag.rewards.diagnostics import process_shaped_groups, process_signal, uniform_groups
from prorag.rewards.scoring import RolloutScorer, ScoredBatch
from prorag.specs import AgentSpec, SamplingSpec

if TYPE_CHECKING:
    from prorag.data.records import Question
    from prorag.llm.generation import Generator
    from prorag.retrieval.base import Retriever


def probe_groups(questions: Sequence[Question], generator: Generator, retriever: Retriever, scorer: RolloutScorer,
                 agent: AgentSpec, *, group_sizes: Sequence[int], top_k: int = 3, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, scale_rewards: str = "group") -> list[dict[str, float]]:
    """What a GRPO configuration's first step would see, without training: ``max(group_sizes)`` rollouts per
    question from the starting policy, sampled and scored as GRPO's rollout function does, then cut into
    groups of each size (a group of ``g`` is the first ``g`` samples of each question's group: i.i.d. samples).

    Per group size: ``groups``; ``cem`` and ``bonus_fired`` over rollouts; ``uniform_groups`` (all rewards equal:
    no gradient); ``process_shaped`` (:func:`process_shaped_groups`: groups whose advantages eq. 1's process term
    changes; NaN when not measurable), split into ``ratio_shaped`` (groups with two correct, well-formed rollouts
    whose ``N_corr/N`` differ: HiPRAG's own signal, what a HiPRAG vs Search-R1 run should gate on) and
    ``reweighted`` (the rest: the term only re-weights correct vs wrong vs malformed), both shares of the groups
    whose terms are known; ``no_search_correct`` (share of rollouts correct with no retrieval) and the mean
    advantage gap, correct rollouts that never searched minus correct ones that searched, with the term
    (``gap_with``) and without it (``gap_without``, Search-R1), over the ``gap_groups`` groups holding both
    (:func:`~prorag.rewards.diagnostics.process_signal`). Sizes a HiPRAG vs Search-R1 run before paying for it.
    """
    sizes = sorted(set(group_sizes))
    if not sizes or sizes[0] < 2:
        raise ValueError(f"group sizes must be >= 2 (GRPO needs two samples to compare), got {list(group_sizes)}")
    largest = sizes[-1]
    engine = build_engine(agent, generator, retriever, top_k=top_k, progress=True,
                          sampling=SamplingSpec(temperature=temperature, top_p=top_p, seed=seed))
    rollouts = engine.run([question for question in questions for _ in range(largest)])
    scored = scorer.score(rollouts, generator, step=0)
    results = []
    for size in sizes:
        keep = [index for index in range(len(rollouts)) if index % largest < size]
        subset = ScoredBatch({name: [values[i] for i in keep] for name, values in scored.components.items()},
                             [scored.totals[i] for i in keep], {},
                             [scored.verdicts[i] for i in keep] if scored.verdicts is not None else None,
                             [scored.optimal[i] for i in keep] if len(scored.optimal) == len(rollouts) else [],
                             [scored.bonus_fired[i] for i in keep] if scored.bonus_fired is not None else None)
        shaped = process_shaped_groups(subset, scorer.reward, size, scale_rewards)
        correct = [bool(rollouts[i].format_ok) and cover_exact_match(rollouts[i].answer, rollouts[i].golden_answers)
                   for i in keep]
        searched = [rollouts[i].retrieval_count > 0 for i in keep]
        signal = process_signal(subset, scorer.reward, size, scale_rewards, eligible=correct, searched=searched)
        fired = subset.bonus_fired or []
        results.append({
            "group_size": float(size), "groups": float(len(questions)), "rollouts": float(len(keep)),
            "cem": float(np.mean([cover_exact_match(rollouts[i].answer, rollouts[i].golden_answers) for i in keep])),
            "bonus_fired": float(np.mean([value is True for value in fired])) if fired else float("nan"),
            "uniform_groups": len(uniform_groups(subset.totals, size)) / len(questions),
            "process_shaped": shaped[0] / shaped[1] if shaped and shaped[1] else float("nan"),
            "ratio_shaped": signal.ratio_shaped / signal.groups if signal and signal.groups else float("nan"),
            "reweighted": signal.reweighted / signal.groups if signal and signal.groups else float("nan"),
            "no_search_correct": float(np.mean([ok and not hit for ok, hit in zip(correct, searched, strict=True)])),
            "gap_with": signal.gap_with if signal else float("nan"),
            "gap_without": signal.gap_without if signal else float("nan"),
            "gap_groups": float(signal.gap_groups) if signal else 0.0})
    return results


