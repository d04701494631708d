import random

import pytest
import torch

from prorag.llm import transformers_backend
from prorag.llm.generation import (
    Completion,
    GenerationCancelled,
    Generator,
    SamplingParams,
    cut_at_stop,
    generate_chat,
)
from prorag.llm.registry import BUNDLED_SMOLLM2
from prorag.llm.transformers_backend import TransformersGenerator, _StopStrings

PROMPTS = [
    "The capital of France is",
    "Hello",
    "A much longer prompt, which needs left padding when it shares a batch with the short ones above",
    "Question: who wrote Hamlet?\nAnswer:",
]


def test_sampling_params_are_validated_and_normalized():
    assert SamplingParams(8, stop="</answer>").stop == ("</answer>",)
    assert SamplingParams(8, stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(8).greedy and not SamplingParams(8, temperature=0.5).greedy
    for bad in ({"max_new_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"n": 0}, {"stop": ("",)},
                {"seed": 1.5}):
        with pytest.raises(ValueError):
            SamplingParams(**{"max_new_tokens": 8, **bad})


def test_cut_at_stop_keeps_the_earliest_stop_string():
    assert cut_at_stop("a</search> b</answer>", ("</answer>", "</search>")) == ("a</search>", "</search>")
    assert cut_at_stop("no boundary", ("</answer>",)) == ("no boundary", None)


def test_batched_greedy_equals_one_by_one(tiny_generator):
    assert isinstance(tiny_generator, Generator)
    params = SamplingParams(max_new_tokens=12)
    batched = tiny_generator.generate(PROMPTS, params)
    for prompt, samples in zip(PROMPTS, batched, strict=True):
        (alone,) = tiny_generator.generate([prompt], params)[0]
        (together,) = samples
        assert together.text == alone.text
        assert together.token_ids == alone.token_ids
        assert together.finish_reason == "length" and together.stop is None
        assert len(together.token_ids) == 12
        assert together.prompt_tokens == len(tiny_generator.tokenizer(prompt)["input_ids"])


def _stop_inside(generator, ids: list[int], avoid: str) -> tuple[str, int]:
    """A stop string that first completes at token k (< len(ids)) of ``ids`` and does not occur in ``avoid``."""
    full = generator.tokenizer.decode(ids)
    for k in range(3, len(ids) - 2):
        prefix = generator.tokenizer.decode(ids[:k])
        candidate = prefix[-3:]
        if candidate.strip() and full.find(candidate) + len(candidate) == len(prefix) and candidate not in avoid:
            return candidate, k
    raise AssertionError(f"no usable stop string in {full!r}")


def test_stop_strings_finish_rows_independently(tiny_generator):
    prompts = PROMPTS[:2]
    free = tiny_generator.generate(prompts, SamplingParams(max_new_tokens=16, logprobs=True))
    first, second = free[0][0], free[1][0]
    stop, k = _stop_inside(tiny_generator, first.token_ids, second.text)

    stopped = tiny_generator.generate(prompts, SamplingParams(max_new_tokens=16, stop=("@@never@@", stop),
                                                              logprobs=True))
    early, late = stopped[0][0], stopped[1][0]
    assert early.finish_reason == "stop" and early.stop == stop
    assert early.text.endswith(stop) and early.text == first.text[: first.text.find(stop) + len(stop)]
    assert early.token_ids == first.token_ids[:k]
    assert early.logprobs == pytest.approx(first.logprobs[:k], abs=1e-5)
    # the other row went on to the token limit, unaffected
    assert late.finish_reason == "length" and late.stop is None
    assert late.token_ids == second.token_ids and late.text == second.text


def test_stop_filters_skip_only_rows_that_cannot_have_completed_a_stop(tiny_generator):
    tokenizer = tiny_generator.tokenizer
    stops = ("</search>", "</answer>", "ab")
    texts = ["x </search> y", "plain words", "é</answer> and more", "<</search", "a slab of", "...>>", " a</answer>b"]
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    rng = random.Random(0)
    rows += [[rng.randrange(len(tokenizer)) for _ in range(12)] for _ in range(8)]
    pad = tiny_generator.pad_token_id
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad, *row, *[pad] * (width - len(row))] for row in rows])  # a 1-token prompt, then padding
    may_end, may_start = tiny_generator._stop_filters(stops)
    assert may_end is not None and may_start is not None
    assert all(len(tokens) < len(tokenizer) // 50 for tokens in tiny_generator._stop_filters(("</search>",)))
    filtered = _StopStrings(tokenizer, stops, 1, len(rows), {pad}, may_end, may_start)
    plain = _StopStrings(tokenizer, stops, 1, len(rows), {pad})  # decodes every row at every token
    for length in range(2, width + 2):
        assert filtered(ids[:, :length], None).tolist() == plain(ids[:, :length], None).tolist()
    assert filtered.stopped_at == plain.stopped_at and set(plain.stopped_at) >= {0, 2, 4, 6}
    assert tiny_generator._stop_filters(("\n\n", "é")) == (None, None)  # non-ASCII end, whitespace start


def test_end_of_sequence_finishes_with_stop_and_keeps_the_eos_id(tiny_generator):
    tokenizer = tiny_generator.tokenizer
    words = tokenizer(" hello world", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=8, stop=("@@never@@",))
    done = tiny_generator._finish_row([*words, eos, eos], [-1.0] * (len(words) + 2), 5, params, None)
    assert done == Completion(" hello world", [*words, eos], [-1.0] * (len(words) + 1), "stop", None, 5)


def test_seeded_samples_are_reproducible_and_distinct(tiny_generator):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=3, seed=7)
    state = torch.get_rng_state()
    first = tiny_generator.generate(PROMPTS[:2], params)
    assert torch.equal(state, torch.get_rng_state())  # the caller's RNG is left alone
    again = tiny_generator.generate(PROMPTS[:2], params)
    assert [[c.token_ids for c in samples] for samples in first] == [[c.token_ids for c in s] for s in again]
    for samples in first:
        assert len(samples) == 3
        assert len({tuple(c.token_ids) for c in samples}) == 3
    other = tiny_generator.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, temperature=1.0, n=3, seed=8))
    assert [c.token_ids for c in other[0]] != [c.token_ids for c in first[0]]


def test_a_cancelled_call_stops_at_the_next_decoded_token(tiny_generator):
    checks = []

    def cancelled() -> bool:  # one check before the batch, then one per decoded token: gone after the 4th
        checks.append(1)
        return len(checks) > 4

    params = SamplingParams(max_new_tokens=500, temperature=1.0, n=4)
    with pytest.raises(GenerationCancelled, match="cancelled after 4 decoded tokens"):
        tiny_generator.generate(["hello", "there"], params, cancelled=cancelled)
    assert len(checks) == 5  # decoding stopped at the first check that said so
    never = tiny_generator.generate(["hello"], SamplingParams(max_new_tokens=5), cancelled=lambda: False)
    assert len(never[0][0].token_ids) == 5  # the generator is usable after a cancelled call


def test_a_cancelled_call_still_hands_the_heap_back(tiny_generator, monkeypatch):
    returned = []
    monkeypatch.setattr(transformers_backend, "return_free_heap", lambda: returned.append(1))
    with pytest.raises(GenerationCancelled):
        tiny_generator.generate(["hello", "there"], SamplingParams(max_new_tokens=50, temperature=1.0, n=2),
                                cancelled=lambda: True)
    assert returned == [1]  # the cancelled batches' pasts go back to the OS now, not at the next call


def test_greedy_n_returns_independent_copies(tiny_generator):
    samples = tiny_generator.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, n=2))[0]
    assert samples[0] == samples[1] and samples[0].token_ids is not samples[1].token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_those_of_the_chosen_tokens(tiny_generator, temperature):
    prompt = PROMPTS[0]
    params = SamplingParams(max_new_tokens=8, temperature=temperature, top_p=0.9, seed=3, logprobs=True)
    (completion,) = tiny_generator.generate([prompt], params)[0]
    assert completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids) == 8
    assert all(value <= 0.0 for value in completion.logprobs)
    # teacher forcing: log_softmax(logits / T) of each chosen token, before top-p truncation
    prompt_ids = tiny_generator.encode(prompt)
    with torch.inference_mode():
        logits = tiny_generator.model(torch.tensor([prompt_ids + completion.token_ids])).logits[0].float()
    scale = temperature or 1.0
    steps = torch.log_softmax(logits[len(prompt_ids) - 1 : -1] / scale, dim=-1)
    expected = steps.gather(1, torch.tensor(completion.token_ids)[:, None]).squeeze(1)
    assert completion.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_token_id_prompts_and_chat_helpers(tiny_generator):
    params = SamplingParams(max_new_tokens=5)
    ids = tiny_generator.encode(PROMPTS[3])
    assert tiny_generator.generate([ids], params) == tiny_generator.generate([PROMPTS[3]], params)
    messages = [{"role": "user", "content": "Who wrote Hamlet?"}]
    text = tiny_generator.apply_chat_template(messages)
    assert "Who wrote Hamlet?" in text and text.endswith("assistant\n")
    assert generate_chat(tiny_generator, [messages], params) == tiny_generator.generate([text], params)
    assert tiny_generator.generate([], params) == []
    with pytest.raises(ValueError, match="empty prompt"):
        tiny_generator.generate([""], params)
    with pytest.raises(ValueError, match="token ids"):
        tiny_generator.generate([[10**9]], params)


@pytest.mark.slow
def test_smollm2_stops_one_row_while_the_other_continues(one_torch_thread):
    generator = TransformersGenerator(BUNDLED_SMOLLM2, dtype="bfloat16")
    conversations = [
        [{"role": "user", "content": "What is the capital of France? Answer with one word."}],
        [{"role": "user", "content": "Count from 1 to 30, separated by commas."}],
    ]
    capital, counting = (samples[0] for samples in generator.generate_chat(
        conversations, SamplingParams(max_new_tokens=16, stop=("Paris",))))
    assert capital.finish_reason == "stop" and capital.stop == "Paris" and capital.text.endswith("Paris")
    assert len(capital.token_ids) < 16
    assert counting.finish_reason == "length" and len(counting.token_ids) == 16 and "Paris" not in counting.text
