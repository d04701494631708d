"""glibc's heap reuse for large tensors around every rollout (:func:`prorag.memory.reusing_freed_memory`), off vs
on, in one run.

The same ``kedro run --pipelines=train --nodes=<node>`` twice in ``--project`` (a project that has run ``make
train``, so the node's inputs exist): first with ``PRORAG_MALLOC_REUSE=0`` (glibc's default: every block above 32 MB
is mapped on its own and unmapped on ``free``), then with reuse on (the default). Reported per run: the node's
seconds (``node_timing.csv``), the kedro process's minor page faults and peak resident set size (``wait4``), and
whether the node's output is the same: for a JSON-lines output, the ``completion`` of every row of the two newest
versions. Each run writes a new version of the node's outputs in ``--project``.

    .venv/bin/python benchmarks/malloc_reuse.py --project /path/to/a/trained/clone
    .venv/bin/python benchmarks/malloc_reuse.py --node sft.train_sft --params sft.max_steps=4 --output ""
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import ROOT, Row, write_report  # benchmarks/report.py

VARIANTS = (("glibc default (PRORAG_MALLOC_REUSE=0)", "0"), ("heap reuse (prorag default)", "1"))


def _run(project: Path, node: str, params: str, reuse: str, log: Path) -> dict[str, float]:
    command = [str(project / ".venv" / "bin" / "kedro"), "run", "--pipelines=train", f"--nodes={node}"]
    if params:
        command += ["--params", params]
    environment = {**os.environ, "PRORAG_MALLOC_REUSE": reuse, "KEDRO_DISABLE_TELEMETRY": "1"}
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=project, env=environment, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed (PRORAG_MALLOC_REUSE={reuse}); see {log}")
    with (project / "data" / "08_reporting" / "node_timing.csv").open(encoding="utf-8") as handle:
        seconds = float(next(row["seconds"] for row in csv.DictReader(handle) if row["node"] == node))
    return {"seconds": seconds, "wall": time.perf_counter() - started, "faults": usage.ru_minflt,
            "peak_gib": usage.ru_maxrss / 2**20}


def _newest_two_equal(folder: Path) -> str:
    """Whether the two newest versions of the JSON-lines dataset ``folder`` have the same ``completion`` per row."""
    versions = sorted(path for path in folder.iterdir() if path.is_dir())[-2:]
    rows = [[json.loads(line).get("completion") for line in (version / folder.name).open(encoding="utf-8")]
            for version in versions]
    same = sum(first == second for first, second in zip(*rows, strict=True))
    return f"{same} of {len(rows[0])} completions identical ({versions[0].name} vs {versions[1].name})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="a project that has run make train (default: .)")
    parser.add_argument("--node", default="sft.run_policy_rollouts", help="the node of `train` to run")
    parser.add_argument("--params", default="", help="kedro --params for both runs (e.g. sft.max_steps=4)")
    parser.add_argument("--output", default="data/07_model_output/sft_policy_trajectories.jsonl",
                        help="the node's versioned JSON-lines output to compare ('' for none)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    measured = {}
    for name, reuse in VARIANTS:
        print(f"{name}: kedro run --nodes={args.node}", flush=True)
        measured[name] = _run(args.project, args.node, args.params, reuse,
                              args.output_dir / f"malloc_reuse_{reuse}.log")
    same = _newest_two_equal(args.project / args.output) if args.output else "not compared"
    base = measured[VARIANTS[0][0]]["seconds"]
    section = f"kedro run --pipelines=train --nodes={args.node} {args.params}".strip()
    rows = [Row(section, name, 1, "run", found["seconds"], f"{base / found['seconds']:.2f}x",
                f"{found['faults'] / 1e6:.1f} M page faults; peak RSS {found['peak_gib']:.2f} GiB; kedro run "
                f"{found['wall']:.0f} s" + (f"; {same}" if index else ""))
            for index, (name, found) in enumerate(measured.items())]
    write_report(rows, name="malloc_reuse", heading="glibc heap reuse for large tensors",
                 title=f"{args.node}: node seconds, page faults, peak memory; reuse off vs on, {os.cpu_count()} CPUs",
                 command=" ".join(["python", "benchmarks/malloc_reuse.py", *sys.argv[1:]]),
                 output_dir=args.output_dir, console=Console(width=None if sys.stdout.isatty() else 200))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
