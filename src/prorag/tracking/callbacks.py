"""A transformers ``TrainerCallback`` that logs every trainer log entry to the active MLflow run as it happens.

transformers' own ``MLflowCallback`` also logs all ``TrainingArguments`` as params and may start or end runs;
the project's hook owns the run and its params, so this callback only logs metrics, under a prefix.
"""

from __future__ import annotations

from typing import Any

import mlflow
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from prorag.tracking.mlflow_utils import metric_series


class MlflowStepMetrics(TrainerCallback):
    """Log the numeric entries of each trainer log to the active MLflow run at ``state.global_step``.

    Only the main process logs; without an active run nothing is logged (the history is still the trainer's).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or not state.is_world_process_zero or mlflow.active_run() is None:
            return
        metrics = {key: value for key, value, _ in metric_series(f"{self.prefix}_metrics", dict(logs))}
        if metrics:
            mlflow.log_metrics(metrics, step=int(state.global_step))
