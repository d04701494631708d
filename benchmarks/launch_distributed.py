"""The training launcher (:mod:`prorag.training.launch`), 1 vs 2 processes, on this machine in one run.

SFT and DPO on the tiny random Llama (``bundled:tiny-random-llama``): in this process (``launch.mode: in_process``),
then under ``accelerate launch`` with 1 and with 2 gloo processes (DDP, ``ddp`` config), the same per-process batch,
``--steps`` optimizer steps, a checkpoint every step. Reported: optimizer steps/s and sequences/s over the trainer's
own ``train_runtime`` (the training loop: forward, backward, all-reduce, optimizer, checkpoints), the ratio to the
1-process launch, and the launch's wall time from the call to the loaded result (interpreter and model start-up of
every rank included). GRPO's 1-vs-2 comparison is ``benchmarks/grpo_distributed.py``.

Output: a rich table and ``data/08_reporting/launch_distributed_benchmark.csv`` / ``.md``::

    .venv/bin/python benchmarks/launch_distributed.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
TINY = "bundled:tiny-random-llama"


def _examples(count: int, length: int) -> list[dict[str, list[int]]]:
    return [{"input_ids": [(17 * i + j) % 4000 + 10 for j in range(length)],
             "labels": [-100] * (length // 4) + [(17 * i + j) % 4000 + 10 for j in range(length // 4, length)]}
            for i in range(count)]


def _pairs(count: int) -> list[dict[str, str]]:
    return [{"prompt": f"Question {i}: what is {i} plus {i}? Think step by step.", "chosen": f" The answer is {2 * i}.",
             "rejected": f" I believe it could be {2 * i + 1}, or maybe not."} for i in range(count)]


def _runtime(history: list[dict[str, Any]]) -> float:
    return float(next(entry["train_runtime"] for entry in history if "train_runtime" in entry))


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from prorag.training.config import SFTSettings
    from prorag.training.dpo import DPOTrainingConfig, train_dpo_lora
    from prorag.training.launch import LaunchSettings, launch_dpo, launch_sft
    from prorag.training.sft import train_sft_lora

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from report import Row, write_report  # benchmarks/report.py

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (default 8)")
    parser.add_argument("--batch-size", type=int, default=2, help="sequences (pairs) per process and step")
    parser.add_argument("--length", type=int, default=256, help="SFT sequence length in tokens (default 256)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 220)
    import torch

    torch.set_num_threads(1)
    sft = SFTSettings(max_steps=args.steps, per_device_train_batch_size=args.batch_size, save_steps=1, lora_r=8,
                      lora_alpha=16)
    dpo = DPOTrainingConfig(max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                            gradient_accumulation_steps=1, learning_rate=1e-3, warmup_ratio=0.0, save_steps=1,
                            lora_r=8, lora_alpha=16)
    examples, pairs = _examples(8 * args.batch_size * args.steps, args.length), _pairs(4 * args.batch_size * args.steps)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="launch_benchmark_") as scratch:
        for stage in ("sft", "dpo"):
            section = (f"{stage.upper()}, tiny random Llama, {args.steps} steps, {args.batch_size} "
                       f"{'sequences of ' + str(args.length) + ' tokens' if stage == 'sft' else 'pairs'}"
                       "/process/step, 1 torch thread/process, checkpoint every step, CPU")
            measured: dict[str, tuple[float, float, int]] = {}
            started = time.perf_counter()
            output = Path(scratch) / f"{stage}_in_process"
            history = (train_sft_lora(TINY, examples, output, sft)[1] if stage == "sft"
                       else train_dpo_lora(TINY, pairs, output, dpo)[1])
            measured["in process (no launch)"] = (_runtime(history), time.perf_counter() - started, 1)
            for processes in (1, 2):
                launch = LaunchSettings(mode="accelerate", processes_per_machine=processes, threads_per_process=1,
                                        root=str(Path(scratch) / f"launches_{processes}"))
                console.print(f"[bold]{stage}: {processes} process(es)[/]")
                started = time.perf_counter()
                result = (launch_sft(TINY, examples, sft, launch) if stage == "sft"
                          else launch_dpo(TINY, pairs, dpo, launch))
                wall = time.perf_counter() - started
                name = f"accelerate launch, {processes} process{'es' if processes > 1 else ''} " \
                       f"({result.distributed_type}, {result.backend}, world {result.world_size})"
                measured[name] = (_runtime(result.log_history), wall, processes)
            base = next(seconds for name, (seconds, _, procs) in measured.items()
                        if procs == 1 and name.startswith("accelerate"))
            for name, (seconds, wall, processes) in measured.items():
                sequences = args.steps * args.batch_size * processes
                rows.append(Row(section, name, args.steps, "steps", seconds, f"{base / seconds:.2f}x",
                                f"{sequences / seconds:.2f} {'sequences' if stage == 'sft' else 'pairs'}/s "
                                f"({processes * base / seconds:.2f}x); call to result {wall:.1f} s"))
    title = (f"Launcher benchmark — 1 vs 2 processes (accelerate launch, gloo), {os.cpu_count()} CPUs; steps/s over "
             "the trainer's train_runtime")
    write_report(rows, name="launch_distributed", heading="Launcher benchmark", title=title,
                 command=" ".join(["python", "benchmarks/launch_distributed.py", *sys.argv[1:]]),
                 output_dir=args.output_dir, console=console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
