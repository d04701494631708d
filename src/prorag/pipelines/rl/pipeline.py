"""RL: training questions (never the evaluated ones) → GRPO from the SFT adapter → RL adapter (versioned)."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.rl.nodes import select_rl_questions, train_rl, train_rl_from_instruct


def create_pipeline(*, from_sft: bool = True, **kwargs: object) -> Pipeline:
    """Select the training questions, then train the policy with GRPO and the shared ``reward`` block (namespace
    ``rl``, shared with the RL policy's rollouts). ``from_sft=False``: no ``sft_adapter`` input, for ``rl.init:
    instruct`` (HiPRAG and the multi-stage paper train the instruct model with RL alone)."""
    if from_sft:
        train = Node(train_rl, ["rl_questions", "retrieval_index", "sft_adapter", "params:rl", "params:policy",
                                "params:agent", "params:reward", "params:launch"],
                     ["rl_adapter", "rl_training_log"], name="train_rl")
    else:
        train = Node(train_rl_from_instruct, ["rl_questions", "retrieval_index", "params:rl", "params:policy",
                                              "params:agent", "params:reward", "params:launch"],
                     ["rl_adapter", "rl_training_log"], name="train_rl")
    return Pipeline([
        Node(select_rl_questions, ["index_questions", "evaluated_questions", "params:rl"], "rl_questions",
             name="select_rl_questions"),
        train,
    ], namespace="rl", prefix_datasets_with_namespace=False, tags=[tags.TRAINING, *tags.TRAINED_AGENT])
