"""Checkpointing beyond an activation budget: the measured layer cost, how many layers run plain, same gradients."""

from __future__ import annotations

import gc
from collections import Counter

import pytest
import torch

from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.training.activation_budget import (
    LayerActivations,
    activation_bytes,
    checkpoint_beyond_budget,
    checkpointing_layers,
)


@pytest.fixture
def model():
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    model.train()
    return model


def _saved_bytes(model, ids: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes autograd holds for the backward of one forward pass (checkpointed layers keep only their inputs), and
    the loss."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids, labels=ids).loss
    return sum(saved.values()), loss


def test_layers_within_a_budget():
    cost = LayerActivations(per_token=1000.0, fixed=500.0)
    assert cost.layers_within(10 * (500 + 1000 * 100), tokens=100, layers=30) == 10
    assert cost.layers_within(10 * (500 + 1000 * 100), tokens=200, layers=30) == 5  # twice the tokens, half the layers
    assert cost.layers_within(1e12, tokens=100, layers=30) == 30
    assert cost.layers_within(0, tokens=100, layers=30) == 0


def test_the_measured_cost_predicts_what_plain_layers_save(model):
    cost = activation_bytes(model)
    layers = len(checkpointing_layers(model))
    assert cost.per_token > 0
    ids = torch.randint(0, model.config.vocab_size, (1, 300), generator=torch.Generator().manual_seed(1))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    checkpointed, _ = _saved_bytes(model, ids)
    for layer in checkpointing_layers(model):
        layer.gradient_checkpointing = False
    plain, _ = _saved_bytes(model, ids)
    predicted = layers * (cost.fixed + cost.per_token * 300)
    assert plain - checkpointed == pytest.approx(predicted, rel=0.15)  # a length it was not measured at


def _live_tensors() -> Counter[torch.dtype]:
    gc.collect()
    return Counter(obj.dtype for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_the_measurement_keeps_nothing_alive(model, autocast_dtype):
    """The probe's saved tensors (under autocast, bf16 copies of every weight) are gone when it returns: kept in the
    graph, they made a cycle through autograd that gc could not collect (make train held 438 MB of them)."""
    before = _live_tensors()
    cost = activation_bytes(model, autocast_dtype)
    assert cost.per_token > 0
    assert _live_tensors() == before


def test_a_step_checkpoints_the_layers_beyond_its_budget_with_the_same_gradients(model):
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    layers = checkpointing_layers(model)
    assert len(layers) >= 2
    cost = activation_bytes(model)
    short, long = (torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
                   for n in (40, 160))
    budget = (len(layers) - 1) * (cost.fixed + cost.per_token * 40) + 1  # all but one layer of the short step
    grads = {}
    for mode in ("all checkpointed", "budget"):
        if mode == "budget":
            handle = checkpoint_beyond_budget(model, budget, cost)
        model.zero_grad()
        seen = []
        for ids in (short, long):
            _, loss = _saved_bytes(model, ids)
            seen.append([layer.gradient_checkpointing for layer in layers])
            loss.backward()
        grads[mode] = [param.grad.clone() for param in model.parameters() if param.grad is not None]
    handle.remove()
    plain_short = cost.layers_within(budget, 40, len(layers))
    plain_long = cost.layers_within(budget, 160, len(layers))
    assert plain_short == len(layers) - 1 and plain_long < plain_short
    assert seen == [[index >= plain_short for index in range(len(layers))],
                    [index >= plain_long for index in range(len(layers))]]
    for ours, reference in zip(grads["budget"], grads["all checkpointed"], strict=True):
        torch.testing.assert_close(ours, reference)


def test_no_layer_is_touched_before_checkpointing_is_enabled(model):
    cost = activation_bytes(model)
    checkpoint_beyond_budget(model, 0, cost)  # a budget of nothing: every layer would be checkpointed
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert not any(layer.gradient_checkpointing for layer in checkpointing_layers(model))
    with pytest.raises(ValueError, match="no layer that transformers can checkpoint"):
        checkpointing_layers(torch.nn.Linear(2, 2))
