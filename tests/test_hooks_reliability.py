"""A run's status is what happened to its nodes (issue 32, bug 2 and weak points): a node_timing report that cannot
be written is a warning, not a ``killed`` run; a SIGKILLed run, which cannot record its end, is marked KILLED (MLflow)
and ``killed`` (manifest) by the next run; concurrent runs keep their own node_timing tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from kedro.io import DataCatalog
from kedro.pipeline import Pipeline

from prorag.hooks.mlflow_tracking import MlflowTrackingHook
from prorag.hooks.run_versions import RUN_MANIFEST_DIR, RunVersionHook
from prorag.hooks.timing import NodeTimingHook


def _manifest(root: Path, run_id: str) -> dict:
    return json.loads((root / RUN_MANIFEST_DIR / f"{run_id}.json").read_text(encoding="utf-8"))


@pytest.mark.integration
def test_a_completed_run_whose_node_timing_cannot_be_written_is_recorded_completed(project_copy: Path, mlflow_uri):
    (project_copy / "data" / "08_reporting" / "node_timing.csv").mkdir(parents=True)  # cannot be written as a file
    completed = subprocess.run([sys.executable, "-m", "kedro", "run", "--pipelines=data_preparation"],
                               cwd=project_copy, capture_output=True, text=True, timeout=600,
                               env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri})
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "per-node timing not written" in completed.stdout + completed.stderr
    (manifest_file,) = (project_copy / RUN_MANIFEST_DIR).glob("*.json")
    assert _manifest(project_copy, manifest_file.stem)["status"] == "completed"
    (run,) = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`prorag.kind` = 'pipeline'",
                                output_format="list")
    assert run.info.status == "FINISHED"
    artifacts = [item.path for item in mlflow.MlflowClient().list_artifacts(run.info.run_id, "reporting/node_timing")]
    assert "reporting/node_timing/node_timing.csv" in artifacts  # MLflow still gets the table


SIGKILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from kedro.io import DataCatalog
    from kedro.pipeline import Pipeline
    from prorag.hooks.mlflow_tracking import MlflowTrackingHook
    from prorag.hooks.run_versions import RunVersionHook
    catalog = DataCatalog({})
    params = {"run_id": sys.argv[1], "project_path": sys.argv[2], "pipeline_names": ["long"]}
    for hook in (MlflowTrackingHook(), RunVersionHook()):
        hook.after_catalog_created(catalog)
        hook.before_pipeline_run(params, Pipeline([]), catalog)
    print("running", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, `kill -9`: no handler runs
""")


@pytest.mark.integration
def test_a_sigkilled_run_is_marked_killed_by_the_next_run(tmp_path: Path, mlflow_uri):
    first, second = "2026-02-01T00.00.00.000Z", "2026-02-02T00.00.00.000Z"
    completed = subprocess.run([sys.executable, "-c", SIGKILLED_RUN, first, str(tmp_path)], capture_output=True,
                               text=True, timeout=120, env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri})
    assert "running" in completed.stdout and completed.returncode == -signal.SIGKILL, completed.stderr[-2000:]
    (lost,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert lost.info.status == "RUNNING" and _manifest(tmp_path, first)["status"] == "running"
    catalog = DataCatalog({})
    hooks = (MlflowTrackingHook(), RunVersionHook())
    for hook in hooks:
        hook.after_catalog_created(catalog)
        hook.before_pipeline_run({"run_id": second, "project_path": str(tmp_path), "pipeline_names": ["next"]},
                                 Pipeline([]), catalog)
    for hook in hooks:
        hook.after_pipeline_run()
    assert mlflow.get_run(lost.info.run_id).info.status == "KILLED"
    assert "is gone" in mlflow.get_run(lost.info.run_id).data.tags["error"]
    assert _manifest(tmp_path, first)["status"] == "killed" and _manifest(tmp_path, second)["status"] == "completed"


def test_concurrent_runs_keep_their_own_node_timing(tmp_path: Path):
    hooks = [NodeTimingHook(), NodeTimingHook()]
    for number, hook in enumerate(hooks):
        hook.before_pipeline_run({"project_path": str(tmp_path), "run_id": f"run-{number}"}, None)
        node = SimpleNamespace(name=f"node_of_run_{number}")
        hook.before_node_run(node)
        hook.after_node_run(node)
    for hook in hooks:
        hook.after_pipeline_run()
    folder = tmp_path / "data" / "08_reporting" / "node_timing"
    assert "node_of_run_0" in (folder / "run-0.csv").read_text()
    assert "node_of_run_1" in (folder / "run-1.csv").read_text()
    assert "node_of_run_1" in (tmp_path / "data" / "08_reporting" / "node_timing.csv").read_text()  # the latest
