"""The combined on-disk retrieval index: dense (FAISS) + BM25 + passages + metadata in one directory.

Layout of an index directory::

    faiss.index        FAISS index (CPU form), row i = record i of passages.jsonl
    passages.jsonl     the passage store {"id", "title", "text"}
    passages.jsonl.offsets.npy, .idhash.npy, .idrow.npy
                       (indexes built at scale) byte offsets and id index: passages are read from disk by offset
    bm25/              bm25s index files (optional)
    index_meta.json    embedder spec, dim, metric, index type, passage count, prefixes, build settings

``faiss_file`` / ``passages_file`` in the metadata may name files outside the directory (absolute paths): a
prebuilt index and corpus used as they are (:func:`import_prebuilt_index`). Loading memory-maps the FAISS index
where its type allows and reads passages by offset when the offsets file exists; :func:`load_index_dir` with
``mmap=False`` reads everything into memory as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import faiss

from prorag.data.jsonl import MAX_RECORD_BYTES
from prorag.data.records import Passage
from prorag.retrieval.base import RetrievalError, Retriever
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.corpus import deduplicate_passages, split_passages
from prorag.retrieval.dense import IVF_TYPES, DenseIndexBuilder, DenseIndexConfig, DenseRetriever, IndexType
from prorag.retrieval.disk_store import OFFSETS_SUFFIX, DiskPassageStore, index_passage_file, sidecar
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
    faiss_file: str = FAISS_FILE
    """The FAISS file: relative to the index directory, or an absolute path (a prebuilt index used as is)."""
    passages_file: str = PASSAGES_FILE
    passages_format: str = "prorag"
    source: dict[str, Any] = field(default_factory=dict)
    """Where the passages came from (a dump's path, size and mtime; a prebuilt index's files)."""

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
        store: Sequence[Passage],
        faiss_index: faiss.Index,
        bm25: BM25Retriever | None = None,
        embedder: Embedder | None = None,
        *,
        use_gpu: bool = False,
        nprobe: int | None = None,
        device: str | None = None,
        threads: int | None = None,
        gpus: Sequence[int] | None = None,
        build_dir: str | os.PathLike[str] | None = None,
        parent: RetrievalIndex | None = None,
        source_dir: str | os.PathLike[str] | None = None,
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
        self._gpus = gpus
        self._dense: DenseRetriever | None = None
        self._lock = threading.Lock()
        self._retrievers: dict[str, RetrieverFactory] = dict(_INDEX_RETRIEVERS)
        self._parent = parent
        self.build_dir = Path(build_dir) if build_dir is not None else None
        """A resumable build's working folder (embedding shards): deleted once the index is saved."""
        self.source_dir = Path(source_dir) if source_dir is not None else None
        """The index directory this index was loaded from (None: built in memory, or a temporary download): what
        another process can load the same index from instead of a copy (the GRPO launch bundle)."""

    def view(self) -> RetrievalIndex:
        """A new index object over the same loaded parts (FAISS index, store, BM25, embedder, dense retriever):
        what a per-process cache hands each consumer, so that one consumer's registered retriever kinds (a
        knowledge graph) do not leak into another's."""
        root = self._parent or self
        return RetrievalIndex(self.meta, self.store, self.faiss_index, self._bm25, self._embedder,
                              use_gpu=self._use_gpu, nprobe=self._nprobe, device=self._device, threads=self._threads,
                              gpus=self._gpus, parent=root, source_dir=root.source_dir)

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
        if self._parent is not None and self._embedder is None:
            self._embedder = self._parent.embedder
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
        if self._parent is not None:
            return self._parent.dense
        embedder = self.embedder
        with self._lock:
            if self._dense is None:
                self._dense = DenseRetriever(
                    self.faiss_index,
                    self.store,
                    embedder,
                    nprobe=self._nprobe,
                    use_gpu=self._use_gpu,
                    gpus=self._gpus,
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


def build_retrieval_index_at_scale(
    passages: Iterable[tuple[str, Passage]],
    work_dir: str | os.PathLike[str],
    embedder_spec: str = BUNDLED_MINILM,
    index_type: IndexType = "flat",
    *,
    source: dict[str, Any] | None = None,
    embedder: Embedder | None = None,
    window_words: int | None = None,
    shard_size: int = 65_536,
    batch_size: int | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    fp16: bool = False,
    devices: Sequence[str] | None = None,
    nlist: int | None = None,
    nprobe: int = 16,
    pq_m: int | None = None,
    pq_nbits: int = 8,
    train_size: int | None = None,
    hnsw_m: int = 32,
    ef_construction: int = 40,
    ef_search: int = 64,
    use_gpu: bool = False,
    gpus: Sequence[int] | None = None,
    device: str | None = None,
    build_bm25: bool = True,
    bm25_stopwords: str | None = "en",
    check_resources: bool = True,
    threads: int | None = None,
) -> RetrievalIndex:
    """Build an index that never holds the corpus in memory, resumably, under ``work_dir``.

    1. *ingest*: ``(origin, passage)`` pairs are streamed into ``work_dir/store/passages.jsonl`` with byte offsets
       and an id index (deduplicated, optionally windowed); skipped when ``work_dir/store/ingested.json`` records the
       same ``source`` and ``window_words``;
    2. *plan*: the FAISS index's memory, disk and build time are estimated, printed and checked against this
       machine (``check_resources``), and an explicit ``nlist`` against the corpus size — before any embedding;
    3. *embed*: shards of ``shard_size`` passages go to ``work_dir/embeddings/`` (:func:`prorag.retrieval.sharded.
       embed_store`): kill the run and start it again, finished shards are not recomputed; ``devices`` (e.g.
       ``["cuda:0", "cuda:1"]``) embed in one process each; ``fp16`` halves the model and the shards;
    4. *index*: the FAISS index is built from the shard files (``use_gpu``/``gpus`` for IVF training) and written to
       ``work_dir/built`` at once (a failure after it — BM25 over the store, the save — does not lose it: the rerun
       reads it back), then BM25 over the store. The shards and the built index stay until the index is saved
       (:func:`save_index_dir` deletes ``work_dir/embeddings`` and ``work_dir/built``).
    """
    from prorag.retrieval.sharded import embed_store, finished_shards
    from prorag.retrieval.sizing import check_index_cost, estimate_index_cost

    root = Path(work_dir)
    store_dir = root / "store"
    marker = store_dir / "ingested.json"
    recorded = {"source": source or {}, "window_words": window_words}
    store_path = store_dir / PASSAGES_FILE
    if (source and marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == recorded
            and sidecar(store_path, OFFSETS_SUFFIX).is_file()):
        store = DiskPassageStore(store_path)
        logger.info("reusing the ingested store %s (%d passages)", store_path, len(store))
    else:
        marker.unlink(missing_ok=True)
        from prorag.retrieval.disk_store import ingest_passages

        store = ingest_passages(passages, store_path, window_words=window_words)
        marker.write_text(json.dumps(recorded, indent=2) + "\n", encoding="utf-8")
        logger.info("ingested %d passages into %s", len(store), store_path)
    options: dict[str, Any] = {"batch_size": batch_size, "query_prefix": query_prefix,
                               "passage_prefix": passage_prefix, "show_progress": False, "fp16": fp16}
    devices = list(devices or ([device] if device else []))
    if embedder is None and len(devices) <= 1:
        embedder = load_embedder(embedder_spec, device=devices[0] if devices else None, **options)
    if embedder is not None:
        dim, described = embedder.dim, embedder.describe()
    else:
        probe = load_embedder(embedder_spec, device="cpu", **{**options, "fp16": False})
        dim, described = probe.dim, probe.describe()
        del probe
    config = DenseIndexConfig(index_type=index_type, nlist=nlist, nprobe=nprobe, pq_m=pq_m, pq_nbits=pq_nbits,
                              train_size=train_size, use_gpu=use_gpu, hnsw_m=hnsw_m, ef_construction=ef_construction,
                              ef_search=ef_search, gpus=tuple(gpus) if gpus is not None else None)
    embeddings_dir = root / "embeddings"
    dtype = "float16" if fp16 else "float32"
    cost = estimate_index_cost(config, len(store), dim, shard_bytes_per_value=2 if fp16 else 4,
                               shard_size=shard_size)
    if check_resources:
        done = finished_shards(embeddings_dir, len(store), shard_size)
        check_index_cost(cost, root, already_on_disk=len(done) * shard_size * dim * (2 if fp16 else 4))
    paths = embed_store(store, embeddings_dir, embedder=embedder, spec=embedder_spec,
                        embedder_options={key: value for key, value in options.items() if key != "show_progress"},
                        devices=devices, shard_size=shard_size, dtype=dtype, described=described)
    faiss_index = _built_faiss_index(root / BUILT_DIR, paths, dim, config,
                                     {"config": config.to_dict(), "count": len(store), "dim": dim,
                                      "embedder": described, "shard_dtype": dtype, "shard_size": shard_size})
    bm25 = BM25Retriever.build(store, stopwords=bm25_stopwords) if build_bm25 else None
    faiss_info: dict[str, Any] = {**config.to_dict(), "description": _describe_faiss(faiss_index),
                                  "estimate": cost.to_dict(), "shard_dtype": dtype}
    meta = IndexMeta(
        embedder_spec=described["embedder_spec"], dim=dim, index_type=index_type, passage_count=len(store),
        query_prefix=described["query_prefix"] or "", passage_prefix=described["passage_prefix"] or "",
        has_bm25=bm25 is not None, window_words=window_words, faiss=faiss_info,
        bm25=bm25.settings() if bm25 is not None else {}, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        source=source or {},
    )
    logger.info("built %s index over %d passages (%s)", index_type, len(store), faiss_info["description"])
    return RetrievalIndex(meta, store, faiss_index, bm25, embedder, use_gpu=use_gpu, device=device, threads=threads,
                          gpus=gpus, build_dir=root)


BUILT_DIR = "built"
"""Under a resumable build's ``work_dir``: the FAISS index as soon as it is built, kept until the index is saved."""


def _built_faiss_index(folder: Path, shard_paths: Sequence[Path], dim: int, config: DenseIndexConfig,
                       recorded: dict[str, Any]) -> faiss.Index:
    """The FAISS index of the shards: the one a previous run of the same build left in ``folder``, or built now and
    written there before anything else can fail (BM25 over the corpus, the save), so a rerun does not train it
    again."""
    marker, path = folder / "built.json", folder / FAISS_FILE
    expected = json.loads(json.dumps(recorded, default=str))
    if marker.is_file() and path.is_file() and json.loads(marker.read_text(encoding="utf-8")) == expected:
        logger.info("reusing the FAISS index a previous run built in %s", path)
        return faiss.read_index(str(path))
    builder = DenseIndexBuilder(dim, config)
    for shard in shard_paths:
        builder.add_file(shard)
    faiss_index = builder.finish()
    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    temporary = folder / f".{FAISS_FILE}.tmp-{os.getpid()}"
    faiss.write_index(faiss_index, str(temporary))
    temporary.replace(path)
    marker.write_text(json.dumps(expected, indent=2) + "\n", encoding="utf-8")
    return faiss_index


def import_prebuilt_index(
    faiss_path: str | os.PathLike[str],
    corpus_path: str | os.PathLike[str],
    *,
    corpus_format: str = "auto",
    embedder_spec: str = "intfloat/e5-base-v2",
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    build_bm25: bool = False,
    mmap: bool = True,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> RetrievalIndex:
    """Use a prebuilt FAISS index and its corpus file as they are (Search-R1's ``e5_Flat.index`` + ``wiki-18.jsonl``).

    Nothing is copied: the corpus gets an offsets file beside it (one streaming pass; reused when it exists), the
    index is memory-mapped, and the metadata names both files by absolute path. Row ``i`` of the FAISS index must be
    record ``i`` of the corpus (the counts are checked). E5's ``query: `` prefix is used unless told otherwise.
    """
    from prorag.retrieval.embedder import default_prefixes

    index_file, corpus_file = Path(faiss_path).resolve(), Path(corpus_path).resolve()
    faiss_index = _read_faiss(index_file, mmap=mmap)
    store = (DiskPassageStore(corpus_file, corpus_format) if sidecar(corpus_file, OFFSETS_SUFFIX).is_file()
             else index_passage_file(corpus_file, corpus_format, max_record_bytes=max_record_bytes))
    if faiss_index.ntotal != len(store):
        raise RetrievalError(f"{index_file} has {faiss_index.ntotal} vectors but {corpus_file} has {len(store)} "
                             "passages: they are not an index and its corpus")
    default_query, default_passage = default_prefixes(embedder_spec)
    bm25 = BM25Retriever.build(store) if build_bm25 else None
    meta = IndexMeta(
        embedder_spec=embedder_spec, dim=faiss_index.d, index_type=_index_kind(faiss_index),
        passage_count=len(store), query_prefix=default_query if query_prefix is None else query_prefix,
        passage_prefix=default_passage if passage_prefix is None else passage_prefix, has_bm25=bm25 is not None,
        faiss={"description": _describe_faiss(faiss_index), "prebuilt": True},
        bm25=bm25.settings() if bm25 is not None else {}, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        faiss_file=str(index_file), passages_file=str(corpus_file), passages_format=store.format,
        source={"prebuilt_faiss": str(index_file), "corpus": str(corpus_file)},
    )
    return RetrievalIndex(meta, store, faiss_index, bm25)


def _index_kind(index: faiss.Index) -> str:
    name = type(faiss.downcast_index(index)).__name__
    if "HNSW" in name:
        return "hnsw"
    if "IVFPQ" in name:
        return "ivfpq"
    return "ivf" if "IVF" in name else "flat"


def _read_faiss(path: Path, *, mmap: bool, kind: str | None = None) -> faiss.Index:
    """Read a FAISS file, memory-mapped when asked: IVF lists via ``IO_FLAG_MMAP``, flat / HNSW vector storage via
    ``IO_FLAG_MMAP_IFC`` (an HNSW graph itself is read into RAM)."""
    if not path.is_file():
        raise RetrievalError(f"{path}: FAISS index file not found")
    flags = 0
    if mmap:
        flags = faiss.IO_FLAG_MMAP if kind in IVF_TYPES else faiss.IO_FLAG_MMAP_IFC
    try:
        index = faiss.read_index(str(path), flags)
        if mmap and kind is None and _index_kind(index) in IVF_TYPES:
            index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP)
        return index
    except RuntimeError as error:
        raise RetrievalError(f"{path}: cannot read the FAISS index: {error}") from error


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
        meta = replace(index.meta, has_bm25=index.has_bm25)
        if Path(index.meta.faiss_file).is_absolute():
            pass  # a prebuilt index used as is: the metadata keeps pointing at it
        else:
            faiss.write_index(index.faiss_index, str(staging / FAISS_FILE))  # always the CPU form
            meta = replace(meta, faiss_file=FAISS_FILE)
        if isinstance(index.store, DiskPassageStore):
            if not Path(index.meta.passages_file).is_absolute():
                for source_file in index.store.files():
                    _link_or_copy(source_file, staging / (PASSAGES_FILE + source_file.name[len(
                        index.store.path.name):]))
                meta = replace(meta, passages_file=PASSAGES_FILE, passages_format=index.store.format)
        else:
            index.store.save(staging / PASSAGES_FILE)
        if index.has_bm25:
            index.bm25.save(staging / BM25_DIR)
        (staging / META_FILE).write_text(
            json.dumps(meta.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if index.build_dir is not None and (index.build_dir / "embeddings").is_dir():
        shutil.rmtree(index.build_dir / "embeddings", ignore_errors=True)  # the index is saved: shards may go
        shutil.rmtree(index.build_dir / BUILT_DIR, ignore_errors=True)
        logger.info("index saved to %s; removed the embedding shards and the built FAISS index under %s", target,
                    index.build_dir)
    return target


def _link_or_copy(source: Path, target: Path) -> None:
    """Hard-link ``source`` to ``target`` (same file system: no copy of a 14 GB corpus), else copy it."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


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
    mmap: bool = True,
    gpus: Sequence[int] | None = None,
) -> RetrievalIndex:
    """Load an index directory written by :func:`save_index_dir`.

    ``mmap`` (default) memory-maps the FAISS index where its type allows and BM25's score matrix; passages are
    read from disk by offset when the directory has an offsets file (indexes built at scale), else into memory.
    ``mmap=False`` reads everything into memory.
    """
    root = Path(path)
    meta = read_index_meta(root)
    faiss_path = _resolve(root, meta.faiss_file)
    faiss_index = _read_faiss(faiss_path, mmap=mmap, kind=meta.index_type)
    passages_path = _resolve(root, meta.passages_file)
    if sidecar(passages_path, OFFSETS_SUFFIX).is_file():
        store: Sequence[Passage] = DiskPassageStore(passages_path, meta.passages_format)
    else:
        store = PassageStore.load(passages_path)
    for what, count in (
        ("FAISS vectors in " + meta.faiss_file, faiss_index.ntotal),
        ("passages in " + meta.passages_file, len(store)),
    ):
        if count != meta.passage_count:
            raise RetrievalError(f"{root}: {count} {what} but {META_FILE} says passage_count {meta.passage_count}")
    bm25 = None
    if load_bm25 and meta.has_bm25:
        bm25 = BM25Retriever.load(root / BM25_DIR, store, mmap=mmap)
    return RetrievalIndex(
        meta, store, faiss_index, bm25, embedder, use_gpu=use_gpu, nprobe=nprobe, device=device, threads=threads,
        gpus=gpus, source_dir=root.resolve(),
    )


def _resolve(root: Path, name: str) -> Path:
    return Path(name) if Path(name).is_absolute() else root / name
