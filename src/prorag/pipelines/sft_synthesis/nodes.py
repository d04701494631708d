"""Nodes of the SFT-synthesis pipeline."""

from __future__ import annotations

from typing import Any

from prorag.assembly import build_retriever
from prorag.data import Question, require_train_split, select_questions
from prorag.pipelines.sft_synthesis.params import SftSynthesisParams
from prorag.retrieval import RetrievalIndex
from prorag.specs import TrainedAgentSpec
from prorag.training import split_for_synthesis, synthesis_summary, synthesize_trajectories


def synthesize_sft_data(question_records: list[dict[str, Any]], evaluation_records: list[dict[str, Any]],
                        index: RetrievalIndex, params: SftSynthesisParams,
                        agent: TrainedAgentSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Gold trajectories in the trained agent's protocol for the selected questions; the evaluated questions
    (``evaluated_questions``: the rollout and compare questions) are excluded by key and by text (and checked), and
    every selected question must be of a train split."""
    evaluated = [Question.from_dict(record) for record in evaluation_records]
    evaluation_keys = {question.key for question in evaluated}
    selected = select_questions(map(Question.from_dict, question_records), params.sources,
                                max_per_source=params.max_per_source, exclude=evaluated,
                                setting="sft_synthesis.sources")
    require_train_split(selected, "sft_synthesis.sources")
    questions = split_for_synthesis(selected, evaluation_keys)
    trajectories, skipped = synthesize_trajectories(questions, build_retriever(params.retriever, index),
                                                    top_k=params.retriever.top_k, seed=params.seed,
                                                    protocol=agent.protocol, single_search=params.single_search,
                                                    first_hops=params.first_hops,
                                                    later_hops=params.later_hops)
    if not trajectories:
        raise ValueError("sft_synthesis produced no trajectory (check sft_synthesis.sources)")
    return [trajectory.to_dict() for trajectory in trajectories], synthesis_summary(trajectories, skipped)
