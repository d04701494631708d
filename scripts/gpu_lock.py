"""Compile and check the GPU lock (``requirements/gpu.txt``) from its top-level pins (``requirements/gpu.in``).

``compile`` resolves ``gpu.in`` against the package index with pip's resolver (a dry run: nothing is installed)
and writes every resolved distribution as ``name==version``; ``check`` resolves ``gpu.txt`` the same way and
fails when the resolution is impossible or pulls in a distribution the lock does not list. Both ignore the local
wheel folders and pip configuration of this machine (``--isolated``), so a CPU-only torch wheel never hides the
CUDA one the index serves.

    python scripts/gpu_lock.py compile      # after editing requirements/gpu.in
    python scripts/gpu_lock.py check        # what tests/scale/test_gpu_lock.py runs
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK_IN = ROOT / "requirements" / "gpu.in"
LOCK = ROOT / "requirements" / "gpu.txt"
INDEX = "https://pypi.org/simple"
HEADER = """\
# The GPU lock: every distribution of the paper-scale (conf/gpu) environment, exact. Generated from gpu.in by
#   python scripts/gpu_lock.py compile
# (a pip dry run against PyPI), for CPython {python} on {platform}. Install it with `make gpu-setup`:
#   pip install -r requirements/gpu.txt && pip install --no-deps -e .
# The project is installed without its own dependencies because two of them differ here on purpose:
#   faiss-cpu is left out (faiss-gpu installs the same `faiss` package; the two must never share an env),
#   fastapi is 0.136.x (vllm 0.30.0 requires fastapi<0.137; the project's servers pass their tests on it).
# torch 2.13.0 and vllm 0.30.0 from PyPI are CUDA 13 builds: NVIDIA driver R580 or newer. faiss-gpu 1.15.1
# brings its own CUDA 12 runtime (sm_90 code for H100). See docs/scaling.md.
"""

_CANONICAL = re.compile(r"[-_.]+")


def canonical(name: str) -> str:
    """PEP 503 normalised name."""
    return _CANONICAL.sub("-", name).lower()


def resolve(requirements: Path, *, index: str = INDEX, timeout: float = 900.0) -> tuple[dict[str, str], dict]:
    """``{name: version}`` pip's resolver picks for ``requirements`` (a dry run), and the report's environment."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                   "--quiet", "--index-url", index, "--report", str(report), "-r", str(requirements)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not resolve {requirements}:\n{done.stderr[-4000:]}")
        data = json.loads(report.read_text())
    resolved = {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in data["install"]}
    return resolved, data.get("environment", {})


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """The ``name==version`` lines of a lock (``name[extra]==version`` counts as ``name``); anything else is an
    error naming the line."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)", line)
        if match is None:
            raise ValueError(f"{path}:{number}: not an exact pin (name==version): {raw!r}")
        pins[canonical(match.group(1))] = match.group(3)
    return pins


def compile_lock() -> Path:
    started = time.monotonic()
    resolved, environment = resolve(LOCK_IN)
    platform = f"{environment.get('sys_platform', '?')} {environment.get('platform_machine', '?')}"
    header = HEADER.format(python=environment.get("python_full_version", "?"), platform=platform)
    body = "".join(f"{name}=={version}\n" for name, version in sorted(resolved.items()))
    LOCK.write_text(header + body)
    print(f"wrote {LOCK} ({len(resolved)} distributions, resolved in {time.monotonic() - started:.0f} s)")
    return LOCK


def check_lock() -> dict[str, str]:
    """Resolve the lock; raise when pip cannot, or when it adds or changes a distribution."""
    pins = read_lock()
    resolved, _ = resolve(LOCK)
    extra = sorted(set(resolved) - set(pins))
    changed = sorted(name for name in set(resolved) & set(pins) if resolved[name] != pins[name])
    if extra or changed:
        raise RuntimeError(f"{LOCK} is not closed: pip adds {extra} and changes {changed}; run "
                           "`python scripts/gpu_lock.py compile`")
    return resolved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["compile", "check"])
    args = parser.parse_args(argv)
    if args.action == "compile":
        compile_lock()
    else:
        started = time.monotonic()
        resolved = check_lock()
        print(f"{LOCK} resolves: {len(resolved)} distributions in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
