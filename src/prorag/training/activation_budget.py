"""Gradient checkpointing only where memory needs it: a step's decoder layers keep their activations while those fit a
budget, and the rest are checkpointed (recomputed in the backward pass).

Checkpointing every layer costs a second forward pass of each layer in the backward pass (21% of an SFT step of
SmolLM2 here, py-spy); checkpointing none stores every layer's activations, whose size grows with the step's tokens
(make train's SFT: 7.15 GiB peak at a 3,036-token sequence, 3.3 GiB checkpointed). transformers checkpoints all of a
model's layers or none (``gradient_checkpointing_enable``), and torch's selective checkpointing chooses by operator,
not by memory; nothing decides per step from its length, so :func:`checkpoint_beyond_budget` sets each layer's
``gradient_checkpointing`` flag (which transformers' ``GradientCheckpointingLayer`` reads at every call) before
each forward pass: the first ``n`` layers run plain, ``n`` as many as the step's tokens fit in the budget.

What a layer stores is measured on the model itself before training (:func:`activation_bytes`): the tensors autograd
saves inside the layers in a forward pass of two short random sequences, per layer, a part per token and a fixed part
(autocast's low-precision weight copies; not the weights themselves).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

logger = logging.getLogger(__name__)

_PROBE_TOKENS = (32, 96)


@dataclass(frozen=True)
class LayerActivations:
    """Bytes autograd saves for one decoder layer's backward: ``per_token`` for each token of a step, plus ``fixed``."""

    per_token: float
    fixed: float

    def layers_within(self, budget_bytes: float, tokens: int, layers: int) -> int:
        """How many layers' activations for ``tokens`` fit ``budget_bytes`` (0 to ``layers``)."""
        per_layer = self.fixed + self.per_token * tokens
        return max(0, min(layers, int(budget_bytes // per_layer))) if per_layer > 0 else layers


def checkpointing_layers(model: nn.Module) -> list[GradientCheckpointingLayer]:
    """The model's layers that transformers can checkpoint, in forward order (a ValueError if it has none)."""
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no layer that transformers can checkpoint "
                         "(GradientCheckpointingLayer)")
    return layers


def activation_bytes(model: nn.Module, autocast_dtype: torch.dtype | None = None) -> LayerActivations:
    """Measure what one layer saves for backward: two forward passes of random token ids (:data:`_PROBE_TOKENS`),
    no layer checkpointed, under autocast to ``autocast_dtype`` when given (as the trainer runs them)."""
    layers = checkpointing_layers(model)
    device = next(model.parameters()).device
    vocab = int(getattr(model.config, "vocab_size", 2))
    flags = [layer.gradient_checkpointing for layer in layers]
    was_training = model.training
    weights = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    inside: list[bool] = []  # a layer's forward is running: what is saved now is that layer's

    def enter(*_: Any) -> None:
        inside.append(True)

    def leave(*_: Any) -> None:
        inside.pop()

    hooks = [handle for layer in layers
             for handle in (layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave))]
    totals = []
    try:
        for layer in layers:
            layer.gradient_checkpointing = False
        model.train()
        generator = torch.Generator().manual_seed(0)
        for tokens in _PROBE_TOKENS:
            saved: dict[int, int] = {}
            # What autograd would save stays alive through the pass (as in training, so that no storage is freed
            # and its address reused), here and not in the graph: a tensor returned to autograd that is an output
            # of its own node makes a cycle through the graph that Python's gc cannot see, and make train's process
            # held the probe's bf16 weight copies (438 MB) to its end.
            alive: list[torch.Tensor] = []

            def pack(tensor: torch.Tensor, saved: dict[int, int] = saved, alive: list[torch.Tensor] = alive) -> None:
                storage = tensor.untyped_storage()  # one storage saved twice (a layer's input, its norm) counts once
                if inside and storage.data_ptr() not in weights:  # the weights are there anyway
                    saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
                alive.append(tensor)

            ids = torch.randint(0, vocab, (1, tokens), generator=generator).to(device)
            autocast = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
                        else contextlib.nullcontext())
            with torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked), autocast:
                model(input_ids=ids)
            alive.clear()
            totals.append(sum(saved.values()))
    finally:
        for handle in hooks:
            handle.remove()
        for layer, flag in zip(layers, flags, strict=True):
            layer.gradient_checkpointing = flag
        model.train(was_training)
    (short, long), (few, many) = _PROBE_TOKENS, totals
    per_token = (many - few) / (long - short) / len(layers)
    fixed = max(0.0, few / len(layers) - per_token * short)
    return LayerActivations(per_token=per_token, fixed=fixed)


def _never_unpacked(_: object) -> torch.Tensor:
    raise RuntimeError("activation_bytes keeps no saved tensor: its forward passes cannot be back-propagated")


def checkpoint_beyond_budget(model: nn.Module, budget_bytes: float,
                             cost: LayerActivations) -> torch.utils.hooks.RemovableHandle:
    """Before each forward pass of ``model`` in training, leave as many of its first layers un-checkpointed as the
    step's tokens (``input_ids`` or ``inputs_embeds``, all rows) fit in ``budget_bytes`` by ``cost``; checkpoint the
    others. Takes effect where checkpointing is on (the trainer's ``gradient_checkpointing_enable``): the flags it
    sets are those transformers sets there. Returns the hook's handle."""
    layers = checkpointing_layers(model)

    def before_forward(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training or not hasattr(layers[0], "_gradient_checkpointing_func"):
            return  # not training, or checkpointing never enabled: nothing to recompute with
        inputs = kwargs.get("input_ids")
        if inputs is None:
            inputs = kwargs.get("inputs_embeds")
        if inputs is None and args and isinstance(args[0], torch.Tensor):
            inputs = args[0]
        if inputs is None:
            return
        tokens = int(inputs.shape[0] * inputs.shape[1]) if inputs.dim() >= 2 else int(inputs.numel())
        plain = cost.layers_within(budget_bytes, tokens, len(layers))
        for index, layer in enumerate(layers):
            layer.gradient_checkpointing = index >= plain

    return model.register_forward_pre_hook(before_forward, with_kwargs=True)
