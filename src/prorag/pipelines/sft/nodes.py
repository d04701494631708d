"""Nodes of the SFT pipeline."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from prorag.config import StrictModel, register_parameters
from prorag.llm.registry import BUNDLED_SMOLLM2, load_tokenizer
from prorag.training import build_sft_example, train_sft_lora
from prorag.training.synthesis import SynthesizedTrajectory


@register_parameters("sft")
class SftParams(StrictModel):
    """LoRA SFT settings (TRL SFTTrainer + PEFT)."""

    model: str = BUNDLED_SMOLLM2
    few_shot: bool = False
    """Train with the prompt the SFT'd policy will be rolled out with (the few-shot examples are then redundant)."""
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    lora_dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: list[str] = Field(default=["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    learning_rate: float = Field(default=2e-4, gt=0)
    num_train_epochs: float = Field(default=1.0, gt=0)
    max_steps: int = -1
    per_device_train_batch_size: int = Field(default=4, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    seed: int = 0
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    use_cpu: bool = True
    """False on GPUs (conf/gpu)."""


def train_sft(trajectory_records: list[dict[str, Any]], params: SftParams) -> tuple[str, list[dict[str, Any]]]:
    """Train a LoRA adapter; returns its folder (saved by the catalog as a versioned copy) and the loss curve."""
    tokenizer = load_tokenizer(params.model)
    trajectories = [SynthesizedTrajectory.from_dict(record) for record in trajectory_records]
    examples = [build_sft_example(tokenizer, item.question, item.completion, few_shot=params.few_shot)
                for item in trajectories]
    output_dir = Path(tempfile.mkdtemp(prefix="prorag-sft-"))
    adapter_dir, history = train_sft_lora(
        params.model, examples, output_dir, lora_r=params.lora_r, lora_alpha=params.lora_alpha,
        lora_dropout=params.lora_dropout, target_modules=tuple(params.target_modules),
        learning_rate=params.learning_rate, num_train_epochs=params.num_train_epochs, max_steps=params.max_steps,
        per_device_train_batch_size=params.per_device_train_batch_size,
        gradient_accumulation_steps=params.gradient_accumulation_steps, seed=params.seed, dtype=params.dtype,
        gradient_checkpointing=params.gradient_checkpointing, use_cpu=params.use_cpu,
        bf16=params.dtype == "bfloat16" and not params.use_cpu)
    curve = [{"step": int(entry["step"]), **{key: float(value) for key, value in entry.items()
                                              if key in ("loss", "learning_rate", "grad_norm", "train_loss")}}
             for entry in history if "step" in entry]
    return str(adapter_dir), curve
