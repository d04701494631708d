"""A versioned JSON Lines dataset: a list of JSON objects, one per line, through fsspec."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from kedro.io.core import DatasetError, get_filepath_str

from prorag.data.jsonl import parse_jsonl_lines
from prorag.datasets.fsspec_base import FsspecVersionedDataset


class JSONLinesDataset(FsspecVersionedDataset[list[dict[str, Any]], list[dict[str, Any]]]):
    """Loads and saves ``list[dict]`` as JSONL; a malformed or non-UTF-8 line fails with the file and line number.

    Saving writes the whole file in one ``open`` call of the target filesystem, so a failed node never
    leaves a truncated version behind for the next run to load.
    """

    def load(self) -> list[dict[str, Any]]:
        path = self._load_path()
        with self._fs.open(path, mode="rb") as handle:
            return [record for _, record in parse_jsonl_lines(handle, path)]

    def save(self, data: list[dict[str, Any]]) -> None:
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise DatasetError(f"{type(self).__name__} saves a list of dicts, got {type(data).__name__}")
        payload = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in data)
        path = self._save_path()
        self._fs.makedirs(str(PurePosixPath(path).parent), exist_ok=True)
        with self._fs.open(path, mode="w", encoding="utf-8") as handle:
            handle.write(payload)
        self._invalidate_cache()

    def _invalidate_cache(self) -> None:
        path = get_filepath_str(self._filepath, self._protocol)
        self._fs.invalidate_cache(path)
