"""DPO: preference pairs → LoRA adapter (versioned, attached to the MLflow run), curves in MLflow."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.dpo.nodes import train_dpo, train_dpo_from_adapter


def create_pipeline(init_adapter: str | None = None, **kwargs: object) -> Pipeline:
    """Train the adapter on ``reasonrag_pairs`` (map another pair set onto that input to reuse it); namespace
    ``dpo``, shared with the DPO policy's rollouts. ``init_adapter`` names a dataset holding the LoRA adapter to
    continue (a cold start) instead of a new one."""
    outputs = ["dpo_adapter", "dpo_metrics", "dpo_training_log"]
    train = (Node(train_dpo, ["reasonrag_pairs", "params:dpo", "params:policy", "params:launch"], outputs,
                  name="train_dpo") if init_adapter is None else
             Node(train_dpo_from_adapter, ["reasonrag_pairs", "params:dpo", "params:policy", init_adapter,
                                           "params:launch"], outputs, name="train_dpo"))
    return Pipeline([
        train,
    ], namespace="dpo", prefix_datasets_with_namespace=False, tags=[tags.TRAINING, tags.REASONRAG])
