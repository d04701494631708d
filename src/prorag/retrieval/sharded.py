"""Embedding a large corpus in resumable shards, on one device or several (one process per GPU).

Shard ``i`` holds rows ``i·shard_size …`` of the passage store as ``shard-{i:06d}.npy`` (float16 or float32),
written to a temporary name and renamed, so a file that exists is complete. ``manifest.json`` records what the
shards were made from (embedder, prefixes, shard size, passage count, store fingerprint); a rerun with the same
manifest skips every finished shard — kill the process at any point and run it again — and a rerun with another
one is refused rather than mixing embeddings. Progress (rows, rate, ETA) is logged every ``log_every_s``.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prorag.data.records import Passage
from prorag.gpus import pin_child_to
from prorag.retrieval.base import RetrievalError
from prorag.retrieval.disk_store import DiskPassageStore
from prorag.retrieval.embedder import Embedder, load_embedder

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def shard_path(directory: str | os.PathLike[str], shard: int) -> Path:
    return Path(directory) / f"shard-{shard:06d}.npy"


def shard_paths(directory: str | os.PathLike[str], count: int, shard_size: int) -> list[Path]:
    """The shard files of ``count`` rows, in row order."""
    return [shard_path(directory, shard) for shard in range(math.ceil(count / shard_size))]


def finished_shards(directory: str | os.PathLike[str], count: int, shard_size: int) -> list[int]:
    return [shard for shard, path in enumerate(shard_paths(directory, count, shard_size)) if path.is_file()]


class ProgressMeter:
    """Logs ``done/total unit (pct), rate/s, ETA`` at most every ``every_s`` seconds (and at the end)."""

    def __init__(self, total: int, *, done: int = 0, unit: str = "passages", every_s: float = 30.0,
                 label: str = "embedded") -> None:
        self.total, self.done, self.unit, self.every_s, self.label = total, done, unit, every_s, label
        self._start_done = done
        self._start = self._last = time.monotonic()

    def rate(self) -> float:
        elapsed = time.monotonic() - self._start
        return (self.done - self._start_done) / elapsed if elapsed > 0 else 0.0

    def message(self) -> str:
        rate = self.rate()
        left = self.total - self.done
        eta = f"{left / rate / 60:.1f} min" if rate > 0 else "unknown"
        return (f"{self.label} {self.done:,}/{self.total:,} {self.unit} ({100 * self.done / max(1, self.total):.1f}%), "
                f"{rate:,.1f} {self.unit}/s, ETA {eta}")

    def update(self, count: int, *, force: bool = False) -> None:
        self.done += count
        now = time.monotonic()
        if force or now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            logger.info("%s", self.message())


def _rows(store: Sequence[Passage], start: int, stop: int) -> list[Passage]:
    return [store[row] for row in range(start, stop)]


def store_fingerprint(store: Sequence[Passage]) -> dict[str, Any]:
    """Identity of a store for the manifest: its file's size and mtime, or (in memory) count and edge ids."""
    if isinstance(store, DiskPassageStore):
        stat = store.path.stat()
        return {"path": str(store.path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {"count": len(store), "first": store[0].id if len(store) else None,
            "last": store[len(store) - 1].id if len(store) else None}


def _check_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    path = directory / MANIFEST
    if path.is_file():
        previous = json.loads(path.read_text(encoding="utf-8"))
        if previous != manifest:
            changed = sorted(key for key in {*previous, *manifest} if previous.get(key) != manifest.get(key))
            raise RetrievalError(
                f"{directory}: holds embedding shards of another build (differs in {', '.join(changed)}); "
                "delete the folder or choose another corpus_indexing.work_dir")
    else:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _write_shard(path: Path, vectors: np.ndarray, dtype: str) -> None:
    temporary = path.with_name(f".{path.stem}.tmp-{os.getpid()}.npy")
    np.save(temporary, vectors.astype(dtype, copy=False))
    temporary.replace(path)


def embed_shards(embedder: Embedder, store: Sequence[Passage], directory: Path, shard_size: int,
                 shards: Sequence[int], dtype: str, meter: ProgressMeter | None = None,
                 on_shard: Callable[[int], None] | None = None) -> None:
    """Embed the given shard numbers of ``store`` into ``directory`` (the loop every worker runs)."""
    for shard in shards:
        path = shard_path(directory, shard)
        if path.is_file():
            continue
        start = shard * shard_size
        rows = _rows(store, start, min(len(store), start + shard_size))
        if on_shard is not None:
            on_shard(shard)
        _write_shard(path, embedder.encode_passages(rows, show_progress=False), dtype)
        if meter is not None:
            meter.update(len(rows))


def _worker(store_path: str, store_format: str, spec: str, options: dict[str, Any], device: str, directory: str,
            shard_size: int, shards: list[int], dtype: str) -> None:  # pragma: no cover - runs in a child process
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [{device}] %(message)s")
    embedder = load_embedder(spec, device=pin_child_to(device), **options)
    store = DiskPassageStore(store_path, store_format)
    meter = ProgressMeter(len(shards) * shard_size, unit="passages", label=f"[{device}] embedded")
    embed_shards(embedder, store, Path(directory), shard_size, shards, dtype, meter)


def embed_store(
    store: Sequence[Passage],
    directory: str | os.PathLike[str],
    *,
    embedder: Embedder | None = None,
    spec: str | None = None,
    embedder_options: dict[str, Any] | None = None,
    devices: Sequence[str] | None = None,
    shard_size: int = 65_536,
    dtype: str = "float32",
    log_every_s: float = 30.0,
    described: dict[str, Any] | None = None,
) -> list[Path]:
    """Embed every row of ``store`` into resumable shards under ``directory``; returns the shard paths in order.

    One device (or an ``embedder`` given): in this process. Several ``devices`` (``["cuda:0", "cuda:1"]``): one
    spawned process per device, each loading ``spec`` there and taking every n-th missing shard; ``store``
    must then be a :class:`DiskPassageStore` (the workers open it by path). ``described`` (an embedder's
    :meth:`~prorag.retrieval.embedder.Embedder.describe`) identifies the model in the manifest when none is loaded
    here, so a one-device rerun of a several-device run resumes it.
    """
    if dtype not in ("float16", "float32"):
        raise ValueError(f"shard dtype must be float16 or float32, got {dtype!r}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if embedder is None and spec is None:
        raise ValueError("embed_store needs an embedder or an embedder spec")
    options = dict(embedder_options or {})
    devices = list(devices or [])
    if embedder is None and len(devices) <= 1:
        embedder = load_embedder(spec or "", device=devices[0] if devices else None, **options)
    if embedder is not None:
        described = embedder.describe()
    elif described is None:
        described = {"embedder_spec": spec, **{key: options.get(key) for key in ("query_prefix", "passage_prefix")}}
    root = Path(directory)
    manifest = {**described, "shard_size": shard_size, "count": len(store), "dtype": dtype,
                "store": store_fingerprint(store)}
    _check_manifest(root, manifest)
    paths = shard_paths(root, len(store), shard_size)
    missing = [shard for shard, path in enumerate(paths) if not path.is_file()]
    done_rows = len(store) - sum(min(shard_size, len(store) - shard * shard_size) for shard in missing)
    logger.info("embedding %d passages in %d shards of %d under %s: %d finished, %d to go", len(store), len(paths),
                shard_size, root, len(paths) - len(missing), len(missing))
    meter = ProgressMeter(len(store), done=done_rows, every_s=log_every_s)
    if embedder is not None:
        embed_shards(embedder, store, root, shard_size, missing, dtype, meter)
        return paths
    if not isinstance(store, DiskPassageStore):
        raise ValueError("embedding on several devices needs a DiskPassageStore (workers open it by path)")
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_worker, args=(str(store.path), store.format, spec, options, device, str(root),
                                              shard_size, missing[rank :: len(devices)], dtype), daemon=False)
        for rank, device in enumerate(devices)
    ]
    for worker in workers:
        worker.start()
    while any(worker.is_alive() for worker in workers):
        time.sleep(min(5.0, log_every_s))
        now_done = len(store) - sum(min(shard_size, len(store) - shard * shard_size) for shard in missing
                                    if not paths[shard].is_file())
        meter.update(now_done - meter.done)
    failed = [(device, worker.exitcode) for device, worker in zip(devices, workers, strict=True) if worker.exitcode]
    if failed:
        raise RetrievalError(f"embedding workers failed ({failed}); finished shards are kept in {root}, "
                             "run the same command again to resume")
    return paths
