"""The node's GPUs as the ``kedro run`` process found them, before it narrowed itself to its trainer's GPU.

A one-process trainer must see one GPU (transformers' ``Trainer`` wraps a model in ``nn.DataParallel`` otherwise),
so the GPU preflight narrows ``CUDA_VISIBLE_DEVICES`` of the run to ``placement.trainer_gpu``. Children that need
other GPUs of the node — embedding workers on ``cuda:k``, launched trainers, servers — read the node's GPUs here
(:data:`NODE_GPUS_ENV`, inherited by every child), so ``cuda:k`` always means the k-th GPU the run was started with.
"""

from __future__ import annotations

import os

NODE_GPUS_ENV = "PRORAG_NODE_GPUS"
"""``CUDA_VISIBLE_DEVICES`` of the run before it was narrowed (``all`` when it was unset)."""


def narrow_to(gpu: int) -> None:
    """Make this process (and its children) see GPU ``gpu`` only, remembering what it saw before."""
    os.environ.setdefault(NODE_GPUS_ENV, os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)


def node_gpus() -> list[str] | None:
    """The GPUs the run was started with (``CUDA_VISIBLE_DEVICES`` entries), None for every GPU of the node."""
    recorded = os.environ.get(NODE_GPUS_ENV)
    if recorded is None:
        recorded = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    if recorded.strip() == "all":
        return None
    return [gpu.strip() for gpu in recorded.split(",") if gpu.strip()]


def pin_child_to(device: str) -> str:
    """In a freshly spawned child (CUDA not initialised): make ``cuda:k`` of the node this process's only GPU and
    return the device to use in it (``cuda:0``); any other device is returned unchanged."""
    if not device.startswith("cuda:"):
        return device
    index = int(device.split(":", 1)[1])
    known = node_gpus()
    if known is not None and index >= len(known):
        raise ValueError(f"device {device}: the run was started seeing {len(known)} GPU(s) "
                         f"(CUDA_VISIBLE_DEVICES={','.join(known)})")
    os.environ["CUDA_VISIBLE_DEVICES"] = known[index] if known is not None else str(index)
    return "cuda:0"
