"""Reward judging: trajectories → step verdicts → rewards (the shared ``reward`` block, as RL) → metrics."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.reward_judging.nodes import judge_trajectories


def create_pipeline(**kwargs: object) -> Pipeline:
    """Judge every trajectory's steps and compute its reward (namespace ``reward_judging``)."""
    return Pipeline([
        Node(judge_trajectories,
             ["trajectories", "retrieval_index", "params:reward_judging", "params:reward", "params:policy",
              "index_questions"],
             ["step_verdicts", "trajectory_rewards", "judge_metrics"], name="judge_trajectories"),
    ], namespace="reward_judging", prefix_datasets_with_namespace=False, tags=[tags.EVALUATION])
