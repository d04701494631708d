"""The combined on-disk retrieval index: dense (FAISS) + BM25 + passages + metadata in one directory.

Layout of an index directory::

    faiss.index        FAISS index (CPU form), row i = line i of passages.jsonl
    passages.jsonl     the passage store {"id", "title", "text"}
    bm25/              bm25s index files (optional)
    index_meta.json    embedder spec, dim, metric, index type, passage count, prefixes, build settings
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import faiss

from prorag.data.records import Passage
from prorag.retrieval.base import RetrievalError, Retriever
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.corpus import deduplicate_passages, split_passages
from prorag.retrieval.dense import DenseIndexBuilder, DenseIndexConfig, DenseRetriever, IndexType
from prorag.retrieval.embedder import BUNDLED_MINILM, Embedder, load_embedder
from prorag.retrieval.hybrid import HybridRetriever
from prorag.retrieval.store import PassageStore

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
FAISS_FILE = "faiss.index"
PASSAGES_FILE = "passages.jsonl"
BM25_DIR = "bm25"
META_FILE = "index_meta.json"
RetrieverKind = Literal["dense", "bm25", "hybrid", "kag", "kag_concat"]
RETRIEVER_KINDS: tuple[str, ...] = ("dense", "bm25", "hybrid", "kag", "kag_concat")
KG_RETRIEVER_KINDS: tuple[str, ...] = ("kag", "kag_concat")
"""Kinds another package registers on an index (:meth:`RetrievalIndex.register_retriever`): the knowledge layer's,
once a knowledge graph is attached (:func:`prorag.kg.kag.attach_knowledge_graph`)."""

RetrieverFactory = Callable[["RetrievalIndex"], Retriever]
"""Builds the retriever of one kind over an index (called on every :meth:`RetrievalIndex.retriever` request)."""

_INDEX_RETRIEVERS: dict[str, RetrieverFactory] = {
    "dense": lambda index: index.dense,
    "bm25": lambda index: index.bm25,
    "hybrid": lambda index: index.hybrid,
}
"""The kinds every index serves from its own parts."""


@dataclass(frozen=True)
class IndexMeta:
    """What ``index_meta.json`` records: enough to embed queries the way the passages were embedded."""

    embedder_spec: str
    dim: int
    index_type: str
    passage_count: int
    query_prefix: str = ""
    passage_prefix: str = ""
    metric: str = "inner_product"
    has_bm25: bool = True
    window_words: int | None = None
    faiss: dict[str, Any] = field(default_factory=dict)
    bm25: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any, source: str = META_FILE) -> IndexMeta:
        """Validate a parsed ``index_meta.json``; errors name the file and field."""
        if not isinstance(raw, dict):
            raise RetrievalError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise RetrievalError(f"{source}: unsupported format_version {version!r} (expected {FORMAT_VERSION})")
        required = {"embedder_spec": str, "dim": int, "index_type": str, "passage_count": int}
        for name, kind in required.items():
            if not isinstance(raw.get(name), kind) or isinstance(raw.get(name), bool):
                raise RetrievalError(f"{source}: field {name!r} must be a {kind.__name__}, got {raw.get(name)!r}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise RetrievalError(f"{source}: unknown field(s) {', '.join(map(repr, unknown))}")
        return cls(**raw)


class RetrievalIndex:
    """A loaded or freshly built index; ``.dense``, ``.bm25`` and ``.hybrid`` are ready retrievers.

    The embedder is loaded from ``meta.embedder_spec`` on first use of ``.dense`` unless one is given,
    so a BM25-only consumer never loads a model.
    """

    def __init__(
        self,
        meta: IndexMeta,
        store: PassageStore,
        faiss_index: faiss.Index,
        bm25: BM25Retriever | None = None,
        embedder: Embedder | None = None,
        *,
        use_gpu: bool = False,
        nprobe: int | None = None,
        device: str | None = None,
        threads: int | None = None,
    ) -> None:
        if faiss_index.ntotal != len(store) or meta.passage_count != len(store):
            raise RetrievalError(
                f"inconsistent index: {faiss_index.ntotal} FAISS vectors, {len(store)} passages, "
                f"passage_count {meta.passage_count} in the metadata"
            )
        if faiss_index.d != meta.dim:
            raise RetrievalError(f"FAISS index dimension {faiss_index.d} != metadata dim {meta.dim}")
        self.meta = meta
        self.store = store
        self.faiss_index = faiss_index
        self._bm25 = bm25
        self._embedder = embedder
        self._use_gpu = use_gpu
        self._nprobe = nprobe
        self._device = device
        self._threads = threads
        self._dense: DenseRetriever | None = None
        self._lock = threading.Lock()
        self._retrievers: dict[str, RetrieverFactory] = dict(_INDEX_RETRIEVERS)

    def register_retriever(self, kind: str, factory: RetrieverFactory) -> RetrievalIndex:
        """Make ``retriever(kind)`` build ``factory(self)``: how another package (the knowledge layer's ``kag`` /
        ``kag_concat``, :func:`prorag.kg.kag.attach_knowledge_graph`) adds a kind to this index. A kind
        registered again is replaced; the index's own kinds (dense, bm25, hybrid) cannot be. Returns ``self``."""
        if not kind or not isinstance(kind, str):
            raise ValueError(f"a retriever kind must be a non-empty string, got {kind!r}")
        if kind in _INDEX_RETRIEVERS:
            raise ValueError(f"retriever kind {kind!r} is the index's own and cannot be replaced")
        self._retrievers[kind] = factory
        return self

    @property
    def retriever_kinds(self) -> tuple[str, ...]:
        """The kinds :meth:`retriever` can build now (the index's own and the registered ones)."""
        return tuple(self._retrievers)

    def fingerprint(self) -> str:
        """The version of this index as a short hash: its metadata (with its build time, so a re-index is a new
        version) and its passage ids in order. What a cache of results computed over the index is keyed by."""
        digest = hashlib.sha256(json.dumps(self.meta.to_dict(), sort_keys=True, default=str).encode("utf-8"))
        for passage_id in self.store.ids:
            digest.update(passage_id.encode("utf-8") + b"\x00")
        return digest.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.store)

    def __repr__(self) -> str:
        return (
            f"RetrievalIndex({len(self)} passages, {self.meta.index_type}, {self.meta.embedder_spec!r}, "
            f"bm25={self._bm25 is not None})"
        )

    @property
    def embedder(self) -> Embedder:
        with self._lock:
            if self._embedder is None:
                self._embedder = load_embedder(
                    self.meta.embedder_spec,
                    query_prefix=self.meta.query_prefix,
                    passage_prefix=self.meta.passage_prefix,
                    device=self._device,
                )
            if self._embedder.dim != self.meta.dim:
                raise RetrievalError(
                    f"embedder {self._embedder.spec!r} has dimension {self._embedder.dim}, "
                    f"the index was built with dimension {self.meta.dim}"
                )
            return self._embedder

    @property
    def dense(self) -> DenseRetriever:
        embedder = self.embedder
        with self._lock:
            if self._dense is None:
                self._dense = DenseRetriever(
                    self.faiss_index,
                    self.store,
                    embedder,
                    nprobe=self._nprobe,
                    use_gpu=self._use_gpu,
                    threads=self._threads,
                )
            return self._dense

    @property
    def has_bm25(self) -> bool:
        return self._bm25 is not None

    @property
    def bm25(self) -> BM25Retriever:
        if self._bm25 is None:
            raise RetrievalError("this index was built without BM25 (build_bm25=False)")
        return self._bm25

    @property
    def hybrid(self) -> HybridRetriever:
        """Dense + BM25 fused by reciprocal rank fusion (k=60)."""
        return HybridRetriever([self.dense, self.bm25])

    def retriever(self, kind: RetrieverKind | str = "dense") -> Retriever:
        """The retriever named ``dense``, ``bm25``, ``hybrid``, or a kind registered on this index
        (:meth:`register_retriever`): with a knowledge graph attached, ``kag`` / ``kag_concat`` (TeaRAG's KAG + PPR,
        and TeaRAG-Con; :mod:`prorag.kg.kag`)."""
        factory = self._retrievers.get(kind)
        if factory is not None:
            return factory(self)
        if kind in KG_RETRIEVER_KINDS:
            raise RetrievalError(f"retriever {kind!r} needs a knowledge graph: run the kg_extraction pipeline "
                                 "and a pipeline that attaches it (e.g. rollout_kag), or call "
                                 "prorag.kg.kag.attach_knowledge_graph")
        known = list(dict.fromkeys([*RETRIEVER_KINDS, *self._retrievers]))
        raise ValueError(f"retriever kind must be one of {', '.join(known)}; got {kind!r}")

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        return save_index_dir(path, self, overwrite=overwrite)


def build_retrieval_index(
    passages: Iterable[Passage],
    embedder_spec: str = BUNDLED_MINILM,
    index_type: IndexType = "flat",
    *,
    embedder: Embedder | None = None,
    window_words: int | None = None,
    shard_size: int = 4096,
    batch_size: int | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    nlist: int | None = None,
    nprobe: int = 16,
    pq_m: int | None = None,
    pq_nbits: int = 8,
    train_size: int | None = None,
    use_gpu: bool = False,
    device: str | None = None,
    build_bm25: bool = True,
    bm25_stopwords: str | None = "en",
    show_progress: bool = True,
    spill_dir: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> RetrievalIndex:
    """Deduplicate, optionally window, embed in shards, and build the FAISS (and BM25) index.

    ``embedder`` (an already loaded one) takes precedence over ``embedder_spec`` and the prefix options.
    Embeddings go to the FAISS builder one shard of ``shard_size`` passages at a time.
    """
    corpus = deduplicate_passages(passages)
    if window_words is not None:
        corpus = list(split_passages(corpus, window_words))
    if not corpus:
        raise ValueError("cannot build a retrieval index from an empty corpus")
    store = PassageStore(corpus)
    if embedder is None:
        embedder = load_embedder(
            embedder_spec,
            batch_size=batch_size,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            device=device,
            show_progress=show_progress,
        )
    config = DenseIndexConfig(
        index_type=index_type,
        nlist=nlist,
        nprobe=nprobe,
        pq_m=pq_m,
        pq_nbits=pq_nbits,
        train_size=train_size,
        use_gpu=use_gpu,
    )
    builder = DenseIndexBuilder(embedder.dim, config, spill_dir)
    for shard in embedder.encode_passages_in_shards(store, shard_size, show_progress=show_progress):
        builder.add(shard.embeddings)
    faiss_index = builder.finish()
    bm25 = BM25Retriever.build(store, stopwords=bm25_stopwords) if build_bm25 else None
    faiss_info: dict[str, Any] = {**config.to_dict(), "description": _describe_faiss(faiss_index)}
    meta = IndexMeta(
        embedder_spec=embedder.spec,
        dim=embedder.dim,
        index_type=index_type,
        passage_count=len(store),
        query_prefix=embedder.query_prefix,
        passage_prefix=embedder.passage_prefix,
        has_bm25=bm25 is not None,
        window_words=window_words,
        faiss=faiss_info,
        bm25=bm25.settings() if bm25 is not None else {},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    logger.info("built %s index over %d passages (%s)", index_type, len(store), faiss_info["description"])
    return RetrievalIndex(meta, store, faiss_index, bm25, embedder, use_gpu=use_gpu, device=device, threads=threads)


def _describe_faiss(index: faiss.Index) -> str:
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        return type(index).__name__
    return f"{type(index).__name__}(nlist={ivf.nlist}, nprobe={ivf.nprobe})"


def save_index_dir(path: str | os.PathLike[str], index: RetrievalIndex, *, overwrite: bool = False) -> Path:
    """Write ``index`` as an index directory (via a temporary sibling, then a rename); returns the path."""
    target = Path(path)
    if target.exists() and not overwrite and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target}: already exists and is not empty (pass overwrite=True to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        faiss.write_index(index.faiss_index, str(staging / FAISS_FILE))  # always the CPU form
        index.store.save(staging / PASSAGES_FILE)
        if index.has_bm25:
            index.bm25.save(staging / BM25_DIR)
        meta = replace(index.meta, has_bm25=index.has_bm25)
        (staging / META_FILE).write_text(
            json.dumps(meta.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def read_index_meta(path: str | os.PathLike[str]) -> IndexMeta:
    """Read and validate ``index_meta.json`` of an index directory."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        raise RetrievalError(f"{meta_path}: index metadata not found (is {Path(path)} an index directory?)")
    try:
        raw = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise RetrievalError(f"{meta_path}: malformed JSON ({error.msg} at line {error.lineno})") from error
    return IndexMeta.from_dict(raw, str(meta_path))


def load_index_dir(
    path: str | os.PathLike[str],
    *,
    embedder: Embedder | None = None,
    load_bm25: bool = True,
    use_gpu: bool = False,
    nprobe: int | None = None,
    device: str | None = None,
    threads: int | None = None,
) -> RetrievalIndex:
    """Load an index directory written by :func:`save_index_dir` (everything is read into memory)."""
    root = Path(path)
    meta = read_index_meta(root)
    faiss_path = root / FAISS_FILE
    if not faiss_path.is_file():
        raise RetrievalError(f"{faiss_path}: FAISS index file not found")
    try:
        faiss_index = faiss.read_index(str(faiss_path))
    except RuntimeError as error:
        raise RetrievalError(f"{faiss_path}: cannot read the FAISS index: {error}") from error
    store = PassageStore.load(root / PASSAGES_FILE)
    for what, count in (
        ("FAISS vectors in " + FAISS_FILE, faiss_index.ntotal),
        ("passages in " + PASSAGES_FILE, len(store)),
    ):
        if count != meta.passage_count:
            raise RetrievalError(f"{root}: {count} {what} but {META_FILE} says passage_count {meta.passage_count}")
    bm25 = None
    if load_bm25 and meta.has_bm25:
        bm25 = BM25Retriever.load(root / BM25_DIR, store)
    return RetrievalIndex(
        meta, store, faiss_index, bm25, embedder, use_gpu=use_gpu, nprobe=nprobe, device=device, threads=threads
    )
