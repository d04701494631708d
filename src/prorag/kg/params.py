"""The ``kg_extraction`` parameter block (conf/base/parameters_kg_extraction.yml): which chunks, the extractor, the
extraction settings and the KAG retrieval settings.

It lives in the library because three pipelines read it (kg_extraction, tearag for its extractor and compare for
the KAG settings); :mod:`prorag.pipelines.kg_extraction.params` re-exports it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prorag.config import Dtype, PositiveInt, Seed, StrictModel
from prorag.kg.extraction import ExtractionSettings
from prorag.kg.kag import KagSettings
from prorag.llm.registry import BUNDLED_SMOLLM2


class ChunkSelection(StrictModel):
    """Which chunks of the index to extract from: the passages of selected questions, plus a background sample.

    ``max_questions_per_source: null`` and ``max_background_chunks: null`` select the whole index (paper scale).
    """

    sources: list[str] | None = None
    """Question file stems among the indexed questions (null: all)."""
    max_questions_per_source: PositiveInt | None = None
    question_passages: Literal["supporting", "context"] = "supporting"
    """Per question: its supporting passages only, or every context passage (HotpotQA's 10, distractors too)."""
    max_background_chunks: int | None = Field(default=None, ge=0)
    """Other index chunks, a seeded sample (null: every chunk of the index)."""
    seed: Seed = 0


class ExtractorSpec(StrictModel):
    """The extraction model and where it runs (in-process transformers, or an OpenAI-compatible endpoint)."""

    model: str = Field(default=BUNDLED_SMOLLM2, min_length=1)
    backend: Literal["transformers", "openai"] = "transformers"
    base_url: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    """The NAME of the environment variable holding the key (never the key)."""
    mode: Literal["completions", "chat"] = "chat"
    """OpenAI backend only: chat endpoint (the server applies the model's chat template) or completions."""
    dtype: Dtype = "float32"
    batch_size: PositiveInt = 8
    """transformers: prompts per forward batch."""
    max_concurrency: PositiveInt = 16
    """openai: requests in flight at once."""
    timeout: float = Field(default=120.0, gt=0)


class ExtractionParams(StrictModel):
    """How each chunk is extracted (:class:`prorag.kg.extraction.ExtractionSettings`)."""

    few_shot: bool = True
    max_new_tokens: PositiveInt = 128
    temperature: float = Field(default=0.0, ge=0.0)
    chunks_per_batch: PositiveInt = 16
    """Chunks per generate call; each finished batch is appended to the cache before the next starts."""
    filter_ungrounded: bool = True
    """Drop triplets whose head or tail is not in their chunk (counted either way); on for small models."""
    cache_path: str | None = "data/02_intermediate/kg_extraction_cache.jsonl"
    """Append-only reply cache keyed by (endpoint, model, prompt, chunk hash): re-runs extract only new chunks."""
    max_reply_chars: PositiveInt = 16_384
    """A longer reply is cut here (an endpoint is not trusted; 128 new tokens are ~600 characters)."""
    max_triplets_per_reply: PositiveInt = 64
    """At most this many triplets are taken from one chunk's reply (the paper's chunks yield ~5-15)."""

    def settings(self, extractor: ExtractorSpec) -> ExtractionSettings:
        """The library settings for extraction with ``extractor`` (its model, and its endpoint in the cache key)."""
        endpoint = (extractor.base_url or "") if extractor.backend == "openai" else "local"
        return ExtractionSettings(model=extractor.model, endpoint=endpoint, few_shot=self.few_shot,
                                  max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                  batch_size=self.chunks_per_batch, filter_ungrounded=self.filter_ungrounded,
                                  cache_path=self.cache_path, max_reply_chars=self.max_reply_chars,
                                  max_triplets_per_reply=self.max_triplets_per_reply)


class KagParams(StrictModel):
    """KAG + PPR hyperparameters for the ``kag`` / ``kag_concat`` retrievers (:class:`KagSettings`)."""

    chunk_top_k: PositiveInt = KagSettings.chunk_top_k
    entity_top_k: PositiveInt = KagSettings.entity_top_k
    triplet_top_k: PositiveInt = KagSettings.triplet_top_k
    damping: float = Field(default=KagSettings.damping, ge=0.0, lt=1.0)
    max_iterations: PositiveInt = KagSettings.max_iterations
    tolerance: float = Field(default=KagSettings.tolerance, gt=0.0)
    triplet_threshold: float = KagSettings.triplet_threshold
    triplet_edge: Literal["normalized", "score", "indicator"] = KagSettings.triplet_edge
    chunk_normalization: Literal["softmax", "minmax", "sum"] = KagSettings.chunk_normalization
    subquery_weight: float = Field(default=KagSettings.subquery_weight, gt=0.0)
    key_entity_weight: float = Field(default=KagSettings.key_entity_weight, ge=0.0)
    fallback_key_entities: PositiveInt = KagSettings.fallback_key_entities

    def settings(self) -> KagSettings:
        return KagSettings(**self.model_dump())


class KgExtractionParams(StrictModel):
    """``kg_extraction`` parameters: which chunks, which model, how, and the KAG retrieval settings."""

    chunks: ChunkSelection = ChunkSelection()
    extractor: ExtractorSpec = ExtractorSpec()
    extraction: ExtractionParams = ExtractionParams()
    kag: KagParams = KagParams()
