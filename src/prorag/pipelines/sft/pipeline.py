"""SFT: synthesized trajectories → LoRA adapter (versioned) and its loss curve (MLflow)."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines.sft.nodes import train_sft


def create_pipeline(**kwargs: object) -> Pipeline:
    """Train the LoRA adapter."""
    return Pipeline([
        Node(train_sft, ["sft_trajectories", "params:sft", "params:policy", "params:agent"],
             ["sft_adapter", "sft_metrics"], name="train_sft"),
    ])
