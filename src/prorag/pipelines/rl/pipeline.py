"""RL: training questions (never the evaluated ones) → GRPO from the SFT adapter → RL adapter (versioned)."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines.rl.nodes import select_rl_questions, train_rl


def create_pipeline(**kwargs: object) -> Pipeline:
    """Select the training questions, then train the policy with GRPO and the shared ``reward`` block."""
    return Pipeline([
        Node(select_rl_questions, ["index_questions", "rollout_questions", "params:rl"], "rl_questions",
             name="select_rl_questions"),
        Node(train_rl, ["rl_questions", "retrieval_index", "sft_adapter", "params:rl", "params:policy",
                        "params:agent", "params:reward"],
             ["rl_adapter", "rl_training_log"], name="train_rl"),
    ])
