"""The MLflow tracking hook: one parent MLflow run per ``kedro run``, with a child run per stage and per evaluated
method (parameters, metrics, inputs, adapters, rollout traces and judge verdicts)."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import mlflow
from kedro.framework.hooks import hook_impl
from kedro.io import DataCatalog
from kedro.pipeline import Node, Pipeline
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NOTE
from pydantic import BaseModel

from prorag.config import ParameterError, parse_parameters
from prorag.datasets import DirectoryDataset, OptionalVersionDataset
from prorag.hooks.support import catalog_parameters, file_of, local_path, on_termination
from prorag.tracking import (
    TrackingParams,
    default_tracking_uri,
    flatten,
    git_sha,
    metric_series,
    portable_paths,
    redact,
    redact_text,
)
from prorag.tracking.missing_inputs import (
    Available,
)
from prorag.tracking.model_reference import BackgroundUploads, log_model_folder
from prorag.tracking.result import RunResult
from prorag.tracking.run_manifest import (
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
    recorded_method,
    recorded_policy,
    recorded_wall_time,
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
_MLFLOW_TAG_VALUE_LIMIT = 8000
RESULT_ARTIFACT = "result.md"
"""The parent run's artifact with the run's result tables (its description holds the same text)."""
HOST_TAG = "prorag.host"
PID_TAG = "prorag.pid"
"""Tags of a parent run naming the process that runs it, so that the next run can mark it KILLED once it is gone."""


class MlflowTrackingHook:
    """One parent MLflow run per ``kedro run``, with a child run per stage and per evaluated method.

    The tracking URI is ``MLFLOW_TRACKING_URI`` or ``sqlite:///<project>/mlflow.db``; the experiment is the
    ``tracking.experiment_name`` parameter, tagged as a model-development experiment. The *parent* run holds the
    Kedro session's tags, the parameters the pipeline reads (secrets redacted), system metrics, the question and
    corpus datasets as run inputs (``tracking.input_datasets``, with content digests), the per-node timing, and the
    run's result (:class:`~prorag.tracking.result.RunResult`): its result tables and OSR/USR as the run's
    description and ``result.md``, CEM, retrievals, OSR and USR per method as ``result.<method>.*`` metrics.

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
        self._project_path: Path | None = None
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
        self._unsaved: dict[str, tuple[str, set[str]]] = {}
        """Per node: its stage run and the outputs not saved yet (Kedro saves them after ``after_node_run``)."""
        self._traces: dict[tuple[str, str, int], TraceRef] = {}
        self._adapter_names: dict[str, str] = {}
        self._logged_inputs: set[tuple[str, str]] = set()
        self._uploads = BackgroundUploads()
        self._result = RunResult()
        self._work_ends: dict[str, int] = {}
        """Per method, when its run ends (ms): its rollouts' end when made in this run, else its last number."""
        self._rolled_out_here: set[str] = set()

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline,
                            catalog: DataCatalog) -> None:
        parameters = catalog_parameters(catalog)
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
            self._child_tags[BASE_MODEL_TAG] = portable_paths(redact_text(str(base_model)), project_path)
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
            on_termination(self._end_killed_run)
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
            self._log_input(dataset_name, data, file_of(local_path(self._catalog, dataset_name, saved=False)), node)
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
        if outputs:
            self._unsaved[node.name] = (stage_run, set(outputs))
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
        if node is not None and node.name in self._unsaved:
            self._unsaved[node.name][1].discard(dataset_name)
        self._result.observe(dataset_name, data)
        saved = local_path(self._catalog, dataset_name, saved=True)
        if dataset_name in self._settings.input_datasets:
            self._log_input(dataset_name, data, file_of(saved), node)
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
            message = redact_text(f"{type(error).__name__}: {error}")[:5000]
            self._fail_unsaved_stages(message)
            self._client.set_tag(self._parent_id, "error", message)
            self._finish("FAILED")

    def _fail_unsaved_stages(self, message: str) -> None:
        """Mark FAILED the stage runs that ended FINISHED after their node ran but whose outputs were not all
        saved (the save that failed the run), with the outputs not saved and the run's error."""
        failed: dict[str, set[str]] = {}
        for stage_run, unsaved in self._unsaved.values():
            if unsaved:
                failed.setdefault(stage_run, set()).update(unsaved)
        for stage_run, unsaved in failed.items():
            self._client.set_tag(stage_run, "error", f"not saved: {', '.join(sorted(unsaved))}; {message}"[:5000])
            self._client.set_terminated(stage_run, status="FAILED")

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
        self._safely("the run's result", self._log_result)
        active = mlflow.active_run()
        while active is not None and active.info.run_id != self._parent_id:
            mlflow.end_run(status=status)
            active = mlflow.active_run()
        for method, run_id in self._method_runs.items():
            self._client.set_terminated(run_id, status=status, end_time=self._work_ends.get(method))
        if active is not None:
            mlflow.end_run(status=status)
        else:
            self._client.set_terminated(self._parent_id, status=status)
        self.run_hint = ui_hint(self._tracking_uri, self._experiment_id, self._parent_id,
                                project_path=self._project_path)
        logger.info("MLflow run %s %s (%d stage and %d method runs); open it with: %s", self._parent_id,
                    status.lower(), len(self._stage_runs), len(self._method_runs), self.run_hint)

    def _log_result(self) -> None:
        """The run's result on the parent run, where its link opens: the result tables and OSR/USR as its
        description and as ``result.md``, and ``result.<method>.<cem|retrievals|osr|usr>`` as metrics."""
        _log_batch(self._client, self._parent_id,
                   [(key, value, None) for key, value in self._result.key_metrics().items()])
        text = self._result.markdown()
        if text:
            self._client.set_tag(self._parent_id, MLFLOW_RUN_NOTE, _note(text))
            self._client.log_text(self._parent_id, text, RESULT_ARTIFACT)

    def _safely(self, what: str, function: Callable[..., Any], *args: Any) -> None:
        """Tracking extras (traces, models, inputs) never fail a pipeline: an error is a warning."""
        try:
            function(*args)
        except Exception as error:  # any MLflow or file error: the run's own outputs are saved anyway
            logger.warning("MLflow: could not log %s: %s", what, redact_text(f"{type(error).__name__}: {error}"))

    def _child_run(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> str:
        run = self._client.create_run(self._experiment_id, run_name=name, start_time=start_ms,
                                      tags={**self._child_tags, **tags, MLFLOW_PARENT_RUN_ID: self._parent_id})
        return run.info.run_id

    def _logged_to_method(self, method: str) -> None:
        """A method run whose rollouts were not made in this run ends with the last number logged to it."""
        if method not in self._rolled_out_here:
            self._work_ends[method] = int(time.time() * 1000)

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
                tags[BASE_MODEL_TAG] = portable_paths(redact_text(base_model), self._project_path)
            if node is not None:
                tags[STAGE_TAG] = _stage_of(node)
            wall = recorded_wall_time(record) if node is not None else None
            if wall is not None:  # made in this run: the method run spans its runner's call, the work it did
                self._rolled_out_here.add(method)
                self._work_ends[method] = wall[1] // 1_000_000
            self._method_runs[method] = run_id = self._child_run(
                f"{method} ({policy})", tags, start_ms=None if wall is None else wall[0] // 1_000_000)
            self._logged_to_method(method)
            settings = recorded_method(record)
            used = {} if node is None else _own_entry(_used_parameters([node], self._parameters,
                                                                       with_tracking=False), method)
            if settings:  # what ran, under the same keys for every method: not the node's blocks that configure it
                used = {**_without_method_blocks(used), "method": settings}
            policy = used.get("policy")
            if isinstance(policy, BaseModel):  # Kedro 1.7 gives typed nodes their parameters as models
                policy = policy.model_dump()
            if isinstance(policy, dict) or recorded_policy(record):  # the policy this method ran, not the node's
                used["policy"] = {**(policy if isinstance(policy, dict) else {}), **recorded_policy(record)}
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
            self._logged_to_method(method)
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
        """Traces of the sampled rollouts, in their method runs: at their measured turns, else within their runner's
        (else their node's) wall time when made in this run."""
        now = time.time_ns()
        for record in sample_rollouts(records, self._settings.trace_samples):
            key = rollout_key(record)
            if key not in self._traces:
                wall = recorded_wall_time(record) if started_ns is not None else None
                start, end = wall if wall is not None else (started_ns or now, now)  # its runner's, else its node's
                self._traces[key] = log_rollout_trace(
                    record, experiment_id=self._experiment_id, run_id=self._method_runs[key[0]],
                    start_ns=start, end_ns=end, measured=started_ns is not None,
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
        mlflow.flush_trace_async_logging()  # once for all: a flush per trace took 30 s of make train's 25 traces
        for verdict in verdicts:
            question = (str(verdict.get("method")), str(verdict.get("question_key")))
            occurrence = seen[question] = seen.get(question, -1) + 1
            candidates = by_question.get(question, [])
            record = candidates[occurrence] if occurrence < len(candidates) else None
            key = rollout_key(record) if record is not None else (*question, occurrence)
            if key in self._traces:
                log_verdicts(self._traces[key], verdict, record.get("steps") if record else None,
                             reward_of.get(key), judge_kind=judges, flush=False)

    def _log_adapter(self, dataset_name: str, path: Path, run_id: str) -> None:
        """Log (and register) the PEFT adapter at ``path`` as an MLflow model in ``run_id``, in
        ``tracking.model_flavor``."""
        from prorag.tracking.adapter_model import (  # pull in mlflow.pyfunc / .transformers: only when needed
            log_adapter_model,
            log_merged_model,
        )

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
        options = {"base_model": base_model, "run_id": run_id, "name": dataset_name,
                   "dtype": str(_parameter(self._parameters, "policy.dtype") or "float32"),
                   "registered_model_name": None if prefix is None else f"{prefix}{dataset_name}",
                   "tags": {**self._child_tags, ADAPTER_TAG: dataset_name}}
        info = None
        if self._settings.model_flavor == "transformers":
            limit = None if self._settings.upload_large_models else self._settings.max_artifact_mb
            info = log_merged_model(path, max_mb=limit, **options)
            if info is None:
                logger.warning("MLflow: %s merged is larger than tracking.max_artifact_mb (%.0f MB): logged as a "
                               "pyfunc model instead (tracking.upload_large_models: true logs it merged)",
                               dataset_name, self._settings.max_artifact_mb)
        if info is None:
            info = log_adapter_model(path, mixed_precision=_parameter(self._parameters, "policy.mixed_precision"),
                                     **options)
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
        flat = {key: portable_paths(value, self._project_path) for key, value in redact(flatten(parameters)).items()}
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


def _note(text: str) -> str:
    """``text`` cut to what a run's description (a tag) holds, pointing at the artifact for the rest."""
    if len(text) <= _MLFLOW_TAG_VALUE_LIMIT:
        return text
    tail = f"\n\n… (the whole result is the artifact {RESULT_ARTIFACT})"
    return text[:_MLFLOW_TAG_VALUE_LIMIT - len(tail)] + tail


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


def _without_method_blocks(used: dict[str, Any]) -> dict[str, Any]:
    """``used`` less the parameter blocks that set a method's settings (``rollout.methods``, an ``agent`` block
    such as ``methods.hiprag.agent``), which a method run logs as the ``method.*`` its rollouts recorded."""
    kept = {key: value for key, value in used.items() if key != "agent" and not key.endswith(".agent")}
    rollout = kept.get("rollout")
    if isinstance(rollout, BaseModel):
        rollout = rollout.model_dump(mode="json")
    if isinstance(rollout, dict):
        kept["rollout"] = {key: value for key, value in rollout.items() if key != "methods"}
    return kept


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _MLFLOW_PARAM_VALUE_LIMIT else text[: _MLFLOW_PARAM_VALUE_LIMIT - 3] + "..."
