"""How long one GRPO step of a GPU run takes, from stated per-token costs (not measured): printed before the run.

A step of TRL's synchronous GRPO runs, one after the other: the weight sync to every vLLM replica, the rollouts of
the step's ``C`` completions (``per_device_train_batch_size`` × ``gradient_accumulation_steps`` × ranks), the
judges, then training on them. With :class:`StatedCosts` (every number a stated assumption, printed beside the
result):

* **rollout concurrency** per replica ``K`` = min(the replica's share of the batch ``S = C / N``, the sequences its
  KV cache holds at full length, the requests the ranks send it: ranks × ``rl.generation_batch_size``);
  :func:`sized_concurrency` is what ``generation_batch_size`` should be for ``K`` to reach the first two;
* **decode**: a decode step of a replica reads the weights and the ``K`` sequences' KV cache once:
  ``latency = (weights + K × mean context × KV bytes per token) / (bandwidth × efficiency)``. The engine's turns run
  in lock-step: a turn ends with its longest completion, so each of the ``T = step_budget + 1`` turns takes
  ``max(S / K × mean tokens per turn, max_new_tokens_per_turn)`` decode steps;
* **prefill**: each replica's share of prompt and retrieved tokens (prefix caching: each once), 2 × parameters
  FLOP per token at the stated MFU;
* **judging**: calls per rollout (HiPRAG: one per step, ``step_budget``, split evenly over its over- and
  under-search judges; any other reward: one per judge), each endpoint at min(its ``requests_per_minute``, ranks ×
  ``max_concurrency`` / latency); endpoints one after the other;
* **training**: ``C`` × (prompt + passages + mean generated) × padding tokens, 6 forward-equivalents each (the old
  and reference log-probs, forward, the checkpointed recompute, a backward of two), 2 × parameters FLOP per forward
  per token, over the ranks at the stated MFU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

GIB: Final = float(2**30)


@dataclass(frozen=True)
class StatedCosts:
    """The per-token costs the estimate rests on (stated, not measured on a GPU)."""

    hbm_bandwidth: float = 3.35e12
    """B/s of one GPU's memory (H100 SXM)."""
    decode_efficiency: float = 0.5
    """Share of that bandwidth a vLLM decode step achieves."""
    peak_flops: float = 989e12
    """Dense bf16 FLOP/s of one GPU (H100 SXM)."""
    mfu: float = 0.4
    """Share of ``peak_flops`` training and prefill achieve."""
    generated_share: float = 0.25
    """Mean generated tokens of a rollout, as a share of ``max_total_new_tokens``."""
    padding: float = 1.3
    """Trained tokens over real ones (a micro-batch is padded to its longest sequence)."""
    forward_equivalents: int = 6
    """Forward passes' worth of compute per trained token (module docstring)."""
    judge_latency_s: float = 2.0
    """Seconds of one judge call."""
    sync_bandwidth: float = 25e9
    """B/s of TRL's NCCL weight transfer to one replica."""


@dataclass(frozen=True)
class RolloutShape:
    """What the estimate needs of a run (:func:`prorag.scale.preflight.grpo_step_time` reads it from the
    parameters)."""

    parameters: float
    kv_bytes_per_token: float
    completions: int
    replicas: int
    ranks: int
    concurrency_per_rank: int
    step_budget: int
    top_k: int
    max_new_tokens_per_turn: int
    max_total_new_tokens: int
    prompt_tokens: int
    passage_tokens: int
    server_memory_gib: float
    """What one replica may take: ``gpu_memory_gib`` × ``gpu_memory_utilization``."""
    judges: tuple[tuple[str, float, int, int], ...] = ()
    """Per judge endpoint: name, calls per rollout, ``requests_per_minute``, ``max_concurrency``."""


@dataclass(frozen=True)
class StepTime:
    """One GRPO step's parts, in seconds, and the rollout concurrency behind them."""

    sync: float
    rollouts: float
    judging: float
    training: float
    concurrency: int
    """Sequences a replica decodes at once."""
    kv_sequences: int
    """Sequences at full length its KV cache holds."""
    sized: int
    """``generation_batch_size`` for that concurrency (:func:`sized_concurrency`)."""
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.sync + self.rollouts + self.judging + self.training


def sized_concurrency(share: int, kv_sequences: int, ranks: int) -> int:
    """Requests each rank keeps in flight per replica so that a replica decodes ``min(share, kv_sequences)``
    sequences at once."""
    return max(1, math.ceil(min(share, kv_sequences) / ranks))


def estimate_step(shape: RolloutShape, costs: StatedCosts = StatedCosts()) -> StepTime:
    """One step's time (module docstring)."""
    weights = 2.0 * shape.parameters
    turns = shape.step_budget + 1
    passages = shape.step_budget * shape.top_k * shape.passage_tokens
    generated = costs.generated_share * shape.max_total_new_tokens
    full_length = shape.prompt_tokens + passages + shape.max_total_new_tokens
    mean_context = shape.prompt_tokens + passages / 2 + generated / 2
    kv_budget = shape.server_memory_gib * GIB - weights
    kv_sequences = max(1, int(kv_budget // (full_length * shape.kv_bytes_per_token)))
    share = math.ceil(shape.completions / shape.replicas)
    concurrency = max(1, min(share, kv_sequences, shape.ranks * shape.concurrency_per_rank))
    bandwidth = costs.hbm_bandwidth * costs.decode_efficiency
    latency = (weights + concurrency * mean_context * shape.kv_bytes_per_token) / bandwidth
    steps_per_turn = max(share / concurrency * generated / turns, shape.max_new_tokens_per_turn)
    decode = turns * steps_per_turn * latency
    prefill = share * (shape.prompt_tokens + passages) * 2 * shape.parameters / (costs.peak_flops * costs.mfu)
    judging = 0.0
    for _, per_rollout, per_minute, max_concurrency in shape.judges:
        rate = min(per_minute / 60.0, shape.ranks * max_concurrency / costs.judge_latency_s)
        judging += shape.completions * per_rollout / rate
    tokens = shape.completions * (shape.prompt_tokens + passages + generated) * costs.padding
    training = tokens * costs.forward_equivalents * 2 * shape.parameters / (
        shape.ranks * costs.peak_flops * costs.mfu)
    sync = shape.replicas * weights / costs.sync_bandwidth
    return StepTime(sync, decode + prefill, judging, training, concurrency, kv_sequences,
                    sized_concurrency(share, kv_sequences, shape.ranks),
                    {"decode": decode, "prefill": prefill, "decode_step_s": latency, "steps_per_turn": steps_per_turn,
                     "trained_tokens": tokens})


def describe(step: StepTime, shape: RolloutShape, *, steps: int | None = None) -> str:
    """The estimate as the preflight prints it."""
    minutes = {name: getattr(step, name) / 60 for name in ("sync", "rollouts", "judging", "training", "total")}
    days = f", {step.total * steps / 86_400:.1f} days for {steps} steps" if steps else ""
    return (f"GRPO step time (stated per-token costs, not measured; docs/scaling.md): weight sync "
            f"{minutes['sync']:.1f} min + rollouts {minutes['rollouts']:.1f} min on {shape.replicas} vLLM "
            f"replica(s) + judging {minutes['judging']:.1f} min + training {minutes['training']:.1f} min on "
            f"{shape.ranks} rank(s) = {minutes['total']:.1f} min per step{days}; {shape.completions:,} completions, "
            f"{step.concurrency} decoded at once per replica (its KV cache holds {step.kv_sequences} at full length)")
