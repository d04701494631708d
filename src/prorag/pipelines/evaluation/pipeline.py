"""Evaluation: trajectories → a per-method, per-dataset table and MLflow metrics."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.evaluation.nodes import evaluate_trajectories, summarize_results


def create_pipeline(**kwargs: object) -> Pipeline:
    """Summarize the trajectories (namespace ``evaluation``)."""
    return Pipeline([
        Node(evaluate_trajectories, "trajectories", ["evaluation_table", "evaluation_metrics"],
             name="evaluate_trajectories"),
        Node(summarize_results, "trajectories", "evaluation_summary", name="summarize_results"),
    ], namespace="evaluation", prefix_datasets_with_namespace=False, tags=[tags.EVALUATION])

