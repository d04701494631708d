"""Nodes of the compare pipeline."""

from __future__ import annotations

import json
import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from prorag.agent import Rollout, build_runner, record_policy
from prorag.assembly import build_judge_from_spec, build_policy, build_retriever
from prorag.data import Question, pick_questions
from prorag.kg.kag import attach_knowledge_graph
from prorag.kg.params import KgExtractionParams
from prorag.methods import KNOWLEDGE_GRAPH
from prorag.pipelines.compare.params import CompareArm, CompareParams
from prorag.reporting.comparison import (
    ComparisonInputs,
    accuracy_figure,
    comparison_table,
    efficiency_figure,
    render_report,
    search_figure,
)
from prorag.retrieval import RetrievalIndex
from prorag.specs import MethodSpec, PolicySpec, RetrieverSpec, TrainedAgentSpec
from prorag.tracking.missing_inputs import Available, Missing

logger = logging.getLogger(__name__)



def select_compare_questions(question_records: list[dict[str, Any]], params: CompareParams) -> list[dict[str, Any]]:
    """The first ``compare.questions.max_per_source`` dev/test questions of each source (all indexed sources by
    default): every arm answers the same questions, so their scores pair up."""
    return pick_questions(question_records, params.questions, setting="compare.questions.sources")


def run_compare_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex, params: CompareParams,
                         policy: PolicySpec, methods: dict[str, Any], kg: KgExtractionParams, **artifacts: Any,
                         ) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """Every arm on the same questions: baselines and prompted agents with the base policy, trained agents with
    their adapter (the agent and retriever of the method they name, as it trained). ``artifacts`` are the trained
    datasets by name — :class:`Available` (data and version), :class:`Missing` (why not) or, when a run trained
    it, the data — so an arm whose adapter has no usable version is skipped with the reason. Returns the
    trajectories (method = arm name) and one row per arm — what it ran (policy, adapter version) or why it was
    skipped and which pipeline makes what it lacks."""
    questions = [Question.from_dict(record) for record in question_records]
    plans, rows = [], []
    for arm in params.arms:
        missing = _missing_artifact(arm, artifacts, params, methods)
        if missing is not None:
            if not params.skip_untrained:
                raise ValueError(f"compare arm {arm.name!r}: {missing}")
            logger.warning("compare: skipping %s: %s", arm.name, missing)
            rows.append(_arm_row(arm, "skipped", missing))
            continue
        arm_policy = policy
        version = None
        if arm.adapter is not None:
            data, version = _available(artifacts[arm.adapter])
            arm_policy = policy.with_trained(data)
        plans.append((arm, _method(arm, methods), arm_policy, _retriever_spec(arm, params, methods)))
        rows.append(_arm_row(arm, "ran", "", version=version))
    graph = artifacts.get(KNOWLEDGE_GRAPH)
    if graph is not None and not isinstance(graph, Missing) and any(
            spec.kind.startswith("kag") for *_, spec in plans):
        attach_knowledge_graph(index, _available(graph)[0], kg.kag.settings())
    records: list[dict[str, Any]] = []
    # arms that share a policy run back to back, so each policy is loaded once
    plans.sort(key=lambda plan: json.dumps(plan[2].model_dump(), sort_keys=True))
    generator, loaded = None, None
    for arm, method, arm_policy, retriever_spec in plans:
        key = json.dumps(arm_policy.model_dump(), sort_keys=True)
        if key != loaded:
            generator, loaded = None, None  # free the previous policy before loading the next
            generator, loaded = build_policy(arm_policy), key
        runner = build_runner(method, generator, build_retriever(retriever_spec, index), top_k=retriever_spec.top_k,
                              sampling=params)
        logger.info("compare: %s on %d questions", arm.name, len(questions))
        records.extend(rollout.to_dict() for rollout in record_policy(runner(questions), arm_policy))
    return records, pd.DataFrame(rows, columns=["arm", "status", "reason", "adapter", "adapter_version"])


def judge_compare_answers(trajectory_records: list[dict[str, Any]], params: CompareParams) -> pd.DataFrame:
    """The LLM judge's verdict on every final answer (``compare.answer_judge``; the multi-stage paper's LasJ):
    ``correct`` is true, false or empty — *unknown* (a timeout, an error, an unparsable reply) is never counted
    as correct. An empty table when no judge is configured."""
    columns = ["method", "question_key", "dataset", "sample_index", "correct", "error"]
    if params.answer_judge is None:
        return pd.DataFrame(columns=columns)
    rollouts = [Rollout.from_dict(record) for record in trajectory_records]
    judge = build_judge_from_spec(params.answer_judge)
    verdicts = judge.answer_correct([(r.question, tuple(r.golden_answers), r.answer or "") for r in rollouts])
    return pd.DataFrame([{"method": r.method, "question_key": r.question_key, "dataset": r.dataset,
                          "sample_index": r.sample_index, "correct": verdict.value, "error": verdict.error}
                         for r, verdict in zip(rollouts, verdicts, strict=True)], columns=columns)


def report_comparison(trajectory_records: list[dict[str, Any]], arms: pd.DataFrame, judge_metrics: dict[str, Any],
                      answer_verdicts: pd.DataFrame, params: CompareParams,
                      ) -> tuple[pd.DataFrame, pd.DataFrame, str, Figure, Figure, Figure, dict[str, Any]]:
    """The comparison a paper would print: per arm and dataset (and macro-averaged over datasets) EM, F1 and CEM
    with 95% intervals, format, steps, retrievals, tokens, OSR/USR with the unknown rate and LLM-judge accuracy;
    paired tests between every two arms; a Markdown report; the accuracy, efficiency and search-behaviour plots;
    and per arm and dataset (and "macro") the figures as metrics."""
    inputs = ComparisonInputs(
        rollouts=[Rollout.from_dict(record) for record in trajectory_records], arms=arms,
        judge_metrics=judge_metrics, answer_verdicts=answer_verdicts, reference=params.reference,
        answer_judge=None if params.answer_judge is None else {
            "model": params.answer_judge.model, "base_url": params.answer_judge.base_url,
            "timeout": params.answer_judge.timeout, "max_retries": params.answer_judge.max_retries},
        confidence=params.confidence, bootstrap_resamples=params.bootstrap_resamples,
        permutation_resamples=params.permutation_resamples, seed=params.seed)
    table, tests = comparison_table(inputs)
    keys = ("cem", "em", "f1", "format_rate", "avg_retrieval_count", "avg_generated_tokens", "osr", "usr", "lasj")
    # {arm: {dataset | "macro": {metric: value}}}: logged to each arm's method run as evaluation.<dataset>.<metric>,
    # the keys the evaluation pipeline's method runs carry, so MLflow's Compare lines them up
    metrics: dict[str, Any] = {}
    for row in table.to_dict("records"):
        metrics.setdefault(row["method"], {})[row["dataset"]] = {key: row[key] for key in keys
                                                                 if key in row and pd.notna(row[key])}
    return (table, tests, render_report(inputs, table, tests), accuracy_figure(table),
            efficiency_figure(table), search_figure(table), metrics)


def _missing_artifact(arm: CompareArm, artifacts: dict[str, Any], params: CompareParams,
                      methods: dict[str, Any]) -> str | None:
    needed = [] if arm.adapter is None else [arm.adapter]
    if _retriever_spec(arm, params, methods).kind.startswith("kag"):
        needed.append(KNOWLEDGE_GRAPH)
    for name in needed:
        if name not in artifacts:
            raise ValueError(f"compare arm {arm.name!r} names {name!r}, not an input of compare "
                             f"({', '.join(sorted(artifacts))}): an arm's adapter is the adapter of a methods "
                             "entry (conf/base/parameters_methods.yml)")
        if isinstance(artifacts[name], Missing):
            return artifacts[name].reason
    return None


def _available(artifact: Any) -> tuple[Any, str | None]:
    """The data and version of a loaded artifact (the data alone, version unknown, when this run trained it)."""
    return (artifact.data, artifact.version) if isinstance(artifact, Available) else (artifact, None)


def _method_entry(arm: CompareArm, methods: dict[str, Any]) -> dict[str, Any]:
    name = arm.method_name
    if name not in methods:
        raise ValueError(f"compare arm {arm.name!r}: method {name!r} is not a methods entry "
                         f"({', '.join(sorted(methods))}; conf/base/parameters_methods.yml)")
    return methods[name]


def _retriever_spec(arm: CompareArm, params: CompareParams, methods: dict[str, Any]) -> RetrieverSpec:
    if arm.retriever is not None:
        return arm.retriever
    if arm.method_name is not None:
        return RetrieverSpec.model_validate(dict(_method_entry(arm, methods)["retriever"]))
    return params.retriever


def _method(arm: CompareArm, methods: dict[str, Any]) -> MethodSpec:
    if arm.method_name is None:
        return MethodSpec(name=arm.name, **arm.method.model_dump())
    agent = TrainedAgentSpec.model_validate(dict(_method_entry(arm, methods)["agent"])).model_dump(exclude={"name"})
    if arm.few_shot is not None:
        agent["few_shot"] = arm.few_shot
    return MethodSpec(name=arm.name, kind="agent", **agent)


def _arm_row(arm: CompareArm, status: str, reason: str, *, version: str | None = None) -> dict[str, Any]:
    return {"arm": arm.name, "status": status, "reason": reason, "adapter": arm.adapter or "",
            "adapter_version": version or ""}

