"""``kedro run --env cpu_distributed``: the training nodes run under ``accelerate launch`` with 2 gloo processes on the
tiny random Llama, end to end (SFT, then GRPO from its adapter); the MLflow stage runs show world size 2 and one
set of curves (rank 0 only), and the SFT adapter loads back through the catalog and generates (its rollouts)."""

from __future__ import annotations

import os
import subprocess
import sys

import mlflow
import pytest


def _kedro(project, pipeline: str) -> None:
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "1"}
    completed = subprocess.run([sys.executable, "-m", "kedro", "run", f"--pipelines={pipeline}", "--env",
                                "cpu_distributed"], cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-6000:]


@pytest.mark.distributed
@pytest.mark.slow
def test_sft_and_rl_train_on_two_gloo_processes_from_kedro_run(project_copy, mlflow_uri):
    _kedro(project_copy, "train_sft")
    _kedro(project_copy, "rl")

    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("prorag-cpu-distributed")
    stages = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])
              if "distributed.world_size" in run.data.params}
    assert set(stages) == {"sft", "rl"}
    for name, run in stages.items():
        assert run.data.params["distributed.world_size"] == "2"
        assert run.data.params["distributed.backend"] == "gloo"
        assert run.info.status == "FINISHED"
        loss = client.get_metric_history(run.info.run_id, f"{name}.loss")
        assert sorted(point.step for point in loss) == list(range(1, len(loss) + 1))  # one value per step: rank 0
    sft_rollouts = [run for run in client.search_runs([experiment.experiment_id])
                    if run.info.run_name.startswith("hiprag_agent_sft")]
    assert sft_rollouts, "the SFT adapter trained by 2 processes was not rolled out"
    assert list((project_copy / "data" / "06_models" / "launches").glob("grpo-*/run/checkpoints/checkpoint-2"))
