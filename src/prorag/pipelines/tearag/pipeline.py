"""TeaRAG: SFT data (§4.3.1) → LoRA SFT → IP-DPO rounds (§4.3.2) → the policies rolled out on the dev questions."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.tearag.nodes import build_sft_data, run_ip_dpo_rounds, run_tearag_rollouts, train_tearag_sft


def create_pipeline(**kwargs: object) -> Pipeline:
    """Needs ``questions``, ``evaluated_questions`` (excluded from the SFT and IP-DPO questions),
    ``rollout_questions`` (the shared dev questions), ``retrieval_index`` and ``knowledge_graph``; writes
    ``tearag_trajectories`` for the evaluation and judging pipelines (namespace ``tearag``). IP-DPO scores with
    ``params:reward``, the method's reward (the registry maps it to ``methods.<name>.reward``)."""
    return Pipeline([
        Node(build_sft_data, ["questions", "evaluated_questions", "params:kg_extraction", "params:tearag"],
             ["tearag_sft_data", "tearag_sft_data_metrics"], name="build_tearag_sft_data", tags=[tags.TRAINING]),
        Node(train_tearag_sft, ["tearag_sft_data", "params:policy", "params:tearag", "params:launch"],
             ["tearag_sft_adapter", "tearag_sft_metrics"], name="train_tearag_sft", tags=[tags.TRAINING]),
        Node(run_ip_dpo_rounds,
             ["questions", "evaluated_questions", "retrieval_index", "knowledge_graph", "tearag_sft_adapter",
              "params:kg_extraction", "params:policy", "params:tearag", "params:reward", "params:launch"],
             ["tearag_adapter", "tearag_ip_dpo_metrics", "tearag_ip_dpo_pairs", "tearag_ip_dpo_samples"],
             name="run_ip_dpo_rounds", tags=[tags.TRAINING]),
        Node(run_tearag_rollouts,
             ["rollout_questions", "retrieval_index", "knowledge_graph", "tearag_sft_adapter", "tearag_adapter",
              "params:kg_extraction", "params:policy", "params:tearag"],
             "tearag_trajectories", name="run_tearag_rollouts", tags=[tags.ROLLOUT]),
    ], namespace="tearag", prefix_datasets_with_namespace=False, tags=[tags.TEARAG])
