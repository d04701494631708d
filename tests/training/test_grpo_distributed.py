"""GRPO data-parallel under ``accelerate launch``: 2 CPU processes with the gloo backend run the same training
(``prorag.training.toy_grpo_run``, the tiny random Llama, 2 steps) and share the generation batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "src" / "prorag" / "training" / "toy_grpo_run.py"  # the worker the GRPO benchmark launches too
# accelerate 1.15: --multi_gpu is its local multi-process (torchrun) launcher and needs no GPU; the training's
# use_cpu=True makes accelerate pick MULTI_CPU + gloo. `--cpu --num_processes 2` would start one process (MPI).
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]


@pytest.mark.integration
@pytest.mark.slow
def test_accelerate_launch_trains_grpo_on_two_gloo_processes(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    completed = subprocess.run([*LAUNCH, str(SCRIPT), "--out", str(out), "--steps", "2", "--batch-size", "2",
                                "--generations", "2"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-6000:]

    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert result["world_size"] == 2
    assert result["backend"] == "gloo"
    assert result["distributed_type"] == "MULTI_CPU"
    assert result["global_step"] == 2
    assert len(result["step_seconds"]) == 2
    assert result["completions_per_step"] == 4  # 2 per process

    # each process rolled out its own share: 2 steps x 2 completions, whole groups of 2, different questions
    first, second = result["prompts_per_rank"]
    assert len(first) == len(second) == 4
    for prompts in (first, second):
        assert prompts[0::2] == prompts[1::2]
    assert not set(first[:2]) & set(second[:2])

    adapter = Path(result["adapter"])
    assert adapter == out / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").stat().st_size > 0
    assert json.loads((out / "COMPLETED").read_text())["global_step"] == 2

    steps = result["log_history"]
    assert [entry["step"] for entry in steps] == [1, 2]
    for entry in steps:
        assert {"agent/format_rate", "agent/cem", "agent/generated_tokens"} <= set(entry)
        assert {"rewards/outcome/mean", "rewards/format/mean", "rewards/process/mean", "reward"} <= set(entry)
        # the agent statistics are summed over both processes before the ratio: token means stay per rollout
        assert 0 < entry["agent/generated_tokens"] <= 16
