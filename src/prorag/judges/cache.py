"""A persistent cache of judge replies (SQLite, WAL), so a re-run or a crash never repeats a paid call.

A row maps ``key`` — :func:`cache_key`, the SHA-256 of the endpoint, the model name, the prompt messages and the
sampling parameters — to the judge's raw reply. Only replies that parsed into a verdict are stored; errors,
timeouts and unparsable replies are not, so they are asked again on the next run (a reply that stops parsing
after a parser change is treated as missing too). The verdict is re-parsed from the raw reply on every read.

Each reply is committed as soon as it arrives. Safe across threads (one connection behind a lock) and
processes (SQLite's WAL journal and a busy timeout; a forked child opens its own connection on first use).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_replies (
    key TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    model TEXT NOT NULL,
    raw TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""
_CHUNK = 500  # keys per SELECT … IN (…), below SQLite's variable limit


def cache_key(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any], *, endpoint: str) -> str:
    """SHA-256 hex digest of the endpoint (base URL), the model, the messages and the sampling parameters
    (canonical JSON): the same model name behind two servers may be two different models."""
    payload = json.dumps({"endpoint": endpoint.rstrip("/"), "model": model,
                          "messages": [dict(message) for message in messages], "params": dict(params)},
                         sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class JudgeCache:
    # Kept over diskcache 5.6.3 (unmaintained since 2023): it evicts at 1 GB by default (paid replies lost), pickles
    # non-string values (CVE-2025-69872, unfixed) and has no batched read. This is ~70 lines on sqlite3, the engine
    # diskcache wraps, with the same WAL/busy-timeout process safety, and it still reads earlier runs' files.
    """Raw judge replies by :func:`cache_key`, in the SQLite file ``path`` (``":memory:"`` for a private one)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._pid = -1
        self._connection: sqlite3.Connection | None = None
        with self._lock:
            self._connect()

    def __repr__(self) -> str:
        return f"JudgeCache({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        """The connection of this process (re-opened after a fork); call with the lock held."""
        if self._connection is None or self._pid != os.getpid():
            connection = sqlite3.connect(self.path, timeout=self.busy_timeout_s, check_same_thread=False,
                                         isolation_level=None)
            if self.path != ":memory:":
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute(_SCHEMA)
            self._connection, self._pid = connection, os.getpid()
        return self._connection

    def get(self, key: str) -> str | None:
        """The cached raw reply for ``key``, or None."""
        return self.get_many([key]).get(key)

    def get_many(self, keys: Iterable[str]) -> dict[str, str]:
        """The cached raw replies of those ``keys`` that are present."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        with self._lock:
            connection = self._connect()
            for start in range(0, len(wanted), _CHUNK):
                chunk = wanted[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = connection.execute(f"SELECT key, raw FROM judge_replies WHERE key IN ({marks})", chunk)
                found.update(rows.fetchall())
        return found

    def put(self, key: str, raw: str, *, task: str = "", model: str = "") -> None:
        """Store (or replace) one raw reply, committed immediately."""
        if not isinstance(raw, str):
            raise TypeError(f"raw reply must be a string, got {type(raw).__name__}")
        with self._lock:
            self._connect().execute(
                "INSERT OR REPLACE INTO judge_replies (key, task, model, raw, created_at) VALUES (?, ?, ?, ?, ?)",
                (key, task, model, raw, time.time()))

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._connect().execute("SELECT COUNT(*) FROM judge_replies").fetchone()
        return int(count)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def close(self) -> None:
        """Close the connection (it is re-opened if the cache is used again)."""
        with self._lock:
            if self._connection is not None and self._pid == os.getpid():
                self._connection.close()
            self._connection = None

    def __enter__(self) -> JudgeCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
