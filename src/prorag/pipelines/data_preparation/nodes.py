"""Nodes of the data-preparation pipeline."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pandas as pd

from prorag.data import (
    DataFileError,
    Passage,
    Question,
    RawFiles,
    deduplicate_passages,
    load_questions,
    read_corpus_files,
)
from prorag.metrics import cover_exact_match
from prorag.pipelines.data_preparation.params import DataPreparationParams


def load_question_files(raw_files: RawFiles, params: DataPreparationParams) -> list[dict[str, Any]]:
    """Read, validate and normalize every configured question file into one list of records (``raw_files``, the
    raw folder, names what is there when a configured file is missing)."""
    raw_files.check(params.question_files, "data_preparation.question_files")
    questions: list[Question] = []
    origin: dict[str, str] = {}
    for path in params.question_files:
        loaded = load_questions(path)
        if params.max_questions_per_source is not None:
            loaded = loaded[: params.max_questions_per_source]
        for question in loaded:
            if question.key in origin:
                raise DataFileError(path, f"question {question.key!r} is also in {origin[question.key]}")
            origin[question.key] = path
        questions.extend(loaded)
    return [question.to_dict() for question in questions]


def load_corpus_files(raw_files: RawFiles, params: DataPreparationParams,
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Read, validate, normalize and deduplicate every configured corpus file (``raw_files`` as for questions).

    Returns the passages and a summary: passages per file and exact duplicates dropped.
    """
    raw_files.check(params.corpus_files, "data_preparation.corpus_files")
    read, origins = read_corpus_files(params.corpus_files)
    passages = deduplicate_passages(read, origins)
    per_file = Counter(origin.rsplit(":", 1)[0] for origin in origins)
    summary = {"passages_per_corpus_file": {Path(path).stem: per_file[path] for path in params.corpus_files},
               "duplicate_passages_dropped": len(read) - len(passages)}
    return [passage.to_dict() for passage in passages], summary


def build_data_report(question_records: list[dict[str, Any]], passage_records: list[dict[str, Any]],
                      corpus_summary: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame, dict[str, Any]]:
    """Counts per question source, corpus coverage, and how often the answer is in a supporting passage.

    Returns the full report (with the ids of questions whose supporting passages are missing), a
    per-source table, and the numeric summary that the tracking hook logs as metrics.
    """
    passages = {record["id"]: Passage.from_dict(record) for record in passage_records}
    by_source: dict[str, list[Question]] = defaultdict(list)
    for record in question_records:
        question = Question.from_dict(record)
        by_source[question.source].append(question)

    rows = []
    missing_ids: dict[str, list[str]] = {}
    for source, questions in sorted(by_source.items()):
        with_support = [q for q in questions if q.supporting_passage_ids]
        missing = [q for q in with_support if any(pid not in passages for pid in q.supporting_passage_ids)]
        complete = [q for q in with_support if q not in missing]
        answer_found = sum(
            any(cover_exact_match(passages[pid].contents, q.golden_answers) for pid in q.supporting_passage_ids)
            for q in complete)
        missing_ids[source] = [q.id for q in missing]
        rows.append({
            "source": source,
            "datasets": ",".join(sorted({q.dataset for q in questions})),
            "questions": len(questions),
            "with_supporting_passages": len(with_support),
            "supporting_passages_missing": len(missing),
            "answer_in_supporting_passage": answer_found,
            "answer_in_supporting_passage_rate": round(answer_found / len(complete), 4) if complete else None,
            "mean_golden_answers": round(sum(len(q.golden_answers) for q in questions) / len(questions), 3),
        })

    table = pd.DataFrame(rows)
    report = {
        "questions_total": len(question_records),
        "passages_total": len(passages),
        **corpus_summary,
        "sources": rows,
        "questions_with_missing_supporting_passages": missing_ids,
    }
    metrics = {
        "questions_total": report["questions_total"],
        "passages_total": report["passages_total"],
        "duplicate_passages_dropped": report["duplicate_passages_dropped"],
        **{f"{row['source']}.{key}": value for row in rows for key, value in row.items()
           if key not in {"source", "datasets"} and value is not None},
    }
    return report, table, metrics
