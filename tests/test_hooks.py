"""The MLflow tracking hook's artifacts: report files and adapter folders from their save versions, nothing else."""

from __future__ import annotations

from pathlib import Path

import mlflow
from kedro.io import DataCatalog, Version
from kedro.pipeline import Pipeline
from kedro_datasets.json import JSONDataset

from prorag.datasets import DirectoryDataset, JSONLinesDataset
from prorag.hooks import MlflowTrackingHook

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
    hook = MlflowTrackingHook()
    hook.after_catalog_created(catalog)
    hook.before_pipeline_run({"run_id": "session-1", "project_path": str(tmp_path)}, Pipeline([]), catalog)
    run_id = mlflow.active_run().info.run_id
    for name, data in (("rl_adapter", str(adapter)), ("report", {"cem": 0.5}), ("trajectories", [{"a": 1}])):
        catalog.save(name, data)
        hook.after_dataset_saved(name)
    hook.after_pipeline_run()

    client = mlflow.MlflowClient()
    assert {a.path for a in client.list_artifacts(run_id)} == {"models", "reporting"}
    assert {a.path for a in client.list_artifacts(run_id, "models/rl_adapter")} == {
        "models/rl_adapter/adapter_config.json", "models/rl_adapter/adapter_model.safetensors"}
    assert [a.path for a in client.list_artifacts(run_id, "reporting/report")] == ["reporting/report/report.json"]
    assert client.get_run(run_id).info.status == "FINISHED"
