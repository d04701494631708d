import numpy as np
import pytest

from prorag.retrieval import (
    DenseIndexBuilder,
    DenseIndexConfig,
    DenseRetriever,
    HashingEmbedder,
    PassageStore,
    RetrievalError,
    build_dense_index,
    numpy_topk,
)


def unit_vectors(count: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def brute_force(corpus: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ corpus.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, axis=1), rows


@pytest.fixture(scope="module")
def vectors() -> tuple[np.ndarray, np.ndarray]:
    return unit_vectors(3000, 48, seed=1), unit_vectors(64, 48, seed=2)


def test_flat_index_equals_numpy_brute_force(vectors):
    corpus, queries = vectors
    index = build_dense_index(np.array_split(corpus, 7), dim=48)  # added shard by shard
    assert index.ntotal == 3000
    scores, rows = index.search(queries, 10)
    expected_scores, expected_rows = brute_force(corpus, queries, 10)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
    reference_scores, reference_rows = numpy_topk(corpus, queries, 10)
    np.testing.assert_array_equal(reference_rows, expected_rows)
    np.testing.assert_allclose(reference_scores, expected_scores, atol=1e-6)


def test_ivf_probing_every_list_is_exact(vectors, tmp_path):
    corpus, queries = vectors
    builder = DenseIndexBuilder(48, DenseIndexConfig(index_type="ivf", nlist=16, nprobe=16), spill_dir=tmp_path)
    for shard in np.array_split(corpus, 5):
        builder.add(shard)
    assert len(list(tmp_path.iterdir())) == 1  # shards spilled to disk until training
    index = builder.finish()
    assert list(tmp_path.iterdir()) == []  # spilled shards removed
    _, rows = index.search(queries, 10)
    np.testing.assert_array_equal(rows, brute_force(corpus, queries, 10)[1])


def test_ivfpq_is_approximate_but_close(vectors):
    corpus, queries = vectors
    index = build_dense_index([corpus], 48, DenseIndexConfig(index_type="ivfpq", nlist=8, nprobe=8, pq_m=24))
    assert "IVFPQ" in type(index).__name__ and index.ntotal == 3000
    _, rows = index.search(queries, 10)
    expected = brute_force(corpus, queries, 10)[1]
    nearest_found = np.mean([truth[0] in set(found) for found, truth in zip(rows, expected, strict=True)])
    assert nearest_found > 0.9  # 1-recall@10 of compressed codes on structureless random vectors


def test_config_and_builder_validation():
    with pytest.raises(ValueError, match="index_type must be one of"):
        DenseIndexConfig(index_type="annoy")
    with pytest.raises(ValueError, match="pq_m=7 must divide"):
        build_dense_index([unit_vectors(500, 48, 0)], 48, DenseIndexConfig(index_type="ivfpq", pq_m=7))
    builder = DenseIndexBuilder(48)
    with pytest.raises(ValueError, match=r"shape \(m, 48\)"):
        builder.add(np.zeros((3, 12), dtype=np.float32))


def test_dense_retriever_returns_store_passages(hotpot_passages):
    passages = hotpot_passages[:200]
    embedder = HashingEmbedder(256, show_progress=False)
    store = PassageStore(passages)
    index = build_dense_index([embedder.encode_passages(passages)], 256)
    retriever = DenseRetriever(index, store, embedder)
    hits = retriever.search([passages[17].contents, passages[3].contents], 5)
    assert [row[0].id for row in hits] == [passages[17].id, passages[3].id]
    assert hits[0][0].title == passages[17].title and hits[0][0].text == passages[17].text
    assert hits[0][0].score == pytest.approx(1.0, abs=1e-4)
    assert all(a.score >= b.score for a, b in zip(hits[0], hits[0][1:], strict=False))
    assert retriever.search([], 3) == []
    assert len(retriever.search(["anything"], 10_000)[0]) == 200  # k is clamped to the corpus size
    with pytest.raises(ValueError, match="k must be >= 1"):
        retriever.search(["q"], 0)
    with pytest.raises(RetrievalError, match="3 vectors but the passage store has 200"):
        DenseRetriever(build_dense_index([embedder.encode_passages(passages[:3])], 256), store, embedder)
