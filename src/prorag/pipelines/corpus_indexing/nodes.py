"""Nodes of the corpus-indexing pipeline."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any

import pandas as pd

from prorag.data import Passage, Question, select_questions
from prorag.data.dumps import PassageFile, iter_passage_file
from prorag.pipelines.corpus_indexing.params import INDEX_OPTIONS, SCALE_OPTIONS, CorpusIndexingParams
from prorag.retrieval import RetrievalIndex, build_retrieval_index, evaluate_recall
from prorag.retrieval.index import build_retrieval_index_at_scale, import_prebuilt_index

logger = logging.getLogger(__name__)


def select_index_corpus(passage_records: list[dict[str, Any]], question_records: list[dict[str, Any]],
                        params: CorpusIndexingParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The questions and corpus to index: every passage the selected questions point at plus the background.

    With both caps null this is the whole prepared corpus and every question (paper scale).
    """
    questions = question_records
    if params.max_questions_per_source is not None:
        parsed = [Question.from_dict(record) for record in question_records]
        parts = ("tuning", "reporting") if params.per_part else ("all",)
        chosen = {question.key for part in parts
                  for question in select_questions(parsed, max_per_source=params.max_questions_per_source, part=part)}
        questions = [record for record, question in zip(question_records, parsed, strict=True)
                     if question.key in chosen]
    if params.max_background_passages is None:
        return passage_records, questions
    referenced = {pid for record in questions
                  for pid in (*record.get("supporting_passage_ids", ()), *record.get("context_passage_ids", ()))}
    background = [index for index, record in enumerate(passage_records) if record["id"] not in referenced]
    sampled = set(random.Random(params.seed).sample(background, min(len(background), params.max_background_passages)))
    corpus = [record for index, record in enumerate(passage_records) if record["id"] in referenced or index in sampled]
    return corpus, questions


def build_index(passage_records: list[dict[str, Any]], params: CorpusIndexingParams) -> RetrievalIndex:
    """Embed in shards and build the FAISS and BM25 indexes.

    ``prebuilt``: the given FAISS index and corpus, used as they are. ``corpus_files``: those files streamed into a
    resumable build under ``work_dir`` (the prepared passages are not indexed). ``work_dir`` alone: the prepared
    passages through the same resumable build. Otherwise the in-memory build (the bundled corpus).
    """
    if params.prebuilt is not None:
        return import_prebuilt_index(params.prebuilt.faiss_index, params.prebuilt.corpus,
                                     corpus_format=params.prebuilt.format, embedder_spec=params.embedder,
                                     query_prefix=params.query_prefix, passage_prefix=params.passage_prefix,
                                     build_bm25=params.build_bm25, max_record_bytes=params.max_record_bytes)
    if params.work_dir is None:
        return build_retrieval_index((Passage.from_dict(record) for record in passage_records), params.embedder,
                                     params.index_type, **params.model_dump(include=INDEX_OPTIONS))
    if params.corpus_files is not None:
        files = [PassageFile(item.path, item.format, params.max_record_bytes) for item in params.corpus_files]
        source: dict[str, Any] = {"files": [item.fingerprint() for item in files]}
        passages: Iterator[tuple[str, Passage]] = _stream_files(files)
    else:
        source = {"prepared_passages": len(passage_records), "first": passage_records[0]["id"] if passage_records
                  else None, "last": passage_records[-1]["id"] if passage_records else None}
        passages = ((f"index_passages #{row}", Passage.from_dict(record)) for row, record in enumerate(passage_records))
    return build_retrieval_index_at_scale(passages, params.work_dir, params.embedder, params.index_type,
                                          source=source, **params.model_dump(include=SCALE_OPTIONS))


def _stream_files(files: list[PassageFile]) -> Iterator[tuple[str, Passage]]:
    for item in files:
        for line, _, passage in iter_passage_file(item.path, item.format, max_record_bytes=item.max_record_bytes):
            yield f"{item.path}:{line}", passage


def evaluate_retrieval(index: RetrievalIndex, question_records: list[dict[str, Any]],
                       params: CorpusIndexingParams) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Recall@k of supporting passages per question file and retriever: a table and the metrics for MLflow."""
    settings = params.evaluation
    if params.corpus_files is not None or params.prebuilt is not None:
        logger.warning("corpus_indexing: the index holds an external corpus whose passage ids are not the "
                       "questions' supporting ids; recall@k of supporting passages is not measured")
        return pd.DataFrame(columns=["retriever", "dataset"]), {}
    questions = [Question.from_dict(record) for record in question_records]
    rows: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    needs_bm25 = sorted({"bm25", "hybrid"} & set(settings.retrievers))
    if needs_bm25 and not index.has_bm25:
        raise ValueError(f"corpus_indexing.evaluation.retrievers lists {needs_bm25} but the index has no BM25 "
                         "(corpus_indexing.build_bm25 is false)")
    for kind in settings.retrievers:
        result = evaluate_recall(index.retriever(kind), questions, settings.ks,
                                 group_by=lambda question: question.source)
        for dataset, values in [*result["by_dataset"].items(), ("all", _overall(result))]:
            rows.append({"retriever": kind, "dataset": dataset, **values})
            metrics.setdefault(kind, {})[dataset] = values
    return pd.DataFrame(rows), metrics


def _overall(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in ("by_dataset", "skipped_without_supporting")}
