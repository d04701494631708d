"""Item 5 of issue 43: the GPU check (``benchmarks/gpu_check.py``) — its CPU dry run, its shapes held to conf/gpu
and the memory model's table, its tiled LM head, and the torch-only imports it needs on the lent machine. The GPU run
itself is not a test: its report goes into docs/scaling.md."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prorag.scale.memory import MODELS
from prorag.scale.preflight import PROMPT_TOKENS

from .conftest import gpu_parameters, trainer_loads

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _parameters(config: dict) -> float:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    built = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = (AutoModel if config["model_type"] == "bert" else AutoModelForCausalLM).from_config(built)
    return float(sum(parameter.numel() for parameter in model.parameters()))


def test_the_checked_shapes_are_conf_gpu_s_and_the_memory_model_s():
    """The GPU sizes are conf/gpu's GRPO micro-batch (completions × rollout tokens) and SFT micro-batch, and the
    inline configs have the parameter counts the memory model charges (E5-base-v2: 109.5 M)."""
    check = _check()
    parameters = gpu_parameters()
    rl = next(load for load in trainer_loads(parameters) if load.stage == "rl")
    assert rl.full_parameters and rl.reference_copy and rl.gradient_checkpointing
    assert check.GPU.grpo == (rl.micro_batch, rl.sequence, PROMPT_TOKENS) == (4, 7040, 1024)
    assert check.GPU.sft[0] == parameters["sft"]["per_device_train_batch_size"]
    assert check.GPU.tile == check.FUSED_HEAD_TILE
    for config, model in ((check.QWEN25_3B, "Qwen/Qwen2.5-3B-Instruct"), (check.QWEN25_7B, "Qwen/Qwen2.5-7B-Instruct")):
        assert _parameters(config) == pytest.approx(MODELS[model].parameters, rel=0.005)
        assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (
            MODELS[model].hidden, MODELS[model].layers, MODELS[model].vocabulary)
    assert _parameters(check.E5_BASE_V2) == pytest.approx(109.48e6, rel=0.005)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_tiled_lm_head_gives_log_softmax_s_values_and_gradients(autocast):
    """Tiles that do not divide the tokens or the vocabulary, targets in every tile; under bf16 autocast within
    bf16's precision."""
    check = _check()
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=generator, requires_grad=True)
    weight = torch.randn(101, 16, generator=generator, requires_grad=True)
    targets = torch.randint(101, (37,), generator=generator)
    weights = torch.randn(37, generator=generator)
    expected = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None])[:, 0]
    expected_grads = torch.autograd.grad((expected * weights).sum(), (hidden, weight))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        found = check.ChunkedLogprob.apply(hidden, weight, targets, (8, 30))
    found_grads = torch.autograd.grad((found * weights).sum(), (hidden, weight))
    tolerance = {"rtol": 0.05, "atol": 0.3} if autocast else {"rtol": 1e-5, "atol": 1e-5}
    assert found.dtype == torch.float32
    torch.testing.assert_close(found, expected, **tolerance)
    for got, want in zip(found_grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, **tolerance)


def test_the_memory_model_imports_where_only_torch_is():
    """The lent GPU image has torch, transformers, peft and accelerate but no pydantic: the check's import of the
    memory model must not pull the placement schema in."""
    code = ("import sys; sys.modules['pydantic'] = None; "
            "from prorag.scale.memory import estimate, TrainerLoad, ModelShape; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.integration
def test_the_dry_run_runs_every_phase_and_reports_each_measure(tmp_path):
    """``--dry-run``: every phase on the CPU with tiny configs, through the GPU run's code (about 20 s here)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    steps = {step["step"]: step for step in report["steps"]}
    assert list(steps) == list(_check().PHASES)
    assert report["environment"]["device"] == "cpu" and report["environment"]["dry_run"] is True
    assert report["environment"]["total_seconds"] > 0
    measured = ("reference_forward", "old_logps_forward", "policy_forward_backward", "optimizer_step")
    for name, dtype in (("grpo_3b_reference_bf16", "torch.bfloat16"), ("grpo_3b_reference_fp32", "torch.float32")):
        step = steps[name]
        assert step["status"] == "ok" and step["reference_dtype"] == dtype, step
        assert {f"{tag}{part}" for tag in ("warmup_", "step_") for part in measured} <= set(step["parts"])
        assert step["estimate_gib"] > 0 and set(step["estimate_parts_gib"]) >= {"reference", "autocast_weights"}
        assert step["completion_tokens"] == step["sequence"] - 32 and step["loss"] == step["loss"]  # not NaN
    fp32, bf16 = steps["grpo_3b_reference_fp32"], steps["grpo_3b_reference_bf16"]
    assert fp32["estimate_gib"] == pytest.approx(bf16["estimate_gib"] + bf16["parameters"] * 2 / 2**30, abs=1e-4)
    zero3 = steps["zero3_save_resume"]
    assert zero3["status"] == "ok" or (zero3["status"] == "skipped" and "deepspeed" in zero3["why"]), zero3
    embedding = steps["e5_embedding"]
    assert embedding["status"] == "ok"
    assert embedding["float16_passages_per_s"] > 0 and embedding["float32_passages_per_s"] > 0
    sft = steps["lora_7b_sft"]
    assert sft["status"] == "ok" and sft["lora_parameters"] > 0 and sft["estimate_gib"] > 0
    assert {"step_forward_backward", "step_optimizer_step"} <= set(sft["parts"])
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.startswith("# GPU check") and all(f"| {name} |" in markdown for name in steps)
