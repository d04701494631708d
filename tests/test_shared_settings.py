"""One source of truth per setting: the places that must agree read the same block, in every conf env."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from pydantic import BaseModel

from prorag.config import ParameterError, validate_parameters
from prorag.config_loader import CONFIG_LOADER_ARGS
from prorag.config_loader import ProjectConfigLoader as OmegaConfigLoader
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.parameter_schemas import PARAMETER_SCHEMAS, all_parameter_schemas

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
    reward, agent = "params:methods.hiprag.reward", "params:methods.hiprag.agent"  # train = train_hiprag
    assert {"rl.train_rl", "reward_judging.judge_trajectories"} <= _readers(reward)  # RL == judged
    assert {"sft_synthesis.synthesize_sft_data", "sft.train_sft", "rl.train_rl", "sft.run_policy_rollouts",
            "rl.run_policy_rollouts"} <= _readers(agent)  # one protocol, prompt and budget
    assert {"sft.train_sft", "rl.train_rl", "rollout.run_rollouts", "sft.run_policy_rollouts",
            "rl.run_policy_rollouts", "reward_judging.judge_trajectories"} <= _readers("params:policy")  # named once
    assert not _readers("params:agent") and not _readers("params:reward")  # nothing reads around the method


def test_cpu_recipe_deviations_do_not_merge_into_the_gpu_env():
    """Parameters merge softly across envs: conf/gpu pins the paper's value where conf/base deviates for the CPU."""
    base, gpu = _parameters("local"), _parameters("gpu")
    paper_lora = ["q_proj", "k_proj", "v_proj", "o_proj"]  # TeaRAG §5.1, both stages
    assert base["tearag"]["sft"]["target_modules"] != paper_lora
    assert gpu["tearag"]["sft"]["target_modules"] == paper_lora
    reasonrag_dpo = gpu["methods"]["reasonrag"]["stages"]["dpo"]["trainer"]
    assert base["methods"]["reasonrag"]["stages"]["dpo"]["trainer"]["sft_weight"] > 0
    assert reasonrag_dpo["sft_weight"] == 0  # the paper's plain DPO


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


def _preset_parameters() -> dict:
    preset = CONF.parent / "experiments" / "multistage_gpu.yml"
    loader = OmegaConfigLoader(str(CONF), **{**CONFIG_LOADER_ARGS, "default_run_env": "gpu"},
                               runtime_params=_runtime_params(preset))
    return loader["parameters"]


def test_the_multistage_paper_preset_validates_over_the_gpu_env():
    parsed = validate_parameters(_preset_parameters(), all_parameter_schemas())
    multistage = parsed["methods"].multistage
    trainer = multistage.stages.rl.trainer
    assert (trainer.loss_type, trainer.num_generations, trainer.max_steps, trainer.learning_rate) == \
        ("dapo", 32, 500, 1e-6)
    assert (trainer.epsilon, trainer.epsilon_high, trainer.beta, trainer.drop_uniform_groups) == (0.2, 0.28, 0.0, True)
    assert trainer.refill_rounds > 0 and multistage.stages.rl.retriever.top_k == 5 == multistage.retriever.top_k
    reward = multistage.reward_settings()
    assert (reward.kind, multistage.agent.protocol, multistage.agent.step_budget) == ("multistage", "multistage", 5)
    assert reward.answer_judge.kind == "llm" and reward.stage_switch_step > 0
    assert parsed["policy"].model == "Qwen/Qwen2.5-3B-Instruct"  # conf/gpu kept where the preset is silent
    hiprag = parsed["rl"].trainer  # HiPRAG's untouched: GRPO's group 5, symmetric clipping, KL
    assert parsed["reward"].kind == "hiprag" and (hiprag.num_generations, hiprag.epsilon_high, hiprag.beta) == \
        (5, None, 0.001)


def test_the_multistage_preset_runs_a_pipeline_without_an_sft_stage():
    import yaml

    name = yaml.safe_load((CONF.parent / "experiments" / "multistage_gpu.yml").read_text())["run"]["pipelines"]
    pipeline = register_pipelines()[name]
    assert "sft_adapter" not in pipeline.all_inputs() | pipeline.all_outputs()
    assert not any(node.namespace in {"sft", "sft_synthesis"} for node in pipeline.nodes)


def test_the_pipeline_without_sft_trains_from_the_instruct_model_whatever_rl_init_says(monkeypatch):
    """train_rl_instruct runs on the embedded default (rl.init: sft): the pipeline, not the flag, has no SFT stage."""
    import prorag.pipelines.rl.nodes as nodes
    from prorag.pipelines.rl.params import RLParams

    seen = {}

    def fake_train_rl(records, index, sft_adapter, params, *args):
        seen.update(adapter=sft_adapter, init=params.init)
        return "adapter", []

    monkeypatch.setattr(nodes, "train_rl", fake_train_rl)
    assert nodes.train_rl_from_instruct([], None, RLParams(init="sft"), None, None, None) == ("adapter", [])  # type: ignore[arg-type]
    assert seen == {"adapter": "", "init": "instruct"}  # the fingerprint and the trainer see where it starts


def test_cpu_long_trains_sft_longer_on_more_sources_and_keeps_the_rest_of_base():
    base = validate_parameters(_parameters("local"), all_parameter_schemas())
    long = validate_parameters(_parameters("cpu_long"), all_parameter_schemas())
    assert (long["sft"].max_steps, long["sft"].num_train_epochs) == (-1, 1)
    assert base["sft"].max_steps > 0
    assert set(long["sft_synthesis"].sources) == set(base["sft_synthesis"].sources) == {"musique_train"}  # train only
    assert long["sft_synthesis"].single_search
    assert long["sft_synthesis"].retriever == base["sft_synthesis"].retriever
    assert long["agent"] == base["agent"] and long["rollout"] == base["rollout"] and long["rl"] == base["rl"]


def test_hiprag_at_paper_scale_under_the_gpu_env():
    parsed = validate_parameters(_parameters("gpu"), all_parameter_schemas())
    rl = parsed["rl"]
    assert (rl.init, rl.lora, rl.trainer.max_steps, rl.trainer.save_steps, rl.trainer.num_generations) == \
        ("instruct", False, 400, 50, 5)
    # Search-R1's verl recipe averages the policy loss over tokens, not per completion (TRL 1.16's `dapo`
    # normalization), with GRPO's symmetric clipping and KL kept
    assert (rl.trainer.loss_type, rl.trainer.epsilon, rl.trainer.epsilon_high, rl.trainer.beta) == \
        ("dapo", 0.2, None, 0.001)
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


ENVS = {"local": lambda: _parameters("local"), "cpu_long": lambda: _parameters("cpu_long"),
        "gpu": lambda: _parameters("gpu"), "multistage_gpu preset": _preset_parameters,
        "hiprag_vs_search_r1": lambda: _parameters("hiprag_vs_search_r1"),
        "cpu_distributed": lambda: _parameters("cpu_distributed")}


@pytest.mark.parametrize("env", sorted(ENVS))
def test_every_evaluated_arm_runs_as_its_method_trains(env):
    """Under every env and preset: a compare arm that names a method runs that method's agent (protocol, budgets)
    and retriever, and every stage that trains the method retrieves with the same retriever; the trained
    policies' rollouts use the method's agent; evaluation samples as the rollout does."""
    from prorag.pipelines.compare.nodes import _method, _retriever_spec

    parameters = _parameters_checked(env)
    parsed = validate_parameters(parameters, all_parameter_schemas())
    compare, methods = parsed["compare"], parameters["methods"]
    named = [arm for arm in compare.arms if arm.method_name is not None]
    if env != "cpu_distributed":  # the 2-process plumbing env compares its SFT arm only
        assert {arm.method_name for arm in named} == set(methods)  # every method is evaluated by compare
    for arm in named:
        method = getattr(parsed["methods"], arm.method_name)
        spec = _method(arm, methods)
        expected = method.agent.model_dump(exclude={"name"}) | ({"few_shot": arm.few_shot} if arm.few_shot is not None
                                                                else {})
        assert {key: getattr(spec, key) for key in expected} == expected, (env, arm.name)
        assert _retriever_spec(arm, compare, methods) == method.retriever, (env, arm.name)
        for stage in ("sft_synthesis", "rl", "reasonrag_data"):
            block = getattr(method.stages, stage)
            if block is not None:
                assert block.retriever == method.retriever, (env, arm.method_name, stage)
        if method.stages.tearag is not None:
            tearag = method.stages.tearag
            assert (tearag.retriever.kind, tearag.retriever.top_k) == (method.retriever.kind, method.retriever.top_k)
            assert tearag.agent.model_dump() == method.agent.model_dump()
    baselines = [arm for arm in compare.arms if arm.method_name is None]
    assert all(_retriever_spec(arm, compare, methods) == parsed["retriever"] for arm in baselines)
    assert parsed["rollout"].retriever == parsed["retriever"]
    rollout = parsed["rollout"]
    assert (compare.temperature, compare.top_p, compare.seed) == (rollout.temperature, rollout.top_p, rollout.seed)


def _parameters_checked(env: str) -> dict:
    return ENVS[env]()


def test_a_method_entry_overrides_only_what_it_names():
    parameters = _parameters("gpu")
    methods = parameters["methods"]
    # Search-R1 is HiPRAG's run with λp = 0: it keeps the shared judges, budgets and retriever
    assert methods["search_r1"]["reward"]["over_search_judge"] == parameters["reward"]["over_search_judge"]
    assert "lambda_p" not in methods["search_r1"]["reward"]
    assert methods["search_r1"]["agent"] == methods["hiprag"]["agent"] == parameters["agent"]
    assert methods["search_r1"]["stages"]["rl"] == parameters["rl"]
    assert methods["tearag"]["retriever"]["kind"] == "kag" and parameters["tearag"]["agent"] == \
        methods["tearag"]["agent"]  # the standalone tearag block is the method's


def test_method_errors_are_found_when_the_context_is_created(tmp_path):
    from prorag.pipelines.parameter_schemas import check_method_references

    parameters = _parameters("local")
    catalog = OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS)["catalog"]
    bad_arm = {**parameters["compare"], "arms": [*parameters["compare"]["arms"],
                                                 {"name": "x", "method": "hiprgg", "adapter": "rl_adapter"}]}
    with pytest.raises(ParameterError, match=r"method 'hiprgg' is not a methods entry; did you mean 'hiprag'"):
        check_method_references({**parameters, "compare": bad_arm}, catalog)
    unknown_adapter = {**parameters["compare"], "arms": [*parameters["compare"]["arms"],
                                                         {"name": "x", "method": "hiprag", "adapter": "kg_report"}]}
    with pytest.raises(ParameterError, match=r"adapter 'kg_report' is not an adapter of the methods map, which "
                                             r"compare takes \(dpo_adapter, multistage_adapter, rl_adapter, "
                                             r"search_r1_adapter, sft_adapter, tearag_adapter\)"):
        check_method_references({**parameters, "compare": unknown_adapter}, catalog)
    renamed = {**parameters, "methods": {**parameters["methods"],
                                         "hiprag": {**parameters["methods"]["hiprag"], "recipe": "rl_from_sft"}}}
    with pytest.raises(ParameterError, match=r"methods\.hiprag: recipe/adapter rl_from_sft/rl_adapter differ"):
        check_method_references(renamed, catalog, parameters["methods"])
    with pytest.raises(ParameterError, match=r"methods\.hiprag\.adapter: 'nowhere' is not a catalog dataset"):
        check_method_references({**parameters, "methods": {"hiprag": {**parameters["methods"]["hiprag"],
                                                                      "adapter": "nowhere"}}}, catalog)
    with pytest.raises(ParameterError, match=r"`agent: agent` is now `method: <name>`"):
        validate_parameters({**parameters, "compare": {**parameters["compare"], "arms": [
            {"name": "a", "agent": "agent", "adapter": "rl_adapter"}, *parameters["compare"]["arms"]]}},
            all_parameter_schemas())
    with pytest.raises(ParameterError, match=r"reward 'multistage' scores the multistage protocol"):
        loader = OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS,
                                   runtime_params={"methods": {"hiprag": {"reward": {"kind": "multistage"}}}})
        validate_parameters(loader["parameters"], all_parameter_schemas())
    with pytest.raises(ParameterError, match=r"methods\.hiprag: .*not stages of recipe 'sft_rl'"):
        OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS,
                          runtime_params={"methods": {"hiprag": {"stages": {"dpo": {}}}}})["parameters"]


@pytest.mark.parametrize("env", ["local", "gpu"])
def test_the_parameters_kedro_types_for_the_run_validate_again_before_it(env):
    """Kedro instantiates typed node parameters inside the nested method blocks (``methods.hiprag.reward`` becomes
    a ``HiPRAGSettings``); the validation before the run must read them back (a first ``make train`` failed on it)."""
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from prorag.hooks.validation import ParameterValidationHook

    root = CONF.parent
    bootstrap_project(root)
    with KedroSession.create(project_path=root, env=env) as session:
        catalog = session.load_context().catalog
        ParameterValidationHook().before_pipeline_run({}, register_pipelines()["train"], catalog)


def _endpoints(tree: object, path: str = "") -> list[tuple[str, str, str | None]]:
    """(path, base_url, api_key_env) of every block with a base_url; an unset api_key_env is its spec's default
    (None for rl.policy_server, OPENAI_API_KEY for every other spec); policy.trained_server takes the policy's."""
    found = []
    if isinstance(tree, dict):
        if isinstance(tree.get("base_url"), str):
            default = None if path.endswith("policy_server") else "OPENAI_API_KEY"
            found.append((path, tree["base_url"], tree.get("api_key_env", default)))
            if isinstance(tree.get("trained_server"), dict):
                found.append((f"{path}.trained_server", tree["trained_server"]["base_url"],
                              tree.get("api_key_env", default)))
                tree = {key: value for key, value in tree.items() if key != "trained_server"}
        for key, value in tree.items():
            found += _endpoints(value, f"{path}.{key}" if path else str(key))
    return found


@pytest.mark.parametrize("env", sorted(ENVS))
def test_every_endpoint_of_every_env_pairs_its_key(env):
    """A block that names a server gets a key variable the pairing rule accepts for it (OPENAI_API_KEY only for
    api.openai.com): under --env gpu the KG extractor inherited OPENAI_API_KEY for its loopback vLLM and was refused
    before its first request."""
    from prorag.llm.openai_backend import MissingApiKeyError, api_key_from_env

    endpoints = _endpoints(ENVS[env]())
    assert endpoints or env in ("local", "cpu_long", "cpu_distributed")
    for path, url, variable in endpoints:
        with contextlib.suppress(MissingApiKeyError):  # a named variable for its own server: set at run time
            api_key_from_env(variable, endpoint=path, base_url=url)


def _at(tree: object, dotted: str) -> object:
    """The value at a dotted path, or None where the path does not exist."""
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _stage_blocks(parameters: dict) -> dict[str, dict]:
    """The top-level parameters and every method's stage blocks, by the prefix of their paths."""
    return {"": parameters} | {f"methods.{name}.stages.": method.get("stages") or {}
                               for name, method in parameters["methods"].items()}


@pytest.mark.parametrize("env", sorted(ENVS))
def test_every_model_block_gets_the_one_compute_setting(env):
    """``compute.dtype`` reaches the policy, the KG extractor and every trainer, ``compute.use_cpu`` every trainer,
    in every env and every method's stages: written once per env, fanned out by the config loader (before, 7 copies
    of dtype and 5 of use_cpu per env were kept equal by this test)."""
    from prorag.methods import compute_blocks

    parameters = ENVS[env]()
    found = {prefix + path: (key, _at(block, f"{path}.{key}")) for key, paths in compute_blocks(parameters).items()
             for prefix, block in _stage_blocks(parameters).items() for path in paths
             if _at(block, path) is not None}
    wrong = {path: value for path, (key, value) in found.items() if value != parameters["compute"][key]}
    assert len(found) >= 12 and not wrong, (env, parameters["compute"], wrong)


def test_conf_declares_dtype_and_use_cpu_only_in_compute():
    import yaml

    def keys(tree: object, path: str = "") -> list[str]:
        if not isinstance(tree, dict):
            return []
        return [found for key, value in tree.items()
                for found in [f"{path}{key}"] * (key in ("dtype", "use_cpu")) + keys(value, f"{path}{key}.")]

    declared = {f"{file.relative_to(CONF)}:{key}" for file in sorted(CONF.rglob("parameters*.yml"))
                for key in keys(yaml.safe_load(file.read_text(encoding="utf-8")))}
    assert {entry for entry in declared if entry.split(":")[1] not in ("compute.dtype", "compute.use_cpu")} == set()
    shipped = {f"{env}/parameters.yml:compute.{key}" for env in ("base", "gpu") for key in ("dtype", "use_cpu")}
    assert shipped <= declared


def test_compute_is_overridden_once_for_all_and_a_block_keeps_its_own():
    everywhere = OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS,
                                   runtime_params={"compute": {"dtype": "bfloat16"}})["parameters"]
    assert {everywhere["policy"]["dtype"], everywhere["rl"]["trainer"]["dtype"], everywhere["sft"]["dtype"],
            everywhere["methods"]["reasonrag"]["stages"]["dpo"]["trainer"]["dtype"],
            everywhere["tearag"]["ip_dpo"]["trainer"]["dtype"]} == {"bfloat16"}
    one = OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS,
                            runtime_params={"rl": {"trainer": {"dtype": "bfloat16"}}})["parameters"]
    assert one["rl"]["trainer"]["dtype"] == "bfloat16" and one["sft"]["dtype"] == one["policy"]["dtype"] == "float32"


def _reward_reader(pipeline, node_suffix: str) -> str:
    node = next(node for node in pipeline.nodes if node.name.endswith(node_suffix))
    readers = [name for name in node.inputs if name.endswith(".reward") or name == "params:reward"]
    assert len(readers) == 1, (node.name, node.inputs)
    return readers[0]


def test_tearag_trains_and_is_judged_from_one_reward_entry():
    """IP-DPO's node and reward judging in ``train_tearag`` (and the standalone ``tearag`` pipeline) read one
    parameter, the method's ``reward``: before, IP-DPO read six keys of ``tearag.ip_dpo`` (a copy the resolver
    wrote) and built its settings by hand."""
    pipelines = register_pipelines()
    judged = _reward_reader(pipelines["train_tearag"], "reward_judging.judge_trajectories")
    assert judged == "params:methods.tearag.reward"
    assert _reward_reader(pipelines["train_tearag"], "tearag.run_ip_dpo_rounds") == judged
    assert _reward_reader(pipelines["tearag"], "tearag.run_ip_dpo_rounds") == judged


@pytest.mark.parametrize("env", sorted(ENVS))
def test_tearag_trains_and_is_judged_with_one_reward(env):
    """What IP-DPO scores its samples with (the reward its node builds from the parameter it reads) is what reward
    judging and compare build for the method, every setting of it: under --env gpu training used the bge-reranker
    similarity and judging the MiniLM embedder, and later training the default detection judges and judging
    gpu's LLM judges."""
    from prorag.pipelines.tearag.nodes import ip_dpo_reward
    from prorag.rewards.base import RewardSettings
    from prorag.rewards.registry import build_reward

    parameters = ENVS[env]()
    entry = parameters["methods"]["tearag"]["reward"]
    judged = build_reward(entry).settings
    trained = ip_dpo_reward(RewardSettings.model_validate(entry)).settings
    assert trained == judged and trained.kind == "knowledge_matching", env
    if env == "gpu":
        assert trained.similarity == "reranker:BAAI/bge-reranker-v2-m3"
        assert trained.over_search_judge == RewardSettings.model_validate(parameters["reward"]).over_search_judge


def test_ip_dpo_refuses_a_reward_it_cannot_pair_with():
    from prorag.pipelines.tearag.nodes import ip_dpo_reward
    from prorag.rewards.base import RewardSettings

    with pytest.raises(ParameterError, match=r"must be 'knowledge_matching' \(methods.<name>.reward.kind\), got "
                                             r"'hiprag'"):
        ip_dpo_reward(RewardSettings.model_validate({"kind": "hiprag"}))


def test_a_reward_key_in_the_ip_dpo_block_names_where_it_moved():
    with pytest.raises(ParameterError, match=r"tearag\.ip_dpo\.similarity moved: .* set "
                                             r"methods\.<name>\.reward\.similarity"):
        parameters = OmegaConfigLoader(str(CONF), **CONFIG_LOADER_ARGS, runtime_params={
            "tearag": {"ip_dpo": {"similarity": "embedder:hashing:64"}}})["parameters"]
        validate_parameters(parameters, all_parameter_schemas())


@pytest.mark.parametrize("env", sorted(ENVS))
def test_tearag_evaluates_with_the_rollout_s_sampling(env):
    """TeaRAG's own evaluation samples as the rollout and compare do (under --env gpu it was greedy while they
    sampled at 0.7 / top-p 0.8)."""
    from prorag.reporting.compare_params import CompareParams
    from prorag.specs import SamplingSpec
    from prorag.training.tearag_params import TeaRAGParams

    parameters = ENVS[env]()
    rollout = SamplingSpec.model_validate({key: parameters["rollout"][key] for key in ("temperature", "top_p", "seed")})
    compare = CompareParams.model_validate(parameters["compare"])
    tearag = TeaRAGParams.model_validate(parameters["tearag"]).evaluation_sampling
    assert tearag == rollout == SamplingSpec(temperature=compare.temperature, top_p=compare.top_p, seed=compare.seed)


@pytest.mark.parametrize(("dtype", "use_cpu", "requested", "full_parameters", "expected"), [
    ("float32", True, "no", False, False), ("float32", True, "bf16", False, True),
    ("bfloat16", True, "no", False, False), ("bfloat16", True, "no", True, True),
    ("bfloat16", False, "no", False, True), ("float32", False, "no", True, False),
])
def test_one_bf16_rule(dtype, use_cpu, requested, full_parameters, expected):
    from prorag.training.devices import bf16_compute

    assert bf16_compute(dtype, use_cpu, requested=requested, full_parameters=full_parameters) is expected


def test_no_trainer_decides_bf16_by_itself():
    """SFT, DPO, GRPO and the launcher's mixed precision call :func:`bf16_compute`; before, 4 places held 3 rules
    (the launcher's disagreed with GRPO's for full-parameter bf16 training on the CPU)."""
    training = Path(__file__).resolve().parents[1] / "src" / "prorag" / "training"
    deciding = [path.name for path in sorted(training.glob("*.py"))
                if '== "bfloat16"' in path.read_text(encoding="utf-8") and path.name != "devices.py"]
    callers = [path.name for path in sorted(training.glob("*.py")) if "bf16_compute(" in path.read_text("utf-8")]
    assert not deciding and {"sft.py", "dpo.py", "trl_grpo.py", "launch.py"} <= set(callers)
