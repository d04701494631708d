"""Finished rollouts as MLflow traces (spans per turn and search, in order) and verdicts as feedback."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from prorag.tracking.traces import TIMING_NOTE, log_rollout_trace, log_verdicts, rollout_key, sample_rollouts


def _record(method: str, key: str, sample_index: int = 0, **fields: object) -> dict:
    return {"method": method, "question_key": key, "sample_index": sample_index, "question": "Who?",
            "dataset": "nq", "golden_answers": ["Ann"], "protocol": "none", "prompt": "p", "answer": "Ann",
            "stop_reason": "answer", "segments": [], "queries": [], "retrieved_ids": [], **fields}


def test_every_method_is_sampled_on_the_same_questions_first_samples_first():
    records = [_record(method, f"nq/{index}", sample) for method in ("base", "rl") for index in range(6)
               for sample in range(2)]
    chosen = sample_rollouts(records, 3)
    by_method = {method: [(r["question_key"], r["sample_index"]) for r in chosen if r["method"] == method]
                 for method in ("base", "rl")}
    assert by_method["base"] == by_method["rl"] and len(by_method["base"]) == 3
    assert {sample for _, sample in by_method["base"]} == {0}
    assert sample_rollouts(records, 0) == []


@pytest.mark.integration
def test_a_standard_rag_rollout_retrieves_before_it_generates(tmp_path: Path, mlflow_uri: str):
    experiment = mlflow.get_experiment(mlflow.create_experiment("traces", (tmp_path / "mlruns").as_uri()))
    run = mlflow.MlflowClient().create_run(experiment.experiment_id)
    record = _record("standard_rag", "nq/1", queries=["Who?"], retrieved_ids=[["d1", "d2", "d3"]],
                     segments=[{"text": "Ann", "token_ids": [1, 2, 3], "kind": "generated"}])
    ref = log_rollout_trace(record, experiment_id=experiment.experiment_id, run_id=run.info.run_id,
                            start_ns=1_000_000_000, end_ns=2_000_000_000)
    assert log_verdicts(ref, {"steps": [{"step_index": 0, "kind": "search", "checked": False}]}, None, 0.5) == 1
    mlflow.flush_trace_async_logging()
    [trace] = mlflow.search_traces(locations=[experiment.experiment_id], run_id=run.info.run_id,
                                   return_type="list")
    assert rollout_key(record) == ("standard_rag", "nq/1", 0) and trace.info.trace_id == ref.trace_id
    root, search, generate = trace.data.spans
    assert (search.name, generate.name) == ("search 1", "generate 1")
    assert search.outputs["passage_ids"] == ["d1", "d2", "d3"] and generate.outputs == "Ann"
    assert root.start_time_ns == search.start_time_ns == 1_000_000_000 and root.end_time_ns == 2_000_000_000
    assert search.end_time_ns == generate.start_time_ns and generate.end_time_ns == 2_000_000_000
    assert root.attributes["prorag.timing"] == TIMING_NOTE
    assert [(item.name, item.value) for item in trace.info.assessments] == [("reward", 0.5)]


@pytest.mark.integration
def test_verdicts_are_labelled_with_the_judge_that_gave_them(tmp_path: Path, mlflow_uri: str):
    """Issue 34: the deterministic reference judge's verdicts were labelled LLM_JUDGE."""
    experiment = mlflow.get_experiment(mlflow.create_experiment("verdicts", (tmp_path / "mlruns").as_uri()))
    run = mlflow.MlflowClient().create_run(experiment.experiment_id)
    sources = {}
    for kind in ("reference", "llm"):
        record = _record("hiprag_agent", f"nq/{kind}", queries=["Who?"], retrieved_ids=[["d1"]],
                         segments=[{"text": "Ann", "token_ids": [1], "kind": "generated"}])
        ref = log_rollout_trace(record, experiment_id=experiment.experiment_id, run_id=run.info.run_id,
                                start_ns=1_000_000_000, end_ns=2_000_000_000)
        verdict = {"steps": [{"step_index": 0, "kind": "non_search", "checked": True, "under": False}]}
        assert log_verdicts(ref, verdict, [{"kind": "non_search"}], judge_kind=kind) == 1
        mlflow.flush_trace_async_logging()
        trace = mlflow.get_trace(ref.trace_id)
        sources[kind] = {(a.name, a.source.source_type) for a in trace.info.assessments}
    assert sources == {"reference": {("under_search", "CODE")}, "llm": {("under_search", "LLM_JUDGE")}}
