"""Where ``prorag serve`` takes its API key from: a file or the environment, the command line only with a warning
(it is visible in ``ps``)."""

from __future__ import annotations

import logging

import pytest

from prorag.serving.__main__ import build_parser, server_api_key


def _key(argv: list[str]) -> str | None:
    return server_api_key(build_parser().parse_args(["--model", "m", *argv]))


def test_the_key_comes_from_a_file_or_the_environment(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PRORAG_SERVE_API_KEY", "from-env")
    secret = tmp_path / "key"
    secret.write_text("from-file\n")
    with caplog.at_level(logging.WARNING):
        assert _key(["--api-key-file", str(secret)]) == "from-file"
        assert _key([]) == "from-env"
    assert "ps" not in caplog.text
    monkeypatch.delenv("PRORAG_SERVE_API_KEY")
    assert _key([]) is None


def test_a_key_on_the_command_line_is_warned_about_and_bad_files_are_refused(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert _key(["--api-key", "typed"]) == "typed"
    assert "visible to every user of this machine in `ps`" in caplog.text
    with pytest.raises(SystemExit, match="not both"):
        _key(["--api-key", "a", "--api-key-file", str(tmp_path / "k")])
    with pytest.raises(SystemExit, match="No such file"):
        _key(["--api-key-file", str(tmp_path / "missing")])
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SystemExit, match="is empty"):
        _key(["--api-key-file", str(tmp_path / "empty")])
