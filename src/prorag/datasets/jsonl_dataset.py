"""A versioned JSON Lines dataset: a list of JSON objects, one per line, through fsspec."""

from __future__ import annotations

import contextlib
import json
import os
from itertools import islice
from pathlib import PurePosixPath
from typing import Any

from kedro.io.core import DatasetError
from kedro_datasets._typing import TablePreview

from prorag.data.jsonl import DataFileError, parse_jsonl_lines
from prorag.datasets.fsspec_base import (
    PREVIEW_MAX_CHARS,
    FsspecVersionedDataset,
    preview_cell,
    spread_rows,
    table_preview,
)


class JSONLinesDataset(FsspecVersionedDataset[list[dict[str, Any]], list[dict[str, Any]]]):
    # Kept over kedro-datasets' json.JSONDataset (one JSON document, cannot read JSONL), pandas.JSONDataset(lines=True)
    # and polars' read_ndjson: both infer column types ("1" -> 1, 1 -> 1.0, missing keys -> NaN/None, so records do
    # not round-trip) and report a malformed line as a byte or character offset, not as file:line.
    """Loads and saves ``list[dict]`` as JSONL; a malformed or non-UTF-8 line fails with the file and line number.

    Saving serializes every record before touching the target, then writes it atomically: a local file through
    a temporary sibling and a rename, an object store in one upload (an object appears only once complete), so a
    failed node or a killed process never leaves a truncated version behind for the next run to load.
    """

    def load(self) -> list[dict[str, Any]]:
        path = self._load_path()
        with self._fs.open(path, mode="rb") as handle:
            return [record for _, record in parse_jsonl_lines(handle, path)]

    def save(self, data: list[dict[str, Any]]) -> None:
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise DatasetError(f"{type(self).__name__} saves a list of dicts, got {type(data).__name__}")
        payload = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in data).encode("utf-8")
        path = self._save_path()
        self._fs.makedirs(str(PurePosixPath(path).parent), exist_ok=True)
        if self._protocol == "file":
            temporary = str(PurePosixPath(path).with_name(f".{PurePosixPath(path).name}.tmp-{os.getpid()}"))
            try:
                with open(temporary, "wb") as handle:
                    handle.write(payload)
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(temporary)
                raise
        else:
            with self._fs.open(path, mode="wb") as handle:
                handle.write(payload)
        self._invalidate_cache()

    def preview(self, nrows: int = 5, max_chars: int = PREVIEW_MAX_CHARS, columns: list[str] | None = None,
                spread_by: str | None = None) -> TablePreview:
        """The first ``nrows`` records as a kedro-viz table (read line by line, never the whole file at once): one
        column per key in order of first appearance (or the ``columns`` named, in their order), ``index`` the line
        numbers, nested values as compact JSON and every cell cut to ``max_chars`` characters. With ``spread_by``
        (a key, e.g. ``method``), the records are taken in turn from each of its values (:func:`spread_rows`), so
        the trained agents appended after the baselines show too; the whole file is then read."""
        if nrows < 0 or max_chars < 1:
            raise DatasetError(f"preview needs nrows >= 0 and max_chars >= 1, got {nrows} and {max_chars}")
        path = self._load_path()
        try:
            with self._fs.open(path, mode="rb") as handle:
                lines = parse_jsonl_lines(handle, path)
                numbered = (list(islice(lines, nrows)) if spread_by is None
                            else spread_rows(lines, spread_by, nrows))
        except DataFileError as error:
            raise DatasetError(str(error)) from error
        if columns is None:
            columns = list(dict.fromkeys(key for _, record in numbered for key in record))
        rows = [[preview_cell(record.get(column), max_chars) for column in columns] for _, record in numbered]
        return table_preview(columns, rows, index=[line for line, _ in numbered])
