"""The corpus: reading several passage files and deduplicating them, with errors that name file and line."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence

from prorag.data.jsonl import DataFileError, iter_jsonl
from prorag.data.records import Passage
from prorag.errors import UserError

logger = logging.getLogger(__name__)


class DuplicatePassageError(UserError, ValueError):
    """Two records share an id but differ in title or text; the message names both."""


def _describe(passage: Passage, origin: str) -> str:
    text = passage.text if len(passage.text) <= 80 else passage.text[:77] + "..."
    return f"{origin} (title {passage.title!r}, text {text!r})"


def deduplicate_passages(passages: Iterable[Passage], origins: Sequence[str] | None = None) -> list[Passage]:
    """Drop exact repeats of a passage (same id, title and text), keeping the first occurrence.

    The same id with a different title or text raises :class:`DuplicatePassageError` naming both records,
    by ``origins[i]`` (e.g. ``"corpus/hotpotqa.jsonl:12"``) when given, else by position.
    """
    kept: list[Passage] = []
    first_seen: dict[str, tuple[Passage, str]] = {}
    dropped = 0
    for position, passage in enumerate(passages):
        origin = origins[position] if origins is not None else f"passage #{position}"
        previous = first_seen.get(passage.id)
        if previous is None:
            first_seen[passage.id] = (passage, origin)
            kept.append(passage)
            continue
        first, first_origin = previous
        if (first.title, first.text) != (passage.title, passage.text):
            raise DuplicatePassageError(
                f"passage id {passage.id!r} has two different records: "
                f"{_describe(first, first_origin)} and {_describe(passage, origin)}"
            )
        dropped += 1
    if dropped:
        logger.info("dropped %d exact duplicate passages (%d kept)", dropped, len(kept))
    return kept


def read_corpus_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Passage], list[str]]:
    """Read several corpus files without deduplicating: the passages and each one's ``file:line`` origin.

    A file without any record is an error (a silent zero would build an index without that corpus)."""
    passages: list[Passage] = []
    origins: list[str] = []
    for path in paths:
        before = len(passages)
        for line_number, raw in iter_jsonl(path):
            try:
                passages.append(Passage.from_dict(raw))
            except ValueError as error:
                raise DataFileError(path, f"invalid passage record: {error}", line_number) from error
            origins.append(f"{os.fspath(path)}:{line_number}")
        if len(passages) == before:
            raise DataFileError(path, "no passage records: the corpus file is empty")
    return passages, origins


def load_corpus(paths: Iterable[str | os.PathLike[str]]) -> list[Passage]:
    """Read and deduplicate several corpus files; errors name the file and line of each record involved."""
    return deduplicate_passages(*read_corpus_files(paths))
