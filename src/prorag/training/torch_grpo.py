"""The ``torch`` trainer backend: GRPO in plain PyTorch over the backend-neutral rollouts (:mod:`.grpo`), in one
process — HiPRAG / Search-R1's objective with no trainer framework.

Per generation batch (``per_device_train_batch_size × gradient_accumulation_steps`` completions, whole groups of
``num_generations``), the current policy rolls out and scores the questions
(:meth:`~prorag.training.grpo.AgentRollouts.roll_out`, DAPO's refill included); each completion's advantage is its
reward minus its group's mean, scaled by the group's (or batch's) standard deviation
(:func:`~prorag.rewards.diagnostics.grpo_advantages`, TRL's rule). The loss over the generated tokens only is the
clipped surrogate ``-min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)`` with ``ρ = π/π_old`` (π_old: the policy that sampled,
``rl.backend.args.num_iterations`` updates per batch), plus ``beta`` times the k3 estimate of KL to the reference
(the starting policy: the adapter switched off, or a frozen copy for full-parameter training); it is averaged per
sequence (``grpo``), over the batch's tokens (``dapo``) or over ``batch × max_completion_length`` (``dr_grpo``).
``drop_uniform_groups`` leaves groups whose rewards are all equal out of the loss and its normaliser.

The run folder is the TRL backend's: ``checkpoints/checkpoint-<step>`` every ``save_steps`` (the trainable
weights, optimizer and scheduler; ``trainer_state.json`` written last), resumed from the last complete one;
``adapter/`` and the ``COMPLETED`` marker at the end. ``rl.policy_server`` and several processes are the ``trl``
backend's.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import random
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import torch
from pydantic import Field, ValidationError

from prorag.config import StrictModel
from prorag.judges.limits import use_ledger
from prorag.llm.precision import compute_precision
from prorag.llm.registry import make_adapter_portable, merge_adapter
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.llm.upstream_warnings import upstream_deprecations
from prorag.memory import release_memory
from prorag.rewards.diagnostics import grpo_advantages, uniform_groups
from prorag.specs import PositiveInt
from prorag.training.checkpoints import COMPLETED_MARKER, continue_adapter, last_complete_checkpoint
from prorag.training.devices import bf16_compute, ensure_one_device, fp32_master_weights, launched_processes
from prorag.training.grpo import JUDGE_LEDGER, STAT_PREFIX, AgentRollouts, RolloutBatch, unique_questions

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from prorag.data.records import Question
    from prorag.training.config import GRPOSettings

logger = logging.getLogger(__name__)

STATE_FILE: Final = "trainer_state.json"


class TorchGRPOArgs(StrictModel):
    """``rl.backend.args`` of the torch backend."""

    max_grad_norm: float = Field(default=1.0, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    num_iterations: PositiveInt = 1
    """Optimizer steps per generation batch (μ); from the second on, the ratio to the sampling policy is clipped."""
    max_completion_length: PositiveInt = 256
    """Dr. GRPO's constant normaliser (TRL's default)."""


class TorchBackend:
    """The ``torch`` trainer backend (module docstring)."""

    name: Final = "torch"
    rollouts: Final = AgentRollouts

    def check_args(self, args: Mapping[str, Any], where: str) -> dict[str, Any]:
        try:
            return TorchGRPOArgs.model_validate(dict(args), strict=False).model_dump()
        except ValidationError as error:
            problems = "; ".join(f"{where}.{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
                                 for item in error.errors())
            raise ValueError(f"torch backend: {problems}") from None

    def train(self, model: str, questions: Sequence[Question], rollouts: AgentRollouts, output_dir: str | Path,
              settings: GRPOSettings, *, args: Mapping[str, Any], adapter_dir: str | Path | None,
              full_parameters: bool, callbacks: list[Any]) -> tuple[Path, list[dict[str, Any]]]:
        return train_torch_grpo(model, questions, rollouts, output_dir, settings,
                                args=TorchGRPOArgs(**self.check_args(args, "rl.backend.args")),
                                adapter_dir=adapter_dir, full_parameters=full_parameters, callbacks=callbacks)


TORCH_BACKEND: Final = TorchBackend()


def train_torch_grpo(model: str | tuple[PreTrainedModel, PreTrainedTokenizerBase], questions: Sequence[Question],
                     rollouts: AgentRollouts, output_dir: str | Path, settings: GRPOSettings, *,
                     args: TorchGRPOArgs | None = None, adapter_dir: str | Path | None = None,
                     full_parameters: bool = False,
                     callbacks: Sequence[Any] = ()) -> tuple[Path, list[dict[str, Any]]]:
    """Train ``model`` (a registry spec or a loaded ``(model, tokenizer)``) with GRPO (module docstring); returns
    the adapter (or full model) folder ``output_dir / "adapter"`` and one log entry per step. ``callbacks`` are
    transformers ``TrainerCallback`` objects: their ``on_log`` and ``on_step_end`` are called."""
    args = args or TorchGRPOArgs()
    if rollouts.policy_server is not None:
        raise ValueError("rl.backend torch rolls out in-process: rl.policy_server needs rl.backend.name: trl")
    if launched_processes() > 1:
        raise ValueError("rl.backend torch trains in one process: several processes (launch.mode: accelerate with "
                         "num_processes > 1) need rl.backend.name: trl")
    size = settings.num_generations
    batch = settings.per_device_train_batch_size * settings.gradient_accumulation_steps
    if batch % size:
        raise ValueError(f"rl.trainer.per_device_train_batch_size × gradient_accumulation_steps ({batch}) must be "
                         f"whole groups of rl.trainer.num_generations ({size})")
    ensure_one_device(settings.use_cpu, what="GRPO")
    output = Path(output_dir)
    checkpoints = output / "checkpoints"
    if (output / COMPLETED_MARKER).exists():
        logger.info("%s holds a finished run: starting afresh", output)
        shutil.rmtree(checkpoints, ignore_errors=True)
        shutil.rmtree(output / JUDGE_LEDGER, ignore_errors=True)  # a new run, a new judge budget
        (output / COMPLETED_MARKER).unlink()
    checkpoints.mkdir(parents=True, exist_ok=True)

    device = torch.device("cpu" if settings.use_cpu else "cuda")
    torch.manual_seed(settings.seed)  # a fresh adapter's initial weights
    policy, tokenizer = _policy(model, settings, adapter_dir=adapter_dir, full_parameters=full_parameters)
    policy.to(device)
    reference = (copy.deepcopy(policy).eval().requires_grad_(False)
                 if full_parameters and settings.beta > 0 else None)
    if settings.gradient_checkpointing:
        # transformers' current name (gradient_checkpointing_enable warns that it goes in v6)
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(policy, "enable_input_require_grads"):
            policy.enable_input_require_grads()
    trainable = [parameter for parameter in policy.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / settings.max_steps))
    autocast = bf16_compute(settings.dtype, settings.use_cpu, full_parameters=full_parameters)

    history: list[dict[str, Any]] = []
    start = 0
    last = last_complete_checkpoint(checkpoints) if settings.resume else None
    if last is not None:
        logger.info("resuming GRPO (torch) from %s", last)
        start, history = _load_checkpoint(last, policy, optimizer, scheduler)
    order = [question.question for question in unique_questions(questions)]
    per_batch = batch // size
    state = _State(global_step=start)
    generation: _Generation | None = None
    with use_ledger(output / JUDGE_LEDGER):  # one judge budget and rate limit for every restart of the run
        for step in range(start, settings.max_steps):
            metrics: dict[str, float] = {}
            if generation is None or step % args.num_iterations == 0:
                prompts = _prompts(order, step // args.num_iterations, per_batch, size, settings.seed)
                with _generating(policy, tokenizer, rollouts.batch_size) as generator:
                    rolled = rollouts.roll_out(prompts, generator, step=step, rank=0, group_size=size,
                                               scale_rewards=settings.scale_rewards)
                generation = _Generation.of(rolled, step, tokenizer, device, size, settings, args)
                with torch.no_grad(), compute_precision("bf16" if autocast else "no", device):
                    if args.num_iterations > 1:  # with one update per batch π_old is the policy itself (ρ = 1)
                        generation.old_logps = _logps(policy, generation, settings.temperature)
                    if settings.beta > 0:
                        with _reference(policy, reference) as frozen:
                            generation.ref_logps = _logps(frozen, generation, settings.temperature)
                metrics.update(_rollout_metrics(rolled, size))
            policy.train()
            metrics.update(_update(policy, generation, settings, args, autocast, device))
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.global_step = step + 1
            entry = {**metrics, "learning_rate": scheduler.get_last_lr()[0], "step": state.global_step}
            history.append(entry)
            for callback in callbacks:  # transformers' order: step end, then the log, then the checkpoint
                callback.on_step_end(None, state, None)
            for callback in callbacks:
                callback.on_log(None, state, None, logs=dict(entry))
            if state.global_step % settings.save_steps == 0 or state.global_step == settings.max_steps:
                _save_checkpoint(checkpoints, state.global_step, policy, optimizer, scheduler, history,
                                 settings.save_total_limit)
    adapter = output / "adapter"
    policy.save_pretrained(str(adapter))
    if full_parameters:  # a loadable model folder: the rollouts load it as the model
        tokenizer.save_pretrained(str(adapter))
    else:  # the adapter records its base by its portable name, not this machine's cache folder
        make_adapter_portable(adapter)
    (output / COMPLETED_MARKER).write_text(json.dumps({"global_step": state.global_step}))
    logger.info("saved the GRPO (torch) policy to %s after %d steps", adapter, state.global_step)
    del policy, reference, optimizer, generation
    release_memory("GRPO (torch)")
    return adapter, history


class _State:
    """What the callbacks read of a transformers ``TrainerState``."""

    is_world_process_zero: Final = True
    is_local_process_zero: Final = True

    def __init__(self, global_step: int) -> None:
        self.global_step = global_step


class _Generation:
    """One generation batch as tensors: sequences (prompt + completion, right-padded), the mask of generated
    completion tokens over the predicted positions, advantages, and the sampling / reference log-probabilities."""

    def __init__(self, step: int, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor,
                 advantages: torch.Tensor) -> None:
        self.step = step
        self.ids = ids
        self.attention = attention
        self.mask = mask
        self.advantages = advantages
        self.old_logps: torch.Tensor | None = None
        self.ref_logps: torch.Tensor | None = None

    @classmethod
    def of(cls, rolled: RolloutBatch, step: int, tokenizer: Any, device: torch.device, size: int,
           settings: GRPOSettings, args: TorchGRPOArgs) -> _Generation:
        prompts = [list(rollout.prompt_token_ids) for rollout in rolled.rollouts]
        completions = rolled.completions()
        length = max(len(prompt) + len(ids) for prompt, (ids, _, _) in zip(prompts, completions, strict=True))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids = torch.full((len(prompts), length), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), length), dtype=torch.long)
        mask = torch.zeros((len(prompts), length - 1), dtype=torch.float32)
        for row, (prompt, (completion, _, generated)) in enumerate(zip(prompts, completions, strict=True)):
            sequence = prompt + completion
            ids[row, :len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            attention[row, :len(sequence)] = 1
            # position t predicts token t + 1: completion token j sits at len(prompt) + j
            mask[row, len(prompt) - 1:len(prompt) - 1 + len(completion)] = torch.tensor(generated, dtype=torch.float32)
        totals = rolled.scored.totals
        advantages = torch.tensor(grpo_advantages(totals, size, settings.scale_rewards), dtype=torch.float32)
        if settings.drop_uniform_groups:
            for group in uniform_groups(totals, size):
                mask[group * size:(group + 1) * size] = 0.0
        return cls(step, ids.to(device), attention.to(device), mask.to(device), advantages.to(device))

    def rows(self, count: int) -> Iterator[slice]:
        """Consecutive micro-batches of ``count`` rows."""
        for start in range(0, self.ids.shape[0], count):
            yield slice(start, start + count)


def _policy(model: str | tuple[PreTrainedModel, PreTrainedTokenizerBase], settings: GRPOSettings, *,
            adapter_dir: str | Path | None, full_parameters: bool) -> tuple[Any, Any]:
    """The trainable policy: every parameter (fp32 master weights; a given adapter merged in first), the given
    adapter continued, or a fresh LoRA adapter (``settings.lora``)."""
    from peft import LoraConfig, get_peft_model

    from prorag.llm.registry import load_causal_lm

    load_dtype = "float32" if full_parameters else settings.dtype
    policy, tokenizer = load_causal_lm(model, dtype=load_dtype) if isinstance(model, str) else model
    with upstream_deprecations():  # PEFT reads transformers' deprecated is_gradient_checkpointing
        if full_parameters:
            if adapter_dir is not None:
                policy = merge_adapter(policy, adapter_dir)
            return fp32_master_weights(policy).requires_grad_(True), tokenizer
        if adapter_dir is not None:
            return continue_adapter(policy, adapter_dir), tokenizer
        lora = settings.lora
        return get_peft_model(policy, LoraConfig(r=lora.lora_r, lora_alpha=lora.lora_alpha,
                                                 lora_dropout=lora.lora_dropout,
                                                 target_modules=list(lora.target_modules), bias="none",
                                                 task_type="CAUSAL_LM")), tokenizer


def _prompts(order: list[str], batch_index: int, per_batch: int, size: int, seed: int) -> list[str]:
    """The prompts of generation batch ``batch_index``: ``per_batch`` questions, each ``size`` times in a row, taken
    in turn from a shuffle of the training questions (reshuffled each epoch, seeded: a resumed run draws the same)."""
    drawn = []
    for slot in range(batch_index * per_batch, (batch_index + 1) * per_batch):
        epoch, position = divmod(slot, len(order))
        shuffled = list(order)
        random.Random(seed + epoch).shuffle(shuffled)
        drawn.append(shuffled[position])
    return [prompt for prompt in drawn for _ in range(size)]


@contextlib.contextmanager
def _generating(policy: Any, tokenizer: Any, batch_size: int) -> Iterator[TransformersGenerator]:
    """The current policy as a generator (eval mode, no grad); training mode is restored after."""
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad():
            yield TransformersGenerator((policy, tokenizer), batch_size=batch_size)
    finally:
        policy.train(was_training)


@contextlib.contextmanager
def _reference(policy: Any, reference: Any | None) -> Iterator[Any]:
    """The reference policy: the frozen copy, or the policy with its adapter switched off."""
    if reference is not None:
        yield reference
        return
    with policy.disable_adapter():
        yield policy


def _logps(model: Any, generation: _Generation, temperature: float, rows: slice = slice(None)) -> torch.Tensor:
    """Per predicted position, the log-probability of the next token under ``model`` at the sampling temperature."""
    ids = generation.ids[rows]
    logits = model(input_ids=ids, attention_mask=generation.attention[rows]).logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _update(policy: Any, generation: _Generation, settings: GRPOSettings, args: TorchGRPOArgs, autocast: bool,
            device: torch.device) -> dict[str, float]:
    """Accumulate the gradient of the GRPO loss over the batch's micro-batches; returns the step's loss metrics."""
    old, reference = generation.old_logps, generation.ref_logps
    accumulation = settings.gradient_accumulation_steps
    tokens = generation.mask.sum().clamp(min=1.0)
    high = settings.epsilon_high if settings.epsilon_high is not None else settings.epsilon
    total_loss = kl_sum = clipped = 0.0
    for rows in generation.rows(settings.per_device_train_batch_size):
        mask = generation.mask[rows]
        with compute_precision("bf16" if autocast else "no", device):
            logps = _logps(policy, generation, settings.temperature, rows)
        ratio = torch.exp(logps - (old[rows] if old is not None else logps.detach()))
        advantages = generation.advantages[rows].unsqueeze(1)
        per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - settings.epsilon, 1 + high) * advantages)
        if reference is not None:
            delta = reference[rows] - logps
            kl = torch.exp(delta) - delta - 1
            per_token = per_token + settings.beta * kl
            kl_sum += float((kl.detach() * mask).sum())
        if settings.loss_type == "grpo":
            loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
        elif settings.loss_type == "dapo":
            loss = (per_token * mask).sum() / tokens
        else:  # dr_grpo
            loss = (per_token * mask).sum() / (generation.ids.shape[0] * args.max_completion_length)
        loss.backward()
        total_loss += float(loss.detach())
        outside = ((ratio < 1 - settings.epsilon) | (ratio > 1 + high)).float()
        clipped += float((outside.detach() * mask).sum())
    metrics = {"loss": total_loss, "clip_ratio": clipped / float(tokens)}
    if reference is not None:
        metrics["kl"] = kl_sum / float(tokens)
    return metrics


def _rollout_metrics(rolled: RolloutBatch, size: int) -> dict[str, float]:
    """The generation batch's rewards (``reward``, ``reward_std``, ``rewards/<component>/mean``), agent statistics
    (``agent/*``), DAPO and judge-usage metrics and completion lengths, named as the TRL backend logs them."""
    totals = np.asarray(rolled.scored.totals, dtype=np.float64)
    metrics = {"reward": float(totals.mean()), "reward_std": float(totals.std(ddof=1)) if totals.size > 1 else 0.0}
    for name, values in rolled.scored.components.items():
        metrics[f"rewards/{name}/mean"] = float(np.mean(values))
        metrics[f"rewards/{name}/std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    for name, (numerator, denominator) in rolled.stats.items():
        if denominator > 0:
            metrics[STAT_PREFIX + name] = numerator / denominator
    uniform = len(uniform_groups(rolled.scored.totals, size))
    metrics["frac_reward_zero_std"] = uniform / max(1, len(totals) // size)
    metrics["completions/mean_length"] = float(np.mean([len(ids) for ids, _, _ in rolled.completions()]))
    return {**metrics, **rolled.metrics}


def _save_checkpoint(root: Path, step: int, policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                     history: list[dict[str, Any]], keep: int | None) -> None:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    trainable = {name: parameter.detach().cpu() for name, parameter in policy.named_parameters()
                 if parameter.requires_grad}
    torch.save(trainable, folder / "trainable.pt")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, folder / "optimizer.pt")
    (folder / STATE_FILE).write_text(json.dumps({"global_step": step, "log_history": history}))  # last: complete
    if keep is not None:
        saved = sorted((int(path.name.split("-")[1]), path) for path in root.glob("checkpoint-*") if path.is_dir())
        for _, path in saved[:-keep]:
            shutil.rmtree(path, ignore_errors=True)


def _load_checkpoint(folder: Path, policy: Any, optimizer: torch.optim.Optimizer,
                     scheduler: Any) -> tuple[int, list[dict[str, Any]]]:
    weights = torch.load(folder / "trainable.pt", map_location="cpu")
    parameters = dict(policy.named_parameters())
    unknown = sorted(set(weights) - set(parameters))
    if unknown:
        raise ValueError(f"{folder}: checkpoint holds parameters this policy lacks ({unknown[:3]} ...): not this run")
    with torch.no_grad():
        for name, value in weights.items():
            parameters[name].copy_(value)
    states = torch.load(folder / "optimizer.pt", map_location="cpu")
    optimizer.load_state_dict(states["optimizer"])
    scheduler.load_state_dict(states["scheduler"])
    state = json.loads((folder / STATE_FILE).read_text())
    return int(state["global_step"]), list(state["log_history"])
