"""rollout → evaluation → reward judging on real questions, with the tiny random policy (plumbing, fast)."""

from pathlib import Path

import pytest

from prorag.data import load_corpus, load_questions
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.evaluation.nodes import evaluate_trajectories
from prorag.pipelines.reward_judging.nodes import judge_trajectories
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.pipelines.rollout.nodes import run_rollouts, select_rollout_questions
from prorag.pipelines.rollout.params import RolloutParams
from prorag.retrieval import build_retrieval_index
from prorag.rewards.hiprag import HiPRAGSettings
from prorag.specs import JudgeSpec, PolicySpec

TINY_POLICY = PolicySpec(model="bundled:tiny-random-llama", batch_size=4)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
RAW = PROJECT_ROOT / "data" / "01_raw"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def questions():
    return [q.to_dict() for name in ("hotpotqa", "popqa") for q in load_questions(RAW / "qa" / f"{name}.jsonl")[:3]]


@pytest.fixture(scope="module")
def index(questions):
    wanted = {pid for q in questions for pid in q["supporting_passage_ids"] + q.get("context_passage_ids", [])}
    corpus = [p for p in load_corpus([RAW / "corpus" / "hotpotqa.jsonl", RAW / "corpus" / "popqa.jsonl"])
              if p.id in wanted]
    return build_retrieval_index(corpus, "hashing:64", show_progress=False)


def _rollout_params(**overrides):
    values = {
        "questions": {"sources": ["hotpotqa", "popqa"], "max_per_source": 2},
        "methods": [
            {"name": "direct", "kind": "direct", "max_new_tokens": 8},
            {"name": "standard_rag", "kind": "standard_rag", "max_new_tokens": 8},
            {"name": "hiprag_agent", "kind": "agent", "step_budget": 2, "max_new_tokens_per_turn": 16,
             "max_total_new_tokens": 32},
        ],
        "retriever": {"kind": "bm25"},
    }
    return RolloutParams(**{**values, **overrides})


def test_question_selection(questions):
    selected = select_rollout_questions(questions, _rollout_params())
    assert [q["source"] for q in selected] == ["hotpotqa", "hotpotqa", "popqa", "popqa"]
    with pytest.raises(ValueError, match=r"names \['nq'\]"):
        select_rollout_questions(questions, _rollout_params(questions={"sources": ["nq"]}))


def test_rollout_evaluate_and_judge(questions, index):
    params = _rollout_params()
    selected = select_rollout_questions(questions, params)
    trajectories = run_rollouts(selected, index, params, TINY_POLICY)
    assert len(trajectories) == 3 * len(selected)
    assert {t["method"] for t in trajectories} == {"direct", "standard_rag", "hiprag_agent"}
    agent = [t for t in trajectories if t["method"] == "hiprag_agent"]
    assert all(t["stop_reason"] in {"answer", "forced_answer", "eos", "no_boundary", "token_budget"} for t in agent)
    assert all(t["generated_tokens"] <= 32 + 16 for t in agent)  # generation budget (+ the forced answer turn)

    table, metrics = evaluate_trajectories(trajectories)
    assert set(table["method"]) == {"direct", "standard_rag", "hiprag_agent"}
    assert set(table["dataset"]) == {"hotpotqa", "popqa", "all"}
    overall = metrics["standard_rag"]["all"]
    assert overall["n"] == len(selected)
    assert 0.0 <= overall["cem"] <= 1.0
    assert metrics["direct"]["all"]["avg_retrieval_count"] == 0
    assert metrics["standard_rag"]["all"]["avg_context_tokens"] > 0

    verdicts, rewards, judge_metrics = judge_trajectories(trajectories, index, RewardJudgingParams(), HiPRAGSettings(),
                                                          TINY_POLICY)
    assert len(verdicts) == len(agent) == len(rewards)
    assert judge_metrics["skipped_trajectories"] == 2 * len(selected)
    assert set(judge_metrics) == {"hiprag_agent", "skipped_trajectories"}
    # a random policy never answers in format: eq. 1 gives A(1 - λf) + λf F with F = 0
    for row in rewards.itertuples():
        assert row.reward == pytest.approx(row.outcome * 0.8 + row.format * 0.2 + row.process)


def test_judge_rejects_a_run_without_agent_trajectories(index):
    with pytest.raises(ValueError, match="no agent trajectory"):
        judge_trajectories([], index, RewardJudgingParams(), HiPRAGSettings(), TINY_POLICY)


def test_parameters_are_strict():
    with pytest.raises(ValueError, match="unique"):
        _rollout_params(methods=[{"name": "a", "kind": "direct"}, {"name": "a", "kind": "direct"}])
    with pytest.raises(ValueError, match="temprature"):
        _rollout_params(temprature=0.5)
    with pytest.raises(ValueError, match="kind"):
        HiPRAGSettings(over_search_judge={"kind": "oracle"})
    with pytest.raises(ValueError, match="top_k"):
        _rollout_params(retriever={"kind": "bm25", "top_k": True})  # a bool is not an int
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeSpec(max_concurrency="8")  # no coercion from strings


def test_registry_composes_train():
    pipelines = register_pipelines()
    train = {node.name for node in pipelines["train"].nodes}
    assert {"data_preparation.load_question_files", "corpus_indexing.build_index", "rollout.run_rollouts",
            "evaluation.evaluate_trajectories", "reward_judging.judge_trajectories"} <= train


def test_every_registered_protocol_is_a_selectable_evaluation_method(questions, index):
    from prorag.protocol.registry import protocol_names

    methods = [{"name": f"{name}_agent", "kind": "agent", "protocol": name, "step_budget": 1,
                "max_new_tokens_per_turn": 8, "max_total_new_tokens": 16, "few_shot": False}
               for name in protocol_names()]
    params = _rollout_params(methods=methods, questions={"sources": ["hotpotqa"], "max_per_source": 1})
    trajectories = run_rollouts(select_rollout_questions(questions, params), index, params, TINY_POLICY)
    assert {t["protocol"] for t in trajectories} == set(protocol_names()) >= {"hiprag", "multistage", "reasonrag"}
    table, _ = evaluate_trajectories(trajectories)
    assert {f"{name}_agent" for name in protocol_names()} <= set(table["method"])
    _, rewards, metrics = judge_trajectories(trajectories, index, RewardJudgingParams(), HiPRAGSettings(), TINY_POLICY)
    assert "multistage_agent" in metrics and len(rewards) == len(trajectories)
