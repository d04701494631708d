"""A crash-safe, append-only cache of extraction replies, keyed by (endpoint, model, prompt, chunk hash).

One JSON object per line. Each finished batch is appended, flushed and fsync'ed before the next one starts, so a
run killed at any moment loses at most the batch in flight; a line cut short by the kill is skipped (and
counted) when the file is read back. A re-run, or a run over a corpus with added passages, generates only the
chunks whose key is not in the file yet.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prorag.data.records import Passage

logger = logging.getLogger(__name__)


def chunk_hash(passage: Passage) -> str:
    """SHA-256 of the chunk's id, title and text (an edited chunk is a new chunk)."""
    material = json.dumps([passage.id, passage.title, passage.text], ensure_ascii=False)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def cache_key(model: str, prompt: str, passage: Passage, *, endpoint: str = "local") -> str:
    """The cache key of one extraction: endpoint (a server's ``base_url``, ``"local"`` in-process), model spec,
    prompt fingerprint and chunk hash: replies of one server are never reused for another."""
    return hashlib.sha256(f"{endpoint}\x00{model}\x00{prompt}\x00{chunk_hash(passage)}".encode()).hexdigest()


@dataclass(frozen=True)
class CachedReply:
    """One finished extraction: the raw reply and its token counts."""

    key: str
    chunk_id: str
    model: str
    prompt: str
    reply: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ExtractionCache:
    """The replies already extracted, backed by an append-only JSONL file (``None`` path: in memory only)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self.entries: dict[str, CachedReply] = {}
        self.corrupt_lines = 0
        if self.path is not None and self.path.is_file():
            self._read(self.path)

    def _read(self, path: Path) -> None:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    entry = CachedReply(**json.loads(raw.decode("utf-8")))
                except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as error:
                    self.corrupt_lines += 1  # a line cut short by a kill, or a foreign line: re-extract
                    logger.warning("%s:%d: unreadable cache line skipped (%s)", path, number, error)
                    continue
                self.entries[entry.key] = entry

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str) -> CachedReply | None:
        return self.entries.get(key)

    def append(self, replies: Iterable[CachedReply]) -> None:
        """Record finished replies: in memory, and durably on disk before returning."""
        batch = list(replies)
        for reply in batch:
            self.entries[reply.key] = reply
        if self.path is None or not batch:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(reply.to_dict(), ensure_ascii=False) + "\n" for reply in batch)
        with self.path.open("ab") as handle:
            if handle.tell() > 0 and not _ends_with_newline(self.path):
                handle.write(b"\n")  # a previous run died mid-line: start on a fresh line
            handle.write(lines.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"
