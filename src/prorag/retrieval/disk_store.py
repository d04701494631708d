"""A passage store read from disk by byte offset: passages stay in their file, memory holds 8-byte offsets.

Files beside the passage file ``P`` (any format of :mod:`prorag.data.dumps`)::

    P.offsets.npy   int64, n+1 entries: byte offset of record i, then the file size
    P.idhash.npy    uint64 blake2b-64 hashes of the ids, sorted      (id -> row lookups)
    P.idrow.npy     int64 rows in the order of P.idhash.npy

All three are memory-mapped. :func:`ingest_passages` streams passages (any iterable) into a new ``passages.jsonl``
of this project's schema, deduplicating as :func:`prorag.data.corpus.deduplicate_passages` does;
:func:`index_passage_file` indexes an existing file as it is (a prebuilt corpus whose rows are a FAISS index's rows).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prorag.data.corpus import DuplicatePassageError
from prorag.data.dumps import iter_passage_file, parse_passage_line, resolve_format
from prorag.data.jsonl import MAX_RECORD_BYTES, DataFileError
from prorag.data.records import Passage
from prorag.retrieval.corpus import split_passage

logger = logging.getLogger(__name__)

OFFSETS_SUFFIX = ".offsets.npy"
IDHASH_SUFFIX = ".idhash.npy"
IDROW_SUFFIX = ".idrow.npy"


def id_hash(passage_id: str) -> int:
    """64-bit hash of a passage id (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest(), "little")


def _content_hash(passage: Passage) -> int:
    digest = hashlib.blake2b(f"{passage.title}\x00{passage.text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def sidecar(path: str | os.PathLike[str], suffix: str) -> Path:
    return Path(f"{os.fspath(path)}{suffix}")


def _save_npy(path: Path, array_: np.ndarray) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}.npy")
    np.save(temporary, array_)
    temporary.replace(path)


def _write_id_index(passages_path: Path, hashes: np.ndarray) -> None:
    order = np.argsort(hashes, kind="stable")
    _save_npy(sidecar(passages_path, IDHASH_SUFFIX), hashes[order])
    _save_npy(sidecar(passages_path, IDROW_SUFFIX), order.astype(np.int64))


class DiskPassageStore(Sequence[Passage]):
    """Passages by row (FAISS / BM25 row number) and by id, parsed from the memory-mapped file on access.

    Same interface as :class:`~prorag.retrieval.store.PassageStore`; ids are unique unless the file came as
    it is (:func:`index_passage_file`), where :meth:`position` answers the first row of an id.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: str = "prorag") -> None:
        self.path = Path(path)
        self.format = resolve_format(self.path, fmt)
        offsets_path = sidecar(self.path, OFFSETS_SUFFIX)
        if not offsets_path.is_file():
            raise DataFileError(offsets_path, "offsets file not found (index the passage file first)")
        self._offsets = np.load(offsets_path, mmap_mode="r")
        size = self.path.stat().st_size
        if len(self._offsets) < 1 or int(self._offsets[-1]) != size:
            raise DataFileError(offsets_path, f"does not match {self.path} ({size} bytes): the file changed "
                                              "after it was indexed; index it again")
        self._hashes: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._handle = self.path.open("rb")
        self._map = mmap.mmap(self._handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _raw(self, row: int) -> bytes:
        assert self._map is not None
        return self._map[int(self._offsets[row]) : int(self._offsets[row + 1])]

    def __getitem__(self, position: int) -> Passage:  # type: ignore[override]
        count = len(self)
        row = position + count if position < 0 else position
        if not 0 <= row < count:
            raise IndexError(f"passage row {position} out of range ({count} passages)")
        return parse_passage_line(self._raw(row), self.format, self.path, None)

    def __iter__(self) -> Iterator[Passage]:
        for row in range(len(self)):  # by offset: the records were checked when the file was indexed
            yield self[row]

    def _id_index(self) -> tuple[np.ndarray, np.ndarray]:
        if self._hashes is None or self._rows is None:
            hash_path, row_path = sidecar(self.path, IDHASH_SUFFIX), sidecar(self.path, IDROW_SUFFIX)
            if not hash_path.is_file() or not row_path.is_file():
                raise DataFileError(hash_path, "id index not found (index the passage file first)")
            self._hashes = np.load(hash_path, mmap_mode="r")
            self._rows = np.load(row_path, mmap_mode="r")
        return self._hashes, self._rows

    def _find(self, passage_id: str) -> int | None:
        hashes, rows = self._id_index()
        key = np.uint64(id_hash(passage_id))
        low, high = np.searchsorted(hashes, key, "left"), np.searchsorted(hashes, key, "right")
        candidates = sorted(int(rows[i]) for i in range(int(low), int(high)))
        return next((row for row in candidates if self[row].id == passage_id), None)

    def __contains__(self, passage_id: object) -> bool:
        return isinstance(passage_id, str) and self._find(passage_id) is not None

    @property
    def ids(self) -> list[str]:
        return [passage.id for passage in self]

    def position(self, passage_id: str) -> int:
        """Row of ``passage_id``; ``KeyError`` naming the id if absent."""
        row = self._find(passage_id)
        if row is None:
            raise KeyError(f"passage id {passage_id!r} is not in the store ({len(self)} passages)")
        return row

    def get(self, passage_id: str) -> Passage:  # type: ignore[override]
        return self[self.position(passage_id)]

    def files(self) -> list[Path]:
        """The passage file and its sidecars (what an index directory must keep)."""
        return [self.path, *(sidecar(self.path, suffix) for suffix in (OFFSETS_SUFFIX, IDHASH_SUFFIX, IDROW_SUFFIX))]

    def disk_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.files() if path.is_file())

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._handle.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "format": self.format}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["format"])  # type: ignore[misc]


def index_passage_file(path: str | os.PathLike[str], fmt: str = "auto", *,
                       max_record_bytes: int = MAX_RECORD_BYTES) -> DiskPassageStore:
    """Write the offsets and id index of an existing passage file (streaming); rows are its records in order. A
    record longer than ``max_record_bytes`` is an error naming its file and line."""
    file_path = Path(path)
    fmt = resolve_format(file_path, fmt, max_record_bytes=max_record_bytes)
    offsets, hashes = array("q"), array("Q")
    for _, offset, passage in iter_passage_file(file_path, fmt, max_record_bytes=max_record_bytes):
        offsets.append(offset)
        hashes.append(id_hash(passage.id))
    offsets.append(file_path.stat().st_size)
    _save_npy(sidecar(file_path, OFFSETS_SUFFIX), np.frombuffer(offsets, dtype=np.int64))
    _write_id_index(file_path, np.frombuffer(hashes, dtype=np.uint64))
    logger.info("indexed %s: %d passages (%s)", file_path, len(offsets) - 1, fmt)
    return DiskPassageStore(file_path, fmt)


def ingest_passages(
    passages: Iterable[tuple[str, Passage]],
    target: str | os.PathLike[str],
    *,
    window_words: int | None = None,
) -> DiskPassageStore:
    """Stream ``(origin, passage)`` pairs into ``target`` (``{"id","title","text"}`` JSONL) and index it.

    ``origin`` (e.g. ``"wiki-18.jsonl:12"``) names a record in errors. Exact repeats (same id, title, text) are
    dropped, keeping the first; the same id with another title or text raises
    :class:`~prorag.data.corpus.DuplicatePassageError` naming both origins. Windows (``window_words``) are cut
    as :func:`prorag.retrieval.corpus.split_passage` cuts them. Memory: 24 bytes per passage (offset, two
    hashes), never the passages.
    """
    target_path = Path(target)
    target_path.parent.mkdir(parents=True, exist_ok=True)
    temporary = target_path.with_name(f".{target_path.name}.tmp-{os.getpid()}")
    offsets, hashes, contents, sources = array("q"), array("Q"), array("Q"), array("q")
    offset = 0
    with temporary.open("wb") as handle:
        for record, (_, passage) in enumerate(passages):
            for piece in split_passage(passage, window_words) if window_words is not None else (passage,):
                line = (json.dumps(piece.to_dict(), ensure_ascii=False) + "\n").encode("utf-8")
                offsets.append(offset)
                hashes.append(id_hash(piece.id))
                contents.append(_content_hash(piece))
                sources.append(record)
                handle.write(line)
                offset += len(line)
    if not offsets:
        temporary.unlink()
        raise ValueError("cannot build a passage store from an empty corpus")
    id_hashes = np.frombuffer(hashes, dtype=np.uint64)
    drop = _duplicates(id_hashes, np.frombuffer(contents, dtype=np.uint64), temporary, sources, passages)
    if drop:
        logger.info("dropped %d exact duplicate passages (%d kept)", len(drop), len(offsets) - len(drop))
        _rewrite_without(temporary, drop)
        keep = np.ones(len(id_hashes), dtype=bool)
        keep[sorted(drop)] = False
        id_hashes = id_hashes[keep]
        offsets = _scan_offsets(temporary)
    offsets.append(temporary.stat().st_size)
    temporary.replace(target_path)
    _save_npy(sidecar(target_path, OFFSETS_SUFFIX), np.frombuffer(offsets, dtype=np.int64))
    _write_id_index(target_path, np.ascontiguousarray(id_hashes))
    return DiskPassageStore(target_path, "prorag")


def _duplicates(id_hashes: np.ndarray, content_hashes: np.ndarray, written: Path, sources: array,
                passages: Iterable[tuple[str, Passage]]) -> set[int]:
    """Rows repeating an earlier row exactly; a same-id row with other content raises, naming both origins."""
    order = np.argsort(id_hashes, kind="stable")
    same = np.flatnonzero(id_hashes[order][1:] == id_hashes[order][:-1])
    drop: set[int] = set()
    first_of: dict[int, int] = {}
    for index in same:
        first = first_of.setdefault(int(id_hashes[order[index]]), int(order[index]))
        row = int(order[index + 1])
        first_passage = parse_passage_line(_line_at(written, first), "prorag", written, first + 1)
        passage = parse_passage_line(_line_at(written, row), "prorag", written, row + 1)
        if first_passage.id != passage.id:
            continue  # a 64-bit hash collision of two different ids
        if content_hashes[row] == content_hashes[first] and first_passage == passage:
            drop.add(row)
            continue
        names = _origin_names(passages, {sources[first], sources[row]})
        raise DuplicatePassageError(
            f"passage id {passage.id!r} has two different records: "
            f"{names.get(sources[first], f'record #{sources[first]}')} (title {first_passage.title!r}) and "
            f"{names.get(sources[row], f'record #{sources[row]}')} (title {passage.title!r})")
    return drop


def _line_at(path: Path, row: int) -> bytes:
    with path.open("rb") as handle:
        for index, raw in enumerate(handle):
            if index == row:
                return raw
    raise IndexError(row)


def _origin_names(passages: Iterable[tuple[str, Passage]], records: set[int]) -> dict[int, str]:
    """The origins of some records of a re-iterable source (the error path only; a one-shot iterator: none)."""
    if isinstance(passages, Iterator):
        return {}
    return {index: origin for index, (origin, _) in enumerate(passages) if index in records}


def _scan_offsets(path: Path) -> array:
    offsets, offset = array("q"), 0
    with path.open("rb") as handle:
        for raw in handle:
            offsets.append(offset)
            offset += len(raw)
    return offsets


def _rewrite_without(path: Path, drop: set[int]) -> None:
    rewritten = path.with_name(path.name + ".dedup")
    with path.open("rb") as source, rewritten.open("wb") as handle:
        for row, raw in enumerate(source):
            if row not in drop:
                handle.write(raw)
    rewritten.replace(path)
