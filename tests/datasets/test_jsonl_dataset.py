import json
import uuid

import pytest
from kedro.io import DatasetError, Version

from prorag.data import DataFileError
from prorag.datasets import JSONLinesDataset


def test_round_trip_and_versions(tmp_path):
    path = str(tmp_path / "records.jsonl")
    first = JSONLinesDataset(filepath=path, version=Version(None, "2026-01-01T00.00.00.000Z"))
    first.save([{"id": "1", "nested": {"a": [1, 2]}}, {"id": "ü"}])
    second = JSONLinesDataset(filepath=path, version=Version(None, "2026-01-02T00.00.00.000Z"))
    second.save([{"id": "2"}])
    assert JSONLinesDataset(filepath=path, version=Version(None, None)).load() == [{"id": "2"}]
    pinned = JSONLinesDataset(filepath=path, version=Version("2026-01-01T00.00.00.000Z", None))
    assert pinned.load() == [{"id": "1", "nested": {"a": [1, 2]}}, {"id": "ü"}]


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1}\n\n{"id": \n')
    with pytest.raises(DatasetError) as error:
        JSONLinesDataset(filepath=str(path)).load()
    cause = error.value.__cause__ or error.value
    assert isinstance(cause, DataFileError) or "bad.jsonl:3" in str(error.value)
    assert "bad.jsonl:3" in str(error.value)


def test_save_rejects_non_records(tmp_path):
    dataset = JSONLinesDataset(filepath=str(tmp_path / "x.jsonl"))
    with pytest.raises(DatasetError, match="list of dicts"):
        dataset.save([1, 2])
    assert not dataset.exists()


def test_a_non_utf8_byte_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "1"}\n{"id": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"latin1\.jsonl:2: not UTF-8: byte 0xff"):
        JSONLinesDataset(filepath=str(path)).load()


# ------------------------------------------------------------------------------------------ atomic saves


def test_a_failed_local_write_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    dataset = JSONLinesDataset(filepath=str(path))
    dataset.save([{"id": "old"}])

    def crash(source: str, target: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("prorag.datasets.jsonl_dataset.os.replace", crash)
    with pytest.raises(DatasetError, match="disk full"):
        dataset.save([{"id": "new"}] * 1000)
    assert dataset.load() == [{"id": "old"}]
    assert [item.name for item in tmp_path.iterdir()] == ["records.jsonl"]


def test_a_failed_versioned_save_leaves_no_version_to_load(tmp_path, monkeypatch):
    path = str(tmp_path / "records.jsonl")
    JSONLinesDataset(filepath=path, version=Version(None, "2026-01-01T00.00.00.000Z")).save([{"id": "1"}])
    monkeypatch.setattr("prorag.datasets.jsonl_dataset.os.replace", lambda *_: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(DatasetError):
        JSONLinesDataset(filepath=path, version=Version(None, "2026-01-02T00.00.00.000Z")).save([{"id": "2"}])
    assert JSONLinesDataset(filepath=path, version=Version(None, None)).load() == [{"id": "1"}]


def test_round_trip_on_an_fsspec_filesystem():
    filepath = f"memory://jsonl-test-{uuid.uuid4().hex}/records.jsonl"
    dataset = JSONLinesDataset(filepath=filepath, version=Version(None, None))
    dataset.save([{"id": "ü", "nested": [1, {"a": None}]}])
    assert JSONLinesDataset(filepath=filepath, version=Version(None, None)).load() == [
        {"id": "ü", "nested": [1, {"a": None}]}]


# ------------------------------------------------------------------------------------------ kedro-viz preview


def trajectory(index: int) -> dict:
    segments = [{"text": f"step {step} " + "words " * 50, "token_ids": list(range(200)), "kind": "generated"}
                for step in range(6)]
    return {"id": f"q{index}", "question": "Who wrote " + "very " * 80 + "long?", "segments": segments,
            "reward": 0.5 * index, "answer": None}


def test_preview_is_a_table_of_the_first_rows_with_readable_nested_cells(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    lines = [json.dumps(trajectory(0)), "", json.dumps(trajectory(1) | {"extra": True}), json.dumps(trajectory(2))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    preview = JSONLinesDataset(filepath=str(path)).preview(nrows=2)
    assert set(preview) == {"columns", "index", "data"}
    assert preview["columns"] == ["id", "question", "segments", "reward", "answer", "extra"]
    assert preview["index"] == [1, 3]  # line numbers: the blank line 2 is skipped
    first, second = preview["data"]
    assert len(first) == len(second) == 6
    assert first[0] == "q0" and first[3] == 0.0 and first[4] is None and first[5] is None and second[5] is True
    assert len(first[1]) == 200 and first[1].endswith("…")
    segments = first[2]
    assert isinstance(segments, str) and len(segments) <= 200 and segments.endswith("…")
    assert segments.startswith('[{"text": "step 0 words') and '"token_ids": [0, 1, 2, "… +197 more"]' in segments
    json.dumps(preview, allow_nan=False)  # what kedro-viz sends to the browser


def test_preview_limits_and_arguments(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": "x" * 30}) + "\n" for i in range(10)), encoding="utf-8")
    dataset = JSONLinesDataset(filepath=str(path))
    assert len(dataset.preview()["data"]) == 5
    assert dataset.preview(nrows=0) == {"columns": [], "index": [], "data": []}
    assert dataset.preview(nrows=1, max_chars=10)["data"] == [[0, "xxxxxxxxx…"]]
    with pytest.raises(DatasetError, match="nrows >= 0"):
        dataset.preview(nrows=-1)
    chosen = dataset.preview(nrows=2, columns=["text", "id", "absent"])  # the catalog's preview_args.columns
    assert chosen["columns"] == ["text", "id", "absent"] and chosen["data"][1] == ["x" * 30, 1, None]


def test_preview_reads_only_the_rows_it_shows_and_names_a_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\n{"id": 3}\n{"id": \n', encoding="utf-8")
    dataset = JSONLinesDataset(filepath=str(path))
    assert dataset.preview(nrows=3)["data"] == [[1], [2], [3]]
    with pytest.raises(DatasetError, match=r"bad\.jsonl:4: malformed JSON"):
        dataset.preview(nrows=5)


def test_preview_through_kedro_viz_with_the_catalog_preview_args(tmp_path):
    from kedro_viz.models.flowchart.node_metadata import DataNodeMetadata
    from kedro_viz.models.flowchart.nodes import GraphNode

    filepath = str(tmp_path / "trajectories.jsonl")
    metadata = {"kedro-viz": {"layer": "model_output", "preview_args": {"nrows": 3, "columns": ["answer", "id"]}}}
    JSONLinesDataset(filepath=filepath, version=Version(None, None)).save([trajectory(i) for i in range(8)])
    dataset = JSONLinesDataset(filepath=filepath, version=Version(None, None), metadata=metadata)
    node = GraphNode.create_data_node("id", "trajectories", "model_output", set(), dataset, set())
    shown = DataNodeMetadata(data_node=node)
    assert shown.preview_type == "TablePreview"  # the frontend renders it as a table
    assert len(shown.preview["data"]) == 3 and shown.preview["columns"] == ["answer", "id"]
