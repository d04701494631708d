"""Bad data files fail with file and line (issue 32, bug 7): a lone surrogate, a 5,000-digit integer, 100k-deep
nesting, and (weak point) a record over the size limit, which is never read whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.data import load_passages
from prorag.data.jsonl import DataFileError, read_jsonl

GOOD = b'{"id": "p1", "title": "T", "text": "fine"}\n'


@pytest.mark.parametrize(("line", "reason"), [
    (b'{"id": "p2", "title": "T", "text": "bad \\ud800"}', r"field text: invalid Unicode \(lone surrogate U\+D800"),
    (b'{"id": "p2", "title": "T", "text": "x", "n": ' + b"9" * 5000 + b"}", "unreadable JSON value: .*4300"),
    (b'{"id": "p2", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON nested too deeply"),
])
def test_a_bad_record_names_file_and_line(tmp_path: Path, line: bytes, reason: str):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(GOOD + line + b"\n")
    with pytest.raises(DataFileError, match=rf"corpus.jsonl:2: {reason}"):
        read_jsonl(path)
    with pytest.raises(DataFileError, match=rf"corpus.jsonl:2: {reason}"):
        load_passages(path)  # what data preparation validates with: the bad record never reaches a save


def test_a_record_over_the_size_limit_is_refused_without_reading_it_whole(tmp_path: Path):
    from prorag.data.jsonl import parse_jsonl_lines

    path = tmp_path / "big.jsonl"
    path.write_bytes(GOOD + b'{"text": "' + b"x" * (4 << 20) + b'"}\n')
    with path.open("rb") as handle, pytest.raises(DataFileError, match=r"big.jsonl:2: a record longer than 1048576"):
        list(parse_jsonl_lines(handle, path, max_record_bytes=1 << 20))
    with path.open("rb") as handle:
        rows = parse_jsonl_lines(handle, path, max_record_bytes=1 << 20)
        next(rows)
        with pytest.raises(DataFileError):
            next(rows)
        assert handle.tell() <= len(GOOD) + (1 << 20) + 2  # stopped at the limit, not at the end of the line
