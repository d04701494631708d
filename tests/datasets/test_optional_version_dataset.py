"""OptionalVersionDataset: a versioned dataset read as an optional input (compare's adapters)."""

from __future__ import annotations

import pytest
from kedro.io.core import DatasetError, Version

from prorag.datasets import JSONLinesDataset, OptionalVersionDataset
from prorag.tracking.missing_inputs import Available, Missing


def test_it_loads_the_latest_or_pinned_version_or_missing(tmp_path):
    config = {"type": "prorag.datasets.JSONLinesDataset", "filepath": str(tmp_path / "adapter.jsonl")}
    assert isinstance(OptionalVersionDataset(dataset=config).load(), Missing)  # nothing saved yet
    for version in ("2026-01-01T00.00.00.000Z", "2026-01-02T00.00.00.000Z"):
        JSONLinesDataset(filepath=config["filepath"], version=Version(None, version)).save([{"v": version}])
    assert OptionalVersionDataset(dataset=config).load() == Available([{"v": "2026-01-02T00.00.00.000Z"}],
                                                                      "2026-01-02T00.00.00.000Z")
    pinned = JSONLinesDataset(filepath=config["filepath"], version=Version("2026-01-01T00.00.00.000Z", None))
    assert OptionalVersionDataset(dataset=pinned).load().version == "2026-01-01T00.00.00.000Z"
    assert OptionalVersionDataset(dataset=pinned, reason="x: only failed runs").load() == Missing("x: only failed runs")


def test_it_is_read_only_and_wraps_versioned_datasets_only(tmp_path):
    dataset = OptionalVersionDataset(dataset={"type": "prorag.datasets.JSONLinesDataset",
                                              "filepath": str(tmp_path / "a.jsonl")})
    with pytest.raises(DatasetError, match="read-only"):
        dataset.save([])
    with pytest.raises(DatasetError, match="needs a dataset 'type'"):
        OptionalVersionDataset(dataset={"filepath": "x"})
    with pytest.raises(DatasetError, match="wraps a versioned dataset"):
        OptionalVersionDataset(dataset=JSONLinesDataset(filepath=str(tmp_path / "b.jsonl")))


def test_it_always_exists(tmp_path):
    dataset = OptionalVersionDataset(dataset={"type": "prorag.datasets.JSONLinesDataset",
                                              "filepath": str(tmp_path / "never.jsonl")})
    assert dataset.exists() and isinstance(dataset.load(), Missing)
