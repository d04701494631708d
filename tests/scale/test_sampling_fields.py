"""Item 8 of issue 28 (silent): the JSON the RL rollouts send to the policy server states the whole sampler, so
vLLM's generation-config defaults (Qwen2.5: top_k 20, repetition_penalty 1.05) never apply and the log-probs the
server returns are those of the distribution the trainer differentiates (temperature and top-p 1, full vocabulary)."""

from __future__ import annotations

import itertools
import json

import pytest

from prorag.data.records import Passage, load_questions
from prorag.judges import ReferenceJudge
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.store import PassageStore
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import RolloutScorer
from prorag.specs import AgentSpec
from prorag.training.config import GRPOSettings
from prorag.training.trl_grpo import AgentRolloutFunction, PolicyServer, build_grpo_trainer

from .conftest import ROOT, gpu_parameters

RAW = ROOT / "data" / "01_raw"


@pytest.fixture(scope="module")
def questions():
    return load_questions(RAW / "qa" / "hotpotqa.jsonl")[:2]


@pytest.fixture(scope="module")
def retriever():
    with (RAW / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 30)]
    return BM25Retriever.build(PassageStore(passages))


def test_rl_rollouts_send_every_sampling_field_at_the_trainers_values(questions, retriever, policy_server, tmp_path,
                                                                      one_torch_thread):
    url, captured = policy_server
    trainer_settings = gpu_parameters()["rl"]["trainer"]  # conf/gpu: temperature 1, top_p 1
    judge = ReferenceJudge(retriever)
    scorer = RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge, under_judge=judge)
    function = AgentRolloutFunction(
        questions, retriever, scorer, AgentSpec(step_budget=1, max_new_tokens_per_turn=8, max_total_new_tokens=16,
                                                few_shot=False),
        temperature=trainer_settings["temperature"], top_p=trainer_settings["top_p"], seed=0, batch_size=4,
        policy_server=PolicyServer(url.removesuffix("/v1"), "policy", timeout=30.0))
    in_process = AgentRolloutFunction(questions, retriever, scorer, function.agent, batch_size=4)
    # the trainer's side (TRL's weight sync) needs vLLM and a GPU; the rollout side is what is checked here
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, in_process, tmp_path,
                                 GRPOSettings(per_device_train_batch_size=4, num_generations=2))
    before = len(captured.of("/v1/completions"))
    function([question.question for question in questions for _ in range(2)], trainer)
    sent = captured.of("/v1/completions")[before:]
    rollouts = [body for body in sent if body.get("logprobs")]  # the policy's turns (re-asks ask no log-probs)
    assert rollouts
    for body in rollouts:
        assert (body["temperature"], body["top_p"]) == (1.0, 1.0)
        assert body["top_k"] == 0 and body["min_p"] == 0.0 and body["repetition_penalty"] == 1.0, body
        assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    seeds = [body["seed"] for body in rollouts]  # issue 42: one seed on all G copies collapsed every group
    assert len(set(seeds)) == len(seeds), seeds
    for body in sent:  # every request, re-asks included, states the sampler
        assert {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"} <= set(body)
