"""A versioned Kedro dataset for a retrieval index directory (FAISS + BM25 + passages + metadata), via fsspec.

Catalog entry::

    retrieval_index:
      type: prorag.datasets.RetrievalIndexDataset
      filepath: data/06_models/retrieval_index      # or s3://bucket/…, gcs://…, memory://…
      versioned: true
      load_args: {use_gpu: false, nprobe: 16}      # passed to load_index_dir

A loaded version is kept for the life of the process (:func:`clear_index_cache` empties it): every node that
takes ``retrieval_index`` gets its own :meth:`~prorag.retrieval.index.RetrievalIndex.view` over one FAISS index,
store, BM25 and embedder instead of reloading them all.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from kedro.io.core import DatasetError, Version
from kedro_datasets._typing import TablePreview

from prorag.datasets.fsspec_base import PREVIEW_MAX_CHARS, FsspecVersionedDataset

if TYPE_CHECKING:
    from prorag.retrieval.index import RetrievalIndex

META_FILE = "index_meta.json"  # mirrors prorag.retrieval.index.META_FILE; written last, marks a complete save
_LOAD_ARGS = frozenset({"use_gpu", "nprobe", "device", "load_bm25", "mmap", "gpus"})
_CACHE: dict[tuple[str, str], RetrievalIndex] = {}
_CACHE_LOCK = threading.Lock()


def clear_index_cache() -> None:
    """Forget every index loaded by :class:`RetrievalIndexDataset` in this process."""
    with _CACHE_LOCK:
        _CACHE.clear()


class RetrievalIndexDataset(FsspecVersionedDataset["RetrievalIndex", "RetrievalIndex"]):
    """Saves and loads a :class:`~prorag.retrieval.index.RetrievalIndex` as an index directory.

    Local paths are written in place (staged in a sibling folder, then renamed) and loaded in place.
    Remote paths are written to a local temporary folder and uploaded file by file with ``index_meta.json``
    last, and downloaded to a temporary folder to load; a version without ``index_meta.json`` (an
    interrupted upload) does not count as existing. The loaded index lives in memory; the embedder is
    loaded from the recorded spec on first dense search.
    """

    def __init__(
        self,
        *,
        filepath: str,
        version: Version | None = None,
        load_args: dict[str, Any] | None = None,
        credentials: dict[str, Any] | None = None,
        fs_args: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        unknown = sorted(set(load_args or {}) - _LOAD_ARGS)
        if unknown:
            raise DatasetError(
                f"RetrievalIndexDataset({filepath}): unknown load_args {unknown}; allowed: {sorted(_LOAD_ARGS)}"
            )
        self._load_args = dict(load_args or {})
        super().__init__(filepath=filepath, version=version, credentials=credentials, fs_args=fs_args,
                         metadata=metadata)

    def load(self) -> RetrievalIndex:

        path = self._load_path()
        if not self._stored(path):
            raise DatasetError(f"{path}: no retrieval index here ({META_FILE} missing)")
        key = (f"{self._protocol}://{path}", repr(sorted(self._load_args.items())))
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            if cached is None:
                cached = self._load_uncached(path)
                _CACHE[key] = cached
        return cached.view()

    def _load_uncached(self, path: str) -> RetrievalIndex:
        from prorag.retrieval.index import load_index_dir

        if self._protocol == "file":
            return load_index_dir(path, **self._load_args)
        # a remote index is downloaded once per process, to a folder that lives as long as the process
        local = Path(tempfile.mkdtemp(prefix="prorag-index-")) / "index"
        self._fs.get(path.rstrip("/") + "/", str(local), recursive=True)
        loaded = load_index_dir(local, **self._load_args)
        loaded.source_dir = None  # a temporary download: not a place other processes (machines) can load from
        return loaded

    def save(self, data: RetrievalIndex) -> None:
        from prorag.retrieval.index import RetrievalIndex, save_index_dir

        if not isinstance(data, RetrievalIndex):
            raise DatasetError(f"RetrievalIndexDataset saves a RetrievalIndex, got {type(data).__name__}")
        path = self._save_path()
        with _CACHE_LOCK:
            for key in [key for key in _CACHE if key[0] == f"{self._protocol}://{path}"]:
                del _CACHE[key]
        if self._protocol == "file":
            save_index_dir(path, data, overwrite=True)
        else:
            with tempfile.TemporaryDirectory(prefix="prorag-index-") as temporary:
                local = save_index_dir(Path(temporary) / "index", data)
                if self._fs.exists(path):
                    self._fs.rm(path, recursive=True)
                files = sorted(
                    (item for item in local.rglob("*") if item.is_file()),
                    key=lambda item: (item.name == META_FILE, str(item)),
                )
                for item in files:
                    target = f"{path.rstrip('/')}/{item.relative_to(local).as_posix()}"
                    self._fs.makedirs(str(PurePosixPath(target).parent), exist_ok=True)
                    self._fs.put_file(str(item), target)
        self._invalidate_cache()

    def preview(self, max_chars: int = PREVIEW_MAX_CHARS) -> TablePreview:
        """A ``field``/``value`` table for kedro-viz: the version, ``index_meta.json``'s fields (embedder, dim,
        index type, passage count…) and the files' count and size; the index itself is not loaded."""
        return self._directory_summary(META_FILE, max_chars)

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(), "load_args": self._load_args}

    def _stored(self, path: str) -> bool:
        return bool(self._fs.exists(f"{str(path).rstrip('/')}/{META_FILE}"))
