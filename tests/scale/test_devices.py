"""Items 4 and 7 of issue 28: one GPU per trainer process, chosen or refused before any model is loaded; and
full-parameter training with fp32 master weights and bf16 compute (pure-bf16 weights barely move at lr 1e-6)."""

from __future__ import annotations

import os

import pytest
import torch

import prorag.llm.registry as registry
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.training.config import GRPOSettings, SFTSettings
from prorag.training.dpo import DPOTrainingConfig, train_dpo_lora
from prorag.training.sft import train_sft_lora
from prorag.training.trl_grpo import AgentRolloutFunction, build_grpo_trainer

from .conftest import gpu_parameters, preflight


class NoScorer:
    components = ("outcome",)


@pytest.fixture
def loads(monkeypatch):
    """Every model load, recorded (none may happen before a refusal)."""
    seen: list[str] = []
    original = registry.load_causal_lm

    def recording(spec, *args, **kwargs):
        seen.append(spec)
        return original(spec, *args, **kwargs)

    monkeypatch.setattr(registry, "load_causal_lm", recording)
    return seen


def _questions():
    from prorag.data.records import Question

    return [Question(id="q1", question="Who?", golden_answers=("A",), dataset="d", split="train")]


@pytest.mark.parametrize("stage", ["sft", "grpo", "dpo"])
def test_a_gpu_trainer_seeing_eight_gpus_is_refused_before_loading_with_the_instruction(stage, eight_gpus, loads,
                                                                                       tmp_path):
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES=2 kedro run --env gpu.*placement\.trainer_gpu") as err:
        if stage == "sft":
            train_sft_lora(BUNDLED_TINY_LLAMA, [{"input_ids": [1, 2], "labels": [1, 2]}], tmp_path,
                           SFTSettings(use_cpu=False))
        elif stage == "grpo":
            function = AgentRolloutFunction(_questions(), None, NoScorer(), None)  # type: ignore[arg-type]
            build_grpo_trainer(BUNDLED_TINY_LLAMA, _questions(), function, tmp_path, GRPOSettings(use_cpu=False))
        else:
            train_dpo_lora(BUNDLED_TINY_LLAMA, [{"prompt": "p", "chosen": "a", "rejected": "b"}], tmp_path,
                           DPOTrainingConfig(use_cpu=False))
    assert "sees 8 GPUs" in str(err.value)
    assert loads == []  # refused before any model was loaded


def test_the_run_picks_the_declared_trainer_gpu_before_the_first_node(eight_gpus, monkeypatch):

    found = preflight(gpu_parameters())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2" == str(found.placement.trainer_gpu)
    assert torch.cuda.device_count() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # a user's setting naming several GPUs is refused
    with pytest.raises(ValueError, match="sees 2 GPUs"):
        preflight(gpu_parameters())


def test_full_parameter_bf16_training_keeps_fp32_master_weights_that_move_at_lr_1e_6(tmp_path, one_torch_thread):
    """The review's measurement on the tiny model: 10 AdamW steps at conf/gpu's lr with gradient noise of 1e-3."""
    rl = gpu_parameters()["rl"]
    assert rl["lora"] is False and rl["trainer"]["dtype"] == "bfloat16"
    settings = GRPOSettings(per_device_train_batch_size=2, num_generations=2, dtype="bfloat16",
                            learning_rate=rl["trainer"]["learning_rate"], use_cpu=True)
    function = AgentRolloutFunction(_questions(), None, NoScorer(), None)  # type: ignore[arg-type]
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, _questions(), function, tmp_path, settings,
                                 full_parameters=True)
    parameters = [parameter for parameter in trainer.model.parameters() if parameter.requires_grad]
    optimizer = trainer.create_optimizer()
    before = [parameter.detach().clone() for parameter in parameters]
    generator = torch.Generator().manual_seed(0)
    for _ in range(10):
        for parameter in parameters:
            parameter.grad = torch.randn(parameter.shape, generator=generator).to(parameter.dtype) * 1e-3
        optimizer.step()
        optimizer.zero_grad()
    changed = sum(int((parameter != old).sum()) for parameter, old in zip(parameters, before, strict=True))
    total = sum(parameter.numel() for parameter in parameters)
    assert changed / total > 0.99, f"{changed / total:.1%} of the weights changed"  # pure bf16: a few percent
    assert {parameter.dtype for parameter in parameters} == {torch.float32}  # fp32 masters
    assert trainer.args.bf16  # bf16 compute under autocast
    state = optimizer.state[parameters[0]]
    assert state["exp_avg"].dtype == torch.float32


@pytest.mark.parametrize(("dtype", "expected"), [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_the_full_parameter_reference_model_is_held_in_the_compute_dtype(tmp_path, one_torch_thread, dtype, expected):
    """Issue 43 N2: TRL builds the reference in the policy's dtype, fp32 since the fp32 masters; under bf16 mixed
    precision the reference only ever runs forward in bf16, so it is held in bf16 (half the bytes: 6 GiB of 3B)."""
    settings = GRPOSettings(per_device_train_batch_size=2, num_generations=2, dtype=dtype, beta=0.001, use_cpu=True)
    function = AgentRolloutFunction(_questions(), None, NoScorer(), None)  # type: ignore[arg-type]
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, _questions(), function, tmp_path, settings,
                                 full_parameters=True)
    assert trainer.ref_model is not None
    assert {parameter.dtype for parameter in trainer.model.parameters()} == {torch.float32}  # fp32 masters kept
    assert {parameter.dtype for parameter in trainer.ref_model.parameters()} == {expected}


def test_the_preflight_runs_as_a_hook_before_mlflow_opens_a_run():
    from prorag.hooks.mlflow_tracking import MlflowTrackingHook
    from prorag.hooks.preflight import GpuPreflightHook
    from prorag.hooks.validation import ParameterValidationHook
    from prorag.settings import HOOKS

    kinds = [type(hook) for hook in HOOKS]
    # pluggy calls tryfirst hooks first, the later-registered first: validation, then the preflight, then MLflow
    assert kinds.index(GpuPreflightHook) < kinds.index(ParameterValidationHook) < kinds.index(MlflowTrackingHook)
    assert GpuPreflightHook.before_pipeline_run.kedro_impl["tryfirst"]  # type: ignore[attr-defined]
