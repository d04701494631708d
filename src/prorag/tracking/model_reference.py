"""Large model folders in MLflow: a reference, and an upload only when asked, off the run's critical path.

A full-parameter trained policy is a model folder of several GB (Qwen2.5-3B in fp32 master weights: ~12 GB; 7B in
bf16: ~15 GB). Uploading it synchronously with ``log_artifacts`` stalls the ``kedro run`` for minutes and fills the
artifact store with every run's copy. Field practice is to log adapters and metrics, and a pointer to the model.

:func:`log_model_reference` logs, for a folder larger than ``max_artifact_mb``, a small ``reference.json`` artifact
(the folder's URI on this machine, its size, its files and their sizes, the digest of its ``config.json``) and
``model_ref.<name>`` tags; with ``upload`` it also uploads the folder on a background thread
(:class:`BackgroundUploads`, joined before the run ends). A folder within the limit is uploaded as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow import MlflowClient

logger = logging.getLogger(__name__)


def folder_bytes(path: Path) -> int:
    """The size of every file under ``path``."""
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def reference(path: Path) -> dict[str, Any]:
    """What ``reference.json`` holds for the model folder ``path``."""
    files = {str(item.relative_to(path)): item.stat().st_size for item in sorted(path.rglob("*")) if item.is_file()}
    config = path / "config.json"
    return {"uri": path.resolve().as_uri(), "bytes": sum(files.values()), "files": files,
            "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None}


class BackgroundUploads:
    """Artifact uploads on daemon threads; :meth:`join` waits for them (before the run is ended)."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self, client: MlflowClient, run_id: str, path: Path, artifact_path: str) -> None:
        def upload() -> None:
            try:
                client.log_artifacts(run_id, str(path), artifact_path=artifact_path)
                logger.info("MLflow: uploaded %s to %s/%s", path, run_id, artifact_path)
            except Exception as error:  # the run goes on; the reference stays
                self.errors.append(f"{path}: {error}")
                logger.warning("MLflow: the background upload of %s failed: %s", path, error)

        thread = threading.Thread(target=upload, name=f"mlflow-upload-{path.name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)
        self._threads = [thread for thread in self._threads if thread.is_alive()]


def log_model_folder(client: MlflowClient, run_id: str, path: Path, name: str, *, max_artifact_mb: float,
                     upload: bool, uploads: BackgroundUploads) -> str:
    """Log the model folder ``path`` of dataset ``name`` (module docstring); returns ``"artifacts"``,
    ``"reference"`` or ``"reference+upload"``."""
    size = folder_bytes(path)
    artifact_path = f"models/{name}"
    if size <= max_artifact_mb * 2**20:
        client.log_artifacts(run_id, str(path), artifact_path=artifact_path)
        return "artifacts"
    described = reference(path)
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "reference.json"
        file.write_text(json.dumps(described, indent=2))
        client.log_artifact(run_id, str(file), artifact_path=artifact_path)
    client.set_tag(run_id, f"model_ref.{name}", described["uri"])
    client.set_tag(run_id, f"model_ref.{name}.bytes", str(size))
    logger.info("MLflow: %s (%.1f GB) logged as a reference to %s%s", name, size / 1e9, described["uri"],
                "; uploading it in the background" if upload else " (tracking.upload_large_models: false)")
    if upload:
        uploads.start(client, run_id, path, artifact_path)
        return "reference+upload"
    return "reference"
