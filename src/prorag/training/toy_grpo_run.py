"""A toy-size GRPO run of the RL pipeline's training, as a script that ``accelerate launch`` can start in several
processes (the data-parallel test and the GRPO benchmark run it; it is not part of a pipeline).

:func:`prorag.training.trl_grpo.train_grpo_lora` with the HiPRAG reward (reference judges) on ``--questions`` HotpotQA
questions, BM25 over 50 passages and the tiny random Llama (``bundled:tiny-random-llama``), a fresh LoRA,
``--steps`` optimizer steps, ``--batch-size`` completions per process and step, ``--generations`` completions per
question. Every process rolls out its own share of the generation batch with the engine; DDP averages the LoRA
gradients and the agent statistics are summed over processes. Rank 0 writes ``<out>/result.json``: world size,
process-group backend, global step, per-step wall time, the prompts each rank rolled out and the logged
``rewards/*`` / ``agent/*`` metrics::

    python -m prorag.training.toy_grpo_run --out /tmp/grpo1
    python -m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no --main_process_port 0 src/prorag/training/toy_grpo_run.py --out /tmp/grpo2

``--multi_gpu`` is accelerate 1.15's only *local* multi-process launcher (torchrun): despite its name it needs no
GPU. The training runs with ``use_cpu=True``, so accelerate's state picks ``MULTI_CPU`` with the gloo backend.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

RESULT_FILE = "result.json"
METRIC_PREFIXES = ("rewards/", "agent/", "reward", "loss", "num_tokens", "completions/")


def worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The run's size options (shared with the benchmark that launches it)."""
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    parser.add_argument("--batch-size", type=int, default=2,
                        help="per_device_train_batch_size: completions per process and step (default 2)")
    parser.add_argument("--generations", type=int, default=2, help="num_generations per question (default 2)")
    parser.add_argument("--questions", type=int, default=4, help="HotpotQA training questions (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--raw", type=Path, default=Path("data/01_raw"), help="the vendored raw data folder")


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
    from prorag.rewards.registry import build_reward
    from prorag.rewards.scoring import RolloutScorer
    from prorag.specs import AgentSpec
    from prorag.training.config import GRPOSettings
    from prorag.training.trl_grpo import AgentRolloutFunction, train_grpo_lora

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
    with (args.raw / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 50)]
    questions = load_questions(args.raw / "qa" / "hotpotqa.jsonl")[: args.questions]
    retriever = BM25Retriever.build(PassageStore(passages))
    judge = ReferenceJudge(retriever)
    scorer = RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge, under_judge=judge)
    agent = AgentSpec(few_shot=False, step_budget=1, max_new_tokens_per_turn=8, max_total_new_tokens=16)
    rollout_function = RecordingRolloutFunction(questions, retriever, scorer, agent, batch_size=args.batch_size,
                                                seed=0)
    clock = StepClock()
    settings = GRPOSettings(resume=False, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                            num_generations=args.generations, learning_rate=1e-3, save_steps=max(args.steps, 1),
                            save_total_limit=1)
    adapter, history = train_grpo_lora(BUNDLED_TINY_LLAMA, questions, rollout_function, out, settings,
                                       callbacks=[clock])

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="train and write <out>/result.json (and the adapter)")
    worker_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.steps, args.batch_size, args.questions, args.threads) < 1 or args.generations < 2:
        parser.error("counts must be >= 1 and --generations >= 2")
    return train(args)


if __name__ == "__main__":
    raise SystemExit(main())
