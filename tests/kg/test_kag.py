"""KAG edge rules on a hand-built example, PPR against an independent linear solve, the kag retrievers."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from prorag.data.records import Passage
from prorag.kg.extraction import ExtractedTriplet
from prorag.kg.graph import build_knowledge_graph, load_knowledge_graph, save_knowledge_graph
from prorag.kg.graph_retrieval import entity_query
from prorag.kg.kag import (
    SUBQUERY_NODE,
    KagChunk,
    KagSettings,
    KagTriplet,
    KnowledgeGraphOption,
    attach_knowledge_graph,
    build_kag,
    chunk_node,
    entity_node,
    personalization_vector,
    personalized_pagerank,
    rank_context,
    triplet_node,
)
from prorag.kg.query import format_kag_query, parse_kag_query
from prorag.retrieval import RetrievalError, build_retrieval_index

SETTINGS = KagSettings(triplet_threshold=0.5, max_iterations=1000, tolerance=1e-13)
CHUNKS = [KagChunk("c1", "Paris", 0.9), KagChunk("c2", "Berlin", 0.5)]
TRIPLETS = [KagTriplet(1, "Paris", "France", "c1", 0.8), KagTriplet(2, "The Eiffel Tower", "paris", "c9", 0.3)]


def _edges(graph: nx.Graph) -> dict[frozenset, tuple[float, str]]:
    return {frozenset((u, v)): (round(data["weight"], 6), data["rule"]) for u, v, data in graph.edges(data=True)}


def test_edge_rules_on_a_hand_built_example() -> None:
    graph = build_kag(CHUNKS, TRIPLETS, ["Paris"], SETTINGS)
    paris, france, eiffel, berlin = (entity_node(n) for n in ("Paris", "France", "Eiffel Tower", "Berlin"))
    c1, c2, t1, t2 = chunk_node("c1"), chunk_node("c2"), triplet_node(1), triplet_node(2)
    soft = np.exp([0.9, 0.5]) / np.exp([0.9, 0.5]).sum()
    expected = {
        frozenset((SUBQUERY_NODE, c1)): (round(soft[0], 6), "chunk-subquery"),  # eq. (1)
        frozenset((SUBQUERY_NODE, c2)): (round(soft[1], 6), "chunk-subquery"),
        frozenset((SUBQUERY_NODE, t1)): (1.0, "triplet-subquery"),  # eq. (2): 0.8 >= θ; t2's 0.3 < θ: no edge
        frozenset((c1, paris)): (1.0, "chunk-entity"),  # title edge, then the co-occurrence rule (same pair)
        frozenset((c2, berlin)): (1.0, "chunk-title"),
        frozenset((paris, france)): (1.0, "entity-entity"),
        frozenset((t1, paris)): (1.0, "triplet-entity"),
        frozenset((t1, france)): (1.0, "triplet-entity"),
        frozenset((c1, t1)): (1.0, "chunk-triplet"),  # t1's source chunk c1 was retrieved
        frozenset((c1, france)): (1.0, "chunk-entity"),
        frozenset((eiffel, paris)): (1.0, "entity-entity"),  # "paris" and "Paris" are one entity node
        frozenset((t2, eiffel)): (1.0, "triplet-entity"),
        frozenset((t2, paris)): (1.0, "triplet-entity"),  # t2's chunk c9 was not retrieved: no chunk edges
    }
    assert _edges(graph) == expected
    kinds = dict(graph.nodes(data="kind"))
    assert sorted(kinds.values()).count("entity") == 4 and kinds[SUBQUERY_NODE] == "subquery"
    score_edges = build_kag(CHUNKS, TRIPLETS, [], KagSettings(triplet_edge="score", triplet_threshold=0.5))
    assert score_edges[SUBQUERY_NODE][t1]["weight"] == pytest.approx(0.8)


def test_triplet_edges_weigh_the_thresholded_score_normalized_like_chunk_edges() -> None:
    # eq. (2): the relevance score, thresholded at θ, normalized over the triplets that pass with eq. (1)'s softmax
    chunks = [KagChunk("c1", "Paris", 0.9), KagChunk("c2", "Berlin", 0.3)]
    triplets = [KagTriplet(1, "Paris", "France", "c1", 0.8), KagTriplet(2, "Berlin", "Germany", "c2", 0.6),
                KagTriplet(3, "Rome", "Italy", "c7", 0.3)]
    graph = build_kag(chunks, triplets, [], KagSettings(triplet_threshold=0.5))
    passing = [0.8, 0.6]  # 0.3 < θ: no edge
    expected = [np.exp(score) / sum(np.exp(other) for other in passing) for score in passing]
    weights = [graph[SUBQUERY_NODE][triplet_node(i)]["weight"] for i in (1, 2)]
    assert weights == pytest.approx(expected)
    assert not graph.has_edge(SUBQUERY_NODE, triplet_node(3))
    chunk_weights = [graph[SUBQUERY_NODE][chunk_node(c)]["weight"] for c in ("c1", "c2")]
    assert sum(weights) == pytest.approx(1.0) and sum(chunk_weights) == pytest.approx(1.0)  # comparable scales
    # the best chunk (0.9) now weighs more than a weaker triplet (0.6); with the indicator every triplet weighs 1
    assert chunk_weights[0] > weights[1]
    indicator = build_kag(chunks, triplets, [], KagSettings(triplet_threshold=0.5, triplet_edge="indicator"))
    assert [indicator[SUBQUERY_NODE][triplet_node(i)]["weight"] for i in (1, 2)] == [1.0, 1.0]
    minmax = build_kag(chunks, triplets, [], KagSettings(triplet_threshold=0.5, chunk_normalization="minmax"))
    assert minmax[SUBQUERY_NODE][triplet_node(1)]["weight"] == pytest.approx(1.0)  # (0.8 - 0.6) / (0.8 - 0.6)
    assert not minmax.has_edge(SUBQUERY_NODE, triplet_node(2))  # min-max maps the lowest passing score to 0


def test_ppr_matches_an_independent_linear_solve() -> None:
    graph = build_kag(CHUNKS, TRIPLETS, ["Paris"], SETTINGS)
    personalization = personalization_vector(graph, ["Paris"], SETTINGS)
    assert personalization == {SUBQUERY_NODE: 1.0, entity_node("Paris"): 0.5}
    scores = personalized_pagerank(graph, personalization, SETTINGS)
    nodes = list(graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    weights = np.zeros((len(nodes), len(nodes)))
    for u, v, data in graph.edges(data=True):
        weights[position[u], position[v]] = weights[position[v], position[u]] = data["weight"]
    transition = weights / weights.sum(axis=0, keepdims=True)  # P = A D^-1 (no dangling node here)
    v = np.zeros(len(nodes))
    v[position[SUBQUERY_NODE]], v[position[entity_node("Paris")]] = 1.0, 0.5
    v /= v.sum()
    alpha = SETTINGS.damping
    exact = (1 - alpha) * np.linalg.solve(np.eye(len(nodes)) - alpha * transition, v)  # fixed point of eq. (3)
    assert np.allclose([scores[node] for node in nodes], exact, atol=1e-9)
    ranked = rank_context(graph, scores)
    assert ranked[0][0] in (chunk_node("c1"), triplet_node(1))  # the co-occurring pair leads
    assert {node for node, _ in ranked} == {chunk_node("c1"), chunk_node("c2"), triplet_node(1), triplet_node(2)}


def test_kag_query_encoding_round_trips_and_tolerates_plain_text() -> None:
    text = format_kag_query(" Who founded it? ", ["Acme; Inc.", 'The "Big" One', " "])
    assert parse_kag_query(text) == ("Who founded it?", ["Acme; Inc.", 'The "Big" One'])
    assert parse_kag_query("plain question") == ("plain question", [])
    assert parse_kag_query("q\nKey entities: [broken") == ("q\nKey entities: [broken", [])
    assert format_kag_query("q", []) == "q"
    assert entity_query("Paris", "Where is it?") == "Key entity: Paris. Query: Where is it?"


PASSAGES = [
    Passage("p1", "Kreuzlingen", "Kreuzlingen is a town in Switzerland on Lake Constance."),
    Passage("p2", "Westphal", "Alexander Westphal was a psychiatrist born in Berlin."),
    Passage("p3", "Lake Constance", "Lake Constance lies between Germany, Switzerland and Austria."),
    Passage("p4", "Berlin", "Berlin is the capital of Germany."),
]
EXTRACTED = [
    ExtractedTriplet("Kreuzlingen", "is a town in", "Switzerland", "p1", True, True),
    ExtractedTriplet("Kreuzlingen", "lies on", "Lake Constance", "p1", True, True),
    ExtractedTriplet("Alexander Westphal", "born in", "Berlin", "p2", True, True),
    ExtractedTriplet("Berlin", "capital of", "Germany", "p4", True, True),
    ExtractedTriplet("berlin", "capital of", "Germany", "p4", True, True),  # a duplicate after normalization
]


@pytest.fixture(scope="module")
def kag_index():
    index = build_retrieval_index(PASSAGES, "hashing:256", build_bm25=False, show_progress=False)
    return index, build_knowledge_graph(EXTRACTED, index.embedder, chunk_count=len(PASSAGES))


def test_knowledge_graph_dedups_and_round_trips(kag_index, tmp_path: Path) -> None:
    _, graph = kag_index
    assert len(graph.triplets) == 4 and [e.key for e in graph.entities].count("berlin") == 1
    loaded = load_knowledge_graph(save_knowledge_graph(tmp_path / "kg", graph))
    assert [t.chunk_id for t in loaded.triplets] == ["p1", "p1", "p2", "p4"]
    assert loaded.triplet_text(2) == "Alexander Westphal born in Berlin"
    assert loaded.one_hop([loaded.entity_by_key["berlin"]]) == [2, 3]
    (tmp_path / "kg" / "triplets.jsonl").write_text('{"id": 5}\n')
    with pytest.raises(RetrievalError, match=r"triplets.jsonl:1"):
        load_knowledge_graph(tmp_path / "kg")


def test_kag_and_kag_concat_retrievers(kag_index) -> None:
    index, graph = kag_index
    with pytest.raises(RetrievalError, match="needs a knowledge graph"):
        index.retriever("kag")
    attach_knowledge_graph(index, graph, KagSettings(chunk_top_k=2, triplet_top_k=2, triplet_threshold=0.0))
    query = format_kag_query("Where was Alexander Westphal born?", ["Alexander Westphal"])
    [hits] = index.retriever("kag").search([query], 3)
    assert len(hits) == 3 and hits == sorted(hits, key=lambda hit: -hit.score)
    assert "triplet:2" in [hit.id for hit in hits] and "p2" in [hit.id for hit in hits]
    triplet = next(hit for hit in hits if hit.id == "triplet:2")
    assert triplet.text == "Alexander Westphal born in Berlin" and triplet.title == ""
    [plain] = index.retriever("kag").search(["Where was Alexander Westphal born?"], 3)  # entities found
    assert "triplet:2" in [hit.id for hit in plain]
    [concat] = index.retriever("kag_concat").search([query], 4)
    kinds = ["triplet" if hit.id.startswith("triplet:") else "chunk" for hit in concat]
    assert kinds == ["chunk", "chunk", "triplet", "triplet"]
    assert index.retriever("kag").search([], 3) == []


def test_retrieval_server_serves_kag_with_a_knowledge_graph(kag_index, tmp_path: Path, monkeypatch) -> None:
    from prorag.kg.kag import KagRetriever
    from prorag.retrieval import server

    index, graph = kag_index
    index.save(tmp_path / "index")
    save_knowledge_graph(tmp_path / "kg", graph)
    served = {}
    monkeypatch.setattr(server, "serve", lambda retriever, *args, **kwargs: served.update(retriever=retriever))
    server.main(["--index-dir", str(tmp_path / "index"), "--retriever", "kag", "--knowledge-graph",
                 str(tmp_path / "kg")], [KnowledgeGraphOption()])
    assert isinstance(served["retriever"], KagRetriever)
    with pytest.raises(RetrievalError, match="needs a knowledge graph"):
        server.main(["--index-dir", str(tmp_path / "index"), "--retriever", "kag_concat"], [KnowledgeGraphOption()])
