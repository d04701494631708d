"""GPU memory arithmetic of a one-node run: refuse, before any work, what cannot fit the declared GPUs.

Estimates (GiB = 2**30 bytes), per process, from the model's size and the configured batch:

* **Full-parameter training** (mixed precision, :mod:`prorag.training.devices`): fp32 master weights (4 B), fp32
  gradients (4 B) and AdamW's two fp32 moments (8 B) — 16 B per parameter — plus the reference model when the KL
  coefficient ``beta`` > 0 (TRL loads a second copy for a full model; held in the compute dtype, 2 B in bf16:
  :func:`prorag.training.trl_grpo.reference_dtype`). Autocast over fp32 weights (one process, DDP) also caches a
  bf16 copy of every weight a micro-batch's forward uses until its autocast region ends: 2 B more per parameter.
* **LoRA training**: the frozen base in bf16 (2 B per parameter); the adapter and its optimizer are negligible, and
  PEFT's reference is the base with the adapter disabled (no copy).
* **Activations**: with gradient checkpointing, every layer's input is kept — ``micro-batch × sequence × hidden ×
  2 B × layers``, 4 B under autocast over fp32 weights, where the embeddings, RMSNorm and residual adds stay fp32 —
  plus one layer recomputed in full (≈ 34 × hidden B per token, Korthikanti et al. 2022); without it, every
  layer's. Trainers that materialise the logits (SFT, DPO) add ``micro-batch × sequence × vocabulary × 4 B``;
  TRL's GRPO projects through a fused LM head in tiles (:data:`FUSED_HEAD_TILE`) and keeps the head's input.
* **Sharded over a launch** (``launch.mode: accelerate``, :class:`Sharding`): ZeRO-2 splits gradients and
  optimizer moments over the ranks (each keeps its fp32 weights: 4 B + 12 B / ranks); ZeRO-3 and FSDP2 split
  weights too (16 B / ranks, and the frozen base of LoRA 2 B / ranks); DDP splits nothing. Activations are per rank.
* **A vLLM server** needs its weights (2 B per parameter in bf16, 1 in FP8) split over its tensor-parallel GPUs
  within ``gpu_memory_utilization`` of each, with at least :data:`KV_RESERVE` of it left for the KV cache.

A refusal names the knob that fixes it. Models are known by name (:data:`MODELS`) or by a local ``config.json``; a
model whose size cannot be found is reported and not checked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # the arithmetic imports without pydantic: benchmarks/gpu_check.py runs where only torch is
    from prorag.scale.placement import PlacementSpec

logger = logging.getLogger(__name__)

GIB: Final = float(2**30)
HEADROOM: Final = 0.92
"""Share of a GPU a trainer may plan to use (the CUDA context, the allocator's fragmentation and NCCL take the
rest)."""
KV_RESERVE: Final = 0.15
"""Share of a vLLM server's memory budget that must stay free of weights for the KV cache."""
FUSED_HEAD_TILE: Final = (4096, 32768)
"""Tokens × vocabulary columns of one fp32 tile of TRL's fused LM head (``trl.kernels.chunked_logprob``)."""


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a model."""

    parameters: float
    hidden: int
    layers: int
    vocabulary: int
    kv_width: int = 0
    """Key-value heads × head size (grouped-query attention); 0: ``hidden`` (one KV head per query head)."""

    @property
    def kv_bytes_per_token(self) -> float:
        """bf16 keys and values of one token over every layer (vLLM's KV cache)."""
        return 2.0 * self.layers * (self.kv_width or self.hidden) * 2.0


MODELS: Final[dict[str, ModelShape]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape(0.494e9, 896, 24, 151_936, 2 * 64),
    "Qwen/Qwen2.5-1.5B-Instruct": ModelShape(1.54e9, 1536, 28, 151_936, 2 * 128),
    "Qwen/Qwen2.5-3B-Instruct": ModelShape(3.09e9, 2048, 36, 151_936, 2 * 128),
    "Qwen/Qwen2.5-7B-Instruct": ModelShape(7.62e9, 3584, 28, 152_064, 4 * 128),
    "Qwen/Qwen2.5-14B-Instruct": ModelShape(14.8e9, 5120, 48, 152_064, 8 * 128),
    "meta-llama/Meta-Llama-3-8B-Instruct": ModelShape(8.03e9, 4096, 32, 128_256, 8 * 128),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ModelShape(235.1e9, 4096, 94, 151_936, 4 * 128),
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": ModelShape(235.1e9, 4096, 94, 151_936, 4 * 128),
}
"""Sizes from the models' ``config.json`` (parameters as published)."""


class MemoryPlanError(ValueError):
    """A declared process cannot fit its GPU(s)."""


def model_shape(model: str) -> ModelShape | None:
    """:data:`MODELS`, else a local folder's ``config.json`` (parameters estimated from its shapes), else None."""
    if model in MODELS:
        return MODELS[model]
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    hidden, layers = int(data["hidden_size"]), int(data["num_hidden_layers"])
    vocabulary = int(data.get("vocab_size", 32_000))
    intermediate = int(data.get("intermediate_size", 4 * hidden))
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate
    heads = int(data.get("num_attention_heads", 1))
    kv_width = int(data.get("num_key_value_heads", heads)) * int(data.get("head_dim") or hidden // heads)
    return ModelShape(float(layers * per_layer + 2 * vocabulary * hidden), hidden, layers, vocabulary, kv_width)


@dataclass(frozen=True)
class Sharding:
    """How a launch splits a trainer's states over its ``ranks``: ``stage`` 0 (one process, DDP), 2 (ZeRO-2:
    gradients and optimizer) or 3 (ZeRO-3, FSDP2: parameters too)."""

    ranks: int = 1
    stage: int = 0

    def states_bytes(self, full_parameters: bool, reference_copy: bool, reference_bytes: float = 2.0) -> float:
        """Bytes per parameter of one rank (module docstring), autocast's weight copies left out."""
        shared = reference_bytes if reference_copy else 0.0
        if not full_parameters:
            frozen = 2.0 + shared
            return frozen / self.ranks if self.stage >= 3 else frozen
        if self.stage >= 3:
            return (16.0 + shared) / self.ranks
        if self.stage == 2:
            return 4.0 + 12.0 / self.ranks + shared
        return 16.0 + shared

    @property
    def autocast(self) -> bool:
        """Mixed precision runs as torch autocast over fp32 weights (one process, DDP); DeepSpeed and FSDP2 compute
        with bf16 weights of their own instead."""
        return self.stage == 0


UNSHARDED: Final = Sharding()


@dataclass(frozen=True)
class TrainerLoad:
    """One training stage as the memory check sees it; ``knob`` is the parameter prefix a refusal names."""

    stage: str
    knob: str
    model: str
    full_parameters: bool
    reference_copy: bool
    micro_batch: int
    sequence: int
    gradient_checkpointing: bool
    logits: str = "full"
    """``full`` (SFT, DPO: micro-batch × sequence × vocabulary fp32) or ``fused`` (TRL GRPO's tiled LM head)."""
    mixed_precision: bool = True
    """bf16 compute (``dtype: bfloat16``); False: fp32 throughout (a full-parameter reference is then fp32 too)."""


@dataclass(frozen=True)
class Estimate:
    """GiB of one stage: ``states`` (weights, gradients, optimizer, reference, autocast's weight copies) and
    ``activations``; ``parts`` names each term of both (module docstring)."""

    stage: str
    states: float
    activations: float
    parts: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def total(self) -> float:
        return self.states + self.activations


def estimate(load: TrainerLoad, shape: ModelShape, sharding: Sharding = UNSHARDED) -> Estimate:
    """The estimate of one training stage on one rank (module docstring)."""
    autocast = load.full_parameters and load.mixed_precision and sharding.autocast
    reference_bytes = 2.0 if load.mixed_precision else 4.0
    bytes_per_parameter = sharding.states_bytes(load.full_parameters, False)
    reference = sharding.states_bytes(load.full_parameters, load.reference_copy, reference_bytes) \
        - bytes_per_parameter
    tokens = load.micro_batch * load.sequence
    residual = 4.0 if autocast or (load.full_parameters and not load.mixed_precision) else 2.0
    kept_layers = shape.layers if load.gradient_checkpointing else 0
    recomputed = 1 if load.gradient_checkpointing else shape.layers
    if load.logits == "fused":
        head = min(tokens, FUSED_HEAD_TILE[0]) * min(shape.vocabulary, FUSED_HEAD_TILE[1]) * 4.0 \
            + tokens * shape.hidden * 4.0
    else:
        head = tokens * shape.vocabulary * 4.0
    parts = {"weights_gradients_optimizer": shape.parameters * bytes_per_parameter,
             "reference": shape.parameters * reference,
             "autocast_weights": shape.parameters * 2.0 if autocast else 0.0,
             "layer_inputs": tokens * shape.hidden * residual * kept_layers,
             "recomputed_layers": tokens * shape.hidden * 34.0 * recomputed,
             "lm_head": head}
    parts = {name: value / GIB for name, value in parts.items()}
    states = sum(parts[name] for name in ("weights_gradients_optimizer", "reference", "autocast_weights"))
    return Estimate(load.stage, states, sum(parts.values()) - states, parts)


def check_trainers(loads: list[TrainerLoad], placement: PlacementSpec,
                   sharding: Sharding = UNSHARDED) -> list[Estimate]:
    """Estimate every GPU stage on one rank; refuse the first that cannot fit ``placement.gpu_memory_gib`` (one
    process per GPU), naming the knob."""
    budget = placement.gpu_memory_gib * HEADROOM
    estimates = []
    for load in loads:
        shape = model_shape(load.model)
        if shape is None:
            logger.warning("memory check: the size of %s (%s) is unknown; %s is not checked", load.model, load.stage,
                           load.stage)
            continue
        found = estimate(load, shape, sharding)
        estimates.append(found)
        if found.total <= budget:
            continue
        where = "one GPU" if sharding.ranks == 1 else f"each of {sharding.ranks} ranks (stage {sharding.stage})"
        what = (f"{load.stage} needs about {found.total:.0f} GiB on {where} ({found.states:.0f} GiB of weights, "
                f"gradients, optimizer, reference and autocast's bf16 weight copies, {found.activations:.0f} GiB of "
                f"activations for {load.micro_batch} sequences of {load.sequence} tokens), more than {budget:.0f} GiB "
                f"({HEADROOM:.0%} of placement.gpu_memory_gib {placement.gpu_memory_gib:g})")
        if found.states > budget and sharding.stage >= 3:
            fix = (f"more ranks (launch.processes_per_machine, launch.num_machines), a LoRA adapter ({load.knob} "
                   "lora: true) or a smaller policy.model")
        elif found.states > budget:
            fix = (f"train a LoRA adapter ({load.knob} lora: true), a smaller policy.model, or shard the states "
                   "over several GPUs with launch.mode: accelerate and launch.config: zero3 (docs/distributed.md)")
        else:
            room = budget - found.states
            fitting = max(0, int(load.micro_batch * room / found.activations)) if found.activations else 0
            fix = (f"lower {load.knob}per_device_train_batch_size to at most {fitting} (raise "
                   f"gradient_accumulation_steps to keep the batch)" if fitting >= 1 else
                   f"shorten the sequences or turn on {load.knob}gradient_checkpointing")
        raise MemoryPlanError(f"{what}: {fix}")
    return estimates


def check_servers(placement: PlacementSpec) -> dict[str, float]:
    """GiB of weights per GPU of every declared server with a known model; refuse one whose weights leave less
    than :data:`KV_RESERVE` of its budget for the KV cache, naming its GPUs and utilisation."""
    per_gpu: dict[str, float] = {}
    for name, server in placement.active().items():
        if server.model is None or not server.gpus:
            continue
        shape = model_shape(server.model)
        if shape is None:
            logger.warning("memory check: the size of %s (servers.%s) is unknown; not checked", server.model, name)
            continue
        weights = shape.parameters * server.bytes_per_parameter / len(server.gpus) / GIB
        budget = placement.gpu_memory_gib * server.gpu_memory_utilization
        per_gpu[name] = weights
        if weights > budget * (1 - KV_RESERVE):
            raise MemoryPlanError(
                f"servers.{name} serves {server.model} over {len(server.gpus)} GPU(s): {weights:.0f} GiB of weights "
                f"per GPU against {budget:.0f} GiB (gpu_memory_utilization {server.gpu_memory_utilization:g} of "
                f"{placement.gpu_memory_gib:g} GiB), leaving under {KV_RESERVE:.0%} for the KV cache: give "
                f"placement.servers.{name}.gpus more GPUs (tensor parallel), or serve an FP8 checkpoint "
                "(bytes_per_parameter: 1)")
    return per_gpu


