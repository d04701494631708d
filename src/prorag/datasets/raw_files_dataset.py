"""A read-only raw-layer dataset: a local folder of benchmark files (``data/01_raw/qa``, ``data/01_raw/corpus``).

It puts the raw layer in the graph (``kedro viz``, ``kedro catalog``) without taking the choice of files away
from the parameters: it loads a :class:`~prorag.data.raw_files.RawFiles` listing, and the data-preparation nodes
read the files their parameters name (anywhere on disk) with :func:`prorag.data.iter_jsonl`'s file:line errors::

    raw_question_files:
      type: prorag.datasets.RawFilesDataset
      filepath: data/01_raw/qa
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.io.core import AbstractDataset, DatasetError

from prorag.data.raw_files import RawFiles


class RawFilesDataset(AbstractDataset[RawFiles, object]):
    """Loads the listing of ``filepath`` (files matching ``pattern``); saving is refused (raw data is read-only)."""

    def __init__(self, *, filepath: str, pattern: str = "*.jsonl", metadata: dict[str, Any] | None = None) -> None:
        self._filepath = Path(filepath)
        self._pattern = pattern
        self.metadata = metadata

    def load(self) -> RawFiles:
        return RawFiles.scan(self._filepath, self._pattern)

    def save(self, data: object) -> None:
        raise DatasetError(f"{self._filepath} is raw input and read-only; nothing in the project writes to it")

    def _exists(self) -> bool:
        return self._filepath.is_dir()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath), "pattern": self._pattern}
