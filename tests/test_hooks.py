"""The MLflow tracking hook's artifacts (report files and adapter folders from their save versions, nothing else),
the run-version hook's refusal of inputs that have no version yet, and parameter errors that name the closest key."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.io import DataCatalog, Version
from kedro.pipeline import Pipeline, node
from kedro_datasets.json import JSONDataset

from prorag.config import ParameterError
from prorag.datasets import DirectoryDataset, JSONLinesDataset
from prorag.hooks.mlflow_tracking import MlflowTrackingHook
from prorag.hooks.run_versions import RUN_MANIFEST_DIR, RunVersionHook
from prorag.tracking.missing_inputs import MissingInputError

SAVE_VERSION = "2026-01-01T00.00.00.000Z"


def test_reports_and_adapters_are_logged_from_their_save_versions(tmp_path: Path, mlflow_uri: str) -> None:
    adapter = tmp_path / "trained"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}", encoding="utf-8")
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    version = Version(None, SAVE_VERSION)
    catalog = DataCatalog({
        "rl_adapter": DirectoryDataset(filepath=str(tmp_path / "06_models/rl_adapter"), version=version),
        "report": JSONDataset(filepath=str(tmp_path / "08_reporting/report.json"), version=version),
        "trajectories": JSONLinesDataset(filepath=str(tmp_path / "07_model_output/trajectories.jsonl")),
    })
    mlflow.create_experiment("prorag", artifact_location=(tmp_path / "mlruns").as_uri())  # not the cwd's ./mlruns
    hook = MlflowTrackingHook()
    hook.after_catalog_created(catalog)
    hook.before_pipeline_run({"run_id": "session-1", "project_path": str(tmp_path)}, Pipeline([]), catalog)
    run_id = mlflow.active_run().info.run_id
    for name, data in (("rl_adapter", str(adapter)), ("report", {"cem": 0.5}), ("trajectories", [{"a": 1}])):
        catalog.save(name, data)
        hook.after_dataset_saved(name, data, None)  # saved outside a node: into the parent run
    hook.after_pipeline_run()

    client = mlflow.MlflowClient()
    assert {a.path for a in client.list_artifacts(run_id)} == {"models", "reporting"}
    assert {a.path for a in client.list_artifacts(run_id, "models/rl_adapter")} == {
        "models/rl_adapter/adapter_config.json", "models/rl_adapter/adapter_model.safetensors"}
    assert [a.path for a in client.list_artifacts(run_id, "reporting/report")] == ["reporting/report/report.json"]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_an_input_without_any_version_fails_the_run_before_it_starts(tmp_path: Path) -> None:
    catalog = DataCatalog({name: JSONLinesDataset(filepath=str(tmp_path / f"{name}.jsonl"),
                                                  version=Version(None, SAVE_VERSION))
                           for name in ("never_written", "pinned")})
    pipeline = Pipeline([node(lambda a, b: a, ["never_written", "pinned"], "out", name="use")])
    hook = RunVersionHook()
    hook.after_catalog_created(catalog)
    run_params = {"run_id": SAVE_VERSION, "project_path": str(tmp_path), "load_versions": {"pinned": "v1"}}
    with pytest.raises(MissingInputError, match=r"^never_written has no version yet, and no registered pipeline "
                                                r"writes it$"):
        hook.before_pipeline_run(run_params, pipeline, catalog)  # "pinned" is --load-versions': Kedro's to load
    assert not (tmp_path / RUN_MANIFEST_DIR).exists()  # no manifest: the run never started


def test_train_rl_on_a_fresh_project_names_the_pipelines_to_run_first(project_copy: Path, mlflow_uri: str) -> None:
    bootstrap_project(project_copy)
    with KedroSession.create(project_path=project_copy) as session, pytest.raises(MissingInputError) as error:
        session.run(pipeline_names=["train_rl"], to_nodes=["rl.train_rl"])  # a namespaced node name resolves
    assert str(error.value).splitlines() == [
        "3 inputs of this run have no version yet:",
        "  index_questions has no version yet: run `kedro run --pipelines=index` "
        "(or train_sft, train) first",
        "  retrieval_index has no version yet: run `kedro run --pipelines=index` "
        "(or train_sft, train) first",
        "  sft_adapter has no version yet: run `kedro run --pipelines=train_sft` (or train) first"]
    assert not any((project_copy / "data").glob("0[2-8]_*/**/*.*"))  # no node ran
    assert not mlflow.search_runs(search_all_experiments=True, output_format="list")  # no MLflow run opened


def test_a_mistyped_key_read_by_a_typed_node_gets_the_suggestion_before_kedro_s_own_check(
        project_copy: Path, mlflow_uri: str) -> None:
    bootstrap_project(project_copy)
    with (KedroSession.create(project_path=project_copy, runtime_params={"reward": {"lambda_pp": 0.1}}) as session,
          pytest.raises(ParameterError, match=r"unknown parameter key 'reward\.lambda_pp'; did you mean "
                                              r"'reward\.lambda_p'\?")):
        session.run(pipeline_names=["train_rl"])  # rl.train_rl's RewardSettings annotation: Kedro validates it too
