"""Two-stage graph retrieval over a :class:`~prorag.kg.graph.KnowledgeGraph` (TeaRAG §4.2.3).

Stage 1 (entities): for every key entity ``e`` of the step, the entity query ``"Key entity: e. Query: q"``
(:func:`entity_query`, the paper's exact format) retrieves the top-``entity_top_k`` entities of ``E``;
their union is ``E_q``.
Stage 2 (triplets): the one-hop triplets of ``E_q``, ``T_q = {(h, r, t) ∈ T : h ∈ E_q or t ∈ E_q}``, are ranked
by their similarity to the subquery ``q`` and the top-``triplet_top_k`` kept: ``T_q^K = top-K_{τ ∈ T_q} s(q, τ)``.
Similarities are inner products of unit embeddings (cosine) from the retrieval index's embedder. The paper
reranks both stages with BGE-reranker-v2; there is no reranker here, so the embedder's scores rank directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prorag.kg.graph import KnowledgeGraph
from prorag.kg.parsing import entity_key
from prorag.kg.query import parse_kag_query
from prorag.retrieval.base import Hit, RetrievalError, check_search_args
from prorag.retrieval.dense import QueryEncoder


def entity_query(entity: str, subquery: str) -> str:
    """The stage-1 query of one key entity, exactly as the paper writes it: ``"Key entity: e. Query: q"``."""
    return f"Key entity: {entity}. Query: {subquery}"


@dataclass(frozen=True)
class ScoredTriplet:
    """A retrieved triplet id and its similarity to the subquery."""

    triplet_id: int
    score: float


def triplet_hit(graph: KnowledgeGraph, triplet_id: int, score: float) -> Hit:
    """A triplet as a :class:`Hit`: id ``triplet:<n>``, no title, text ``"head relation tail"``."""
    return Hit(id=f"triplet:{triplet_id}", title="", text=graph.triplet_text(triplet_id), score=float(score))


class GraphRetriever:
    """Stage 1 + stage 2 over one knowledge graph; also a :class:`~prorag.retrieval.base.Retriever` of triplets
    (TeaRAG-G), whose key entities are found from the query (:meth:`find_key_entities`)."""

    def __init__(self, graph: KnowledgeGraph, encoder: QueryEncoder, *, entity_top_k: int = 5,
                 triplet_top_k: int = 5, fallback_key_entities: int = 2, fallback_candidates: int = 10) -> None:
        if encoder.dim != graph.meta.dim:
            raise RetrievalError(f"embedder dimension {encoder.dim} != knowledge-graph dimension {graph.meta.dim}")
        if min(entity_top_k, triplet_top_k, fallback_key_entities, fallback_candidates) < 1:
            raise ValueError("entity_top_k, triplet_top_k, fallback_key_entities, fallback_candidates must be >= 1")
        self.graph = graph
        self.encoder = encoder
        self.entity_top_k = entity_top_k
        self.triplet_top_k = triplet_top_k
        self.fallback_key_entities = fallback_key_entities
        self.fallback_candidates = fallback_candidates

    def find_key_entities(self, queries: Sequence[str], vectors: np.ndarray | None = None) -> list[list[str]]:
        """Key entities for queries that name none: among the ``fallback_candidates`` entities nearest to the
        query, those whose name occurs in the query (whole words); if none does, the nearest
        ``fallback_key_entities``. (A stand-in for the agent's entity recognition, §4.2.1.)"""
        if not queries:
            return []
        vectors = self.encoder.encode_queries(list(queries)) if vectors is None else vectors
        _, ids = self.graph.search_entities(vectors, self.fallback_candidates)
        found = []
        for query, row in zip(queries, ids, strict=True):
            padded = f" {' '.join(entity_key(query).split())} "
            candidates = [int(entity) for entity in row if entity >= 0]
            named = [entity for entity in candidates
                     if f" {self.graph.entities[entity].key} " in padded]
            chosen = named[: self.fallback_key_entities] or candidates[: self.fallback_key_entities]
            found.append([self.graph.entities[entity].name for entity in chosen])
        return found

    def retrieve_entities(self, subqueries: Sequence[str], key_entities: Sequence[Sequence[str]]) -> list[set[int]]:
        """Stage 1: per subquery, the union of the top-``entity_top_k`` entities of its entity queries."""
        texts, owners = [], []
        for position, (subquery, entities) in enumerate(zip(subqueries, key_entities, strict=True)):
            for entity in dict.fromkeys(entities):
                texts.append(entity_query(entity, subquery))
                owners.append(position)
        found: list[set[int]] = [set() for _ in subqueries]
        if not texts:
            return found
        _, ids = self.graph.search_entities(self.encoder.encode_queries(texts), self.entity_top_k)
        for owner, row in zip(owners, ids, strict=True):
            found[owner].update(int(entity) for entity in row if entity >= 0)
        return found

    def rank_triplets(self, subquery_vectors: np.ndarray, entity_sets: Sequence[set[int]],
                      k: int | None = None) -> list[list[ScoredTriplet]]:
        """Stage 2: the one-hop triplets of each entity set, ranked by cosine to the subquery, top ``k``."""
        k = self.triplet_top_k if k is None else k
        ranked = []
        for vector, entities in zip(subquery_vectors, entity_sets, strict=True):
            candidates = self.graph.one_hop(entities)
            if not candidates:
                ranked.append([])
                continue
            scores = self.graph.triplet_vectors[candidates] @ np.asarray(vector, dtype=np.float32)
            order = np.argsort(-scores, kind="stable")[:k]
            ranked.append([ScoredTriplet(candidates[i], float(scores[i])) for i in order])
        return ranked

    def retrieve(self, subqueries: Sequence[str], key_entities: Sequence[Sequence[str]],
                 subquery_vectors: np.ndarray | None = None, k: int | None = None) -> list[list[ScoredTriplet]]:
        """Both stages for a batch of (subquery, key entities)."""
        if subquery_vectors is None:
            subquery_vectors = self.encoder.encode_queries(list(subqueries))
        return self.rank_triplets(subquery_vectors, self.retrieve_entities(subqueries, key_entities), k)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Graph-only retrieval (TeaRAG-G): top-``k`` triplets per query, key entities parsed from the query
        (:func:`prorag.kg.query.parse_kag_query`) or found from it."""
        queries = check_search_args(queries, k)
        if not queries:
            return []
        subqueries, entities, vectors = resolve_queries(self, queries)
        return [[triplet_hit(self.graph, item.triplet_id, item.score) for item in row]
                for row in self.retrieve(subqueries, entities, vectors, k)]


def resolve_queries(graph: GraphRetriever, queries: Sequence[str]) -> tuple[list[str], list[list[str]], np.ndarray]:
    """Subqueries, key entities (parsed, or found from the entity index) and subquery embeddings."""
    parsed = [parse_kag_query(query) for query in queries]
    subqueries = [subquery for subquery, _ in parsed]
    vectors = graph.encoder.encode_queries(subqueries)
    missing = [position for position, (_, entities) in enumerate(parsed) if not entities]
    found = graph.find_key_entities([subqueries[p] for p in missing], vectors[missing]) if missing else []
    entities = [list(entities) for _, entities in parsed]
    for position, names in zip(missing, found, strict=True):
        entities[position] = names
    return subqueries, entities, vectors
