"""TeaRAG's hybrid retrieval: Knowledge Association Graph + Personalized PageRank (§4.2.3–4.2.5), and TeaRAG-Con.

For a subquery ``q`` with key entities ``E_t``: semantic retrieval gives chunks ``C_q`` (top-``chunk_top_k`` of the
dense index), graph retrieval (:mod:`prorag.kg.graph_retrieval`) gives triplets ``T_q`` (top-``triplet_top_k``).

**KAG** (§4.2.4), an undirected weighted graph with nodes: the subquery ``q``; a chunk node per ``c ∈ C_q``; a
triplet node per ``τ ∈ T_q``; an entity node per key entity, per title of a chunk of ``C_q`` and per head/tail of
a triplet of ``T_q`` (entities are identified by :func:`~prorag.kg.parsing.entity_key`, so a title and a
triplet's head naming the same thing are one node). Co-occurrence edges, weight 1:

1. entity–entity: ``(h, t)`` for every ``τ = (h, r, t) ∈ T_q``;
2. triplet–entity: ``(τ, h)`` and ``(τ, t)``;
3. chunk–triplet: ``(c, τ)`` when ``τ``'s source chunk ``c`` is in ``C_q``;
4. chunk–entity: ``(c, h)`` and ``(c, t)`` for such a co-occurring pair, and ``(c, title(c))`` for every chunk.

Relevance edges (the printed formulas were lost; rebuilt from the prose and arXiv 2511.05385):

* eq. (1) chunk–subquery: ``w(q, c_i) = softmax_i(s(q, c_i)) = exp s(q, c_i) / Σ_{c_j ∈ C_q} exp s(q, c_j)``
  ("the relevance score computed by the retriever, normalized"; the normalizer's name was lost — softmax is
  assumed, ``min-max`` and ``sum`` are options);
* eq. (2) triplet–subquery: the relevance score, thresholded ("triplet similarities are unreliable for lack of
  context"), and normalized like the chunk edges: with ``T_q^θ = {τ ∈ T_q : s(q, τ) ≥ θ}``,
  ``w(q, τ_j) = norm_{τ_k ∈ T_q^θ}(s(q, τ_j))`` for ``τ_j ∈ T_q^θ`` (the same normalizer as eq. (1): for softmax
  ``exp s(q, τ_j) / Σ_{τ_k ∈ T_q^θ} exp s(q, τ_k)``) and no edge below θ (``triplet_edge="normalized"``, the
  default). The chunk edges and the triplet edges then each sum to 1, so a triplet outranks a chunk only by its
  score and its co-occurrences. Options: ``triplet_edge="score"`` keeps the raw ``s·1[s ≥ θ]``; ``"indicator"``
  weighs every triplet over θ 1 (prorag's earlier default: with chunk edges summing to 1, any triplet over θ
  outweighs every chunk by construction).

**PPR** (§4.2.5, eq. 3): ``r^{(t+1)} = α · P · r^{(t)} + (1 − α) · v`` for ``t < T``, with ``P = A D^{-1}`` the
column-normalized weighted adjacency and ``v`` the personalization — 1 on ``q`` and 0.5 on each key entity
(normalized to sum 1 by networkx; the ranking is unchanged by the scale). Computed by
``networkx.pagerank(alpha=α, personalization=v, max_iter=T, tol=…)``; dangling nodes jump by ``v``. The
highest-scoring chunk and triplet nodes form the context.

Hyperparameters: ``1`` / ``0.5`` personalization, weight-1 co-occurrence edges, 5 context items (KAG) and 5 + 5
(TeaRAG-Con, §5.4.1) are the paper's. The values of α, θ and T were among the symbols lost from the text here,
and neither the arXiv HTML nor the authors' repository was readable from this machine: α = 0.5 (HippoRAG's
damping; §5.5.2 reports TeaRAG robust to α and best at intermediate values, the numbers being lost too),
θ = 0.5 and T = 100 (to convergence at tolerance 1e-6) are this implementation's choices — set them when the
paper's are known. The paper reranks
with BGE-reranker-v2 before the KAG; there is no reranker here.

Key entities travel inside the query string — :func:`~prorag.kg.query.format_kag_query` /
:func:`~prorag.kg.query.parse_kag_query` are the one encoding (used by the TeaRAG agent protocol); a query without
them gets them from the entity index (:meth:`~prorag.kg.graph_retrieval.GraphRetriever.find_key_entities`).

A :class:`~prorag.retrieval.index.RetrievalIndex` offers ``kag`` / ``kag_concat`` once
:func:`attach_knowledge_graph` has registered them on it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal

import networkx as nx
import numpy as np

from prorag.kg.graph import KnowledgeGraph, load_knowledge_graph
from prorag.kg.graph_retrieval import GraphRetriever, ScoredTriplet, resolve_queries, triplet_hit
from prorag.kg.parsing import entity_key
from prorag.retrieval.base import Hit, RetrievalError, check_search_args
from prorag.retrieval.dense import DenseRetriever

if TYPE_CHECKING:
    from prorag.retrieval.index import RetrievalIndex

SUBQUERY_NODE: Final = ("subquery",)
ChunkNormalization = Literal["softmax", "minmax", "sum"]
TripletEdge = Literal["normalized", "score", "indicator"]


@dataclass(frozen=True)
class KagSettings:
    """Every KAG/PPR hyperparameter (see the module docstring for which values are the paper's)."""

    chunk_top_k: int = 5
    """|C_q|: chunks from semantic retrieval."""
    entity_top_k: int = 5
    """Entities per entity query (stage 1)."""
    triplet_top_k: int = 5
    """|T_q|: triplets from graph retrieval (stage 2)."""
    damping: float = 0.5
    """α of eq. (3): weight of the graph structure against the personalization."""
    max_iterations: int = 100
    """T of eq. (3) (networkx stops earlier once the change is below ``tolerance``)."""
    tolerance: float = 1e-6
    triplet_threshold: float = 0.5
    """θ of eq. (2)."""
    triplet_edge: TripletEdge = "normalized"
    """Eq. (2)'s weight over θ: ``normalized`` (the thresholded scores, normalized like the chunk edges), ``score``
    (the raw score) or ``indicator`` (1)."""
    chunk_normalization: ChunkNormalization = "softmax"
    subquery_weight: float = 1.0
    key_entity_weight: float = 0.5
    fallback_key_entities: int = 2
    """Key entities taken from the entity index for a query that carries none."""

    def __post_init__(self) -> None:
        if min(self.chunk_top_k, self.entity_top_k, self.triplet_top_k, self.max_iterations,
               self.fallback_key_entities) < 1:
            raise ValueError("KAG top-k values, max_iterations and fallback_key_entities must be >= 1")
        if not 0.0 <= self.damping < 1.0:
            raise ValueError(f"damping must be in [0, 1), got {self.damping}")
        if self.subquery_weight <= 0 or self.key_entity_weight < 0 or self.tolerance <= 0:
            raise ValueError("subquery_weight and tolerance must be > 0, key_entity_weight >= 0")


@dataclass(frozen=True)
class KagChunk:
    """A retrieved chunk as the KAG sees it."""

    id: str
    title: str
    score: float


@dataclass(frozen=True)
class KagTriplet:
    """A retrieved triplet as the KAG sees it: entity keys of its head and tail, and its source chunk."""

    id: int
    head: str
    tail: str
    chunk_id: str
    score: float


def chunk_node(chunk_id: str) -> tuple[str, str]:
    return ("chunk", chunk_id)


def triplet_node(triplet_id: int) -> tuple[str, int]:
    return ("triplet", triplet_id)


def entity_node(name: str) -> tuple[str, str]:
    """The node of an entity (by its dedup key, so surface variants share a node)."""
    return ("entity", entity_key(name))


def normalize_chunk_scores(scores: Sequence[float], method: ChunkNormalization) -> list[float]:
    """Eq. (1)'s normalization of the chunks' retrieval scores."""
    if not scores:
        return []
    values = np.asarray(scores, dtype=np.float64)
    if method == "softmax":
        shifted = np.exp(values - values.max())
        return list(shifted / shifted.sum())
    if method == "minmax":
        spread = values.max() - values.min()
        return list((values - values.min()) / spread) if spread > 0 else [1.0] * len(values)
    if method == "sum":
        clipped = np.clip(values, 0.0, None)
        return list(clipped / clipped.sum()) if clipped.sum() > 0 else [1.0 / len(values)] * len(values)
    raise ValueError(f"unknown chunk_normalization {method!r}")


def triplet_edge_weights(scores: Sequence[float], settings: KagSettings) -> list[float]:
    """Eq. (2) for the triplets of one subquery: 0 (no edge) below θ; at or above it the score normalized over the
    triplets that pass θ with eq. (1)'s normalizer (``normalized``), the raw score (``score``) or 1 (``indicator``)."""
    passing = [index for index, score in enumerate(scores) if score >= settings.triplet_threshold]
    weights = [0.0] * len(scores)
    if settings.triplet_edge == "normalized":
        normalized = normalize_chunk_scores([scores[index] for index in passing], settings.chunk_normalization)
        for index, weight in zip(passing, normalized, strict=True):
            weights[index] = float(weight)
        return weights
    if settings.triplet_edge not in ("score", "indicator"):
        raise ValueError(f"unknown triplet_edge {settings.triplet_edge!r}")
    for index in passing:
        weights[index] = 1.0 if settings.triplet_edge == "indicator" else float(scores[index])
    return weights


def build_kag(chunks: Sequence[KagChunk], triplets: Sequence[KagTriplet], key_entities: Sequence[str],
              settings: KagSettings) -> nx.Graph:
    """The Knowledge Association Graph of one subquery (§4.2.4; the edge rules are in the module docstring).

    Nodes carry ``kind`` (subquery, chunk, triplet, entity); edges carry ``weight`` and ``rule``.
    """
    graph = nx.Graph()
    graph.add_node(SUBQUERY_NODE, kind="subquery")
    for name in key_entities:
        if entity_key(name):
            graph.add_node(entity_node(name), kind="entity", key_entity=True)
    chunk_ids = {chunk.id for chunk in chunks}

    def co_occurrence(first: Any, second: Any, rule: str) -> None:
        if first != second:
            graph.add_edge(first, second, weight=1.0, rule=rule)

    for chunk, weight in zip(chunks, normalize_chunk_scores([c.score for c in chunks],
                                                            settings.chunk_normalization), strict=True):
        node = chunk_node(chunk.id)
        graph.add_node(node, kind="chunk")
        if weight > 0:
            graph.add_edge(SUBQUERY_NODE, node, weight=float(weight), rule="chunk-subquery")
        if entity_key(chunk.title):
            graph.add_node(entity_node(chunk.title), kind="entity")
            co_occurrence(node, entity_node(chunk.title), "chunk-title")
    for triplet, weight in zip(triplets, triplet_edge_weights([t.score for t in triplets], settings), strict=True):
        node, head, tail = triplet_node(triplet.id), entity_node(triplet.head), entity_node(triplet.tail)
        graph.add_node(node, kind="triplet")
        for entity in (head, tail):
            if not graph.has_node(entity):
                graph.add_node(entity, kind="entity")
        co_occurrence(head, tail, "entity-entity")
        co_occurrence(node, head, "triplet-entity")
        co_occurrence(node, tail, "triplet-entity")
        if triplet.chunk_id in chunk_ids:
            source = chunk_node(triplet.chunk_id)
            co_occurrence(source, node, "chunk-triplet")
            co_occurrence(source, head, "chunk-entity")
            co_occurrence(source, tail, "chunk-entity")
        if weight > 0:
            graph.add_edge(SUBQUERY_NODE, node, weight=weight, rule="triplet-subquery")
    return graph


def personalization_vector(graph: nx.Graph, key_entities: Sequence[str], settings: KagSettings) -> dict[Any, float]:
    """``v`` of eq. (3): ``subquery_weight`` on the subquery node, ``key_entity_weight`` on each key entity."""
    vector: dict[Any, float] = {SUBQUERY_NODE: settings.subquery_weight}
    for name in key_entities:
        node = entity_node(name)
        if graph.has_node(node) and settings.key_entity_weight > 0:
            vector[node] = settings.key_entity_weight
    return vector


def personalized_pagerank(graph: nx.Graph, personalization: dict[Any, float],
                          settings: KagSettings) -> dict[Any, float]:
    """Eq. (3) by ``networkx.pagerank`` (weighted edges, personalization, damping α, at most T iterations)."""
    try:
        return nx.pagerank(graph, alpha=settings.damping, personalization=personalization,
                           max_iter=settings.max_iterations, tol=settings.tolerance, weight="weight")
    except nx.PowerIterationFailedConvergence as error:
        raise RetrievalError(f"PPR did not converge within {settings.max_iterations} iterations "
                             f"(damping {settings.damping}, tolerance {settings.tolerance})") from error


def rank_context(graph: nx.Graph, scores: dict[Any, float]) -> list[tuple[Any, float]]:
    """Chunk and triplet nodes by PPR score, best first (ties: chunks before triplets, then node order)."""
    content = [(node, scores[node]) for node, kind in graph.nodes(data="kind") if kind in ("chunk", "triplet")]
    order = {node: position for position, node in enumerate(graph.nodes)}
    return sorted(content, key=lambda item: (-item[1], item[0][0] != "chunk", order[item[0]]))


class _HybridBase:
    """Semantic (dense chunks) + graph (triplets) retrieval for a batch of KAG queries."""

    def __init__(self, chunks: DenseRetriever, graph: KnowledgeGraph, settings: KagSettings | None = None) -> None:
        self.settings = settings or KagSettings()
        if chunks.encoder.dim != graph.meta.dim:
            raise RetrievalError(f"the knowledge graph was embedded with dimension {graph.meta.dim}, the index's "
                                 f"embedder has {chunks.encoder.dim}")
        self.chunks = chunks
        self.graph = graph
        self.graph_retriever = GraphRetriever(graph, chunks.encoder, entity_top_k=self.settings.entity_top_k,
                                              triplet_top_k=self.settings.triplet_top_k,
                                              fallback_key_entities=self.settings.fallback_key_entities)

    def _retrieve(self, queries: Sequence[str], chunk_k: int, triplet_k: int
                  ) -> tuple[list[str], list[list[str]], list[list[Hit]], list[list[ScoredTriplet]]]:
        subqueries, entities, vectors = resolve_queries(self.graph_retriever, queries)
        scores, rows = self.chunks.search_vectors(vectors, chunk_k)
        chunk_hits = [[Hit.from_passage(self.chunks.store[int(row)], float(score))
                       for score, row in zip(score_row, row_ids, strict=True) if row >= 0]
                      for score_row, row_ids in zip(scores, rows, strict=True)]
        triplets = self.graph_retriever.retrieve(subqueries, entities, vectors, triplet_k)
        return subqueries, entities, chunk_hits, triplets


class KagRetriever(_HybridBase):
    """TeaRAG's retriever: chunks + triplets → KAG → PPR → the ``k`` best chunk/triplet nodes as hits.

    Chunk hits keep their passage id, title and text; triplet hits are ``triplet:<n>`` with the text
    ``"head relation tail"``; every hit's score is its PPR score.
    """

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        queries = check_search_args(queries, k)
        if not queries:
            return []
        settings = self.settings
        _, entities, chunk_hits, triplets = self._retrieve(queries, settings.chunk_top_k, settings.triplet_top_k)
        results = []
        for key_entities, hits, scored in zip(entities, chunk_hits, triplets, strict=True):
            kag, _ = self.association_graph(key_entities, hits, scored)
            ppr = personalized_pagerank(kag, personalization_vector(kag, key_entities, settings), settings)
            by_id = {hit.id: hit for hit in hits}
            selected = []
            for (kind, ident), score in rank_context(kag, ppr)[:k]:
                if kind == "chunk":
                    hit = by_id[ident]
                    selected.append(Hit(hit.id, hit.title, hit.text, float(score)))
                else:
                    selected.append(triplet_hit(self.graph, ident, score))
            results.append(selected)
        return results

    def association_graph(self, key_entities: Sequence[str], hits: Sequence[Hit],
                          scored: Sequence[ScoredTriplet]) -> tuple[nx.Graph, list[KagTriplet]]:
        """The KAG of one subquery from its retrieved chunks and triplets."""
        graph = self.graph
        kag_triplets = [KagTriplet(item.triplet_id, graph.entities[graph.triplets[item.triplet_id].head].name,
                                   graph.entities[graph.triplets[item.triplet_id].tail].name,
                                   graph.triplets[item.triplet_id].chunk_id, item.score) for item in scored]
        kag_chunks = [KagChunk(hit.id, hit.title, hit.score) for hit in hits]
        return build_kag(kag_chunks, kag_triplets, key_entities, self.settings), kag_triplets


class KagConcatRetriever(_HybridBase):
    """TeaRAG-Con (§5.4.1): the top chunks then the top triplets, concatenated, no KAG or PPR.

    ``k`` items in all: ⌈k/2⌉ chunks and ⌊k/2⌋ triplets (the paper's TeaRAG-Con uses 5 + 5, i.e. ``k = 10``);
    if one side has fewer, the other fills the remaining places.
    """

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        queries = check_search_args(queries, k)
        if not queries:
            return []
        _, _, chunk_hits, triplets = self._retrieve(queries, k, k)
        results = []
        for hits, scored in zip(chunk_hits, triplets, strict=True):
            chunk_share = min(len(hits), max(math.ceil(k / 2), k - len(scored)))
            triplet_hits = [triplet_hit(self.graph, item.triplet_id, item.score) for item in scored]
            results.append(hits[:chunk_share] + triplet_hits[: k - chunk_share])
        return results


KAG_RETRIEVERS: Final[dict[str, type[_HybridBase]]] = {"kag": KagRetriever, "kag_concat": KagConcatRetriever}
"""The retriever kinds a knowledge graph adds to an index (:data:`prorag.retrieval.index.KG_RETRIEVER_KINDS`)."""


def _kag_retriever(kind: str, graph: KnowledgeGraph, settings: KagSettings | None,
                   index: RetrievalIndex) -> _HybridBase:
    return KAG_RETRIEVERS[kind](index.dense, graph, settings)


def attach_knowledge_graph(index: RetrievalIndex, graph: KnowledgeGraph,
                           settings: KagSettings | None = None) -> RetrievalIndex:
    """Make ``index.retriever("kag")`` / ``("kag_concat")`` available: the KG extracted from this index's passages
    (and the KAG hyperparameters, the paper's by default). Returns ``index``."""
    if graph.meta.embedder_spec != index.meta.embedder_spec or graph.meta.dim != index.meta.dim:
        raise RetrievalError(f"the knowledge graph was embedded with {graph.meta.embedder_spec!r} "
                             f"({graph.meta.dim}-d), the index with {index.meta.embedder_spec!r} "
                             f"({index.meta.dim}-d)")
    for kind in KAG_RETRIEVERS:
        index.register_retriever(kind, partial(_kag_retriever, kind, graph, settings))
    return index


class KnowledgeGraphOption:
    """The retrieval server's ``--knowledge-graph DIR`` option (:func:`prorag.retrieval.server.main`): loads the
    knowledge graph and attaches it to the served index, for ``--retriever kag`` / ``kag_concat``."""

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--knowledge-graph", default=None,
                            help="for --retriever kag / kag_concat: data/06_models/knowledge_graph/<version>/"
                                 "knowledge_graph (kedro run --pipelines=kg_extraction)")

    def apply(self, index: RetrievalIndex, args: Any) -> None:
        path: str | os.PathLike[str] | None = args.knowledge_graph
        if path:
            attach_knowledge_graph(index, load_knowledge_graph(path))
