"""Shared parts of the one-node GPU tests (issue 28): conf/gpu's parameters, a fake 8-GPU machine, and the project's
own OpenAI-compatible server on loopback with every request body captured."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from prorag.config_loader import CONFIG_LOADER_ARGS
from prorag.config_loader import ProjectConfigLoader as OmegaConfigLoader
from prorag.gpus import NODE_GPUS_ENV
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.methods import trainer_blocks
from prorag.scale.memory import TrainerLoad
from prorag.scale.preflight import Preflight
from prorag.scale.preflight import preflight as run_preflight
from prorag.scale.preflight import trainer_loads as loads_of
from prorag.serving import create_app, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def gpu_parameters(runtime_params: dict | None = None) -> dict:
    """conf/base + conf/gpu (+ runtime params, as an experiment's ``run.params``)."""
    loader = OmegaConfigLoader(str(CONF), **{**CONFIG_LOADER_ARGS, "default_run_env": "gpu"},
                               runtime_params=runtime_params or {})
    return loader["parameters"]


def preflight(parameters: dict) -> Preflight:
    """The GPU preflight as the hook and ``kedro preflight`` run it: with the recipes' trainer blocks."""
    return run_preflight(parameters, trainer_blocks(parameters))


def trainer_loads(parameters: dict) -> list[TrainerLoad]:
    """The memory check's view of ``parameters``' GPU trainers, with the recipes' trainer blocks."""
    return loads_of(parameters, trainer_blocks(parameters))


def preset_params(name: str = "multistage_gpu.yml") -> dict:
    import yaml

    return yaml.safe_load((ROOT / "experiments" / name).read_text())["run"]["params"]


@pytest.fixture
def eight_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reports 8 CUDA devices (fewer when ``CUDA_VISIBLE_DEVICES`` names fewer), CUDA not yet initialised, no
    distributed launch."""

    def count() -> int:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return 8 if visible is None else len([gpu for gpu in visible.split(",") if gpu.strip()])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", count)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in ("CUDA_VISIBLE_DEVICES", NODE_GPUS_ENV, "WORLD_SIZE"):  # set first, so whatever the run sets is undone
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


class Captured:
    """Request bodies a server received, by path."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict]] = []

    def of(self, path: str) -> list[dict]:
        return [body for seen, body in self.bodies if seen == path]


def capturing(app, captured: Captured):
    """An ASGI wrapper recording the JSON body of every POST before ``app`` answers it."""

    async def wrapper(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            captured.bodies.append((scope["path"], json.loads(body or b"{}")))
        except ValueError:
            captured.bodies.append((scope["path"], {}))
        sent = False

        async def replay():
            nonlocal sent
            if sent:  # then the real channel: it says disconnect only when the client has left
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)

    return wrapper


@pytest.fixture(scope="module")
def policy_server() -> Iterator[tuple[str, Captured]]:
    """The project's server with the tiny model as ``policy`` on loopback (``/v1`` URL), every POST captured; it also
    accepts vLLM's ``/v1/load_lora_adapter`` (recorded, answered 200) as a server started with ``--enable-lora``."""
    captured = Captured()
    app = create_app(TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=4), "policy", max_tokens_limit=64)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter() -> dict:
        return {"status": "loaded"}

    url, stop = serve_in_thread(capturing(app, captured))
    yield url, captured
    stop()
