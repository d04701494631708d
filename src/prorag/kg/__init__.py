"""TeaRAG's knowledge layer (paper §4.1): LLM triplet extraction from chunks, and the knowledge graph.

* :mod:`prorag.kg.prompt` — the few-shot extraction prompt;
* :mod:`prorag.kg.parsing` — the strict reply parser, entity normalization, the grounding check;
* :mod:`prorag.kg.cache` — the crash-safe extraction cache keyed by (model, prompt, chunk hash);
* :mod:`prorag.kg.extraction` — :func:`extract_triplets` (generator, chunks, settings) → triplets + counts;
* :mod:`prorag.kg.graph` — :class:`KnowledgeGraph` (entities, triplets, FAISS indexes), build / save / load.

Graph retrieval and the Knowledge Association Graph live in :mod:`prorag.retrieval.graph` and
:mod:`prorag.retrieval.kag`.
"""

from prorag.kg.cache import ExtractionCache
from prorag.kg.extraction import (
    ExtractedTriplet,
    ExtractionResult,
    ExtractionSettings,
    ExtractionStats,
    extract_triplets,
)
from prorag.kg.parsing import ParsedReply, RawTriplet, entity_key, is_grounded, parse_reply

__all__ = [
    "ExtractedTriplet",
    "ExtractionCache",
    "ExtractionResult",
    "ExtractionSettings",
    "ExtractionStats",
    "ParsedReply",
    "RawTriplet",
    "entity_key",
    "extract_triplets",
    "is_grounded",
    "parse_reply",
]
