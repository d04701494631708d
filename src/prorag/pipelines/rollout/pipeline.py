"""Rollout: selected questions × policy × retriever → trajectories; and the trained agent per trained policy."""

from collections.abc import Iterable
from typing import Any

from kedro.pipeline import Node, Pipeline, pipeline

from prorag.pipelines import tags
from prorag.pipelines.rollout.nodes import (
    run_rollouts,
    run_trained_rollouts,
    select_evaluated_questions,
    select_rollout_questions,
)
from prorag.pipelines.rollout.params import RolloutParams
from prorag.retrieval import RetrievalIndex
from prorag.specs import PolicySpec, TrainedAgentSpec


def create_pipeline(**kwargs: object) -> Pipeline:
    """Select the questions, then roll out every configured method (namespace ``rollout``)."""
    return Pipeline([
        Node(select_rollout_questions, ["index_questions", "params:rollout"], "rollout_questions",
             name="select_rollout_questions"),
        Node(run_rollouts, ["rollout_questions", "retrieval_index", "params:rollout", "params:policy"],
             "trajectories", name="run_rollouts"),
    ], namespace="rollout", prefix_datasets_with_namespace=False, tags=[tags.ROLLOUT])


def evaluated_questions_pipeline() -> Pipeline:
    """``rollout.select_evaluated_questions``: ``rollout_questions`` ∪ ``compare_questions`` → ``evaluated_questions``,
    the questions every trainer excludes (``pipeline_registry`` composes it with the two selections)."""
    return Pipeline([
        Node(select_evaluated_questions, ["rollout_questions", "compare_questions"], "evaluated_questions",
             name="select_evaluated_questions"),
    ], namespace="rollout", prefix_datasets_with_namespace=False, tags=[tags.DATA])


def trained_policy_rollouts(stage: str, method_tags: Iterable[str] = ()) -> Pipeline:
    """The trained agent rolled out with the ``<stage>_adapter`` merged into the policy: one modular pipeline in
    namespace ``stage`` (node ``<stage>.run_policy_rollouts``, beside the stage's trainer), output
    ``<stage>_policy_trajectories``; tagged ``rollout`` and ``method_tags``."""
    def run_policy_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex, adapter_dir: str,
                            params: RolloutParams, policy: PolicySpec, agent: TrainedAgentSpec,
                            ) -> list[dict[str, Any]]:
        return run_trained_rollouts(question_records, index, adapter_dir, params, policy, agent, stage)

    # a typed function per stage (not a partial): Kedro instantiates the params:... schemas from its annotations
    run_policy_rollouts.__doc__ = run_trained_rollouts.__doc__
    template = Pipeline([
        Node(run_policy_rollouts, ["rollout_questions", "retrieval_index", "adapter", "params:rollout", "params:policy",
                   "params:agent"], "policy_trajectories", name="run_policy_rollouts"),
    ])
    return pipeline(template, namespace=stage,
                    inputs={"rollout_questions": "rollout_questions", "retrieval_index": "retrieval_index",
                            "adapter": f"{stage}_adapter"},
                    outputs={"policy_trajectories": f"{stage}_policy_trajectories"},
                    parameters={"params:rollout", "params:policy", "params:agent"},
                    tags=[tags.ROLLOUT, *method_tags])
