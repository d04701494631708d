"""The ReasonRAG data nodes on real MuSiQue-train / HotpotQA questions with the tiny random policy."""

from __future__ import annotations

import pytest

from prorag.llm import BUNDLED_TINY_LLAMA
from prorag.pipelines.reasonrag_data.nodes import (
    build_reasonrag_pairs,
    check_disjoint,
    run_reasonrag_mcts,
    select_reasonrag_questions,
)
from prorag.pipelines.reasonrag_data.params import ReasonRAGDataParams
from prorag.specs import PolicySpec, TrainedAgentSpec
from prorag.training.mcts import MCTSValue

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VALUE = MCTSValue(rollouts=1)
"""The method's value function (``methods.<name>.value``): SPRE with one simulation per new node."""


def _params(tmp_path, **mcts) -> ReasonRAGDataParams:
    return ReasonRAGDataParams(
        questions={"sources": ["musique_train", "hotpotqa"], "max_per_source": 2},
        retriever={"kind": "bm25", "top_k": 2}, work_dir=str(tmp_path / "mcts"),
        mcts={"iterations": 2, "max_children": 2, "max_rounds": 3, "max_new_tokens": 6,
              "questions_per_batch": 2, **mcts})


def test_training_questions_exclude_the_evaluated_ones(questions, tmp_path):
    evaluated = [q for q in questions if q["source"] == "hotpotqa"][:1]
    selected = select_reasonrag_questions(questions, evaluated, _params(tmp_path))
    keys = [f"{q['dataset']}/{q['id']}" for q in selected]
    assert len(selected) == 4 and f"{evaluated[0]['dataset']}/{evaluated[0]['id']}" not in keys
    with pytest.raises(ValueError, match=r"1 ReasonRAG training question\(s\) are also evaluated: x/1"):
        check_disjoint(["x/1", "x/2"], {"x/1", "y/3"})
    with pytest.raises(ValueError, match="bamboogle"):
        select_reasonrag_questions(questions, [], ReasonRAGDataParams.model_validate(
            {**_params(tmp_path).model_dump(), "questions": {"sources": ["bamboogle"]}}))


@pytest.mark.slow
def test_mcts_node_writes_resumable_trees_and_a_report(questions, index, tmp_path):
    params = _params(tmp_path)
    policy = PolicySpec(model=BUNDLED_TINY_LLAMA, batch_size=8)
    selected = select_reasonrag_questions(questions, [], params)[:2]
    agent = TrainedAgentSpec(name="reasonrag_agent", protocol="reasonrag")
    records = run_reasonrag_mcts(selected, index, params, policy, agent, VALUE)
    assert {row["question_key"] for row in records} == {f"{q['dataset']}/{q['id']}" for q in selected}
    assert all(row["schema"] == "prorag.reasonrag_tree/v1" for row in records)
    files = list((tmp_path / "mcts").glob("*.jsonl"))
    assert len(files) == 1
    assert run_reasonrag_mcts(selected, index, params, policy, agent, VALUE) == records  # resumed: the same trees
    pairs, metrics, report = build_reasonrag_pairs(records, params, VALUE)
    assert metrics["questions"] == 2 and metrics["pairs"] == len(pairs)
    assert {"nodes", "pairs_per_question", "mean_depth", "invalid_samples"} <= set(metrics)
    assert report["metrics"] == metrics and report["value"]["kind"] == "spre"


def test_trees_searched_over_an_older_index_are_not_resumed_after_a_reindex(questions, index, tmp_path):
    from prorag.retrieval import build_retrieval_index

    params = _params(tmp_path, iterations=1, max_children=1, max_new_tokens=2)
    policy = PolicySpec(model=BUNDLED_TINY_LLAMA, batch_size=8)
    agent = TrainedAgentSpec(name="reasonrag_agent", protocol="reasonrag")
    selected = select_reasonrag_questions(questions, [], params)[:1]
    run_reasonrag_mcts(selected, index, params, policy, agent, VALUE)
    corpus = list(index.store)[:-3]  # re-index a different corpus slice
    reindexed = build_retrieval_index(corpus, "hashing:64", show_progress=False)
    run_reasonrag_mcts(selected, reindexed, params, policy, agent, VALUE)
    assert len(list((tmp_path / "mcts").glob("*.jsonl"))) == 2  # new trees, not the old index's resumed
