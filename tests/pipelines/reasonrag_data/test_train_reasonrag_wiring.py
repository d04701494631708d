"""train_reasonrag composes index, base rollouts, ReasonRAG data, DPO, the DPO policy's rollouts and judging."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.pipeline_registry import register_pipelines

CONF = Path(__file__).resolve().parents[3] / "conf"


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


def test_the_trees_are_searched_for_the_method_s_value():
    """ReasonRAG's value function (SPRE) is its ``methods`` entry's ``value``, read by the MCTS and pair nodes of
    ``train_reasonrag`` and of the stage pipeline run alone (before: ``reasonrag_data.mcts`` and
    ``reasonrag_data.judge``, a stage block of no method)."""
    pipelines = register_pipelines()
    for pipeline in (pipelines["train_reasonrag"], pipelines["reasonrag_data"]):
        for name in ("reasonrag_data.run_reasonrag_mcts", "reasonrag_data.build_reasonrag_pairs"):
            node = next(node for node in pipeline.nodes if node.name == name)
            assert "params:methods.reasonrag.value" in node.inputs, name


def test_the_value_set_in_the_entry_is_the_one_searched_for():
    from prorag.config_loader import CONFIG_LOADER_ARGS, ProjectConfigLoader
    from prorag.pipelines.reasonrag_data.params import ReasonRAGDataParams
    from prorag.training.mcts import MCTSValue, search_config

    parameters = ProjectConfigLoader(str(CONF), **CONFIG_LOADER_ARGS, runtime_params={
        "methods": {"reasonrag": {"value": {"alpha": 0.5}}}})["parameters"]
    method = parameters["methods"]["reasonrag"]
    value = MCTSValue.model_validate(method["value"])
    config = search_config(ReasonRAGDataParams.model_validate(method["stages"]["reasonrag_data"]).mcts, value)
    assert (value.kind, config.value, config.alpha, config.rollouts) == ("spre", "rollout", 0.5, 1)


@pytest.mark.parametrize(("override", "message"), [
    ({"reasonrag_data": {"mcts": {"alpha": 0.9}}},
     r"reasonrag_data\.mcts\.alpha moved: .* set methods\.<name>\.value\.alpha"),
    ({"reasonrag_data": {"judge": {"kind": "llm"}}}, r"reasonrag_data\.judge moved: .* methods\.<name>\.value\.judge"),
    ({"methods": {"hiprag": {"value": {"alpha": 0.9}}}}, r"methods\.hiprag\.value: recipe 'sft_rl' searches no tree"),
])
def test_a_value_key_where_it_no_longer_belongs_names_where_it_goes(override, message):
    from prorag.config import ParameterError, validate_parameters
    from prorag.config_loader import CONFIG_LOADER_ARGS, ProjectConfigLoader
    from prorag.pipelines.parameter_schemas import all_parameter_schemas

    with pytest.raises(ParameterError, match=message):
        parameters = ProjectConfigLoader(str(CONF), **CONFIG_LOADER_ARGS, runtime_params=override)["parameters"]
        validate_parameters(parameters, all_parameter_schemas())
