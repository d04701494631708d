"""Supervised fine-tuning on gold trajectories: loss on the policy's own tokens only, LoRA via TRL.

:func:`build_sft_example` tokenizes a (question, completion) pair the way the rollout engine
(:mod:`prorag.agent.engine`) builds the sequence: the chat-templated prompt of the protocol, then each piece of the
completion tokenized on its own (``add_special_tokens=False``), alternating what the policy writes and what the
engine inserts. The pieces come from the protocol adapter's
:meth:`~prorag.protocol.base.ProtocolAdapter.label_pieces` (its SFT label mask), so this module names no protocol.
Labels are ``-100`` on everything the engine inserts, so the model is never trained to produce it — for HiPRAG:
the prompt and Algorithm 1's initial prefix; every retrieval insertion (``\\n<context>``, the escaped documents,
``</context>\\n<conclusion>``); every ``\\n</step>`` the engine appends after a conclusion. The model writes
the next ``<step>`` or ``</think>``.

The EOS token is appended (and trained) after ``</answer>`` unless ``add_eos=False``.

:func:`train_sft_lora` trains a LoRA adapter with TRL's ``SFTTrainer`` on these pre-tokenized rows: TRL 1.16
recognizes a dataset with an ``input_ids`` column as pre-tokenized and uses its ``labels`` column as is (no
completion/assistant mask is rebuilt); its ``DataCollatorForLanguageModeling`` pads labels with ``-100``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from prorag.llm.generation import render_chat
from prorag.llm.upstream_warnings import upstream_deprecations
from prorag.memory import release_memory
from prorag.protocol.base import ProtocolAdapter
from prorag.protocol.registry import build_adapter
from prorag.training.checkpoints import CHECKPOINTS, checkpoint_arguments, save_adapter, train_resumable
from prorag.training.config import SFT_TRL_NAMES, SFTSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, TrainerCallback

logger = logging.getLogger(__name__)

IGNORE_INDEX: Final = -100


def completion_pieces(completion: str, protocol: str | ProtocolAdapter) -> list[tuple[str, bool]]:
    """Split a rendered completion into ``(text, written_by_policy)`` pieces, in order (the protocol's label mask).

    The completion must pass the protocol's format check and start with its initial prefix.
    """
    return build_adapter(protocol).label_pieces(completion)


def build_sft_example(tokenizer: PreTrainedTokenizerBase, question: str, completion: str, *,
                      protocol: str | ProtocolAdapter, add_eos: bool = True, few_shot: bool = True,
                      ) -> dict[str, list[int]]:
    """``input_ids``, ``labels`` (``-100`` on the prompt and on engine-inserted text) and ``attention_mask``.

    ``protocol`` (a registered name or an adapter) gives the prompt and the label mask; ``few_shot`` selects the
    prompt of the protocols that have few-shot examples — use the value the policy is later rolled out with.
    """
    adapter = build_adapter(protocol, few_shot=few_shot)
    prompt = render_chat(tokenizer, adapter.messages(question))
    input_ids: list[int] = []
    labels: list[int] = []
    for text, trained in [(prompt, False), *adapter.label_pieces(completion)]:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        input_ids.extend(ids)
        labels.extend(ids if trained else [IGNORE_INDEX] * len(ids))
    if add_eos and tokenizer.eos_token_id is not None:
        input_ids.append(int(tokenizer.eos_token_id))
        labels.append(int(tokenizer.eos_token_id))
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def _training_rows(examples: Iterable[Mapping[str, Sequence[int]]]) -> list[dict[str, list[int]]]:
    rows = []
    for position, example in enumerate(examples):
        input_ids, labels = [int(x) for x in example["input_ids"]], [int(x) for x in example["labels"]]
        if len(input_ids) != len(labels):
            raise ValueError(f"example {position}: {len(input_ids)} input ids but {len(labels)} labels")
        if all(label == IGNORE_INDEX for label in labels):
            raise ValueError(f"example {position} has no trained token")
        rows.append({"input_ids": input_ids, "labels": labels})
    if not rows:
        raise ValueError("no training examples")
    return rows


def train_sft_lora(model_spec: str, examples: Iterable[Mapping[str, Sequence[int]]], output_dir: str | Path,
                   settings: SFTSettings, *, callbacks: list[TrainerCallback] | None = None,
                   ) -> tuple[Path, list[dict[str, Any]]]:
    """Train a LoRA adapter on pre-tokenized examples with TRL's ``SFTTrainer``; save only the adapter.

    ``examples`` are :func:`build_sft_example` rows (``attention_mask`` is ignored: the collator rebuilds it).
    Nothing is reported to a tracker (``report_to=[]``): the caller logs ``log_history``. With
    ``settings.save_steps``, checkpoints go to ``output_dir / "checkpoints"`` and an unfinished run in the same
    ``output_dir`` resumes from its last one (:mod:`prorag.training.checkpoints`).
    Returns ``(output_dir / "adapter", trainer.state.log_history)``.
    """
    from datasets import Dataset  # noqa: I001  (ruff takes it for first-party: tests/datasets)
    import torch
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from prorag.llm.precision import frozen_linear_weights_in_bf16
    from prorag.llm.registry import load_causal_lm
    from prorag.training.activation_budget import activation_bytes, checkpoint_beyond_budget, checkpointing_layers
    from prorag.training.devices import bf16_compute, ensure_one_device
    from prorag.training.trl_private import score_labelled_positions_only

    score_labelled_positions_only()

    rows = _training_rows(examples)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    ensure_one_device(settings.use_cpu, what="SFT")
    config = SFTConfig(**{  # before the model: under ZeRO-3 the weights are then partitioned as they load
        **settings.model_dump(include=set(SFT_TRL_NAMES)),
        "output_dir": str(output / CHECKPOINTS),
        "report_to": [],
        "bf16": bf16_compute(settings.dtype, settings.use_cpu, requested=settings.mixed_precision),
        "fp16": False,
        "data_seed": settings.seed,
        **checkpoint_arguments(settings.save_steps, settings.save_total_limit),
        "activation_checkpointing": settings.gradient_checkpointing,  # the non-deprecated name in transformers 5
        "completion_only_loss": False,
        "assistant_only_loss": False,
        **settings.trainer_args,  # validated: no field set above but report_to
    })
    model, tokenizer = load_causal_lm(model_spec, dtype=settings.dtype, device="cpu")
    peft_config = LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                             target_modules=list(settings.target_modules), bias="none", task_type="CAUSAL_LM")
    with upstream_deprecations():  # PEFT wraps the model: transformers' is_gradient_checkpointing FutureWarning
        trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
    if settings.gradient_checkpointing and settings.activation_budget_mb:
        budget = settings.activation_budget_mb * 2**20
        layers = len(checkpointing_layers(trainer.model))
        cost = activation_bytes(trainer.model, torch.bfloat16 if config.bf16 else None)
        checkpoint_beyond_budget(trainer.model, budget, cost)
        logger.info("SFT: layers checkpointed beyond %.0f MB of activations a step (a layer stores %.1f kB a token "
                    "+ %.1f MB): %d of %d layers plain at 1,000 tokens", settings.activation_budget_mb,
                    cost.per_token / 1e3, cost.fixed / 2**20, cost.layers_within(budget, 1000, layers), layers)
    if config.bf16 and trainer.accelerator.num_processes == 1:
        frozen_linear_weights_in_bf16(trainer.model)
    prepared = trainer.train_dataset[0]["labels"]
    if list(prepared) != rows[0]["labels"]:  # a TRL change that rebuilt the labels would silently train on context
        raise RuntimeError("SFTTrainer did not keep the labels of the pre-tokenized examples")
    train_resumable(trainer, output, resume=settings.resume and settings.save_steps is not None)
    adapter_dir = save_adapter(trainer, output / "adapter")
    logger.info("saved the LoRA adapter of %s to %s after %d steps", model_spec, adapter_dir,
                trainer.state.global_step)
    history = list(trainer.state.log_history)
    del trainer, model
    release_memory("SFT")  # the model, optimizer and activations' heap, before the next stage
    return adapter_dir, history
