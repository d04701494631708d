"""DPO with a LoRA adapter (TRL ``DPOTrainer`` + PEFT): the one preference trainer of the project.

Used for ReasonRAG's process-supervised preference optimization (§2.3, eq. 3) on step-level pairs from MCTS
(:func:`prorag.training.mcts.preference_pairs`: prompt = the protocol's chat prompt + the prior steps, chosen /
rejected = the next step), and for TeaRAG's IP-DPO (DPO jointly with an SFT loss on the chosen responses).

Eq. 3 as printed, ``-E log σ(β log p_θ(y_w|x, y_<t) / p_θ(y_l|x, y_<t))``, omits the reference policy of DPO [33];
this module trains standard DPO, ``-E log σ(β [log π_θ(y_w)/π_ref(y_w) − log π_θ(y_l)/π_ref(y_l)])`` (TRL's
``loss_type="sigmoid"``), with the reference being the model at the start of training: the base model when a new
LoRA adapter is created (TRL disables the adapter for the reference pass), or a frozen copy of the starting adapter
(TRL's ``"ref"`` adapter) when training continues an existing one (``DPOTrainingConfig.init_adapter``).

SFT term (IP-DPO): ``sft_weight > 0`` sets TRL 1.16's ``loss_type=["sigmoid", "sft"]`` with
``loss_weights=[1.0, sft_weight]``: ``L = L_DPO + sft_weight · L_SFT``, where ``L_SFT`` is the mean negative
log-likelihood per token of the chosen responses in the batch (TRL's ``"sft"`` loss). TRL 1.16 has no
``rpo_alpha`` (removed); this is its replacement.

End of sequence: TRL appends the EOS token to both responses of plain-text data. A ReasonRAG step is not the end
of the sequence (generation stops at its closing tag), so with ``append_eos=False`` (the default) the appended EOS
is removed from the tokenized responses; use ``append_eos=True`` for complete trajectories (IP-DPO).

Engine-inserted text: a pair may name the character ranges of each response the engine wrote
(``chosen_inserted`` / ``rejected_inserted``: TeaRAG's ``<Reference>`` contexts inside whole paths). Their
tokens are left out of both log-likelihoods and of the SFT term, as SFT leaves them out of its labels: TRL 1.16
tokenizes prompt + response itself and sums over its collator's ``completion_mask``, so the ranges become a
per-token mask through the tokenizer's offsets that a collator multiplies into that mask
(:mod:`prorag.training.preference_masks`). TRL has no such option; this is the smallest hook into its collator.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from prorag.llm.generation import render_chat
from prorag.llm.upstream_warnings import upstream_deprecations
from prorag.specs import Dtype, PositiveInt, Seed
from prorag.training.checkpoints import (
    CHECKPOINTS,
    checkpoint_arguments,
    continue_adapter,
    save_adapter,
    train_resumable,
)
from prorag.training.config import FIXED_BY_PRORAG, CheckpointSettings, LoraSettings, TrainerArgs, TRLConfigName

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, TrainerCallback

logger = logging.getLogger(__name__)


class DPOTrainingConfig(TrainerArgs, CheckpointSettings, LoraSettings):
    """Every knob of :func:`train_dpo_lora` (TRL names; also the parameter schema of ``dpo.trainer``; any other
    ``DPOConfig`` field in ``trainer_args``). The anchor code (LLaMA-Factory, full fine-tuning of Qwen2.5-7B) uses
    β = 0.3, lr 1e-6, cosine schedule, warm-up ratio 0.2, batch 1 × 2 accumulation, one epoch: the defaults here."""

    trl_config: ClassVar[TRLConfigName] = "DPOConfig"
    trl_where: ClassVar[str] = "dpo.trainer.trainer_args"
    trl_owned: ClassVar[dict[str, str]] = {
        **{name: f"dpo.trainer.{name}" for name in (
            "beta", "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
            "gradient_accumulation_steps", "lr_scheduler_type", "seed", "logging_steps", "max_length", "use_cpu",
            "precompute_ref_log_probs", "save_steps", "save_total_limit")},
        "warmup_steps": "dpo.trainer.warmup_ratio", "loss_type": "dpo.trainer.sft_weight",
        "loss_weights": "dpo.trainer.sft_weight", "bf16": "dpo.trainer.dtype", "fp16": "dpo.trainer.dtype",
        "data_seed": "dpo.trainer.seed", "activation_checkpointing": "dpo.trainer.gradient_checkpointing",
        **dict.fromkeys(("output_dir", "save_strategy", "remove_unused_columns"), FIXED_BY_PRORAG),
    }

    beta: float = Field(default=0.3, gt=0)
    learning_rate: float = Field(default=1e-6, gt=0)
    num_train_epochs: float = Field(default=1.0, gt=0)
    max_steps: int = Field(default=-1, ge=-1)
    """-1: the whole ``num_train_epochs``."""
    per_device_train_batch_size: PositiveInt = 1
    gradient_accumulation_steps: PositiveInt = 2
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = Field(default=0.2, ge=0, lt=1)
    sft_weight: float = Field(default=0.0, ge=0)
    """Weight of the SFT term (mean NLL per token of the chosen responses); 0 is plain DPO (IP-DPO sets it)."""
    init_adapter: str | None = None
    """Continue this LoRA adapter (the reference is its frozen copy) instead of creating a new one."""
    max_length: PositiveInt | None = None
    """Truncate prompt + response to this many tokens (None: keep all)."""
    append_eos: bool = False
    """Keep TRL's EOS after each response (complete trajectories); False for step-level pairs."""
    seed: Seed = 0
    logging_steps: PositiveInt = 1
    dtype: Dtype = "float32"
    use_cpu: bool = True
    """False on GPUs (conf/gpu)."""
    gradient_checkpointing: bool = False
    precompute_ref_log_probs: bool = False
    """TRL: compute the reference log-probabilities once before training (saves memory at scale)."""

    def loss(self) -> tuple[list[str], list[float]]:
        """TRL's ``loss_type`` and ``loss_weights``."""
        if self.sft_weight > 0:
            return ["sigmoid", "sft"], [1.0, float(self.sft_weight)]
        return ["sigmoid"], [1.0]


def preference_rows(tokenizer: PreTrainedTokenizerBase,
                    pairs: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """``{"prompt", "chosen", "rejected"}`` rows: prompt = chat template of the pair's ``messages`` (ready for the
    assistant) + its ``transcript`` (the prior steps as the engine wrote them); errors name the pair."""
    rows = []
    for position, pair in enumerate(pairs):
        missing = [key for key in ("messages", "transcript", "chosen", "rejected") if key not in pair]
        if missing:
            raise ValueError(f"preference pair {position} lacks {missing}")
        if not str(pair["chosen"]).strip() or not str(pair["rejected"]).strip():
            raise ValueError(f"preference pair {position} has an empty response")
        if str(pair["chosen"]).strip() == str(pair["rejected"]).strip():
            raise ValueError(f"preference pair {position}: chosen and rejected are identical")
        prompt = render_chat(tokenizer, pair["messages"]) + str(pair["transcript"])
        row = {"prompt": prompt, "chosen": str(pair["chosen"]), "rejected": str(pair["rejected"])}
        row[INSERTED] = json.dumps({side: _checked_spans(pair.get(f"{side}_inserted") or [], row[side],
                                                         f"preference pair {position} {side}_inserted")
                                    for side in ("chosen", "rejected")})
        rows.append(row)
    if not rows:
        raise ValueError("no preference pairs to train on")
    return rows


INSERTED = "inserted_spans"
"""The row column holding the engine-inserted character ranges of both responses (JSON: a fixed Arrow type)."""


def _checked_spans(spans: Iterable[Sequence[int]], text: str, where: str) -> list[list[int]]:
    checked = []
    for span in spans:
        if len(span) != 2 or not 0 <= int(span[0]) < int(span[1]) <= len(text):
            raise ValueError(f"{where}: {list(span)} is no character range of the {len(text)}-character response")
        checked.append([int(span[0]), int(span[1])])
    return checked


def _drop_appended_eos(dataset: Any, eos_token_id: int | None) -> Any:
    """Undo TRL's EOS on step-level responses (module docstring); checks it is really there."""
    if eos_token_id is None:
        return dataset

    def strip(example: dict[str, Any]) -> dict[str, Any]:
        for key in ("chosen_ids", "rejected_ids"):
            ids = list(example[key])
            if len(ids) > 1 and ids[-1] == eos_token_id:
                example[key] = ids[:-1]
        return example

    return dataset.map(strip)


def train_dpo_lora(model_spec: str, rows: Sequence[Mapping[str, str]], output_dir: str | Path,
                   config: DPOTrainingConfig, *,
                   callbacks: list[TrainerCallback] | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Train (or continue) a LoRA adapter with TRL's ``DPOTrainer`` on :func:`preference_rows`; save the adapter.

    Nothing is reported by the trainer itself (``report_to=[]``); pass
    :class:`prorag.tracking.callbacks.MlflowStepMetrics` to log loss, ``rewards/margins``, ``rewards/accuracies``
    … per step. Checkpoints and resumption as :func:`prorag.training.sft.train_sft_lora`.
    Returns ``(output_dir / "adapter", trainer.state.log_history)``.
    """
    from datasets import Dataset  # noqa: I001  (ruff takes it for first-party: tests/datasets)
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    from prorag.llm.registry import load_causal_lm, resolve_model_path
    from prorag.training.devices import bf16_compute, ensure_one_device
    from prorag.training.trl_private import score_labelled_positions_only

    if not rows:
        raise ValueError("no preference rows")
    masked = any(any(json.loads(row.get(INSERTED) or "{}").values()) for row in rows)
    if masked and config.precompute_ref_log_probs:
        raise ValueError("dpo precompute_ref_log_probs: the responses hold engine-inserted text, and TRL would "
                         "precompute the reference log-probabilities over it before prorag masks it; set it false")
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    ensure_one_device(config.use_cpu, what="DPO")
    device = "cpu" if config.use_cpu else "cuda"
    loss_type, loss_weights = config.loss()
    # the config before the model: under ZeRO-3 the weights are then partitioned as they load
    args = DPOConfig(**{"report_to": [], **config.trainer_args}, **dict(
        output_dir=str(output / CHECKPOINTS), use_cpu=config.use_cpu,
        bf16=bf16_compute(config.dtype, config.use_cpu), fp16=False,
        beta=config.beta, loss_type=loss_type, loss_weights=loss_weights,
        learning_rate=config.learning_rate, num_train_epochs=config.num_train_epochs, max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        lr_scheduler_type=config.lr_scheduler_type, warmup_steps=float(config.warmup_ratio),  # a float < 1 is a ratio
        seed=config.seed, data_seed=config.seed, logging_steps=config.logging_steps,
        **checkpoint_arguments(config.save_steps, config.save_total_limit),
        max_length=config.max_length, activation_checkpointing=config.gradient_checkpointing,
        precompute_ref_log_probs=config.precompute_ref_log_probs,
        remove_unused_columns=False,  # the policy-token masks travel to the collator beside TRL's columns
    ))  # trainer_args is validated: it sets no field named here (report_to may be overridden)
    model, tokenizer = load_causal_lm(model_spec, dtype=config.dtype, device=device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    peft_config = None
    if config.init_adapter:
        model = continue_adapter(model, config.init_adapter)
    else:
        peft_config = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                                 target_modules=list(config.target_modules), bias="none", task_type="CAUSAL_LM")
    score_labelled_positions_only()
    with upstream_deprecations():  # PEFT wraps the model: transformers' is_gradient_checkpointing FutureWarning
        trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list([dict(row) for row in rows]),
                             processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
    if not config.append_eos:
        trainer.train_dataset = _drop_appended_eos(trainer.train_dataset, tokenizer.eos_token_id)
    if masked:
        from prorag.training.preference_masks import PolicyTokenCollator, policy_token_masks

        trainer.train_dataset = trainer.train_dataset.map(policy_token_masks,
                                                          fn_kwargs={"tokenizer": tokenizer, "spans_column": INSERTED})
        trainer.data_collator = PolicyTokenCollator.from_collator(trainer.data_collator)
    with upstream_deprecations():  # TRL's DPO loss reads is_gradient_checkpointing at every step
        train_resumable(trainer, output, resume=config.resume and config.save_steps is not None)
    adapter_dir = save_adapter(trainer, output / "adapter", selected_adapters=["default"])
    logger.info("saved the DPO LoRA adapter of %s (%s) to %s after %d steps", model_spec,
                resolve_model_path(model_spec), adapter_dir, trainer.state.global_step)
    return adapter_dir, list(trainer.state.log_history)
