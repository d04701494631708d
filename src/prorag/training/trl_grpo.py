"""GRPO / DAPO / Dr. GRPO with TRL's ``GRPOTrainer`` over the project's multi-turn rollout engine: the ``trl``
trainer backend (:data:`TRL_BACKEND`, :mod:`prorag.training.backends`; the default).

* :class:`AgentRolloutFunction` is TRL's ``rollout_func``: for the prompts of a generation batch (TRL's sampler
  already repeats each question ``num_generations`` times) it runs the backend-neutral
  :class:`~prorag.training.grpo.AgentRollouts` (engine, scorer, DAPO refill) on the trainer's *current* policy,
  in-process, and hands TRL the exact prompt ids, the completion ids (generated and inserted segments), the sampler's
  log-probabilities (0 for inserted tokens), ``env_mask`` (1 for generated tokens, 0 for inserted ones: retrieved
  ``<context>`` and the engine's tags stay out of the loss) and the reward components as extra fields.
  With a :class:`~prorag.training.grpo.PolicyServer` the same rollouts and re-asks go through an OpenAI-compatible
  server instead (``trl vllm-serve``): :func:`build_grpo_trainer` then turns on TRL's vLLM server mode, which pushes
  the current weights (LoRA merged) to that server before every generation batch, so it serves the current policy.
  Several servers (data-parallel replicas, ``rl.policy_server.base_url`` a list) each get the weights
  (:class:`~prorag.training.trl_private.ReplicaWeightSync`) and a share of each batch's groups.
* :class:`ComponentReward` hands one component to TRL, which sums the components (each already weighted) and
  logs each one's mean and std.
* :class:`AgentGRPOTrainer` adds the agent statistics (format rate, CEM, OSR, USR, search ratio, retrievals,
  unknown-judge rate, tokens, ``bonus_fired``: the share of rollouts whose process bonus fired, ``process_shaped``:
  the share of groups whose advantages the process term changes,
  :func:`~prorag.rewards.diagnostics.process_shaped_groups`) to TRL's logged
  metrics, summed over processes before the ratio is taken, and DAPO's dynamic sampling filter when
  ``drop_uniform_groups`` is set (TRL 1.16 has none): groups whose rewards are all equal are removed from the loss
  and its token normalizer, and ``dapo/dropped_group_fraction`` says how many. DAPO's refill (``refill_rounds``)
  happens before, in the rollout function: each uniform group is replaced by the group of a newly drawn training
  question, for a bounded number of rounds (``dapo/refilled_groups``).
* :func:`train_grpo_lora` trains a LoRA adapter (a fresh one, or continuing a given one such as the SFT adapter),
  with checkpoints every ``save_steps`` and resumption from the last checkpoint of an unfinished run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.import_utils import is_vllm_available
from trl.models.utils import unwrap_model_for_generation

from prorag.judges.limits import use_ledger
from prorag.llm.generation import Generator
from prorag.llm.registry import make_adapter_portable, merge_adapter
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.llm.upstream_warnings import upstream_deprecations
from prorag.memory import release_memory
from prorag.rewards.scoring import Ratio
from prorag.training.checkpoints import continue_adapter
from prorag.training.config import FIXED_BY_PRORAG, GRPOSettings, check_trainer_args
from prorag.training.devices import bf16_compute, ensure_one_device, fp32_master_weights
from prorag.training.grpo import (
    COMPLETED_MARKER,
    JUDGE_LEDGER,
    STAT_PREFIX,
    AgentRollouts,
    PolicyServer,
    unique_questions,
)
from prorag.training.trl_private import GRPOTrainerHooks, score_labelled_positions_only, sync_every_replica

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

    from prorag.data.records import Question

__all__ = ["COMPLETED_MARKER", "JUDGE_LEDGER", "STAT_PREFIX", "TRL_BACKEND", "AgentGRPOTrainer",
           "AgentRolloutFunction", "ComponentReward", "PolicyServer", "build_grpo_trainer", "grpo_dataset",
           "train_grpo_lora"]

logger = logging.getLogger(__name__)

REWARD_FIELD_PREFIX: Final = "reward_"
GRPO_TRL_NAMES = ("learning_rate", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                  "num_generations", "loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards", "temperature",
                  "seed", "logging_steps", "save_steps", "save_total_limit", "use_cpu")
"""The ``GRPOConfig`` fields :class:`~prorag.training.config.GRPOSettings` sets under their own names."""
GRPO_TRL_OWNED: Final[Mapping[str, str]] = {
    **{name: f"rl.trainer.{name}" for name in GRPO_TRL_NAMES},
    "activation_checkpointing": "rl.trainer.gradient_checkpointing", "bf16": "rl.trainer.dtype",
    "fp16": "rl.trainer.dtype", "data_seed": "rl.trainer.seed", "top_p": "rl.trainer.top_p",
    **dict.fromkeys(("use_vllm", "vllm_mode", "vllm_server_base_url"), "rl.policy_server"),
    **dict.fromkeys(("output_dir", "save_strategy", "mask_truncated_completions", "remove_unused_columns",
                     "shuffle_dataset"), FIXED_BY_PRORAG),
}
"""Who sets each ``GRPOConfig`` field prorag sets: such a field in ``rl.backend.args`` fails naming it."""


def check_grpo_args(args: Mapping[str, Any], where: str = "rl.backend.args") -> dict[str, Any]:
    """``args`` when each is a ``GRPOConfig`` field of the pinned TRL that prorag does not set (a typo fails with
    the closest field, a field prorag sets with the parameter that sets it)."""
    return check_trainer_args(args, "GRPOConfig", GRPO_TRL_OWNED, where)


class AgentRolloutFunction(AgentRollouts):
    """TRL ``rollout_func``: :class:`~prorag.training.grpo.AgentRollouts` on the trainer's current policy (module
    docstring), its batch handed to TRL as token arrays and reward-component fields."""

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        with self._policy(trainer) as generator:
            batch = self.roll_out(prompts, generator, step=int(trainer.state.global_step),
                                  rank=trainer.accelerator.process_index, group_size=int(trainer.num_generations),
                                  scale_rewards=str(trainer.scale_rewards))
        if isinstance(trainer, AgentGRPOTrainer):
            trainer.record_rollout_stats(batch.stats)
            for name, value in batch.metrics.items():  # DAPO refill; the judges' calls, tokens and cost so far
                trainer.log_metric(name, value)
            if batch.usage:
                trainer.record_judge_step_cost(batch.judge_cost)
        completions = batch.completions()
        return {
            "prompt_ids": [list(rollout.prompt_token_ids) for rollout in batch.rollouts],
            "completion_ids": [ids for ids, _, _ in completions],
            "logprobs": [logprobs for _, logprobs, _ in completions],
            "env_mask": [mask for _, _, mask in completions],
            **{REWARD_FIELD_PREFIX + name: values for name, values in batch.scored.components.items()},
        }

    @contextlib.contextmanager
    def _policy(self, trainer: GRPOTrainer) -> Iterator[Generator]:
        """The current policy: in-process, or the policy server that TRL keeps in sync."""
        if self.policy_server is None:
            with policy_generator(trainer, batch_size=self.batch_size) as generator:
                yield generator
            return
        with self.server_generator(trainer.processing_class) as generator:
            yield generator


@contextlib.contextmanager
def fsdp2_full_parameters(model: torch.nn.Module) -> Iterator[bool]:
    """FSDP2 (``fully_shard``): gather every parameter once before generation and keep it whole through all of
    generation's forward passes, then reshard; a model without FSDP2 modules is left alone.

    Under FSDP2 each forward pass all-gathers every wrapped block's shards (a collective) and frees them afterwards,
    so ranks whose multi-turn rollouts run different numbers of forward passes (turns, stop strings) would pair up
    mismatched collectives and hang or exchange wrong data. Here each FSDP module is unsharded once (the same
    collectives, in the same order, on every rank) with resharding after forward turned off, so generation runs no
    collective at all; on exit the modules are resharded and their reshard-after-forward settings restored. Memory:
    the full model is held on every rank while generating (what ZeRO-3's ``ds3_gather_for_generation`` does too).
    Yields whether it gathered (False: no FSDP2 module). Generate with transformers' ``synced_gpus=False`` inside
    (:class:`~prorag.llm.transformers_backend.TransformersGenerator`): its per-step all-reduce is a collective too.
    """
    from torch.distributed.fsdp import FSDPModule

    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    if not modules:
        yield False
        return
    # the outermost FSDP module is the root: initialize it as such before generation, whose forward passes may
    # enter below it (PeftModel.generate calls the wrapped model) and would otherwise make a block the root
    modules[0]._get_fsdp_state()._lazy_init()
    saved = []
    for module in modules:
        state = module._get_fsdp_state()
        groups = list(state._fsdp_param_groups)
        saved.append((state, state._auto_reshard_after_forward, [(group, group.post_forward_mesh_info)
                                                                  for group in groups]))
    try:
        for module in modules:
            module.set_reshard_after_forward(False, recurse=False)
        for module in modules:
            module.unshard()
        yield True
    finally:
        for module in modules:
            module.reshard()
        for state, auto, groups in saved:
            state._auto_reshard_after_forward = auto
            for group, mesh_info in groups:
                group.post_forward_mesh_info = mesh_info


@contextlib.contextmanager
def policy_generator(trainer: GRPOTrainer, *, batch_size: int) -> Iterator[TransformersGenerator]:
    """The trainer's current policy as a :class:`TransformersGenerator` (unwrapped, eval mode, no grad; under FSDP2
    with its full parameters gathered, :func:`fsdp2_full_parameters`)."""
    model = trainer.model_wrapped
    with contextlib.ExitStack() as stack:
        # TRL calls transformers' deprecated checkpointing aliases on entering and on leaving (FutureWarnings)
        stack.enter_context(upstream_deprecations())
        unwrapped = stack.enter_context(unwrap_model_for_generation(
            model, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs))
        gathered = stack.enter_context(fsdp2_full_parameters(unwrapped))
        stack.enter_context(torch.no_grad())
        was_training = unwrapped.training
        # whole parameters on every rank (FSDP2 gathered here, ZeRO-3 by TRL): each rank generates on its own, so
        # transformers' synced_gpus (an all-reduce per decoding step) is off; ranks' turns may differ in number
        whole = gathered or (bool(getattr(trainer, "is_deepspeed_enabled", False))
                             and bool(trainer.args.ds3_gather_for_generation))
        try:
            yield TransformersGenerator((unwrapped, trainer.processing_class), batch_size=batch_size,
                                        synced_gpus=False if whole else None)
        finally:
            unwrapped.train(was_training)


class ComponentReward:
    """One reward component computed by the rollout function, handed to TRL as a reward function."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.__name__ = component

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        field = REWARD_FIELD_PREFIX + self.component
        if field not in kwargs:
            raise KeyError(f"the rollout function returned no {field!r} (use AgentRolloutFunction)")
        return [float(value) for value in kwargs[field]]


class AgentGRPOTrainer(GRPOTrainerHooks):
    """``GRPOTrainer`` with agent statistics in its logs and optional DAPO dynamic sampling (module docstring)."""

    def __init__(self, *args: Any, drop_uniform_groups: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drop_uniform_groups = drop_uniform_groups
        server = getattr(self.rollout_func, "policy_server", None)
        if server is not None and self.use_vllm:
            sync_every_replica(self, server.roots)  # TRL's server mode syncs only its vllm_server_base_url

    def record_rollout_stats(self, stats: dict[str, Ratio]) -> None:
        """Add ``(numerator, denominator)`` statistics, summed over processes, to the next logged metrics."""
        names = sorted(stats)
        local = torch.tensor([stats[name] for name in names], dtype=torch.float64, device=self.accelerator.device)
        total = self.accelerator.reduce(local, reduction="sum") if self.accelerator.num_processes > 1 else local
        for name, (numerator, denominator) in zip(names, total.tolist(), strict=True):
            if denominator > 0:
                self.log_metric(STAT_PREFIX + name, numerator / denominator)

    def record_judge_step_cost(self, local_usd: float) -> None:
        """Log ``judge_usage/step_cost_usd``: what every process's judges spent on this step (summed over
        processes)."""
        local = torch.tensor([local_usd], dtype=torch.float64, device=self.accelerator.device)
        total = self.accelerator.reduce(local, reduction="sum") if self.accelerator.num_processes > 1 else local
        self.log_metric("judge_usage/step_cost_usd", float(total.item()))

    def after_scoring(self, output: dict[str, Any]) -> None:
        if self.drop_uniform_groups and self.model.training:
            self._drop_uniform_groups(output)

    def _drop_uniform_groups(self, output: dict[str, Any]) -> None:
        """DAPO's dynamic sampling: groups whose advantages are all zero leave the loss, and the loss is normalized
        by the tokens that remain. Every rank joins the one collective (the recount), whatever it dropped: a rank
        that returned early while another gathered would hang NCCL (issue 43 N3)."""
        advantages = output["advantages"]
        size = self.num_generations
        if advantages.shape[0] % size:
            logger.warning("dynamic sampling skipped: %d local completions are not whole groups of %d",
                           advantages.shape[0], size)
        else:
            uniform = (advantages.view(-1, size).abs() < 1e-8).all(dim=1)
            self.log_metric("dapo/dropped_group_fraction", float(uniform.float().mean()), mode="train")
            if uniform.any() and not uniform.all():  # all uniform: nothing would remain (its loss is zero anyway)
                keep = (~uniform).repeat_interleave(size).to(output["completion_mask"].dtype).unsqueeze(1)
                output["completion_mask"] = output["completion_mask"] * keep
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()


def grpo_dataset(questions: Sequence[Question]) -> Any:
    """A ``datasets.Dataset`` with TRL's ``prompt`` column (the question text; duplicates by text dropped)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": question.question, "question_key": question.key,
                               "dataset": question.dataset, "golden_answers": list(question.golden_answers)}
                              for question in unique_questions(questions)])


def reference_dtype(dtype: str, trainer_args: Mapping[str, Any], *, full_parameters: bool) -> dict[str, Any]:
    """``model_init_kwargs`` holding a full-parameter run's reference model in the compute ``dtype`` (issue 43 N2).

    TRL builds the reference (``beta`` > 0) in the policy's dtype unless ``model_init_kwargs`` names one, and the
    policy's weights are fp32 masters; the reference only runs forward under autocast, so fp32 would double its
    memory for nothing. TRL uses ``model_init_kwargs`` only for the reference here (the policy is passed built).
    A ``dtype`` set in ``trainer_args.model_init_kwargs`` wins; LoRA has no reference copy."""
    if not full_parameters:
        return {}
    return {"model_init_kwargs": {"dtype": dtype, **(trainer_args.get("model_init_kwargs") or {})}}


def build_grpo_trainer(model: str | tuple[PreTrainedModel, PreTrainedTokenizerBase], questions: Sequence[Question],
                       rollout_function: AgentRolloutFunction, checkpoint_dir: str | Path, settings: GRPOSettings, *,
                       adapter_dir: str | Path | None = None, full_parameters: bool = False,
                       callbacks: list[TrainerCallback] | None = None,
                       trainer_args: Mapping[str, Any] | None = None) -> AgentGRPOTrainer:
    """An :class:`AgentGRPOTrainer` training a LoRA policy with ``rollout_function`` (see :func:`train_grpo_lora`).

    ``model`` is a registry spec or a loaded ``(model, tokenizer)``. ``adapter_dir`` continues training an
    existing adapter (e.g. the SFT one) instead of a fresh LoRA (``settings.lora``). ``full_parameters`` trains
    every weight instead (HiPRAG's setting); a given adapter is then merged into the model first. ``trainer_args``
    (``rl.backend.args``) are other ``GRPOConfig`` fields, passed through (:func:`check_grpo_args`).
    """
    trainer_args = check_grpo_args(trainer_args or {})
    from peft import LoraConfig

    from prorag.llm.registry import load_causal_lm

    ensure_one_device(settings.use_cpu, what="GRPO")
    server = rollout_function.policy_server
    if server is not None and not is_vllm_available():
        raise ImportError(f"a policy server ({server.base_url}) needs vllm installed (the GPU lock: make gpu-setup): "
                          "TRL pushes the trained weights to it through vLLM's client before every generation batch")
    vllm = ({"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": server.root}
            if server is not None else {})
    # The config before the model: under accelerate launch with ZeRO-3, creating it registers DeepSpeed's config
    # (zero3_init_flag), so from_pretrained then partitions the weights as it loads them instead of every rank
    # materialising the whole model in host memory first.
    config = GRPOConfig(**{
        **vllm,
        **settings.model_dump(include=set(GRPO_TRL_NAMES)),
        "output_dir": str(checkpoint_dir),
        "report_to": [],
        "bf16": bf16_compute(settings.dtype, settings.use_cpu, full_parameters=full_parameters),
        "fp16": False,
        "mask_truncated_completions": False,  # agent completions end with </answer>, not EOS
        "data_seed": settings.seed,
        "save_strategy": "steps",
        "activation_checkpointing": settings.gradient_checkpointing,
        "remove_unused_columns": False,
        "shuffle_dataset": True,
        **trainer_args,  # validated: no field set above but report_to
        **reference_dtype(settings.dtype, trainer_args, full_parameters=full_parameters),
    })
    # Full-parameter training keeps fp32 master weights (and fp32 AdamW states) and computes in bf16 under
    # autocast (mixed precision, as verl / DeepSpeed bf16 / FSDP do): an update of ~lr = 1e-6 is below half a
    # bf16 ulp of a typical weight, so pure-bf16 weights would barely move. LoRA keeps the frozen base in
    # ``dtype`` (PEFT holds the adapter in fp32).
    load_dtype = "float32" if full_parameters else settings.dtype
    policy, tokenizer = load_causal_lm(model, dtype=load_dtype) if isinstance(model, str) else model
    peft_config = None
    if full_parameters:
        if adapter_dir is not None:
            policy = merge_adapter(policy, adapter_dir)
        policy = fp32_master_weights(policy)
    elif adapter_dir is not None:
        policy = continue_adapter(policy, adapter_dir)
    else:
        lora = settings.lora
        peft_config = LoraConfig(r=lora.lora_r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                                 target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    # rollout_func is flagged experimental by TRL; the pinned TRL version is the one this module is tested with.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    score_labelled_positions_only()
    with upstream_deprecations():  # PEFT wraps the model: transformers' is_gradient_checkpointing FutureWarning
        return AgentGRPOTrainer(
            model=policy, args=config, processing_class=tokenizer, train_dataset=grpo_dataset(questions),
            reward_funcs=[ComponentReward(name) for name in rollout_function.reward_components],
            peft_config=peft_config, rollout_func=rollout_function, callbacks=callbacks,
            drop_uniform_groups=settings.drop_uniform_groups)


def train_grpo_lora(model: str | tuple[PreTrainedModel, PreTrainedTokenizerBase], questions: Sequence[Question],
                    rollout_function: AgentRolloutFunction, output_dir: str | Path, settings: GRPOSettings, *,
                    adapter_dir: str | Path | None = None, full_parameters: bool = False,
                    callbacks: list[TrainerCallback] | None = None,
                    trainer_args: Mapping[str, Any] | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Train with :func:`build_grpo_trainer`; save only the adapter, to ``output_dir / "adapter"``.

    Checkpoints go to ``output_dir / "checkpoints"`` every ``save_steps``. With ``settings.resume``, an unfinished
    run in the same ``output_dir`` continues from its last checkpoint (the step count, optimizer, scheduler and RNG
    states go on); a finished one is started afresh. The LLM judges account to ``output_dir / "judge_ledger"``
    (:data:`JUDGE_LEDGER`): their budget, usage and rate limit span every rank and restart of the run, and are reset
    only when a finished run is started afresh. Returns the adapter folder and ``log_history``.
    """
    from transformers.trainer_utils import get_last_checkpoint

    output = Path(output_dir)
    checkpoints = output / "checkpoints"
    trainer = build_grpo_trainer(model, questions, rollout_function, checkpoints, settings, adapter_dir=adapter_dir,
                                 full_parameters=full_parameters, callbacks=callbacks, trainer_args=trainer_args)
    if trainer.accelerator.is_main_process:  # under `accelerate launch` only the main process edits the folder
        if (output / COMPLETED_MARKER).exists():
            logger.info("%s holds a finished run: starting afresh", output)
            shutil.rmtree(checkpoints, ignore_errors=True)
            shutil.rmtree(output / JUDGE_LEDGER, ignore_errors=True)  # a new run, a new judge budget
            (output / COMPLETED_MARKER).unlink()
        checkpoints.mkdir(parents=True, exist_ok=True)
    trainer.accelerator.wait_for_everyone()
    last = get_last_checkpoint(str(checkpoints)) if settings.resume else None
    if last is not None:
        logger.info("resuming GRPO from %s", last)
    with use_ledger(output / JUDGE_LEDGER):  # one judge budget and rate limit for every rank and restart
        trainer.train(resume_from_checkpoint=last)
    adapter = output / "adapter"
    trainer.save_model(str(adapter))  # the adapter only (PEFT) or the full model, gathered under ZeRO-3
    if trainer.accelerator.is_main_process:
        if full_parameters:  # a loadable model folder: the rollouts load it as the model
            trainer.processing_class.save_pretrained(str(adapter))
        else:  # the adapter records its base by its portable name, not this machine's cache folder
            make_adapter_portable(adapter)
        (output / COMPLETED_MARKER).write_text(json.dumps({"global_step": trainer.state.global_step}))
    trainer.accelerator.wait_for_everyone()
    logger.info("saved the GRPO LoRA adapter to %s after %d steps", adapter, trainer.state.global_step)
    history = list(trainer.state.log_history)
    del trainer
    release_memory("GRPO")  # the policy, optimizer and activations' heap, before the next stage
    return adapter, history


class TRLBackend:
    """The ``trl`` trainer backend: TRL's ``GRPOTrainer`` (:class:`AgentGRPOTrainer`); ``rl.backend.args`` are
    other ``GRPOConfig`` fields. Rolls out in-process or through a policy server (TRL's vLLM server mode)."""

    name: Final = "trl"
    rollouts: Final = AgentRolloutFunction

    def check_args(self, args: Mapping[str, Any], where: str) -> dict[str, Any]:
        return check_grpo_args(args, where)

    def train(self, model: str, questions: Sequence[Question], rollouts: AgentRollouts, output_dir: str | Path,
              settings: GRPOSettings, *, args: Mapping[str, Any], adapter_dir: str | Path | None,
              full_parameters: bool, callbacks: list[Any]) -> tuple[Path, list[dict[str, Any]]]:
        if not isinstance(rollouts, AgentRolloutFunction):
            raise TypeError(f"the trl backend drives an AgentRolloutFunction, got {type(rollouts).__name__} (build "
                            "it with the backend's `rollouts` class)")
        return train_grpo_lora(model, questions, rollouts, output_dir, settings, adapter_dir=adapter_dir,
                               full_parameters=full_parameters, callbacks=callbacks, trainer_args=args)


TRL_BACKEND: Final = TRLBackend()
