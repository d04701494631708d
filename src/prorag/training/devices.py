"""One GPU per trainer process, and fp32 master weights for full-parameter training.

A ``kedro run`` is one process. transformers' ``Trainer`` wraps the model in ``nn.DataParallel`` when one process
sees several GPUs, and TRL's SFT, GRPO and DPO trainers refuse that (``ValueError: … does not support
nn.DataParallel``) — after the model is loaded. :func:`ensure_one_device` refuses earlier, with the instruction
that fixes it; :func:`prorag.scale.placement.select_trainer_gpu` picks the GPU itself before the first node when
conf declares ``placement.trainer_gpu``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def bf16_compute(dtype: str, use_cpu: bool, *, requested: str = "no", full_parameters: bool = False) -> bool:
    """Whether a trainer computes in bf16 (autocast over its weights): when asked (``mixed_precision: bf16``), or
    with bf16 weights on a GPU, or with bf16 weights trained full-parameter anywhere (fp32 master weights, bf16
    compute: an update of ~1e-6 is below half a bf16 ulp of a weight, so pure-bf16 weights would barely move).
    The one rule of every trainer (SFT, DPO, GRPO) and of ``accelerate launch``'s mixed precision."""
    return requested == "bf16" or (dtype == "bfloat16" and (full_parameters or not use_cpu))


class DevicePlacementError(ValueError):
    """A trainer process would see several GPUs (or none of the declared one)."""


def launched_processes() -> int:
    """The number of processes of a distributed launch (``accelerate launch`` / ``torchrun`` set ``WORLD_SIZE``)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def visible_gpus() -> int:
    """How many CUDA devices this process sees (0 without CUDA)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def one_gpu_instruction(count: int) -> str:
    """What to do when one process sees ``count`` GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"this process sees {count} GPUs (CUDA_VISIBLE_DEVICES={visible if visible is not None else 'unset'}) "
            "and trains in one process on one GPU. Start it with one GPU visible, e.g. "
            "`CUDA_VISIBLE_DEVICES=2 kedro run --env gpu` (the GPU conf/gpu's placement.trainer_gpu names; the "
            "run sets it itself when placement.trainer_gpu is declared and CUDA is not yet initialised), or launch "
            "several processes with `accelerate launch` (docs/scaling.md)")


def ensure_one_device(use_cpu: bool, *, what: str) -> None:
    """Refuse, before any model is loaded, a GPU trainer in a single process that sees several GPUs."""
    if use_cpu or launched_processes() > 1:
        return
    count = visible_gpus()
    if count > 1:
        raise DevicePlacementError(f"{what}: {one_gpu_instruction(count)}")


def fp32_master_weights(model: nn.Module) -> nn.Module:
    """``model`` with every floating-point parameter in fp32 (the optimizer's master copy; compute runs in bf16
    under autocast). A no-op for a model already in fp32."""
    import torch

    if any(parameter.is_floating_point() and parameter.dtype != torch.float32 for parameter in model.parameters()):
        model = model.to(torch.float32)
    return model
