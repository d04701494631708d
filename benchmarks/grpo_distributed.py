"""GRPO over the rollout engine in one process or data-parallel under ``accelerate launch`` (2 CPU processes, gloo).

The RL pipeline's training at toy size (a fresh LoRA instead of the SFT adapter):
:func:`prorag.training.trl_grpo.train_grpo_lora` with the HiPRAG reward (reference judges) on 4 HotpotQA questions,
BM25 over 50 passages and the tiny random Llama (``bundled:tiny-random-llama``), ``--steps`` optimizer steps,
``--batch-size`` completions per process and step, ``--generations`` completions per question. Every process
rolls out its own share of the generation batch with the engine; DDP averages the LoRA gradients and the agent
statistics are summed over processes.

**Worker**: :mod:`prorag.training.toy_grpo_run` (trains, then rank 0 writes ``<out>/result.json``); this script
starts it in 1 process and in 2 (``accelerate launch``).

``--multi_gpu`` is accelerate 1.15's only *local* multi-process launcher (torchrun): despite its name it needs no
GPU. The training runs with ``use_cpu=True``, so accelerate's state picks ``MULTI_CPU`` with the gloo backend
(torch has no MPI here). ``accelerate launch --cpu --num_processes 2`` starts a *single* process: its launcher
expects ``mpirun`` (``--mpirun_hostfile``) to create the others.

**Benchmark** (``--compare``): runs the 1-process and the 2-process training as subprocesses, one after the other,
and reports steps/s (training loop only: the per-step wall times) side by side as a ratio; with the same
per-process batch, 2 processes train twice the completions per step. Output: a rich table,
``data/08_reporting/grpo_distributed_benchmark.csv`` and ``.md``. On a shared 2-core machine the ratio is bounded
by the cores (each process uses ``--threads`` torch threads, default 1)::

    .venv/bin/python benchmarks/grpo_distributed.py --compare
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "data" / "01_raw"
WORKER = ROOT / "src" / "prorag" / "training" / "toy_grpo_run.py"
RESULT_FILE = "result.json"


def launch_command(script_args: list[str], *, num_processes: int = 2) -> list[str]:
    """The ``accelerate launch`` command line running the worker in ``num_processes`` local CPU processes."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
            str(WORKER), *script_args]


# ------------------------------------------------------------------------------------------ worker


# ------------------------------------------------------------------------------------------ benchmark


def compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from report import Row, write_report  # benchmarks/report.py

    console = Console(width=None if sys.stdout.isatty() else 220)
    worker_args = ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--generations",
                   str(args.generations), "--threads", str(args.threads), "--questions", str(args.questions)]
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="grpo_distributed_") as scratch:
        for processes in (1, 2):
            out = Path(scratch) / f"{processes}proc"
            command = ([sys.executable, str(WORKER), "--out", str(out), *worker_args]
                       if processes == 1 else launch_command(["--out", str(out), *worker_args]))
            console.print(f"[bold]{processes} process{'es' if processes > 1 else ''}:[/] {' '.join(command)}")
            started = time.perf_counter()
            completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
            wall = time.perf_counter() - started
            if completed.returncode != 0:
                console.print(completed.stdout[-4000:], completed.stderr[-4000:], markup=False)
                console.print(f"[bold red]{processes}-process training failed (exit {completed.returncode})[/]")
                return 1
            results[processes] = json.loads((out / RESULT_FILE).read_text(encoding="utf-8"))
            results[processes]["launch_seconds"] = wall

    rows: list[Row] = []
    section = (f"GRPO, tiny random Llama, {args.steps} steps, {args.batch_size} completions/process/step, "
               f"{args.generations} generations/question, {args.threads} torch thread(s)/process, CPU")

    def rates(result: dict[str, Any]) -> tuple[float, float]:  # steps/s and completions/s over the step times
        seconds = sum(result["step_seconds"])
        return result["global_step"] / seconds, result["completions_per_step"] * result["global_step"] / seconds

    base_rate, base_completion_rate = rates(results[1])
    for processes, result in results.items():
        seconds = sum(result["step_seconds"])
        rate, completion_rate = rates(result)
        reward = [entry["reward"] for entry in result["log_history"] if "reward" in entry]
        rows.append(Row(
            section, f"{processes} process{'es' if processes > 1 else ''} ({result['distributed_type']}, "
                     f"{result['backend']}, world {result['world_size']})",
            result["global_step"], "steps", seconds, f"{rate / base_rate:.2f}x",
            f"{completion_rate:.2f} completions/s ({completion_rate / base_completion_rate:.2f}x); "
            f"step seconds {result['step_seconds']}; launch to exit {result['launch_seconds']:.0f} s; "
            f"mean reward {sum(reward) / max(len(reward), 1):.3f}; {len(result['metric_names'])} metrics logged"))
    title = (f"GRPO data-parallel benchmark — 1 vs 2 processes (accelerate launch, gloo), {os.cpu_count()} CPUs; "
             "steps/s over the per-step wall times")
    command = " ".join(["python", "benchmarks/grpo_distributed.py", *sys.argv[1:]])
    write_report(rows, name="grpo_distributed", heading="GRPO data-parallel benchmark", title=title,
                 command=command, output_dir=args.output_dir, console=console)
    return 0


def main(argv: list[str] | None = None) -> int:
    from prorag.training.toy_grpo_run import worker_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", action="store_true", required=True,
                        help="benchmark: 1 process vs 2 under accelerate launch")
    worker_arguments(parser)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per training run")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    if min(args.steps, args.batch_size, args.questions, args.threads) < 1 or args.generations < 2:
        parser.error("counts must be >= 1 and --generations >= 2")
    return compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
