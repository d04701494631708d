"""ReasonRAG data: training questions (disjoint from the evaluated ones) → MCTS trees → step-level pairs + report."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.reasonrag_data.nodes import (
    build_reasonrag_pairs,
    run_reasonrag_mcts,
    run_reasonrag_mcts_from_adapter,
    select_reasonrag_questions,
)


def create_pipeline(explorer_adapter: str | None = None, **kwargs: object) -> Pipeline:
    """Select the questions, search their trees, build and report the pairs (namespace ``reasonrag_data``).
    ``params:agent`` and ``params:value`` are the ReasonRAG method's (the pipeline registry maps them to
    ``methods.<name>.agent`` and ``methods.<name>.value``: its value function, SPRE or eq. 6's judgment);
    ``explorer_adapter`` names a dataset holding a LoRA adapter the policy explores with (a cold start)."""
    inputs = ["reasonrag_questions", "retrieval_index", "params:reasonrag_data", "params:policy", "params:agent",
              "params:value"]
    search = (Node(run_reasonrag_mcts, inputs, "reasonrag_trees", name="run_reasonrag_mcts") if explorer_adapter is None
              else Node(run_reasonrag_mcts_from_adapter, [*inputs, explorer_adapter], "reasonrag_trees",
                        name="run_reasonrag_mcts"))
    return Pipeline([
        Node(select_reasonrag_questions, ["index_questions", "evaluated_questions", "params:reasonrag_data"],
             "reasonrag_questions", name="select_reasonrag_questions"),
        search,
        Node(build_reasonrag_pairs, ["reasonrag_trees", "params:reasonrag_data", "params:value"],
             ["reasonrag_pairs", "reasonrag_data_metrics", "reasonrag_data_report"], name="build_reasonrag_pairs"),
    ], namespace="reasonrag_data", prefix_datasets_with_namespace=False, tags=[tags.TRAINING, tags.REASONRAG])
