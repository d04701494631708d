"""The knowledge graph G = (E, T) of TeaRAG §4.1: deduplicated entities, triplets with their source chunk, and
FAISS indexes over entity names and triplet texts (embedded with the retrieval index's embedder).

Directory layout (written by :func:`save_knowledge_graph`, ``kg_meta.json`` last, marking a complete save)::

    entities.jsonl        {"id", "name", "key", "mentions"}; row i is entity i and row i of entities.faiss
    triplets.jsonl        {"id", "head", "relation", "tail", "chunk_id", "grounded"}; head/tail are entity ids
    entities.faiss        inner-product FAISS index of the entity names
    triplets.faiss        inner-product FAISS index of the triplet texts ("head relation tail")
    triplet_vectors.npy   the triplet embeddings (stage 2 scores the one-hop triplets of some entities)
    kg_meta.json          embedder spec/dim/prefixes, counts, extraction model and prompt, creation time
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from prorag.data.jsonl import DataFileError, iter_jsonl
from prorag.kg.extraction import ExtractedTriplet
from prorag.kg.parsing import entity_key, relation_key
from prorag.retrieval.base import RetrievalError
from prorag.retrieval.dense import DenseIndexBuilder, DenseIndexConfig
from prorag.retrieval.embedder import Embedder

KG_FORMAT_VERSION = 1
META_FILE = "kg_meta.json"
ENTITIES_FILE = "entities.jsonl"
TRIPLETS_FILE = "triplets.jsonl"
ENTITY_INDEX_FILE = "entities.faiss"
TRIPLET_INDEX_FILE = "triplets.faiss"
TRIPLET_VECTORS_FILE = "triplet_vectors.npy"


@dataclass(frozen=True)
class Entity:
    """A deduplicated entity: its display name (the most frequent surface form) and dedup key."""

    id: int
    name: str
    key: str
    mentions: int = 1


@dataclass(frozen=True)
class Triplet:
    """An edge of the graph: entity ids, the normalized relation, and the chunk it was extracted from."""

    id: int
    head: int
    relation: str
    tail: int
    chunk_id: str
    grounded: bool = True


@dataclass(frozen=True)
class KGMeta:
    """What ``kg_meta.json`` records."""

    embedder_spec: str
    dim: int
    entity_count: int
    triplet_count: int
    relation_count: int
    chunk_count: int
    query_prefix: str = ""
    passage_prefix: str = ""
    extraction: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    format_version: int = KG_FORMAT_VERSION

    @classmethod
    def from_dict(cls, raw: Any, source: str) -> KGMeta:
        if not isinstance(raw, dict) or raw.get("format_version") != KG_FORMAT_VERSION:
            raise RetrievalError(f"{source}: not a knowledge-graph metadata file of format {KG_FORMAT_VERSION}")
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise RetrievalError(f"{source}: unknown field(s) {unknown}")
        try:
            return cls(**raw)
        except TypeError as error:
            raise RetrievalError(f"{source}: {error}") from error


class KnowledgeGraph:
    """Entities, triplets, their one-hop adjacency and FAISS indexes; the store graph retrieval searches."""

    def __init__(self, meta: KGMeta, entities: Sequence[Entity], triplets: Sequence[Triplet],
                 entity_index: faiss.Index, triplet_index: faiss.Index, triplet_vectors: np.ndarray) -> None:
        if entity_index.ntotal != len(entities) or triplet_index.ntotal != len(triplets) \
                or len(triplet_vectors) != len(triplets):
            raise RetrievalError(
                f"inconsistent knowledge graph: {len(entities)} entities / {entity_index.ntotal} entity vectors, "
                f"{len(triplets)} triplets / {triplet_index.ntotal} triplet vectors / {len(triplet_vectors)} rows")
        self.meta = meta
        self.entities = list(entities)
        self.triplets = list(triplets)
        self.entity_index = entity_index
        self.triplet_index = triplet_index
        self.triplet_vectors = triplet_vectors
        self.entity_by_key = {entity.key: entity.id for entity in self.entities}
        incident: dict[int, list[int]] = defaultdict(list)
        for triplet in self.triplets:
            incident[triplet.head].append(triplet.id)
            if triplet.tail != triplet.head:
                incident[triplet.tail].append(triplet.id)
        self.incident = dict(incident)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"KnowledgeGraph({len(self.entities)} entities, {len(self.triplets)} triplets)"

    def triplet_text(self, triplet_id: int) -> str:
        """``"head relation tail"``: how a triplet is embedded and shown to the model."""
        triplet = self.triplets[triplet_id]
        return f"{self.entities[triplet.head].name} {triplet.relation} {self.entities[triplet.tail].name}"

    def one_hop(self, entity_ids: Iterable[int]) -> list[int]:
        """Ids of the triplets incident to any of ``entity_ids`` (each once, in id order)."""
        return sorted({triplet for entity in entity_ids for triplet in self.incident.get(entity, ())})

    def search_entities(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS top-k entities for unit query vectors: ``(scores, ids)``, missing ids are -1."""
        if self.entity_index.ntotal == 0:
            empty = np.full((len(vectors), 0), -1)
            return empty.astype(np.float32), empty
        with self._lock:
            return self.entity_index.search(np.ascontiguousarray(vectors, dtype=np.float32),
                                            min(k, self.entity_index.ntotal))

    def stats(self) -> dict[str, Any]:
        """Counts for reports."""
        return {"entities": len(self.entities), "triplets": len(self.triplets),
                "relations": len({triplet.relation for triplet in self.triplets}),
                "chunks_with_triplets": len({triplet.chunk_id for triplet in self.triplets})}


def build_knowledge_graph(triplets: Iterable[ExtractedTriplet], embedder: Embedder, *,
                          chunk_count: int = 0, extraction: dict[str, Any] | None = None) -> KnowledgeGraph:
    """Normalize and deduplicate entities (by :func:`~prorag.kg.parsing.entity_key`), drop repeated
    (head, relation, tail) triplets of the same chunk, and embed entity names and triplet texts."""
    surface: dict[str, Counter[str]] = defaultdict(Counter)
    order: dict[str, int] = {}
    kept: list[tuple[str, str, str, str, bool]] = []
    seen: set[tuple[str, str, str, str]] = set()
    for triplet in triplets:
        head, tail, relation = entity_key(triplet.head), entity_key(triplet.tail), relation_key(triplet.relation)
        if not head or not tail or not relation:
            continue
        signature = (head, relation, tail, triplet.chunk_id)
        if signature in seen:
            continue
        seen.add(signature)
        for key, name in ((head, triplet.head), (tail, triplet.tail)):
            order.setdefault(key, len(order))
            surface[key][name] += 1
        kept.append((head, relation, tail, triplet.chunk_id, triplet.grounded))
    entities = [Entity(position, _display_name(surface[key]), key, sum(surface[key].values()))
                for key, position in sorted(order.items(), key=lambda item: item[1])]
    graph_triplets = [Triplet(number, order[head], relation, order[tail], chunk, grounded)
                      for number, (head, relation, tail, chunk, grounded) in enumerate(kept)]
    entity_vectors = embedder.encode_passages([entity.name for entity in entities], show_progress=False) \
        if entities else np.zeros((0, embedder.dim), dtype=np.float32)
    texts = [f"{entities[t.head].name} {t.relation} {entities[t.tail].name}" for t in graph_triplets]
    triplet_vectors = embedder.encode_passages(texts, show_progress=False) if texts \
        else np.zeros((0, embedder.dim), dtype=np.float32)
    meta = KGMeta(
        embedder_spec=embedder.spec, dim=embedder.dim, entity_count=len(entities), triplet_count=len(graph_triplets),
        relation_count=len({t.relation for t in graph_triplets}), chunk_count=chunk_count,
        query_prefix=embedder.query_prefix, passage_prefix=embedder.passage_prefix, extraction=extraction or {},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"))
    return KnowledgeGraph(meta, entities, graph_triplets, _flat_index(entity_vectors, embedder.dim),
                          _flat_index(triplet_vectors, embedder.dim), triplet_vectors)


def _display_name(forms: Counter[str]) -> str:
    return max(forms.items(), key=lambda item: item[1])[0]  # most frequent; ties: the first seen


def _flat_index(vectors: np.ndarray, dim: int) -> faiss.Index:
    builder = DenseIndexBuilder(dim, DenseIndexConfig(index_type="flat"))
    if len(vectors):
        builder.add(vectors)
    return builder.finish()


def save_knowledge_graph(path: str | os.PathLike[str], graph: KnowledgeGraph) -> Path:
    """Write ``graph`` as a knowledge-graph directory (staged in a sibling folder, then renamed)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with (staging / ENTITIES_FILE).open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(asdict(entity), ensure_ascii=False) + "\n" for entity in graph.entities)
        with (staging / TRIPLETS_FILE).open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(asdict(triplet), ensure_ascii=False) + "\n" for triplet in graph.triplets)
        faiss.write_index(graph.entity_index, str(staging / ENTITY_INDEX_FILE))
        faiss.write_index(graph.triplet_index, str(staging / TRIPLET_INDEX_FILE))
        np.save(staging / TRIPLET_VECTORS_FILE, graph.triplet_vectors)
        (staging / META_FILE).write_text(json.dumps(asdict(graph.meta), indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def load_knowledge_graph(path: str | os.PathLike[str]) -> KnowledgeGraph:
    """Load a directory written by :func:`save_knowledge_graph`; errors name the file and line."""
    root = Path(path)
    meta_path = root / META_FILE
    if not meta_path.is_file():
        raise RetrievalError(f"{meta_path}: not found (is {root} a knowledge-graph directory?)")
    try:
        meta = KGMeta.from_dict(json.loads(meta_path.read_text(encoding="utf-8")), str(meta_path))
    except json.JSONDecodeError as error:
        raise RetrievalError(f"{meta_path}: malformed JSON ({error.msg} at line {error.lineno})") from error
    entities = [Entity(**row) for row in _read_rows(root / ENTITIES_FILE, Entity)]
    triplets = [Triplet(**row) for row in _read_rows(root / TRIPLETS_FILE, Triplet)]
    for triplet in triplets:
        if not (0 <= triplet.head < len(entities) and 0 <= triplet.tail < len(entities)):
            raise RetrievalError(f"{root / TRIPLETS_FILE}: triplet {triplet.id} names an unknown entity")
    try:
        entity_index = faiss.read_index(str(root / ENTITY_INDEX_FILE))
        triplet_index = faiss.read_index(str(root / TRIPLET_INDEX_FILE))
    except RuntimeError as error:
        raise RetrievalError(f"{root}: cannot read a FAISS index: {error}") from error
    vectors = np.load(root / TRIPLET_VECTORS_FILE)
    return KnowledgeGraph(meta, entities, triplets, entity_index, triplet_index, vectors)


def _read_rows(path: Path, kind: type) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    allowed = set(kind.__dataclass_fields__)
    try:
        for number, row in iter_jsonl(path):  # file:line errors for missing files, bad UTF-8 and bad JSON
            if set(row) - allowed or row.get("id") != len(rows):
                raise RetrievalError(f"{path}:{number}: expected a {kind.__name__} record with id {len(rows)}")
            rows.append(row)
    except DataFileError as error:
        raise RetrievalError(str(error)) from error
    return rows
