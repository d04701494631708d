"""Issue 42, item 1: the samples of one prompt drawn through a server are G samples, not one sample G times.

The engine rolls a question out G times in one ``generate`` call per turn, with one seed for the call. A server seeds
a generator per request (vLLM, ``prorag serve``), so the G requests of a group must not carry the same seed, or the
group collapses to one rollout and every GRPO advantage is zero.
"""

from __future__ import annotations

import itertools
import json

import pytest

from prorag.agent.engine import RolloutEngine
from prorag.data.records import Passage, load_questions
from prorag.llm.generation import SamplingParams, request_seeds
from prorag.llm.openai_backend import OpenAICompatibleGenerator
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.store import PassageStore

from ..agent.conftest import RAW
from .conftest import MODEL_NAME

GROUP = 4


@pytest.fixture(scope="module")
def served(base_url, tiny_generator):
    with OpenAICompatibleGenerator(base_url, MODEL_NAME, tokenizer=tiny_generator.tokenizer) as generator:
        yield generator


@pytest.fixture(scope="module")
def retriever():
    with (RAW / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 30)]
    return BM25Retriever.build(PassageStore(passages))


def test_engine_groups_through_a_server_are_not_one_rollout_copied(served, retriever):
    questions = load_questions(RAW / "qa" / "hotpotqa.jsonl")[:2]
    engine = RolloutEngine(served, retriever, "hiprag", step_budget=1, max_new_tokens_per_turn=12,
                           max_total_new_tokens=24, temperature=1.0, seed=0, progress=False)
    rollouts = engine.run(questions, samples=GROUP)
    for group in (rollouts[:GROUP], rollouts[GROUP:]):
        distinct = {rollout.completion for rollout in group}
        assert len(distinct) >= GROUP - 1, distinct


def test_seeded_calls_through_a_server_are_reproducible(served):
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7)
    prompts = ["The capital of France is"] * GROUP
    first = [samples[0].text for samples in served.generate(prompts, params)]
    assert [samples[0].text for samples in served.generate(prompts, params)] == first
    assert len(set(first)) >= GROUP - 1


def test_request_seeds_differ_per_prompt_and_per_call_seed():
    seeds = request_seeds(0, 64)
    assert len(set(seeds)) == 64 and request_seeds(0, 64) == seeds
    assert not set(seeds) & set(request_seeds(1, 64))
    assert all(0 <= seed < 2**63 for seed in seeds)
    assert request_seeds(None, 3) == [None, None, None]
