"""Nodes of the SFT pipeline."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prorag.llm.registry import load_tokenizer
from prorag.pipelines.sft.params import SftParams
from prorag.specs import PolicySpec, TrainedAgentSpec
from prorag.training import build_sft_example, train_sft_lora
from prorag.training.launch import IN_PROCESS, LaunchSettings, launch_sft
from prorag.training.synthesis import SynthesizedTrajectory


def train_sft(trajectory_records: list[dict[str, Any]], params: SftParams, policy: PolicySpec,
              agent: TrainedAgentSpec, launch: LaunchSettings = IN_PROCESS) -> tuple[str, list[dict[str, Any]]]:
    """Train a LoRA adapter of ``policy.model`` on the gold trajectories, with the ``agent`` block's protocol and
    prompt; returns its folder (saved by the catalog as a versioned copy) and the loss curve. In this process, or
    under ``accelerate launch`` with ``launch.mode: accelerate`` (:mod:`prorag.training.launch`)."""
    tokenizer = load_tokenizer(policy.model)
    trajectories = [SynthesizedTrajectory.from_dict(record) for record in trajectory_records]
    examples = [build_sft_example(tokenizer, item.question, item.completion, protocol=agent.protocol,
                                  few_shot=agent.few_shot) for item in trajectories]
    if launch.enabled:
        result = launch_sft(policy.model, examples, params, launch)
        adapter_dir, history = result.adapter, result.log_history
    else:
        adapter_dir, history = train_sft_lora(policy.model, examples, Path(tempfile.mkdtemp(prefix="prorag-sft-")),
                                              params)
    curve = [{"step": int(entry["step"]), **{key: float(value) for key, value in entry.items()
                                              if key in ("loss", "learning_rate", "grad_norm", "train_loss")}}
             for entry in history if "step" in entry]
    return str(adapter_dir), curve
