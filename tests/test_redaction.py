"""The one redaction (issue 32, bug 1): every writer — reports, logs, MLflow params, traces — hides the credential
of ``http://user:sk-fake@host`` in ``compare.answer_judge.base_url``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from prorag.agent.trajectory import Rollout
from prorag.pipelines.compare.nodes import report_comparison
from prorag.reporting.compare_params import CompareParams
from prorag.tracking.traces import log_rollout_trace

SECRET = "sk-fake-0123456789"
URL = f"http://user:{SECRET}@127.0.0.1:9/v1"


def _rollout(key: str, answer: str, prompt: str = "") -> dict:
    return Rollout(question_key=f"popqa/{key}", question_id=key, dataset="popqa", question=f"Question {key}?",
                   golden_answers=("Paris",), method="standard_rag", protocol="standard_rag", prompt=prompt,
                   prompt_token_ids=[], completion=answer, segments=[], steps=None, format_ok=True, n_steps=0,
                   answer=answer, stop_reason="answer", retrieval_count=1, queries=[], retrieved_ids=[],
                   generated_tokens=3, context_tokens=10, tag_tokens=0, turns=1).to_dict()


def test_text_forms_of_a_credential_are_hidden():
    from prorag.redaction import is_secret_key, redact, redact_text

    assert redact_text(URL) == "http://***@127.0.0.1:9/v1"
    assert redact_text(f"GET https://h/x?model=m&api_key={SECRET}&n=1") == "GET https://h/x?model=m&api_key=***&n=1"
    assert redact_text(f"Authorization: Bearer {SECRET}") == "Authorization: Bearer ***"
    assert redact({"judge.base_url": URL, "judge.api_key": "k", "max_new_tokens": 8}) == {
        "judge.base_url": "http://***@127.0.0.1:9/v1", "judge.api_key": "***", "max_new_tokens": 8}
    assert not is_secret_key("api_key_env") and not redact_text("max_tokens=5&topk=3").count("***")


def test_the_comparison_report_hides_the_answer_judges_credentials():
    params = CompareParams(questions={"max_per_source": 2}, retriever={"kind": "bm25"},
                           arms=[{"name": "direct", "method": {"kind": "direct", "max_new_tokens": 8}},
                                 {"name": "standard_rag", "method": {"kind": "standard_rag", "max_new_tokens": 8}}],
                           answer_judge={"kind": "llm", "base_url": URL, "model": "m", "api_key_env": None},
                           bootstrap_resamples=50, permutation_resamples=99)
    arms = pd.DataFrame([{"arm": "standard_rag", "status": "ran", "reason": "", "adapter": "", "adapter_version": ""}])
    verdicts = pd.DataFrame(columns=["method", "question_key", "sample_index", "correct", "error"])
    *_, report, _, _, _, _ = report_comparison([_rollout("a", "Paris"), _rollout("b", "Lyon")], arms, {}, verdicts,
                                               params)
    assert "`m`" in report and "127.0.0.1:9" in report
    assert SECRET not in report


def test_the_logging_filter_hides_credentials_in_messages_arguments_and_tracebacks():
    from prorag.redaction import RedactingFilter

    record = logging.LogRecord("prorag.x", logging.WARNING, __file__, 1, "judge at %s failed", (URL,), None)
    try:
        raise RuntimeError(f"cannot reach {URL}")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    assert SECRET not in record.getMessage() and SECRET not in (record.exc_text or "")
    assert "http://***@127.0.0.1:9/v1" in record.getMessage()


def test_the_logging_filter_keeps_the_arguments_a_formatter_unpacks():
    """uvicorn's access formatter unpacks ``record.args`` (client, method, path, version, status): the filter
    redacts the path argument in place instead of flattening the message (issue 47, bug 10)."""
    from uvicorn.logging import AccessFormatter

    from prorag.redaction import RedactingFilter

    args = ("127.0.0.1:5", "POST", "/v1/completions?api_key=sk-QUERYKEY-1&n=2", "1.1", 200)
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None)
    assert RedactingFilter().filter(record)
    line = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False).format(record)
    assert line == '127.0.0.1:5 - "POST /v1/completions?api_key=***&n=2 HTTP/1.1" 200 OK', line


INFO_LOG_SCRIPT = f"""
import logging
from kedro.framework.project import configure_project  # Kedro configures logging from conf/logging.yml
configure_project("prorag")  # what `kedro run` does first: imports prorag.settings
logging.getLogger("prorag.judges.llm_judge").warning("judge m at %s: 1 of 1 verdicts unknown", {URL!r})
"""


@pytest.mark.integration
def test_info_log_hides_credentials(project_copy: Path):
    environment = {key: value for key, value in os.environ.items() if key != "KEDRO_LOGGING_CONFIG"}
    completed = subprocess.run([sys.executable, "-c", INFO_LOG_SCRIPT], cwd=project_copy, env=environment,
                               capture_output=True, text=True, timeout=60, check=True)
    log = (project_copy / "info.log").read_text(encoding="utf-8")
    assert "judge m at http://***@127.0.0.1:9/v1" in log
    assert SECRET not in log and SECRET not in completed.stdout + completed.stderr


def test_traces_hide_credentials(tmp_path: Path, mlflow_uri: str):
    experiment = mlflow.get_experiment(mlflow.create_experiment("traces", (tmp_path / "mlruns").as_uri()))
    run = mlflow.MlflowClient().create_run(experiment.experiment_id)
    record = _rollout("a", "Paris", prompt=f"use the tool at {URL}")
    log_rollout_trace(record, experiment_id=experiment.experiment_id, run_id=run.info.run_id,
                      start_ns=1_000_000_000, end_ns=2_000_000_000)
    mlflow.flush_trace_async_logging()
    [trace] = mlflow.search_traces(locations=[experiment.experiment_id], run_id=run.info.run_id, return_type="list")
    assert SECRET not in trace.to_json() and "http://***@127.0.0.1:9/v1" in trace.to_json()
