"""Corpus indexing: prepared passages → FAISS + BM25 index → recall of supporting passages."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.corpus_indexing.nodes import build_index, evaluate_retrieval, select_index_corpus


def create_pipeline(**kwargs: object) -> Pipeline:
    """Select the corpus, build the index, evaluate recall@k per dataset and retriever (namespace
    ``corpus_indexing``)."""
    return Pipeline([
        Node(select_index_corpus, ["passages", "questions", "params:corpus_indexing"],
             ["index_passages", "index_questions"], name="select_index_corpus", tags=[tags.DATA]),
        Node(build_index, ["index_passages", "params:corpus_indexing"], "retrieval_index", name="build_index",
             tags=[tags.DATA]),
        Node(evaluate_retrieval, ["retrieval_index", "index_questions", "params:corpus_indexing"],
             ["retrieval_recall", "retrieval_recall_metrics"], name="evaluate_retrieval", tags=[tags.EVALUATION]),
    ], namespace="corpus_indexing", prefix_datasets_with_namespace=False)
