"""Nodes of the rollout pipeline."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from prorag.agent import Rollout, build_runner, record_policy
from prorag.assembly import build_policy, build_retriever
from prorag.data import Question, pick_questions
from prorag.memory import release_memory
from prorag.pipelines.rollout.params import RolloutParams
from prorag.retrieval import RetrievalIndex
from prorag.specs import MethodSpec, PolicySpec, TrainedAgentSpec
from prorag.tracking.missing_inputs import Available, Missing

logger = logging.getLogger(__name__)

TRAINED_AGENT_STAGES = ("sft", "rl")
"""The stages whose ``<stage>_adapter`` the trained agent (the ``agent`` block) is rolled out with."""


def select_rollout_questions(question_records: list[dict[str, Any]], params: RolloutParams) -> list[dict[str, Any]]:
    """The first ``max_per_source`` questions of each selected source; unknown sources are an error. Questions of a
    train split (e.g. ``musique_train``) are evaluation-free unless ``rollout.questions.include_train_split``."""
    return pick_questions(question_records, params.questions, setting="rollout.questions.sources")


def run_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex, params: RolloutParams,
                 policy: PolicySpec) -> list[dict[str, Any]]:
    """Every configured method over the selected questions, with one policy and one retriever."""
    return _run_methods(params.methods, question_records, index, params, policy)


def run_trained_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex, adapter_dir: str,
                         params: RolloutParams, policy: PolicySpec, agent: TrainedAgentSpec,
                         stage: str) -> list[dict[str, Any]]:
    """The trained agent (the ``agent`` block SFT and RL trained) with the ``stage`` adapter merged into the policy
    (or the ``stage`` model, after full-parameter training); its rollouts are named ``<agent.name>_<stage>``."""
    method = MethodSpec(kind="agent", **{**agent.model_dump(), "name": f"{agent.name}_{stage}"})
    return _run_methods([method], question_records, index, params, policy.with_trained(adapter_dir))


def select_evaluated_questions(rollout_records: list[dict[str, Any]],
                               compare_records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every question an evaluation answers — the one set every trainer leaves out of its training questions, by
    key and by question text: the rollout questions (the base rollouts, the trained-policy rollouts and TeaRAG's
    evaluation answer them) and the compare questions. Rollout questions first, then the compare questions not
    among them."""
    keys = {Question.from_dict(record).key for record in rollout_records}
    return [*rollout_records, *(record for record in compare_records if Question.from_dict(record).key not in keys)]


def concat_trajectories(*trajectory_sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One trajectory table from several rollouts (e.g. base and SFT policies side by side); a method name that
    two sets use is an error (their rows would be summarized as one method)."""
    owners: Counter[str] = Counter()
    for records in trajectory_sets:
        owners.update({record["method"] for record in records})
    repeated = sorted(name for name, count in owners.items() if count > 1)
    if repeated:
        raise ValueError(f"method name(s) {repeated} occur in more than one trajectory set; rename them "
                         "(rollout.methods vs agent.name with its _sft/_rl suffix)")
    return [record for records in trajectory_sets for record in records]


def run_latest_policy_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex,
                               params: RolloutParams, policy: PolicySpec, agent: TrainedAgentSpec,
                               **artifacts: Any) -> list[dict[str, Any]]:
    """The trained agent rolled out with each ``<stage>_adapter`` of ``artifacts`` that has a usable version (the
    newest from a completed run, pinned by the run-version hook), as :func:`run_trained_rollouts`; an adapter
    without one is named in a warning with what makes it, so a re-evaluation never drops a trained policy
    silently."""
    records: list[dict[str, Any]] = []
    for name, artifact in artifacts.items():
        stage = name.removesuffix("_adapter")
        if isinstance(artifact, Missing):
            logger.warning("not evaluated: %s_%s (%s)", agent.name, stage, artifact.reason)
            continue
        adapter_dir, version = (artifact.data, artifact.version) if isinstance(artifact, Available) else (artifact, "")
        logger.info("rolling out %s_%s with %s%s", agent.name, stage, name, f" {version}" if version else "")
        records.extend(run_trained_rollouts(question_records, index, adapter_dir, params, policy, agent, stage))
    return records


def gather_trajectories(base: list[dict[str, Any]], **artifacts: Any) -> list[dict[str, Any]]:
    """``base`` (rollouts this run made, or the required base rollouts) and the trajectory sets of ``artifacts``
    in one table (:func:`concat_trajectories`). A set this run made is data; one read from an earlier run is
    :class:`Available` (its newest version from a completed run) or :class:`Missing`. A missing set, or one that
    answers other questions than ``base`` (rolled out on an older selection), is left out with a warning that
    names it and what to run; the methods evaluated are logged."""
    keys = {record["question_key"] for record in base}
    sets = [base]
    for name, artifact in artifacts.items():
        if isinstance(artifact, Missing):
            logger.warning("not evaluated: %s (%s)", name, artifact.reason)
            continue
        records, version = (artifact.data, artifact.version) if isinstance(artifact, Available) else (artifact, "")
        if not records:  # e.g. no adapter to roll out: run_latest_policy_rollouts named it
            continue
        other = {record["question_key"] for record in records}
        if other != keys:
            logger.warning("not evaluated: %s %s was rolled out on other questions (%d, of which %d are not among the "
                           "%d evaluated here); roll every policy out on the current questions with `kedro run "
                           "--pipelines=evaluate`", name, version, len(other), len(other - keys), len(keys))
            continue
        sets.append(records)
    gathered = concat_trajectories(*sets)
    logger.info("evaluating %s", ", ".join(dict.fromkeys(record["method"] for record in gathered)))
    return gathered


def _run_methods(methods: list[MethodSpec], question_records: list[dict[str, Any]], index: RetrievalIndex,
                 params: RolloutParams, policy: PolicySpec) -> list[dict[str, Any]]:
    rollouts = _roll_out(methods, [Question.from_dict(record) for record in question_records], index, params, policy)
    release_memory("rollouts")  # the policy and its KV cache, before the next stage
    return [rollout.to_dict() for rollout in record_policy(rollouts, policy)]


def _roll_out(methods: list[MethodSpec], questions: list[Question], index: RetrievalIndex, params: RolloutParams,
              policy: PolicySpec) -> list[Rollout]:
    retriever = build_retriever(params.retriever, index)
    generator = build_policy(policy)
    rollouts: list[Rollout] = []
    for method in methods:
        runner = build_runner(method, generator, retriever, top_k=params.retriever.top_k, sampling=params,
                              samples=params.samples)
        rollouts.extend(runner(questions))
    return rollouts
