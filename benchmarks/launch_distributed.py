"""The training launcher (:mod:`prorag.training.launch`), 1 vs 2 processes, on this machine in one run.

SFT and DPO on the tiny random Llama (``bundled:tiny-random-llama``): in this process (``launch.mode: in_process``),
then under ``accelerate launch`` with 1 and with 2 gloo processes (DDP, ``ddp`` config), the same per-process batch,
``--steps`` optimizer steps, a checkpoint every step. Reported: optimizer steps/s and sequences/s over the trainer's
own ``train_runtime`` (the training loop: forward, backward, all-reduce, optimizer, checkpoints), the ratio to the
1-process launch, and the launch's wall time from the call to the loaded result (interpreter and model start-up of
every rank included). GRPO's 1-vs-2 comparison on the tiny model is ``benchmarks/grpo_distributed.py``.

``--kedro``: instead, whole ``kedro run --env cpu_distributed`` runs of ``train_sft``, ``rl`` and ``dpo`` (in a
temporary copy of the project, its own MLflow store) with ``launch.processes_per_machine`` 1 and 2 and the same global
batch (2 sequences / pairs, 4 GRPO completions per step), on ``--model`` (default SmolLM2-135M-Instruct) for
``--steps`` steps: the training node's seconds (``node_timing.csv``: bundle, start-up of every rank, training, adapter
back), the trainer's ``train_runtime``, the world size and backend recorded in the MLflow stage run, the losses, and
whether the versioned adapter loads and generates. DPO trains on hand-written preference pairs (the MCTS explorer is
not under test). Every ``kedro run`` is capped at ``--timeout`` seconds::

    .venv/bin/python benchmarks/launch_distributed.py             # data/08_reporting/launch_distributed_benchmark.md
    nice -n 19 .venv/bin/python benchmarks/launch_distributed.py --kedro   # ..._kedro_benchmark.md
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
SMOLLM2 = "bundled:smollm2-135m-instruct"
KEDRO_STAGES = (  # pipeline, training node, adapter dataset, steps / per-device batch parameters, global batch, unit
    ("train_sft", "sft.train_sft", "sft_adapter", "sft.max_steps", "sft.per_device_train_batch_size", 2, "sequences"),
    ("rl", "rl.train_rl", "rl_adapter", "rl.trainer.max_steps", "rl.trainer.per_device_train_batch_size", 4,
     "completions"),
    ("dpo", "dpo.train_dpo", "dpo_adapter", "dpo.trainer.max_steps", "dpo.trainer.per_device_train_batch_size", 2,
     "pairs"),
)
PAIRS = (("Who wrote Hamlet?", "Shakespeare", "Marlowe"), ("What is the capital of Peru?", "Lima", "Cusco"),
         ("Which is the largest planet?", "Jupiter", "Saturn"), ("Who wrote Faust?", "Goethe", "Schiller"))


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
    parser.add_argument("--kedro", action="store_true", help="kedro run of train_sft, rl, dpo (module docstring)")
    parser.add_argument("--model", default=SMOLLM2, help="--kedro: the policy model (default SmolLM2-135M-Instruct)")
    parser.add_argument("--pipelines", default="train_sft,rl,dpo", help="--kedro: which of train_sft, rl, dpo")
    parser.add_argument("--timeout", type=float, default=600.0, help="--kedro: seconds per kedro run (default 600)")
    parser.add_argument("--rl-start-adapter", type=Path, default=None,
                        help="--kedro: GRPO starts from this SFT adapter folder (e.g. make train's) instead of the "
                             "benchmark's 2-step one, so that its groups' rewards differ and the comparison trains")
    parser.add_argument("--params", default="",
                        help="--kedro: more runtime parameters for every run, as kedro run's --params (e.g. "
                             "sft.lora_dropout=0.0, or make train's agent budgets: agent.step_budget=3,"
                             "agent.max_new_tokens_per_turn=96,agent.max_total_new_tokens=288)")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 220)
    if args.kedro:
        rows = _kedro_rows(args, console)
        title = (f"kedro run --env cpu_distributed, 1 vs 2 processes (accelerate launch, gloo), {args.model}, "
                 f"{args.steps} steps, {os.cpu_count()} CPUs; items/s over the training node's seconds"
                 + (f"; --params {args.params}" if args.params else ""))
        write_report(rows, name="launch_distributed_kedro", heading="Launcher benchmark: kedro run", title=title,
                     command=" ".join(["python", "benchmarks/launch_distributed.py", *sys.argv[1:]]),
                     output_dir=args.output_dir, console=console)
        return 0
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


def _kedro_rows(args: argparse.Namespace, console: Any) -> list[Any]:
    """The ``--kedro`` measurements (module docstring), one row per pipeline and process count."""
    import subprocess

    from report import Row

    wanted = [stage for stage in KEDRO_STAGES if stage[0] in args.pipelines.split(",")]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="launch_kedro_benchmark_") as scratch:
        project = _project_copy(Path(scratch))
        uri = f"sqlite:///{project / 'mlflow.db'}"
        env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "MLFLOW_TRACKING_URI": uri}
        for pipeline, node, adapter_name, steps_key, batch_key, global_batch, unit in wanted:
            if pipeline == "rl" and args.rl_start_adapter is not None:
                _save_version(args.rl_start_adapter, project, "sft_adapter", "9999-01-01T00.00.00.000Z")  # newest
            section = (f"kedro run --pipelines={pipeline}, {args.model}, {args.steps} steps, {global_batch} {unit}"
                       "/step (global), 1 torch thread/process, checkpoint every step, CPU")
            measured: dict[int, dict[str, Any]] = {}
            for processes in (1, 2):
                params = (f"policy.model={args.model},launch.processes_per_machine={processes},"
                          f"{steps_key}={args.steps},{batch_key}={global_batch // processes}"
                          + (f",{args.params}" if args.params else ""))
                command = [sys.executable, "-m", "kedro", "run", f"--pipelines={pipeline}", "--env",
                           "cpu_distributed", "--params", params]
                console.print(f"[bold]{pipeline}: {processes} process(es)[/] {' '.join(command[2:])}")
                log = project / f"{pipeline}_{processes}.log"
                load = os.getloadavg()[0]  # the machine is shared: its load when the run started
                started = time.perf_counter()
                try:
                    with log.open("w", encoding="utf-8") as handle:
                        completed = subprocess.run(command, cwd=project, env=env, stdout=handle,
                                                   stderr=subprocess.STDOUT, timeout=args.timeout, check=False)
                except subprocess.TimeoutExpired:  # a row saying so; the other runs go on
                    console.print(f"[red]{pipeline}, {processes} process(es): past --timeout {args.timeout:.0f} s[/]")
                    rows.append(Row(section, f"{processes} process{'es' if processes > 1 else ''}", 0, unit, 0.0,
                                    "", f"did not finish within --timeout {args.timeout:.0f} s (load average at "
                                    f"start {load:.1f})"))
                    continue
                wall = time.perf_counter() - started
                if completed.returncode != 0:  # a row saying so; the other runs go on
                    tail = log.read_text(encoding="utf-8").strip().splitlines()[-3:]
                    console.print(f"[red]{pipeline}, {processes} process(es): exited {completed.returncode}[/]")
                    rows.append(Row(section, f"{processes} process{'es' if processes > 1 else ''}", 0, unit, 0.0,
                                    "", f"exited {completed.returncode}: {' / '.join(tail)}"))
                    continue
                adapter = _latest_adapter(project, adapter_name)
                measured[processes] = {"wall": wall, "node": _node_seconds(project, node), "load": load,
                                       **_stage_run(uri, node.split(".")[0]), "adapter": adapter,
                                       "generated": _generates(args.model, adapter)}
            if pipeline == "train_sft" and measured:  # run alone, dpo continues ReasonRAG's cold start
                _save_version(_latest_adapter(project, adapter_name), project, "reasonrag_sft_adapter",
                              "2026-01-01T00.00.00.000Z")
            base = measured[1]["node"] if 1 in measured else float("nan")
            for processes, found in measured.items():
                per_step = "; ".join(f"{key} per step {', '.join(f'{value:.4f}' for value in found[key])}"
                                     for key in ("losses", "grad_norms", "rewards") if found[key])
                same = ""
                if processes > 1 and 1 in measured:
                    difference = _weight_difference(measured[1]["adapter"], found["adapter"])
                    same = f"; LoRA weights vs 1 process: {difference}"
                rows.append(Row(section, f"{processes} process{'es' if processes > 1 else ''} (world "
                                f"{found['world_size']}, {found['backend']})", args.steps * global_batch, unit,
                                found["node"], f"{base / found['node']:.2f}x",
                                f"train_runtime {found['train_runtime']:.1f} s; kedro run {found['wall']:.0f} s; "
                                f"load average at start {found['load']:.1f}; "
                                f"steps {found['steps']}; {per_step}{same}; adapter loads and generates "
                                f"{found['generated']!r}"))
    return rows


def _project_copy(scratch: Path) -> Path:
    """The project's configuration in ``scratch``, the raw data linked in, a ``reasonrag_pairs`` version written."""
    import json
    import shutil

    root = scratch / "project"
    root.mkdir()
    for name in ("pyproject.toml", ".kedro.yml", ".telemetry"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "conf", root / "conf", ignore=shutil.ignore_patterns("credentials.yml"))
    (root / "src").mkdir()
    (root / "data").mkdir()
    (root / "data" / "01_raw").symlink_to(ROOT / "data" / "01_raw")
    from prorag.protocol import reasonrag

    folder = root / "data" / "05_model_input" / "reasonrag_pairs.jsonl" / "2026-01-01T00.00.00.000Z"
    folder.mkdir(parents=True)
    (folder / "reasonrag_pairs.jsonl").write_text("".join(
        json.dumps({"messages": reasonrag.render_prompt(question), "transcript": "",
                    "chosen": f"So the answer is <answer>{right}</answer>",
                    "rejected": f"So the answer is <answer>{wrong}</answer>"}) + "\n"
        for question, right, wrong in PAIRS), encoding="utf-8")
    return root


def _save_version(adapter: Path, project: Path, name: str, version: str) -> None:
    """``adapter`` saved as ``version`` of the directory dataset ``name`` (with no run manifest, it carries no
    lineage, so the run that loads it passes the lineage check)."""
    import shutil

    shutil.copytree(adapter, project / "data" / "06_models" / name / version / name, dirs_exist_ok=True)


def _node_seconds(project: Path, node: str) -> float:
    import csv

    with (project / "data" / "08_reporting" / "node_timing.csv").open(encoding="utf-8") as handle:
        return float(next(row["seconds"] for row in csv.DictReader(handle) if row["node"] == node))


def _stage_run(uri: str, stage: str) -> dict[str, Any]:
    """The newest MLflow stage run of ``stage`` with launch params: world size, backend, its bundle's result."""
    import json

    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("prorag-cpu-distributed")
    [run] = client.search_runs([experiment.experiment_id], filter_string=f"attributes.run_name = '{stage}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    result = json.loads((Path(run.data.params["distributed.bundle"]) / "result.json").read_text(encoding="utf-8"))
    history = result["log_history"]
    return {"world_size": int(run.data.params["distributed.world_size"]),
            "backend": run.data.params["distributed.backend"], "train_runtime": _runtime(history),
            "steps": result["global_step"], "losses": [float(entry["loss"]) for entry in history if "loss" in entry],
            "grad_norms": [float(entry["grad_norm"]) for entry in history if "grad_norm" in entry],
            "rewards": [float(entry["reward"]) for entry in history if "reward" in entry]}


def _weight_difference(first: Path, second: Path) -> str:
    """How far two trained LoRA adapters are apart: the largest absolute difference of a weight, and the norm of
    the difference over the norm of the first adapter's weights. GRPO's loss is 0 on-policy whatever the batch
    (the group-normalized advantages average to 0), so equal losses say nothing; equal weights do."""
    import torch
    from safetensors.torch import load_file

    one, two = (load_file(str(folder / "adapter_model.safetensors")) for folder in (first, second))
    if one.keys() != two.keys():
        return f"different tensors ({len(one)} vs {len(two)})"
    differences = [(one[key] - two[key]).float() for key in one]
    largest = max(float(difference.abs().max()) for difference in differences)
    relative = float(torch.sqrt(sum((difference ** 2).sum() for difference in differences))
                     / torch.sqrt(sum((one[key].float() ** 2).sum() for key in one)))
    return f"max |difference| {largest:.2e}, relative {relative:.2e}"


def _latest_adapter(project: Path, name: str) -> Path:
    versions = sorted((project / "data" / "06_models" / name).iterdir())
    return versions[-1] / name


def _generates(model: str, adapter: Path) -> str:
    from prorag.llm.factory import build_generator
    from prorag.llm.generation import SamplingParams

    generator = build_generator(model, adapter=str(adapter))
    [[completion]] = generator.generate([generator.apply_chat_template([
        {"role": "user", "content": "Who wrote Hamlet?"}])], SamplingParams(max_new_tokens=8))
    if not completion.token_ids:
        raise RuntimeError(f"the adapter {adapter} generated nothing")
    return completion.text


if __name__ == "__main__":
    raise SystemExit(main())
