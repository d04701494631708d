"""Project pipelines.

Registered explicitly rather than with ``find_pipelines``: Kedro 1.7 imports only the packages named on the
command line, and composed pipelines such as ``train`` have no package of their own.
"""

from __future__ import annotations

from kedro.pipeline import Node, Pipeline, pipeline

from prorag.pipelines import (
    corpus_indexing,
    data_preparation,
    evaluation,
    reward_judging,
    rl,
    rollout,
    sft,
    sft_synthesis,
)
from prorag.pipelines.rollout.nodes import concat_trajectories, run_rl_policy_rollouts, run_sft_policy_rollouts


def register_pipelines() -> dict[str, Pipeline]:
    """Every pipeline package, plus ``index``, ``evaluate``, ``train_sft`` and ``train`` (the end-to-end job, the
    default)."""
    pipelines = {
        "data_preparation": data_preparation.create_pipeline(),
        "corpus_indexing": corpus_indexing.create_pipeline(),
        "rollout": rollout.create_pipeline(),
        "evaluation": evaluation.create_pipeline(),
        "reward_judging": reward_judging.create_pipeline(),
        "sft_synthesis": sft_synthesis.create_pipeline(),
        "sft": sft.create_pipeline(),
        "rl": rl.create_pipeline(),
    }
    pipelines["judge"] = pipelines["reward_judging"]
    pipelines["index"] = pipelines["data_preparation"] + pipelines["corpus_indexing"]
    # evaluate: roll out every configured method on the indexed questions, summarize, judge OSR/USR and rewards
    pipelines["evaluate"] = pipelines["rollout"] + pipelines["evaluation"] + pipelines["reward_judging"]
    trained_rollouts = {
        "sft": Node(run_sft_policy_rollouts, ["rollout_questions", "retrieval_index", "sft_adapter", "params:rollout"],
                    "sft_policy_trajectories", name="run_sft_policy_rollouts"),
        "rl": Node(run_rl_policy_rollouts, ["rollout_questions", "retrieval_index", "rl_adapter", "params:rollout"],
                   "rl_policy_trajectories", name="run_rl_policy_rollouts"),
    }
    judged = pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                      inputs={"trajectories": "all_trajectories"})
    # train: index → base rollouts → SFT data → LoRA SFT → GRPO → base, SFT and RL policies evaluated side by side
    pipelines["train"] = (
        pipelines["index"] + pipelines["rollout"] + pipelines["sft_synthesis"] + pipelines["sft"] + pipelines["rl"]
        + Pipeline([trained_rollouts["sft"], trained_rollouts["rl"],
                    Node(concat_trajectories,
                         ["trajectories", "sft_policy_trajectories", "rl_policy_trajectories"],
                         "all_trajectories", name="concat_trajectories")])
        + judged)
    # train_sft: the same without RL (index → base rollouts → SFT data → SFT → base and SFT evaluated)
    pipelines["train_sft"] = (
        pipelines["index"] + pipelines["rollout"] + pipelines["sft_synthesis"] + pipelines["sft"]
        + Pipeline([trained_rollouts["sft"],
                    Node(concat_trajectories, ["trajectories", "sft_policy_trajectories"], "all_trajectories",
                         name="concat_trajectories")])
        + judged)
    # train_rl: GRPO from the latest SFT adapter, then the RL policy evaluated and judged (reward experiments)
    pipelines["train_rl"] = (
        pipelines["rollout"].only_nodes("select_rollout_questions") + pipelines["rl"]
        + Pipeline([trained_rollouts["rl"]])
        + pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                   inputs={"trajectories": "rl_policy_trajectories"}))
    pipelines["__default__"] = pipelines["train"]
    return pipelines
