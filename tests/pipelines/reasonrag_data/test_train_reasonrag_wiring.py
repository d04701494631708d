"""train_reasonrag composes index, base rollouts, ReasonRAG data, DPO, the DPO policy's rollouts and judging."""

from __future__ import annotations

from prorag.pipeline_registry import register_pipelines


def test_train_reasonrag_wiring() -> None:
    pipelines = register_pipelines()
    train = pipelines["train_reasonrag"]
    names = {node.name for node in train.nodes}
    assert {"corpus_indexing.build_index", "rollout.run_rollouts", "reasonrag_data.select_reasonrag_questions",
            "reasonrag_data.run_reasonrag_mcts", "reasonrag_data.build_reasonrag_pairs", "dpo.train_dpo",
            "dpo.run_policy_rollouts", "evaluation.concat_trajectories", "evaluation.evaluate_trajectories",
            "reward_judging.judge_trajectories"} <= names
    rollout = next(node for node in train.nodes if node.name == "dpo.run_policy_rollouts")
    assert "dpo_adapter" in rollout.inputs and "params:methods.reasonrag.agent" in rollout.inputs
    mcts = next(node for node in train.nodes if node.name == "reasonrag_data.run_reasonrag_mcts")
    assert "params:methods.reasonrag.agent" in mcts.inputs  # the MCTS explores with the prompt DPO is rolled out in
    assert rollout.outputs == ["dpo_policy_trajectories"]
    select = next(node for node in train.nodes if node.name == "reasonrag_data.select_reasonrag_questions")
    assert "evaluated_questions" in select.inputs  # the evaluated questions are excluded from training
    assert {"reasonrag_data", "dpo"} <= set(pipelines)
