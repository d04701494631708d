"""JSON Lines reading and writing that names the file and line of every bad record."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prorag.errors import UserError


class DataFileError(UserError, ValueError):
    """A data file is missing or holds a malformed record; the message names the file and line."""

    def __init__(self, path: str | os.PathLike[str], message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


def parse_jsonl_lines(lines: Iterable[bytes], path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line of raw bytes; a line that is not UTF-8, not
    JSON or not an object raises :class:`DataFileError` naming ``path`` and the line (numbered from 1)."""
    for line_number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataFileError(path, f"not UTF-8: byte 0x{raw[error.start]:02x} at byte {error.start + 1} of the "
                                      "line (re-save the file as UTF-8)", line_number) from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFileError(path, f"malformed JSON ({error.msg} at column {error.colno})",
                                line_number) from error
        if not isinstance(record, dict):
            raise DataFileError(path, f"expected a JSON object, got {type(record).__name__}", line_number)
        yield line_number, record


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line; line numbers start at 1."""
    file_path = Path(path)
    if not file_path.is_file():
        raise DataFileError(file_path, "file not found" if not file_path.exists() else "not a regular file")
    with file_path.open("rb") as handle:
        yield from parse_jsonl_lines(handle, file_path)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a whole JSONL file into a list of objects."""
    return [record for _, record in iter_jsonl(path)]


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically (temporary file, then rename), so a crash never leaves half a file."""
    file_path = Path(path)
    file_path.parent.mkdir(parents=True, exist_ok=True)
    temporary = file_path.with_name(f".{file_path.name}.tmp-{os.getpid()}")
    count = 0
    with temporary.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    temporary.replace(file_path)
    return count
