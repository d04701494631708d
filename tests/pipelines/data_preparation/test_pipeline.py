"""The data-preparation nodes on real vendored data, and the pipeline through a real Kedro session."""

import json

import mlflow
import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from prorag.config import ParameterError
from prorag.data import DataFileError
from prorag.datasets import RawFilesDataset
from prorag.pipelines.data_preparation import create_pipeline
from prorag.pipelines.data_preparation.params import DataPreparationParams

RAW = "data/01_raw"


def _params(**overrides):
    values = {"question_files": [f"{RAW}/qa/popqa.jsonl", f"{RAW}/qa/nq.jsonl"],
              "corpus_files": [f"{RAW}/corpus/popqa.jsonl"], "max_questions_per_source": 40}
    return DataPreparationParams(**{**values, **overrides})


def _run(params):
    catalog = DataCatalog({"params:data_preparation": MemoryDataset(params),
                           "raw_question_files": RawFilesDataset(filepath=f"{RAW}/qa"),
                           "raw_corpus_files": RawFilesDataset(filepath=f"{RAW}/corpus")})
    outputs = SequentialRunner().run(create_pipeline(), catalog)
    return {name: value.load() if hasattr(value, "load") else value for name, value in outputs.items()}


def test_report_on_real_data(project_root, monkeypatch):
    monkeypatch.chdir(project_root)
    outputs = _run(_params())
    report = outputs["data_report"]
    assert report["questions_total"] == 80
    assert report["passages_total"] == 1059
    rows = {row["source"]: row for row in report["sources"]}
    assert rows["popqa"]["with_supporting_passages"] == 40
    assert rows["popqa"]["supporting_passages_missing"] == 0
    assert rows["popqa"]["answer_in_supporting_passage_rate"] == 1.0
    assert rows["nq"]["with_supporting_passages"] == 0
    assert outputs["data_report_metrics"]["popqa.questions"] == 40
    assert list(outputs["data_report_table"]["source"]) == ["nq", "popqa"]


def test_missing_supporting_passages_are_reported(project_root, monkeypatch):
    monkeypatch.chdir(project_root)
    report = _run(_params(corpus_files=[f"{RAW}/corpus/musique.jsonl"]))["data_report"]
    rows = {row["source"]: row for row in report["sources"]}
    assert rows["popqa"]["supporting_passages_missing"] == 40
    assert len(report["questions_with_missing_supporting_passages"]["popqa"]) == 40


def test_same_question_in_two_files_is_an_error(tmp_path, project_root, monkeypatch):
    monkeypatch.chdir(project_root)
    copy = tmp_path / "popqa_copy.jsonl"
    copy.write_text((project_root / RAW / "qa" / "popqa.jsonl").read_text())
    with pytest.raises(DataFileError, match=r"popqa_copy\.jsonl: question 'popqa/0' is also in"):
        _run(_params(question_files=[f"{RAW}/qa/popqa.jsonl", str(copy)]))


def test_a_missing_file_names_its_parameter_and_what_the_raw_folder_has(project_root, monkeypatch):
    monkeypatch.chdir(project_root)
    with pytest.raises(DataFileError, match=r"qa/nope\.jsonl: file not found \(listed in parameter 'data_prepar"
                                            r"ation\.question_files'; data/01_raw/qa has: bamboogle\.jsonl, "):
        _run(_params(question_files=[f"{RAW}/qa/nope.jsonl"]))
    with pytest.raises(DataFileError, match=r"'data_preparation\.corpus_files'; data/01_raw/corpus has: hotpotqa"):
        _run(_params(corpus_files=[f"{RAW}/corpus/nope.jsonl"]))


def test_held_out_files_outside_the_raw_folder_are_read_with_file_and_line_errors(tmp_path, project_root,
                                                                                   monkeypatch):
    monkeypatch.chdir(project_root)
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join((project_root / RAW / "qa" / "popqa.jsonl").read_text().splitlines(True)[:3]))
    outputs = _run(_params(question_files=[str(held_out)], max_questions_per_source=None))
    assert outputs["data_report"]["questions_total"] == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q", "golden_answers": ["a"], "dataset": "d"}\n{"id": 2,\n')
    with pytest.raises(DataFileError, match=r"bad\.jsonl:2: malformed JSON"):
        _run(_params(question_files=[str(bad)]))


def test_parameters_reject_unknown_keys_and_repeats():
    with pytest.raises(ValueError, match="max_question_per_source"):
        DataPreparationParams(question_files=["a"], max_question_per_source=3)
    with pytest.raises(ValueError, match="listed more than once"):
        DataPreparationParams(question_files=["a", "a"])


def _session_run(project, **runtime_params):
    bootstrap_project(project)
    with KedroSession.create(project_path=project, runtime_params=runtime_params) as session:
        return session.run(pipeline_names=["data_preparation"])


@pytest.mark.integration
def test_run_is_tracked_in_mlflow(project_copy, mlflow_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.5")  # MLflow's default, 10 s, outlasts the run
    _session_run(project_copy, data_preparation={"max_questions_per_source": 5},
                 tracking={"experiment_name": "prorag-test"})
    mlflow.set_tracking_uri(mlflow_uri)
    runs = mlflow.search_runs(experiment_names=["prorag-test"], output_format="list")
    [run] = [item for item in runs if "mlflow.parentRunId" not in item.data.tags]  # the parent of the kedro run
    [stage] = [item for item in runs if item.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert run.info.status == stage.info.status == "FINISHED"
    tags, params = run.data.tags, run.data.params
    assert tags["kedro.pipeline"] == "data_preparation" and tags["prorag.kind"] == "pipeline"
    session_id = tags["kedro.session_id"]
    assert (project_copy / "data/08_reporting/data_report.json" / session_id / "data_report.json").is_file()
    assert json.loads(tags["kedro.runtime_params"])["data_preparation.max_questions_per_source"] == 5
    assert "git.sha" in tags
    assert params["data_preparation.max_questions_per_source"] == "5"
    assert params["tracking.experiment_name"] == "prorag-test"
    assert "system/cpu_utilization_percentage" in run.data.metrics
    inputs = {item.dataset.name: item for item in run.inputs.dataset_inputs}
    assert set(inputs) == {"questions", "passages"}
    assert json.loads(inputs["questions"].dataset.profile)["num_rows"] == 35
    assert [(tag.key, tag.value) for tag in inputs["questions"].tags] == [("mlflow.data.context", "data_preparation")]
    assert mlflow.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert stage.info.run_name == "data_preparation" and stage.data.tags["prorag.stage"] == "data_preparation"
    assert stage.data.tags["kedro.session_id"] == session_id
    assert stage.data.params["data_preparation.max_questions_per_source"] == "5"
    assert stage.data.metrics["data_report.questions_total"] == 35  # 7 question files, first 5 of each
    assert stage.data.metrics["data_report.passages_total"] == 23575
    client = mlflow.MlflowClient()
    assert {a.path for a in client.list_artifacts(stage.info.run_id, "reporting")} == {
        "reporting/data_report", "reporting/data_report_table"}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "reporting")} == {"reporting/node_timing"}


@pytest.mark.integration
def test_failed_run_is_marked_failed_with_file_and_line(project_copy, mlflow_uri):
    bad = project_copy / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q", "golden_answers": ["a"], "dataset": "d"}\n{"id": 2,\n')
    with pytest.raises(DataFileError, match=r"bad\.jsonl:2"):
        _session_run(project_copy, data_preparation={"question_files": [str(bad)]})
    mlflow.set_tracking_uri(mlflow_uri)
    runs = mlflow.search_runs(experiment_names=["prorag"], output_format="list")
    [run] = [item for item in runs if "mlflow.parentRunId" not in item.data.tags]
    [stage] = [item for item in runs if item.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert run.info.status == stage.info.status == "FAILED"
    assert "bad.jsonl:2" in run.data.tags["error"] and "bad.jsonl:2" in stage.data.tags["error"]


@pytest.mark.integration
def test_missing_data_file_names_its_path(project_copy, mlflow_uri):
    with pytest.raises(DataFileError, match=r"data/01_raw/qa/nope\.jsonl: file not found"):
        _session_run(project_copy, data_preparation={"question_files": ["data/01_raw/qa/nope.jsonl"]})


def test_unknown_parameter_fails_before_any_run_is_opened(project_copy, mlflow_uri):
    with pytest.raises(ParameterError, match="unknown parameter key 'nonsense'"):
        _session_run(project_copy, nonsense=1)
    mlflow.set_tracking_uri(mlflow_uri)
    experiment = mlflow.get_experiment_by_name("prorag")
    assert experiment is None or not mlflow.search_runs([experiment.experiment_id], output_format="list")


def test_unknown_nested_parameter_is_reported(project_copy, mlflow_uri):
    with pytest.raises(Exception, match="max_question_per_source"):
        _session_run(project_copy, data_preparation={"max_question_per_source": 1})
