"""What an index will cost before it is built: memory, disk and build time, checked against this machine.

The byte counts follow FAISS's storage (flat: 4·d B/vector; IVF-flat: 4·d + 8 id; IVF-PQ: M·nbits/8 + 8 id;
HNSW: 4·d + 2·M neighbours × 4 B at level 0 plus ~1/M of that above). Build-time rates are defaults measured by
``benchmarks/corpus_scale.py`` on a 2-core CPU (see docs/corpus.md); pass your own for other machines.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from prorag.retrieval.dense import DenseIndexConfig, _auto_pq_m, _train_count, resolved_nlist

logger = logging.getLogger(__name__)

GIB = 1024**3

# Measured on this project's 2-core CPU box (benchmarks/corpus_scale.py, d=384, 1M synthetic vectors);
# seconds per vector per dimension, so other dimensions scale linearly.
DEFAULT_RATES: dict[str, float] = {
    "flat_add": 2.0e-9,        # copying vectors in
    "ivf_assign": 1.2e-10,     # per vector x list x dim (coarse assignment during add and k-means)
    "pq_encode": 6.0e-9,       # per vector x dim
    "hnsw_add": 3.5e-7,        # per vector x dim at M=32, efConstruction=40
}


class InsufficientResourcesError(RuntimeError):
    """The planned index does not fit this machine; the message names the knob to change."""


@dataclass(frozen=True)
class IndexCost:
    """Estimated cost of building and serving one index."""

    index_type: str
    count: int
    dim: int
    description: str
    index_bytes: int
    """The saved FAISS file (and the RAM a non-memory-mapped load takes)."""
    build_memory_bytes: int
    """Peak RAM of the build: the index plus the training sample plus one shard."""
    spill_bytes: int
    """Embedding shards on disk until the index is saved."""
    build_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"{self.description} over {self.count:,} x {self.dim}-d vectors: index "
                f"{self.index_bytes / GIB:.2f} GiB on disk, build peak RAM {self.build_memory_bytes / GIB:.2f} GiB, "
                f"embedding shards {self.spill_bytes / GIB:.2f} GiB, build ~{_duration(self.build_seconds)} on CPU")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_index_cost(config: DenseIndexConfig, count: int, dim: int, *, shard_bytes_per_value: int = 4,
                        shard_size: int = 65_536, rates: dict[str, float] | None = None) -> IndexCost:
    """Estimate memory, disk and CPU build time of ``config`` over ``count`` vectors of dimension ``dim``."""
    rate = {**DEFAULT_RATES, **(rates or {})}
    vector = 4 * dim
    spill = count * dim * shard_bytes_per_value
    shard = min(count, shard_size) * vector
    kind = config.index_type
    if kind == "flat":
        size = count * vector
        return IndexCost(kind, count, dim, "Flat", size, size + shard, spill, count * dim * rate["flat_add"])
    if kind == "hnsw":
        m = config.hnsw_m
        size = count * (vector + int(2 * m * 4 * (1 + 1 / m)) + 8)
        seconds = count * dim * rate["hnsw_add"] * (m / 32) * (config.ef_construction / 40)
        return IndexCost(kind, count, dim, f"HNSW{m},Flat", size, size + shard, spill, seconds)
    nlist = resolved_nlist(config, count)
    train = _train_count(config, count, nlist)
    centroids = nlist * vector
    kmeans = 25 * train * nlist * dim * rate["ivf_assign"]
    assign = count * nlist * dim * rate["ivf_assign"]
    if kind == "ivf":
        size = count * (vector + 8) + centroids
        return IndexCost(kind, count, dim, f"IVF{nlist},Flat", size, size + train * vector + shard, spill,
                         kmeans + assign)
    pq_m = config.pq_m or _auto_pq_m(dim)
    code = math.ceil(pq_m * config.pq_nbits / 8)
    size = count * (code + 8) + centroids + pq_m * (1 << config.pq_nbits) * (dim // pq_m) * 4
    seconds = kmeans + assign + count * dim * rate["pq_encode"]
    return IndexCost(kind, count, dim, f"IVF{nlist},PQ{pq_m}x{config.pq_nbits}", size,
                     size + train * vector + shard, spill, seconds)


def check_index_cost(cost: IndexCost, work_dir: str | os.PathLike[str], *, already_on_disk: int = 0,
                     memory_available: int | None = None, disk_free: int | None = None) -> None:
    """Log ``cost`` and refuse it (:class:`InsufficientResourcesError`) if this machine cannot hold it.

    RAM: the build peak must fit the available memory. Disk: the index, plus the embedding shards not yet
    written (``already_on_disk`` bytes of them exist), must fit the free space of ``work_dir``'s filesystem.
    """
    memory = psutil.virtual_memory().available if memory_available is None else memory_available
    directory = Path(work_dir)
    probe = next((parent for parent in (directory, *directory.parents) if parent.exists()), Path("."))
    free = shutil.disk_usage(probe).free if disk_free is None else disk_free
    logger.info("index plan: %s", cost.describe())
    print(f"[prorag] index plan: {cost.describe()}; this machine: {memory / GIB:.1f} GiB RAM available, "
          f"{free / GIB:.1f} GiB free under {probe}")
    if cost.build_memory_bytes > memory:
        raise InsufficientResourcesError(
            f"building {cost.description} needs ~{cost.build_memory_bytes / GIB:.1f} GiB of RAM, "
            f"{memory / GIB:.1f} GiB is available: use corpus_indexing.index_type ivfpq (smaller codes: pq_m), "
            "lower corpus_indexing.train_size, or a bigger machine")
    needed_disk = cost.index_bytes + max(0, cost.spill_bytes - already_on_disk)
    if needed_disk > free:
        raise InsufficientResourcesError(
            f"the index ({cost.index_bytes / GIB:.1f} GiB) and the embedding shards still to write "
            f"({max(0, cost.spill_bytes - already_on_disk) / GIB:.1f} GiB) need {needed_disk / GIB:.1f} GiB under "
            f"{probe}, {free / GIB:.1f} GiB is free: move corpus_indexing.work_dir to a larger disk or set "
            "corpus_indexing.fp16: true (half-size shards)")
