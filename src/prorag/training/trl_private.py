"""Every use of TRL's private API, in one place, written against the pinned TRL version (pyproject: ``trl==1.16.0``).

TRL has no public hook for these, so the GRPO trainer reaches into ``GRPOTrainer`` here and nowhere else:

* ``_generate_and_score_completions`` — wrapped to post-process a scored batch (DAPO's dynamic sampling, which
  TRL 1.16 lacks); the batch keys it edits (``advantages``, ``completion_mask``, ``tool_mask``,
  ``num_items_in_batch``) are that method's output in 1.16;
* ``_metrics[mode][name]`` — TRL's per-step metric buffer, which its ``log`` averages and reports;
* ``vllm_generation`` (``trl.generation.vllm_generation.VLLMGeneration``) and its ``vllm_client`` — TRL's server
  mode talks to one vLLM server; :class:`ReplicaWeightSync` keeps several in sync (data-parallel replicas) by
  running TRL's own ``sync_weights`` once per server with that server's client swapped in;
* ``trl.trainer.utils._use_triton`` — read by TRL's fused LM head (SFT, GRPO, DPO) to decide whether it scores
  only the labelled positions: :func:`score_labelled_positions_only` makes that true on the CPU.

A TRL upgrade re-checks this module (and tests/training/test_grpo.py) first; a different installed version logs a
warning at import.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

import trl
import trl.trainer.utils as trl_trainer_utils
from trl import GRPOTrainer

from prorag.llm.upstream_warnings import upstream_deprecations

logger = logging.getLogger(__name__)

PINNED_TRL_VERSION: Final = "1.16.0"

if trl.__version__ != PINNED_TRL_VERSION:
    logger.warning("TRL %s is installed; prorag.training.trl_private is written against TRL %s",
                   trl.__version__, PINNED_TRL_VERSION)


class GRPOTrainerHooks(GRPOTrainer):
    """``GRPOTrainer`` with two hooks over its private API: :meth:`after_scoring` and :meth:`log_metric`."""

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # TRL's disable_gradient_checkpointing around the old log-probabilities calls transformers' deprecated
        # checkpointing aliases (three FutureWarnings on the terminal of make train)
        with upstream_deprecations():
            output = super()._generate_and_score_completions(inputs)
        self.after_scoring(output)
        return output

    def after_scoring(self, output: dict[str, Any]) -> None:
        """Edit a scored generation batch in place before the loss sees it (no-op here)."""

    def log_metric(self, name: str, value: float, *, mode: str | None = None) -> None:
        """Add ``value`` to the metrics TRL averages and logs at the next logging step."""
        self._metrics[mode or ("train" if self.model.training else "eval")][name].append(value)


class ReplicaWeightSync:
    """TRL's ``VLLMGeneration`` (server mode) pushing the weights to every replica, not only the first.

    ``generation`` was built by ``GRPOTrainer`` for the first server (``vllm_server_base_url``) and holds, on the
    main process, that server's client and NCCL group. ``clients`` are every server's clients on the main process
    (the first one ``generation.vllm_client``), none elsewhere. :meth:`sync_weights` runs TRL's ``sync_weights``
    once per replica with that replica's client swapped in: every rank walks the parameters each time (under ZeRO-3
    they are gathered, a collective), the main process streams them to that replica and resets its prefix cache.
    Anything else is TRL's ``VLLMGeneration``'s."""

    def __init__(self, generation: Any, replicas: int, clients: Sequence[Any] = ()) -> None:
        if clients and len(clients) != replicas:
            raise ValueError(f"{len(clients)} vLLM clients for {replicas} replicas")
        self._generation = generation
        self.replicas = replicas
        self.clients = list(clients)

    def sync_weights(self) -> None:
        """Push the current weights to every replica (class docstring)."""
        first = getattr(self._generation, "vllm_client", None)
        try:
            for index in range(self.replicas):
                if self.clients:
                    self._generation.vllm_client = self.clients[index]
                self._generation.sync_weights()
        finally:
            if first is not None:
                self._generation.vllm_client = first

    def __getattr__(self, name: str) -> Any:
        return getattr(self._generation, name)


def sync_every_replica(trainer: GRPOTrainer, roots: Sequence[str]) -> None:
    """Make ``trainer`` (TRL's server mode, built for ``roots[0]``) keep every server of ``roots`` in sync: the main
    process opens a ``VLLMClient`` and an NCCL group on ``vllm_group_port + i`` for each further server ``i``."""
    if len(roots) < 2:
        return
    generation, args = trainer.vllm_generation, trainer.args
    clients: list[Any] = []
    if trainer.accelerator.is_main_process:
        from trl.generation.vllm_client import VLLMClient

        clients = [generation.vllm_client]
        for index, root in enumerate(roots[1:], start=1):
            client = VLLMClient(base_url=root, group_port=args.vllm_group_port + index,
                                connection_timeout=args.vllm_server_timeout)
            client.init_communicator(device=trainer.accelerator.device)
            clients.append(client)
    trainer.vllm_generation = ReplicaWeightSync(generation, len(roots), clients)


def score_labelled_positions_only() -> None:
    """Make TRL's fused LM head score only the positions that carry a label on the CPU too (idempotent).

    TRL's fused head (``add_fused_lm_head``: SFT, GRPO and DPO) projects only the labelled positions onto the
    vocabulary when Triton runs (CUDA, XPU); on other devices it projects every position, so that compiled tile
    shapes stay fixed (Neuron), and masks the result. The CPU compiles nothing, and SFT labels a small share of the
    positions (make train: 15.6k of 120.7k tokens, 13%), so the head did 7.7x the work, in float32: 24% of SFT's
    time (py-spy). The choice reads this module's ``_use_triton`` name; the kernel module keeps its own, so the CPU
    still runs TRL's torch tiles. The loss and gradients are those of the full scoring (masked positions add 0).
    """
    upstream = trl_trainer_utils._use_triton
    if getattr(upstream, "scores_labelled_positions_on_cpu", False):
        return

    def labelled_only(device: Any) -> bool:
        return device.type == "cpu" or upstream(device)

    labelled_only.scores_labelled_positions_on_cpu = True  # type: ignore[attr-defined]
    trl_trainer_utils._use_triton = labelled_only
