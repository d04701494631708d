"""KnowledgeGraphDataset: versioned save/load, locally and on an fsspec filesystem; incomplete versions."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.io.core import DatasetError, Version

from prorag.datasets import KnowledgeGraphDataset
from prorag.kg.extraction import ExtractedTriplet
from prorag.kg.graph import build_knowledge_graph
from prorag.retrieval import load_embedder


@pytest.fixture(scope="module")
def graph():
    triplets = [ExtractedTriplet("Berlin", "capital of", "Germany", "p1", True, True),
                ExtractedTriplet("Paris", "capital of", "France", "p2", True, True)]
    return build_knowledge_graph(triplets, load_embedder("hashing:32"), chunk_count=2)


@pytest.mark.parametrize("root", ["local", "memory://kg-dataset-test"])
def test_versioned_round_trip(graph, tmp_path: Path, root: str) -> None:
    filepath = str(tmp_path / "knowledge_graph") if root == "local" else f"{root}/knowledge_graph"
    dataset = KnowledgeGraphDataset(filepath=filepath, version=Version(None, "2026-01-01T00.00.00.000Z"))
    assert not dataset.exists()
    dataset.save(graph)
    assert dataset.exists()
    loaded = KnowledgeGraphDataset(filepath=filepath, version=Version(None, None)).load()
    assert [e.name for e in loaded.entities] == [e.name for e in graph.entities]
    assert loaded.triplet_text(1) == "Paris capital of France" and loaded.meta.chunk_count == 2


def test_a_version_without_metadata_does_not_exist(tmp_path: Path, graph) -> None:
    (tmp_path / "kg" / "2026-01-01T00.00.00.000Z" / "kg").mkdir(parents=True)  # an interrupted save
    dataset = KnowledgeGraphDataset(filepath=str(tmp_path / "kg"), version=Version(None, None))
    assert not dataset.exists()
    with pytest.raises(DatasetError):
        dataset.load()
    with pytest.raises(DatasetError, match="KnowledgeGraph"):
        KnowledgeGraphDataset(filepath=str(tmp_path / "x"), version=Version(None, "v1")).save("not a graph")


def test_an_interrupted_newer_version_does_not_hide_the_complete_one(graph, tmp_path: Path) -> None:
    filepath = str(tmp_path / "kg")
    KnowledgeGraphDataset(filepath=filepath, version=Version(None, "2026-01-01T00.00.00.000Z")).save(graph)
    (tmp_path / "kg" / "2026-01-02T00.00.00.000Z" / "kg").mkdir(parents=True)  # interrupted: no kg_meta.json
    latest = KnowledgeGraphDataset(filepath=filepath, version=Version(None, None))
    assert latest.resolve_load_version() == "2026-01-01T00.00.00.000Z"
    assert latest.load().meta.triplet_count == 2


@pytest.mark.parametrize("root", ["local", "memory://kg-preview-test"])
def test_preview_is_a_summary_table(graph, tmp_path: Path, root: str) -> None:
    filepath = str(tmp_path / "kg") if root == "local" else f"{root}/{tmp_path.name}/kg"
    KnowledgeGraphDataset(filepath=filepath, version=Version(None, "2026-01-01T00.00.00.000Z")).save(graph)
    preview = KnowledgeGraphDataset(filepath=filepath, version=Version(None, None)).preview()
    assert preview["columns"] == ["field", "value"] and preview["index"] == list(range(len(preview["data"])))
    table = dict(preview["data"])
    assert table["version"] == "2026-01-01T00.00.00.000Z" and table["entity_count"] == 4
    assert table["triplet_count"] == 2 and table["embedder_spec"] == "hashing:32"
    assert table["files"] >= 5 and table["bytes"] > 0
    assert all(len(row) == 2 for row in preview["data"])
    with pytest.raises(DatasetError):
        KnowledgeGraphDataset(filepath=str(tmp_path / "none"), version=Version(None, None)).preview()
