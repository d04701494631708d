"""Parameter schema of the corpus-indexing pipeline (``corpus_indexing``; see
conf/base/parameters_corpus_indexing.yml)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field, model_validator

from prorag.config import StrictModel
from prorag.data.jsonl import MAX_RECORD_BYTES
from prorag.retrieval.embedder import BUNDLED_MINILM
from prorag.specs import PositiveInt, RetrieverKind, Seed

INDEX_OPTIONS: Final = frozenset({
    "window_words", "shard_size", "batch_size", "query_prefix", "passage_prefix", "nlist", "nprobe", "pq_m",
    "pq_nbits", "train_size", "use_gpu", "build_bm25"})
"""The fields passed by name to :func:`prorag.retrieval.build_retrieval_index` (same names there)."""


SCALE_OPTIONS: Final = frozenset({
    "window_words", "shard_size", "batch_size", "query_prefix", "passage_prefix", "fp16", "devices", "nlist",
    "nprobe", "pq_m", "pq_nbits", "train_size", "hnsw_m", "ef_construction", "ef_search", "use_gpu", "gpus",
    "build_bm25", "check_resources"})
"""The fields passed by name to :func:`prorag.retrieval.index.build_retrieval_index_at_scale`."""


class CorpusFileParams(StrictModel):
    """One passage file read as it is distributed (:mod:`prorag.data.dumps`)."""

    path: str
    format: Literal["auto", "prorag", "flashrag", "dpr"] = "auto"


class PrebuiltIndexParams(StrictModel):
    """A prebuilt FAISS index and its corpus file, used as they are (Search-R1's ``e5_Flat.index`` +
    ``wiki-18.jsonl``)."""

    faiss_index: str
    corpus: str
    format: Literal["auto", "prorag", "flashrag", "dpr"] = "auto"


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
    index_type: Literal["flat", "ivf", "ivfpq", "hnsw"] = "flat"
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
    """The first N questions of each question file are selected (null: all); with ``per_part``, the first N of
    each part of the file (its tuning and its reporting part: :func:`prorag.data.selection.question_parts`)."""
    per_part: bool = False
    max_background_passages: int | None = Field(default=None, ge=0)
    """Index every passage the selected questions point at, plus at most this many others (seeded sample)."""
    seed: Seed = 0
    evaluation: RecallEvaluationParams = RecallEvaluationParams()
    corpus_files: list[CorpusFileParams] | None = None
    """Index these passage files (streamed; e.g. wiki-18.jsonl) instead of the prepared corpus (docs/corpus.md)."""
    prebuilt: PrebuiltIndexParams | None = None
    """Use a prebuilt FAISS index + corpus as they are instead of building one."""
    work_dir: str | None = None
    """Resumable build folder (store, embedding shards); set with corpus_files, optional otherwise (null: the
    in-memory build of the bundled corpus)."""
    fp16: bool = False
    devices: list[str] | None = None
    """Embedding devices, one process each (e.g. [cuda:0, cuda:1]); null: the embedder's default device."""
    gpus: list[int] | None = None
    """GPUs FAISS may use with use_gpu (null: every visible one)."""
    hnsw_m: PositiveInt = 32
    ef_construction: PositiveInt = 40
    ef_search: PositiveInt = 64
    check_resources: bool = True
    max_record_bytes: PositiveInt = MAX_RECORD_BYTES
    """Longest record (line) read from corpus_files or prebuilt.corpus: a longer one fails with its file and line,
    without being read whole (default 64 MiB, as every JSONL file the pipelines read)."""

    @model_validator(mode="after")
    def _scale_settings(self) -> CorpusIndexingParams:
        if self.corpus_files is not None and self.work_dir is None:
            raise ValueError("corpus_indexing.corpus_files needs corpus_indexing.work_dir (the resumable build "
                             "folder: passage store and embedding shards)")
        if self.corpus_files is not None and self.prebuilt is not None:
            raise ValueError("set corpus_indexing.corpus_files or corpus_indexing.prebuilt, not both")
        if self.corpus_files is not None and not self.corpus_files:
            raise ValueError("corpus_indexing.corpus_files is empty (null: the prepared corpus)")
        return self
