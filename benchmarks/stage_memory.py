"""Peak memory of ``make train``'s stages (issue 46, item 6: the laptop budget), each in its own ``kedro run``.

Each stage of the ``train`` pipeline runs alone (``kedro run --pipelines=train --namespaces=<stage>`` with the
datasets a previous stage or run saved), with fewer questions or steps than ``make train`` but the same sequence
lengths and batch shapes: peak memory depends on the shapes, not on how many batches or steps there are. A sampler
reads the resident set size of the kedro process and its children every ``--interval`` seconds; the largest single
process's peak is what ``/usr/bin/time -v`` reports and what the 8 GB budget is about.

Every run is stored under a label (``--label before`` on the old code, ``--label after`` on the new) in
``data/08_reporting/stage_memory/<label>.json``; the report puts every stored label side by side, with the ratio
of the last label to the first, in ``data/08_reporting/stage_memory_benchmark.md`` / ``.csv``. Wall times are on
this shared 2-core machine: contended, for orientation only.

    .venv/bin/python benchmarks/stage_memory.py --label after              # every stage, in dependency order
    .venv/bin/python benchmarks/stage_memory.py --label after --stages sft rl
    .venv/bin/python benchmarks/stage_memory.py --report-only
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from rich.console import Console

from report import ROOT  # benchmarks/report.py

RESULTS = ROOT / "data" / "08_reporting" / "stage_memory"
GIB = 1024**3

# The stages of `train` (src/prorag/pipeline_registry.py, recipe sft_rl), in dependency order, with make train's
# shapes: 12 rollout questions fill one batch of policy.batch_size 12 (make train: 30 questions, 3 batches);
# SFT trains 4 of its 16 steps (batch 1, the same examples' lengths: the data seed orders them); GRPO's one step is
# make train's.
SHAPES = ["rollout.questions.max_per_source=4", "sft.max_steps=4"]
STAGES: dict[str, list[str]] = {
    "index": ["--pipelines=index"],
    "rollout": ["--pipelines=train", "--namespaces=rollout,compare"],
    "sft_synthesis": ["--pipelines=train", "--namespaces=sft_synthesis"],
    "sft": ["--pipelines=train", "--nodes=sft.train_sft"],
    "sft_rollouts": ["--pipelines=train", "--nodes=sft.run_policy_rollouts"],
    "rl": ["--pipelines=train", "--nodes=rl.select_rl_questions,rl.train_rl"],
    "rl_rollouts": ["--pipelines=train", "--nodes=rl.run_policy_rollouts"],
    # make train runs every stage in one process: what one stage leaves behind adds to the next one's peak
    "sft_then_rl": ["--pipelines=train", "--nodes=sft.train_sft,rl.select_rl_questions,rl.train_rl"],
    "evaluation": ["--pipelines=train", "--namespaces=evaluation"],
    "reward_judging": ["--pipelines=train", "--namespaces=reward_judging"],
}


@dataclass
class Measurement:
    """One stage run: the largest single process's peak RSS, the whole tree's, the wall time and exit code."""

    stage: str
    peak_rss_gib: float
    peak_tree_gib: float
    seconds: float
    returncode: int
    command: str


def measure(command: list[str], *, interval: float, log: Path) -> tuple[int, int, float, int]:
    """Run ``command`` (output to ``log``) and sample its process tree's RSS until it exits; the largest process's
    RSS over time goes to ``log`` with suffix ``.rss.csv`` (seconds, GiB; one row per second)."""
    start = time.perf_counter()
    timeline: list[tuple[float, float]] = []
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        root = psutil.Process(process.pid)
        peaks = [0, 0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                try:
                    tree = [root, *root.children(recursive=True)]
                    sizes = []
                    for member in tree:
                        try:
                            sizes.append(member.memory_info().rss)
                        except psutil.Error:
                            continue
                    if sizes:
                        peaks[0] = max(peaks[0], max(sizes))
                        peaks[1] = max(peaks[1], sum(sizes))
                        now = time.perf_counter() - start
                        if not timeline or now - timeline[-1][0] >= 1.0:
                            timeline.append((round(now, 1), round(max(sizes) / GIB, 3)))
                except psutil.Error:
                    pass
                done.wait(interval)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        returncode = process.wait()
        done.set()
        sampler.join()
    with log.with_suffix(".rss.csv").open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([("seconds", "rss_gib"), *timeline])
    return peaks[0], peaks[1], time.perf_counter() - start, returncode


def run_stages(stages: list[str], label: str, *, interval: float, extra: list[str], console: Console) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{label}.json"
    stored = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    kedro = str(Path(sys.executable).with_name("kedro"))
    for stage in stages:
        command = [kedro, "run", *STAGES[stage], "--params", ",".join([*SHAPES, *extra])]
        console.print(f"[bold]{stage}[/]: {' '.join(command[1:])}")
        peak, tree, seconds, rc = measure(command, interval=interval, log=RESULTS / f"{label}_{stage}.log")
        result = Measurement(stage, round(peak / GIB, 2), round(tree / GIB, 2), round(seconds, 1), rc,
                             " ".join(command[1:]))
        console.print(f"  peak {result.peak_rss_gib:.2f} GiB (tree {result.peak_tree_gib:.2f}), {seconds:.0f} s, "
                      f"rc {rc}")
        stored[stage] = asdict(result)
        path.write_text(json.dumps(stored, indent=1), encoding="utf-8")
        if rc:
            console.print(f"[red]{stage} failed (rc {rc}); log: {RESULTS / f'{label}_{stage}.log'}[/]")
            break


def write_table(console: Console) -> Path | None:
    """Every stored label side by side: peak RSS (GiB) and seconds per stage, the last label's ratio to the first."""
    labels = {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(RESULTS.glob("*.json"))}
    if not labels:
        console.print("no stored measurement")
        return None
    order = sorted(labels, key=lambda name: (name != "before", name != "after", name))
    header = ["stage", *[f"{label} peak GiB" for label in order], *[f"{label} s" for label in order]]
    if len(order) > 1:
        header.append(f"{order[-1]}/{order[0]} peak")
    rows = []
    for stage in [stage for stage in STAGES if any(stage in results for results in labels.values())]:
        peaks = [labels[label].get(stage, {}).get("peak_rss_gib") for label in order]
        seconds = [labels[label].get(stage, {}).get("seconds") for label in order]
        row = [stage, *["" if value is None else f"{value:.2f}" for value in peaks],
               *["" if value is None else f"{value:.0f}" for value in seconds]]
        if len(order) > 1:
            row.append(f"{peaks[-1] / peaks[0]:.2f}" if peaks[0] and peaks[-1] else "")
        rows.append(row)
    out = ROOT / "data" / "08_reporting" / "stage_memory_benchmark.csv"
    with out.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([header, *rows])
    lines = ["# Peak RSS of make train's stages, each in its own kedro run\n",
             f"Largest process's peak resident set (GiB) and wall seconds (shared 2-core CPU: contended); shapes "
             f"as make train, fewer items: `{','.join(SHAPES)}`\n",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    console.print("\n".join(lines[2:]))
    console.print(f"wrote {out.relative_to(ROOT)} and .md")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="after", help="the name the measurements are stored under")
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    parser.add_argument("--params", nargs="*", default=[], help="more kedro --params overrides (key=value)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples")
    parser.add_argument("--report-only", action="store_true", help="only write the table of stored measurements")
    args = parser.parse_args()
    console = Console()
    if not args.report_only:
        run_stages(args.stages, args.label, interval=args.interval, extra=args.params, console=console)
    write_table(console)


if __name__ == "__main__":
    main()
