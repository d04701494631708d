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
