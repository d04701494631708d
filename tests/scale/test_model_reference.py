"""Item 15 of issue 28: a large model folder (the full-parameter RL model, ~12-15 GB) is logged to MLflow as a
reference, not uploaded inside the run; uploaded in the background only when asked; LoRA adapters and small
folders as before. The run's own hook, MLflow with a sqlite store."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient

from prorag.tracking.mlflow_utils import TrackingParams
from prorag.tracking.model_reference import BackgroundUploads, log_model_folder


def _model(folder: Path, megabytes: float) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(b"\0" * int(megabytes * 2**20))
    return folder


def _artifacts(client: MlflowClient, run_id: str, path: str) -> list[str]:
    return sorted(item.path for item in client.list_artifacts(run_id, path))


def test_a_large_model_folder_is_a_reference_and_uploads_only_when_asked(tmp_path, mlflow_uri):
    client = MlflowClient(mlflow_uri)
    experiment = client.create_experiment("models")
    settings = TrackingParams()
    assert settings.upload_large_models is False and settings.max_artifact_mb <= 1024
    big = _model(tmp_path / "rl_adapter", 2.0)
    run = client.create_run(experiment).info.run_id
    uploads = BackgroundUploads()
    assert log_model_folder(client, run, big, "rl_adapter", max_artifact_mb=1.0, upload=False,
                            uploads=uploads) == "reference"
    assert _artifacts(client, run, "models/rl_adapter") == ["models/rl_adapter/reference.json"]
    reference = json.loads(Path(client.download_artifacts(run, "models/rl_adapter/reference.json")).read_text())
    assert reference["uri"] == big.resolve().as_uri() and reference["bytes"] > 2 * 2**20
    assert set(reference["files"]) == {"config.json", "model.safetensors"}
    assert client.get_run(run).data.tags["model_ref.rl_adapter"] == big.resolve().as_uri()

    asked = client.create_run(experiment).info.run_id
    assert log_model_folder(client, asked, big, "rl_adapter", max_artifact_mb=1.0, upload=True,
                            uploads=uploads) == "reference+upload"
    uploads.join(timeout=60)
    assert "models/rl_adapter/model.safetensors" in _artifacts(client, asked, "models/rl_adapter")

    small = _model(tmp_path / "small", 0.1)
    plain = client.create_run(experiment).info.run_id
    assert log_model_folder(client, plain, small, "small", max_artifact_mb=1.0, upload=False,
                            uploads=uploads) == "artifacts"
    assert "models/small/model.safetensors" in _artifacts(client, plain, "models/small")


def test_the_tracking_hook_logs_model_folders_through_the_reference_path():
    """The run's hook routes every non-adapter model folder through :func:`log_model_folder` (no synchronous
    ``log_artifacts`` of a whole model folder left in the hook)."""
    source = (Path(__file__).resolve().parents[2] / "src" / "prorag" / "hooks" / "mlflow_tracking.py").read_text()
    assert "log_model_folder(" in source
    assert 'artifact_path=f"models/{dataset_name}")\n' not in source.split("def _log_adapter")[0]
