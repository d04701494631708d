import uuid

import fsspec
import pytest
from kedro.io.core import DatasetError, Version

from prorag.data.records import Passage
from prorag.datasets import RetrievalIndexDataset
from prorag.retrieval import HashingEmbedder, build_retrieval_index


def make_index(texts: list[str]):
    passages = [Passage(f"p{index}", f"Title {index}", text) for index, text in enumerate(texts)]
    return build_retrieval_index(passages, embedder=HashingEmbedder(32, show_progress=False), show_progress=False)


@pytest.fixture(scope="module")
def index():
    return make_index(["zebras live in africa", "penguins live in antarctica", "kangaroos live in australia"])


def ids(retrieval_index, query: str) -> list[str]:
    return [hit.id for hit in retrieval_index.bm25.search([query], 3)[0]]


def test_versioned_save_and_load_on_a_local_path(tmp_path, index):
    filepath = tmp_path / "06_models" / "retrieval_index"
    dataset = RetrievalIndexDataset(filepath=str(filepath), version=Version(None, None))
    assert not dataset.exists()
    dataset.save(index)
    assert dataset.exists()
    [version] = [path.name for path in filepath.iterdir()]
    assert sorted(item.name for item in (filepath / version / "retrieval_index").iterdir()) == [
        "bm25",
        "faiss.index",
        "index_meta.json",
        "passages.jsonl",
    ]
    loaded = dataset.load()
    assert len(loaded) == 3 and loaded.meta.embedder_spec == "hashing:32"
    assert ids(loaded, "penguins") == ["p1"]
    assert loaded.dense.search(["kangaroos australia"], 1)[0][0].id == "p2"

    newer = make_index(["only one passage about penguins"])
    RetrievalIndexDataset(filepath=str(filepath), version=Version(None, None)).save(newer)
    latest = RetrievalIndexDataset(filepath=str(filepath), version=Version(None, None)).load()
    assert len(latest) == 1
    pinned = RetrievalIndexDataset(filepath=str(filepath), version=Version(version, None)).load()
    assert len(pinned) == 3
    assert len(list(filepath.iterdir())) == 2

    described = str(dataset)
    assert "retrieval_index" in described and "version" in described


def test_saving_twice_to_the_same_version_fails(tmp_path, index):
    dataset = RetrievalIndexDataset(filepath=str(tmp_path / "idx"), version=Version(None, "2024-01-01T00.00.00.000Z"))
    dataset.save(index)
    with pytest.raises(DatasetError, match="must not exist if versioning is enabled"):
        dataset.save(index)


def test_unversioned_save_overwrites(tmp_path, index):
    dataset = RetrievalIndexDataset(filepath=str(tmp_path / "idx"))
    dataset.save(index)
    dataset.save(make_index(["a single passage"]))
    assert len(dataset.load()) == 1


def test_remote_filesystem_roundtrip_through_fsspec(index):
    root = f"memory:///prorag-test-{uuid.uuid4().hex}/retrieval_index"
    dataset = RetrievalIndexDataset(filepath=root, version=Version(None, None))
    assert not dataset.exists()
    dataset.save(index)
    assert dataset.exists()
    memory = fsspec.filesystem("memory")
    names = {path.rsplit("/", 1)[-1] for path in memory.find(root)}
    assert {"faiss.index", "passages.jsonl", "index_meta.json", "params.index.json"} <= names
    loaded = RetrievalIndexDataset(filepath=root, version=Version(None, None)).load()
    assert len(loaded) == 3 and ids(loaded, "zebras africa") == ["p0"]
    memory.rm(root, recursive=True)


def test_incomplete_version_does_not_count(tmp_path):
    filepath = tmp_path / "idx"
    (filepath / "2024-01-01T00.00.00.000Z" / "idx").mkdir(parents=True)  # an interrupted upload: no metadata
    dataset = RetrievalIndexDataset(filepath=str(filepath), version=Version(None, None))
    assert not dataset.exists()
    with pytest.raises(DatasetError):
        dataset.load()


def test_wrong_input_and_load_args_are_named(tmp_path):
    with pytest.raises(DatasetError, match="unknown load_args"):
        RetrievalIndexDataset(filepath=str(tmp_path / "idx"), load_args={"nprobes": 3})
    with pytest.raises(DatasetError, match="saves a RetrievalIndex, got dict"):
        RetrievalIndexDataset(filepath=str(tmp_path / "idx")).save({})


def test_an_interrupted_newer_version_does_not_hide_the_complete_one(tmp_path, index):
    filepath = tmp_path / "idx"
    RetrievalIndexDataset(filepath=str(filepath), version=Version(None, "2024-01-01T00.00.00.000Z")).save(index)
    (filepath / "2024-01-02T00.00.00.000Z" / "idx").mkdir(parents=True)
    assert len(RetrievalIndexDataset(filepath=str(filepath), version=Version(None, None)).load()) == 3


def test_preview_is_a_summary_table(index):
    root = f"memory:///prorag-preview-{uuid.uuid4().hex}/retrieval_index"
    RetrievalIndexDataset(filepath=root, version=Version(None, None)).save(index)
    preview = RetrievalIndexDataset(filepath=root, version=Version(None, None)).preview(max_chars=30)
    assert preview["columns"] == ["field", "value"]
    table = dict(preview["data"])
    assert table["passage_count"] == 3 and table["embedder_spec"] == "hashing:32" and table["files"] >= 4
    assert all(not isinstance(value, str) or len(value) <= 30 for value in table.values())
    assert isinstance(table["faiss"], str)  # nested settings as JSON text
    fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def test_an_index_is_loaded_once_per_process_and_each_node_gets_its_own_view(tmp_path, index):
    """Every node taking ``retrieval_index`` used to reload FAISS, passages and BM25 from disk."""
    from prorag.datasets.retrieval_index_dataset import clear_index_cache

    clear_index_cache()
    filepath = str(tmp_path / "idx")
    RetrievalIndexDataset(filepath=filepath, version=Version(None, None)).save(index)
    first = RetrievalIndexDataset(filepath=filepath, version=Version(None, None)).load()
    second = RetrievalIndexDataset(filepath=filepath, version=Version(None, None)).load()
    assert first is not second
    assert first.faiss_index is second.faiss_index and first.store is second.store
    assert first.bm25 is second.bm25 and first.dense is second.dense
    first.register_retriever("custom", lambda idx: idx.bm25)
    assert "custom" not in second.retriever_kinds  # a knowledge graph attached in one node stays there
    other_args = RetrievalIndexDataset(filepath=filepath, version=Version(None, None), load_args={"mmap": False})
    assert other_args.load().faiss_index is not first.faiss_index
    clear_index_cache()
