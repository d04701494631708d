"""The plug-in test, for real: a fifth method — a per-step information-gain reward (``tests/plugins/info_gain.py``,
outside ``src/prorag``) on the existing HiPRAG protocol — is registered and runs through rollout → reward → one
GRPO step → ``compare`` → reward judging on the tiny model, with no file under ``src/prorag`` touched for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.plugins.info_gain import InfoGainReward, InfoGainSettings

from prorag.agent.runner import build_engine
from prorag.agent.trajectory import Rollout
from prorag.assembly import build_policy, build_retriever, build_scorer
from prorag.config import ParameterError, parse_parameters
from prorag.data import Question
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.pipelines.compare.nodes import run_compare_rollouts
from prorag.pipelines.compare.params import CompareParams
from prorag.pipelines.kg_extraction.params import KgExtractionParams
from prorag.pipelines.reward_judging.nodes import judge_trajectories
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.rewards.base import RewardSettings, ScoringContext
from prorag.rewards.registry import check_reward_protocol, register_reward, reward_kinds, unregister_reward
from prorag.specs import PolicySpec, RetrieverSpec, SamplingSpec, TrainedAgentSpec
from prorag.tracking.missing_inputs import Available
from prorag.training.config import GRPOSettings
from prorag.training.trl_grpo import AgentRolloutFunction, train_grpo_lora

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SRC = Path(__file__).resolve().parents[2] / "src" / "prorag"
TINY = PolicySpec(model=BUNDLED_TINY_LLAMA, batch_size=8)
AGENT = TrainedAgentSpec(step_budget=2, max_new_tokens_per_turn=12, max_total_new_tokens=24)
ENTRY: dict[str, Any] = {"kind": "info_gain", "lambda_g": 0.5}


@pytest.fixture()
def info_gain():
    register_reward(InfoGainReward)
    yield InfoGainReward
    unregister_reward("info_gain")


def test_nothing_under_src_names_the_fifth_method():
    assert not [path for path in SRC.rglob("*.py") if "info_gain" in path.read_text(encoding="utf-8")]


def test_its_conf_entry_is_validated_by_its_own_settings(info_gain):
    assert "info_gain" in reward_kinds()
    settings = parse_parameters(RewardSettings, ENTRY, "reward")
    assert isinstance(settings, InfoGainSettings) and settings.lambda_g == 0.5
    with pytest.raises(ParameterError, match=r"unknown parameter key 'reward\.lambda_gg'; did you mean "
                                             r"'reward\.lambda_g'\?"):
        parse_parameters(RewardSettings, {"kind": "info_gain", "lambda_gg": 0.5}, "reward")
    check_reward_protocol(settings, "hiprag")  # any protocol the multistage / TeaRAG rewards do not claim
    with pytest.raises(ValueError, match="goes with the 'multistage' reward only"):
        check_reward_protocol(settings, "multistage")


def test_its_gain_counts_only_supporting_passages_found_first(info_gain, questions):
    question = Question.from_dict(questions[0])
    supporting = list(question.supporting_passage_ids)
    assert len(supporting) >= 2
    rollout = Rollout(question_key=question.key, question_id=question.id, dataset=question.dataset,
                      question=question.question, golden_answers=question.golden_answers, method="agent",
                      protocol="hiprag", prompt="", prompt_token_ids=[], completion="", segments=[], steps=[],
                      format_ok=True, n_steps=3, answer=question.golden_answers[0], stop_reason="answer",
                      retrieval_count=3, queries=["a", "b", "c"],
                      retrieved_ids=[[supporting[0], "x"], [supporting[0]], [supporting[1]]], generated_tokens=1,
                      context_tokens=1, tag_tokens=1, turns=3)
    scores = InfoGainReward(InfoGainSettings(lambda_g=0.5)).score([rollout], ScoringContext(
        questions={question.key: question}))
    share = 1 / len(supporting)
    assert scores.components["gain"] == [pytest.approx(0.5 * 2 * share)]  # the repeated passage earns nothing
    assert scores.totals == [pytest.approx(0.8 + 0.2 + 0.5 * 2 * share)]


@pytest.mark.integration
def test_a_fifth_method_runs_through_rollout_reward_grpo_compare_and_judging(info_gain, questions, index, tmp_path):
    chosen = [Question.from_dict(record) for record in questions[:2]]
    settings = parse_parameters(RewardSettings, ENTRY, "reward")
    scorer = build_scorer(settings, index, questions=chosen)
    retriever = build_retriever(RetrieverSpec(kind="bm25", top_k=2), index)

    # rollout → reward
    generator = build_policy(TINY)
    rollouts = build_engine(AGENT, generator, retriever, top_k=2, sampling=SamplingSpec()).run(chosen)
    scored = scorer.score(rollouts, generator)
    assert set(scored.components) == {"outcome", "format", "gain"}
    assert scored.totals == pytest.approx([sum(values) for values in zip(*scored.components.values(), strict=True)])
    assert "format_rate" in scored.stats and scored.verdicts is None  # no detection asked for
    del generator

    # one GRPO step: TRL logs the plug-in's components by name
    function = AgentRolloutFunction(chosen, retriever, scorer, AGENT, top_k=2, seed=0, batch_size=4)
    adapter, history = train_grpo_lora(BUNDLED_TINY_LLAMA, chosen, function, tmp_path / "grpo", GRPOSettings(
        max_steps=1, per_device_train_batch_size=4, num_generations=2, learning_rate=1e-3, save_steps=1))
    assert Path(adapter, "adapter_config.json").is_file()
    assert any("rewards/gain/mean" in entry for entry in history)

    # compare: the trained adapter is one more arm beside a baseline, on the same questions
    artifacts = {"info_gain_adapter": Available(str(adapter), "test")}  # as compare's optional input loads it
    params = CompareParams(questions={"max_per_source": 1}, retriever={"kind": "bm25", "top_k": 2},
                           arms=[{"name": "standard_rag", "method": {"kind": "standard_rag", "max_new_tokens": 8}},
                                 {"name": "info_gain_grpo", "method": "info_gain", "adapter": "info_gain_adapter"}],
                           bootstrap_resamples=100, permutation_resamples=99)
    methods = {"info_gain": {"recipe": "rl_from_sft", "adapter": "info_gain_adapter", "agent": AGENT.model_dump(),
                             "reward": ENTRY, "retriever": {"kind": "bm25", "top_k": 2}}}  # its conf entry, resolved
    records, arms = run_compare_rollouts(questions[:2], index, params, TINY, methods, KgExtractionParams(),
                                         **artifacts)
    assert dict(zip(arms["arm"], arms["status"], strict=True)) == {"standard_rag": "ran", "info_gain_grpo": "ran"}
    trained = [record for record in records if record["method"] == "info_gain_grpo"]
    assert {record["question_key"] for record in trained} == {question.key for question in chosen}

    # reward judging scores the arm's trajectories with the same plug-in reward (gold evidence: index_questions)
    judged = [record for record in records if record["method"] == "info_gain_grpo"]
    _, table, metrics = judge_trajectories(judged, index, RewardJudgingParams(), settings, TINY, questions)
    assert {"outcome", "format", "gain"} <= set(table.columns)
    assert "gain" in metrics["info_gain_grpo"]
