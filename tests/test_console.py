"""The command-line entry points: ``prorag --version`` and help texts that document every option."""

from __future__ import annotations

import argparse
from importlib.metadata import version

import pytest

from prorag.console import main
from prorag.retrieval.server import build_parser as retrieval_parser
from prorag.serving.__main__ import build_parser as serving_parser


def test_version_is_the_installed_distribution_s(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"prorag {version('prorag')}"


def test_top_level_help_lists_the_commands_and_points_to_kedro(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--version" in out and "models" in out and "serve" in out and "kedro run --pipelines=train" in out


@pytest.mark.parametrize("parser", [serving_parser, retrieval_parser], ids=["prorag serve", "retrieval server"])
def test_every_option_has_help(parser):
    undocumented = [action.option_strings for action in parser()._actions
                    if not isinstance(action, argparse._HelpAction) and not action.help]
    assert not undocumented


def test_retrieval_help_names_the_versioned_index_folder(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at the terminal's width
    help_text = retrieval_parser().format_help()
    assert "data/06_models/retrieval_index/<version>/retrieval_index" in help_text
