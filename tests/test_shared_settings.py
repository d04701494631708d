"""One source of truth per setting: the places that must agree read the same block, in every conf env."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.config import OmegaConfigLoader
from pydantic import BaseModel

from prorag.config import ParameterError, validate_parameters
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.parameter_schemas import PARAMETER_SCHEMAS, all_parameter_schemas
from prorag.settings import CONFIG_LOADER_ARGS

CONF = Path(__file__).resolve().parents[1] / "conf"
SHARED = {"policy": "model", "agent": "protocol", "reward": "lambda_p"}
"""Each shared block and one setting that only it may declare."""
PIPELINE_SCHEMAS = ("rollout", "reward_judging", "sft_synthesis", "sft", "rl")


def _parameters(env: str) -> dict:
    loader = OmegaConfigLoader(str(CONF), **{**CONFIG_LOADER_ARGS, "default_run_env": env})  # as `--env <env>`
    return loader["parameters"]


def _readers(parameter: str) -> set[str]:
    return {node.name for node in register_pipelines()["train"].nodes if parameter in node.inputs}


@pytest.mark.parametrize("env", ["local", "gpu", "cpu_long"])
def test_every_parameter_file_validates(env):
    parsed = validate_parameters(_parameters(env), all_parameter_schemas())
    assert set(SHARED) <= set(parsed)


def test_shared_blocks_are_the_only_declarations_of_their_settings():
    def fields(schema: type[BaseModel]) -> set[str]:
        return set(schema.model_fields)

    for namespace in PIPELINE_SCHEMAS:  # the pipeline schemas hold no copy of a shared setting
        assert not fields(PARAMETER_SCHEMAS[namespace]) & {"model", "lambda_f", "lambda_p", "few_shot", "protocol",
                                                            "reask_max_new_tokens", "step_budget"}, namespace


def test_training_and_evaluation_read_the_same_blocks():
    assert {"rl.train_rl", "reward_judging.judge_trajectories"} <= _readers("params:reward")  # RL == judged
    assert {"sft_synthesis.synthesize_sft_data", "sft.train_sft", "rl.train_rl", "sft.run_policy_rollouts",
            "rl.run_policy_rollouts"} <= _readers("params:agent")  # one protocol, prompt and budget
    assert {"sft.train_sft", "rl.train_rl", "rollout.run_rollouts", "sft.run_policy_rollouts",
            "rl.run_policy_rollouts", "reward_judging.judge_trajectories"} <= _readers("params:policy")  # named once


def test_the_gpu_policy_server_serves_the_shared_model():
    parameters = _parameters("gpu")
    assert parameters["rl"]["policy_server"]["model"] == parameters["policy"]["model"]  # ${policy.model}


def test_an_override_of_the_reward_reaches_training_and_judging_alike():
    loader = OmegaConfigLoader(str(CONF), base_env="base", default_run_env="local",
                               runtime_params={"reward": {"kind": "hiprag", "lambda_p": 0.0}})
    parsed = validate_parameters(loader["parameters"], all_parameter_schemas())
    reward = parsed["reward"]
    assert (reward.kind, reward.lambda_p) == ("hiprag", 0.0)


def test_a_reward_kind_layered_over_another_keeps_only_its_own_settings(caplog):
    """A runtime ``reward: {kind: search_r1}`` merged over conf/base's hiprag entry: λp (hiprag's) is left out with
    a warning naming it, λf stays; an unknown key of no reward is still an error."""
    loader = OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS, runtime_params={"reward": {"kind": "search_r1"}})
    with caplog.at_level("WARNING"):
        reward = validate_parameters(loader["parameters"], all_parameter_schemas())["reward"]
    assert (reward.kind, reward.lambda_f) == ("search_r1", 0.2) and not hasattr(reward, "lambda_p")
    assert "reward 'search_r1' takes no lambda_p" in caplog.text
    typo = OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS, runtime_params={"reward": {"lambda_pp": 0.1}})
    with pytest.raises(ParameterError, match=r"unknown parameter key 'reward\.lambda_pp'; did you mean"):
        validate_parameters(typo["parameters"], all_parameter_schemas())


def _runtime_params(config: Path) -> dict:
    import yaml

    return yaml.safe_load(config.read_text())["run"]["params"]


def test_the_multistage_paper_preset_validates_over_the_gpu_env():
    preset = CONF.parent / "experiments" / "multistage_gpu.yml"
    loader = OmegaConfigLoader(str(CONF), **{**CONFIG_LOADER_ARGS, "default_run_env": "gpu"},
                               runtime_params=_runtime_params(preset))
    parsed = validate_parameters(loader["parameters"], all_parameter_schemas())
    trainer = parsed["rl"].trainer
    assert (trainer.loss_type, trainer.num_generations, trainer.max_steps, trainer.learning_rate) == \
        ("dapo", 32, 500, 1e-6)
    assert (trainer.epsilon, trainer.epsilon_high, trainer.beta, trainer.drop_uniform_groups) == (0.2, 0.28, 0.0, True)
    assert trainer.refill_rounds > 0 and parsed["rl"].retriever.top_k == 5
    assert (parsed["reward"].kind, parsed["agent"].protocol, parsed["agent"].step_budget) == \
        ("multistage", "multistage", 5)
    assert parsed["reward"].answer_judge.kind == "llm" and parsed["reward"].stage_switch_step > 0
    assert parsed["policy"].model == "Qwen/Qwen2.5-3B-Instruct"  # conf/gpu kept where the preset is silent


def test_the_multistage_preset_runs_a_pipeline_without_an_sft_stage():
    import yaml

    from prorag.pipelines.rl.nodes import train_rl_from_instruct
    from prorag.pipelines.rl.params import RLParams

    name = yaml.safe_load((CONF.parent / "experiments" / "multistage_gpu.yml").read_text())["run"]["pipelines"]
    pipeline = register_pipelines()[name]
    assert "sft_adapter" not in pipeline.all_inputs() | pipeline.all_outputs()
    assert not any(node.namespace in {"sft", "sft_synthesis"} for node in pipeline.nodes)
    with pytest.raises(ValueError, match=r"rl\.init: instruct"):
        train_rl_from_instruct([], None, RLParams(init="sft"), None, None, None)  # type: ignore[arg-type]


def test_cpu_long_trains_sft_longer_on_more_sources_and_keeps_the_rest_of_base():
    base = validate_parameters(_parameters("local"), all_parameter_schemas())
    long = validate_parameters(_parameters("cpu_long"), all_parameter_schemas())
    assert (long["sft"].max_steps, long["sft"].num_train_epochs) == (-1, 1)
    assert base["sft"].max_steps > 0
    assert set(long["sft_synthesis"].sources) > set(base["sft_synthesis"].sources) >= {"musique_train", "hotpotqa"}
    assert long["sft_synthesis"].single_search
    assert long["sft_synthesis"].retriever == base["sft_synthesis"].retriever
    assert long["agent"] == base["agent"] and long["rollout"] == base["rollout"] and long["rl"] == base["rl"]


def test_hiprag_at_paper_scale_under_the_gpu_env():
    parsed = validate_parameters(_parameters("gpu"), all_parameter_schemas())
    rl = parsed["rl"]
    assert (rl.init, rl.lora, rl.trainer.max_steps, rl.trainer.save_steps, rl.trainer.num_generations) == \
        ("instruct", False, 400, 50, 5)
    assert set(rl.questions.sources) == {"nq_train", "hotpotqa_train"}  # HiPRAG's train splits (issue 28)
    assert {method.protocol for method in parsed["rollout"].methods if method.kind == "agent"} >= \
        {"hiprag", "search_r1", "multistage"}


def test_every_pipeline_finds_its_parameters_under_every_env():
    for env in ("local", "gpu"):
        parameters = _parameters(env)
        for name, registered in register_pipelines().items():
            for dataset in registered.inputs():
                if dataset.startswith("params:"):
                    node: object = parameters
                    for key in dataset.removeprefix("params:").split("."):
                        assert isinstance(node, dict) and key in node, f"{env}: {name} needs {dataset}"
                        node = node[key]
