"""What prorag's file- and directory-backed versioned datasets share: an fsspec filesystem, version paths that
count only complete saves, and kedro-viz previews."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any, Generic, TypeVar

import fsspec
from kedro.io.core import AbstractVersionedDataset, DatasetError, Version, get_filepath_str, get_protocol_and_path
from kedro_datasets._typing import TablePreview

LoadT = TypeVar("LoadT")
SaveT = TypeVar("SaveT")

PREVIEW_MAX_CHARS = 200
"""The longest cell of a preview table; longer text ends with ``…``."""
_NESTED_TEXT_CHARS = 40  # a string inside a list or object, in a preview cell
_NESTED_ITEMS = 3  # items of a list inside a cell; the rest are counted


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _shorten(value: Any) -> Any:
    """A nested value with long strings cut and long lists reduced to their first items and a count, so that a
    trajectory's structure (segments, token ids, steps) stays visible in one cell."""
    if isinstance(value, str):
        return _cut(value, _NESTED_TEXT_CHARS)
    if isinstance(value, dict):
        return {str(key): _shorten(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        head = [_shorten(item) for item in value[:_NESTED_ITEMS]]
        return head + ([f"… +{len(value) - _NESTED_ITEMS} more"] if len(value) > _NESTED_ITEMS else [])
    return value


def preview_cell(value: Any, max_chars: int = PREVIEW_MAX_CHARS) -> Any:
    """``value`` as a kedro-viz table cell: numbers, booleans and None as they are, text cut to ``max_chars``,
    lists and objects as compact JSON of a shortened copy (:func:`_shorten`), cut to ``max_chars``."""
    if value is None or isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, str):
        return _cut(value, max_chars)
    nested = _shorten(value) if isinstance(value, dict | list | tuple) else str(value)
    return _cut(json.dumps(nested, ensure_ascii=False, default=str), max_chars)


def table_preview(columns: list[str], rows: list[list[Any]], index: list[Any] | None = None) -> TablePreview:
    """A kedro-viz table: pandas' ``orient="split"`` shape (``columns``, ``index``, ``data``)."""
    return TablePreview({"columns": columns, "index": list(range(len(rows))) if index is None else index,
                         "data": rows})


def spread_rows(rows: Iterable[tuple[Any, Mapping[str, Any]]], key: str, nrows: int,
                ) -> list[tuple[Any, Mapping[str, Any]]]:
    """``nrows`` of the ``(index, row)`` pairs taken in turn from each value of ``row[key]`` (in order of first
    appearance), so that a preview shows every method rather than the first one's rows; at most ``nrows`` rows per
    value are kept while reading."""
    groups: dict[Any, list[tuple[Any, Mapping[str, Any]]]] = {}
    for index, row in rows:
        group = groups.setdefault(row.get(key), [])
        if len(group) < nrows:
            group.append((index, row))
    spread = [group[turn] for turn in range(nrows) for group in groups.values() if turn < len(group)]
    return spread[:nrows]


class FsspecVersionedDataset(AbstractVersionedDataset[LoadT, SaveT], Generic[LoadT, SaveT]):
    """A versioned dataset at ``filepath`` on any fsspec filesystem (local, ``s3://``, ``memory://``…).

    A version counts (for ``exists``, the latest-version lookup and Kedro's "must not exist" check) only when
    :meth:`_stored` says its save is complete, so an interrupted save never hides the previous version.
    """

    def __init__(self, *, filepath: str, version: Version | None = None, credentials: dict[str, Any] | None = None,
                 fs_args: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> None:
        protocol, path = get_protocol_and_path(filepath, version)
        self._protocol = protocol
        self._fs = fsspec.filesystem(protocol, **(credentials or {}), **(fs_args or {}))
        self.metadata = metadata
        super().__init__(filepath=PurePosixPath(path), version=version, exists_function=self._stored,
                         glob_function=self._fs.glob)

    def _load_path(self) -> str:
        return get_filepath_str(self._get_load_path(), self._protocol)

    def _save_path(self) -> str:
        return get_filepath_str(self._get_save_path(), self._protocol)

    def _describe(self) -> dict[str, Any]:
        return {"filepath": self._filepath, "protocol": self._protocol, "version": self._version}

    def _exists(self) -> bool:
        try:
            return self._stored(self._load_path())
        except DatasetError:
            return False

    def _stored(self, path: str) -> bool:
        """Whether a complete save is at ``path``."""
        return bool(self._fs.exists(str(path)))

    def _release(self) -> None:
        super()._release()
        self._invalidate_cache()

    def _invalidate_cache(self) -> None:
        self._fs.invalidate_cache(get_filepath_str(self._filepath, self._protocol))

    def _directory_summary(self, meta_file: str, max_chars: int = PREVIEW_MAX_CHARS) -> TablePreview:
        """A ``field``/``value`` table of a directory save: its version, its metadata file's fields and its files
        (count and bytes). Reads only the metadata file and the listing, never the data."""
        path = self._load_path().rstrip("/")
        if not self._stored(path):
            raise DatasetError(f"{path}: nothing to preview ({meta_file} missing)")
        with self._fs.open(f"{path}/{meta_file}", mode="r", encoding="utf-8") as handle:
            meta = json.load(handle)
        sizes = self._fs.find(path, detail=True)
        rows: list[list[Any]] = [["version", self.resolve_load_version() if self._version else None]]
        if isinstance(meta, dict):
            rows += [[str(key), preview_cell(value, max_chars)] for key, value in meta.items()]
        rows += [["files", len(sizes)], ["bytes", sum(int(info.get("size") or 0) for info in sizes.values())]]
        return table_preview(["field", "value"], rows)
