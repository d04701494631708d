"""Project hooks: strict parameter validation, inputs from completed runs that belong together, and MLflow tracking
of every ``kedro run``."""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import mlflow
from kedro.config import MissingConfigException
from kedro.framework.context import KedroContext
from kedro.framework.hooks import hook_impl
from kedro.io import AbstractDataset, AbstractVersionedDataset, DataCatalog, DatasetError, Version
from kedro.pipeline import Node, Pipeline
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from pydantic import BaseModel

from prorag.config import ParameterError, parse_parameters, validate_parameters
from prorag.datasets import DirectoryDataset, OptionalVersionDataset
from prorag.datasets.optional_version_dataset import stored_versions
from prorag.tracking import (
    TrackingParams,
    default_tracking_uri,
    flatten,
    git_sha,
    metric_series,
    redact,
    redact_text,
)
from prorag.tracking.missing_inputs import (
    Available,
    PipelineShape,
    check_inputs_have_versions,
    missing_input_line,
    producers,
)
from prorag.tracking.model_reference import BackgroundUploads, log_model_folder
from prorag.tracking.run_manifest import (
    RunManifest,
    RunManifests,
    RunVersionError,
    choose_load_versions,
    process_alive,
)
from prorag.tracking.runs import (
    ADAPTER_TAG,
    BASE_MODEL_TAG,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    KIND_TAG,
    METHOD_METRICS_TABLE,
    METHOD_TAG,
    POLICY_TAG,
    PROTOCOL_TAG,
    STAGE_TAG,
    adapter_key,
    dataset_input,
    is_curated_method_metric,
    is_peft_adapter,
    is_rollout_records,
    recorded_policy,
    records_digest,
    rollout_policy,
    split_method_metrics,
    stage_name,
    ui_hint,
)
from prorag.tracking.traces import TraceRef, log_rollout_trace, log_verdicts, rollout_key, sample_rollouts

logger = logging.getLogger(__name__)

_MLFLOW_PARAM_VALUE_LIMIT = 6000
_MLFLOW_BATCH = 100
HOST_TAG = "prorag.host"
PID_TAG = "prorag.pid"
"""Tags of a parent run naming the process that runs it, so that the next run can mark it KILLED once it is gone."""
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
    """Fails a run before any node runs when a parameter key is unknown or a value has the wrong type.

    It validates as soon as the context exists, before Kedro's own typed-parameter check (which runs when the
    catalog is built and reports a bare pydantic error), so that a mistyped key gets :func:`validate_parameters`'
    message with the closest valid key; and again before the pipeline runs (hooks driven without a context).
    """

    @hook_impl(tryfirst=True)
    def after_context_created(self, context: KedroContext) -> None:
        from prorag.pipeline_registry import configured_methods
        from prorag.pipelines.parameter_schemas import (  # the one explicit list
            all_parameter_schemas,
            check_method_references,
        )

        try:
            parameters = context.config_loader["parameters"]  # raw, runtime parameters merged; not context.params
        except MissingConfigException:
            return
        # the shared blocks first: a method entry merges them, so a typo there would be reported again per method
        validate_parameters({key: value for key, value in parameters.items() if key != "methods"},
                            all_parameter_schemas())
        validate_parameters(parameters, all_parameter_schemas())
        try:
            catalog = context.config_loader["catalog"]
        except MissingConfigException:
            catalog = {}
        registered = configured_methods(Path(context.project_path)) if "methods" in parameters else None
        check_method_references(parameters, catalog, registered)

    @hook_impl(tryfirst=True)  # before the tracking hook opens an MLflow run for a run that cannot start
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline,
                            catalog: DataCatalog) -> None:
        from prorag.pipelines.parameter_schemas import all_parameter_schemas  # the one explicit list

        validate_parameters(_parameters(catalog), all_parameter_schemas())


class GpuPreflightHook:
    """Refuses, before any node (and before MLflow opens a run), a GPU run that cannot work: colliding GPUs or
    ports, a trainer process that would see several GPUs (it is given ``placement.trainer_gpu`` when CUDA is not
    initialised yet), a process that cannot fit its GPU (:func:`prorag.scale.preflight.preflight`). Runs after
    :class:`ParameterValidationHook` (both ``tryfirst``; registered before it in ``settings.HOOKS``)."""

    @hook_impl(tryfirst=True)
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline, catalog: DataCatalog) -> None:
        from prorag.scale.preflight import preflight

        preflight(_parameters(catalog))


class RunVersionHook:
    """Inputs from completed runs that belong together, and a manifest per run (issue 11, item 3).

    Before the pipeline runs, a versioned input with no saved version fails the run naming the registered
    pipelines that write it (:func:`~prorag.tracking.missing_inputs.check_inputs_have_versions`); every other
    versioned input without a ``--load-versions`` pin is pinned to the newest
    version saved by a *completed* run, and the chosen versions must share their lineage, else the run fails
    naming both versions (:func:`~prorag.tracking.run_manifest.choose_load_versions`). An optional input
    (:func:`optional_inputs`: compare's adapters) is pinned the same way, each on its own, and loads through an
    :class:`~prorag.datasets.OptionalVersionDataset`: ``Available(data, version)``, or ``Missing(reason)`` when no
    version is usable (none saved, or only by runs that did not complete). The run's manifest in
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
        for run_id in manifests.mark_lost():
            logger.warning("run %s was killed (its process is gone): its manifest now says killed", run_id)
        versioned = {name: dataset for name in sorted(pipeline.inputs())
                     if (dataset := _versioned(catalog, name)) is not None}
        available = {name: stored_versions(dataset) for name, dataset in versioned.items()}
        pins = run_params.get("load_versions") or {}
        refuse_pinned_outputs(pins, pipeline)
        optional = optional_inputs(pipeline) & set(versioned)
        required = {name: versions for name, versions in available.items() if name not in optional}
        check_inputs_have_versions([name for name, versions in required.items() if not versions and name not in pins],
                                   _registered_pipeline_shapes(), lambda name: _has_data(catalog, name))
        chosen = choose_load_versions(required, manifests, pins)
        for name, version in chosen.items():
            dataset = versioned[name]
            if dataset._version.load != version and available[name][:1] != [version]:
                _replace(catalog, name, dataset._copy(_version=Version(version, dataset._version.save)))
        for name in sorted(optional):
            version, reason = _optional_version(catalog, name, available[name], manifests, pins)
            dataset = versioned[name]
            if version is not None:
                chosen[name] = version
                dataset = dataset._copy(_version=Version(version, dataset._version.save))
            _replace(catalog, name, OptionalVersionDataset(dataset=dataset, reason=reason,
                                                           metadata=getattr(dataset, "metadata", None)))
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


def refuse_pinned_outputs(pins: Mapping[str, str], pipeline: Pipeline) -> None:
    """Refuses a ``--load-versions`` pin on a dataset that ``pipeline`` writes: Kedro would load the pinned (another
    run's) version wherever the run reads it back, beside this run's own outputs, and the manifest would record
    neither (issue 47, bug 7)."""
    written = sorted(set(pins) & pipeline.all_outputs())
    if written:
        pinned = ", ".join(f"{name}:{pins[name]}" for name in written)
        raise RunVersionError(f"--load-versions={pinned}: {', '.join(written)} "
                              f"{'is' if len(written) == 1 else 'are'} written by this run; --load-versions pins "
                              f"inputs only (run the pipelines that read it without the one that writes it)")


OPTIONAL_ARTIFACTS: Final = "artifacts"
"""The ``**kwargs`` parameter of a node function through which the node takes optional inputs (compare's
``run_compare_rollouts``: each trained adapter and the knowledge graph)."""


def optional_inputs(pipeline: Pipeline) -> set[str]:
    """The inputs that ``pipeline``'s nodes read only as optional: those a node passes to its function's
    ``**artifacts`` (:data:`OPTIONAL_ARTIFACTS`). An input that another node of the run needs stays required (e.g.
    ``sft_adapter`` in ``kedro run --pipelines=train_rl,compare``)."""
    optional: set[str] = set()
    required: set[str] = set()
    for node in pipeline.nodes:
        through = _optional_node_inputs(node)
        optional.update(through)
        required.update(set(node.inputs) - through)
    return optional - required


def _optional_node_inputs(node: Node) -> set[str]:
    parameters = inspect.signature(node.func).parameters.values()
    if not any(parameter.kind is parameter.VAR_KEYWORD and parameter.name == OPTIONAL_ARTIFACTS
               for parameter in parameters):
        return set()
    named = [parameter for parameter in parameters if parameter.kind is not parameter.VAR_KEYWORD]
    return set(node.inputs[len(named):])  # Kedro orders dict inputs as bound: the named ones, then **artifacts


def _optional_version(catalog: DataCatalog, name: str, stored: list[str], manifests: RunManifests,
                      pins: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The version an optional input loads — its ``--load-versions`` pin, else the newest version saved by a
    completed run — or None and why there is none (the inputs are independent, so lineages are not compared)."""
    version = pins.get(name) or next((version for version in stored if manifests.usable(version)), None)
    if version is not None:
        return version, None
    if stored:
        statuses = ", ".join(f"{version} ({manifests.status(version)})" for version in stored[:3])
        reason = (f"{name}: no stored version comes from a completed run ({statuses}); re-run its pipeline, or "
                  f"choose one with --load-versions={name}:<version>")
        logger.warning("%s", reason)
    else:  # never made: the node says what it skips
        reason = missing_input_line(name, producers(name, _registered_pipeline_shapes(),
                                                    lambda dataset: _has_data(catalog, dataset)))
    return None, reason


class _WithoutReplacingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Replacing dataset '%s'"


def _replace(catalog: DataCatalog, name: str, dataset: AbstractDataset) -> None:
    """``catalog[name] = dataset`` without Kedro's "Replacing dataset" warning: the hook replaces an input by the
    version it pins on purpose, and the warning would read as a problem on every run."""
    kedro_logger = logging.getLogger(DataCatalog.__module__)  # the catalog's own logger (its class may be derived)
    quiet = _WithoutReplacingWarning()
    kedro_logger.addFilter(quiet)
    try:
        catalog[name] = dataset
    finally:
        kedro_logger.removeFilter(quiet)


def _registered_pipeline_shapes() -> list[PipelineShape]:
    """The project's registered pipelines as :class:`PipelineShape` (none outside a Kedro project)."""
    from kedro.framework.project import pipelines

    return [PipelineShape(name, frozenset(dataset for dataset in pipe.inputs()
                                          if dataset != "parameters" and not dataset.startswith("params:")),
                          frozenset(pipe.all_outputs()), len(pipe.nodes))
            for name, pipe in pipelines.items()]


def _has_data(catalog: DataCatalog, name: str) -> bool:
    """Whether ``name`` can be loaded now: a saved version of a versioned dataset, else the dataset exists."""
    if name not in catalog:
        return False
    dataset = _versioned(catalog, name)
    return bool(dataset._get_versions()) if dataset is not None else catalog.exists(name)


def _versioned(catalog: DataCatalog, name: str) -> AbstractVersionedDataset | None:
    """The versioned dataset ``name`` of the catalog, or None (parameters, memory, unversioned, unknown)."""
    if name == "parameters" or name.startswith("params:") or name not in catalog:
        return None
    dataset = catalog.get(name)
    if isinstance(dataset, AbstractVersionedDataset) and dataset._version is not None:
        return dataset
    return None


class MlflowTrackingHook:
    """One parent MLflow run per ``kedro run``, with a child run per stage and per evaluated method.

    The tracking URI is ``MLFLOW_TRACKING_URI`` or ``sqlite:///<project>/mlflow.db``; the experiment is the
    ``tracking.experiment_name`` parameter, tagged as a model-development experiment. The *parent* run holds the
    Kedro session's tags, the parameters the pipeline reads (secrets redacted), system metrics, the question and
    corpus datasets as run inputs (``tracking.input_datasets``, with content digests), and the per-node timing.

    Children (:mod:`prorag.tracking.runs`): a *stage* run per pipeline stage (the node's namespace or pipeline
    package), active while its nodes run, so that training curves land in it, with its nodes' parameters,
    ``*_metrics`` outputs, report files (``data/08_reporting``) and models: a PEFT adapter saved by a
    ``DirectoryDataset`` is logged as an MLflow model and registered as ``<registered_model_prefix><dataset>``
    (:mod:`prorag.tracking.adapter_model`); other saved folders as plain artifacts. A *method* run per evaluated
    method holds its evaluation and judge metrics, and ``tracking.trace_samples`` of its rollouts as traces with
    the judge's verdicts (:mod:`prorag.tracking.traces`). A failed run is marked FAILED, a killed one KILLED.
    """

    def __init__(self) -> None:
        self._run_active = False
        self.run_hint: str | None = None
        """How to open the last finished run (its URL in the training view), for the result screen."""
        self._settings = TrackingParams()
        self._catalog: DataCatalog | None = None
        self._exit_handler_installed = False
        self._reset()

    def _reset(self) -> None:
        self._client_instance: MlflowClient | None = None
        self._parent_id = ""
        self._experiment_id = ""
        self._tracking_uri = ""
        self._parameters: dict[str, Any] = {}
        self._child_tags: dict[str, str] = {}
        self._stage_runs: dict[str, str] = {}
        self._method_runs: dict[str, str] = {}
        self._logged_params: dict[str, set[str]] = {}
        self._node_started: dict[str, int] = {}
        self._traces: dict[tuple[str, str, int], TraceRef] = {}
        self._adapter_names: dict[str, str] = {}
        self._logged_inputs: set[tuple[str, str]] = set()
        self._uploads = BackgroundUploads()

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
        from prorag.judges.limits import reset_usage

        reset_usage()  # the judge usage this run logs is its own, not that of earlier runs in this process
        if not self._settings.enabled:
            return
        self._reset()
        self._parameters = parameters
        project_path = Path(run_params.get("project_path") or Path.cwd())
        self._tracking_uri = default_tracking_uri(project_path)
        self._project_path = project_path
        mlflow.set_tracking_uri(self._tracking_uri)
        experiment = mlflow.set_experiment(self._settings.experiment_name)
        self._experiment_id = experiment.experiment_id
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # the UI then opens on the runs, not the GenAI pages
            self._client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        pipeline_names = run_params.get("pipeline_names") or ["__default__"]
        parent = mlflow.start_run(run_name=f"{'+'.join(pipeline_names)} {run_params['run_id']}",
                                  nested=mlflow.active_run() is not None,
                                  log_system_metrics=self._settings.system_metrics)
        self._parent_id = parent.info.run_id
        self._run_active = True
        self._mark_lost_runs()
        self._child_tags = {
            "kedro.session_id": run_params["run_id"],
            "kedro.pipeline": ",".join(pipeline_names),
            "kedro.env": run_params.get("env") or "local",
            "git.sha": git_sha(project_path) or "unknown",
        }
        owner = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
        base_model = _parameter(parameters, "policy.model")
        if base_model is not None:
            self._child_tags[BASE_MODEL_TAG] = redact_text(str(base_model))
        mlflow.set_tags({
            **self._child_tags,
            **owner,
            KIND_TAG: "pipeline",
            "kedro.version": str(run_params.get("kedro_version")),
            "kedro.runtime_params": json.dumps(redact(flatten(run_params.get("runtime_params") or {})),
                                               default=str),
        })
        self._child_tags.update({key: value for key, value in parent.data.tags.items()
                                 if key.startswith("mlflow.source.") or key == "mlflow.user"})
        self._log_params(self._parent_id, _used_parameters(pipeline.nodes, parameters))
        if not self._exit_handler_installed:
            _on_termination(self._end_killed_run)
            self._exit_handler_installed = True

    def _mark_lost_runs(self) -> None:
        """End as KILLED the runs of this experiment still RUNNING whose process on this host is gone (SIGKILL
        cannot be caught: such a run would stay RUNNING forever), with their open child runs."""
        try:
            runs = self._client.search_runs(
                [self._experiment_id], f"attributes.status = 'RUNNING' and tags.{HOST_TAG} = '{socket.gethostname()}'",
                max_results=200)
            for run in runs:
                pid = int(run.data.tags.get(PID_TAG, "0") or 0)
                if run.info.run_id == self._parent_id or process_alive(pid):
                    continue
                children = self._client.search_runs(
                    [self._experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}' and "
                                           "attributes.status = 'RUNNING'", max_results=1000)
                for child in children:
                    self._client.set_terminated(child.info.run_id, status="KILLED")
                self._client.set_tag(run.info.run_id, "error", f"the process {pid} on {socket.gethostname()} is gone "
                                     f"(SIGKILL or a crash); marked KILLED by run {self._parent_id}")
                self._client.set_terminated(run.info.run_id, status="KILLED")
                logger.warning("MLflow run %s was killed (process %d is gone): marked KILLED", run.info.run_id, pid)
        except Exception as error:  # tracking housekeeping never fails a run
            logger.warning("MLflow: could not check for killed runs: %s", redact_text(str(error)))

    @property
    def _client(self) -> MlflowClient:
        """The client of this run's store (made on first use: constructing one opens the store)."""
        if self._client_instance is None:
            self._client_instance = MlflowClient(self._tracking_uri or None)
        return self._client_instance

    @hook_impl
    def after_catalog_created(self, catalog: DataCatalog) -> None:
        self._catalog = catalog

    @hook_impl
    def after_dataset_loaded(self, dataset_name: str, data: Any, node: Node) -> None:
        if not self._run_active:
            return
        dataset = self._catalog.get(dataset_name) if self._catalog is not None and dataset_name in self._catalog \
            else None
        if isinstance(dataset, OptionalVersionDataset) and isinstance(data, Available):
            dataset, data = dataset.dataset, data.data
        if isinstance(data, str) and isinstance(dataset, DirectoryDataset):
            self._adapter_names[adapter_key(data)] = dataset_name
        if dataset_name in self._settings.input_datasets:
            self._log_input(dataset_name, data, _file_of(_local_path(self._catalog, dataset_name, saved=False)), node)
        if dataset_name.endswith("trajectories") and is_rollout_records(data):
            self._trace_rollouts(data, None, None)

    @hook_impl
    def before_node_run(self, node: Node) -> None:
        if not self._run_active:
            return
        self._node_started[node.name] = time.time_ns()
        run_id = self._stage_run(node)
        self._log_params(run_id, _used_parameters([node], self._parameters, with_tracking=False))
        mlflow.start_run(run_id=run_id, nested=True, log_system_metrics=False)  # training callbacks log here

    @hook_impl
    def after_node_run(self, node: Node, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        if not self._run_active:
            return
        stage_run = self._stage_run(node)
        for name, data in outputs.items():
            if name.endswith("_metrics"):
                self._log_metrics(stage_run, name, data)
            elif name.endswith("trajectories") and is_rollout_records(data):
                self._trace_rollouts(data, node, self._node_started.get(node.name))
        for name, data in outputs.items():
            if name.endswith("step_verdicts") and isinstance(data, list):
                rewards = next((value for key, value in outputs.items() if key.endswith("trajectory_rewards")), None)
                rollouts = next((value for value in inputs.values() if is_rollout_records(value)), [])
                self._safely("judge verdicts", self._log_verdicts, data, rollouts, rewards)
        self._safely("judge usage", self._log_judge_usage, stage_run)
        self._end_stage_run(stage_run, "FINISHED")

    def _log_judge_usage(self, stage_run: str) -> None:
        """The LLM judges' calls, tokens and estimated cost so far (:func:`prorag.judges.limits.usage_metrics`),
        on the stage run and the parent run."""
        from prorag.judges.limits import usage_metrics

        metrics = usage_metrics()
        if metrics:
            for run_id in {stage_run, self._parent_id}:
                _log_batch(self._client, run_id, [(key, value, None) for key, value in metrics.items()])

    @hook_impl
    def on_node_error(self, error: Exception, node: Node) -> None:
        if self._run_active:
            stage_run = self._stage_run(node)
            self._client.set_tag(stage_run, "error", redact_text(f"{type(error).__name__}: {error}")[:5000])
            self._end_stage_run(stage_run, "FAILED")

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any, node: Node | None) -> None:
        if not self._run_active:
            return
        saved = _local_path(self._catalog, dataset_name, saved=True)
        if dataset_name in self._settings.input_datasets:
            self._log_input(dataset_name, data, _file_of(saved), node)
        if saved is None:
            return
        dataset, path = saved
        run_id = self._stage_run(node) if node is not None else self._parent_id
        if isinstance(dataset, DirectoryDataset) and path.is_dir():
            self._adapter_names[adapter_key(str(path))] = dataset_name
        if not self._settings.log_artifacts:
            return
        if "08_reporting" in path.parts and path.is_file():
            self._client.log_artifact(run_id, str(path), artifact_path=f"reporting/{dataset_name}")
        elif path.is_dir() and isinstance(dataset, DirectoryDataset):
            if self._settings.log_models and is_peft_adapter(path):
                self._safely(f"the model of {dataset_name}", self._log_adapter, dataset_name, path, run_id)
            else:
                log_model_folder(self._client, run_id, path, dataset_name,
                                 max_artifact_mb=self._settings.max_artifact_mb,
                                 upload=self._settings.upload_large_models, uploads=self._uploads)

    @hook_impl
    def after_pipeline_run(self) -> None:
        if self._run_active:
            self._finish("FINISHED")

    @hook_impl
    def on_pipeline_error(self, error: Exception) -> None:
        if self._run_active:
            self._client.set_tag(self._parent_id, "error", redact_text(f"{type(error).__name__}: {error}")[:5000])
            self._finish("FAILED")

    def _end_killed_run(self) -> None:
        """At exit with the run still open (killed, Ctrl-C): mark it KILLED rather than leave it RUNNING."""
        if self._run_active:
            self._client.set_tag(self._parent_id, "error",
                                 "the process was killed or interrupted before the pipeline ended")
            self._finish("KILLED")

    def _finish(self, status: str) -> None:
        """End the open stage run, the method runs and the parent with ``status``; say how to open the run."""
        self._run_active = False
        self._uploads.join()  # background uploads of large models (tracking.upload_large_models) end first
        self._safely("traces", mlflow.flush_trace_async_logging)
        active = mlflow.active_run()
        while active is not None and active.info.run_id != self._parent_id:
            mlflow.end_run(status=status)
            active = mlflow.active_run()
        for run_id in self._method_runs.values():
            self._client.set_terminated(run_id, status=status)
        if active is not None:
            mlflow.end_run(status=status)
        else:
            self._client.set_terminated(self._parent_id, status=status)
        self.run_hint = ui_hint(self._tracking_uri, self._experiment_id, self._parent_id,
                                project_path=getattr(self, "_project_path", None))
        logger.info("MLflow run %s %s (%d stage and %d method runs); open it with: %s", self._parent_id,
                    status.lower(), len(self._stage_runs), len(self._method_runs), self.run_hint)

    def _safely(self, what: str, function: Callable[..., Any], *args: Any) -> None:
        """Tracking extras (traces, models, inputs) never fail a pipeline: an error is a warning."""
        try:
            function(*args)
        except Exception as error:  # any MLflow or file error: the run's own outputs are saved anyway
            logger.warning("MLflow: could not log %s: %s", what, redact_text(f"{type(error).__name__}: {error}"))

    def _child_run(self, name: str, tags: dict[str, str]) -> str:
        run = self._client.create_run(self._experiment_id, run_name=name,
                                      tags={**self._child_tags, **tags, MLFLOW_PARENT_RUN_ID: self._parent_id})
        return run.info.run_id

    def _stage_run(self, node: Node) -> str:
        """The run of the node's stage (created on first use)."""
        stage = _stage_of(node)
        if stage not in self._stage_runs:
            self._stage_runs[stage] = self._child_run(stage, {KIND_TAG: "stage", STAGE_TAG: stage})
        return self._stage_runs[stage]

    def _end_stage_run(self, run_id: str, status: str) -> None:
        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            mlflow.end_run(status=status)

    def _method_run(self, record: dict[str, Any], node: Node | None) -> str:
        """The run of a rollout's method (created on first use, tagged with the policy that produced it)."""
        method = str(record["method"])
        if method not in self._method_runs:
            policy, adapter, base_model = rollout_policy(record, self._adapter_names)
            tags = {KIND_TAG: "method", METHOD_TAG: method, POLICY_TAG: policy,
                    PROTOCOL_TAG: str(record.get("protocol"))}
            if adapter:
                tags[ADAPTER_TAG] = adapter
            if base_model:
                tags[BASE_MODEL_TAG] = redact_text(base_model)
            if node is not None:
                tags[STAGE_TAG] = _stage_of(node)
            self._method_runs[method] = run_id = self._child_run(f"{method} ({policy})", tags)
            if node is not None:
                used = _own_entry(_used_parameters([node], self._parameters, with_tracking=False), method)
                policy = used.get("policy")
                if isinstance(policy, BaseModel):  # Kedro 1.7 gives typed nodes their parameters as models
                    policy = policy.model_dump()
                if isinstance(policy, dict):  # the policy this method ran, not the node's base policy
                    used["policy"] = {**policy, **recorded_policy(record)}
                self._log_params(run_id, used)
        return self._method_runs[method]

    def _log_metrics(self, stage_run: str, name: str, data: Any) -> None:
        """A ``*_metrics`` output: per-method parts to the method runs, the rest to the stage run."""
        split = split_method_metrics(name, data)
        if split is None:
            _log_batch(self._client, stage_run, metric_series(name, data))
            return
        prefix, methods, rest = split
        for method, values in methods.items():
            if method not in self._method_runs:
                self._method_runs[method] = self._child_run(method, {KIND_TAG: "method", METHOD_TAG: method})
            series = list(metric_series(f"{prefix}_metrics", values))
            _log_batch(self._client, self._method_runs[method],
                       [item for item in series if is_curated_method_metric(item[0])])
            self._safely("the metrics table", self._log_metrics_table, self._method_runs[method], name, series)
        _log_batch(self._client, stage_run, metric_series(name, rest))

    def _log_metrics_table(self, run_id: str, output: str, series: list[tuple[str, float, int | None]]) -> None:
        """Every number of a method's part of ``output`` as rows of the run's table artifact (appended: a method
        run gets the evaluation's and the judge's)."""
        if series:
            self._client.log_table(run_id, {"key": [key for key, _, _ in series],
                                            "value": [value for _, value, _ in series],
                                            "curated": [is_curated_method_metric(key) for key, _, _ in series],
                                            "output": [output] * len(series)}, METHOD_METRICS_TABLE)

    def _trace_rollouts(self, records: list[dict[str, Any]], node: Node | None, started_ns: int | None) -> None:
        """Method runs for the rollouts' methods, and a trace for each sampled rollout not traced yet."""
        for record in records:
            if str(record["method"]) not in self._method_runs:
                self._method_run(record, node)
        if self._settings.trace_samples:
            self._safely("rollout traces", self._log_traces, records, started_ns)

    def _log_traces(self, records: list[dict[str, Any]], started_ns: int | None) -> None:
        """Traces of the sampled rollouts, in their method runs, within the producing node's wall time (if known)."""
        now = time.time_ns()
        for record in sample_rollouts(records, self._settings.trace_samples):
            key = rollout_key(record)
            if key not in self._traces:
                self._traces[key] = log_rollout_trace(
                    record, experiment_id=self._experiment_id, run_id=self._method_runs[key[0]],
                    start_ns=started_ns or now, end_ns=now, measured=started_ns is not None,
                    tags={POLICY_TAG: rollout_policy(record, self._adapter_names)[0]})

    def _log_verdicts(self, verdicts: list[dict[str, Any]], rollouts: list[dict[str, Any]], rewards: Any) -> None:
        """The judge's step verdicts and rewards as feedback on the traced rollouts they judge, labelled with the
        judges' kind (``llm`` when either detection judge is an LLM judge, else ``reference``)."""
        if not self._traces:
            return
        kinds = {str(_parameter(self._parameters, f"reward.{name}.kind") or "reference")
                 for name in ("over_search_judge", "under_search_judge")}
        judges = "llm" if "llm" in kinds else "reference"
        by_question: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for record in rollouts:
            by_question.setdefault((str(record["method"]), str(record["question_key"])), []).append(record)
        reward_of: dict[tuple[str, str, int], float] = {}
        if rewards is not None and hasattr(rewards, "to_dict"):
            for row in rewards.to_dict("records"):
                if row.get("reward") is not None and row["reward"] == row["reward"]:  # not NaN
                    reward_of[(str(row["method"]), str(row["question_key"]), int(row.get("sample_index") or 0))] = \
                        float(row["reward"])
        seen: dict[tuple[str, str], int] = {}
        for verdict in verdicts:
            question = (str(verdict.get("method")), str(verdict.get("question_key")))
            occurrence = seen[question] = seen.get(question, -1) + 1
            candidates = by_question.get(question, [])
            record = candidates[occurrence] if occurrence < len(candidates) else None
            key = rollout_key(record) if record is not None else (*question, occurrence)
            if key in self._traces:
                log_verdicts(self._traces[key], verdict, record.get("steps") if record else None,
                             reward_of.get(key), judge_kind=judges)

    def _log_adapter(self, dataset_name: str, path: Path, run_id: str) -> None:
        """Log (and register) the PEFT adapter at ``path`` as an MLflow model in ``run_id``."""
        from prorag.tracking.adapter_model import log_adapter_model  # pulls in mlflow.pyfunc: only when needed

        base_model = str(_parameter(self._parameters, "policy.model") or "")
        if not base_model:
            logger.warning("MLflow: %s is not logged as a model: no policy.model parameter names its base",
                           dataset_name)
            self._client.log_artifacts(run_id, str(path), artifact_path=f"models/{dataset_name}")
            return
        if Path(base_model).expanduser().exists():
            logger.warning("MLflow: the model %s refers to its base by the local path %s, which other machines "
                           "may not have", dataset_name, base_model)
        prefix = self._settings.registered_model_prefix
        info = log_adapter_model(path, base_model=base_model, run_id=run_id, name=dataset_name,
                                 dtype=str(_parameter(self._parameters, "policy.dtype") or "float32"),
                                 registered_model_name=None if prefix is None else f"{prefix}{dataset_name}",
                                 tags={**self._child_tags, ADAPTER_TAG: dataset_name})
        if info.registered_model_version is not None and prefix is not None:
            for key, value in {"kedro.session_id": self._child_tags["kedro.session_id"], BASE_MODEL_TAG: base_model,
                               ADAPTER_TAG: dataset_name}.items():
                self._client.set_model_version_tag(f"{prefix}{dataset_name}", str(info.registered_model_version),
                                                   key, value)
        logger.info("MLflow: %s logged as model %s%s", dataset_name, info.model_uri,
                    "" if prefix is None else f", registered as {prefix}{dataset_name} "
                                              f"v{info.registered_model_version}")

    def _log_input(self, dataset_name: str, data: Any, path: str | None, node: Node | None) -> None:
        """A question or corpus dataset as an input of the parent run, once per file (or content)."""
        identity = (dataset_name, path or records_digest(data if isinstance(data, list) else [repr(data)]))
        if identity in self._logged_inputs:
            return
        self._logged_inputs.add(identity)
        context = "pipeline" if node is None else _stage_of(node)
        self._safely(f"the input {dataset_name}", lambda: self._client.log_inputs(
            self._parent_id, datasets=[dataset_input(dataset_name, data, path, context)]))

    def _log_params(self, run_id: str, parameters: dict[str, Any]) -> None:
        logged = self._logged_params.setdefault(run_id, set())
        flat = redact(flatten(parameters))
        items = [Param(key, _param_value(value)) for key, value in sorted(flat.items()) if key not in logged]
        for start in range(0, len(items), _MLFLOW_BATCH):
            self._client.log_batch(run_id, params=items[start:start + _MLFLOW_BATCH])
        logged.update(item.key for item in items)


def _log_batch(client: MlflowClient, run_id: str, series: Iterable[tuple[str, float, int | None]]) -> None:
    """Log ``(key, value, step)`` metrics in batches (MLflow takes at most 1000 per call)."""
    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, step or 0) for key, value, step in series]
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start:start + 1000])


def _stage_of(node: Node) -> str:
    """The node's stage (:func:`~prorag.tracking.runs.stage_name`): its namespace, else its pipeline package."""
    function = node.func
    while isinstance(function, functools.partial):
        function = function.func
    return stage_name(getattr(function, "__module__", None), node.namespace, node.name)


def _parameter(parameters: Any, dotted: str) -> Any:
    """``parameters["a"]["b"]`` for ``"a.b"`` (mappings or pydantic models), None when absent."""
    value = parameters
    for part in dotted.split("."):
        if isinstance(value, BaseModel):
            value = getattr(value, part, None)
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _used_parameters(nodes: Iterable[Node], parameters: dict[str, Any], with_tracking: bool = True,
                     ) -> dict[str, Any]:
    """The parameter namespaces these nodes read (``params:x`` inputs), plus ``tracking``."""
    used: dict[str, Any] = {}
    for name in {name for node in nodes for name in node.inputs}:
        if name == "parameters":
            return dict(parameters)
        if name.startswith("params:"):
            path = name.removeprefix("params:").split(".")
            value: Any = parameters
            for part in path:
                value = value[part]
            used[".".join(path)] = value
    if with_tracking and "tracking" in parameters:
        used["tracking"] = parameters["tracking"]
    return used


def _own_entry(used: dict[str, Any], method: str) -> dict[str, Any]:
    """``used`` with each list of named entries (``rollout.methods``, ``compare.arms``) cut to ``method``'s own, so
    the run of ``direct`` does not carry the agent's settings of its sibling methods."""
    def own(key: str, items: Any) -> Any:
        if key not in ("methods", "arms") or not isinstance(items, list):
            return items
        if not all(isinstance(item, dict) and "name" in item for item in items):
            return items
        mine = [item for item in items if item["name"] == method]
        return mine or items  # a list without this method's entry is kept whole

    return {block: {key: own(key, items) for key, items in value.items()} if isinstance(value, dict) else value
            for block, value in used.items()}


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _MLFLOW_PARAM_VALUE_LIMIT else text[: _MLFLOW_PARAM_VALUE_LIMIT - 3] + "..."


SMOKE_STEPS: Final = 50
"""Fewer optimizer steps than this in every trainer of a run, and the result screen calls the run a smoke run."""


class ResultScreenHook:
    """The run ends on its result: the evaluation summaries it saved (``*evaluation_summary``: CEM with its
    interval, format, retrievals, tokens, the paired Δ against standard RAG) are printed after everything else,
    with where the files are and how to open MLflow and kedro-viz."""

    def __init__(self, tracking: MlflowTrackingHook | None = None) -> None:
        self._tracking = tracking
        self._catalog: DataCatalog | None = None
        self._summaries: list[tuple[str, str, Path | None]] = []
        self._trained: list[tuple[str, int]] = []
        """(stage, optimizer steps) of every trainer whose log this run saved."""

    @hook_impl
    def before_pipeline_run(self, catalog: DataCatalog) -> None:
        self._catalog, self._summaries, self._trained = catalog, [], []

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if dataset_name.endswith(("training_log", "sft_metrics")) and isinstance(data, list):
            steps = [int(entry["step"]) for entry in data if isinstance(entry, dict) and "step" in entry]
            self._trained.append((dataset_name.removesuffix("_training_log").removesuffix("_metrics"),
                                  max(steps, default=0)))
        if dataset_name.endswith("evaluation_summary") and isinstance(data, str):
            located = _local_path(self._catalog, dataset_name, saved=True)
            self._summaries.append((dataset_name, data, None if located is None else located[1]))

    @hook_impl
    def after_pipeline_run(self) -> None:
        if not self._summaries:
            return
        lines = [""]
        for name, text, path in self._summaries:
            lines += [f"{name}{f' ({path})' if path else ''}:", text]
        if self._trained:
            trained = ", ".join(f"{stage} {steps} step{'s' if steps != 1 else ''}" for stage, steps in self._trained)
            short = max(steps for _, steps in self._trained) < SMOKE_STEPS
            lines.append(f"Trained in this run: {trained}." + (
                f" Under {SMOKE_STEPS} optimizer steps this is a smoke run of the pipeline (the papers train for "
                "hundreds): the table shows what these steps produced, not what the method can do." if short
                else ""))
        hint = self._tracking.run_hint if self._tracking is not None else None
        lines += ["Tables and reports: data/08_reporting/ (evaluation.csv, node_timing.md, ...)",
                  f"This run in MLflow: {hint}" if hint else "Runs, curves and traces: make mlflow-ui "
                  "(http://127.0.0.1:5000)", "Pipelines: make viz (http://127.0.0.1:4141)", ""]
        sys.stdout.write("\n".join(lines))
        sys.stdout.flush()


def _local_path(catalog: DataCatalog | None, dataset_name: str, *, saved: bool) -> tuple[Any, Path] | None:
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


def _file_of(located: tuple[Any, Path] | None) -> str | None:
    """The path of a :func:`_local_path` result when it is a file (what a dataset input digests), else None."""
    return str(located[1]) if located is not None and located[1].is_file() else None
