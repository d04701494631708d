"""bf16 compute over fp32 weights: linear layers in bf16 under autocast, the residual stream and norms in fp32.

SFT trains the policy this way (``sft.mixed_precision: bf16``); ``policy.mixed_precision: bf16`` runs the policy's
rollouts the same way (with a LoRA adapter merged into the weights before they are rounded to bf16, so an update
below half a bf16 ulp of a weight is lost: one GRPO step at 5e-5 is). The weights the linear layers read are stored in
bf16 once (the values autocast would cast them to at every forward), so the numbers are autocast's and the casts
cost nothing per step.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import nn

    from prorag.config import MixedPrecision


def compute_precision(mixed_precision: MixedPrecision, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context ``mixed_precision`` asks for on ``device`` (``no``: none)."""
    if mixed_precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if mixed_precision != "no":
        raise ValueError(f"mixed_precision must be 'no' or 'bf16', got {mixed_precision!r}")
    return contextlib.nullcontext()


def frozen_linear_weights_in_bf16(model: nn.Module) -> int:
    """Store the frozen weights of ``model``'s linear layers in bf16, for training under bf16 autocast; returns how
    many. Autocast casts an fp32 weight to bf16 at every forward, and again in each checkpointed recompute (it caches
    the casts of trainable weights only); stored once, they take half the memory (3 SFT steps of make train: peak
    4.69 -> 4.44 GiB, 1.02x the time). The pre-cast copy holds the same bf16 values (round to nearest even), so the
    steps compute the same numbers. Trainable weights (LoRA's, fp32 for the optimizer) and weights an embedding shares
    (a tied ``lm_head``, whose lookup stays fp32) are left as they are; only for one process (sharded launches flatten
    parameters of one dtype)."""
    shared = {module.weight.data_ptr() for module in model.modules() if isinstance(module, torch.nn.Embedding)}
    converted = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for parameter in (module.weight, module.bias):
            if (parameter is not None and not parameter.requires_grad and parameter.dtype == torch.float32
                    and parameter.data_ptr() not in shared):
                parameter.data = parameter.data.to(torch.bfloat16)
                converted += 1
    return converted


def inference_weights_in_bf16(model: nn.Module) -> int:
    """Freeze ``model`` (inference only) and store every linear weight in bf16, for generation under bf16 autocast;
    returns how many. An output head tied to the fp32 input embedding gets its own bf16 copy: autocast would cast
    its 28 M weights (SmolLM2) at every decoding step, about as long as the step's other linear layers take."""
    model.requires_grad_(False)
    converted = frozen_linear_weights_in_bf16(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Linear) and head.weight.dtype == torch.float32:
        head.weight = torch.nn.Parameter(head.weight.detach().to(torch.bfloat16), requires_grad=False)
        converted += 1
    return converted
