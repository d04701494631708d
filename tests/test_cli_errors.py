"""Expected user errors of ``kedro run`` (issue 34, item 4): an unknown pipeline, an input without a saved version and
a mistyped parameter print one message and a hint, no traceback; ``--traceback`` / ``PRORAG_TRACEBACK=1`` show it.
Run through the real ``kedro`` command in a copy of the project (nothing saved yet)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prorag.errors import TRACEBACK_ENV, user_error_message


def kedro_run(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "COLUMNS": "200",
                   "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}", **env}
    if TRACEBACK_ENV not in env:
        environment.pop(TRACEBACK_ENV, None)
    return subprocess.run([sys.executable, "-m", "kedro", "run", *args], cwd=project, capture_output=True, text=True,
                          env=environment, timeout=300)


def error_lines(completed: subprocess.CompletedProcess[str]) -> list[str]:
    output = completed.stdout + completed.stderr
    assert "Traceback" not in output and "╭" not in output, output[-3000:]
    assert "register_new_resolver" not in output  # Kedro's own deprecation noise (filtered in settings.py)
    return output[output.index("Error: "):].splitlines()


@pytest.mark.integration
def test_unknown_pipeline_is_one_line_with_the_closest_names(project_copy):
    completed = kedro_run(project_copy, "--pipelines=trian")
    assert completed.returncode == 1
    lines = error_lines(completed)
    assert lines[0].startswith("Error: unknown pipeline 'trian'; did you mean 'train'")
    assert "kedro registry list" in lines[0]
    assert lines[1:] == ["(the traceback: add --traceback or set PRORAG_TRACEBACK=1)"]


@pytest.mark.integration
def test_missing_input_version_names_the_pipeline_to_run_first(project_copy):
    completed = kedro_run(project_copy, "--pipelines=rl")
    assert completed.returncode == 1
    lines = error_lines(completed)
    assert lines[0] == "Error: 4 inputs of this run have no version yet:"
    assert "  sft_adapter has no version yet: run `kedro run --pipelines=train_sft` (or train) first" in lines
    assert lines[-1].startswith("(the traceback:")


@pytest.mark.integration
def test_mistyped_parameter_is_one_line_with_did_you_mean(project_copy):
    completed = kedro_run(project_copy, "--pipelines=data_preparation", "--params", "reward.lambda_pp=0.1")
    assert completed.returncode == 1
    assert error_lines(completed)[0] == ("Error: invalid parameters: unknown parameter key 'reward.lambda_pp'; "
                                         "did you mean 'reward.lambda_p'?")


@pytest.mark.integration
@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_traceback_on_request(project_copy, how):
    args, env = (["--traceback"], {}) if how == "flag" else ([], {TRACEBACK_ENV: "1"})
    completed = kedro_run(project_copy, "--pipelines=data_preparation", "--params", "reward.lambda_pp=0.1", *args,
                          **env)
    assert completed.returncode == 1
    assert "Traceback" in completed.stdout + completed.stderr
    assert "ParameterError" in completed.stdout + completed.stderr


def test_bugs_are_not_user_errors():
    assert user_error_message(KeyError("x")) is None
    assert user_error_message(ValueError("Failed to find the pipeline named 'x'. It needs …")) == (
        "unknown pipeline 'x' (`kedro registry list` lists the registered pipelines)")
