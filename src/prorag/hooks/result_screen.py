"""The result-screen hook: the run ends on its result (the evaluation summaries it saved, what it trained, where
the files are)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

from kedro.framework.hooks import hook_impl
from kedro.io import DataCatalog

from prorag.hooks.mlflow_tracking import MlflowTrackingHook
from prorag.hooks.support import local_path
from prorag.tracking.result import RunResult

SMOKE_STEPS: Final = 50
"""Fewer optimizer steps than this in every trainer of a run, and the result screen calls the run a smoke run."""


class ResultScreenHook:
    """The run ends on its result: the evaluation summaries it saved (``*evaluation_summary``: CEM with its
    interval, format, retrievals, tokens, the paired Δ against standard RAG) and, when judging ran, each method's
    over- and under-search rates are printed after everything else, with where the files are and how to open MLflow
    and kedro-viz."""

    def __init__(self, tracking: MlflowTrackingHook | None = None) -> None:
        self._tracking = tracking
        self._catalog: DataCatalog | None = None
        self._summaries: list[tuple[str, str, Path | None]] = []
        self._result = RunResult()
        self._trained: list[tuple[str, int]] = []
        """(stage, optimizer steps) of every trainer whose log this run saved."""

    @hook_impl
    def before_pipeline_run(self, catalog: DataCatalog) -> None:
        self._catalog, self._summaries, self._trained, self._result = catalog, [], [], RunResult()

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        self._result.observe(dataset_name, data)
        if dataset_name.endswith(("training_log", "sft_metrics")) and isinstance(data, list):
            steps = [int(entry["step"]) for entry in data if isinstance(entry, dict) and "step" in entry]
            self._trained.append((dataset_name.removesuffix("_training_log").removesuffix("_metrics"),
                                  max(steps, default=0)))
        if dataset_name.endswith("evaluation_summary") and isinstance(data, str):
            located = local_path(self._catalog, dataset_name, saved=True)
            self._summaries.append((dataset_name, data, None if located is None else located[1]))

    @hook_impl
    def after_pipeline_run(self) -> None:
        if not self._summaries:
            return
        lines = [""]
        for name, text, path in self._summaries:
            lines += [f"{name}{f' ({path})' if path else ''}:", text]
        rates = self._result.search_rates()
        if rates:
            lines += ["Search behaviour (judged; OSR: search steps the policy did not need, USR: non-search steps "
                      "that were wrong):", *rates, ""]
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
