"""Parameter schema of the corpus-indexing pipeline (``corpus_indexing``; see
conf/base/parameters_corpus_indexing.yml)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from prorag.config import StrictModel
from prorag.retrieval.embedder import BUNDLED_MINILM
from prorag.specs import PositiveInt, RetrieverKind, Seed

INDEX_OPTIONS: Final = frozenset({
    "window_words", "shard_size", "batch_size", "query_prefix", "passage_prefix", "nlist", "nprobe", "pq_m",
    "pq_nbits", "train_size", "use_gpu", "build_bm25"})
"""The fields passed by name to :func:`prorag.retrieval.build_retrieval_index` (same names there)."""


class RecallEvaluationParams(StrictModel):
    """Recall@k of supporting passages, per dataset and retriever, on the selected questions."""

    retrievers: list[RetrieverKind] = Field(default=["dense", "bm25", "hybrid"], min_length=1)
    ks: list[PositiveInt] = Field(default=[1, 3, 5, 10], min_length=1)


class CorpusIndexingParams(StrictModel):
    """How the corpus is windowed, embedded and indexed; see docs/data.md."""

    embedder: str = BUNDLED_MINILM
    query_prefix: str | None = None
    passage_prefix: str | None = None
    window_words: int | None = Field(default=None, ge=20)
    index_type: Literal["flat", "ivf", "ivfpq"] = "flat"
    nlist: PositiveInt | None = None
    nprobe: PositiveInt = 16
    pq_m: PositiveInt | None = None
    pq_nbits: int = Field(default=8, ge=1, le=16)
    train_size: PositiveInt | None = None
    shard_size: PositiveInt = 4096
    batch_size: PositiveInt | None = None
    use_gpu: bool = False
    build_bm25: bool = True
    max_questions_per_source: PositiveInt | None = None
    """The first N questions of each question file are selected (null: all)."""
    max_background_passages: int | None = Field(default=None, ge=0)
    """Index every passage the selected questions point at, plus at most this many others (seeded sample)."""
    seed: Seed = 0
    evaluation: RecallEvaluationParams = RecallEvaluationParams()
