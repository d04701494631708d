"""Nodes of the reward-judging pipeline."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pandas as pd

from prorag.agent import Rollout, build_policy
from prorag.judges import StepVerdicts, detection_summary
from prorag.metrics import search_behaviour
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.protocol.registry import protocol_names
from prorag.retrieval import RetrievalIndex
from prorag.specs import PolicySpec, RewardSpec
from prorag.training.process_rewards import build_scorer


def judge_trajectories(trajectory_records: list[dict[str, Any]], index: RetrievalIndex, params: RewardJudgingParams,
                       reward: RewardSpec, policy: PolicySpec,
                       ) -> tuple[list[dict[str, Any]], pd.DataFrame, dict[str, Any]]:
    """Detect over-/under-search per step, then reward every agent trajectory with the ``reward`` block — the
    scorer RL trains with (HiPRAG eq. 1 and its ablations, or the multi-stage reward).

    Every trajectory of a registered protocol is judged, whatever the protocol; the single-shot baselines'
    records (direct, standard RAG) have no agent steps and are counted in the metrics as ``skipped_trajectories``.
    Returns the per-trajectory step verdicts, a per-trajectory reward table, and metrics per method (reward and
    its components, OSR, USR, unknown rate, search ratio).
    """
    protocols = set(protocol_names())
    rollouts = [item for item in map(Rollout.from_dict, trajectory_records) if item.protocol in protocols]
    if not rollouts:
        raise ValueError(f"no agent trajectory to judge (rollout.methods has no agent; protocols: {sorted(protocols)})")
    scorer = build_scorer(reward, index, judge_for_metrics=True)  # evaluation always reports OSR/USR
    scored = scorer.score(rollouts, build_policy(params.reask_policy or policy), step=reward.stage_switch_step)
    verdicts = scored.verdicts or []
    rows = [{"question_key": item.question_key, "method": item.method, "dataset": item.dataset,
             "sample_index": item.sample_index, "reward": total,
             **{name: values[position] for name, values in scored.components.items()},
             "n_steps": item.n_steps,
             **{f"n_{kind}": getattr(optimal, f"n_{kind}") if optimal else None
                for kind in ("optimal", "over", "under", "unknown")}}
            for position, (item, total, optimal) in enumerate(zip(rollouts, scored.totals, scored.optimal,
                                                                   strict=True))]
    table = pd.DataFrame(rows)
    metrics = _metrics(rollouts, verdicts, table, tuple(scored.components))
    metrics["skipped_trajectories"] = len(trajectory_records) - len(rollouts)
    return [verdict.to_dict() for verdict in verdicts], table, metrics


def _metrics(rollouts: list[Rollout], verdicts: list[StepVerdicts], table: pd.DataFrame,
             components: tuple[str, ...]) -> dict[str, Any]:
    by_method: dict[str, list[StepVerdicts]] = defaultdict(list)
    for rollout, verdict in zip(rollouts, verdicts, strict=True):
        by_method[rollout.method].append(verdict)
    metrics: dict[str, Any] = {}
    for method, group in by_method.items():
        rewards = table[table["method"] == method]
        metrics[method] = {
            **{column: float(rewards[column].mean()) for column in ("reward", *components)},
            **search_behaviour(group).to_dict(),
            **detection_summary(group),
        }
    return metrics
