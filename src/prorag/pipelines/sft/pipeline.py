"""SFT: synthesized trajectories → LoRA adapter (versioned) and its loss curve (MLflow)."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.sft.nodes import train_sft


def create_pipeline(**kwargs: object) -> Pipeline:
    """Train the LoRA adapter (namespace ``sft``, shared with the SFT policy's rollouts)."""
    return Pipeline([
        Node(train_sft, ["sft_trajectories", "params:sft", "params:policy", "params:agent",
                        "params:launch"],
             ["sft_adapter", "sft_metrics"], name="train_sft"),
    ], namespace="sft", prefix_datasets_with_namespace=False, tags=[tags.TRAINING, *tags.TRAINED_AGENT])
