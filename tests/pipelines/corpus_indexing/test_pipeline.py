"""The corpus-indexing nodes on the real vendored data."""

from pathlib import Path

import pytest

from prorag.data import load_corpus, load_questions
from prorag.pipelines.corpus_indexing import create_pipeline
from prorag.pipelines.corpus_indexing.nodes import build_index, evaluate_retrieval, select_index_corpus
from prorag.pipelines.corpus_indexing.params import CorpusIndexingParams
from prorag.retrieval import RetrievalIndex

PROJECT_ROOT = Path(__file__).resolve().parents[3]
RAW = "data/01_raw"


@pytest.fixture(scope="module")
def records():
    questions = [q.to_dict() for name in ("hotpotqa", "popqa", "nq")
                 for q in load_questions(PROJECT_ROOT / RAW / "qa" / f"{name}.jsonl")]
    passages = [p.to_dict() for p in load_corpus([PROJECT_ROOT / RAW / "corpus" / f"{name}.jsonl"
                                                   for name in ("hotpotqa", "popqa")])]
    return questions, passages


def test_selection_keeps_every_referenced_passage_and_caps_the_background(records):
    questions, passages = records
    params = CorpusIndexingParams(max_questions_per_source=3, max_background_passages=7, seed=1)
    corpus, selected = select_index_corpus(passages, questions, params)
    assert [q["source"] for q in selected] == ["hotpotqa"] * 3 + ["popqa"] * 3 + ["nq"] * 3
    referenced = {pid for q in selected
                  for pid in q.get("supporting_passage_ids", []) + q.get("context_passage_ids", [])}
    ids = [p["id"] for p in corpus]
    assert referenced <= set(ids)
    assert len(ids) == len(set(ids)) == len(referenced) + 7
    again, _ = select_index_corpus(passages, questions, params)
    assert again == corpus  # seeded


def test_no_caps_means_everything(records):
    questions, passages = records
    corpus, selected = select_index_corpus(passages, questions, CorpusIndexingParams())
    assert corpus is passages
    assert selected is questions


def test_nodes_build_an_index_that_finds_supporting_passages(records):
    questions, passages = records
    params = CorpusIndexingParams(max_questions_per_source=4, max_background_passages=20)
    corpus, selected = select_index_corpus(passages, questions, params)
    index = build_index(corpus, params)
    assert isinstance(index, RetrievalIndex)
    assert len(index) == len(corpus)
    assert index.meta.embedder_spec == "bundled:all-minilm-l6-v2"
    assert index.has_bm25
    table, metrics = evaluate_retrieval(index, selected, params)
    assert set(table["retriever"]) == {"dense", "bm25", "hybrid"}
    assert set(table["dataset"]) == {"hotpotqa", "popqa", "all"}
    hotpot = table[(table.retriever == "dense") & (table.dataset == "hotpotqa")].iloc[0]
    assert hotpot["questions"] == 4
    assert hotpot["recall@10"] >= 0.5  # 4 questions x 10 context passages + 20 others: the gold is findable
    assert hotpot["recall@1"] <= hotpot["recall@3"] <= hotpot["recall@5"] <= hotpot["recall@10"]
    assert metrics["dense"]["hotpotqa"]["recall@10"] == hotpot["recall@10"]


def test_pipeline_wiring():
    pipeline = create_pipeline()
    assert pipeline.inputs() == {"passages", "questions", "params:corpus_indexing"}
    assert pipeline.outputs() == {"retrieval_recall", "retrieval_recall_metrics"}
    assert "retrieval_index" in pipeline.all_outputs()


def test_bm25_evaluation_without_bm25_index_is_a_clear_error():
    class NoBM25:
        has_bm25 = False

    with pytest.raises(ValueError, match=r"corpus_indexing\.build_bm25 is false"):
        evaluate_retrieval(NoBM25(), [], CorpusIndexingParams())  # type: ignore[arg-type]


def test_unknown_evaluation_key_is_rejected():
    with pytest.raises(ValueError, match="k_values"):
        CorpusIndexingParams(evaluation={"k_values": [1]})
    with pytest.raises(ValueError, match="retrievers"):
        CorpusIndexingParams(evaluation={"retrievers": ["splade"]})


def test_numeric_parameters_are_strict_and_bounded():
    with pytest.raises(ValueError, match=r"evaluation\.ks\.0"):
        CorpusIndexingParams(evaluation={"ks": [0]})  # recall@0 would fail after the index is built
    with pytest.raises(ValueError, match="nprobe"):
        CorpusIndexingParams(nprobe=True)  # a bool is not an int
    with pytest.raises(ValueError, match="shard_size"):
        CorpusIndexingParams(shard_size=4096.0)  # nor is a float
    with pytest.raises(ValueError, match="seed"):
        CorpusIndexingParams(seed=-1)
