"""Before the first node of a GPU run: placement, one GPU for the trainer, memory of every process.

:func:`preflight` is what the run's hook calls with the whole parameter tree
(:class:`prorag.hooks.preflight.GpuPreflightHook`);
:func:`trainer_loads` estimates each trainer block the recipes declare (:data:`TrainerBlocks`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prorag.scale.memory import (
    UNSHARDED,
    Estimate,
    Sharding,
    TrainerLoad,
    check_servers,
    check_trainers,
    model_shape,
)
from prorag.scale.placement import PlacementError, PlacementSpec, check_placement, select_trainer_gpu
from prorag.scale.step_time import RolloutShape, StepTime, describe, estimate_step

if TYPE_CHECKING:
    from prorag.training.launch import Stage

logger = logging.getLogger(__name__)

PROMPT_TOKENS = 1024
"""The rendered prompt (instructions, few-shot examples, question) of an agent rollout, in tokens."""
PASSAGE_TOKENS = 160
"""One retrieved passage inserted into a rollout (about 100 words)."""


def _get(tree: Any, dotted: str, default: Any = None) -> Any:
    value = tree
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return default
        value = value[part]
    return value


def _rollout_tokens(agent: Mapping[str, Any], top_k: int) -> int:
    return (PROMPT_TOKENS + int(agent.get("max_total_new_tokens", 1024))
            + int(agent.get("step_budget", 4)) * top_k * PASSAGE_TOKENS)


TrainerBlocks = Mapping[str, "Stage"]
"""Each trainer block, a dotted path from a stage block (``tearag.ip_dpo.trainer``), with the algorithm it trains:
the recipes declare them (:attr:`prorag.recipes.Recipe.trainers`), the application passes them in
(:func:`prorag.methods.trainer_blocks`)."""


def trainer_loads(parameters: Mapping[str, Any], trainers: TrainerBlocks) -> list[TrainerLoad]:
    """Every training stage of ``parameters`` that trains on a GPU (``use_cpu: false``), as the memory check sees
    it: the top-level trainer blocks (with the shared agent) and each ``methods`` entry's (with the method's agent;
    a stage identical to the shared one is checked once)."""
    model = str(_get(parameters, "policy.model", ""))
    loads = _stage_loads(parameters, _get(parameters, "agent", {}) or {}, model, "", trainers)
    for name, method in (_get(parameters, "methods", {}) or {}).items():
        if not isinstance(method, Mapping):
            continue
        for load in _stage_loads(method.get("stages") or {}, method.get("agent") or {}, model,
                                 f"methods.{name}.stages.", trainers):
            if not any(_same(load, seen) for seen in loads):
                loads.append(load)
    return loads


def _same(first: TrainerLoad, second: TrainerLoad) -> bool:
    """The same load whatever parameter prefix names it."""
    return replace(first, knob="") == replace(second, knob="")


def _stage_block(path: str) -> str:
    """The stage block a trainer block belongs to: ``rl`` for ``rl.trainer``, ``tearag.sft`` for itself."""
    return path.removesuffix(".trainer")


def _default_batch(algorithm: Stage) -> int:
    """The trainer schema's ``per_device_train_batch_size`` where a block sets none."""
    from prorag.training.config import GRPOSettings, SFTSettings
    from prorag.training.dpo import DPOTrainingConfig

    schema = {"sft": SFTSettings, "dpo": DPOTrainingConfig, "grpo": GRPOSettings}[algorithm]
    return int(schema.model_fields["per_device_train_batch_size"].default)


def _stage_loads(blocks: Mapping[str, Any], agent: Mapping[str, Any], model: str, knob: str,
                 trainers: TrainerBlocks) -> list[TrainerLoad]:
    loads: list[TrainerLoad] = []
    for path, algorithm in trainers.items():
        settings = _get(blocks, path)
        if not isinstance(settings, Mapping) or settings.get("use_cpu") is not False:
            continue
        block = _stage_block(path)
        stage, where = block.replace(".", "_"), f"{knob}{path}."
        batch = int(settings.get("per_device_train_batch_size", _default_batch(algorithm)))
        if algorithm == "grpo":
            rl = _get(blocks, block, {}) or {}
            full = not rl.get("lora", True)
            loads.append(TrainerLoad(stage, where, model, full, full and float(settings.get("beta", 0.0)) > 0,
                                     batch, _rollout_tokens(agent, int(_get(rl, "retriever.top_k", 3))),
                                     bool(settings.get("gradient_checkpointing", False)), logits="fused",
                                     mixed_precision=settings.get("dtype", "bfloat16") == "bfloat16"))
            continue
        pairs = 2 if algorithm == "dpo" else 1  # DPO runs chosen and rejected in one batch
        loads.append(TrainerLoad(stage, where, model, False, False, pairs * batch,
                                 int(settings.get("max_length") or _rollout_tokens(agent, 3)),
                                 bool(settings.get("gradient_checkpointing", False))))
    return loads


@dataclass(frozen=True)
class Preflight:
    """What the checks found: the placement, each training stage's estimate, each server's weights per GPU, and
    each GPU GRPO stage's step time (by its parameter block: ``rl``, ``methods.<name>.stages.rl``)."""

    placement: PlacementSpec | None
    trainers: list[Estimate]
    servers: dict[str, float]
    step_times: dict[str, tuple[RolloutShape, StepTime]] = field(default_factory=dict)


def _judges(reward: Mapping[str, Any], step_budget: int) -> tuple[tuple[str, float, int, int], ...]:
    """The ``llm`` judges a reward calls with their calls per rollout (HiPRAG: one per step, half to each of its
    over- and under-search judges; any other reward: its ``answer_judge``, once), ``requests_per_minute`` and
    ``max_concurrency``."""
    hiprag = reward.get("kind") == "hiprag"
    used = ("over_search_judge", "under_search_judge") if hiprag else ("answer_judge",)
    judges = {name: reward[name] for name in used
              if isinstance(reward.get(name), Mapping) and reward[name].get("kind") == "llm"}
    per_rollout = step_budget / 2 if hiprag else 1.0
    return tuple((str(judge.get("model", name)), per_rollout, int(judge.get("requests_per_minute") or 10**9),
                  int(judge.get("max_concurrency") or 16)) for name, judge in judges.items())


def grpo_step_times(parameters: Mapping[str, Any], placement: PlacementSpec, sharding: Sharding | None,
                    trainers: TrainerBlocks) -> dict[str, tuple[RolloutShape, StepTime]]:
    """The step time of every GRPO stage that trains on a GPU and rolls out through policy servers
    (:mod:`prorag.scale.step_time`), by its parameter block."""
    grpo = [_stage_block(path) for path, algorithm in trainers.items() if algorithm == "grpo"]
    blocks = [(stage, _get(parameters, stage), parameters.get("agent"), parameters.get("reward")) for stage in grpo]
    for name, method in (_get(parameters, "methods", {}) or {}).items():
        if isinstance(method, Mapping):
            blocks.extend((f"methods.{name}.stages.{stage}", _get(method, f"stages.{stage}"), method.get("agent"),
                           method.get("reward")) for stage in grpo)
    shape = model_shape(str(_get(parameters, "policy.model", "")))
    found: dict[str, tuple[RolloutShape, StepTime]] = {}
    for where, rl, agent, reward in blocks:
        trainer = _get(rl, "trainer", {}) or {}
        urls = _get(rl, "policy_server.base_url")
        if shape is None or trainer.get("use_cpu") is not False or not urls:
            continue
        urls = [urls] if isinstance(urls, str) else list(urls)
        ports = {server.port: server for server in placement.active().values()}
        first = ports.get(int(urls[0].rstrip("/").rsplit(":", 1)[-1])) if urls[0].count(":") == 2 else None
        utilization = first.gpu_memory_utilization if first is not None else 0.9
        agent = agent or {}
        ranks = (sharding or UNSHARDED).ranks
        step_budget = int(agent.get("step_budget", 4))
        rollout = RolloutShape(
            parameters=shape.parameters, kv_bytes_per_token=shape.kv_bytes_per_token,
            completions=int(trainer.get("per_device_train_batch_size", 4))
            * int(trainer.get("gradient_accumulation_steps", 1)) * ranks,
            replicas=len(urls), ranks=ranks, concurrency_per_rank=int(rl.get("generation_batch_size", 8)),
            step_budget=step_budget, top_k=int(_get(rl, "retriever.top_k", 3)),
            max_new_tokens_per_turn=int(agent.get("max_new_tokens_per_turn", 256)),
            max_total_new_tokens=int(agent.get("max_total_new_tokens", 1024)), prompt_tokens=PROMPT_TOKENS,
            passage_tokens=PASSAGE_TOKENS, server_memory_gib=placement.gpu_memory_gib * utilization,
            judges=_judges(reward or {}, step_budget))
        step = estimate_step(rollout)
        if any((rollout, step) == seen for seen in found.values()):
            continue  # a method's stage identical to the shared one
        found[where] = (rollout, step)
        logger.info("%s: %s", where, describe(step, rollout, steps=trainer.get("max_steps")))
        if rollout.concurrency_per_rank < step.sized:
            logger.warning("%s.generation_batch_size is %d: each rank keeps that many requests in flight per "
                           "replica, so a replica decodes %d sequences at once; %d would fill its KV cache (%d)",
                           where, rollout.concurrency_per_rank, step.concurrency, step.sized, step.kv_sequences)
    return found


def launch_sharding(parameters: Mapping[str, Any]) -> Sharding | None:
    """The sharding of ``launch`` when the training nodes run under ``accelerate launch`` (started by the node or,
    ``external``, by the scheduler); None when they train in the ``kedro run`` process."""
    from prorag.training.launch import LaunchSettings, sharding_stage

    raw = parameters.get("launch")
    if not isinstance(raw, Mapping) or raw.get("mode", "in_process") == "in_process":
        return None
    settings = LaunchSettings.model_validate(raw)
    return Sharding(ranks=settings.world_size, stage=sharding_stage(settings.config))


def check_launch_gpus(parameters: Mapping[str, Any], placement: PlacementSpec) -> None:
    """The training ranks of a launch take ``launch.gpu_ids`` of this machine: refuse ids that do not exist, that a
    server holds, or whose count is not ``processes_per_machine``; without ids every visible GPU is taken, which
    collides with any declared server's GPUs."""
    from prorag.training.launch import LaunchSettings

    launch = LaunchSettings.model_validate(parameters["launch"])
    processes, ids = launch.processes_per_machine, launch.gpu_ids
    if ids is None:
        servers = placement.claim_gpus(placement.server_gpus(during_training=True))
        if servers:
            free = [gpu for gpu in range(placement.gpus_per_node) if gpu not in servers]
            raise PlacementError(
                f"launch.gpu_ids is unset, so the {processes} training processes would take every visible GPU, "
                f"including the servers' {sorted(servers)}: set launch.gpu_ids to {processes} of the free GPUs "
                f"{free}")
        return
    if len(ids) != processes:
        raise PlacementError(f"launch.gpu_ids names {len(ids)} GPU(s) for launch.processes_per_machine {processes}: "
                             "one training process per GPU")
    try:
        placement.claim_gpus([*placement.server_gpus(during_training=True), ("launch.gpu_ids", list(ids))])
    except ValueError as error:
        raise PlacementError(str(error)) from error


def preflight(parameters: Mapping[str, Any], trainers: TrainerBlocks) -> Preflight:
    """Refuse, before any work, a run whose placement collides, whose trainer would see several GPUs, or whose
    processes cannot fit their GPUs (:mod:`prorag.scale.placement`, :mod:`prorag.scale.memory`). A run without a
    ``placement`` (the CPU default) only gets the one-GPU check of its GPU trainers.

    Under ``launch.mode: accelerate`` the training nodes do not train in this process: it is not narrowed to one GPU
    (the launch takes ``launch.gpu_ids``, checked against the servers' GPUs), and each stage is estimated per rank
    with the launch's sharding (ZeRO-2 / ZeRO-3 / FSDP2). ``trainers``: where the trainer blocks are
    (:data:`TrainerBlocks`)."""
    placement = check_placement(parameters)
    loads = trainer_loads(parameters, trainers)
    sharding = launch_sharding(parameters)
    if sharding is None:
        select_trainer_gpu(placement, training_on_gpu=bool(loads))
    if placement is None:
        return Preflight(None, [], {})
    if sharding is not None:
        check_launch_gpus(parameters, placement)
    servers = check_servers(placement)
    estimates = check_trainers(loads, placement, sharding or UNSHARDED)
    where = f"GPU {placement.trainer_gpu}" if sharding is None else f"each of {sharding.ranks} ranks"
    for found in estimates:
        logger.info("memory plan: %s about %.0f GiB on %s", found.stage, found.total, where)
    return Preflight(placement, estimates, servers, grpo_step_times(parameters, placement, sharding, trainers))
