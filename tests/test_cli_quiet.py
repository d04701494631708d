"""A quiet ``kedro run`` terminal (issue 46, item 5): Kedro's start-up lines ("Using 'conf/logging.yml' as logging
configuration", "Kedro project prorag", "Using synchronous mode …") and the catalog's load/save lines stay in
info.log; ``--verbose`` prints them all."""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from prorag.cli import ChatterFilter, release_startup_lines

ROOT = Path(__file__).resolve().parents[1]
STARTUP = "Using 'conf/logging.yml' as logging configuration."


def test_the_project_logging_file_buffers_kedros_startup_logger():
    config = yaml.safe_load((ROOT / "conf" / "logging.yml").read_text(encoding="utf-8"))
    startup = config["loggers"]["kedro.framework.project"]
    assert startup["propagate"] is False and set(startup["handlers"]) == {"startup_buffer", "info_file_handler"}
    assert config["handlers"]["startup_buffer"]["class"] == "logging.handlers.MemoryHandler"


@pytest.fixture
def terminal() -> Iterator[io.StringIO]:
    """A root terminal handler and Kedro's start-up logger wired as conf/logging.yml wires them."""
    root, startup = logging.getLogger(), logging.getLogger("kedro.framework.project")
    saved = root.handlers[:], root.level, startup.handlers[:], startup.propagate, startup.level
    stream = io.StringIO()
    root.handlers, startup.handlers = [logging.StreamHandler(stream)], []
    root.setLevel(logging.INFO)
    startup.setLevel(logging.INFO)
    startup.propagate = False
    startup.addHandler(logging.handlers.MemoryHandler(1000, flushLevel=100))
    startup.info("%s You can change this …", STARTUP)
    try:
        yield stream
    finally:
        root.handlers, root.level = saved[0], saved[1]
        startup.handlers, startup.propagate, startup.level = saved[2], saved[3], saved[4]


@pytest.mark.parametrize("verbose", [False, True])
def test_the_startup_line_is_printed_only_with_verbose(terminal, verbose):
    assert terminal.getvalue() == ""  # buffered, not printed
    release_startup_lines(verbose)
    assert (STARTUP in terminal.getvalue()) is verbose
    startup = logging.getLogger("kedro.framework.project")
    assert startup.propagate and not startup.handlers  # later records go through the root handlers
    release_startup_lines(True)  # released once
    assert terminal.getvalue().count(STARTUP) == int(verbose)


def test_the_chatter_filter_keeps_node_lines_and_warnings():
    def passes(name: str, message: str, level: int = logging.INFO) -> bool:
        return ChatterFilter().filter(logging.LogRecord(name, level, __file__, 1, message, None, None))

    assert not passes("kedro.io.data_catalog", "Loading data from passages (JSONLinesDataset)...")
    assert not passes("kedro.framework.session.session", "Kedro project prorag")
    assert not passes("kedro.framework.project", STARTUP)
    assert not passes("kedro.runner.sequential_runner", "Using synchronous mode for loading and saving data.")
    assert passes("kedro.runner.sequential_runner", "Completed 1 out of 13 tasks")
    assert passes("kedro.pipeline.node", "Running node: load_corpus_files")
    assert passes("kedro.io.data_catalog", "something is wrong", logging.WARNING)
    assert passes("prorag.training.sft", "SFT: 16 steps")


def _kedro_run(project: Path, *args: str) -> str:
    completed = subprocess.run([sys.executable, "-m", "kedro", "run", "--pipelines=data_preparation", *args],
                               cwd=project, capture_output=True, text=True, timeout=600,
                               env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "COLUMNS": "200",
                                    "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"})
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    return output


CHATTER = ("as logging configuration", "Kedro project prorag", "Using synchronous mode", "Loading data from")


@pytest.mark.integration
def test_a_kedro_run_prints_kedros_chatter_only_with_verbose(project_copy: Path):
    quiet = _kedro_run(project_copy)
    assert [line for line in CHATTER if line in quiet] == []
    assert "Completed node" in quiet or "Completed 1 out of" in quiet  # a line per node stays
    log = (project_copy / "info.log").read_text(encoding="utf-8")
    assert all(line in log for line in CHATTER)  # info.log keeps every record
    verbose = _kedro_run(project_copy, "--verbose")
    assert [line for line in CHATTER if line not in verbose] == []
