"""SFT synthesis: indexed questions (minus the evaluated ones: rollout and compare questions) → gold trajectories."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.sft_synthesis.nodes import synthesize_sft_data


def create_pipeline(**kwargs: object) -> Pipeline:
    """Synthesize gold trajectories with the project's own retrieval contexts (namespace ``sft_synthesis``)."""
    return Pipeline([
        Node(synthesize_sft_data, ["index_questions", "evaluated_questions", "retrieval_index", "params:sft_synthesis",
                                   "params:agent"],
             ["sft_trajectories", "sft_synthesis_metrics"], name="synthesize_sft_data"),
    ], namespace="sft_synthesis", prefix_datasets_with_namespace=False, tags=[tags.TRAINING, *tags.TRAINED_AGENT])
