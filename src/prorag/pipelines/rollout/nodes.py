"""Nodes of the rollout pipeline."""

from __future__ import annotations

from collections import Counter
from typing import Any

from prorag.agent import Rollout, build_runner, record_policy
from prorag.assembly import build_policy, build_retriever
from prorag.data import Question, pick_questions
from prorag.memory import release_memory
from prorag.pipelines.rollout.params import RolloutParams
from prorag.retrieval import RetrievalIndex
from prorag.specs import MethodSpec, PolicySpec, TrainedAgentSpec


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
