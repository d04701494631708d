"""The process that ``accelerate launch`` starts on every rank for :mod:`prorag.training.launch`::

    python -m accelerate.commands.launch … -m prorag.launch_worker <bundle folder>

It reads the bundle, trains its stage (SFT, DPO or GRPO) with the same library function the node calls in-process,
into the bundle's ``run/`` folder (checkpoints, resumption, adapter), and:

* rank 0 logs into the bundle's MLflow run (the node's stage run): the world size, backend and distributed type as
  ``distributed.*`` params and, through the stage's metrics callback, one set of curves; other ranks log nothing;
* rank 0 writes ``result.json`` (adapter folder, ``log_history``, world size, backend, checkpoint resumed from);
* a rank that raises writes ``errors/rank_<r>.json`` (time, error, traceback) before exiting non-zero;
* every rank exits when the process that started it on its own machine (accelerate's local launcher, torchrun's
  agent, srun's step) is gone, whatever its stdout / stderr do: ``kill -9`` of ``kedro run`` ends its ``accelerate
  launch`` (SIGTERM on its parent's death), which ends the ranks, leaving the last complete checkpoint to resume
  from. Nothing watches a process of another machine. ``$PRORAG_EXIT_WITH_PARENT=0`` turns the watch off (a worker
  started by hand under ``nohup``).

``$PRORAG_LAUNCH_FAULT`` (tests): ``rank=R,step=S,action=raise`` raises on rank R at the end of step S;
``action=sleep:N`` sleeps N seconds there (a window to kill the launcher mid-training).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prorag.training.launch import (
    BUNDLE_FILE,
    BUNDLE_FORMAT,
    ERRORS_DIR,
    EXIT_WITH_PARENT_ENV,
    FAULT_ENV,
    INPUTS_DIR,
    RESULT_FILE,
    RUN_DIR,
)

logger = logging.getLogger("prorag.launch_worker")


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _watch_launcher(interval: float = 1.0) -> None:
    """Exit this rank (137) when the process that started it on this machine is gone (module docstring).

    The parent is ``accelerate launch``'s local launcher or torchrun's agent on every machine; once it is gone the
    rank is reparented, which :func:`os.getppid` shows. No process id crosses machines, and the exit does not depend
    on the rank's stdout / stderr: they are the pipe to a launcher that may be dead, so the notice may fail."""
    if os.environ.get(EXIT_WITH_PARENT_ENV, "1") == "0":
        return
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        threading.Timer(2.0, os._exit, (137,)).start()  # a notice blocked on a full pipe does not keep the rank
        try:  # the notice may raise (a closed pipe): the exit does not depend on it
            print(f"rank {_rank()}: its launcher (pid {parent}) is gone; stopping", file=sys.stderr, flush=True)
        finally:
            os._exit(137)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _fault_callback() -> Any:
    """The test fault of ``$PRORAG_LAUNCH_FAULT`` as a ``TrainerCallback`` (None when unset or another rank)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    fields = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
    if int(fields.get("rank", "0")) != _rank():
        return None
    step, action = int(fields.get("step", "1")), fields.get("action", "raise")
    from transformers import TrainerCallback

    class Fault(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step != step:
                return
            if action.startswith("sleep:"):
                print(f"rank {_rank()}: fault injection: sleeping at step {step}", flush=True)
                time.sleep(float(action.split(":", 1)[1]))
            else:
                raise RuntimeError(f"fault injected on rank {_rank()} at step {step} ({FAULT_ENV})")

    return Fault()


class _MlflowRun:
    """Rank 0 resumes the bundle's MLflow run (the node's stage run); other ranks and bundles without one: no-op."""

    def __init__(self, target: dict[str, str] | None) -> None:
        self.target = target if _rank() == 0 else None
        self.active = False

    def __enter__(self) -> _MlflowRun:
        if self.target:
            import mlflow

            mlflow.set_tracking_uri(self.target["tracking_uri"])
            mlflow.start_run(run_id=self.target["run_id"], log_system_metrics=False)
            self.active = True
        return self

    def log_params(self, params: dict[str, Any]) -> None:
        if self.active:
            import mlflow

            try:
                mlflow.log_params(params)
            except Exception as error:  # a param logged with another value by an earlier attempt of the same run
                logger.warning("MLflow: could not log %s: %s", sorted(params), error)

    def __exit__(self, *exc: object) -> None:
        if self.active:
            import mlflow

            # the node's hook sets the final status when the node ends (FAILED on an error)
            mlflow.end_run()


if TYPE_CHECKING:
    from prorag.training.config import SFTSettings
    from prorag.training.dpo import DPOTrainingConfig

Settings = TypeVar("Settings", "SFTSettings", "DPOTrainingConfig")
"""A trainer's settings with a ``save_steps``."""


def _checkpointed(settings: Settings, bundle: dict[str, Any]) -> Settings:
    """``settings`` saving a checkpoint every ``launch.checkpoint_steps`` unless they set their own ``save_steps``."""
    if settings.save_steps is None:
        return settings.model_copy(update={"save_steps": bundle["launch"]["checkpoint_steps"]})
    return settings


def _stage_sft(bundle: dict[str, Any], folder: Path, callbacks: list[Any]) -> tuple[Path, list[dict[str, Any]]]:
    from prorag.training.config import SFTSettings
    from prorag.training.sft import train_sft_lora

    worker = bundle["worker"]
    settings = _checkpointed(SFTSettings.model_validate(worker["settings"], strict=False), bundle)
    examples = _read(folder / INPUTS_DIR / "examples.json")
    return train_sft_lora(worker["model"], examples, folder / RUN_DIR, settings, callbacks=callbacks)


def _stage_dpo(bundle: dict[str, Any], folder: Path, callbacks: list[Any]) -> tuple[Path, list[dict[str, Any]]]:
    from prorag.training.dpo import DPOTrainingConfig, train_dpo_lora

    worker = bundle["worker"]
    config = _checkpointed(DPOTrainingConfig.model_validate(worker["settings"], strict=False), bundle)
    rows = _read(folder / INPUTS_DIR / "rows.json")
    return train_dpo_lora(worker["model"], rows, folder / RUN_DIR, config, callbacks=callbacks)


def _stage_grpo(bundle: dict[str, Any], folder: Path, callbacks: list[Any]) -> tuple[Path, list[dict[str, Any]]]:
    from prorag.assembly import build_grpo_rollouts
    from prorag.data.records import Question
    from prorag.specs import RetrieverSpec, TrainedAgentSpec
    from prorag.training.backends import trainer_backend
    from prorag.training.config import GRPOSettings, TrainerBackendSettings

    worker = bundle["worker"]
    questions = [Question.from_dict(record) for record in _read(folder / INPUTS_DIR / "questions.json")]
    index = grpo_index(worker, folder)
    trainer = GRPOSettings.model_validate(worker["trainer"], strict=False)
    choice = TrainerBackendSettings.model_validate(worker.get("backend") or {}, strict=False)
    rollout_function = build_grpo_rollouts(
        questions, index, retriever=RetrieverSpec.model_validate(worker["retriever"], strict=False),
        agent=TrainedAgentSpec.model_validate(worker["agent"], strict=False), reward=worker["reward"],
        trainer=trainer, generation_batch_size=worker["generation_batch_size"],
        judge_for_metrics=worker["judge_for_metrics"], policy_server=worker["policy_server"], backend=choice.name)
    return trainer_backend(choice.name).train(
        worker["model"], questions, rollout_function, folder / RUN_DIR, trainer, args=choice.args,
        adapter_dir=worker["start_adapter"], full_parameters=worker["full_parameters"], callbacks=callbacks)


def grpo_index(worker: dict[str, Any], folder: Path) -> Any:
    """The retrieval index of a GRPO bundle (``worker.index``, :func:`prorag.training.launch.index_reference`): the
    versioned index directory loaded in place (memory-mapped, read-only), None when the ranks query the retrieval
    server, or the bundle's own copy (``inputs/index``; also bundles written before the reference existed)."""
    from prorag.retrieval.index import load_index_dir

    reference = worker.get("index") or {"mode": "copy"}
    mode = reference.get("mode")
    if mode == "server":
        return None
    if mode == "path":
        path = Path(reference["path"])
        if not path.is_dir():
            raise FileNotFoundError(f"{folder / BUNDLE_FILE}: worker.index.path {path} is not a directory (the "
                                    "versioned index must stay where the launch found it, on a filesystem every "
                                    "machine sees)")
        return load_index_dir(path, mmap=True)
    if mode == "copy":
        return load_index_dir(folder / INPUTS_DIR / "index")
    raise ValueError(f"{folder / BUNDLE_FILE}: unknown worker.index.mode {mode!r} (server, path or copy)")


STAGES = {"sft": _stage_sft, "dpo": _stage_dpo, "grpo": _stage_grpo}


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _write_error(folder: Path, error: BaseException) -> None:
    errors = folder / ERRORS_DIR
    errors.mkdir(parents=True, exist_ok=True)
    report = {"rank": _rank(), "world_size": _world(), "time": time.time(), "host": os.uname().nodename,
              "error": f"{type(error).__name__}: {error}",
              "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))}
    (errors / f"rank_{_rank()}.json").write_text(json.dumps(report), encoding="utf-8")


def run(folder: Path) -> int:
    """Train the bundle's stage on this rank (module docstring)."""
    bundle = _read(folder / BUNDLE_FILE)
    if bundle.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{folder / BUNDLE_FILE}: bundle format {bundle.get('format')!r}, this prorag reads "
                         f"{BUNDLE_FORMAT}")
    stage = bundle["stage"]
    if stage not in STAGES:
        raise ValueError(f"{folder / BUNDLE_FILE}: unknown stage {stage!r} (one of {sorted(STAGES)})")
    if stage == "grpo" and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" \
            and os.environ.get("FSDP_VERSION", "1") != "2" and not bundle["worker"].get("policy_server"):
        raise RuntimeError("FSDP1 cannot run GRPO's in-process rollouts: use FSDP2 (launch.config fsdp2), zero3 or a "
                           "vLLM policy server (see prorag.training.launch.check_stage)")
    from prorag.tracking.callbacks import MlflowStepMetrics
    from prorag.training.checkpoints import last_complete_checkpoint

    resumed = last_complete_checkpoint(folder / RUN_DIR / "checkpoints")
    prefix = bundle["worker"].get("metrics_prefix")
    callbacks = [callback for callback in (_fault_callback(),) if callback is not None]
    with _MlflowRun(bundle.get("mlflow")) as tracking:
        if prefix:
            callbacks.append(MlflowStepMetrics(prefix))
        adapter, history = STAGES[stage](bundle, folder, callbacks)
        import torch.distributed as dist
        from accelerate import PartialState

        state = PartialState()
        backend = str(dist.get_backend()) if dist.is_available() and dist.is_initialized() else "none"
        distributed = str(state.distributed_type).split(".")[-1]
        tracking.log_params({"distributed.world_size": state.num_processes, "distributed.backend": backend,
                             "distributed.type": distributed, "distributed.config": bundle["launch"]["config"],
                             "distributed.bundle": str(folder)})
        if state.is_main_process:
            steps = [entry for entry in history if "step" in entry]
            result = {"adapter": str(adapter), "log_history": history, "world_size": state.num_processes,
                      "backend": backend, "distributed_type": distributed,
                      "global_step": max((int(entry["step"]) for entry in steps), default=0),
                      "resumed_from": str(resumed) if resumed else None}
            temporary = folder / (RESULT_FILE + ".tmp")
            temporary.write_text(json.dumps(result, default=str), encoding="utf-8")
            temporary.replace(folder / RESULT_FILE)
        state.wait_for_everyone()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m prorag.launch_worker <bundle folder>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if _rank() == 0 else logging.WARNING,
                        format=f"[rank {_rank()}] %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    folder = Path(args[0]).resolve()
    _watch_launcher()
    try:
        return run(folder)
    except BaseException as error:
        _write_error(folder, error)
        raise


if __name__ == "__main__":
    raise SystemExit(main())
