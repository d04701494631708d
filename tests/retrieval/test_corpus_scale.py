"""The papers' corpus at scale: dump readers, the disk store, resumable embedding, index choices, serving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import faiss
import numpy as np
import pytest

from prorag.data.corpus import DuplicatePassageError
from prorag.data.dumps import PassageFile, detect_format, iter_passage_file
from prorag.data.jsonl import DataFileError
from prorag.data.records import Passage
from prorag.retrieval import HashingEmbedder, PassageStore, RetrievalError, build_retrieval_index
from prorag.retrieval.dense import DenseIndexBuilder, DenseIndexConfig, build_dense_index, check_nlist
from prorag.retrieval.disk_store import DiskPassageStore, index_passage_file, ingest_passages
from prorag.retrieval.index import build_retrieval_index_at_scale, import_prebuilt_index, load_index_dir
from prorag.retrieval.sharded import embed_store, shard_paths
from prorag.retrieval.sizing import InsufficientResourcesError, check_index_cost, estimate_index_cost

SRC = Path(__file__).resolve().parents[2] / "src"


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


# --- 1. readers ---------------------------------------------------------------------------------------------------

def test_flashrag_jsonl_title_on_first_line(tmp_path):
    path = write(tmp_path / "wiki-18.jsonl", """
        {"id": "0", "contents": "\\"Aaron\\"\\nAaron is a prophet, high priest."}
        {"id": 1, "contents": "No title line here"}
    """)
    assert detect_format(path) == "flashrag"
    records = list(iter_passage_file(path))
    assert [(line, passage.id, passage.title, passage.text) for line, _, passage in records] == [
        (1, "0", '"Aaron"', "Aaron is a prophet, high priest."), (2, "1", "", "No title line here")]
    assert records[0][2].contents == '"Aaron"\nAaron is a prophet, high priest.'  # the string Search-R1 embedded
    assert records[1][1] == len(path.read_bytes().split(b"\n")[0]) + 1  # byte offsets


def test_dpr_tsv_with_csv_quoting(tmp_path):
    path = write(tmp_path / "psgs_w100.tsv", """
        id\ttext\ttitle
        1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron
        2\tplain text\tSecond
    """)
    passages = list(PassageFile(str(path)))
    assert [(p.id, p.title, p.text) for p in passages] == [
        ("1", "Aaron", 'Aaron Aaron ( or ; "Ahärôn") is a prophet'), ("2", "Second", "plain text")]


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.jsonl", '{"id": "0", "contents": "t\\nx"}\n{"id": "1", "contents": 5}\n', r"bad.jsonl:2: .*contents"),
    ("bad2.jsonl", '{"id": "0", "contents": "t\\nx"}\n\n{"id": "1", "contents": \n', r"bad2.jsonl:3: malformed JSON"),
    ("bad.tsv", "id\ttext\ttitle\n1\tonly two\n", r"bad.tsv:2: expected 3 tab-separated"),
    ("hdr.tsv", "pid\ttext\ttitle\n", r"hdr.tsv:1: expected the DPR header"),
    ("own.jsonl", '{"id": "a", "title": "T", "text": ""}\n', r"own.jsonl:1: .*text"),
])
def test_reader_errors_name_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataFileError, match=message):
        list(iter_passage_file(path))


DEEP = '{"id": "1", "contents": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize(("name", "line", "message"), [
    ("deep.jsonl", DEEP, r"deep.jsonl:2: JSON nested too deeply"),
    ("surrogate.jsonl", '{"id": "1", "contents": "T\\nbad \\ud800"}',
     r"surrogate.jsonl:2: field contents: invalid Unicode \(lone surrogate U\+D800"),
    ("bigint.jsonl", '{"id": ' + "9" * 5000 + ', "contents": "T\\nx"}', r"bigint.jsonl:2: unreadable JSON value"),
])
def test_a_bad_record_in_a_streamed_corpus_names_file_and_line(tmp_path, name, line, message):
    """Issue 47, bug 9: deep nesting was a RecursionError naming nothing, and a lone surrogate was accepted (it
    failed later, in the passage store, naming no input)."""
    path = tmp_path / name
    path.write_text('{"id": "0", "contents": "T\\nfine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=message):
        list(iter_passage_file(path, "flashrag"))
    with pytest.raises(DataFileError, match=message):
        index_passage_file(path, "auto")  # what `prebuilt` reads the corpus with


@pytest.mark.parametrize("name", ["big.jsonl", "big.tsv"])
def test_a_streamed_record_over_the_size_cap_is_refused_without_reading_it_whole(tmp_path, name):
    """Issue 47, bug 9: a 100 MB line was read whole (24 s, 1.1 GB); now the cap (``max_record_bytes``, a
    setting) stops it with file and line after reading at most the cap."""
    path = tmp_path / name
    big = 4 << 20
    if name.endswith(".tsv"):
        path.write_bytes(b"id\ttext\ttitle\n1\tsmall\tT\n2\t" + b"x" * big + b"\tT\n")
    else:
        path.write_bytes(b'{"id": "1", "title": "T", "text": "small"}\n{"id": "2", "title": "T", "text": "'
                         + b"x" * big + b'"}\n')
    read: list[int] = []
    original = open

    class Spy:  # the largest single read from the file
        def __init__(self, handle):
            self.handle = handle

        def __iter__(self):
            return iter(self.handle)

        def readline(self, size=-1):
            line = self.handle.readline(size)
            read.append(len(line))
            return line

        def __getattr__(self, attribute):
            return getattr(self.handle, attribute)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.handle.close()

    def spying_open(self, *args, **kwargs):
        return Spy(original(self, *args, **kwargs))

    cap = 1 << 20
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "open", spying_open)
        line = 3 if name.endswith(".tsv") else 2
        with pytest.raises(DataFileError, match=rf"{name}:{line}: a record longer than {cap} bytes"):
            list(iter_passage_file(path, max_record_bytes=cap))
    assert read and max(read) <= cap + 2
    assert [p.id for p in PassageFile(str(path), max_record_bytes=big + 64)] == ["1", "2"]  # a larger cap reads it


def test_corpus_indexing_streams_with_the_record_size_setting(tmp_path):
    """The cap is ``corpus_indexing.max_record_bytes``; the node's error names the file and line."""
    from prorag.pipelines.corpus_indexing.nodes import build_index
    from prorag.pipelines.corpus_indexing.params import CorpusIndexingParams

    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "1", "title": "T", "text": "' + "word " * 400 + '"}\n', encoding="utf-8")
    params = CorpusIndexingParams.model_validate({"corpus_files": [{"path": str(path)}], "max_record_bytes": 1000,
                                                 "work_dir": str(tmp_path / "w"), "embedder": "hashing:64",
                                                 "check_resources": False})
    with pytest.raises(DataFileError, match=r"c\.jsonl:1: a record longer than 1000 bytes"):
        build_index([], params)


def test_project_schema_still_reads(hotpot_passages, tmp_path):
    path = tmp_path / "own.jsonl"
    path.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in hotpot_passages[:50]), encoding="utf-8")
    assert detect_format(path) == "prorag"
    assert list(PassageFile(str(path))) == hotpot_passages[:50]


# --- the disk store -----------------------------------------------------------------------------------------------

def test_disk_store_reads_by_offset_and_matches_memory(hotpot_passages, tmp_path):
    passages = hotpot_passages[:300]
    store = ingest_passages(((f"x:{i}", p) for i, p in enumerate([*passages, passages[5]])), tmp_path / "p.jsonl")
    assert len(store) == 300  # the exact repeat was dropped
    memory = PassageStore(passages)
    assert [store[i] for i in (0, 17, 299, -1)] == [memory[i] for i in (0, 17, 299, -1)]
    assert store.position(passages[123].id) == 123 and passages[9].id in store and "nope" not in store
    with pytest.raises(KeyError, match="nope"):
        store.position("nope")
    assert list(store) == passages


def test_disk_store_conflicting_duplicate_names_both_origins(tmp_path):
    records = [("a.jsonl:1", Passage("p", "T", "one")), ("a.jsonl:2", Passage("q", "T", "x")),
               ("b.tsv:7", Passage("p", "T", "two"))]
    with pytest.raises(DuplicatePassageError, match=r"'p'.*a.jsonl:1.*b.tsv:7"):
        ingest_passages(records, tmp_path / "p.jsonl")


def test_disk_store_refuses_a_changed_file(tmp_path):
    path = write(tmp_path / "w.jsonl", '{"id": "0", "contents": "T\\nbody"}\n')
    index_passage_file(path)
    path.write_text(path.read_text() + '{"id": "1", "contents": "T\\nmore"}\n')
    with pytest.raises(DataFileError, match="changed after it was indexed"):
        DiskPassageStore(path, "flashrag")


# --- 2. resumable embedding ---------------------------------------------------------------------------------------

_RESUME_SCRIPT = """
import os, sys, time
from pathlib import Path
from prorag.retrieval import HashingEmbedder
from prorag.retrieval.disk_store import DiskPassageStore
from prorag.retrieval.sharded import embed_store

class Slow(HashingEmbedder):
    def _embed_batch(self, texts):
        time.sleep(float(os.environ["SLOW_S"]))
        return super()._embed_batch(texts)

log = Path(sys.argv[2])
import prorag.retrieval.sharded as sharded
original = sharded.embed_shards
def logged(embedder, store, directory, shard_size, shards, dtype, meter=None, on_shard=None):
    def note(shard):
        with log.open("a") as handle:
            handle.write(f"{shard}\\n")
    return original(embedder, store, directory, shard_size, shards, dtype, meter, note)
sharded.embed_shards = logged
store = DiskPassageStore(sys.argv[1])
embed_store(store, sys.argv[3], embedder=Slow(64, batch_size=10, show_progress=False), shard_size=20,
            dtype="float16")
"""


def test_kill_9_mid_embedding_then_rerun_recomputes_no_finished_shard(hotpot_passages, tmp_path):
    store = ingest_passages(((str(i), p) for i, p in enumerate(hotpot_passages[:200])), tmp_path / "p.jsonl")
    script = write(tmp_path / "embed.py", _RESUME_SCRIPT)
    log, shards = tmp_path / "computed.log", tmp_path / "shards"
    env = {**os.environ, "PYTHONPATH": str(SRC), "SLOW_S": "0.15"}
    args = [sys.executable, str(script), str(store.path), str(log), str(shards)]
    process = subprocess.Popen(args, env=env)
    deadline = time.monotonic() + 120
    while len(list(shards.glob("shard-*.npy"))) < 3 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    finished_before = {path.name for path in shards.glob("shard-*.npy")}
    assert 3 <= len(finished_before) < 10, finished_before  # killed mid-way
    subprocess.run(args, env={**env, "SLOW_S": "0"}, check=True)
    computed = [int(line) for line in log.read_text().split()]
    first_run = computed[: len(computed) - (10 - len(finished_before))]
    rerun = computed[len(first_run):]
    assert not {f"shard-{shard:06d}.npy" for shard in rerun} & finished_before  # nothing finished recomputed
    assert sorted(rerun) == sorted(set(range(10)) - {int(name[6:12]) for name in finished_before})
    resumed = np.concatenate([np.load(path) for path in shard_paths(shards, 200, 20)])
    fresh = HashingEmbedder(64, batch_size=10, show_progress=False).encode_passages(list(store))
    np.testing.assert_allclose(resumed.astype(np.float32), fresh, atol=1e-3)
    assert resumed.dtype == np.float16


def test_resume_refuses_shards_of_another_build(hotpot_passages, tmp_path):
    passages = hotpot_passages[:40]
    embed_store(PassageStore(passages), tmp_path, embedder=HashingEmbedder(32, show_progress=False), shard_size=10)
    with pytest.raises(RetrievalError, match=r"another build.*embedder_spec"):
        embed_store(PassageStore(passages), tmp_path, embedder=HashingEmbedder(16, show_progress=False),
                    shard_size=10)


# --- 3. index choices, estimates, nlist, GPU cloner options, spill kept ------------------------------------------

def unit(count: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_hnsw_index_close_to_exact():
    corpus, queries = unit(4000, 32, 1), unit(50, 32, 2)
    index = build_dense_index(np.array_split(corpus, 3), 32, DenseIndexConfig(index_type="hnsw", ef_search=128))
    assert "HNSW" in type(index).__name__
    _, rows = index.search(queries, 10)
    truth = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, truth, strict=True)])
    assert recall > 0.9


def test_explicit_nlist_is_checked_against_the_corpus_size():
    with pytest.raises(ValueError, match=r"nlist=4096 needs at least 159744 vectors .* has 23575"):
        check_nlist(4096, 23_575)
    with pytest.raises(ValueError, match="nlist=64 needs"):
        build_dense_index([unit(500, 16, 0)], 16, DenseIndexConfig(index_type="ivf", nlist=64))


def test_estimate_is_printed_and_refuses_what_does_not_fit(tmp_path, capsys):
    config = DenseIndexConfig(index_type="ivfpq", nlist=4096, pq_m=64)
    cost = estimate_index_cost(config, 21_000_000, 768, shard_bytes_per_value=2)
    assert 1.4e9 < cost.index_bytes < 2.0e9  # 64-byte codes + 8-byte ids for 21M
    assert cost.spill_bytes == 21_000_000 * 768 * 2
    flat = estimate_index_cost(DenseIndexConfig(), 21_000_000, 768)
    assert flat.index_bytes == 21_000_000 * 768 * 4  # 64.5 GB, Search-R1's e5_Flat.index
    with pytest.raises(InsufficientResourcesError, match="RAM"):
        check_index_cost(flat, tmp_path, memory_available=32 * 1024**3, disk_free=10**13)
    with pytest.raises(InsufficientResourcesError, match=r"corpus_indexing.work_dir"):
        check_index_cost(cost, tmp_path, memory_available=10**12, disk_free=10 * 1024**3)
    check_index_cost(cost, tmp_path, memory_available=10**12, disk_free=10**13)
    assert "IVF4096,PQ64x8 over 21,000,000 x 768-d" in capsys.readouterr().out


class _FakeOptions:
    def __init__(self) -> None:
        self.useFloat16 = False
        self.useFloat16LookupTables = False
        self.usePrecomputed = True
        self.shard = False


def test_gpu_clone_uses_float16_lookup_tables_and_chosen_gpus(monkeypatch):
    """Issue 28 item 3: IVF-PQ with M=64 needs float16 lookup tables on every NVIDIA GPU (48 KiB shared memory)."""
    from prorag.retrieval import dense

    calls = []
    monkeypatch.setattr(dense.faiss, "get_num_gpus", lambda: 8, raising=False)
    monkeypatch.setattr(dense.faiss, "GpuMultipleClonerOptions", _FakeOptions, raising=False)
    monkeypatch.setattr(dense.faiss, "index_cpu_to_gpus_list",
                        lambda index, co=None, gpus=None: calls.append((co, gpus)) or index, raising=False)
    monkeypatch.setattr(dense.faiss, "index_cpu_to_all_gpus",
                        lambda index, *a, **k: calls.append((None, "all")) or index, raising=False)
    ivfpq = faiss.index_factory(768, "IVF4096,PQ64x8", faiss.METRIC_INNER_PRODUCT)
    dense.maybe_to_gpu(ivfpq, True, [2, 3])
    options, gpus = calls[-1]
    assert gpus == [2, 3] and options.useFloat16LookupTables and not options.usePrecomputed
    dense.maybe_to_gpu(faiss.IndexFlatIP(768), True)
    options, gpus = calls[-1]
    assert gpus == list(range(8)) and options.useFloat16 and options.shard  # flat: fp16, sharded over the GPUs
    with pytest.raises(ValueError, match="gpus=\\[9\\]"):
        dense.maybe_to_gpu(ivfpq, True, [9])


def test_spilled_embeddings_survive_a_failed_build(tmp_path, monkeypatch):
    from prorag.retrieval import dense

    builder = DenseIndexBuilder(16, DenseIndexConfig(index_type="ivfpq", pq_m=4), spill_dir=tmp_path)
    for shard in np.array_split(unit(2000, 16, 0), 4):
        builder.add(shard)

    def fail(*_args, **_kwargs):
        raise RuntimeError("requiredSmemSize <= getMaxSharedMemPerBlock")

    monkeypatch.setattr(dense, "maybe_to_gpu", fail)
    with pytest.raises(RuntimeError, match="requiredSmemSize"):
        builder.finish()
    spilled = list(tmp_path.glob("*/shard-*.npy"))
    assert len(spilled) == 4  # hours of embedding are not thrown away


# --- the whole build at scale, prebuilt, serving ------------------------------------------------------------------

def test_build_at_scale_saves_loads_mmapped_and_matches_the_in_memory_build(hotpot_passages, tmp_path):
    passages = hotpot_passages[:400]
    embedder = HashingEmbedder(64, show_progress=False)
    memory = build_retrieval_index(passages, embedder=embedder, show_progress=False)
    scaled = build_retrieval_index_at_scale(((str(i), p) for i, p in enumerate(passages)), tmp_path / "work",
                                            embedder=embedder, shard_size=64, source={"test": 1})
    assert (tmp_path / "work" / "embeddings" / "shard-000006.npy").is_file()  # kept until saved
    saved = scaled.save(tmp_path / "index")
    assert not (tmp_path / "work" / "embeddings").exists()  # removed once the index is saved
    loaded = load_index_dir(saved, embedder=embedder)
    assert isinstance(loaded.store, DiskPassageStore)
    queries = [p.text[:80] for p in passages[::37]]
    for kind in ("dense", "bm25"):
        assert memory.retriever(kind).search(queries, 10) == loaded.retriever(kind).search(queries, 10)


def test_a_failure_after_the_faiss_index_is_built_does_not_lose_it(hotpot_passages, tmp_path, monkeypatch):
    """BM25 over the corpus (or the save) failing after an IVF index is trained: the rerun reads the built index back
    from work_dir/built instead of training it again; the save then removes it with the shards."""
    import prorag.retrieval.index as index_module

    passages = hotpot_passages[:400]
    embedder = HashingEmbedder(32, show_progress=False)

    def build(**options):
        return build_retrieval_index_at_scale(((str(i), p) for i, p in enumerate(passages)), tmp_path / "work",
                                              embedder=embedder, shard_size=64, index_type="ivf", nlist=4,
                                              source={"test": 2}, **options)

    def out_of_memory(*args, **kwargs):
        raise MemoryError("BM25 over the corpus")

    with monkeypatch.context() as patch:
        patch.setattr(index_module.BM25Retriever, "build", out_of_memory)
        with pytest.raises(MemoryError):
            build()
    assert (tmp_path / "work" / "built" / "faiss.index").is_file()
    trained = []
    original = index_module.DenseIndexBuilder.finish
    monkeypatch.setattr(index_module.DenseIndexBuilder, "finish", lambda self: trained.append(1) or original(self))
    resumed = build()
    assert trained == []  # read back, not trained again
    assert resumed.faiss_index.ntotal == len(passages)
    other = build_retrieval_index_at_scale(((str(i), p) for i, p in enumerate(passages)), tmp_path / "work",
                                           embedder=embedder, shard_size=64, index_type="ivf", nlist=8,
                                           source={"test": 2})
    assert trained == [1] and faiss.extract_index_ivf(other.faiss_index).nlist == 8  # other settings: built anew
    other.save(tmp_path / "index")
    assert not (tmp_path / "work" / "built").exists() and not (tmp_path / "work" / "embeddings").exists()


def test_prebuilt_flat_index_and_corpus_used_as_they_are(tmp_path):
    corpus = tmp_path / "wiki-18.jsonl"
    lines = [{"id": str(i), "contents": f'"Title {i}"\nbody number {i} about topic {i % 7}'} for i in range(120)]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    embedder = HashingEmbedder(32, show_progress=False)
    flat = faiss.IndexFlatIP(32)
    flat.add(embedder.encode_passages([line["contents"] for line in lines]))
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    index = import_prebuilt_index(tmp_path / "e5_Flat.index", corpus, embedder_spec="hashing:32")
    saved = index.save(tmp_path / "saved")
    assert sorted(path.name for path in saved.iterdir()) == ["index_meta.json"]  # nothing copied
    loaded = load_index_dir(saved)
    hit = loaded.dense.search([lines[42]["contents"]], 1)[0][0]
    assert (hit.id, hit.title) == ("42", '"Title 42"')


def test_several_devices_embed_in_one_process_each_and_resume_alike(hotpot_passages, tmp_path):
    store = ingest_passages(((str(i), p) for i, p in enumerate(hotpot_passages[:90])), tmp_path / "p.jsonl")
    probe = HashingEmbedder(32, show_progress=False)
    paths = embed_store(store, tmp_path / "e", spec="hashing:32", devices=["cpu", "cpu"], shard_size=20,
                        described=probe.describe(), log_every_s=0.2)
    assert len(paths) == 5 and all(path.is_file() for path in paths)
    np.testing.assert_allclose(np.concatenate([np.load(path) for path in paths]), probe.encode_passages(list(store)),
                               atol=1e-6)
    paths[2].unlink()
    embed_store(store, tmp_path / "e", embedder=probe, shard_size=20)  # one device resumes the two-device run
    assert paths[2].is_file()
