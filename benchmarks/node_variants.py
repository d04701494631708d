"""One node of ``train`` under several settings, side by side in one run: node seconds, peak memory, what it made.

Each variant is the same ``kedro run --pipelines=train --nodes=<node>`` in ``--project`` (a project that has run
``make train``, so the node's inputs exist), with its own ``--params`` and environment. Reported per variant: the
node's seconds (``node_timing.csv``), the kedro process's minor page faults and peak resident set size (``wait4``),
the last training loss the run logged (a trainer node), and for a JSON-lines ``--output`` how many rows'
``completion`` equal the first variant's. Each run writes a new version of the node's outputs in ``--project``.

    # make train's SFT with and without LoRA dropout (issue 46; docs/rollout-speed.md)
    .venv/bin/python benchmarks/node_variants.py --name sft_dropout --node sft.train_sft \\
        --params sft.max_steps=3,tracking.enabled=false --output "" \\
        --variant "LoRA dropout 0.05::sft.lora_dropout=0.05" --variant "LoRA dropout 0 (default)::sft.lora_dropout=0.0"
    # the evaluation rollouts with the policy held in float32 vs bfloat16
    .venv/bin/python benchmarks/node_variants.py --name policy_dtype --node sft.run_policy_rollouts \\
        --variant "float32::policy.dtype=float32" --variant "bfloat16::policy.dtype=bfloat16"

A variant is ``LABEL::PARAMS`` or ``LABEL::PARAMS::NAME=VALUE;NAME=VALUE`` (environment variables).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import ROOT, Row, write_report  # benchmarks/report.py

_LOSS = re.compile(r"'loss': '([0-9.eE+-]+)'")


@dataclass(frozen=True)
class Variant:
    """A label, the ``--params`` added to the shared ones, and environment variables."""

    label: str
    params: str = ""
    environment: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        label, _, rest = text.partition("::")
        params, _, environment = rest.partition("::")
        pairs = [item.split("=", 1) for item in environment.split(";") if item]
        if not label or any(len(pair) != 2 for pair in pairs):
            raise argparse.ArgumentTypeError(f"a variant is LABEL::PARAMS[::NAME=VALUE;...], got {text!r}")
        return cls(label, params, dict(pairs))


@dataclass(frozen=True)
class Measured:
    seconds: float
    wall: float
    faults: int
    peak_gib: float
    last_loss: str


def run_node(project: Path, node: str, params: str, environment: dict[str, str], log: Path) -> Measured:
    """``kedro run --pipelines=train --nodes=node`` in ``project``; raises SystemExit naming ``log`` on failure."""
    command = [str(project / ".venv" / "bin" / "kedro"), "run", "--pipelines=train", f"--nodes={node}"]
    if params:
        command += ["--params", params]
    started = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=project, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", **environment})
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed ({environment or 'no extra environment'}); see {log}")
    with (project / "data" / "08_reporting" / "node_timing.csv").open(encoding="utf-8") as handle:
        seconds = float(next(row["seconds"] for row in csv.DictReader(handle) if row["node"] == node))
    losses = _LOSS.findall(log.read_text(encoding="utf-8", errors="replace"))
    return Measured(seconds, time.perf_counter() - started, usage.ru_minflt, usage.ru_maxrss / 2**20,
                    losses[-1] if losses else "")


def newest_completions(folder: Path, versions: int) -> list[list[object]]:
    """The ``completion`` of every row of the ``versions`` newest versions of the JSON-lines dataset ``folder``,
    oldest first."""
    newest = sorted(path for path in folder.iterdir() if path.is_dir())[-versions:]
    return [[json.loads(line).get("completion") for line in (version / folder.name).open(encoding="utf-8")]
            for version in newest]


def measure(variants: list[Variant], *, project: Path, node: str, params: str, output: str, name: str,
            output_dir: Path, title: str | None = None) -> Path:
    """Run every variant in turn, then write ``<name>_benchmark.{csv,md}``; ratios are of the first variant."""
    measured: list[Measured] = []
    for index, variant in enumerate(variants):
        shared = ",".join(part for part in (params, variant.params) if part)
        print(f"{variant.label}: kedro run --nodes={node} --params {shared!r}", flush=True)
        measured.append(run_node(project, node, shared, variant.environment, output_dir / f"{name}_{index}.log"))
    same: list[str] = [""] * len(variants)
    if output:
        completions = newest_completions(project / output, len(variants))
        same = [f"{sum(a == b for a, b in zip(completions[0], rows, strict=True))} of {len(rows)} completions "
                "as the first" for rows in completions]
    base = measured[0].seconds
    rows = [Row(f"--params {params}" if params else node, variant.label, 1, "run", found.seconds,
                f"{base / found.seconds:.2f}x",
                "; ".join(part for part in (
                    f"peak RSS {found.peak_gib:.2f} GiB", f"{found.faults / 1e6:.1f} M page faults",
                    f"last loss {found.last_loss}" if found.last_loss else "", same[index] if index else "",
                    f"kedro run {found.wall:.0f} s") if part))
            for index, (variant, found) in enumerate(zip(variants, measured, strict=True))]
    return write_report(rows, name=name, heading=f"{node}: settings side by side",
                        title=f"{title or f'kedro run --pipelines=train --nodes={node}'}; {os.cpu_count()} CPUs",
                        command=shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
                        output_dir=output_dir, console=Console(width=None if sys.stdout.isatty() else 200))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="a project that has run make train (default: .)")
    parser.add_argument("--node", default="sft.run_policy_rollouts", help="the node of `train` to run")
    parser.add_argument("--params", default="", help="kedro --params for every variant (e.g. sft.max_steps=4)")
    parser.add_argument("--variant", type=Variant.parse, action="append", required=True,
                        help="LABEL::PARAMS[::NAME=VALUE;...], at least two; ratios are of the first")
    parser.add_argument("--output", default="data/07_model_output/sft_policy_trajectories.jsonl",
                        help="the node's versioned JSON-lines output to compare ('' for none)")
    parser.add_argument("--name", default="node_variants", help="the report's name in data/08_reporting")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    if len(args.variant) < 2:
        parser.error("give at least two --variant")
    measure(args.variant, project=args.project, node=args.node, params=args.params, output=args.output,
            name=args.name, output_dir=args.output_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
