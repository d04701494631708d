"""Frozen linear weights in bf16 for bf16 autocast: the same training numbers, trainable and tied weights kept."""

from __future__ import annotations

import copy

import torch
from peft import LoraConfig, get_peft_model

from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.training.devices import frozen_linear_weights_in_bf16


def _lora_steps(model: torch.nn.Module, batches: list[torch.Tensor]) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Adam steps on ``batches`` under CPU bf16 autocast with activation checkpointing: the losses and LoRA weights."""
    model.activation_checkpointing_enable({"use_reentrant": False})
    model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for ids in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def test_bf16_frozen_weights_train_the_same_numbers(one_torch_thread):
    base, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"], task_type="CAUSAL_LM")
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(3, 5000, (2, 24), generator=generator) for _ in range(3)]
    torch.manual_seed(0)
    plain = get_peft_model(copy.deepcopy(base), config)
    torch.manual_seed(0)
    cast = get_peft_model(copy.deepcopy(base), config)

    converted = frozen_linear_weights_in_bf16(cast)
    layers = base.config.num_hidden_layers
    assert converted == layers * 7  # q, k, v, o, gate, up, down of every layer; no bias
    assert cast.get_output_embeddings().weight.dtype == torch.float32  # tied to the embedding lookup
    assert all(p.dtype == torch.float32 for p in cast.parameters() if p.requires_grad)  # LoRA's, for the optimizer

    ours, our_weights = _lora_steps(cast, batches)
    theirs, their_weights = _lora_steps(plain, batches)
    assert ours == theirs
    assert our_weights.keys() == their_weights.keys()
    for name, weight in our_weights.items():
        assert torch.equal(weight, their_weights[name]), name
