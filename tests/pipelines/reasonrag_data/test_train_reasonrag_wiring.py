"""train_reasonrag composes index, base rollouts, ReasonRAG data, DPO, the DPO policy's rollouts and judging."""

from __future__ import annotations

from prorag.pipeline_registry import register_pipelines


def test_train_reasonrag_wiring() -> None:
    pipelines = register_pipelines()
    train = pipelines["train_reasonrag"]
    names = {node.name for node in train.nodes}
    assert {"build_index", "run_rollouts", "select_reasonrag_questions", "run_reasonrag_mcts", "build_reasonrag_pairs",
            "train_dpo", "dpo.run_policy_rollouts", "concat_trajectories", "evaluate_trajectories",
            "judge_trajectories"} <= names
    rollout = next(node for node in train.nodes if node.name == "dpo.run_policy_rollouts")
    assert "dpo_adapter" in rollout.inputs and "params:reasonrag_agent" in rollout.inputs
    assert rollout.outputs == ["dpo_policy_trajectories"]
    select = next(node for node in train.nodes if node.name == "select_reasonrag_questions")
    assert "rollout_questions" in select.inputs  # the evaluated questions are excluded from training
    assert {"reasonrag_data", "dpo"} <= set(pipelines)
