"""The trainers' settings as typed config objects: declared once here, taken whole by the trainers
(:func:`~prorag.training.sft.train_sft_lora`, the GRPO backends of :mod:`prorag.training.backends`) and used as the
parameter schemas of the ``sft`` block, of ``rl.trainer`` (prorag's GRPO settings, which every backend honours) and
of ``rl.backend`` (which backend, and what passes through to it) — a new knob is one field, not four edits."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from prorag.config import StrictModel
from prorag.specs import Dtype, MixedPrecision, PositiveInt, Seed

TRLConfigName = Literal["SFTConfig", "GRPOConfig", "DPOConfig"]

FIXED_BY_PRORAG = "fixed by prorag"


@cache
def trl_config_fields(config: TRLConfigName) -> frozenset[str]:
    """The init fields of the pinned TRL's ``config`` dataclass (``trl.SFTConfig``, ...)."""
    import trl

    return frozenset(field.name for field in dataclasses.fields(getattr(trl, config)) if field.init)


def check_trainer_args(args: Mapping[str, Any], config: TRLConfigName, owned: Mapping[str, str],
                       where: str) -> dict[str, Any]:
    """``args`` when every key is a field of the pinned TRL ``config`` that prorag does not set itself.

    A key that is no field fails with the closest one (``did you mean``); a field prorag sets (``owned``: field ->
    the parameter that sets it, or :data:`FIXED_BY_PRORAG`) fails naming that parameter. Nothing is imported for
    an empty mapping."""
    if not args:
        return {}
    fields = trl_config_fields(config)
    for key in args:
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown TRL {config} field {key!r} in {where}{hint}")
        if key in owned:
            setter = owned[key]
            raise ValueError(f"{config}.{key} is {setter}" if setter == FIXED_BY_PRORAG else
                             f"{config}.{key} is set by {setter}, not by {where}")
    return dict(args)


class TrainerArgs(StrictModel):
    """A ``trainer_args`` mapping: any other field of the pinned TRL config, passed through unchanged."""

    trl_config: ClassVar[TRLConfigName]
    trl_owned: ClassVar[Mapping[str, str]]
    trl_where: ClassVar[str]

    trainer_args: dict[str, Any] = Field(default_factory=dict)
    """TRL config fields prorag does not set itself (``lr_scheduler_type``, ``warmup_ratio``, ``report_to``, ...)."""

    @model_validator(mode="after")
    def _check_trainer_args(self) -> TrainerArgs:
        check_trainer_args(self.trainer_args, self.trl_config, self.trl_owned, self.trl_where)
        return self


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


class SFTSettings(TrainerArgs, CheckpointSettings, LoraSettings):
    """LoRA SFT with TRL's ``SFTTrainer`` (TRL names; any other ``SFTConfig`` field in ``trainer_args``)."""

    trl_config: ClassVar[TRLConfigName] = "SFTConfig"
    trl_where: ClassVar[str] = "sft.trainer_args"

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
    mixed_precision: MixedPrecision = "no"
    """``bf16``: compute under bf16 autocast over ``dtype``'s weights (TRL's ``bf16=True``; with ``dtype: float32``
    the weights stay fp32). On a CPU with AVX512-BF16 or AMX an SFT step takes about half the time of fp32 (1.4k
    tokens of SmolLM2 with LoRA: 3.5 s vs 7.0 s forward + backward here); on one without, it is slower.
    ``dtype: bfloat16`` on a GPU implies it."""
    gradient_checkpointing: bool = False
    activation_budget_mb: float | None = Field(default=None, ge=0)
    """With ``gradient_checkpointing``: a step's first decoder layers run without checkpointing while their stored
    activations fit this many MB (measured on the model; :mod:`prorag.training.activation_budget`), the others are
    checkpointed. None or 0: every layer is checkpointed."""
    use_cpu: bool = True
    """False on GPUs (conf/gpu)."""


class GRPOSettings(StrictModel):
    """A GRPO / DAPO / Dr. GRPO run, whichever backend trains it (``rl.trainer``; names follow TRL's
    ``GRPOConfig``); ``per_device_train_batch_size`` counts completions (prompts × ``num_generations``). What only
    one backend knows goes to ``rl.backend.args`` (:class:`TrainerBackendSettings`)."""

    @model_validator(mode="before")
    @classmethod
    def _moved_trainer_args(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "trainer_args" in data:
            if not data["trainer_args"]:  # an empty one (a launch bundle written before the backend seam) says nothing
                return {key: value for key, value in data.items() if key != "trainer_args"}
            raise ValueError("rl.trainer.trainer_args moved to rl.backend.args (passed through to the trainer "
                             "backend: for trl, other GRPOConfig fields)")
        return data

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


SFT_TRL_NAMES = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                 "gradient_accumulation_steps", "seed", "logging_steps", "max_length", "use_cpu")
"""The ``SFTConfig`` fields :class:`SFTSettings` sets under their own names."""
SFTSettings.trl_owned = {
    **{name: f"sft.{name}" for name in SFT_TRL_NAMES},
    "activation_checkpointing": "sft.gradient_checkpointing", "bf16": "sft.mixed_precision", "fp16": "sft.dtype",
    "data_seed": "sft.seed", "save_steps": "sft.save_steps", "save_total_limit": "sft.save_total_limit",
    **dict.fromkeys(("output_dir", "save_strategy", "completion_only_loss", "assistant_only_loss"), FIXED_BY_PRORAG),
}


class TrainerBackendSettings(StrictModel):
    """``rl.backend``: the GRPO trainer backend (a name of :data:`prorag.training.backends.TRAINER_BACKENDS`, or
    ``package.module:OBJECT``) and what passes through to it unchanged, checked by the backend."""

    name: str = "trl"
    args: dict[str, Any] = Field(default_factory=dict)
    """The backend's own settings (trl: ``GRPOConfig`` fields prorag does not set, e.g. ``lr_scheduler_type``)."""

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        from prorag.training.backends import check_backend_name

        return check_backend_name(name)

    @model_validator(mode="after")
    def _check_args(self) -> TrainerBackendSettings:
        if self.args:  # checked by the backend itself (imports it; nothing is imported for none)
            from prorag.training.backends import trainer_backend

            trainer_backend(self.name).check_args(self.args, "rl.backend.args")
        return self
