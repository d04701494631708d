"""Data preparation: raw files picked by the parameters → primary questions and passages → data report."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.data_preparation.nodes import build_data_report, load_corpus_files, load_question_files


def create_pipeline(**kwargs: object) -> Pipeline:
    """Questions and corpus into the primary layer, then the data report (namespace ``data_preparation``).

    ``raw_question_files`` / ``raw_corpus_files`` are the raw folders; ``data_preparation.question_files`` and
    ``corpus_files`` pick the files, which may live anywhere (held-out files of the same schema)."""
    return Pipeline([
        Node(load_question_files, ["raw_question_files", "params:data_preparation"], "questions",
             name="load_question_files"),
        Node(load_corpus_files, ["raw_corpus_files", "params:data_preparation"], ["passages", "corpus_summary"],
             name="load_corpus_files"),
        Node(build_data_report, ["questions", "passages", "corpus_summary"],
             ["data_report", "data_report_table", "data_report_metrics"], name="build_data_report"),
    ], namespace="data_preparation", prefix_datasets_with_namespace=False, tags=[tags.DATA])
