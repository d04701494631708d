"""Nodes of the kg_extraction pipeline: index chunks → LLM triplets → knowledge graph (+ FAISS) → report."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from prorag.assembly import build_extractor
from prorag.data import Passage
from prorag.kg.extraction import ExtractedTriplet, extract_triplets
from prorag.kg.graph import KnowledgeGraph, build_knowledge_graph
from prorag.kg.kag import attach_knowledge_graph as attach_to_index
from prorag.pipelines.kg_extraction.params import KgExtractionParams
from prorag.retrieval import RetrievalIndex, source_passage_id


def select_kg_chunks(index: RetrievalIndex, question_records: list[dict[str, Any]],
                     params: KgExtractionParams) -> list[dict[str, Any]]:
    """The index chunks to extract from: those of the selected questions' passages (a windowed passage counts
    with all its windows), then a seeded sample of the other chunks. Ids are the index's chunk ids."""
    selection = params.chunks
    taken: Counter[str] = Counter()
    wanted: set[str] = set()
    for record in question_records:
        source = record.get("source") or record["dataset"]
        if selection.sources is not None and source not in selection.sources:
            continue
        if selection.max_questions_per_source is not None and taken[source] >= selection.max_questions_per_source:
            continue
        taken[source] += 1
        wanted.update(record.get("supporting_passage_ids") or ())
        if selection.question_passages == "context":
            wanted.update(record.get("context_passage_ids") or ())
    if selection.sources is not None:
        unknown = sorted(set(selection.sources) - set(taken))
        if unknown:
            raise ValueError(f"kg_extraction.chunks.sources names {unknown}, not among the indexed question sources")
    chunks = list(index.store)
    question_rows = [row for row, chunk in enumerate(chunks) if source_passage_id(chunk.id) in wanted]
    chosen = set(question_rows)
    others = [row for row in range(len(chunks)) if row not in chosen]
    if selection.max_background_chunks is None:
        background = others
    else:
        count = min(len(others), selection.max_background_chunks)
        background = sorted(random.Random(selection.seed).sample(others, count))
    return [chunks[row].to_dict() for row in (*question_rows, *background)]


def extract_kg_triplets(chunk_records: list[dict[str, Any]],
                        params: KgExtractionParams) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Triplets of every chunk (cached per model/prompt/chunk, so re-runs extract only new chunks) and counts."""
    spec, extraction = params.extractor, params.extraction
    settings = extraction.settings(spec)
    result = extract_triplets(build_extractor(spec), [Passage.from_dict(record) for record in chunk_records], settings)
    stats = {**result.stats.to_dict(), "model": spec.model, "backend": spec.backend, "prompt_id": settings.prompt_id,
             "filter_ungrounded": extraction.filter_ungrounded}
    return [triplet.to_dict() for triplet in result.triplets], stats


def build_kg(triplet_records: list[dict[str, Any]], index: RetrievalIndex,
             extraction_stats: dict[str, Any]) -> KnowledgeGraph:
    """Normalize and deduplicate entities, embed entities and triplets with the index's embedder (FAISS)."""
    triplets = [ExtractedTriplet(record["head"], record["relation"], record["tail"], record["chunk_id"],
                                 record["head_grounded"], record["tail_grounded"]) for record in triplet_records]
    extraction = {key: extraction_stats[key] for key in ("model", "backend", "prompt_id", "filter_ungrounded")}
    return build_knowledge_graph(triplets, index.embedder, chunk_count=extraction_stats["chunks"],
                                 extraction=extraction)


def report_kg(graph: KnowledgeGraph, extraction_stats: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The extraction report (chunks, triplets/chunk, parse-failure and ungrounded rates, distinct entities and
    relations, tokens/s), for data/08_reporting and, as ``kg_extraction_metrics``, for MLflow."""
    stats = graph.stats()
    chunks = extraction_stats["chunks"]
    report = {
        **extraction_stats,
        "distinct_entities": stats["entities"],
        "distinct_relations": stats["relations"],
        "graph_triplets": stats["triplets"],
        "graph_triplets_per_chunk": stats["triplets"] / chunks if chunks else 0.0,
        "chunks_with_triplets": stats["chunks_with_triplets"],
    }
    metrics = {key: value for key, value in report.items()
               if isinstance(value, int | float) and not isinstance(value, bool)}
    return report, metrics


def attach_knowledge_graph(index: RetrievalIndex, graph: KnowledgeGraph,
                           params: KgExtractionParams) -> RetrievalIndex:
    """The retrieval index with the knowledge graph attached, so ``retriever: kag`` / ``kag_concat`` work."""
    return attach_to_index(index, graph, params.kag.settings())
