"""A versioned Kedro dataset for a knowledge-graph directory (entities, triplets, FAISS indexes), via fsspec.

Catalog entry::

    knowledge_graph:
      type: prorag.datasets.KnowledgeGraphDataset
      filepath: data/06_models/knowledge_graph       # or s3://bucket/…
      versioned: true

The directory layout is :mod:`prorag.kg.graph`'s; ``kg_meta.json`` is written last, and a version without it
(an interrupted upload) does not count as existing: loading the latest version skips it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from kedro.io.core import DatasetError
from kedro_datasets._typing import TablePreview

from prorag.datasets.fsspec_base import PREVIEW_MAX_CHARS, FsspecVersionedDataset

if TYPE_CHECKING:
    from prorag.kg.graph import KnowledgeGraph

META_FILE = "kg_meta.json"  # mirrors prorag.kg.graph.META_FILE


class KnowledgeGraphDataset(FsspecVersionedDataset["KnowledgeGraph", "KnowledgeGraph"]):
    """Saves and loads a :class:`~prorag.kg.graph.KnowledgeGraph` as a knowledge-graph directory."""

    def load(self) -> KnowledgeGraph:
        from prorag.kg.graph import load_knowledge_graph

        path = self._load_path()
        if not self._stored(path):
            raise DatasetError(f"{path}: no knowledge graph here ({META_FILE} missing)")
        if self._protocol == "file":
            return load_knowledge_graph(path)
        with tempfile.TemporaryDirectory(prefix="prorag-kg-") as temporary:
            local = Path(temporary) / "kg"
            self._fs.get(path.rstrip("/") + "/", str(local), recursive=True)
            return load_knowledge_graph(local)

    def save(self, data: KnowledgeGraph) -> None:
        from prorag.kg.graph import KnowledgeGraph, save_knowledge_graph

        if not isinstance(data, KnowledgeGraph):
            raise DatasetError(f"KnowledgeGraphDataset saves a KnowledgeGraph, got {type(data).__name__}")
        path = self._save_path()
        if self._protocol == "file":
            save_knowledge_graph(path, data)
        else:
            with tempfile.TemporaryDirectory(prefix="prorag-kg-") as temporary:
                local = save_knowledge_graph(Path(temporary) / "kg", data)
                files = sorted((item for item in local.iterdir() if item.is_file()),
                               key=lambda item: (item.name == META_FILE, item.name))
                for item in files:  # the metadata last: its presence marks a complete upload
                    self._fs.put_file(str(item), f"{path.rstrip('/')}/{item.name}")
        self._fs.invalidate_cache(path)

    def preview(self, max_chars: int = PREVIEW_MAX_CHARS) -> TablePreview:
        """A ``field``/``value`` table for kedro-viz: the version, ``kg_meta.json``'s fields (entity, triplet,
        relation and chunk counts, embedder…) and the files' count and size; the graph itself is not loaded."""
        return self._directory_summary(META_FILE, max_chars)

    def _stored(self, path: str) -> bool:
        return bool(self._fs.exists(f"{str(path).rstrip('/')}/{META_FILE}"))
