"""Nodes of the ReasonRAG data pipeline: training questions, MCTS trees, preference pairs and their report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prorag.assembly import build_judge_from_spec, build_policy, build_retriever
from prorag.data import Question, select_questions
from prorag.pipelines.reasonrag_data.params import ReasonRAGDataParams
from prorag.retrieval import RetrievalIndex
from prorag.specs import PolicySpec, TrainedAgentSpec
from prorag.training.mcts import (
    MCTSConfig,
    MCTSValue,
    pair_statistics,
    preference_pairs,
    run_mcts,
    search_config,
    tree_statistics,
)


def select_reasonrag_questions(question_records: list[dict[str, Any]], evaluation_records: list[dict[str, Any]],
                               params: ReasonRAGDataParams) -> list[dict[str, Any]]:
    """The training questions, disjoint from the evaluated ones (``evaluated_questions``: rollout and compare
    questions; by key and by text, checked: an overlap is an error naming it)."""
    evaluated_questions = [Question.from_dict(record) for record in evaluation_records]
    evaluated = {question.key for question in evaluated_questions}
    selected = select_questions(map(Question.from_dict, question_records), params.questions.sources,
                                max_per_source=params.questions.max_per_source, exclude=evaluated_questions,
                                setting="reasonrag_data.questions.sources", part=params.questions.part)
    check_disjoint([question.key for question in selected], evaluated)
    if not selected:
        raise ValueError("reasonrag_data.questions selects no question (all evaluated, or empty sources)")
    return [question.to_dict() for question in selected]


def check_disjoint(training_keys: list[str], evaluated_keys: set[str]) -> None:
    """Raise naming every training question that is also evaluated."""
    overlap = sorted(set(training_keys) & evaluated_keys)
    if overlap:
        shown = ", ".join(overlap[:10]) + (f", … ({len(overlap)} in all)" if len(overlap) > 10 else "")
        raise ValueError(f"{len(overlap)} ReasonRAG training question(s) are also evaluated: {shown}")


def run_reasonrag_mcts(question_records: list[dict[str, Any]], index: RetrievalIndex, params: ReasonRAGDataParams,
                       policy: PolicySpec, agent: TrainedAgentSpec, value: MCTSValue) -> list[dict[str, Any]]:
    """MCTS with the method's ``value`` (SPRE, or eq. 6's judgment) over every training question; one record per
    tree node. The prompt is the ReasonRAG agent's (``agent.few_shot``), the one its DPO policy is later rolled out
    with.

    Finished questions are appended to ``<work_dir>/<fingerprint>.jsonl`` as they finish; re-running the same
    settings over the same inputs after a crash resumes there and never searches a finished question again. The
    fingerprint covers every input the trees depend on (:func:`mcts_fingerprint`): a re-index, other question texts
    or another explorer start new trees.
    """
    if agent.protocol != "reasonrag":
        raise ValueError(f"the ReasonRAG method's agent.protocol must be 'reasonrag', got {agent.protocol!r} "
                         "(methods.<name>.agent in conf/base/parameters_methods.yml)")
    questions = [Question.from_dict(record) for record in question_records]
    explorer = params.policy or policy
    retriever = build_retriever(params.retriever, index)
    judge = None
    if value.kind == "judge" and value.judge_prompt == "answer_matching":
        judge = build_judge_from_spec(value.judge, retriever=index.retriever("bm25"))
    config = search_config(params.mcts, value, top_k=params.retriever.top_k, few_shot=agent.few_shot)
    fingerprint = mcts_fingerprint(config, value, params, explorer, questions, index)
    results = Path(params.work_dir) / f"{fingerprint}.jsonl"
    return run_mcts(build_policy(explorer), retriever, questions, config, results, judge=judge)


def run_reasonrag_mcts_from_adapter(question_records: list[dict[str, Any]], index: RetrievalIndex,
                                    params: ReasonRAGDataParams, policy: PolicySpec, agent: TrainedAgentSpec,
                                    value: MCTSValue, explorer_adapter: str) -> list[dict[str, Any]]:
    """:func:`run_reasonrag_mcts` with the shared policy plus ``explorer_adapter`` (the method's cold-start SFT
    adapter, recipe ``sft_mcts_dpo``) as the explorer; a ``reasonrag_data.policy`` of its own is refused (it would
    leave the cold start unused)."""
    if params.policy is not None:
        raise ValueError("reasonrag_data.policy names an explorer of its own, and recipe sft_mcts_dpo explores with "
                         "its cold-start SFT adapter: use recipe mcts_dpo for a separate explorer")
    return run_reasonrag_mcts(question_records, index, params,
                              policy.model_copy(update={"adapter": explorer_adapter}), agent, value)


def mcts_fingerprint(config: MCTSConfig, value: MCTSValue, params: ReasonRAGDataParams, policy: PolicySpec,
                     questions: list[Question], index: RetrievalIndex) -> str:
    """A short hash of everything that shapes the trees: the search settings with the value, explorer, retriever,
    judge, the questions (whole records: an edited question or gold answer is another question) and the index's
    version (its metadata, with its build time, and its passage ids), so trees searched over an older index are never
    resumed. The same settings hash as before the value moved to the method (``reasonrag_data.mcts`` and ``judge``),
    so trees searched then are resumed."""
    payload = json.dumps({"mcts": config.model_dump(), "policy": policy.model_dump(),
                          "retriever": params.retriever.model_dump(), "judge": value.judge.model_dump(),
                          "questions": [question.to_dict() for question in questions],
                          "index": index.fingerprint()}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_reasonrag_pairs(tree_records: list[dict[str, Any]], params: ReasonRAGDataParams, value: MCTSValue
                          ) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, Any]]:
    """Step-level preference pairs (§2.2.3) and the data report (MLflow metrics and a reporting file)."""
    pairs, dropped = preference_pairs(tree_records, min_gap=params.min_reward_gap)
    trees = tree_statistics(tree_records)
    metrics = {**trees, **pair_statistics(pairs, int(trees["questions"])),
               "dropped_identical": dropped.get("identical", 0), "dropped_small_gap": dropped.get("small_gap", 0)}
    report = {"metrics": metrics, "settings": params.model_dump(mode="json"), "value": value.model_dump(mode="json"),
              "examples": [{key: pair[key] for key in ("question", "chosen", "rejected", "chosen_q", "rejected_q",
                                                       "chosen_action", "rejected_action")} for pair in pairs[:5]]}
    return pairs, metrics, report
