"""Triplet extraction from chunks through any :class:`~prorag.llm.generation.Generator` (TeaRAG §4.1).

:func:`extract_triplets` is a plain function of (generator, chunks, settings): the ``kg_extraction`` pipeline
calls it on the indexed corpus, and TeaRAG's SFT synthesis (§4.3.1 step 1) can call it on golden evidence
paragraphs. Chunks are sent in batches; every finished batch is appended to the crash-safe cache
(:mod:`prorag.kg.cache`) before the next starts, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm.auto import tqdm

from prorag.data.records import Passage
from prorag.kg.cache import CachedReply, ExtractionCache, cache_key
from prorag.kg.parsing import is_grounded, parse_reply
from prorag.kg.prompt import extraction_messages, prompt_fingerprint
from prorag.llm.generation import Generator, SamplingParams, generate_chat

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractionSettings:
    """How to extract.

    ``model`` and ``endpoint`` (the server's ``base_url``, or ``"local"`` for an in-process model) are part of the
    cache key: another model, or the same model name behind another server, re-extracts.
    ``filter_ungrounded`` drops triplets whose head or tail does not occur in their chunk (they are counted
    either way); on by default because small models invent entities. The endpoint is not trusted: a reply longer
    than ``max_reply_chars`` is cut there, and at most ``max_triplets_per_reply`` triplets are taken from one reply
    (both counted in the stats).
    """

    model: str
    endpoint: str = "local"
    max_reply_chars: int = 16_384
    max_triplets_per_reply: int = 64
    few_shot: bool = True
    max_new_tokens: int = 128
    temperature: float = 0.0
    batch_size: int = 16
    filter_ungrounded: bool = True
    cache_path: str | None = None
    stop: tuple[str, ...] = ("\n\n", "\nTitle:")
    show_progress: bool = True

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("ExtractionSettings.model must name the model (it is part of the cache key)")
        if min(self.batch_size, self.max_new_tokens, self.max_reply_chars, self.max_triplets_per_reply) < 1:
            raise ValueError("batch_size, max_new_tokens, max_reply_chars and max_triplets_per_reply must be >= 1")

    @property
    def prompt_id(self) -> str:
        """Fingerprint of the prompt and sampling settings (the cache key's prompt part)."""
        return prompt_fingerprint(few_shot=self.few_shot, extra={
            "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "stop": list(self.stop)})


@dataclass(frozen=True)
class ExtractedTriplet:
    """A triplet with its source chunk and the grounding check of its head and tail."""

    head: str
    relation: str
    tail: str
    chunk_id: str
    head_grounded: bool
    tail_grounded: bool

    @property
    def grounded(self) -> bool:
        return self.head_grounded and self.tail_grounded

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "grounded": self.grounded}


@dataclass
class ExtractionStats:
    """Counts of one extraction run (the ``kg_extraction`` report)."""

    chunks: int = 0
    chunks_from_cache: int = 0
    chunks_generated: int = 0
    unparsable_replies: int = 0
    malformed_lines: int = 0
    triplets_parsed: int = 0
    triplets_ungrounded: int = 0
    triplets_kept: int = 0
    truncated_replies: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_seconds: float = 0.0
    corrupt_cache_lines: int = 0
    oversized_replies: int = 0
    triplets_over_cap: int = 0

    @property
    def tokens_per_second(self) -> float | None:
        """Generated tokens per second of generation (this run's fresh chunks only)."""
        return self.completion_tokens / self.generation_seconds if self.generation_seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        parsed = max(self.triplets_parsed, 1)
        return {
            **asdict(self),
            "triplets_per_chunk": self.triplets_kept / self.chunks if self.chunks else 0.0,
            "parse_failure_rate": self.unparsable_replies / self.chunks if self.chunks else 0.0,
            "ungrounded_rate": self.triplets_ungrounded / parsed if self.triplets_parsed else 0.0,
            "tokens_per_second": self.tokens_per_second,
        }


@dataclass
class ExtractionResult:
    """Triplets (grounded ones only when filtering) and the run's counts."""

    triplets: list[ExtractedTriplet] = field(default_factory=list)
    stats: ExtractionStats = field(default_factory=ExtractionStats)


def extract_triplets(generator: Generator, chunks: Sequence[Passage], settings: ExtractionSettings,
                     cache: ExtractionCache | None = None) -> ExtractionResult:
    """Extract triplets from every chunk; chunks already in the cache are not generated again.

    ``cache`` defaults to one at ``settings.cache_path`` (in memory when that is ``None``). Returns the
    triplets in chunk order, each with its chunk id; ungrounded ones are dropped when
    ``settings.filter_ungrounded``.
    """
    cache = cache if cache is not None else ExtractionCache(settings.cache_path)
    prompt_id = settings.prompt_id
    unique = list({chunk.id: chunk for chunk in chunks}.values())
    keys = {chunk.id: cache_key(settings.model, prompt_id, chunk, endpoint=settings.endpoint) for chunk in unique}
    pending = [chunk for chunk in unique if keys[chunk.id] not in cache]
    stats = ExtractionStats(chunks=len(unique), chunks_from_cache=len(unique) - len(pending),
                            corrupt_cache_lines=cache.corrupt_lines)
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                            stop=settings.stop)
    with tqdm(total=len(pending), desc="Extracting triplets", unit="chunk",
              disable=not settings.show_progress) as progress:
        for start in range(0, len(pending), settings.batch_size):
            batch = pending[start : start + settings.batch_size]
            began = time.perf_counter()
            completions = generate_chat(generator, [extraction_messages(chunk, few_shot=settings.few_shot)
                                                    for chunk in batch], params)
            stats.generation_seconds += time.perf_counter() - began
            replies = []
            for chunk, samples in zip(batch, completions, strict=True):
                completion = samples[0]
                text = completion.text
                if completion.stop and text.endswith(completion.stop):
                    text = text[: -len(completion.stop)]
                if len(text) > settings.max_reply_chars:  # an endpoint that floods: keep what the cap allows
                    logger.warning("extraction reply for chunk %s from %s has %d characters; cut at "
                                   "max_reply_chars=%d", chunk.id, settings.endpoint, len(text),
                                   settings.max_reply_chars)
                    text = text[: settings.max_reply_chars]
                replies.append(CachedReply(keys[chunk.id], chunk.id, settings.model, prompt_id, text,
                                           completion.prompt_tokens, completion.completion_tokens,
                                           completion.finish_reason))
                stats.prompt_tokens += completion.prompt_tokens
                stats.completion_tokens += completion.completion_tokens
            cache.append(replies)
            stats.chunks_generated += len(batch)
            progress.update(len(batch))
    result = ExtractionResult(stats=stats)
    for chunk in unique:
        reply = cache.get(keys[chunk.id])
        assert reply is not None
        _collect(chunk, reply, settings, result)
    logger.info("extracted %d triplets from %d chunks (%d from the cache)", stats.triplets_kept, stats.chunks,
                stats.chunks_from_cache)
    return result


def _collect(chunk: Passage, reply: CachedReply, settings: ExtractionSettings, result: ExtractionResult) -> None:
    stats = result.stats
    text = reply.reply
    if len(text) > settings.max_reply_chars:  # a cache line written before the cap
        text = text[: settings.max_reply_chars]
    stats.oversized_replies += int(len(reply.reply) >= settings.max_reply_chars)
    parsed = parse_reply(text)
    stats.unparsable_replies += int(parsed.unparsable)
    stats.malformed_lines += parsed.malformed
    stats.truncated_replies += int(reply.finish_reason == "length")
    contents = chunk.contents
    stats.triplets_over_cap += max(0, len(parsed.triplets) - settings.max_triplets_per_reply)
    for raw in parsed.triplets[: settings.max_triplets_per_reply]:
        triplet = ExtractedTriplet(raw.head, raw.relation, raw.tail, chunk.id,
                                   is_grounded(raw.head, contents), is_grounded(raw.tail, contents))
        stats.triplets_parsed += 1
        if not triplet.grounded:
            stats.triplets_ungrounded += 1
            if settings.filter_ungrounded:
                continue
        stats.triplets_kept += 1
        result.triplets.append(triplet)
