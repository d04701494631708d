"""Project hooks: strict parameter validation and MLflow tracking of every ``kedro run``."""

from __future__ import annotations

import importlib
import json
import logging
import pkgutil
from pathlib import Path
from typing import Any

import mlflow
from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, DataCatalog
from kedro.pipeline import Pipeline

import prorag.pipelines
from prorag.config import ParameterError, parse_parameters, validate_parameters
from prorag.datasets import DirectoryDataset
from prorag.tracking import TrackingParams, default_tracking_uri, flatten, git_sha, metric_series, redact

logger = logging.getLogger(__name__)

_MLFLOW_PARAM_VALUE_LIMIT = 6000
_MLFLOW_BATCH = 100


def import_parameter_schemas() -> None:
    """Import every pipeline's ``nodes`` module so that all parameter schemas are registered."""
    for module in pkgutil.iter_modules(prorag.pipelines.__path__):
        if module.ispkg:
            importlib.import_module(f"prorag.pipelines.{module.name}.nodes")


def _parameters(catalog: DataCatalog) -> dict[str, Any]:
    return catalog.load("parameters") if "parameters" in catalog else {}


class ParameterValidationHook:
    """Fails a run before any node runs when a parameter key is unknown or a value has the wrong type."""

    @hook_impl(tryfirst=True)  # before the tracking hook opens an MLflow run for a run that cannot start
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline,
                            catalog: DataCatalog) -> None:
        import_parameter_schemas()
        validate_parameters(_parameters(catalog))


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
            mlflow.set_tag("error", f"{type(error).__name__}: {error}"[:5000])
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
