"""Items 1, 2, 11 of issue 28: the GPU lock installs (resolves against the index) and holds one faiss with H100
code, the one vLLM that fits TRL and transformers 5.23, and the project's own pins. Item 3 of issue 42: the pinned
vLLM's (and TRL's) declared torch/transformers/vLLM ranges hold the lock's pins, checked offline against the
``# declared:`` lines the lock records (and, online, those lines against the index's metadata)."""

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
    # the newest vLLM within TRL 1.16's cap (<=0.31) that admits transformers 5.23 (0.31.0 declares <5.18)
    assert pins["vllm"] == "0.30.0" and pins["torch"] == "2.13.0"
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


def test_the_pins_are_within_what_the_pinned_vllm_and_trl_declare():
    """vllm 0.30.0's wheel declares torch==2.13.0 and transformers>=5.10.4; trl 1.16.0's transformers>=4.56.2 and,
    for its vllm extra, vllm>=0.22.0,<=0.31.0. The lock records them (``# declared:``, written by ``compile``)."""
    gpu_lock = _gpu_lock()
    assert gpu_lock.check_declared(LOCK) == []
    pins = gpu_lock.read_lock(LOCK)
    declared = {(name, extra, gpu_lock.canonical(req.name)): str(req.specifier)
                for name, extra, version, req in gpu_lock.read_declared(LOCK) if version == pins[name]}
    assert declared[("vllm", "", "torch")] == "==2.13.0"
    assert declared[("vllm", "", "transformers")] == ">=5.10.4"
    assert declared[("trl", "vllm", "vllm")] == "<=0.31.0,>=0.22.0"


def _edited_lock(tmp_path: Path, *replacements: tuple[str, str]) -> Path:
    text = LOCK.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "gpu.txt"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("replacements", "expected"), [
    # the vllm pin moved without `compile`: the recorded declarations are of another release
    ([("\nvllm==0.30.0\n", "\nvllm==0.31.0\n")], "vllm==0.30.0 declared, but the lock pins vllm==0.31.0"),
    # vllm 0.31.0 as its wheel declares it: transformers capped below the lock's 5.23.0
    ([("\nvllm==0.30.0\n", "\nvllm==0.31.0\n"),
      ("vllm==0.30.0 requires transformers>=5.10.4", "vllm==0.31.0 requires transformers<5.18.0,>=5.10.4"),
      ("vllm==0.30.0 requires torch", "vllm==0.31.0 requires torch")],
     "requires transformers<5.18.0,>=5.10.4, the lock pins transformers==5.23.0"),
    # torch bumped past what vllm pins
    ([("\ntorch==2.13.0\n", "\ntorch==2.14.0\n")], "requires torch==2.13.0, the lock pins torch==2.14.0"),
    # a vllm above TRL 1.16's cap (vllm 0.33.0 declares torch==2.14.0, transformers<5.21.0,>=5.16.1)
    ([("\nvllm==0.30.0\n", "\nvllm==0.33.0\n"), ("\ntorch==2.13.0\n", "\ntorch==2.14.0\n"),
      ("vllm==0.30.0 requires torch==2.13.0", "vllm==0.33.0 requires torch==2.14.0"),
      ("vllm==0.30.0 requires transformers>=5.10.4", "vllm==0.33.0 requires transformers<5.21.0,>=5.16.1")],
     "trl[vllm]==1.16.0 requires vllm<=0.31.0,>=0.22.0, the lock pins vllm==0.33.0"),
    # a lock written without its declarations
    ([("# declared: vllm==0.30.0 requires transformers>=5.10.4\n", "")],
     "no declaration of vllm==0.30.0 about transformers"),
])
def test_a_pin_outside_what_the_pinned_vllm_declares_fails(tmp_path, replacements, expected):
    problems = _gpu_lock().check_declared(_edited_lock(tmp_path, *replacements))
    assert any(expected in problem for problem in problems), problems


def _index_reachable(url: str = "https://pypi.org/simple/pip/") -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return None
    except OSError as error:
        return f"the package index cannot be reached ({error}): the GPU lock was not resolved"


@pytest.mark.integration
@pytest.mark.network
@pytest.mark.slow
def test_the_lock_resolves_against_the_index_and_is_closed():
    """`pip install --dry-run --ignore-installed --report` of requirements/gpu.txt (about 2 min on this machine):
    pip must resolve it (with dependencies: a vllm whose declared torch/transformers exclude the pins fails here) and
    add or change nothing, and the lock's ``# declared:`` lines must be what the index's metadata declares."""
    reason = _index_reachable()
    if reason:
        pytest.skip(reason)
    resolved = _gpu_lock().check_lock()
    assert resolved["vllm"] == "0.30.0" and resolved["faiss-gpu"] == "1.15.1"
