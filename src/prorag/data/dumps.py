"""Streaming readers for passage files as they are distributed, one record at a time, with ``file:line`` errors.

Formats (``PASSAGE_FORMATS``):

* ``prorag``   — this project's JSONL schema ``{"id", "title", "text"}`` (``data/01_raw/corpus/*.jsonl``);
* ``flashrag`` — the FlashRAG / Search-R1 ``wiki-18.jsonl`` schema ``{"id", "contents"}``, the title on the first
  line of ``contents`` and the text after it (the title is kept verbatim, quotes included, so ``title\\ntext``
  is the string the published indexes embedded);
* ``dpr``      — DPR's ``psgs_w100.tsv``: a header ``id<TAB>text<TAB>title``, then one passage per line, fields
  quoted the CSV way (``""`` inside a quoted field);
* ``auto``     — ``.tsv`` is ``dpr``; a JSONL file whose first record has ``contents`` is ``flashrag``, else
  ``prorag``.

Nothing here holds more than one record: :func:`iter_passage_file` yields ``(line, byte_offset, passage)`` so a
caller can index the file by offset (:mod:`prorag.retrieval.disk_store`) instead of loading it. A line is read
only up to ``max_record_bytes`` (a longer one is an error naming its file and line, never read whole), and a JSON
record gets :mod:`prorag.data.jsonl`'s checks (deep nesting, huge integers, lone surrogates) with file and line.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from prorag.data.jsonl import MAX_RECORD_BYTES, DataFileError, bounded_lines, decode_record
from prorag.data.records import Passage

PassageFormat = Literal["auto", "prorag", "flashrag", "dpr"]
PASSAGE_FORMATS: Final = ("auto", "prorag", "flashrag", "dpr")
_DPR_HEADER: Final = ("id", "text", "title")


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise DataFileError(path, "file not found" if not path.exists() else "not a regular file")


def detect_format(path: str | os.PathLike[str], *, max_record_bytes: int = MAX_RECORD_BYTES) -> str:
    """The concrete format of ``path`` (see the module docstring for the rule)."""
    file_path = Path(path)
    _check_file(file_path)
    if file_path.suffix.lower() == ".tsv":
        return "dpr"
    with file_path.open("rb") as handle:
        for line_number, raw in enumerate(bounded_lines(handle, file_path, max_record_bytes), start=1):
            if raw.strip():
                record = decode_record(raw, file_path, line_number)
                return "flashrag" if "contents" in record else "prorag"
    raise DataFileError(file_path, "no passage records: the corpus file is empty")


def resolve_format(path: str | os.PathLike[str], fmt: str, *, max_record_bytes: int = MAX_RECORD_BYTES) -> str:
    """``fmt`` checked against :data:`PASSAGE_FORMATS`; ``auto`` detected from the file."""
    if fmt not in PASSAGE_FORMATS:
        raise ValueError(f"passage format must be one of {', '.join(PASSAGE_FORMATS)}; got {fmt!r}")
    return detect_format(path, max_record_bytes=max_record_bytes) if fmt == "auto" else fmt


def flashrag_record(record: dict[str, Any]) -> dict[str, Any]:
    """``{"id", "contents"}`` → ``{"id", "title", "text"}`` (title = first line of ``contents``)."""
    if "id" not in record:
        raise ValueError("missing field 'id'")
    identifier = record["id"]
    if isinstance(identifier, int) and not isinstance(identifier, bool):
        identifier = str(identifier)
    contents = record.get("contents")
    if not isinstance(contents, str):
        raise ValueError(f"field 'contents' must be a string, got {type(contents).__name__}")
    title, newline, text = contents.partition("\n")
    if not newline:
        title, text = "", contents
    return {"id": identifier, "title": title, "text": text}


def parse_passage_line(raw: bytes, fmt: str, path: Path, line_number: int | None) -> Passage:
    """One line of a passage file in the concrete format ``fmt`` as a :class:`Passage`; errors name file:line."""
    try:
        if fmt == "dpr":
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise DataFileError(path, f"not UTF-8 ({error.reason})", line_number) from None
            fields = next(csv.reader([line], delimiter="\t"), [])
            if len(fields) != 3:
                raise DataFileError(path, f"expected 3 tab-separated fields (id, text, title), got {len(fields)}",
                                    line_number)
            return Passage.from_dict({"id": fields[0], "text": fields[1], "title": fields[2]})
        record = decode_record(raw, path, line_number)
        if fmt == "flashrag":
            record = flashrag_record(record)
        return Passage.from_dict(record)
    except DataFileError:
        raise
    except ValueError as error:
        raise DataFileError(path, f"invalid {fmt} passage record: {error}", line_number) from error


def iter_passage_file(path: str | os.PathLike[str], fmt: str = "auto", *,
                      max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, int, Passage]]:
    """Yield ``(line_number, byte_offset, passage)`` for every record of ``path``, streaming.

    Blank lines are skipped; DPR's header line is checked and skipped. A file without a record, and a line longer
    than ``max_record_bytes`` (never read whole), are errors naming the file (and line).
    """
    file_path = Path(path)
    fmt = resolve_format(file_path, fmt, max_record_bytes=max_record_bytes)
    csv.field_size_limit(max(max_record_bytes, csv.field_size_limit()))
    count = 0
    offset = 0
    with file_path.open("rb") as handle:
        for line_number, raw in enumerate(bounded_lines(handle, file_path, max_record_bytes), start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            if fmt == "dpr" and count == 0 and line_number == 1:
                header = tuple(raw.decode("utf-8", "replace").rstrip("\r\n").split("\t"))
                if header != _DPR_HEADER:
                    raise DataFileError(file_path, f"expected the DPR header 'id<TAB>text<TAB>title', got {header!r}",
                                        line_number)
                continue
            count += 1
            yield line_number, start, parse_passage_line(raw, fmt, file_path, line_number)
    if count == 0:
        raise DataFileError(file_path, "no passage records: the corpus file is empty")


@dataclass(frozen=True)
class PassageFile:
    """A passage file and its format: re-iterable, streaming (never the whole corpus in memory)."""

    path: str
    format: str = "auto"
    max_record_bytes: int = MAX_RECORD_BYTES

    def __post_init__(self) -> None:
        if self.format not in PASSAGE_FORMATS:
            raise ValueError(f"passage format must be one of {', '.join(PASSAGE_FORMATS)}; got {self.format!r}")

    def __iter__(self) -> Iterator[Passage]:
        for _, _, passage in iter_passage_file(self.path, self.format, max_record_bytes=self.max_record_bytes):
            yield passage

    def fingerprint(self) -> dict[str, Any]:
        """Path, size and modification time: enough to notice that a resumed build reads another file."""
        stat = Path(self.path).stat()
        return {"path": str(Path(self.path).resolve()), "format": self.format, "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns}
