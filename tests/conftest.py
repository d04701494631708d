"""Shared fixtures: offline, telemetry off, a throw-away MLflow store, and isolated copies of the project."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PRORAG_CACHE_DIR", str(PROJECT_ROOT / ".cache" / "prorag"))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for a test module: faster and steadier for small models on a shared 2-core
    machine; the previous setting is restored afterwards."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh SQLite MLflow store for one test, exported as ``MLFLOW_TRACKING_URI``.

    MLflow keeps the tracking URI and the active experiment as process globals (a Kedro run in an earlier
    test sets both), so they are pointed at the fresh store here and cleared afterwards.
    """
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("Default")
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture
def project_copy(tmp_path: Path) -> Iterator[Path]:
    """The project's configuration and metadata in a temporary folder, with the raw data linked in.

    Kedro runs in it write their versioned outputs there instead of into the working tree.
    """
    root = tmp_path / "project"
    root.mkdir()
    for name in ("pyproject.toml", ".kedro.yml", ".telemetry"):
        shutil.copy2(PROJECT_ROOT / name, root / name)
    shutil.copytree(PROJECT_ROOT / "conf", root / "conf", ignore=shutil.ignore_patterns("credentials.yml"))
    (root / "src").mkdir()  # the package itself is imported from the installed (editable) project
    (root / "data").mkdir()
    (root / "data" / "01_raw").symlink_to(PROJECT_ROOT / "data" / "01_raw")
    previous = Path.cwd()
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(previous)
