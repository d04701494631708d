"""Dense retrieval with FAISS: flat inner product, IVF, IVF-PQ or HNSW, built shard by shard, optionally on GPU.

Vectors are L2-normalized, so inner product is cosine similarity. Rows of the FAISS index are positions
in the :class:`~prorag.retrieval.store.PassageStore`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import faiss
import numpy as np

from prorag.retrieval.base import Hit, RetrievalError, check_search_args
from prorag.retrieval.store import PassageStore

logger = logging.getLogger(__name__)

IndexType = Literal["flat", "ivf", "ivfpq", "hnsw"]
INDEX_TYPES: tuple[str, ...] = ("flat", "ivf", "ivfpq", "hnsw")
IVF_TYPES: tuple[str, ...] = ("ivf", "ivfpq")
_MIN_POINTS_PER_CENTROID = 39  # FAISS warns below this many training points per k-means centroid


class QueryEncoder(Protocol):
    """What a dense retriever needs from an embedder."""

    @property
    def dim(self) -> int: ...

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class DenseIndexConfig:
    """How to build the FAISS index.

    ``nlist=None`` picks ~4·√n lists (at most n/39); ``pq_m=None`` picks the largest of 64, 48, 32, 16, 8, 4,
    2, 1 dividing the dimension; ``train_size=None`` trains on min(n, max(100000, 64·nlist)) vectors drawn
    uniformly from the whole corpus. An explicit ``nlist`` above n/39 is refused (:func:`check_nlist`).
    ``hnsw_m`` / ``ef_construction`` / ``ef_search`` configure HNSW (graph degree, build and search beam).
    ``gpus`` picks the GPUs FAISS may use (``None``: every visible one).
    """

    index_type: IndexType = "flat"
    nlist: int | None = None
    nprobe: int = 16
    pq_m: int | None = None
    pq_nbits: int = 8
    train_size: int | None = None
    use_gpu: bool = False
    seed: int = 0
    hnsw_m: int = 32
    ef_construction: int = 40
    ef_search: int = 64
    gpus: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.index_type not in INDEX_TYPES:
            raise ValueError(f"index_type must be one of {', '.join(INDEX_TYPES)}; got {self.index_type!r}")
        for name in ("nlist", "pq_m", "train_size", "hnsw_m", "ef_construction", "ef_search"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.nprobe < 1:
            raise ValueError(f"nprobe must be >= 1, got {self.nprobe}")
        if not 1 <= self.pq_nbits <= 16:
            raise ValueError(f"pq_nbits must be in 1..16, got {self.pq_nbits}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_nlist(nlist: int, count: int, *, knob: str = "nlist") -> None:
    """Refuse an IVF ``nlist`` the corpus cannot train: FAISS's k-means wants >= 39 vectors per list."""
    if nlist * _MIN_POINTS_PER_CENTROID > count:
        raise ValueError(
            f"{knob}={nlist} needs at least {nlist * _MIN_POINTS_PER_CENTROID} vectors ({_MIN_POINTS_PER_CENTROID} "
            f"per list) but the corpus has {count}; set {knob} to at most {max(1, count // _MIN_POINTS_PER_CENTROID)} "
            "or null (automatic: ~4*sqrt(n))")


def available_cpus() -> int:
    """CPUs this process may run on (respects affinity / container limits where the OS reports them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def set_faiss_threads(threads: int | None = None) -> int:
    """Set FAISS's OpenMP thread count for the calling thread (default: the CPUs available); returns it.

    OpenMP settings are per OS thread: a search run on another thread (a server worker) does not see
    this. :class:`DenseRetriever` therefore applies its own ``threads`` around every search.
    """
    count = max(1, threads if threads is not None else available_cpus())
    faiss.omp_set_num_threads(count)
    return count


@contextlib.contextmanager
def faiss_threads(count: int) -> Iterator[None]:
    """Run FAISS with ``count`` OpenMP threads on the calling thread, restoring the previous setting."""
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(max(1, count))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def set_blas_min_queries(min_queries: int, dim: int) -> None:
    """Make FAISS's exhaustive search use BLAS (sgemm) for batches of ``min_queries`` or more ``dim``-d queries.

    FAISS 1.15 switches from its SIMD loop to BLAS only when ``nq·d >= 128000`` (333 queries at d=384); on
    this project's CPU machines BLAS was 2-8x faster from 16 queries on (benchmarks/retrieval.py). The
    setting is process-wide (``faiss.cvar.distance_compute_blas_threshold``).
    """
    faiss.cvar.distance_compute_blas_threshold = max(1, min_queries * dim)


def gpu_count() -> int:
    """GPUs FAISS can use (0 with faiss-cpu)."""
    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    return int(get_num_gpus()) if get_num_gpus is not None else 0


def gpu_cloner_options(index: faiss.Index, gpu_total: int) -> Any:
    """Cloner options that work for every index type on every NVIDIA GPU.

    * IVF-PQ: ``useFloat16LookupTables`` — with 32-bit tables, M sub-quantizers x 2^nbits x 4 B exceed the
      48 KiB of shared memory per block FAISS may use for M = 64 x 8 bits (64 KiB), on every NVIDIA GPU;
    * flat / IVF-flat: ``useFloat16`` storage (half the GPU memory), and a flat index is *sharded* over several
      GPUs rather than replicated (FlashRAG / Search-R1 serve wiki-18 that way);
    * no precomputed IVF-PQ tables (nlist x M x 256 floats of GPU memory for a small speed-up).
    """
    options = faiss.GpuMultipleClonerOptions()
    options.useFloat16 = True
    options.useFloat16LookupTables = True
    options.usePrecomputed = False
    options.shard = gpu_total > 1 and "Flat" in type(faiss.downcast_index(index)).__name__
    return options


def maybe_to_gpu(index: faiss.Index, use_gpu: bool, gpus: Sequence[int] | None = None) -> faiss.Index:
    """A GPU copy of ``index`` on ``gpus`` (default: every visible GPU) when requested and available, else
    ``index`` (warning if requested). HNSW has no GPU form and stays on CPU."""
    if not use_gpu:
        return index
    available = gpu_count()
    if available == 0:
        logger.warning("use_gpu requested but FAISS sees no GPU (faiss-cpu installed?); staying on CPU")
        return index
    if "HNSW" in type(faiss.downcast_index(index)).__name__:
        logger.warning("FAISS has no GPU HNSW; searching on CPU")
        return index
    chosen = list(gpus) if gpus is not None else list(range(available))
    bad = [gpu for gpu in chosen if not 0 <= gpu < available]
    if bad or not chosen:
        raise ValueError(f"gpus={chosen}: FAISS sees {available} GPU(s) (0..{available - 1}); "
                         "set CUDA_VISIBLE_DEVICES or the gpus option")
    options = gpu_cloner_options(index, len(chosen))
    logger.info("cloning %s to GPU(s) %s (float16 lookup tables, shard=%s)", type(index).__name__, chosen,
                options.shard)
    return faiss.index_cpu_to_gpus_list(index, co=options, gpus=chosen)


def set_nprobe(index: faiss.Index, nprobe: int, *, on_gpu: bool = False) -> None:
    """Set ``nprobe`` on an IVF index (CPU, or GPU when ``on_gpu``); a no-op for flat indexes."""
    space = faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()
    with contextlib.suppress(RuntimeError):  # "could not set parameter nprobe": not an IVF index
        space.set_index_parameter(index, "nprobe", nprobe)


def _auto_pq_m(dim: int) -> int:
    return next(m for m in (64, 48, 32, 16, 8, 4, 2, 1) if dim % m == 0)


def resolved_nlist(config: DenseIndexConfig, count: int) -> int:
    """The IVF list count for ``count`` vectors: the explicit one (checked), else ~4*sqrt(n) capped at n/39."""
    if config.nlist is not None:
        check_nlist(config.nlist, count)
        return config.nlist
    return max(1, min(round(4 * math.sqrt(count)), max(1, count // _MIN_POINTS_PER_CENTROID)))


def factory_string(config: DenseIndexConfig, dim: int, count: int) -> str:
    """The ``faiss.index_factory`` description for ``count`` vectors of dimension ``dim``."""
    if config.index_type == "flat":
        return "Flat"
    if config.index_type == "hnsw":
        return f"HNSW{config.hnsw_m},Flat"
    nlist = resolved_nlist(config, count)
    if config.index_type == "ivf":
        return f"IVF{nlist},Flat"
    pq_m = config.pq_m or _auto_pq_m(dim)
    if dim % pq_m:
        raise ValueError(f"pq_m={pq_m} must divide the embedding dimension {dim}")
    train_count = _train_count(config, count, nlist)
    nbits = min(config.pq_nbits, max(1, int(math.log2(max(2, train_count // _MIN_POINTS_PER_CENTROID)))))
    if nbits < config.pq_nbits:
        logger.warning(
            "only %d training vectors: using %d-bit PQ codes instead of %d",
            train_count,
            nbits,
            config.pq_nbits,
        )
    return f"IVF{nlist},PQ{pq_m}x{nbits}"


def _train_count(config: DenseIndexConfig, count: int, nlist: int) -> int:
    return min(count, config.train_size or max(100_000, 64 * nlist))


class DenseIndexBuilder:
    """Add embeddings shard by shard, then :meth:`finish` into a CPU FAISS index.

    A flat or HNSW index takes vectors as they come. IVF / IVF-PQ need training before adding, and a fair
    training sample needs the whole corpus: their shards are spilled to ``.npy`` files under ``spill_dir`` (a
    temporary folder by default), the sample is drawn uniformly over all rows through memory maps, and
    the shards are then added one at a time — memory holds one shard plus the sample, never the corpus.
    Shards already on disk (a resumable embedding run, :mod:`prorag.retrieval.sharded`) are registered with
    :meth:`add_file` and never copied or deleted. The spill folder is deleted only once the index is built; if
    training or adding fails it is kept and its path logged, so the embeddings are not lost.
    """

    def __init__(
        self,
        dim: int,
        config: DenseIndexConfig | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.dim = dim
        self.config = config or DenseIndexConfig()
        self.count = 0
        self._finished = False
        self._direct: faiss.Index | None = None
        self._spill_parent = spill_dir
        self._spill: Path | None = None
        self._shards: list[Path] = []
        if self.config.index_type == "flat":
            self._direct = faiss.IndexFlatIP(dim)
        elif self.config.index_type == "hnsw":
            self._direct = faiss.index_factory(dim, factory_string(self.config, dim, 0), faiss.METRIC_INNER_PRODUCT)
            faiss.downcast_index(self._direct).hnsw.efConstruction = self.config.ef_construction

    def _check(self, vectors: np.ndarray) -> np.ndarray:
        if self._finished:
            raise RuntimeError("DenseIndexBuilder.add after finish")
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (m, {self.dim}), got {vectors.shape}")
        return vectors

    def add(self, vectors: np.ndarray) -> None:
        """Add one shard of L2-normalized embeddings, shape ``(m, dim)``."""
        vectors = self._check(np.ascontiguousarray(vectors, dtype=np.float32))
        if self._direct is not None:
            self._direct.add(vectors)
        else:
            if self._spill is None:
                self._spill = Path(tempfile.mkdtemp(prefix="prorag-embeddings-", dir=self._spill_parent))
            path = self._spill / f"shard-{len(self._shards):06d}.npy"
            np.save(path, vectors)
            self._shards.append(path)
        self.count += len(vectors)

    def add_file(self, path: str | os.PathLike[str]) -> None:
        """Add a shard saved as ``.npy`` (float32 or float16); IVF types read it when training, not now."""
        shard = np.load(path, mmap_mode="r")
        self._check(shard)
        if self._direct is not None:
            for start in range(0, len(shard), 65_536):
                self._direct.add(np.ascontiguousarray(shard[start : start + 65_536], dtype=np.float32))
        else:
            self._shards.append(Path(path))
        self.count += len(shard)

    def finish(self) -> faiss.Index:
        """The built CPU index (``nprobe`` / ``efSearch`` set); a spill folder is deleted only on success."""
        if self._finished:
            raise RuntimeError("DenseIndexBuilder.finish called twice")
        self._finished = True
        if self._direct is not None:
            if self.config.index_type == "hnsw":
                faiss.downcast_index(self._direct).hnsw.efSearch = self.config.ef_search
            return self._direct
        try:
            built = self._train_and_add()
        except BaseException:
            if self._spill is not None:
                logger.error("building the %s index failed; the %d spilled embedding shards are kept in %s",
                             self.config.index_type, len(self._shards), self._spill)
            raise
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
        return built

    def _train_and_add(self) -> faiss.Index:
        if self.count == 0:
            raise ValueError(f"cannot build a {self.config.index_type} index from 0 vectors")
        description = factory_string(self.config, self.dim, self.count)
        index = faiss.index_factory(self.dim, description, faiss.METRIC_INNER_PRODUCT)
        concrete = faiss.downcast_index(index)
        if hasattr(concrete, "do_polysemous_training"):
            concrete.do_polysemous_training = False  # slow annealing for a search mode we do not use
        nlist = faiss.extract_index_ivf(index).nlist
        sample_size = _train_count(self.config, self.count, nlist)
        rng = np.random.default_rng(self.config.seed)
        rows = np.sort(rng.choice(self.count, size=sample_size, replace=False))
        sample = np.empty((sample_size, self.dim), dtype=np.float32)
        filled, offset = 0, 0
        for path in self._shards:
            shard = np.load(path, mmap_mode="r")
            chosen = rows[(rows >= offset) & (rows < offset + len(shard))] - offset
            sample[filled : filled + len(chosen)] = shard[chosen]
            filled += len(chosen)
            offset += len(shard)
        working = maybe_to_gpu(index, self.config.use_gpu, self.config.gpus)
        logger.info("training %s on %d of %d vectors", description, sample_size, self.count)
        working.train(sample)
        del sample
        for path in self._shards:
            shard = np.load(path, mmap_mode="r")
            for start in range(0, len(shard), 65_536):
                working.add(np.ascontiguousarray(shard[start : start + 65_536], dtype=np.float32))
        built = working if working is index else faiss.index_gpu_to_cpu(working)
        set_nprobe(built, min(self.config.nprobe, nlist))
        return built


def build_dense_index(
    shards: Iterable[np.ndarray],
    dim: int,
    config: DenseIndexConfig | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
) -> faiss.Index:
    """Build a CPU FAISS index from an iterable of embedding shards (see :class:`DenseIndexBuilder`)."""
    builder = DenseIndexBuilder(dim, config, spill_dir)
    for shard in shards:
        builder.add(shard)
    return builder.finish()


def numpy_topk(corpus: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k by a numpy matmul (the reference FAISS is checked against)."""
    k = min(k, len(corpus))
    scores = queries @ corpus.T
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    part_scores = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-part_scores, axis=1, kind="stable")
    return np.take_along_axis(part_scores, order, axis=1), np.take_along_axis(part, order, axis=1)


class DenseRetriever:
    """Embed queries, search the FAISS index, return passages from the store.

    FAISS runs on ``threads`` OpenMP threads (default: all available CPUs), except for a single query,
    which runs on one: for one query, starting the thread team costs more than it saves (measured 1.8x
    faster on one thread on a 2-core machine, flat index of 20k-200k vectors). Batches of
    ``blas_min_queries`` or more use BLAS (see :func:`set_blas_min_queries`; ``None`` keeps FAISS's default).
    """

    def __init__(
        self,
        index: faiss.Index,
        store: PassageStore,
        encoder: QueryEncoder,
        *,
        nprobe: int | None = None,
        use_gpu: bool = False,
        gpus: Sequence[int] | None = None,
        threads: int | None = None,
        blas_min_queries: int | None = 16,
    ) -> None:
        if index.ntotal != len(store):
            raise RetrievalError(
                f"FAISS index has {index.ntotal} vectors but the passage store has {len(store)} passages"
            )
        if index.d != encoder.dim:
            raise RetrievalError(f"FAISS index dimension {index.d} != embedder dimension {encoder.dim}")
        self.store = store
        self.encoder = encoder
        self.index = maybe_to_gpu(index, use_gpu, gpus)
        self.on_gpu = self.index is not index
        self.threads = max(1, threads if threads is not None else available_cpus())
        if blas_min_queries is not None:
            set_blas_min_queries(blas_min_queries, index.d)
        if nprobe is not None:
            set_nprobe(self.index, nprobe, on_gpu=self.on_gpu)

    def __len__(self) -> int:
        return len(self.store)

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw FAISS search: ``(scores, rows)``, each ``(len(vectors), min(k, n))``; missing rows are -1."""
        k = min(k, self.index.ntotal)
        with faiss_threads(1 if len(vectors) < 2 else self.threads):
            return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        queries = check_search_args(queries, k)
        if not queries or self.index.ntotal == 0:
            return [[] for _ in queries]
        scores, rows = self.search_vectors(self.encoder.encode_queries(queries), k)
        return [
            [
                Hit.from_passage(self.store[int(row)], float(score))
                for score, row in zip(score_row, row_ids, strict=True)
                if row >= 0
            ]
            for score_row, row_ids in zip(scores, rows, strict=True)
        ]
