"""Item 4 of issue 28: the GPU smoke test's CPU path (``--dry-run``) and its packing step, so neither rots between
the sessions that are lent a GPU. The GPU run itself is not a test: its report goes into docs/scaling.md."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packing_cuts_the_bundle_into_parts_that_travel_and_join_back(tmp_path):
    pack = _script("scripts/gpu_smoke_pack.py")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    contents = {f"pkg{index}-1.0-py3-none-any.whl": bytes([index]) * (700_000 + index) for index in range(4)}
    for name, data in contents.items():
        (wheels / name).write_bytes(data)
    manifest = pack.pack(wheels, tmp_path / "out", part_mib=1.0)
    assert len(manifest["parts"]) >= 3
    assert all(part["bytes"] <= 2**20 for part in manifest["parts"])
    runbook = pack.runbook(manifest)
    assert runbook.count("carry=") == len(manifest["parts"]) and "benchmarks/gpu_smoke.py --out $OUT" in runbook
    unpacked = pack.unpack(tmp_path / "out", tmp_path / "device")
    assert {path.name: path.read_bytes() for path in unpacked} == contents
    (tmp_path / "out" / "part-001").write_bytes(b"broken")
    with pytest.raises(SystemExit, match="sha256 mismatch"):
        pack.unpack(tmp_path / "out", tmp_path / "device2")


def test_every_smoke_package_has_a_pinned_version():
    pack = _script("scripts/gpu_smoke_pack.py")
    pins = {**pack.lock_pins(), **pack.PINNED_ELSEWHERE}
    assert [name for name in pack.SMOKE_PACKAGES if name not in pins] == []
    assert pins["transformers"] == "5.23.0"  # a GPU image's older transformers lacks activation_checkpointing


@pytest.mark.integration
@pytest.mark.slow
def test_the_smoke_test_runs_every_step_on_the_cpu(tmp_path):
    """``--dry-run``: every GPU path on the CPU with the tiny model (under a minute alone on 2 cores)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py"), "--dry-run", "--passages", "80",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, check=False)
    report = json.loads((tmp_path / "report.json").read_text())
    statuses = {step["step"]: step["status"] for step in report["steps"]}
    assert statuses == dict.fromkeys(_script("benchmarks/gpu_smoke.py").STEPS, "ok"), done.stdout[-3000:]
    assert report["environment"]["device"] == "cpu" and done.returncode == 0
    assert (tmp_path / "report.md").read_text().startswith("# GPU smoke test")
