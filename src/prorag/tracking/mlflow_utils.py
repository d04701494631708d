"""Pure helpers behind the project's MLflow hook."""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePath
from typing import Any, Literal

from pydantic import BaseModel, Field

from prorag.config import StrictModel, register_parameters

_METRIC_KEY_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")
DEFAULT_INPUT_DATASETS = ("questions", "passages", "index_questions", "index_passages", "rollout_questions",
                          "rl_questions")


@register_parameters("tracking")
class TrackingParams(StrictModel):
    """``tracking`` parameters: where runs go and what they hold. The URI itself comes from
    ``MLFLOW_TRACKING_URI``."""

    experiment_name: str = "prorag"
    enabled: bool = True
    log_artifacts: bool = True
    system_metrics: bool = True
    """CPU, memory, disk, network (and GPU) use logged to the parent run as ``system/*`` metrics."""
    trace_samples: int = Field(default=5, ge=0)
    """Rollouts per method logged as MLflow traces in the method's run; 0 logs none."""
    log_models: bool = True
    """LoRA adapters (PEFT folders) logged as MLflow models (when ``log_artifacts``), in ``model_flavor``."""
    model_flavor: Literal["pyfunc", "transformers"] = "pyfunc"
    """``pyfunc``: the adapter and the base model's spec, loaded through prorag (``mlflow.pyfunc.load_model``; small,
    needs prorag installed). ``transformers``: the policy with the adapter merged in, in MLflow's own transformers
    flavour (``mlflow.transformers.load_model`` or ``mlflow.pyfunc.load_model`` with mlflow and transformers only;
    the whole model's size, so a merged model over ``max_artifact_mb`` is logged as ``pyfunc`` unless
    ``upload_large_models``)."""
    registered_model_prefix: str | None = Field(default="prorag-", pattern=r"^[A-Za-z0-9_.\-]*$")
    """Logged adapters are registered as ``<prefix><dataset>`` (``prorag-sft_adapter``); null: not registered."""
    max_artifact_mb: float = Field(default=500.0, gt=0)
    """A model folder (not a LoRA adapter) larger than this is logged as a reference (its URI, size and files), not
    uploaded (:mod:`prorag.tracking.model_reference`)."""
    upload_large_models: bool = False
    """Also upload such a folder, on a background thread joined before the run ends."""
    input_datasets: list[str] = Field(default_factory=lambda: list(DEFAULT_INPUT_DATASETS))
    """Catalog datasets logged as run inputs (with a content digest) when a run loads or saves them."""


def default_tracking_uri(project_path: str | os.PathLike[str]) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite store ``mlflow.db`` at the project root."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri
    return f"sqlite:///{(Path(project_path).resolve() / 'mlflow.db').as_posix()}"


def flatten(values: Mapping[str, Any] | BaseModel, prefix: str = "", separator: str = ".") -> dict[str, Any]:
    """Flatten nested mappings into dotted keys; lists stay values."""
    flat: dict[str, Any] = {}
    if isinstance(values, BaseModel):
        values = values.model_dump(mode="json")
    for key, value in values.items():
        name = f"{prefix}{separator}{key}" if prefix else str(key)
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        if isinstance(value, Mapping):
            flat.update(flatten(value, name, separator))
        else:
            flat[name] = value
    return flat


LOCAL_PATH_PREFIX = "<local>/"
"""What replaces the folders of an absolute local path outside the project in a logged parameter."""


def portable_paths(value: Any, project: str | os.PathLike[str] | None) -> Any:
    """``value`` with each absolute local path in it (a string, also inside lists and mappings) made relative to
    ``project`` when inside it (``data/06_models/sft_adapter/<version>/sft_adapter``), else cut to
    ``<local>/<its name>``: what a run logs then names no folder of the machine that ran it."""
    if isinstance(value, Mapping):
        return {key: portable_paths(item, project) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable_paths(item, project) for item in value]
    if not (isinstance(value, str) and 0 < len(value) < 4096 and "\n" not in value and "://" not in value
            and PurePath(value).is_absolute()):
        return value
    path = PurePath(value)
    if project is not None:
        for root in dict.fromkeys((PurePath(project), PurePath(Path(project).resolve()))):
            if path == root or root in path.parents:
                return path.relative_to(root).as_posix() or "."
    return f"{LOCAL_PATH_PREFIX}{path.name}"


def sanitize_metric_key(key: str) -> str:
    """MLflow accepts alphanumerics, ``_ - . / `` and spaces in metric names."""
    return _METRIC_KEY_BAD_CHARS.sub("_", key)


def metric_series(name: str, data: Any) -> Iterator[tuple[str, float, int | None]]:
    """Yield ``(key, value, step)`` for the finite numbers in a ``*_metrics`` output.

    A mapping gives one value per flattened key (step None). A list of mappings that each carry an integer
    ``step`` gives a curve: one value per key per step. Booleans, strings and non-finite numbers are skipped.
    """
    base = name.removesuffix("_metrics")
    if isinstance(data, Mapping):
        for key, value in flatten(data, base).items():
            if _is_number(value):
                yield sanitize_metric_key(key), float(value), None
    elif isinstance(data, list) and all(isinstance(item, Mapping) and _is_step(item.get("step"))
                                        for item in data):
        for item in data:
            for key, value in flatten({k: v for k, v in item.items() if k != "step"}, base).items():
                if _is_number(value):
                    yield sanitize_metric_key(key), float(value), int(item["step"])


def git_sha(path: str | os.PathLike[str]) -> str | None:
    """The commit checked out at ``path`` (with ``-dirty`` if the tree has changes), or None outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
