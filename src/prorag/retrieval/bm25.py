"""Lexical retrieval with BM25 (bm25s): English stop words, lower-cased word tokens, no stemming."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s

from prorag.data.records import Passage
from prorag.retrieval.base import Hit, RetrievalError, check_search_args

logger = logging.getLogger(__name__)

_SETTINGS_FILE = "prorag_bm25.json"


class BM25Retriever:
    """BM25 over ``title\\ntext`` of every passage; hits with score 0 (no shared term) are left out."""

    def __init__(
        self, model: bm25s.BM25, store: Sequence[Passage], *, stopwords: str | None = "en", threads: int = 0
    ) -> None:
        self.model = model
        self.store = store
        self.stopwords = stopwords
        self.threads = threads

    @classmethod
    def build(
        cls,
        store: Sequence[Passage],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stopwords: str | None = "en",
        threads: int = 0,
    ) -> BM25Retriever:
        """Index every passage of ``store`` (row ``i`` is store position ``i``)."""
        if len(store) == 0:
            raise ValueError("cannot build a BM25 index over an empty passage store")
        tokens = bm25s.tokenize([passage.contents for passage in store], stopwords=stopwords, show_progress=False)
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index(tokens, show_progress=False)
        return cls(model, store, stopwords=stopwords, threads=threads)

    def __len__(self) -> int:
        return len(self.store)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        queries = check_search_args(queries, k)
        if not queries:
            return []
        query_tokens = bm25s.tokenize(queries, stopwords=self.stopwords, return_ids=False, show_progress=False)
        rows, scores = self.model.retrieve(
            query_tokens, k=min(k, len(self.store)), show_progress=False, n_threads=self.threads
        )
        return [
            [
                Hit.from_passage(self.store[int(row)], float(score))
                for row, score in zip(row_ids, score_row, strict=True)
                if score > 0
            ]
            for row_ids, score_row in zip(rows, scores, strict=True)
        ]

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the bm25s index files and tokenizer settings to ``directory`` (not the store)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save(str(path), show_progress=False)
        (path / _SETTINGS_FILE).write_text(json.dumps(self.settings(), indent=2), encoding="utf-8")

    def settings(self) -> dict[str, Any]:
        return {
            "stopwords": self.stopwords,
            "k1": self.model.k1,
            "b": self.model.b,
            "method": self.model.method,
            "documents": len(self.store),
        }

    @classmethod
    def load(cls, directory: str | os.PathLike[str], store: Sequence[Passage], *, threads: int = 0,
             mmap: bool = False) -> BM25Retriever:
        """Load an index written by :meth:`save` over the same ``store``; ``mmap`` memory-maps bm25s's score
        matrix (the RAM of a 21M-passage index) instead of reading it."""
        path = Path(directory)
        settings_path = path / _SETTINGS_FILE
        if not settings_path.is_file():
            raise RetrievalError(f"{settings_path}: BM25 settings file not found")
        try:
            settings = json.loads(settings_path.read_text(encoding="utf-8"))
            model = bm25s.BM25.load(str(path), show_progress=False, mmap=mmap)
        except (OSError, ValueError) as error:
            raise RetrievalError(f"{path}: cannot load the BM25 index: {error}") from error
        if settings.get("documents") != len(store):
            raise RetrievalError(
                f"{settings_path}: BM25 index covers {settings.get('documents')} documents "
                f"but the passage store has {len(store)}"
            )
        return cls(model, store, stopwords=settings.get("stopwords"), threads=threads)
