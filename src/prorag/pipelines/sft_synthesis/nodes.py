"""Nodes of the SFT-synthesis pipeline."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from prorag.config import StrictModel, register_parameters
from prorag.data import Question, select_training_questions
from prorag.retrieval import RetrievalIndex
from prorag.training import split_for_synthesis, synthesis_summary, synthesize_trajectories


@register_parameters("sft_synthesis")
class SftSynthesisParams(StrictModel):
    """Which indexed questions become gold trajectories, and how their contexts are retrieved."""

    sources: list[str] = Field(default=["musique_train", "hotpotqa"], min_length=1)
    max_per_source: int | None = Field(default=None, ge=1)
    retriever: Literal["dense", "bm25", "hybrid"] = "dense"
    top_k: int = Field(default=3, ge=1)
    seed: int = 0


def synthesize_sft_data(question_records: list[dict[str, Any]], evaluation_records: list[dict[str, Any]],
                        index: RetrievalIndex, params: SftSynthesisParams,
                        ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Gold trajectories for the selected questions; the evaluated questions are excluded (and checked)."""
    evaluation_keys = {Question.from_dict(record).key for record in evaluation_records}
    selected = select_training_questions(map(Question.from_dict, question_records), params.sources,
                                         max_per_source=params.max_per_source, exclude_keys=evaluation_keys,
                                         setting="sft_synthesis.sources")
    questions = split_for_synthesis(selected, evaluation_keys)
    trajectories, skipped = synthesize_trajectories(questions, index.retriever(params.retriever), top_k=params.top_k,
                                                    seed=params.seed)
    if not trajectories:
        raise ValueError("sft_synthesis produced no trajectory (check sft_synthesis.sources)")
    return [trajectory.to_dict() for trajectory in trajectories], synthesis_summary(trajectories, skipped)
