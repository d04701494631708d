"""GRPO over the rollout engine in one process or data-parallel under ``accelerate launch`` (2 CPU processes, gloo).

The RL pipeline's training at toy size (a fresh LoRA instead of the SFT adapter):
:func:`prorag.training.grpo.train_grpo_lora` with the HiPRAG reward (reference judges) on 4 HotpotQA questions,
BM25 over 50 passages and the tiny random Llama (``bundled:tiny-random-llama``), ``--steps`` optimizer steps,
``--batch-size`` completions per process and step, ``--generations`` completions per question. Every process
rolls out its own share of the generation batch with the engine; DDP averages the LoRA gradients and the agent
statistics are summed over processes.

**Worker** (trains, then rank 0 writes ``<out>/result.json``: world size, process-group backend, global step,
per-step wall time, the prompts each rank rolled out and the logged ``rewards/*`` / ``agent/*`` metrics)::

    python benchmarks/grpo_distributed.py --out /tmp/grpo1
    python -m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no --main_process_port 0 benchmarks/grpo_distributed.py --out /tmp/grpo2

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
import itertools
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
RESULT_FILE = "result.json"
METRIC_PREFIXES = ("rewards/", "agent/", "reward", "loss", "num_tokens", "completions/")


def launch_command(script_args: list[str], *, num_processes: int = 2) -> list[str]:
    """The ``accelerate launch`` command line running this script in ``num_processes`` local CPU processes."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
            str(Path(__file__).resolve()), *script_args]


# ------------------------------------------------------------------------------------------ worker


def train(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from accelerate import PartialState
    from transformers import TrainerCallback

    from prorag.data.records import Passage, load_questions
    from prorag.judges.reference import ReferenceJudge
    from prorag.llm.registry import BUNDLED_TINY_LLAMA
    from prorag.retrieval.bm25 import BM25Retriever
    from prorag.retrieval.store import PassageStore
    from prorag.training.grpo import AgentRolloutFunction, train_grpo_lora
    from prorag.training.process_rewards import RewardSettings, RolloutScorer

    torch.set_num_threads(args.threads)

    class RecordingRolloutFunction(AgentRolloutFunction):
        """Remembers the prompts this process rolled out (to show that the ranks share the batch)."""

        seen: list[str]

        def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
            self.seen = [*getattr(self, "seen", []), *prompts]
            return super().__call__(prompts, trainer)

    class StepClock(TrainerCallback):
        """Wall time of each optimizer step (rollout, scoring, forward/backward, all-reduce, optimizer step)."""

        def __init__(self) -> None:
            self.step_seconds: list[float] = []
            self.train_seconds = 0.0
            self.global_step = 0
            self.world_size = 1
            self.backend = "none"
            self._step_started = self._train_started = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if dist.is_available() and dist.is_initialized():
                self.world_size, self.backend = dist.get_world_size(), str(dist.get_backend())
            self._train_started = time.perf_counter()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._step_started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_seconds.append(time.perf_counter() - self._step_started)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.train_seconds = time.perf_counter() - self._train_started
            self.global_step = int(state.global_step)

    started = time.perf_counter()
    out = Path(args.out)
    with (RAW / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 50)]
    questions = load_questions(RAW / "qa" / "hotpotqa.jsonl")[: args.questions]
    retriever = BM25Retriever.build(PassageStore(passages))
    judge = ReferenceJudge(retriever)
    scorer = RolloutScorer(RewardSettings(), judge, judge)
    rollout_function = RecordingRolloutFunction(
        questions, retriever, scorer, step_budget=1, max_new_tokens_per_turn=8, max_total_new_tokens=16,
        batch_size=args.batch_size, seed=0)
    clock = StepClock()
    adapter, history = train_grpo_lora(
        BUNDLED_TINY_LLAMA, questions, rollout_function, out, resume=False, max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, num_generations=args.generations, learning_rate=1e-3,
        save_steps=max(args.steps, 1), save_total_limit=1, callbacks=[clock])

    state = PartialState()
    prompts_per_rank: list[list[str]] = [list(getattr(rollout_function, "seen", []))]
    if clock.world_size > 1:
        gathered: list[Any] = [None] * clock.world_size
        dist.all_gather_object(gathered, prompts_per_rank[0])
        prompts_per_rank = gathered
    if state.is_main_process:
        steps = [{key: value for key, value in entry.items() if isinstance(value, int | float)}
                 for entry in history if "step" in entry and "train_runtime" not in entry]
        metrics = sorted({key for entry in steps for key in entry if key.startswith(METRIC_PREFIXES)})
        result = {
            "world_size": clock.world_size,
            "backend": clock.backend,
            "distributed_type": str(state.distributed_type).split(".")[-1],
            "global_step": clock.global_step,
            "per_device_train_batch_size": args.batch_size,
            "num_generations": args.generations,
            "completions_per_step": args.batch_size * clock.world_size,
            "torch_threads_per_process": torch.get_num_threads(),
            "step_seconds": [round(seconds, 4) for seconds in clock.step_seconds],
            "train_seconds": round(clock.train_seconds, 4),
            "total_seconds": round(time.perf_counter() - started, 4),
            "prompts_per_rank": prompts_per_rank,
            "adapter": str(adapter),
            "adapter_files": sorted(path.name for path in Path(adapter).iterdir()),
            "metric_names": metrics,
            "log_history": steps,
        }
        (out / RESULT_FILE).write_text(json.dumps(result, indent=2), encoding="utf-8")
        print(f"rank 0 of {clock.world_size} ({clock.backend}): {clock.global_step} steps, "
              f"step seconds {result['step_seconds']}; wrote {out / RESULT_FILE}", flush=True)
    if clock.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


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
            command = ([sys.executable, str(Path(__file__).resolve()), "--out", str(out), *worker_args]
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="worker: train and write <out>/result.json (and the adapter)")
    mode.add_argument("--compare", action="store_true", help="benchmark: 1 process vs 2 under accelerate launch")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    parser.add_argument("--batch-size", type=int, default=2,
                        help="per_device_train_batch_size: completions per process and step (default 2)")
    parser.add_argument("--generations", type=int, default=2, help="num_generations per question (default 2)")
    parser.add_argument("--questions", type=int, default=4, help="HotpotQA training questions (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--timeout", type=float, default=900, help="--compare: seconds per training run")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    if min(args.steps, args.batch_size, args.questions, args.threads) < 1 or args.generations < 2:
        parser.error("counts must be >= 1 and --generations >= 2")
    return compare(args) if args.compare else train(args)


if __name__ == "__main__":
    raise SystemExit(main())
