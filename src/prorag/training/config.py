"""The trainers' settings as typed config objects: declared once here, taken whole by the trainers
(:func:`~prorag.training.sft.train_sft_lora`, :func:`~prorag.training.trl_grpo.build_grpo_trainer`) and used as the
parameter schemas of the ``sft`` block and of ``rl.trainer`` — a new knob is one field, not four edits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prorag.config import StrictModel
from prorag.specs import Dtype, PositiveInt, Seed


class LoraSettings(StrictModel):
    """The LoRA adapter (PEFT ``LoraConfig``)."""

    lora_r: PositiveInt = 16
    lora_alpha: PositiveInt = 32
    lora_dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: list[str] = Field(default=["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)


class CheckpointSettings(StrictModel):
    """Checkpoints of the SFT and DPO trainers (:mod:`prorag.training.checkpoints`)."""

    save_steps: PositiveInt | None = None
    """Checkpoint every N optimizer steps (None: none; under the launcher ``launch.checkpoint_steps`` then applies)."""
    save_total_limit: PositiveInt | None = 2
    resume: bool = True
    """Continue an unfinished run in the same output folder from its last checkpoint."""


class SFTSettings(CheckpointSettings, LoraSettings):
    """LoRA SFT with TRL's ``SFTTrainer`` (TRL names)."""

    learning_rate: float = Field(default=2e-4, gt=0)
    num_train_epochs: float = Field(default=1.0, gt=0)
    max_steps: int = Field(default=-1, ge=-1)
    """-1: the whole ``num_train_epochs``."""
    per_device_train_batch_size: PositiveInt = 4
    gradient_accumulation_steps: PositiveInt = 1
    seed: Seed = 0
    logging_steps: PositiveInt = 1
    max_length: PositiveInt | None = None
    """None keeps every sequence whole (TRL's default of 1024 would cut long prompts' completions)."""
    dtype: Dtype = "float32"
    gradient_checkpointing: bool = False
    use_cpu: bool = True
    """False on GPUs (conf/gpu)."""


class GRPOSettings(StrictModel):
    """A GRPO / DAPO / Dr. GRPO run with TRL's ``GRPOTrainer`` (TRL names); ``per_device_train_batch_size``
    counts completions (prompts × ``num_generations``)."""

    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "grpo"
    max_steps: PositiveInt = 4
    learning_rate: float = Field(default=5e-5, gt=0)
    per_device_train_batch_size: PositiveInt = 4
    num_generations: int = Field(default=4, ge=2)
    gradient_accumulation_steps: PositiveInt = 1
    beta: float = Field(default=0.0, ge=0)
    """KL coefficient (0: no reference model, as in DAPO / Dr. GRPO)."""
    epsilon: float = Field(default=0.2, gt=0)
    epsilon_high: float | None = Field(default=None, gt=0)
    """DAPO's clip-higher (0.28); None: symmetric clipping."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    drop_uniform_groups: bool = False
    """DAPO's dynamic sampling: leave groups whose rewards are all equal out of the loss."""
    refill_rounds: int = Field(default=0, ge=0)
    """DAPO's dynamic sampling with refill: up to this many rounds of replacing each uniform-reward group by the
    group of a newly drawn training question before the loss (0: no refill; what stays uniform is dropped when
    ``drop_uniform_groups``)."""
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Rollout sampling (the rollout function's; TRL's own generation is replaced by it)."""
    seed: Seed = 0
    save_steps: PositiveInt = 2
    save_total_limit: PositiveInt | None = 2
    logging_steps: PositiveInt = 1
    resume: bool = True
    """Continue an unfinished run in the same output folder from its last checkpoint."""
    gradient_checkpointing: bool = False
    dtype: Dtype = "float32"
    use_cpu: bool = True
    lora: LoraSettings = LoraSettings(lora_dropout=0.0)
    """A fresh adapter's LoRA (unused when training continues an adapter, e.g. the SFT one)."""
