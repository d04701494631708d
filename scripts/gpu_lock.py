"""Compile and check the GPU lock (``requirements/gpu.txt``) from its top-level pins (``requirements/gpu.in``).

``compile`` resolves ``gpu.in`` against the package index with pip's resolver (a dry run: nothing is installed)
and writes every resolved distribution as ``name==version``; ``check`` resolves ``gpu.txt`` the same way and
fails when the resolution is impossible or pulls in a distribution the lock does not list. Both ignore the local
wheel folders and pip configuration of this machine (``--isolated``), so a CPU-only torch wheel never hides the
CUDA one the index serves.

``compile`` also records in the lock what the wheels of the pinned vLLM and TRL declare (their ``Requires-Dist``) of
torch, transformers and vLLM, as ``# declared:`` lines: ``check_declared`` tests the lock's pins against them
offline (TRL's ``vllm`` extra included, which pip does not enforce: the lock does not ask for that extra), and
``check`` fails when the index's metadata no longer matches what was recorded.

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

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

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

DECLARED_HEADER = """\
# What the pinned vllm and trl declare (their wheels' Requires-Dist) of torch, transformers and vllm, recorded by
# `compile` from the resolver's report; tests/scale/test_gpu_lock.py checks the pins below against them offline
# (trl[vllm] included: pip does not enforce an extra the lock does not ask for).
"""
WATCHED = {"vllm": ("torch", "transformers"), "trl": ("transformers", "vllm")}
"""``{distribution: the distributions whose declared ranges it must share with the lock}``: each pair needs at least
one ``# declared:`` line in the lock, at the locked version of the distribution."""
_DECLARED = re.compile(r"#\s*declared:\s*([A-Za-z0-9._-]+)(?:\[([A-Za-z0-9._-]+)\])?==(\S+)\s+requires\s+(.+?)\s*$")

_CANONICAL = re.compile(r"[-_.]+")


def canonical(name: str) -> str:
    """PEP 503 normalised name."""
    return _CANONICAL.sub("-", name).lower()


def resolve(requirements: Path, *, index: str = INDEX, timeout: float = 900.0) -> tuple[dict[str, str], dict]:
    """``{name: version}`` pip's resolver picks for ``requirements`` (a dry run), and the report's environment (with
    ``declared``: the lines :func:`declared_lines` makes of the report)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                   "--quiet", "--index-url", index, "--report", str(report), "-r", str(requirements)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not resolve {requirements}:\n{done.stderr[-4000:]}")
        data = json.loads(report.read_text())
    resolved = {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in data["install"]}
    environment = dict(data.get("environment", {}))
    environment["declared"] = declared_lines(data["install"], environment)
    return resolved, environment


def declared_lines(install: list[dict], environment: dict) -> list[str]:
    """``# declared: NAME[EXTRA]==VERSION requires REQUIREMENT`` for every ``Requires-Dist`` of a :data:`WATCHED`
    distribution in a pip report's ``install`` list that names one of its watched distributions with a version
    range and applies on the report's platform (the marker, for no extra or one of them, evaluated there)."""
    base = {**default_environment(), **{key: value for key, value in environment.items() if isinstance(value, str)}}
    lines = []
    for item in install:
        metadata = item["metadata"]
        name = canonical(metadata["name"])
        if name not in WATCHED:
            continue
        extras = ["", *(canonical(extra) for extra in metadata.get("provides_extra", []))]
        for text in metadata.get("requires_dist", []):
            requirement = Requirement(text)
            if canonical(requirement.name) not in WATCHED[name] or not requirement.specifier:
                continue
            applies = [extra for extra in extras
                       if requirement.marker is None or requirement.marker.evaluate({**base, "extra": extra})]
            if not applies:
                continue
            label = name if applies[0] == "" else f"{name}[{applies[0]}]"
            lines.append(f"# declared: {label}=={metadata['version']} requires "
                         f"{canonical(requirement.name)}{requirement.specifier}")
    return sorted(set(lines))


def read_declared(path: Path = LOCK) -> list[tuple[str, str, str, Requirement]]:
    """The lock's ``# declared:`` lines as ``(name, extra, version, requirement)``."""
    found = []
    for raw in path.read_text().splitlines():
        match = _DECLARED.fullmatch(raw.strip())
        if match:
            found.append((canonical(match.group(1)), match.group(2) or "", match.group(3), Requirement(match.group(4))))
    return found


def check_declared(path: Path = LOCK) -> list[str]:
    """What is wrong between the lock's pins and its ``# declared:`` lines (nothing: ``[]``). Offline: every
    :data:`WATCHED` pair has a declaration made at the locked version, and every locked version it names is within
    the declared range."""
    pins = read_lock(path)
    declared = read_declared(path)
    problems = []
    for name, targets in WATCHED.items():
        if name not in pins:
            continue
        for target in targets:
            if not any(d[0] == name and d[2] == pins[name] and canonical(d[3].name) == target for d in declared):
                problems.append(f"no declaration of {name}=={pins[name]} about {target}: run "
                                "`python scripts/gpu_lock.py compile`")
    for name, extra, version, requirement in declared:
        label = f"{name}[{extra}]" if extra else name
        if pins.get(name) != version:
            problems.append(f"{label}=={version} declared, but the lock pins {name}=={pins.get(name)}")
            continue
        target = canonical(requirement.name)
        if target not in pins:
            if not extra:
                problems.append(f"{label}=={version} requires {requirement}, which the lock does not pin")
            continue
        if not SpecifierSet(str(requirement.specifier)).contains(Version(pins[target]), prereleases=True):
            problems.append(f"{label}=={version} requires {requirement}, the lock pins {target}=={pins[target]}")
    return problems


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
    declared = DECLARED_HEADER + "".join(f"{line}\n" for line in environment["declared"])
    body = "".join(f"{name}=={version}\n" for name, version in sorted(resolved.items()))
    LOCK.write_text(header + declared + body)
    problems = check_declared(LOCK)
    print(f"wrote {LOCK} ({len(resolved)} distributions, resolved in {time.monotonic() - started:.0f} s)")
    if problems:
        raise RuntimeError("the pins disagree with what the pinned distributions declare:\n" + "\n".join(problems))
    return LOCK


def check_lock() -> dict[str, str]:
    """Resolve the lock; raise when pip cannot, when it adds or changes a distribution, when the ``# declared:``
    lines are not what the index's metadata declares, or when the pins disagree with them."""
    pins = read_lock()
    resolved, environment = resolve(LOCK)
    extra = sorted(set(resolved) - set(pins))
    changed = sorted(name for name in set(resolved) & set(pins) if resolved[name] != pins[name])
    if extra or changed:
        raise RuntimeError(f"{LOCK} is not closed: pip adds {extra} and changes {changed}; run "
                           "`python scripts/gpu_lock.py compile`")
    recorded = sorted(line for line in LOCK.read_text().splitlines() if _DECLARED.fullmatch(line.strip()))
    if recorded != environment["declared"]:
        raise RuntimeError(f"{LOCK} records {recorded} as declared, the index's metadata declares "
                           f"{environment['declared']}; run `python scripts/gpu_lock.py compile`")
    problems = check_declared(LOCK)
    if problems:
        raise RuntimeError("\n".join(problems))
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
