"""DPO: preference pairs → LoRA adapter (versioned, attached to the MLflow run), curves in MLflow."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.dpo.nodes import train_dpo


def create_pipeline(**kwargs: object) -> Pipeline:
    """Train the adapter on ``reasonrag_pairs`` (map another pair set onto that input to reuse it); namespace
    ``dpo``, shared with the DPO policy's rollouts."""
    return Pipeline([
        Node(train_dpo, ["reasonrag_pairs", "params:dpo", "params:policy", "params:launch"],
             ["dpo_adapter", "dpo_metrics", "dpo_training_log"], name="train_dpo"),
    ], namespace="dpo", prefix_datasets_with_namespace=False, tags=[tags.TRAINING, tags.REASONRAG])
