"""The raw-layer dataset: a read-only listing of a folder; the configured files are checked against it."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.io import DatasetError

from prorag.data import DataFileError, RawFiles
from prorag.datasets import RawFilesDataset


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "qa"
    folder.mkdir()
    for name in ("b.jsonl", "a.jsonl", "notes.md"):
        (folder / name).write_text("{}\n")
    return folder


def test_loads_the_listing_of_matching_files(tmp_path):
    folder = _folder(tmp_path)
    dataset = RawFilesDataset(filepath=str(folder))
    assert dataset.load() == RawFiles(folder, ("a.jsonl", "b.jsonl"))
    assert dataset.exists()
    assert dataset._describe() == {"filepath": str(folder), "pattern": "*.jsonl"}


def test_a_missing_folder_is_empty_not_an_error(tmp_path):
    dataset = RawFilesDataset(filepath=str(tmp_path / "absent"))
    assert dataset.load().names == () and not dataset.exists()


def test_saving_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="read-only"):
        RawFilesDataset(filepath=str(tmp_path)).save(RawFiles(tmp_path))


def test_check_accepts_files_anywhere_and_names_the_key_of_a_missing_one(tmp_path):
    raw = RawFiles.scan(_folder(tmp_path))
    elsewhere = tmp_path / "held_out.jsonl"
    elsewhere.write_text("{}\n")
    raw.check([elsewhere, tmp_path / "qa" / "a.jsonl"], "data_preparation.question_files")
    with pytest.raises(DataFileError, match=r"c\.jsonl: file not found \(listed in parameter "
                                            r"'data_preparation\.question_files'; .*qa has: a\.jsonl, b\.jsonl\)"):
        raw.check([tmp_path / "qa" / "c.jsonl"], "data_preparation.question_files")
    with pytest.raises(DataFileError, match="not a regular file"):
        raw.check([tmp_path], "k")
