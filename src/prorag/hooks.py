"""Project hooks: strict parameter validation, inputs from completed runs that belong together, and MLflow tracking
of every ``kedro run``."""

from __future__ import annotations

import atexit
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import mlflow
from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, DataCatalog, Version
from kedro.pipeline import Pipeline

from prorag.config import ParameterError, parse_parameters, validate_parameters
from prorag.datasets import DirectoryDataset
from prorag.tracking import (
    TrackingParams,
    default_tracking_uri,
    flatten,
    git_sha,
    metric_series,
    redact,
    redact_text,
)
from prorag.tracking.run_manifest import RunManifest, RunManifests, choose_load_versions

logger = logging.getLogger(__name__)

_MLFLOW_PARAM_VALUE_LIMIT = 6000
_MLFLOW_BATCH = 100
RUN_MANIFEST_DIR = Path("data") / "runs"
"""Where run manifests live, relative to the project root (see :mod:`prorag.tracking.run_manifest`)."""


def _on_termination(callback: Callable[[], None]) -> None:
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


def _parameters(catalog: DataCatalog) -> dict[str, Any]:
    return catalog.load("parameters") if "parameters" in catalog else {}


class ParameterValidationHook:
    """Fails a run before any node runs when a parameter key is unknown or a value has the wrong type."""

    @hook_impl(tryfirst=True)  # before the tracking hook opens an MLflow run for a run that cannot start
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline,
                            catalog: DataCatalog) -> None:
        from prorag.pipelines.parameter_schemas import all_parameter_schemas  # the one explicit list

        validate_parameters(_parameters(catalog), all_parameter_schemas())


class RunVersionHook:
    """Inputs from completed runs that belong together, and a manifest per run (issue 11, item 3).

    Before the pipeline runs, every versioned input without a ``--load-versions`` pin is pinned to the newest
    version saved by a *completed* run, and the chosen versions must share their lineage, else the run fails
    naming both versions (:func:`~prorag.tracking.run_manifest.choose_load_versions`). The run's manifest in
    :data:`RUN_MANIFEST_DIR` records what it loaded and saved and ends ``completed``, ``failed`` or ``killed``.
    """

    def __init__(self) -> None:
        self._catalog: DataCatalog | None = None
        self._manifests: RunManifests | None = None
        self._manifest: RunManifest | None = None
        self._exit_handler_installed = False

    @hook_impl
    def after_catalog_created(self, catalog: DataCatalog) -> None:
        self._catalog = catalog

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline, catalog: DataCatalog) -> None:
        project_path = Path(run_params.get("project_path") or Path.cwd())
        self._manifests = manifests = RunManifests(project_path / RUN_MANIFEST_DIR)
        versioned = {name: dataset for name in sorted(pipeline.inputs())
                     if (dataset := _versioned(catalog, name)) is not None}
        # Kedro 1.7 has no public listing of a dataset's stored versions; _get_versions is its own (newest first).
        available = {name: [PurePosixPath(path).parent.name for path in dataset._get_versions()]
                     for name, dataset in versioned.items()}
        chosen = choose_load_versions(available, manifests, run_params.get("load_versions") or {})
        for name, version in chosen.items():
            dataset = versioned[name]
            if dataset._version.load != version and available[name][:1] != [version]:
                catalog[name] = dataset._copy(_version=Version(version, dataset._version.save))
        self._manifest = RunManifest(run_id=run_params["run_id"], pipelines=run_params.get("pipeline_names")
                                     or ["__default__"], loaded=chosen)
        manifests.write(self._manifest)
        if not self._exit_handler_installed:
            _on_termination(self._mark_killed)
            self._exit_handler_installed = True

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        if self._manifest is None or self._catalog is None:
            return
        dataset = _versioned(self._catalog, dataset_name)
        if dataset is not None:
            self._manifest.saved[dataset_name] = dataset.resolve_save_version() or self._manifest.run_id

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._finish("completed")

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._finish("failed")

    def _mark_killed(self) -> None:
        self._finish("killed")

    def _finish(self, status: Literal["completed", "failed", "killed"]) -> None:
        if self._manifest is None or self._manifests is None:
            return
        self._manifest.status = status
        self._manifest.finished_at = time.time()
        self._manifests.write(self._manifest)
        self._manifest = None


def _versioned(catalog: DataCatalog, name: str) -> AbstractVersionedDataset | None:
    """The versioned dataset ``name`` of the catalog, or None (parameters, memory, unversioned, unknown)."""
    if name == "parameters" or name.startswith("params:") or name not in catalog:
        return None
    dataset = catalog.get(name)
    if isinstance(dataset, AbstractVersionedDataset) and dataset._version is not None:
        return dataset
    return None


class MlflowTrackingHook:
    """One MLflow run per ``kedro run``: parameters used, tags linking to the Kedro session, node metrics.

    The tracking URI is ``MLFLOW_TRACKING_URI`` or ``sqlite:///<project>/mlflow.db``; the experiment name is the
    ``tracking.experiment_name`` parameter. Node outputs whose name ends in ``_metrics`` are logged as
    metrics; files saved under ``data/08_reporting`` and folders saved by a ``DirectoryDataset`` (the LoRA
    adapters) are logged as artifacts, each from its own save version; a failed run is marked FAILED.
    """

    def __init__(self) -> None:
        self._run_active = False
        self._settings = TrackingParams()
        self._catalog: DataCatalog | None = None
        self._exit_handler_installed = False

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline,
                            catalog: DataCatalog) -> None:
        parameters = _parameters(catalog)
        tracking = parameters.get("tracking")
        try:
            self._settings = (tracking if isinstance(tracking, TrackingParams)
                              else parse_parameters(TrackingParams, tracking, "tracking"))
        except ParameterError:
            return  # ParameterValidationHook reports it; nothing to track for a run that will not start
        if not self._settings.enabled:
            return
        project_path = Path(run_params.get("project_path") or Path.cwd())
        mlflow.set_tracking_uri(default_tracking_uri(project_path))
        mlflow.set_experiment(self._settings.experiment_name)
        pipeline_names = run_params.get("pipeline_names") or ["__default__"]
        mlflow.start_run(run_name=f"{'+'.join(pipeline_names)} {run_params['run_id']}",
                         nested=mlflow.active_run() is not None)
        self._run_active = True
        mlflow.set_tags({
            "kedro.session_id": run_params["run_id"],
            "kedro.pipeline": ",".join(pipeline_names),
            "kedro.env": run_params.get("env") or "local",
            "kedro.version": str(run_params.get("kedro_version")),
            "kedro.runtime_params": json.dumps(redact(flatten(run_params.get("runtime_params") or {})),
                                               default=str),
            "git.sha": git_sha(project_path) or "unknown",
        })
        self._log_params(_used_parameters(pipeline, parameters))
        if not self._exit_handler_installed:
            _on_termination(self._end_killed_run)
            self._exit_handler_installed = True

    def _end_killed_run(self) -> None:
        """At exit with the run still open (killed, Ctrl-C): mark it KILLED rather than leave it RUNNING."""
        if self._run_active:
            self._run_active = False
            mlflow.set_tag("error", "the process was killed or interrupted before the pipeline ended")
            mlflow.end_run(status="KILLED")

    @hook_impl
    def after_node_run(self, outputs: dict[str, Any]) -> None:
        if not self._run_active:
            return
        for name, data in outputs.items():
            if not name.endswith("_metrics"):
                continue
            for key, value, step in metric_series(name, data):
                mlflow.log_metric(key, value, step=step)

    @hook_impl
    def after_catalog_created(self, catalog: DataCatalog) -> None:
        self._catalog = catalog

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        if not (self._run_active and self._settings.log_artifacts):
            return
        saved = _saved_local_path(self._catalog, dataset_name)
        if saved is None:
            return
        dataset, path = saved
        if "08_reporting" in path.parts and path.is_file():
            mlflow.log_artifact(str(path), artifact_path=f"reporting/{dataset_name}")
        elif path.is_dir() and isinstance(dataset, DirectoryDataset):
            mlflow.log_artifacts(str(path), artifact_path=f"models/{dataset_name}")

    @hook_impl
    def after_pipeline_run(self) -> None:
        if self._run_active:
            mlflow.end_run(status="FINISHED")
            self._run_active = False

    @hook_impl
    def on_pipeline_error(self, error: Exception) -> None:
        if self._run_active:
            mlflow.set_tag("error", redact_text(f"{type(error).__name__}: {error}")[:5000])
            mlflow.end_run(status="FAILED")
            self._run_active = False

    def _log_params(self, parameters: dict[str, Any]) -> None:
        flat = redact(flatten(parameters))
        items = [(key, _param_value(value)) for key, value in sorted(flat.items())]
        for start in range(0, len(items), _MLFLOW_BATCH):
            mlflow.log_params(dict(items[start:start + _MLFLOW_BATCH]))


def _used_parameters(pipeline: Pipeline, parameters: dict[str, Any]) -> dict[str, Any]:
    """The parameter namespaces this pipeline's nodes read (``params:x`` inputs), plus ``tracking``."""
    used: dict[str, Any] = {}
    for name in {name for node in pipeline.nodes for name in node.inputs}:
        if name == "parameters":
            return dict(parameters)
        if name.startswith("params:"):
            path = name.removeprefix("params:").split(".")
            value: Any = parameters
            for part in path:
                value = value[part]
            used[".".join(path)] = value
    if "tracking" in parameters:
        used["tracking"] = parameters["tracking"]
    return used


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _MLFLOW_PARAM_VALUE_LIMIT else text[: _MLFLOW_PARAM_VALUE_LIMIT - 3] + "..."


def _saved_local_path(catalog: DataCatalog | None, dataset_name: str) -> tuple[Any, Path] | None:
    """The dataset and the local file or folder it just wrote (its save version when versioned), else None."""
    if catalog is None or dataset_name not in catalog:
        return None
    dataset = catalog.get(dataset_name)
    filepath = getattr(dataset, "_filepath", None)
    if filepath is None or getattr(dataset, "_protocol", "file") != "file":
        return None
    if isinstance(dataset, AbstractVersionedDataset) and dataset._version is not None:
        path = Path(str(dataset._get_versioned_path(dataset.resolve_save_version())))
    else:
        path = Path(str(filepath))
    return (dataset, path) if path.exists() else None
