"""Trained policies on an OpenAI-compatible server: LoRA adapters by vLLM's LoRA support, full models by name.

A policy server (``vllm serve Qwen/Qwen2.5-3B-Instruct --port 8000``) serves the base model under its name. After
training, the policy is either

* a **PEFT LoRA adapter** folder: :func:`served_adapter_name` loads it into the running server
  (``POST /v1/load_lora_adapter``; the server runs with ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) under a name derived from its path, and requests name that adapter
  as their ``model`` — vLLM applies it per request, beside the base model; or
* a **full model** folder (full-parameter RL): no running server knows it. :func:`served_model_name` asks the
  :class:`TrainedServerSpec`'s endpoint whether it serves the folder's name (``GET /v1/models``); if not and
  ``launch`` is set, it starts ``command`` (by default ``vllm serve <folder> --served-model-name <name>``) on the
  declared GPUs and port (:func:`prorag.llm.server_process.start_server`: its log's last lines in any error), waits
  until it serves the name, and stops it when the process exits. Without ``launch`` it refuses
  with the command to start.

A local folder is never sent as a ``model`` name: a server answers "model does not exist" for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

import httpx
from pydantic import Field

from prorag.config import StrictModel
from prorag.llm.registry import cache_dir
from prorag.llm.server_process import (
    ServerProcess,
    ServerStartError,
    auth_headers,
    served_models,
    server_root,
    start_server,
)

logger = logging.getLogger(__name__)

VLLM_SERVE: Final = ("vllm", "serve", "{model}", "--served-model-name", "{name}", "--host", "{host}", "--port",
                     "{port}", "--generation-config", "vllm", "--dtype", "bfloat16", "--gpu-memory-utilization",
                     "{gpu_memory_utilization}", "--enable-prefix-caching")
"""The default launch command; ``--generation-config vllm`` keeps the model's generation-config sampling defaults
out of requests (the client also sends every sampling field, :data:`prorag.llm.openai_backend.NEUTRAL_SAMPLING`)."""


class ServedModelError(RuntimeError):
    """A trained policy cannot be reached on an OpenAI-compatible server."""


class TrainedServerSpec(StrictModel):
    """Where a full-parameter trained model is served (``policy.trained_server``)."""

    base_url: str = Field(pattern=r"^https?://")
    """The server's OpenAI-compatible ``/v1`` URL (e.g. ``http://127.0.0.1:8003/v1``)."""
    launch: bool = False
    """Start ``command`` for the folder when the server does not serve it (and stop it at exit)."""
    gpus: list[int] = Field(default_factory=list)
    """``CUDA_VISIBLE_DEVICES`` of the launched server (its own GPUs: placement.servers.trained_policy.gpus)."""
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    command: list[str] = Field(default_factory=lambda: list(VLLM_SERVE), min_length=1)
    """The launch command; ``{model}``, ``{name}``, ``{host}``, ``{port}``, ``{gpu_memory_utilization}`` are
    filled in."""
    startup_timeout: float = Field(default=900.0, gt=0)


def _digest(path: str) -> str:
    return hashlib.sha256(str(Path(path).expanduser().resolve()).encode()).hexdigest()[:12]


def adapter_name(adapter_dir: str) -> str:
    """The name an adapter folder is served under (stable for one path)."""
    return f"lora-{Path(adapter_dir).name}-{_digest(adapter_dir)}"


def trained_model_name(folder: str) -> str:
    """The name a full trained model folder is served under (stable for one path)."""
    return f"trained-{Path(folder).name}-{_digest(folder)}"


def is_local_folder(model: str) -> bool:
    """Whether ``model`` names a folder on this machine (not a hub or registry name)."""
    return Path(model).expanduser().is_dir()


def served_adapter_name(base_url: str, adapter_dir: str, *, api_key: str | None = None,
                        timeout: float = 120.0) -> str:
    """Load the PEFT adapter at ``adapter_dir`` into the server at ``base_url`` (once) and return its name."""
    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        raise ServedModelError(f"{adapter_dir} is not a PEFT adapter folder (no adapter_config.json)")
    name = adapter_name(adapter_dir)
    if name in served_models(base_url, api_key=api_key):
        return name
    body = {"lora_name": name, "lora_path": str(Path(adapter_dir).expanduser().resolve())}
    try:
        response = httpx.post(server_root(base_url) + "/v1/load_lora_adapter", json=body, headers=auth_headers(api_key),
                              timeout=timeout)
    except httpx.HTTPError as error:
        raise ServedModelError(f"cannot reach the policy server {base_url} to load the adapter {adapter_dir}: "
                               f"{error}") from error
    if response.status_code == 200 or "already" in response.text.lower():
        logger.info("adapter %s served by %s as %s", adapter_dir, base_url, name)
        return name
    raise ServedModelError(
        f"the policy server {base_url} refused to load the LoRA adapter {adapter_dir} ({response.status_code}: "
        f"{response.text[:300]}). Start it with LoRA support, e.g. `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve "
        "MODEL --enable-lora --max-lora-rank 16 ...` (docs/scaling.md), on the same machine as the adapter folder")


_LAUNCHED: dict[str, tuple[ServerProcess, str]] = {}
"""Servers this process started: base_url -> (server, folder)."""


def _stop(base_url: str) -> None:
    server, folder = _LAUNCHED.pop(base_url)
    server.stop(timeout=60)
    logger.info("stopped the server of %s at %s", folder, base_url)


def stop_launched_servers() -> None:
    """Stop every server this process started (at exit, :func:`prorag.llm.server_process.stop_started_servers` does)."""
    for base_url in list(_LAUNCHED):
        with contextlib.suppress(Exception):
            _stop(base_url)


def launch_command(spec: TrainedServerSpec, folder: str, name: str) -> list[str]:
    """``spec.command`` filled in for ``folder`` served as ``name``."""
    url = urlparse(spec.base_url)
    values = {"model": str(Path(folder).expanduser().resolve()), "name": name, "host": url.hostname or "127.0.0.1",
              "port": str(url.port or 80), "gpu_memory_utilization": f"{spec.gpu_memory_utilization:g}"}
    return [part.format(**values) for part in spec.command]


def served_model_name(spec: TrainedServerSpec | None, folder: str, *, api_key: str | None = None) -> str:
    """The name under which ``spec``'s server serves the full model ``folder``; launches it when asked to."""
    name = trained_model_name(folder)
    if spec is None:
        raise ServedModelError(
            f"the trained model {folder} is a local folder that no server serves: declare policy.trained_server "
            f"(base_url, and launch: true to let the run start `vllm serve {folder} --served-model-name {name}` on "
            "placement.servers.trained_policy's GPU), or use backend: transformers")
    if name in served_models(spec.base_url, api_key=api_key):
        return name
    if not spec.launch:
        raise ServedModelError(
            f"{spec.base_url} does not serve {name}: start `vllm serve {folder} --served-model-name {name} "
            f"--port {urlparse(spec.base_url).port}` there, or set policy.trained_server.launch: true")
    if spec.base_url in _LAUNCHED:
        _stop(spec.base_url)  # it serves an earlier folder; one trained model per declared GPU
    command = launch_command(spec, folder, name)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in spec.gpus)} if spec.gpus else {}
    try:
        server = start_server(command, spec.base_url, cache_dir() / "logs" / f"{name}.log", served_name=name,
                              api_key=api_key, model_dir=folder, env=env, startup_timeout=spec.startup_timeout)
    except ServerStartError as error:
        raise ServedModelError(str(error)) from error
    _LAUNCHED[spec.base_url] = (server, folder)
    return name
