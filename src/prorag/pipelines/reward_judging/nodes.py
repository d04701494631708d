"""Nodes of the reward-judging pipeline."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections import defaultdict
from typing import Any

import pandas as pd

from prorag.agent import Rollout, producing_policy
from prorag.assembly import build_policy, build_scorer
from prorag.data import Question
from prorag.judges import StepVerdicts, detection_summary
from prorag.metrics import search_behaviour
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.protocol.registry import is_protocol, protocol_names
from prorag.retrieval import RetrievalIndex
from prorag.rewards.base import RewardSettings
from prorag.rewards.scoring import ScoredBatch
from prorag.specs import PolicySpec

logger = logging.getLogger(__name__)

SEARCH_RATES = ("osr", "usr", "unknown_rate", "search_ratio")
"""The per-dataset rates whose average over datasets is the paper's "all" figure."""


def judge_trajectories(trajectory_records: list[dict[str, Any]], index: RetrievalIndex, params: RewardJudgingParams,
                       reward: RewardSettings, policy: PolicySpec,
                       question_records: list[dict[str, Any]] | None = None,
                       ) -> tuple[list[dict[str, Any]], pd.DataFrame, dict[str, Any]]:
    """Detect over-/under-search per step, then reward every agent trajectory with the ``reward`` block — the
    scorer RL trains with (HiPRAG eq. 1 and its ablations, or the multi-stage reward).

    Over-search re-asks go to the policy that produced each trajectory (model + adapter, recorded by the rollout:
    an SFT or RL trajectory is re-asked to the SFT or RL policy, §3.2); ``reward_judging.reask_policy``, when set,
    replaces it for every trajectory, and a trajectory with no recorded policy falls back to ``policy``. Each
    verdict record names its re-ask policy (``reask_policy``).

    ``question_records`` (the indexed questions) give a reward that needs gold evidence its questions.

    Every trajectory of a registered protocol is judged, whatever the protocol; the single-shot baselines'
    records (direct, standard RAG) have no agent steps and are counted in the metrics as ``skipped_trajectories``.
    Returns the per-trajectory step verdicts, a per-trajectory reward table, and metrics per method and per
    method and dataset (:func:`search_metrics`).
    """
    rollouts = [item for item in map(Rollout.from_dict, trajectory_records) if is_protocol(item.protocol)]
    if not rollouts:
        raise ValueError(f"no agent trajectory to judge (rollout.methods has no agent; protocols: {protocol_names()})")
    questions = [Question.from_dict(record) for record in question_records or []]
    scorer = build_scorer(reward, index, judge_for_metrics=True, questions=questions)  # always OSR/USR
    groups: dict[str, tuple[PolicySpec, list[int]]] = {}
    for position, rollout in enumerate(rollouts):
        reask = params.reask_policy or producing_policy(rollout) or policy
        key = json.dumps(reask.model_dump(), sort_keys=True)
        groups.setdefault(key, (reask, []))[1].append(position)
    scored_by_position: dict[int, tuple[ScoredBatch, int]] = {}
    reask_labels: dict[int, str] = {}
    for reask, positions in groups.values():
        label = reask.model if reask.adapter is None else f"{reask.model} + {reask.adapter}"
        logger.info("re-asking %d trajectories' search queries to %s", len(positions), label)
        group = [rollouts[position] for position in positions]
        # step None: evaluation (a staged reward's last stage); a bar of judged steps naming methods and policy
        scored = scorer.score(group, build_policy(reask), progress=True)
        for offset, position in enumerate(positions):
            scored_by_position[position] = (scored, offset)
            reask_labels[position] = label
    components = tuple(scorer.components)
    rows, verdicts = [], []
    for position, item in enumerate(rollouts):
        scored, offset = scored_by_position[position]
        optimal = scored.optimal[offset]
        if scored.verdicts:
            judged = scored.verdicts[offset]
            verdicts.append(dataclasses.replace(
                judged, rollout_index=position,
                steps=tuple(dataclasses.replace(step, rollout_index=position) for step in judged.steps)))
        rows.append({"question_key": item.question_key, "method": item.method, "dataset": item.dataset,
                     "sample_index": item.sample_index, "reward": scored.totals[offset],
                     **{name: scored.components[name][offset] for name in components},
                     "n_steps": item.n_steps, "reask_policy": reask_labels[position],
                     **{f"n_{kind}": getattr(optimal, f"n_{kind}") if optimal else None
                        for kind in ("optimal", "over", "under", "unknown")}})
    table = pd.DataFrame(rows)
    metrics = search_metrics(rollouts, verdicts, table, components)
    metrics["skipped_trajectories"] = len(trajectory_records) - len(rollouts)
    records = [{**verdict.to_dict(), "question_key": rollouts[verdict.rollout_index].question_key,
                "method": rollouts[verdict.rollout_index].method,
                "reask_policy": reask_labels[verdict.rollout_index]} for verdict in verdicts]
    return records, table, metrics


def search_metrics(rollouts: list[Rollout], verdicts: list[StepVerdicts], table: pd.DataFrame,
                   components: tuple[str, ...]) -> dict[str, Any]:
    """Per method: the reward and its components, OSR, USR (eq. 2), unknown rate and search ratio — pooled over
    all the method's steps (``pooled_*``) and, as the paper reports its "all" column, the average over datasets of
    each dataset's rate (``osr``, ``usr``, …, NaN datasets left out) — plus ``by_dataset`` with each dataset's
    figures."""
    by_method: dict[str, dict[str, list[StepVerdicts]]] = defaultdict(lambda: defaultdict(list))
    for verdict in verdicts:
        rollout = rollouts[verdict.rollout_index]
        by_method[rollout.method][rollout.dataset].append(verdict)
    metrics: dict[str, Any] = {}
    for method, datasets in by_method.items():
        rewards = table[table["method"] == method]
        pooled = search_behaviour([verdict for group in datasets.values() for verdict in group]).to_dict()
        per_dataset = {dataset: search_behaviour(group).to_dict() for dataset, group in sorted(datasets.items())}
        metrics[method] = {
            **{column: float(rewards[column].mean()) for column in ("reward", *components)},
            **{key: value for key, value in pooled.items() if key not in SEARCH_RATES},
            **{f"pooled_{rate}": pooled[rate] for rate in SEARCH_RATES},
            **{rate: _mean_over_datasets(per_dataset, rate) for rate in SEARCH_RATES},
            **detection_summary([verdict for group in datasets.values() for verdict in group]),
            "by_dataset": {dataset: {rate: figures[rate] for rate in (*SEARCH_RATES, "search_steps",
                                                                      "non_search_steps")}
                           for dataset, figures in per_dataset.items()},
        }
    return metrics


def _mean_over_datasets(per_dataset: dict[str, dict[str, float | int]], rate: str) -> float:
    values = [float(figures[rate]) for figures in per_dataset.values() if not math.isnan(float(figures[rate]))]
    return sum(values) / len(values) if values else math.nan
