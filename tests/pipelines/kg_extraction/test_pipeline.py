"""The kg_extraction nodes on real vendored data (tiny model for plumbing), the pipeline in kedro-viz."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kedro.framework.startup import bootstrap_project

from prorag.kg.extraction import ExtractedTriplet
from prorag.kg.graph import KnowledgeGraph, build_knowledge_graph
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.kg_extraction.nodes import (
    attach_knowledge_graph,
    build_kg,
    extract_kg_triplets,
    report_kg,
    select_kg_chunks,
)
from prorag.pipelines.kg_extraction.params import KgExtractionParams

KEDRO = str(Path(sys.executable).with_name("kedro"))


def _params(tmp_path: Path, **chunks: object) -> KgExtractionParams:
    return KgExtractionParams.model_validate({
        "chunks": {"sources": ["hotpotqa"], "max_questions_per_source": 2, "max_background_chunks": 3, **chunks},
        "extractor": {"model": "bundled:tiny-random-llama", "batch_size": 4},
        "extraction": {"max_new_tokens": 6, "chunks_per_batch": 4, "cache_path": str(tmp_path / "cache.jsonl")},
    })


def test_selection_takes_question_passages_then_a_seeded_background(index, questions, tmp_path):
    chunks = select_kg_chunks(index, questions, _params(tmp_path))
    hotpot = [q for q in questions if q["source"] == "hotpotqa"][:2]
    supporting = {pid for q in hotpot for pid in q["supporting_passage_ids"]}
    ids = [chunk["id"] for chunk in chunks]
    assert set(ids[: len(supporting)]) == supporting and len(ids) == len(set(ids)) == len(supporting) + 3
    assert select_kg_chunks(index, questions, _params(tmp_path)) == chunks
    context = select_kg_chunks(index, questions, _params(tmp_path, question_passages="context",
                                                         max_background_chunks=0))
    assert {c["id"] for c in context} == {pid for q in hotpot for pid in q["context_passage_ids"]}
    everything = select_kg_chunks(index, questions, _params(tmp_path, sources=None, max_questions_per_source=None,
                                                            max_background_chunks=None))
    assert len(everything) == len(index)
    with pytest.raises(ValueError, match="nq"):
        select_kg_chunks(index, questions, _params(tmp_path, sources=["nq"]))


def test_extraction_nodes_end_to_end_and_resume(index, questions, tmp_path, one_torch_thread):
    params = _params(tmp_path)
    chunks = select_kg_chunks(index, questions, params)
    triplets, stats = extract_kg_triplets(chunks, params)
    assert stats["chunks"] == stats["chunks_generated"] == len(chunks) and stats["completion_tokens"] > 0
    assert stats["unparsable_replies"] + stats["malformed_lines"] >= 0 and stats["tokens_per_second"] > 0
    _, again = extract_kg_triplets(chunks, params)
    assert again["chunks_from_cache"] == len(chunks) and again["chunks_generated"] == 0
    real = [ExtractedTriplet("Shirley Temple", "was", "actress", chunks[0]["id"], True, True)]
    graph = build_kg([t.to_dict() for t in real] + triplets, index, stats)
    assert isinstance(graph, KnowledgeGraph) and graph.meta.embedder_spec == "hashing:64"
    report, metrics = report_kg(graph, stats)
    for key in ("chunks", "triplets_per_chunk", "parse_failure_rate", "ungrounded_rate", "distinct_entities",
                "distinct_relations", "tokens_per_second"):
        assert key in report
    assert all(isinstance(value, int | float) for value in metrics.values()) and "model" not in metrics
    attached = attach_knowledge_graph(index, graph, params)
    assert attached.retriever("kag").search(["Who was Shirley Temple?"], 3)[0]


def test_attach_rejects_a_graph_from_another_embedder(index, tmp_path):
    from prorag.retrieval import load_embedder

    other = build_knowledge_graph([], load_embedder("hashing:32"))
    with pytest.raises(Exception, match="hashing:32"):
        attach_knowledge_graph(index, other, _params(tmp_path))


def test_registered_pipelines():
    pipelines = register_pipelines()
    names = {node.name for node in pipelines["kg_extraction"].nodes}
    assert names == {"kg_extraction.select_kg_chunks", "kg_extraction.extract_kg_triplets",
                     "kg_extraction.build_knowledge_graph", "kg_extraction.report_kg_extraction"}
    assert "kag_retrieval_index" in {node.outputs[0] for node in pipelines["rollout_kag"].nodes
                                     if node.name == "kg_extraction.attach_knowledge_graph"}
    assert "kag_retrieval_index" in pipelines["rollout_kag"].all_inputs()


@pytest.mark.integration
@pytest.mark.slow
def test_kedro_viz_shows_kg_extraction(project_copy):
    bootstrap_project(project_copy)
    subprocess.run([KEDRO, "viz", "build"], cwd=project_copy, capture_output=True, text=True,
                   env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}, timeout=300, check=True)
    api = project_copy / "build" / "api"
    assert "kg_extraction" in {pipeline["id"] for pipeline in json.loads((api / "main").read_text())["pipelines"]}
    nodes = json.loads((api / "pipelines" / "kg_extraction").read_text())["nodes"]
    assert {"extract_kg_triplets", "build_knowledge_graph", "knowledge_graph", "kg_extraction_report"} <= {
        node["name"] for node in nodes}
