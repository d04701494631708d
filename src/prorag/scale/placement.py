"""Which GPU and port each process of a one-node run uses (``placement``), checked before any work.

``placement`` (conf/gpu/parameters.yml) declares the node (``gpus_per_node``, ``gpu_memory_gib``), the GPU of the
``kedro run`` process that trains (``trainer_gpu``) and every server the run talks to (``servers``: GPUs, port,
the model it serves, ``gpu_memory_utilization``). :func:`check_placement` refuses

* a GPU used by two of them (vLLM takes ``gpu_memory_utilization`` of a GPU for itself; NCCL refuses two ranks
  on one GPU, so TRL's trainer and its vLLM server cannot share one), a GPU the node does not have; a server the
  run starts only once training has ended (``after_training``) may take the trainers' GPUs;
* a port used twice (the NCCL weight-transfer port ``nccl_port`` included, and ``nccl_port + i`` of the i-th
  replica when ``rl.policy_server.base_url`` lists several servers);
* a loopback URL in the parameters (``base_url``, ``retrieval_url``, ``policy_server.base_url`` or each URL of its
  list…) whose port no server declares, or that asks a declared server for a model it does not serve.

:func:`select_trainer_gpu` makes the ``kedro run`` process see exactly ``trainer_gpu`` (``CUDA_VISIBLE_DEVICES``)
when CUDA is not initialised yet, and otherwise refuses with the instruction.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

from pydantic import Field, model_validator

from prorag.config import StrictModel

logger = logging.getLogger(__name__)

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
URL_KEYS = ("base_url", "retrieval_url")


class PlacementError(ValueError):
    """A placement that cannot run: two processes on one GPU or port, or a URL no declared server answers."""


class ServerPlacement(StrictModel):
    """One server of the node: its GPUs, its port and the model it serves (None: any, or not a model server)."""

    gpus: list[int] = Field(default_factory=list)
    port: int = Field(ge=1, le=65535)
    model: str | None = None
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """vLLM's ``--gpu-memory-utilization``: the share of each of its GPUs it takes (weights + KV cache)."""
    bytes_per_parameter: float = Field(default=2.0, gt=0)
    """2 for bf16 weights, 1 for an FP8 checkpoint."""
    after_training: bool = False
    """Started by the run once training has ended (``policy.trained_server.launch``): it may take the trainers'
    GPUs (``trainer_gpu``, ``launch.gpu_ids``), never another server's."""


class PlacementSpec(StrictModel):
    """The node and the placement of every process on it (module docstring)."""

    gpus_per_node: int = Field(default=8, ge=1)
    gpu_memory_gib: float = Field(default=80.0, gt=0)
    """Memory of one GPU (H100 SXM: 80 GB, shown as about 79 GiB)."""
    trainer_gpu: int | None = Field(default=None, ge=0)
    """The GPU the ``kedro run`` process trains on; None: CPU only, or decided by whoever starts the run."""
    nccl_port: int = Field(default=51216, ge=1, le=65535)
    """TRL's ``vllm_group_port``: the NCCL weight transfer from the trainer to the RL vLLM server."""
    servers: dict[str, ServerPlacement | None] = Field(default_factory=dict)
    """By role; null removes a server an earlier conf layer declared (an experiment's params merge key by key)."""

    def active(self) -> dict[str, ServerPlacement]:
        """The declared servers (the null entries left out)."""
        return {name: server for name, server in self.servers.items() if server is not None}

    def server_gpus(self, *, during_training: bool = False) -> list[tuple[str, list[int]]]:
        """``(servers.<name>.gpus, its GPUs)`` of every declared server (``during_training``: those up while the
        trainers run, i.e. not ``after_training``)."""
        return [(f"servers.{name}.gpus", server.gpus) for name, server in self.active().items()
                if not (during_training and server.after_training)]

    def claim_gpus(self, users: list[tuple[str, list[int]]]) -> dict[int, str]:
        """``{gpu: who}`` for ``(who, gpus)`` users; a ``ValueError`` for a GPU the node lacks or that two use."""
        owners: dict[int, str] = {}
        for who, gpus in users:
            for gpu in gpus:
                if gpu >= self.gpus_per_node:
                    raise ValueError(f"{who}: GPU {gpu} does not exist on a node of {self.gpus_per_node} GPUs")
                if gpu in owners:
                    raise ValueError(f"GPU {gpu} is used by both {owners[gpu]} and {who}: one process per GPU "
                                     "(vLLM reserves gpu_memory_utilization of it; NCCL refuses two ranks on one)")
                owners[gpu] = who
        return owners

    @model_validator(mode="after")
    def _no_collision(self) -> PlacementSpec:
        self.claim_gpus(self.server_gpus())
        self.claim_gpus([("trainer_gpu", [self.trainer_gpu] if self.trainer_gpu is not None else []),
                         *self.server_gpus(during_training=True)])
        ports: dict[int, str] = {self.nccl_port: "nccl_port"}
        for name, server in self.active().items():
            if server.port in ports:
                raise ValueError(f"port {server.port} is used by both {ports[server.port]} and servers.{name}")
            ports[server.port] = f"servers.{name}"
        return self


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        for index, item in enumerate(value):  # several servers of one role (rl.policy_server.base_url)
            yield f"{path}[{index}]", item
    else:
        yield path, value


def _key(path: str) -> str:
    """The parameter name of ``path``'s last part, without a list index (``base_url[1]`` -> ``base_url``)."""
    return path.rsplit(".", 1)[-1].split("[", 1)[0]


def replica_count(parameters: Mapping[str, Any]) -> int:
    """The most servers any ``policy_server.base_url`` of ``parameters`` lists (0 for none): TRL's weight transfer
    takes one NCCL port per server, ``placement.nccl_port`` + its index."""
    counts = [int(path.rsplit("[", 1)[1].rstrip("]")) + 1 if path.endswith("]") else 1
              for path, value in _walk(parameters)
              if path.split("[", 1)[0].endswith("policy_server.base_url") and isinstance(value, str)]
    return max(counts, default=0)


def _sibling(parameters: Mapping[str, Any], path: str, key: str) -> Any:
    value: Any = parameters
    for part in path.split("[", 1)[0].split(".")[:-1]:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value.get(key) if isinstance(value, Mapping) else None


def check_placement(parameters: Mapping[str, Any]) -> PlacementSpec | None:
    """Validate ``parameters["placement"]`` and every loopback URL of ``parameters`` against it (module docstring);
    None when no placement is declared (the CPU default)."""
    raw = parameters.get("placement")
    if raw is None:
        return None
    try:
        placement = raw if isinstance(raw, PlacementSpec) else PlacementSpec.model_validate(raw)
    except ValueError as error:
        raise PlacementError(f"placement: {error}") from error
    by_port = {server.port: (name, server) for name, server in placement.active().items()}
    for index in range(1, replica_count(parameters)):
        port = placement.nccl_port + index
        if port in by_port:
            raise PlacementError(f"placement.nccl_port + {index} = {port} (the weight transfer to the policy server "
                                 f"replica {index}) is servers.{by_port[port][0]}'s port: move nccl_port")
    for path, value in _walk(parameters):
        if path.startswith("placement.") or not isinstance(value, str) or _key(path) not in URL_KEYS:
            continue
        url = urlparse(value)
        if url.hostname not in LOOPBACK:
            continue
        port = url.port or (443 if url.scheme == "https" else 80)
        if port not in by_port:
            raise PlacementError(f"{path} = {value}: no server of placement.servers listens on port {port} "
                                 f"(declared: {sorted(by_port)}); declare it with its GPUs, or fix the port")
        name, server = by_port[port]
        asked = _sibling(parameters, path, "model")
        if server.model is not None and isinstance(asked, str) and asked != server.model:
            raise PlacementError(f"{path} asks port {port} for {asked!r}, but placement.servers.{name} serves "
                                 f"{server.model!r} there: give it its own server and port")
    return placement


def select_trainer_gpu(placement: PlacementSpec | None, *, training_on_gpu: bool) -> None:
    """Make this process see exactly ``placement.trainer_gpu`` before the first node (module docstring).

    Under a distributed launch (``WORLD_SIZE`` > 1) the launcher decides. A ``CUDA_VISIBLE_DEVICES`` naming one GPU
    is kept; one naming several is refused, as is a process whose CUDA is already initialised with several GPUs.
    """
    from prorag.gpus import narrow_to
    from prorag.training.devices import DevicePlacementError, launched_processes, one_gpu_instruction, visible_gpus

    if not training_on_gpu or launched_processes() > 1:
        return
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    chosen = placement.trainer_gpu if placement is not None else None
    if visible is None and chosen is not None and not torch.cuda.is_initialized():
        narrow_to(chosen)
        logger.info("training on GPU %d (placement.trainer_gpu): CUDA_VISIBLE_DEVICES=%d", chosen, chosen)
    elif visible is not None and chosen is not None and visible.strip() != str(chosen):
        logger.warning("CUDA_VISIBLE_DEVICES=%s is kept; placement.trainer_gpu is %d", visible, chosen)
    count = visible_gpus()
    if count > 1:
        raise DevicePlacementError(one_gpu_instruction(count))
