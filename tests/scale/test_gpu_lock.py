"""Items 1, 2, 11 of issue 28: the GPU lock installs (resolves against the index) and holds one faiss with H100
code, the one vLLM that fits TRL and transformers 5.23, and the project's own pins."""

from __future__ import annotations

import importlib.util
import re
import tomllib
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "gpu.txt"


def _gpu_lock():
    spec = importlib.util.spec_from_file_location("gpu_lock", ROOT / "scripts" / "gpu_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _core_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for dependency in project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?==(\S+)", dependency)
        if match:
            pins[_gpu_lock().canonical(match.group(1))] = match.group(3)
    return pins


def test_the_lock_pins_one_installable_gpu_stack():
    pins = _gpu_lock().read_lock(LOCK)  # every line an exact pin, or an error naming it
    assert pins["vllm"] == "0.30.0"  # the only vLLM within TRL 1.16's cap (<=0.31) that admits transformers 5.23
    assert pins["trl"] == "1.16.0" and pins["transformers"] == "5.23.0"  # activation_checkpointing needs >=5.23
    assert tuple(int(part) for part in pins["fastapi"].split(".")[:2]) < (0, 137)  # vllm 0.30: fastapi<0.137
    faiss = sorted(name for name in pins if name.startswith("faiss"))
    assert faiss == ["faiss-gpu"], f"exactly one faiss (with sm_90 code), got {faiss}"  # not faiss-gpu-cu12/-cpu
    assert {"deepspeed", "boto3", "google-cloud-storage", "azure-storage-blob", "nvidia-ml-py"} <= set(pins)
    assert "flash-attn" not in pins  # nothing asks for it; SDPA is used


def test_the_lock_keeps_every_core_pin_but_the_two_it_must_change():
    pins = _gpu_lock().read_lock(LOCK)
    core = _core_pins()
    assert len(core) >= 20
    differ = {name: (version, pins.get(name)) for name, version in core.items() if pins.get(name) != version}
    assert set(differ) == {"faiss-cpu", "fastapi"}, differ
    assert "faiss-cpu" not in pins


def _index_reachable(url: str = "https://pypi.org/simple/pip/") -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return None
    except OSError as error:
        return f"the package index cannot be reached ({error}): the GPU lock was not resolved"


@pytest.mark.network
@pytest.mark.slow
def test_the_lock_resolves_against_the_index_and_is_closed():
    """`pip install --dry-run --ignore-installed --report` of requirements/gpu.txt (about 2 min on this machine):
    pip must resolve it and add or change nothing."""
    reason = _index_reachable()
    if reason:
        pytest.skip(reason)
    resolved = _gpu_lock().check_lock()
    assert resolved["vllm"] == "0.30.0" and resolved["faiss-gpu"] == "1.15.1"
