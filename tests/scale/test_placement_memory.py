"""Items 5, 12 and 16 of issue 28: every shipped GPU config fits its declared GPUs (the memory arithmetic), its
GPUs and ports do not collide, and a config that cannot fit is refused before any work, naming the knob."""

from __future__ import annotations

import copy

import pytest

from prorag.retrieval.server import build_parser
from prorag.scale.memory import MemoryPlanError, check_servers, check_trainers
from prorag.scale.placement import PlacementError, PlacementSpec, check_placement

from .conftest import ROOT, gpu_parameters, preflight, preset_params, trainer_loads

SHIPPED = {"conf/gpu": {}, "conf/gpu + experiments/multistage_gpu.yml": preset_params()}


@pytest.mark.parametrize("name", list(SHIPPED))
def test_every_shipped_gpu_config_fits_and_places_every_process(name, eight_gpus):
    parameters = gpu_parameters(SHIPPED[name])
    found = preflight(parameters)
    placement = found.placement
    assert placement is not None and placement.trainer_gpu is not None
    stages = {estimate.stage: estimate.total for estimate in found.trainers}
    assert "rl" in stages and all(total < placement.gpu_memory_gib for total in stages.values()), stages
    trained = {"conf/gpu": parameters["rl"], "conf/gpu + experiments/multistage_gpu.yml":
               parameters["methods"]["multistage"]["stages"]["rl"]}[name]  # the preset trains train_multistage
    rl = trained["trainer"]
    completions = rl["per_device_train_batch_size"] * rl["gradient_accumulation_steps"]  # one process
    assert completions % rl["num_generations"] == 0
    expected = {"conf/gpu": 512 * 5, "conf/gpu + experiments/multistage_gpu.yml": 32 * 32}[name]
    assert completions == expected  # the paper's batch per optimizer step


PAPER_POLICIES = [("reasonrag_gpu.yml", "train_reasonrag", "Qwen/Qwen2.5-7B-Instruct"),
                  ("tearag_gpu.yml", "train_tearag", "meta-llama/Meta-Llama-3-8B-Instruct"),
                  ("tearag_gpu.yml", "train_tearag", "Qwen/Qwen2.5-14B-Instruct")]  # TeaRAG's second policy


@pytest.mark.parametrize(("preset", "pipeline", "model"), PAPER_POLICIES)
def test_the_paper_policy_presets_fit_and_serve_that_policy(preset, pipeline, model, eight_gpus):
    """ReasonRAG trains Qwen2.5-7B-Instruct, TeaRAG Llama3-8B- and Qwen2.5-14B-Instruct (conf/gpu's shared policy
    is HiPRAG's 3B): each preset's run passes the memory check and its servers serve the paper's policy."""
    import yaml

    from prorag.pipeline_registry import register_pipelines

    run = yaml.safe_load((ROOT / "experiments" / preset).read_text())["run"]
    assert run["pipelines"] == pipeline and pipeline in register_pipelines()
    params = copy.deepcopy(run["params"])
    if model != params["policy"]["model"]:
        params["policy"]["model"] = model
    parameters = gpu_parameters(params)
    found = preflight(parameters)
    assert parameters["policy"]["model"] == model
    assert found.placement is not None
    assert found.placement.servers["policy"].model == found.placement.servers["rl_policy"].model == model
    trained = {estimate.stage for estimate in found.trainers}
    assert {"dpo"} <= trained if pipeline == "train_reasonrag" else {"tearag_sft", "tearag_ip_dpo"} <= trained
    assert all(estimate.total < found.placement.gpu_memory_gib for estimate in found.trainers)
    method = pipeline.removeprefix("train_")
    assert parameters["methods"][method] == gpu_parameters()["methods"][method]  # its own settings: conf/gpu's


def test_mains_conf_gpu_is_refused_naming_the_knob():
    """conf/gpu as it was (7B, full-parameter, KL > 0, 40 completions per micro-batch) cannot fit one H100."""
    parameters = copy.deepcopy(gpu_parameters())
    parameters["policy"]["model"] = "Qwen/Qwen2.5-7B-Instruct"
    parameters["rl"]["trainer"].update(per_device_train_batch_size=40, gradient_accumulation_steps=1)
    placement = PlacementSpec.model_validate(parameters["placement"])
    with pytest.raises(MemoryPlanError, match=r"rl needs about \d+ GiB.*\(rl\.trainer\. lora: true\)"):
        check_trainers(trainer_loads(parameters), placement)
    parameters["policy"]["model"] = "Qwen/Qwen2.5-3B-Instruct"  # the states fit; the micro-batch does not
    with pytest.raises(MemoryPlanError, match=r"lower rl\.trainer\.per_device_train_batch_size to at most \d"):
        check_trainers(trainer_loads(parameters), placement)


def test_the_multistage_judge_needs_gpus_of_its_own():
    """The 235B judge in bf16 on the 4 GPUs the node has left does not fit; its FP8 checkpoint does."""
    parameters = gpu_parameters(preset_params())
    placement = PlacementSpec.model_validate(parameters["placement"])
    assert placement.servers["answer_judge"].gpus == [4, 5, 6, 7]
    check_servers(placement)
    bf16 = placement.model_copy(deep=True)
    bf16.servers["answer_judge"] = bf16.servers["answer_judge"].model_copy(
        update={"model": "Qwen/Qwen3-235B-A22B-Instruct-2507", "bytes_per_parameter": 2.0})
    with pytest.raises(MemoryPlanError, match=r"servers\.answer_judge.*more GPUs"):
        check_servers(bf16)


def test_the_retrieval_server_does_not_default_to_a_policy_servers_port():
    placement = PlacementSpec.model_validate(gpu_parameters()["placement"])
    model_ports = {server.port for name, server in placement.active().items() if name != "retrieval"}
    default = build_parser().parse_args(["--index-dir", "x"]).port
    assert default not in model_ports and placement.servers["retrieval"].port == default


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: p["placement"]["servers"]["rl_policy"].update(gpus=[2]), "GPU 2 is used by both trainer_gpu"),
    (lambda p: p["placement"]["servers"]["retrieval"].update(port=8000), "port 8000 is used by both"),
    (lambda p: p["placement"]["servers"]["policy"].update(gpus=[8]), "GPU 8 does not exist"),
    (lambda p: p["rl"]["policy_server"].update(base_url="http://127.0.0.1:8009"), "no server of placement"),
    (lambda p: p["kg_extraction"]["extractor"].update(base_url="http://127.0.0.1:8000/v1"),
     "asks port 8000 for 'Qwen/Qwen2.5-14B-Instruct'"),  # main's conf/gpu: the 14B extractor on the policy's port
])
def test_a_colliding_placement_is_refused(change, message):
    parameters = copy.deepcopy(gpu_parameters())
    change(parameters)
    with pytest.raises(PlacementError, match=message):
        check_placement(parameters)


def test_a_methods_stage_is_checked_with_its_own_settings():
    """The multi-stage preset's GRPO lives in ``methods.multistage.stages.rl``: the memory check sees it (with the
    method's agent budgets) beside HiPRAG's shared ``rl``, and a refusal names its knob."""

    parameters = gpu_parameters(preset_params())
    knobs = {load.knob for load in trainer_loads(parameters)}
    assert {"rl.trainer.", "methods.multistage.stages.rl.trainer."} <= knobs
    assert "methods.hiprag.stages.rl.trainer." not in knobs  # identical to the shared block: checked once


def test_full_parameter_grpo_charges_the_reference_autocast_s_weight_copies_and_the_fp32_residual():
    """Issue 43 N2, conf/gpu's GRPO by hand (Qwen2.5-3B: 3.09 B parameters, hidden 2048, 36 layers; 4 completions of
    7,040 tokens, checkpointing): 16 B fp32 states, a bf16 reference, autocast's bf16 copy of every weight, fp32
    layer inputs, one layer recomputed, the fused LM head's tile and its fp32 input."""
    from prorag.scale.memory import GIB, MODELS, Sharding, TrainerLoad, estimate

    parameters, tokens = 3.09e9, 4 * 7040
    load = TrainerLoad("rl", "rl.trainer.", "Qwen/Qwen2.5-3B-Instruct", True, True, 4, 7040, True, logits="fused")
    found = estimate(load, MODELS[load.model])
    expected = {"weights_gradients_optimizer": parameters * 16, "reference": parameters * 2,
                "autocast_weights": parameters * 2, "layer_inputs": tokens * 2048 * 4 * 36,
                "recomputed_layers": tokens * 2048 * 34, "lm_head": 4096 * 32768 * 4 + tokens * 2048 * 4}
    assert found.parts == pytest.approx({name: value / GIB for name, value in expected.items()})
    assert found.states == pytest.approx(57.56, abs=0.01) and found.total == pytest.approx(67.83, abs=0.01)
    placement = PlacementSpec(gpu_memory_gib=79)  # an H100: budget 72.7 GiB
    assert check_trainers([load], placement)[0].total < 72.7  # admitted, 4.9 GiB to spare
    doubled = TrainerLoad("rl", "rl.trainer.", load.model, True, True, 8, 7040, True, logits="fused")
    with pytest.raises(MemoryPlanError, match=r"rl needs about 78 GiB on one GPU \(58 GiB .*autocast.*"
                                              r"lower rl\.trainer\.per_device_train_batch_size to at most 6"):
        check_trainers([doubled], placement)
    # fp32 compute: no autocast copy, but the reference is fp32 too
    fp32 = estimate(TrainerLoad("rl", "", load.model, True, True, 4, 7040, True, logits="fused",
                                mixed_precision=False), MODELS[load.model])
    assert fp32.parts["autocast_weights"] == 0 and fp32.parts["reference"] == pytest.approx(parameters * 4 / GIB)
    # ZeRO-3 computes with bf16 weights of its own: no autocast copy, a bf16 residual stream
    sharded = estimate(load, MODELS[load.model], Sharding(4, 3))
    assert sharded.parts["autocast_weights"] == 0
    assert sharded.parts["layer_inputs"] == pytest.approx(found.parts["layer_inputs"] / 2)
