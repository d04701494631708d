"""TeaRAG's knowledge layer (paper §4.1): LLM triplet extraction from chunks, and the knowledge graph.

* :mod:`prorag.kg.prompt` — the few-shot extraction prompt;
* :mod:`prorag.kg.parsing` — the strict reply parser, entity normalization, the grounding check;
* :mod:`prorag.kg.cache` — the crash-safe extraction cache keyed by (model, prompt, chunk hash);
* :mod:`prorag.kg.extraction` — :func:`extract_triplets` (generator, chunks, settings) → triplets + counts;
* :mod:`prorag.kg.graph` — :class:`KnowledgeGraph` (entities, triplets, FAISS indexes), build / save / load;
* :mod:`prorag.kg.graph_retrieval` — two-stage graph retrieval (entities, then their one-hop triplets);
* :mod:`prorag.kg.query` — the KAG query string (a subquery with its key entities);
* :mod:`prorag.kg.kag` — the Knowledge Association Graph + PPR retrievers (``kag``, ``kag_concat``) and
  :func:`~prorag.kg.kag.attach_knowledge_graph`, which registers them on a retrieval index.

The knowledge layer builds on :mod:`prorag.retrieval` (embedders, FAISS, the :class:`Retriever` interface);
retrieval imports nothing from it.
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
