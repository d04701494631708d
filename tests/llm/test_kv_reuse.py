"""KV reuse across generate calls and prefix sharing: outputs identical to re-prefilling, counters that add up."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import StaticCache

from prorag.agent import Rollout, RolloutEngine
from prorag.data.records import Passage, load_questions
from prorag.llm.generation import SamplingParams
from prorag.llm.prefix_cache import PrefixKVCache
from prorag.llm.registry import BUNDLED_SMOLLM2, BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.llm.transformers_backend import TransformersGenerator, _padding_bounded_chunks
from prorag.retrieval import build_retrieval_index

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw"


@pytest.fixture(scope="module")
def tiny_pair(one_torch_thread):
    return load_causal_lm(BUNDLED_TINY_LLAMA)


@pytest.fixture(scope="module")
def retriever():
    with (RAW / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 50)]
    return build_retrieval_index(passages, "hashing:64", build_bm25=True, show_progress=False).bm25


def signature(rollout: Rollout) -> tuple:
    return (rollout.completion, rollout.stop_reason, tuple(tuple(s.token_ids) for s in rollout.segments))


def test_reuse_is_token_identical_over_ragged_turns_with_insertions(tiny_pair):
    reuse = TransformersGenerator(tiny_pair, batch_size=4)
    fresh = TransformersGenerator(tiny_pair, batch_size=4, prefix_cache_mb=0)
    rng = random.Random(0)
    sequences = {row: reuse.encode(f"Question {row}: " + "word " * rng.randint(3, 40)) for row in range(6)}
    active = list(sequences)
    params = SamplingParams(max_new_tokens=10, stop=("ab",), logprobs=True)
    for _turn in range(5):  # rows drop out at different turns; each gets an insertion of 0-30 tokens
        with_cache = reuse.generate([sequences[row] for row in active], params)
        without = fresh.generate([sequences[row] for row in active], params)
        for row, ours, theirs in zip(active, with_cache, without, strict=True):
            assert ours[0].token_ids == theirs[0].token_ids
            assert ours[0].logprobs == pytest.approx(theirs[0].logprobs, abs=1e-4)
            sequences[row] += ours[0].token_ids + [rng.randrange(100, 5000) for _ in range(rng.randint(0, 30))]
        active = [row for row in active if rng.random() > 0.25] or active[:1]
    stats = reuse.stats
    assert stats.cached_tokens > 0.5 * stats.prompt_tokens
    assert stats.prompt_tokens == fresh.stats.prompt_tokens == stats.cached_tokens + stats.prefill_tokens
    assert fresh.stats.cached_tokens == 0 and fresh.stats.prefill_tokens == fresh.stats.prompt_tokens
    assert stats.decode_tokens == fresh.stats.decode_tokens > 0


def test_samples_of_one_prompt_share_one_prefill_and_sampling_is_unchanged(tiny_pair):
    reuse = TransformersGenerator(tiny_pair, batch_size=8)
    fresh = TransformersGenerator(tiny_pair, batch_size=8, prefix_cache_mb=0)
    prompts = [reuse.encode("Who wrote Moby-Dick? " * 5), reuse.encode("Where is Lomako Yokokala?")]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=4, seed=7)
    ours, theirs = reuse.generate(prompts, params), fresh.generate(prompts, params)
    assert [[c.token_ids for c in samples] for samples in ours] == [[c.token_ids for c in s] for s in theirs]
    # each prompt is prefilled once (all but its last token), then its 4 rows run one token each
    assert reuse.stats.shared_prefill_tokens == sum(len(ids) - 1 for ids in prompts)
    assert reuse.stats.cached_tokens == 4 * sum(len(ids) - 1 for ids in prompts)
    assert reuse.stats.prefill_tokens == reuse.stats.shared_prefill_tokens + 8


def test_rows_sharing_a_long_beginning_prefill_it_once(tiny_pair):
    reuse = TransformersGenerator(tiny_pair, batch_size=4)
    fresh = TransformersGenerator(tiny_pair, batch_size=4, prefix_cache_mb=0)
    system = reuse.encode("You answer questions with care and cite your sources. " * 4)
    prompts = [[*system, *reuse.encode(f" Question {index}: " + "word " * index)] for index in range(6)]
    params = SamplingParams(max_new_tokens=5, stop=("ab",))
    ours, theirs = reuse.generate(prompts, params), fresh.generate(prompts, params)
    assert [samples[0].token_ids for samples in ours] == [samples[0].token_ids for samples in theirs]
    common = next(prompts[0][:size] for size in range(len(prompts[0]), 0, -1)
                  if all(ids[:size] == prompts[0][:size] for ids in prompts))
    assert len(common) > len(system)  # the system block and the shared " Question" token
    # prefilled once as one row (not once per row of the two padded batches), then each row its own suffix
    assert reuse.stats.shared_prefill_tokens == len(common)
    assert reuse.stats.cached_tokens == len(prompts) * len(common)
    assert reuse.stats.prefill_tokens == len(common) + sum(len(ids) - len(common) for ids in prompts)


def test_engine_rollouts_are_identical_with_and_without_reuse(tiny_pair, retriever):
    questions = [q.question for q in load_questions(RAW / "qa" / "hotpotqa.jsonl")[:3]]
    runs = {}
    for megabytes in (256, 0):
        generator = TransformersGenerator(tiny_pair, batch_size=4, prefix_cache_mb=megabytes)
        engine = RolloutEngine(generator, retriever, "hiprag", progress=False, max_new_tokens_per_turn=8,
                               max_total_new_tokens=40)
        runs[megabytes] = (engine.run(questions, samples=2), generator.stats)
    (ours, stats), (theirs, fresh) = runs[256], runs[0]
    assert [signature(r) for r in ours] == [signature(r) for r in theirs]
    assert min(r.turns for r in ours) >= 5
    assert stats.cache_hit_rate > 0.8 and fresh.cache_hit_rate == 0.0
    assert stats.shared_prefill_tokens > 0  # the two samples of each question share the first prefill


def test_cache_is_bounded_and_dropped_when_the_weights_change(tiny_pair):
    model, _ = tiny_pair
    generator = TransformersGenerator(tiny_pair, batch_size=2, prefix_cache_mb=1)
    prompt = generator.encode("The quick brown fox " * 4)
    params = SamplingParams(max_new_tokens=4)
    generator.generate([prompt], params)
    cache = generator.prefix_cache
    assert cache is not None and len(cache) == 1 and 0 < cache.nbytes <= cache.max_bytes
    generator.generate([prompt], params)
    assert generator.stats.cached_tokens == len(prompt) - 1
    parameter = next(model.parameters())
    with torch.no_grad():
        parameter.add_(0.0)  # an in-place update (an optimizer step) bumps the version counter
    generator.generate([prompt], params)
    assert generator.stats.cached_tokens == len(prompt) - 1  # nothing reused after the update
    tiny = PrefixKVCache(max_bytes=100)
    tiny.store([1, 2, 3], [(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))])  # 192 bytes > 100: not kept
    assert len(tiny) == 0
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        TransformersGenerator(tiny_pair, prefix_cache_mb=-1)


def test_longest_shared_prefix_is_found_and_superseded_entries_dropped():
    cache = PrefixKVCache(max_bytes=10**6)
    layer = [(torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))]
    cache.store([5, 6, 7, 8], layer)
    assert cache.lookup([5, 6, 9, 9, 9])[1] == 2  # a sibling: shares 2 tokens
    assert cache.lookup([5, 6, 7, 8])[1] == 3  # the last prompt token is always run
    assert cache.lookup([4, 6, 7])[0] is None
    cache.store([5, 6, 7, 8, 1, 2], [(torch.zeros(1, 6, 2), torch.zeros(1, 6, 2))])
    assert len(cache) == 1  # [5, 6, 7, 8] is a prefix of the new entry


def test_eviction_keeps_the_entries_the_current_call_uses():
    def kv(length: int) -> list:
        return [(torch.zeros(1, length, 2), torch.zeros(1, length, 2))]  # 16 bytes per token

    cache = PrefixKVCache(max_bytes=2 * 16 * 4)  # room for two 4-token entries
    cache.begin_call()
    for first in (1, 2, 3):  # a rollout with more trajectories than fit: the third is not kept ...
        cache.store([first, 9, 9, 9], kv(4))
    assert [cache.lookup([first, 9, 9, 9, 0])[1] for first in (1, 2, 3)] == [4, 4, 0]
    cache.begin_call()  # ... and the next turn still reuses the two that were, instead of cycling
    cache.lookup([1, 9, 9, 9, 0])
    cache.store([3, 9, 9, 9], kv(4))  # evicts 2 (unused in this call), not 1
    assert [cache.lookup([first, 9, 9, 9, 0])[1] for first in (1, 2, 3)] == [4, 0, 4]
    assert cache.nbytes == 2 * 16 * 4


def test_entries_idle_for_more_calls_than_allowed_are_dropped_when_a_call_begins():
    kv = [(torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))]
    cache = PrefixKVCache(max_bytes=10**6, idle_calls=2)
    cache.begin_call()
    cache.store([1, 9, 9, 9], kv)  # a trajectory that finishes in this turn
    cache.store([2, 9, 9, 9], kv)  # one that goes on, looked up by every later call
    for _ in range(2):
        cache.begin_call()
        assert cache.lookup([2, 9, 9, 9, 0])[1] == 4
    assert len(cache) == 2  # the first was used by one of the last two calls
    cache.begin_call()
    assert len(cache) == 1 and cache.lookup([1, 9, 9, 9, 0])[1] == 0
    assert cache.nbytes == 2 * 16 * 2
    unbounded = PrefixKVCache(max_bytes=10**6)
    unbounded.store([1, 9, 9, 9], kv)
    for _ in range(5):
        unbounded.begin_call()
    assert len(unbounded) == 1
    with pytest.raises(ValueError, match="idle_calls"):
        PrefixKVCache(max_bytes=1, idle_calls=0)


@pytest.mark.integration
@pytest.mark.slow
def test_smollm2_rollouts_with_searches_are_identical_with_and_without_reuse(one_torch_thread, retriever):
    pair = load_causal_lm(BUNDLED_SMOLLM2)
    question = load_questions(RAW / "qa" / "hotpotqa.jsonl")[:1]
    runs = {}
    for megabytes in (512, 0):
        generator = TransformersGenerator(pair, batch_size=1, prefix_cache_mb=megabytes)
        engine = RolloutEngine(generator, retriever, "hiprag", progress=False, step_budget=2,
                               max_new_tokens_per_turn=24, max_total_new_tokens=64)
        runs[megabytes] = (engine.run(question), generator.stats)
    (ours, stats), (theirs, _) = runs[512], runs[0]
    assert [signature(r) for r in ours] == [signature(r) for r in theirs]
    assert ours[0].retrieval_count >= 1 and ours[0].context_tokens > 0  # a context was inserted mid-rollout
    assert stats.cache_hit_rate > 0.5


def test_batched_multi_turn_generation_runs_under_bf16_autocast_over_fp32_weights(one_torch_thread):
    """Full-parameter training generates with fp32 masters under accelerate's bf16 autocast: keys reach the cache
    in fp32 (rotary) and values in bf16. The batched (StaticCache) path failed there on an H200 (smoke test)."""
    model, tokenizer = load_causal_lm(BUNDLED_TINY_LLAMA)
    assert model.dtype == torch.float32
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)  # what accelerate's bf16 does
    generator = TransformersGenerator((model, tokenizer), batch_size=4)
    sequences = [generator.encode(f"Question {row}: " + "word " * (3 + 7 * row)) for row in range(3)]
    params = SamplingParams(max_new_tokens=8)
    for _turn in range(2):  # the second turn writes the first turn's cached bf16/fp32 KV into a static cache
        outputs = generator.generate(sequences, params)
        assert all(len(samples[0].token_ids) > 0 for samples in outputs)
        sequences = [ids + samples[0].token_ids + [101, 102] for ids, samples in zip(sequences, outputs, strict=True)]
    assert generator.stats.cached_tokens > 0


def test_generation_never_compiles_the_forward(tiny_pair):
    """Each batch's cache has its own length, so transformers' auto-compile on CUDA recompiled on nearly every
    call (H200 smoke test: 2.5 tokens/s; 60.9 with it off)."""
    config = TransformersGenerator(tiny_pair)._generation_config(SamplingParams(max_new_tokens=4))
    assert config.disable_compile is True


def test_padding_bounded_chunks_group_similar_lengths():
    lengths = [1390, 666, 628, 569, 543, 590, 40, 38, 36]
    chunks = _padding_bounded_chunks(lengths, size=4, padding=0.25)
    assert sorted(index for chunk in chunks for index in chunk) == list(range(len(lengths)))
    assert chunks[0] == [0]  # the long suffix is prefilled alone instead of padding the others to it
    for chunk in chunks:
        assert len(chunk) <= 4
        if len(chunk) > 1:
            assert len(chunk) * max(lengths[i] for i in chunk) <= 1.25 * sum(lengths[i] for i in chunk)
    assert _padding_bounded_chunks([], size=4, padding=0.25) == []
    capped = _padding_bounded_chunks([600] * 8 + [3000], size=32, padding=0.25, max_tokens=2048)
    assert capped == [[8], [0, 1, 2], [3, 4, 5], [6, 7]]  # a longer row alone; otherwise at most 2,048 tokens


def test_a_decoding_batch_prefills_one_token_per_row_after_ragged_insertions(tiny_pair, monkeypatch):
    reuse = TransformersGenerator(tiny_pair, batch_size=4)
    fresh = TransformersGenerator(tiny_pair, batch_size=4, prefix_cache_mb=0)
    params = SamplingParams(max_new_tokens=6)
    prompts = [reuse.encode(f"Question {row}: " + "word " * 5) for row in range(4)]
    first = reuse.generate(prompts, params)
    # one row gets a long insertion (retrieved passages), the others a few tokens
    prompts = [ids + samples[0].token_ids + reuse.encode(" doc" * (60 if row == 0 else 2))
               for row, (ids, samples) in enumerate(zip(prompts, first, strict=True))]
    expected = [s[0].token_ids for s in fresh.generate(prompts, params)]
    layouts = []
    original = TransformersGenerator._layout

    def spy(self, rows, new_tokens=0, drafted=False):
        batch = original(self, rows, new_tokens, drafted)
        layouts.append((new_tokens, batch.input_ids.shape[1] - batch.cached_width))
        return batch

    monkeypatch.setattr(TransformersGenerator, "_layout", spy)
    before = reuse.stats.snapshot()
    ours = reuse.generate(prompts, params)
    assert [s[0].token_ids for s in ours] == expected
    assert [suffix for new_tokens, suffix in layouts if new_tokens] == [1]  # not the long row's suffix width
    spent = reuse.stats.since(before)
    assert spent["prompt_tokens"] == spent["cached_tokens"] + spent["prefill_tokens"]
    assert spent["shared_prefill_tokens"] == 0


def test_decoding_batches_are_capped_by_their_kv_memory(tiny_pair):
    generator = TransformersGenerator(tiny_pair, batch_size=8)
    config = tiny_pair[0].config
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * \
        (config.hidden_size // config.num_attention_heads) * 4  # float32
    generator.batch_kv_bytes = 3 * (100 + 10) * per_position  # three rows of 100 tokens with 10 new ones
    lengths = [400, 100, 100, 100, 100, 90, 90, 20, 20, 20, 20, 20, 20, 20, 20, 20]
    batches = generator._decoding_batches(lengths, new_tokens=10)
    assert batches[0] == (0, 1)  # wider than the budget alone: a batch of its own, never none
    assert batches[1] == (1, 4)  # three rows of 100 fit, not four
    assert [stop - start for start, stop in batches[2:]] == [3, 8, 1]  # narrower rows fill up to batch_size
    params = SamplingParams(max_new_tokens=4)
    prompts = [generator.encode("word " * (length // 2)) for length in (60, 8, 8, 8)]
    capped = generator.generate(prompts, params)
    whole = TransformersGenerator(tiny_pair, batch_size=8).generate(prompts, params)
    assert [s[0].token_ids for s in capped] == [s[0].token_ids for s in whole]
    with pytest.raises(ValueError, match="batch_kv_mb"):
        TransformersGenerator(tiny_pair, batch_kv_mb=0)


def test_prefill_batches_are_capped_by_their_kv_memory(tiny_pair, monkeypatch):
    """The second turn of a rollout: long cached pasts and short new suffixes. Chunked by suffix length and token
    count alone, all rows prefilled in one batch whose past (rows x widest past) went uncapped (make train's
    RL-agent rollouts: a 2.5 GB past over a 2 GB prefix cache)."""
    assert _padding_bounded_chunks([5, 5, 5, 5], size=8, padding=0.25, past=[100, 100, 20, 20],
                                   max_positions=220) == [[0, 1], [2, 3]]
    assert _padding_bounded_chunks([5, 5], size=8, padding=0.25, past=[500, 20], max_positions=220) == [[0], [1]]
    config = tiny_pair[0].config
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * \
        (config.hidden_size // config.num_attention_heads) * 4  # float32
    params = SamplingParams(max_new_tokens=4)
    runs = {}
    for budget in (None, 2):
        generator = TransformersGenerator(tiny_pair, batch_size=8)
        prompts = [generator.encode(f"Row {row}: " + "word " * 40) for row in range(6)]
        first = generator.generate(prompts, params)
        prompts = [ids + samples[0].token_ids + generator.encode(" doc doc doc")
                   for ids, samples in zip(prompts, first, strict=True)]
        if budget is not None:  # room for two rows' past, with or without the decoded tokens
            generator.batch_kv_bytes = budget * (max(map(len, prompts)) + 4) * per_position
        widths: list[tuple[int, int]] = []  # (rows, positions of past) of each prefill batch
        original = TransformersGenerator._layout

        def spy(self, rows, new_tokens=0, drafted=False, widths=widths, original=original):
            batch = original(self, rows, new_tokens, drafted)
            if not new_tokens:
                widths.append((len(rows), batch.input_ids.shape[1]))
            return batch

        monkeypatch.setattr(TransformersGenerator, "_layout", spy)
        runs[budget] = ([s[0].token_ids for s in generator.generate(prompts, params)], widths)
        monkeypatch.undo()
    assert runs[None][1] == [(6, max(map(len, prompts)) - 1)]  # unbounded: one batch of every row
    assert runs[2][0] == runs[None][0]
    assert [rows for rows, _ in runs[2][1]] == [2, 2, 2]


@pytest.mark.parametrize("megabytes", [256, 0])
def test_greedy_decoding_that_drops_finished_rows_matches_generate(tiny_pair, monkeypatch, megabytes):
    rng = random.Random(1)
    generator = TransformersGenerator(tiny_pair, batch_size=8, prefix_cache_mb=megabytes)
    prompts = [generator.encode(f"Row {row}: " + "word " * rng.randint(2, 30)) for row in range(8)]
    runs = {}
    reorders: list[int] = []  # rows kept by each compaction of the current path
    original = StaticCache.reorder_cache
    monkeypatch.setattr(StaticCache, "reorder_cache",
                        lambda cache, selection: (reorders.append(len(selection)), original(cache, selection))[1])
    for path in ("drop", "generate"):
        if path == "generate":
            monkeypatch.setattr(TransformersGenerator, "_decode_greedy", TransformersGenerator._decode_with_generate)
        generator = TransformersGenerator(tiny_pair, batch_size=8, prefix_cache_mb=megabytes)
        reorders.clear()
        sequences = [list(ids) for ids in prompts]
        outputs = []
        insertions = random.Random(2)  # the same insertions on both paths
        for _turn in range(3):  # stop strings end rows at different steps; the next turn reuses their KV
            params = SamplingParams(max_new_tokens=12, stop=("ab", "e"), logprobs=True)
            completions = [samples[0] for samples in generator.generate(sequences, params)]
            outputs.append([(c.token_ids, c.finish_reason, c.stop, c.text) for c in completions])
            outputs.append([c.logprobs for c in completions])
            sequences = [ids + c.token_ids + [insertions.randrange(100, 5000) for _ in range(3)]
                         for ids, c in zip(sequences, completions, strict=True)]
        runs[path] = outputs, list(reorders), generator.stats.decode_tokens
    (ours, reorders, decoded), (theirs, untouched, decoded_too) = runs["drop"], runs["generate"]
    for mine, reference in zip(ours[0::2], theirs[0::2], strict=True):
        assert mine == reference
    for mine, reference in zip(ours[1::2], theirs[1::2], strict=True):
        assert [pytest.approx(row, abs=1e-4) for row in mine] == reference
    assert reorders and all(rows < 8 for rows in reorders) and not untouched  # finished rows left the batch
    assert decoded == decoded_too
