"""bf16 compute over fp32 weights: training (the frozen linear weights in bf16, the same numbers) and generation
(the greedy tokens of transformers under autocast)."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from prorag.llm.generation import SamplingParams
from prorag.llm.precision import frozen_linear_weights_in_bf16, inference_weights_in_bf16
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.llm.transformers_backend import TransformersGenerator

PROMPTS = [
    "The capital of France is",
    "Hello",
    "A much longer prompt, which needs left padding when it shares a batch with the short ones above",
    "Question: who wrote Hamlet?\nAnswer:",
]


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


def test_inference_weights_in_bf16_give_the_tied_output_head_its_own_copy(one_torch_thread):
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    embedding = model.get_input_embeddings().weight

    converted = inference_weights_in_bf16(model)
    assert converted == model.config.num_hidden_layers * 7 + 1  # every decoder linear layer and the output head
    assert model.get_output_embeddings().weight.dtype == torch.bfloat16
    assert model.get_input_embeddings().weight is embedding and embedding.dtype == torch.float32  # the lookup
    assert not any(parameter.requires_grad for parameter in model.parameters())


def _reference(model: torch.nn.Module, tokenizer, ids: list[int], *, autocast: bool) -> tuple[list[int], list[float]]:
    """transformers' greedy ``generate`` of 16 tokens (under CPU bf16 autocast when asked): the tokens and the
    log-probability of each."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        output = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                output_logits=True, return_dict_in_generate=True)
    tokens = output.sequences[0, len(ids):].tolist()
    return tokens, [torch.log_softmax(logits.float(), -1)[0, token].item()
                    for logits, token in zip(output.logits, tokens, strict=True)]


def test_mixed_precision_generation_is_transformers_generate_under_autocast(one_torch_thread):
    """Pre-cast weights and KV stored in bf16 compute what ``torch.autocast`` over the fp32 model does (it casts every
    weight and KV at each step): a row alone without drafts (decoded by ``generate`` over its mask-free past), the
    same log-probabilities. A padded batch over the static cache differs from it by bf16's rounding (its matrix
    products have other shapes), with the same tokens, and prompt-lookup drafts change nothing in it."""
    model, tokenizer = load_causal_lm(BUNDLED_TINY_LLAMA)
    reference = copy.deepcopy(model)
    inference_weights_in_bf16(model)
    params = SamplingParams(max_new_tokens=16, logprobs=True)
    prompts = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
    expected = [_reference(reference, tokenizer, ids, autocast=True) for ids in prompts]
    full_precision = [_reference(reference, tokenizer, ids, autocast=False)[1] for ids in prompts]
    generator = TransformersGenerator((model, tokenizer), batch_size=8, mixed_precision="bf16", draft_tokens=0)

    for ids, (tokens, logprobs), fp32 in zip(prompts, expected, full_precision, strict=True):
        (alone,) = generator.generate([ids], params)[0]
        assert alone.token_ids == tokens
        assert alone.logprobs == pytest.approx(logprobs, abs=1e-6)
        assert max(abs(ours - theirs) for ours, theirs in zip(alone.logprobs, fp32, strict=True)) > 1e-3  # not fp32

    batched = {}
    for drafts in (3, 0):
        generator = TransformersGenerator((model, tokenizer), batch_size=8, mixed_precision="bf16",
                                          draft_tokens=drafts)
        batched[drafts] = [samples[0] for samples in generator.generate(prompts, params)]
    assert [c.logprobs for c in batched[3]] == [c.logprobs for c in batched[0]]
    for completion, (tokens, logprobs) in zip(batched[3], expected, strict=True):
        assert completion.token_ids == tokens
        assert completion.logprobs == pytest.approx(logprobs, abs=1e-2)
    entry, length = generator.prefix_cache.lookup([*prompts[0], *expected[0][0]])
    assert length > len(prompts[0]) and entry.layers[0][0].dtype == entry.layers[0][1].dtype == torch.bfloat16


def test_an_unknown_mixed_precision_is_refused():
    with pytest.raises(ValueError, match="'no' or 'bf16'"):
        TransformersGenerator(BUNDLED_TINY_LLAMA, mixed_precision="fp8")  # type: ignore[arg-type]
