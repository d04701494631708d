"""What the run's hooks share: the run's parameters from its catalog, exit handling that also catches SIGTERM and
SIGHUP, and the local file a dataset was loaded from or saved to."""

from __future__ import annotations

import atexit
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kedro.io import AbstractVersionedDataset, DataCatalog, DatasetError


def on_termination(callback: Callable[[], None]) -> None:
    """Call ``callback`` when the process exits, including on SIGTERM/SIGHUP (turned into ``SystemExit`` so that
    exit handlers run) and Ctrl-C (Kedro calls ``on_pipeline_error`` only for ``Exception``s). SIGKILL cannot be
    caught: such a run stays RUNNING / ``running``, which is still never *completed*."""
    atexit.register(callback)  # registered after MLflow's own exit handler, so it runs first
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _exit_on_signal)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def catalog_parameters(catalog: DataCatalog) -> dict[str, Any]:
    return catalog.load("parameters") if "parameters" in catalog else {}



def local_path(catalog: DataCatalog | None, dataset_name: str, *, saved: bool) -> tuple[Any, Path] | None:
    """The dataset and the local file or folder it was just loaded from (its load version) or saved to (its save
    version), else None (memory, remote, unknown, no version to load)."""
    if catalog is None or dataset_name not in catalog:
        return None
    dataset = catalog.get(dataset_name)
    filepath = getattr(dataset, "_filepath", None)
    if filepath is None or getattr(dataset, "_protocol", "file") != "file":
        return None
    if isinstance(dataset, AbstractVersionedDataset) and dataset._version is not None:
        try:
            path = dataset._get_versioned_path(dataset.resolve_save_version()) if saved else dataset._get_load_path()
        except DatasetError:  # no version to load
            return None
    else:
        path = filepath
    path = Path(str(path))
    return (dataset, path) if path.exists() else None


def file_of(located: tuple[Any, Path] | None) -> str | None:
    """The path of a :func:`local_path` result when it is a file (what a dataset input digests), else None."""
    return str(located[1]) if located is not None and located[1].is_file() else None
