"""JSON Lines reading and writing that names the file and line of every bad record.

A record is refused with its file and line when it is not UTF-8, not JSON, not an object, longer than
:data:`MAX_RECORD_BYTES` (read from a file, a longer line is never read whole), nested deeper than Python's recursion
limit, holds an integer over Python's 4,300-digit conversion limit, or a string with a lone surrogate (such a string
cannot be saved or tokenized later)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

from prorag.errors import UserError

MAX_RECORD_BYTES: Final = 64 << 20
"""Longest JSONL record read (64 MiB; a passage is a few KB, a rollout with its token ids ~100 KB)."""


class DataFileError(UserError, ValueError):
    """A data file is missing or holds a malformed record; the message names the file and line."""

    def __init__(self, path: str | os.PathLike[str], message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


def parse_jsonl_lines(lines: Iterable[bytes] | BinaryIO, path: str | os.PathLike[str], *,
                      max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line of raw bytes (an open binary file is read line by
    line up to ``max_record_bytes``); a bad record (see the module docstring) raises :class:`DataFileError` naming
    ``path`` and the line (numbered from 1)."""
    for line_number, raw in enumerate(bounded_lines(lines, path, max_record_bytes), start=1):
        if raw.strip():
            yield line_number, decode_record(raw, path, line_number)


def decode_record(raw: bytes, path: str | os.PathLike[str], line_number: int | None) -> dict[str, Any]:
    """One JSONL line as a JSON object; any bad record (see the module docstring) raises :class:`DataFileError`
    naming ``path`` and ``line_number``."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataFileError(path, f"not UTF-8: byte 0x{raw[error.start]:02x} at byte {error.start + 1} of the "
                                  "line (re-save the file as UTF-8)", line_number) from None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataFileError(path, f"malformed JSON ({error.msg} at column {error.colno})", line_number) from error
    except RecursionError:
        raise DataFileError(path, "JSON nested too deeply", line_number) from None
    except ValueError as error:  # an integer over the int-string conversion limit
        raise DataFileError(path, f"unreadable JSON value: {error}", line_number) from None
    if not isinstance(record, dict):
        raise DataFileError(path, f"expected a JSON object, got {type(record).__name__}", line_number)
    problem = _bad_string(record)
    if problem is not None:
        raise DataFileError(path, problem, line_number)
    return record


def bounded_lines(lines: Iterable[bytes] | BinaryIO, path: str | os.PathLike[str],
                  limit: int = MAX_RECORD_BYTES) -> Iterator[bytes]:
    """The lines (line ends kept), each at most ``limit`` bytes without its line end; a longer one raises
    :class:`DataFileError` with its line number and, from an open file, is never read whole (at most
    ``limit + 2`` bytes of it)."""
    if limit < 1:
        raise ValueError(f"the record-size limit must be >= 1 byte, got {limit}")
    readline = getattr(lines, "readline", None)
    source: Iterable[bytes] = iter(lambda: readline(limit + 2), b"") if readline is not None else lines
    for number, raw in enumerate(source, start=1):
        if len(raw.rstrip(b"\r\n")) > limit:
            raise DataFileError(path, f"a record longer than {limit} bytes (the record-size limit, "
                                      "max_record_bytes)", number)
        yield raw


def _bad_string(record: dict[str, Any]) -> str | None:
    """Where a string (key or value) of ``record`` holds a lone surrogate, else None (walked without recursion)."""
    stack: list[tuple[Any, str]] = [(record, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                return (f"field {where or '(top)'}: invalid Unicode (lone surrogate U+{ord(item[error.start]):04X} "
                        f"at character {error.start})")
        elif isinstance(item, dict):
            for key, value in item.items():
                stack.append((key, f"{where} key".strip()))
                stack.append((value, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((value, f"{where}[{index}]") for index, value in enumerate(item))
    return None


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
