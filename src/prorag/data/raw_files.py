"""The raw-layer folders of benchmark files, and the check that every configured file is there.

Parameters (``data_preparation.question_files`` / ``corpus_files``) pick the files by path — any path, so that
held-out files of the same schema need not live in the vendored folder. The folder's listing serves the error
for a configured file that is missing: it says what the folder holds and which key to change.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prorag.data.jsonl import DataFileError


@dataclass(frozen=True)
class RawFiles:
    """A raw folder (``folder``) and the names of the files in it that match its pattern (``names``)."""

    folder: Path
    names: tuple[str, ...] = ()

    @classmethod
    def scan(cls, folder: str | os.PathLike[str], pattern: str = "*.jsonl") -> RawFiles:
        """The files of ``folder`` matching ``pattern``; a missing folder is empty, not an error (the configured
        files may all live elsewhere)."""
        path = Path(folder)
        names = sorted(item.name for item in path.glob(pattern) if item.is_file()) if path.is_dir() else []
        return cls(path, tuple(names))

    def check(self, paths: Iterable[str | os.PathLike[str]], key: str) -> None:
        """Raise :class:`DataFileError` for the first of ``paths`` that is not a regular file, naming the
        parameter ``key`` that lists it and what this folder holds."""
        for path in paths:
            file_path = Path(path)
            if file_path.is_file():
                continue
            problem = "file not found" if not file_path.exists() else "not a regular file"
            present = ", ".join(self.names) if self.names else "no matching files"
            raise DataFileError(file_path, f"{problem} (listed in parameter {key!r}; {self.folder} has: {present})")
