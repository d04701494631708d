"""How one ``kedro run`` maps onto MLflow runs, and the datasets it logs as run inputs. Kedro-free.

A ``kedro run`` is one *parent* run with two kinds of children (tag ``prorag.kind``):

* a **stage** run per pipeline stage: the package of ``prorag.pipelines`` that holds the node's function
  (``data_preparation``, ``corpus_indexing``, ``rollout``, ``sft``, ``rl``, ``evaluation``, ``reward_judging``, ...),
  or the node's namespace when it has one (``sft.run_policy_rollouts`` belongs to ``sft``). It holds the
  metrics of those nodes (live training curves included: it is the active run while its node runs), their
  reports and models.
* a **method** run per evaluated method (``hiprag``, ``hiprag_agent_sft``, ...): a curated set of its evaluation
  and judge metrics (:func:`is_curated_method_metric`), the same keys for every method of every pipeline, so that
  base, SFT and RL are rows of the runs table that MLflow's Compare lines up; every number in one table artifact
  (:data:`METHOD_METRICS_TABLE`); and a sample of its rollouts as traces.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any, Final

from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.data.dataset_source import DatasetSource
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from prorag.redaction import redact_text

KIND_TAG: Final = "prorag.kind"
STAGE_TAG: Final = "prorag.stage"
METHOD_TAG: Final = "prorag.method"
POLICY_TAG: Final = "prorag.policy"
ADAPTER_TAG: Final = "prorag.adapter"
BASE_MODEL_TAG: Final = "prorag.base_model"
PROTOCOL_TAG: Final = "prorag.protocol"

PER_METHOD_METRICS: Final = {"evaluation_metrics": "evaluation", "judge_metrics": "judge",
                              "comparison_metrics": "evaluation"}
"""Output-name suffixes of metrics shaped ``{method: {...}}`` and the prefix each method's part is logged under in
its method run: ``tearag_evaluation_metrics``, ``evaluation_metrics`` and ``compare``'s ``comparison_metrics`` share
keys (``evaluation.macro.cem``, ``evaluation.<dataset>.cem``), so the method runs of any pipeline compare in the
MLflow UI."""
CURATED_METHOD_METRICS: Final = (
    "evaluation.macro.cem", "evaluation.macro.em", "evaluation.macro.f1", "evaluation.macro.format_rate",
    "evaluation.macro.avg_retrieval_count", "evaluation.macro.avg_generated_tokens", "evaluation.macro.lasj",
    "judge.osr", "judge.usr", "judge.unknown_rate", "judge.reward",
)
"""The metrics a method run logs as MLflow metrics, besides ``evaluation.<dataset>.cem`` per dataset: answer
quality macro-averaged over datasets (CEM, EM, F1; LLM-judge accuracy when ``compare.answer_judge`` is set), format
rate, retrievals and generated tokens per question, the judge's over-/under-search rates, unknown-verdict rate and
mean reward. ``evaluation.all.*`` (pooled over datasets, only the evaluation pipeline has it), intervals, stop
reasons and the per-dataset judge figures are in the table artifact."""
CURATED_PER_DATASET: Final = ("cem",)
"""The per-dataset metrics a method run logs (``evaluation.<dataset>.cem``; not for ``all`` or ``macro``)."""
METHOD_METRICS_TABLE: Final = "metrics_table.json"
"""The artifact of a method run with every number its pipeline computed for it (``key``, ``value``, ``curated``),
the curated metrics included: MLflow's ``log_table`` format, so ``mlflow.load_table`` reads it back."""
EXPERIMENT_KIND_TAG: Final = "mlflow.experimentKind"
EXPERIMENT_KIND: Final = "custom_model_development"
"""What MLflow 3's UI reads to open an experiment on the runs (model training) view, not the GenAI one."""
POLICY_METADATA_KEY: Final = "policy"
"""Where a rollout record keeps the policy that produced it (``prorag.agent.runner.POLICY_METADATA_KEY``)."""
METHOD_METADATA_KEY: Final = "method"
"""Where a rollout record keeps its method's settings (``prorag.agent.runner.METHOD_METADATA_KEY``)."""
WALL_TIME_METADATA_KEY: Final = "runner_wall_ns"
"""Where a rollout record keeps the wall clock of its method's runner call (``prorag.agent.runner``)."""
_PIPELINES_PACKAGE: Final = "prorag.pipelines."
_ROLLOUT_FIELDS: Final = frozenset({"method", "question_key", "segments", "queries", "retrieved_ids", "answer"})


def stage_name(module: str | None, namespace: str | None, node_name: str) -> str:
    """The stage of a node: its namespace, else the ``prorag.pipelines`` package of its function, else the first
    dotted part of its name."""
    if namespace:
        return namespace
    if module and module.startswith(_PIPELINES_PACKAGE):
        return module.removeprefix(_PIPELINES_PACKAGE).split(".")[0]
    return node_name.split(".")[0]


def split_method_metrics(name: str, data: Any) -> tuple[str, dict[str, Mapping[str, Any]], dict[str, Any]] | None:
    """``(prefix, {method: metrics}, other top-level entries)`` for a per-method metrics output
    (:data:`PER_METHOD_METRICS`), else None."""
    suffix = next((suffix for suffix in PER_METHOD_METRICS if name.endswith(suffix)), None)
    if suffix is None or not isinstance(data, Mapping):
        return None
    methods = {str(key): value for key, value in data.items() if isinstance(value, Mapping)}
    rest = {str(key): value for key, value in data.items() if not isinstance(value, Mapping)}
    return PER_METHOD_METRICS[suffix], methods, rest


def is_curated_method_metric(key: str) -> bool:
    """Whether a method run logs ``key`` as a metric (:data:`CURATED_METHOD_METRICS`, ``evaluation.<dataset>.cem``)
    rather than only in its :data:`METHOD_METRICS_TABLE`."""
    if key in CURATED_METHOD_METRICS:
        return True
    parts = key.split(".")
    return (len(parts) == 3 and parts[0] == "evaluation" and parts[1] not in ("all", "macro")
            and parts[2] in CURATED_PER_DATASET)


def is_rollout_records(data: Any) -> bool:
    """Whether ``data`` is a non-empty list of rollout records (``Rollout.to_dict``)."""
    return (isinstance(data, list) and bool(data) and isinstance(data[0], Mapping)
            and data[0].keys() >= _ROLLOUT_FIELDS)


def recorded_policy(record: Mapping[str, Any]) -> dict[str, Any]:
    """The ``model`` and ``adapter`` a rollout record says produced it (empty for a record without one)."""
    recorded = (record.get("metadata") or {}).get(POLICY_METADATA_KEY) or {}
    return {key: recorded[key] for key in ("model", "adapter") if key in recorded}


def recorded_method(record: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of the method a rollout record says produced it (empty for a record without them)."""
    recorded = (record.get("metadata") or {}).get(METHOD_METADATA_KEY)
    return dict(recorded) if isinstance(recorded, Mapping) else {}


def recorded_wall_time(record: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(start, end)`` in ns of the runner call that made a rollout record (with its method's other rollouts), or
    None for a record without them."""
    wall = (record.get("metadata") or {}).get(WALL_TIME_METADATA_KEY)
    if isinstance(wall, list | tuple) and len(wall) == 2 and all(isinstance(item, int) for item in wall):
        return int(wall[0]), int(wall[1])
    return None


def rollout_policy(record: Mapping[str, Any], adapter_names: Mapping[str, str]) -> tuple[str, str | None, str | None]:
    """``(policy, adapter dataset, base model)`` of a rollout record from the policy it recorded.

    The policy is ``unrecorded`` for a record without one, ``base`` without an adapter; else the adapter's dataset
    name less ``_adapter`` (``sft``, ``rl``, ``tearag_sft``): the dataset whose loaded or saved path is the adapter
    (``adapter_names``: path → name), else the last part of the path that ends in ``_adapter``, else the folder's
    name. A full-parameter model folder (``model`` replaced by a trained folder) is named the same way."""
    recorded = (record.get("metadata") or {}).get(POLICY_METADATA_KEY) or {}
    if not recorded:  # rolled out before policies were recorded: do not guess "base"
        return "unrecorded", None, None
    model = recorded.get("model")
    trained = recorded.get("adapter") or (model if model and _trained_folder(str(model), adapter_names) else None)
    if not trained:
        return "base", None, None if model is None else str(model)
    trained = str(trained)
    name = adapter_names.get(_normal(trained)) or next(
        (part for part in reversed(PurePath(trained).parts) if part.endswith("_adapter")), PurePath(trained).name)
    base = None if model is None or str(model) == trained else str(model)
    return name.removesuffix("_adapter"), name, base


def _trained_folder(model: str, adapter_names: Mapping[str, str]) -> bool:
    return _normal(model) in adapter_names or any(part.endswith("_adapter") for part in PurePath(model).parts)


def _normal(path: str) -> str:
    return str(Path(path).expanduser().resolve(strict=False))


def adapter_key(path: str) -> str:
    """The key of a local adapter path in the ``adapter_names`` map of :func:`rollout_policy`."""
    return _normal(path)


def is_peft_adapter(path: str | Path) -> bool:
    """Whether ``path`` is a folder saved by PEFT (``adapter_config.json`` naming a ``peft_type``)."""
    config = Path(path) / "adapter_config.json"
    try:
        loaded = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(loaded, dict) and bool(loaded.get("peft_type"))


def file_digest(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes (hex, first 16 characters)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def records_digest(records: Sequence[Any]) -> str:
    """SHA-256 of the records as canonical JSON lines (hex, first 16 characters): for data that has no file."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, default=str).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]


class _ContentDataset(MetaDataset):
    """A dataset known by its source, content digest and row count (the rows stay in the catalog)."""

    def __init__(self, source: DatasetSource, name: str, digest: str, profile: dict[str, Any]) -> None:
        self._profile = profile
        super().__init__(source, name=name, digest=digest)

    @property
    def profile(self) -> dict[str, Any]:
        return self._profile

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), "profile": json.dumps(self._profile)}


def dataset_input(name: str, data: Any, path: str | None, context: str) -> DatasetInput:
    """An MLflow run input for a catalog dataset: the digest of its local file (else of its records), its row
    count and columns as profile, ``context`` (the stage that loaded or saved it) as input tag. ``path`` is the
    local file or remote URI it was loaded from or saved to, None for an in-memory dataset."""
    rows = data if isinstance(data, list) else None
    local = path is not None and Path(path).is_file()
    digest = file_digest(path) if local else records_digest(rows if rows is not None else [repr(data)])
    source: DatasetSource = CodeDatasetSource({"kedro.dataset": name})
    if path is not None:
        with warnings.catch_warnings():  # "can be interpreted in multiple ways": all of them are the same
            warnings.simplefilter("ignore")
            with contextlib.suppress(MlflowException):
                source = resolve_dataset_source(str(Path(path).resolve()) if local else path)
    profile: dict[str, Any] = {}
    if rows is not None:
        profile["num_rows"] = len(rows)
        if rows and isinstance(rows[0], Mapping):
            profile["columns"] = sorted(map(str, rows[0]))
    dataset = _ContentDataset(source, name=name, digest=digest, profile=profile)
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])


TRAINING_VIEW = "?workflowType=machine_learning"
"""MLflow 3 opens an experiment in its GenAI view by default; this query opens the training (runs, metrics) view."""


def ui_hint(tracking_uri: str, experiment_id: str, run_id: str, *, project_path: str | Path | None = None) -> str:
    """How to open a run in MLflow's training view: its URL on a tracking server, else the command that serves the
    store (``make mlflow-ui`` for the project's own ``mlflow.db``, else the virtualenv's ``mlflow ui``) and the URL
    it will answer on. Credentials in the URI are hidden."""
    uri = redact_text(tracking_uri)
    route = f"#/experiments/{experiment_id}/runs/{run_id}{TRAINING_VIEW}"
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{route}"
    own_store = project_path is not None and uri == (
        f"sqlite:///{(Path(project_path).resolve() / 'mlflow.db').as_posix()}")
    command = ("make mlflow-ui" if own_store
               else f"{Path(sys.executable).with_name('mlflow')} ui --backend-store-uri {uri} --port 5000")
    return f"{command}   (then http://127.0.0.1:5000/{route})"
