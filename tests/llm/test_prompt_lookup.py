"""Greedy decoding with prompt-lookup drafts: the drafts, the packed grouped-query attention, and the same output."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import repeat_kv

from prorag.llm.generation import SamplingParams
from prorag.llm.registry import BUNDLED_SMOLLM2, BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.llm.transformers_backend import TransformersGenerator, _packed_gqa_sdpa, _PromptLookup


@pytest.fixture(scope="module")
def tiny_pair(one_torch_thread):
    return load_causal_lm(BUNDLED_TINY_LLAMA)


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_last_ids():
    lookup = _PromptLookup([5, 6, 7, 8, 9, 1, 6, 7, 4, 4, 2, 6, 7])
    assert lookup.draft(3) == [4, 4, 2]  # the trigram 2 6 7 never occurred before: the bigram 6 7, latest first
    assert lookup.draft(1) == [4]
    assert lookup.draft(0) == []
    lookup.extend([8])  # 6 7 8 occurred at the start
    assert lookup.draft(4) == [9, 1, 6, 7]
    assert _PromptLookup([1, 2, 3, 4]).draft(2) == []  # the last ids occur nowhere else
    assert _PromptLookup([3, 3, 3]).draft(5) == [3]  # the continuation runs up to the row's end
    single = _PromptLookup([4, 9, 4], shortest=1)
    assert single.draft(2) == [9, 4]


def test_packed_grouped_query_attention_matches_repeated_kv_heads():
    torch.manual_seed(0)
    rows, kv_heads, groups, queries, past, dim = 3, 2, 3, 4, 37, 8
    query = torch.randn(rows, kv_heads * groups, queries, dim)
    key, value = torch.randn(rows, kv_heads, past, dim), torch.randn(rows, kv_heads, past, dim)
    mask = torch.rand(rows, 1, queries, past) > 0.3
    mask[..., 0] = True
    module = SimpleNamespace(num_key_value_groups=groups)
    ours, _ = _packed_gqa_sdpa(module, query, key, value, mask, scaling=dim**-0.5)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask, scale=dim**-0.5).transpose(1, 2)
    assert ours.shape == (rows, queries, kv_heads * groups, dim)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)


def _turns(generator: TransformersGenerator, prompts: list[list[int]], params: SamplingParams,
           turns: int) -> list[list[tuple]]:
    """Multi-turn greedy calls over ragged rows (each turn adds its output and an insertion copied from its prompt,
    as a rollout inserts retrieved passages); every completion's ids, finish, stop, text and log-probabilities."""
    rng = random.Random(3)
    sequences = [list(ids) for ids in prompts]
    outputs = []
    for _turn in range(turns):
        completions = [samples[0] for samples in generator.generate(sequences, params)]
        outputs.append([(c.token_ids, c.finish_reason, c.stop, c.text) for c in completions])
        outputs.append([c.logprobs for c in completions])
        for ids, completion in zip(sequences, completions, strict=True):
            start = rng.randrange(len(ids) - 8)
            ids += completion.token_ids + ids[start : start + rng.randint(0, 8)]
    return outputs


@pytest.mark.parametrize("megabytes", [256, 0])
def test_drafted_greedy_decoding_is_the_greedy_output(tiny_pair, megabytes):
    tokenizer = tiny_pair[1]
    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone"]
    # repeated phrases, so that drafts come up and the random model's loops get accepted
    prompts = [tokenizer(" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) * rng.randint(1, 3),
                         add_special_tokens=False)["input_ids"] for _row in range(7)]
    params = SamplingParams(max_new_tokens=14, stop=("ab", "e"), logprobs=True)
    runs = {}
    for drafts in (0, 3, 5):
        generator = TransformersGenerator(tiny_pair, batch_size=8, prefix_cache_mb=megabytes, draft_tokens=drafts)
        runs[drafts] = _turns(generator, prompts, params, turns=3), generator.stats
    (plain, plain_stats) = runs[0]
    assert plain_stats.draft_tokens == 0
    for drafts in (3, 5):
        ours, stats = runs[drafts]
        for mine, reference in zip(ours[0::2], plain[0::2], strict=True):
            assert mine == reference
        for mine, reference in zip(ours[1::2], plain[1::2], strict=True):
            assert [pytest.approx(row, abs=1e-4) for row in mine] == reference
        assert stats.decode_tokens == plain_stats.decode_tokens
        assert 0 < stats.accepted_draft_tokens <= stats.draft_tokens  # drafts were fed and some were kept


def test_drafts_never_run_a_row_past_max_new_tokens(tiny_pair):
    tokenizer = tiny_pair[1]
    prompts = [tokenizer("one two three " * 6, add_special_tokens=False)["input_ids"],
               tokenizer("four five " * 9, add_special_tokens=False)["input_ids"]]
    for limit in (1, 2, 5):
        params = SamplingParams(max_new_tokens=limit)
        ours = TransformersGenerator(tiny_pair, batch_size=2, draft_tokens=4).generate(prompts, params)
        plain = TransformersGenerator(tiny_pair, batch_size=2, draft_tokens=0).generate(prompts, params)
        assert [s[0].token_ids for s in ours] == [s[0].token_ids for s in plain]
        assert all(len(s[0].token_ids) <= limit for s in ours)


def test_one_row_decodes_with_drafts_to_the_output_of_transformers_generate(tiny_pair):
    """A call of one row (``prorag ask``, one served request) drafts too; ``draft_tokens=0`` leaves one row to
    transformers' ``generate`` over its mask-free past, the reference here."""
    tokenizer = tiny_pair[1]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"]
               for text in ("alpha beta gamma " * 9, "river stone " * 14, "delta " * 3)]  # the last: too short to draft
    drafted = TransformersGenerator(tiny_pair, batch_size=1, draft_tokens=3)
    plain = TransformersGenerator(tiny_pair, batch_size=1, draft_tokens=0)
    for params in (SamplingParams(max_new_tokens=14, logprobs=True),
                   SamplingParams(max_new_tokens=14, stop=("ab", "e"), logprobs=True)):
        for prompt in prompts:
            [[mine]] = drafted.generate([prompt], params)
            [[reference]] = plain.generate([prompt], params)
            assert mine.token_ids == reference.token_ids and mine.text == reference.text
            assert mine.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
    assert plain.stats.draft_tokens == 0
    assert 0 < drafted.stats.accepted_draft_tokens <= drafted.stats.draft_tokens


def test_draft_tokens_must_not_be_negative(tiny_pair):
    with pytest.raises(ValueError, match="draft_tokens"):
        TransformersGenerator(tiny_pair, draft_tokens=-1)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [3, 1])  # 1: each row alone, against transformers' generate
def test_smollm2_drafted_greedy_decoding_is_the_greedy_output(one_torch_thread, batch_size):
    """SmolLM2 (9 query heads over 3 KV heads) answering from a passage it may quote: the same output, drafts kept."""
    pair = load_causal_lm(BUNDLED_SMOLLM2)
    passage = ("The 2003 Italian Grand Prix was a Formula One motor race held on 14 September 2003 at the Autodromo "
               "Nazionale Monza. The race was won by Michael Schumacher driving for Ferrari, with Juan Pablo Montoya "
               "second and Rubens Barrichello third.")
    questions = ["Who won the 2003 Italian Grand Prix?", "Where was the 2003 Italian Grand Prix held?",
                 "Who finished third in the 2003 Italian Grand Prix?"]
    prompts = [pair[1].apply_chat_template([{"role": "user", "content": f"{passage}\n\nQuote the passage: {q}"}],
                                           tokenize=False, add_generation_prompt=True) for q in questions]
    params = SamplingParams(max_new_tokens=40, stop=("</answer>",), logprobs=True)
    runs = {}
    for drafts in (0, 3):
        generator = TransformersGenerator(pair, batch_size=batch_size, draft_tokens=drafts)
        runs[drafts] = generator.generate(prompts, params), generator.stats
    (ours, stats), (plain, _) = runs[3], runs[0]
    assert [s[0].token_ids for s in ours] == [s[0].token_ids for s in plain]
    for mine, reference in zip(ours, plain, strict=True):
        assert mine[0].logprobs == pytest.approx(reference[0].logprobs, abs=1e-4)
    assert stats.accepted_draft_tokens > 10
