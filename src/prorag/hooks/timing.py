"""Where a ``kedro run`` spends its time: a per-node table of wall time and generation tokens.

:class:`NodeTimingHook` times every node and reads, around it, the process-wide generation counters
(:data:`prorag.llm.prefix_cache.PROCESS_GENERATION_STATS`: prefill, KV-reused and decoded tokens of every
in-process generator, so the rollout, RL and evaluation nodes show prefill vs decode and the cache hit rate).
At the end of the run (or on failure, with the nodes that finished) it writes
``data/08_reporting/node_timing/<run id>.csv`` and ``.md`` (one pair per run: concurrent runs never overwrite each
other's) and replaces ``data/08_reporting/node_timing.csv`` and ``.md`` atomically with them (the latest run's), and,
when an MLflow run is open, logs the table as ``reporting/node_timing/node_timing.csv`` / ``.md`` artifacts and each
node's numbers as ``node_timing.<node>.<column>`` metrics, ``<node>`` being the node's full, namespaced name
(``node_timing.rl.train_rl.seconds``). The table is a report: failing to write or log it (a full disk, a read-only
folder) is a warning and never changes the run's status, which is what happened to its nodes.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import pandas as pd
from kedro.framework.hooks import hook_impl  # the one Kedro import: this module is a hook (framework glue)

from prorag.config import ParameterError, parse_parameters
from prorag.llm.prefix_cache import PROCESS_GENERATION_STATS
from prorag.tracking.mlflow_utils import TrackingParams, metric_series

if TYPE_CHECKING:
    from kedro.pipeline import Node

logger = logging.getLogger(__name__)

REPORT_NAME = "node_timing"
REPORT_DIR = Path("data") / "08_reporting"
"""Relative to the project root."""


class NodeTimingHook:
    """Per-node wall time and generation counters of one ``kedro run`` (see the module docstring).

    Register it after the MLflow tracking hook (pluggy calls the last registered first), so that its table
    reaches the MLflow run before that hook closes it.
    """

    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []
        self._started: dict[str, tuple[float, dict[str, float]]] = {}
        self._run_started = 0.0
        self._output_dir = REPORT_DIR
        self._log_artifacts = True
        self._run_id = "run"

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], catalog: Any) -> None:  # no default: pluggy passes none
        self._rows = []
        self._started = {}
        self._run_started = time.perf_counter()
        self._output_dir = Path(run_params.get("project_path") or Path.cwd()) / REPORT_DIR
        self._run_id = str(run_params.get("run_id") or f"run-{os.getpid()}").replace("/", "_")
        tracking = catalog.load("parameters").get("tracking") if catalog is not None and "parameters" in catalog \
            else None
        try:  # the tracking hook's switch for artifacts (it reports a bad ``tracking`` block itself)
            settings = tracking if isinstance(tracking, TrackingParams) \
                else parse_parameters(TrackingParams, tracking, "tracking")
            self._log_artifacts = settings.log_artifacts
        except ParameterError:
            self._log_artifacts = False

    @hook_impl
    def before_node_run(self, node: Node) -> None:
        self._started[node.name] = (time.perf_counter(), PROCESS_GENERATION_STATS.snapshot())

    @hook_impl
    def after_node_run(self, node: Node) -> None:
        started, counters = self._started.pop(node.name, (time.perf_counter(), {}))
        generation = PROCESS_GENERATION_STATS.since(counters)
        seconds = time.perf_counter() - started
        row: dict[str, Any] = {"node": node.name, "start_s": round(started - self._run_started, 2),
                               "seconds": round(seconds, 2)}
        if generation["calls"]:
            row.update({"prefill_tokens": generation["prefill_tokens"],
                        "cached_tokens": generation["cached_tokens"],
                        "decode_tokens": generation["decode_tokens"],
                        "cache_hit_rate": generation["cache_hit_rate"]})
            logger.info("node %s: %.1f s; %d prefill, %d cached (hit rate %.2f), %d decoded tokens", node.name,
                        seconds, generation["prefill_tokens"], generation["cached_tokens"],
                        generation["cache_hit_rate"], generation["decode_tokens"])
        self._rows.append(row)

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._write("completed")

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._write("failed")

    def table(self) -> pd.DataFrame:
        """The nodes in run order with their share of the run's wall time, and a total row."""
        frame = pd.DataFrame(self._rows)
        if frame.empty:
            return frame
        wall = max(time.perf_counter() - self._run_started, 1e-9)
        frame["share"] = (frame["seconds"] / wall).round(3)
        total: dict[str, Any] = {"node": "(run wall time)", "start_s": 0.0, "seconds": round(wall, 2), "share": 1.0}
        for column in ("prefill_tokens", "cached_tokens", "decode_tokens"):
            if column in frame:
                total[column] = frame[column].fillna(0).sum()
        if "cached_tokens" in total:
            prompt = total["cached_tokens"] + total["prefill_tokens"]
            total["cache_hit_rate"] = round(total["cached_tokens"] / prompt, 4) if prompt else 0.0
        return pd.concat([frame, pd.DataFrame([total])], ignore_index=True)

    def _write(self, status: str) -> None:
        try:
            self._write_and_log(status)
        except Exception as error:  # a report: the run's outputs are saved, its status stays what its nodes did
            logger.warning("per-node timing not written or logged (%s: %s); the run is %s", type(error).__name__,
                           error, status)

    def _write_and_log(self, status: str) -> None:
        frame = self.table()
        if frame.empty:
            return
        csv_text = frame.to_csv(index=False)
        markdown_text = f"# Per-node timing ({status} run)\n\n{_markdown(frame)}\n"
        try:
            self._write_files(csv_text, markdown_text)
        finally:  # MLflow gets the table even when the folder cannot be written
            if mlflow.active_run() is not None:
                if self._log_artifacts:  # the tracking hook's layout for 08_reporting files
                    mlflow.log_text(csv_text, f"reporting/{REPORT_NAME}/{REPORT_NAME}.csv")
                    mlflow.log_text(markdown_text, f"reporting/{REPORT_NAME}/{REPORT_NAME}.md")
                numbers = {str(row["node"]): {key: value for key, value in row.items() if key not in ("node",)}
                           for row in frame.to_dict("records")}
                for key, value, _ in metric_series(f"{REPORT_NAME}_metrics", numbers):
                    mlflow.log_metric(key, value)

    def _write_files(self, csv_text: str, markdown_text: str) -> None:
        """This run's pair under ``node_timing/``, then the latest pair replaced atomically."""
        run_dir = self._output_dir / REPORT_NAME
        run_dir.mkdir(parents=True, exist_ok=True)
        for suffix, text in ((".csv", csv_text), (".md", markdown_text)):
            (run_dir / f"{self._run_id}{suffix}").write_text(text, encoding="utf-8")
            latest = self._output_dir / f"{REPORT_NAME}{suffix}"
            temporary = latest.with_name(f".{latest.name}.tmp-{os.getpid()}")
            temporary.write_text(text, encoding="utf-8")
            temporary.replace(latest)
        logger.info("per-node timing written to %s", self._output_dir / f"{REPORT_NAME}.csv")


def _markdown(frame: pd.DataFrame) -> str:
    """A pipe table (pandas' ``to_markdown`` needs the optional ``tabulate``)."""
    cells = frame.astype(object).where(frame.notna(), "").astype(str)
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False, name=None)]
    return "\n".join(lines)
