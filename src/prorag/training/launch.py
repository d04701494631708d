"""The launcher behind the training nodes: train in this process (the default) or under ``accelerate launch``.

With ``launch.mode: accelerate`` a trainer (SFT, GRPO, DPO, an IP-DPO round) runs in ``processes_per_machine ×
num_machines`` processes started by accelerate's own launcher with one of its config files (DDP, DeepSpeed ZeRO-2 /
ZeRO-3, FSDP2; shipped in ``prorag/training/accelerate_configs/``, or any accelerate config file). The caller:

1. writes a **bundle**, ``<root>/<stage>-<fingerprint>/``: ``bundle.json`` (format version, the stage, the resolved
   settings, the MLflow run to log into, the command), ``inputs/`` (the stage's inputs as files) and ``run/`` (the
   trainer's output folder: ``checkpoints/``, ``adapter/``, ``COMPLETED``). The fingerprint hashes the stage's
   inputs, its settings and the world size, so repeating the same run finds the same folder and the trainers
   resume from its last checkpoint (``attempts.jsonl`` lists every launch into it);
2. starts ``python -m accelerate.commands.launch … -m prorag.launch_worker <bundle>`` as a subprocess
   (in its own process group), streams its output to this process's log, and waits;
3. on failure, raises :class:`LaunchError` naming the rank that failed first with that rank's traceback (each rank
   writes ``errors/rank_<r>.json`` when it raises); checkpoints already saved stay in ``run/``;
4. on success, reads ``result.json`` (written by rank 0: the adapter folder, ``log_history``, world size, backend).

Rank 0 logs into the MLflow run that was active when the launch started (the node's stage run); the other ranks
log nothing. The launcher gets SIGTERM when this process dies (``kill -9`` of ``kedro run``), and every rank exits
when its own machine's launcher is gone, so a killed launch leaves no training behind and the next identical run
resumes. ``launch.timeout`` is a timer: a launch still running then (a deadlocked collective prints nothing) is
stopped, its process group and every process it started, and fails.

This module imports neither Kedro nor torch; the worker (:mod:`prorag.launch_worker`) imports the trainers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from prorag.config import StrictModel
from prorag.specs import PositiveInt
from prorag.training.devices import bf16_compute

logger = logging.getLogger(__name__)

BUNDLE_FORMAT: Final = 1
"""Version of the bundle layout (``bundle.json: format``); the worker refuses another."""
BUNDLE_FILE: Final = "bundle.json"
RESULT_FILE: Final = "result.json"
ERRORS_DIR: Final = "errors"
INPUTS_DIR: Final = "inputs"
RUN_DIR: Final = "run"
EXIT_WITH_PARENT_ENV: Final = "PRORAG_EXIT_WITH_PARENT"
"""``0``: a worker keeps running when the process that started it is gone (default ``1``: it exits)."""
STOP_GRACE_S = 20.0
"""Seconds between SIGTERM and SIGKILL when a launch is stopped (timeout, or this process leaving early)."""
FAULT_ENV: Final = "PRORAG_LAUNCH_FAULT"
"""Fault injection for tests (``rank=1,step=2,action=raise`` or ``action=sleep:30``): see the worker."""
CONFIGS_DIR: Final = Path(__file__).resolve().parent / "accelerate_configs"
SHIPPED_CONFIGS: Final = ("ddp", "zero2", "zero3", "fsdp2")
Stage = Literal["sft", "dpo", "grpo"]


class LaunchError(RuntimeError):
    """A launched training failed; ``rank`` is the rank that failed first (None: no rank reported an error)."""

    def __init__(self, message: str, *, rank: int | None = None, rank_traceback: str = "",
                 bundle: Path | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.bundle = bundle


class LaunchSettings(StrictModel):
    """``launch``: how the training nodes (sft, rl, dpo, tearag's SFT and IP-DPO rounds) run their trainer."""

    mode: Literal["in_process", "accelerate", "external"] = "in_process"
    """in_process: the node trains in the ``kedro run`` process (the default); accelerate: it starts ``accelerate
    launch``; external: it writes the bundle and waits for the result of a training the scheduler starts (the stock
    command is ``<bundle>/launch.sh``; :func:`await_external`)."""
    processes_per_machine: PositiveInt = 1
    """Training processes on each machine (one per GPU; on CPU, gloo processes)."""
    num_machines: PositiveInt = 1
    machine_rank: int | None = Field(default=0, ge=0)
    """This machine's rank; None: ``$SLURM_NODEID`` (several machines under SLURM)."""
    config: str = "ddp"
    """An accelerate config: a shipped one (ddp, zero2, zero3, fsdp2) or the path of an accelerate config file."""
    gpu_ids: list[int] | None = None
    """The GPUs of this machine to train on (accelerate's ``--gpu_ids``); None: all visible. ``kedro run --params``
    splits on every comma, so there it is written with spaces: ``launch.gpu_ids=2 6 7``."""
    main_process_ip: str | None = None
    """Rendezvous address (the rank-0 machine); None on one machine (127.0.0.1)."""
    main_process_port: int = Field(default=0, ge=0, le=65535)
    """Rendezvous port; 0 on one machine: a free one."""
    srun: bool = False
    """Several machines under SLURM: start one ``accelerate launch`` per node with ``srun`` from this allocation."""
    root: str = "data/06_models/launches"
    """Bundles live in ``<root>/<stage>-<fingerprint>``: a repeated run resumes there (a shared filesystem across
    machines)."""
    checkpoint_steps: PositiveInt = 50
    """Checkpoint interval of an SFT / DPO trainer whose ``save_steps`` is unset (GRPO has its own)."""
    threads_per_process: PositiveInt | None = None
    """``OMP_NUM_THREADS`` of each process (CPU training); None: accelerate's default."""
    timeout: float | None = Field(default=None, gt=0)
    """Seconds before the launch is stopped and fails (None: no limit); external: before the node stops waiting."""
    handoff: str | None = None
    """external: a file the node writes the bundle folder into once the bundle is ready (the scheduler's script
    waits for it, starts the training, and removes it)."""

    @field_validator("gpu_ids", mode="before")
    @classmethod
    def _spaced_ids(cls, value: Any) -> Any:
        return [int(part) for part in value.split()] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> LaunchSettings:
        if self.mode != "in_process":
            config_path(self.config)
        if self.num_machines > 1:
            if not self.main_process_ip and not self.srun and self.mode != "external":
                raise ValueError("launch.num_machines > 1 needs launch.main_process_ip (the rank-0 machine), "
                                 "launch.srun: true, or launch.mode: external ($MASTER_ADDR from the scheduler)")
            if self.main_process_port == 0:
                raise ValueError("launch.num_machines > 1 needs a fixed launch.main_process_port (e.g. 29500)")
        elif self.srun:
            raise ValueError("launch.srun starts one process group per machine: set launch.num_machines > 1")
        return self

    @property
    def enabled(self) -> bool:
        """The training nodes do not train in the ``kedro run`` process."""
        return self.mode != "in_process"

    @property
    def world_size(self) -> int:
        return self.processes_per_machine * self.num_machines


IN_PROCESS: Final = LaunchSettings()
"""The default: train in the calling process."""


def config_path(config: str) -> Path:
    """The accelerate config file of a shipped name or a path; a clear error for anything else."""
    if config in SHIPPED_CONFIGS:
        return CONFIGS_DIR / f"{config}.yaml"
    path = Path(config)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        return path
    raise ValueError(f"launch.config {config!r} is neither a shipped accelerate config ({', '.join(SHIPPED_CONFIGS)}) "
                     "nor an existing .yaml / .json file")


def _accelerate_config(config: str) -> dict[str, Any]:
    """The accelerate config file of ``config`` (a shipped name or a path), parsed (YAML, JSON being YAML too)."""
    import yaml

    return yaml.safe_load(config_path(config).read_text(encoding="utf-8")) or {}


def _kind(loaded: dict[str, Any]) -> str:
    return {"FSDP": "fsdp", "DEEPSPEED": "deepspeed"}.get(str(loaded.get("distributed_type", "")), "ddp")


def config_kind(config: str) -> str:
    """``ddp``, ``deepspeed`` or ``fsdp``: what the accelerate config distributes with."""
    return _kind(_accelerate_config(config))


def sharding_stage(config: str) -> int:
    """What an accelerate config shards across ranks: 3 (ZeRO-3, FSDP: parameters, gradients, optimizer), 2 (ZeRO-2:
    gradients and optimizer), 1 (ZeRO-1: optimizer) or 0 (DDP)."""
    loaded = _accelerate_config(config)
    kind = _kind(loaded)
    if kind == "fsdp":
        return 3
    if kind == "deepspeed":
        deepspeed = loaded.get("deepspeed_config") or {}
        stage = deepspeed.get("zero_stage")
        if stage is None and deepspeed.get("deepspeed_config_file"):
            stage = (json.loads(Path(deepspeed["deepspeed_config_file"]).read_text(encoding="utf-8"))
                     .get("zero_optimization", {}).get("stage"))
        return int(stage or 0)
    return 0


def fsdp_version(config: str) -> int | None:
    """The FSDP version of an accelerate config (``fsdp_config.fsdp_version``, accelerate's default 1); None: not
    FSDP."""
    loaded = _accelerate_config(config)
    if _kind(loaded) != "fsdp":
        return None
    return int((loaded.get("fsdp_config") or {}).get("fsdp_version", 1))


def check_stage(stage: Stage, settings: LaunchSettings, *, policy_server: bool = False,
                vllm_mode: str | None = None) -> None:
    """Refuse combinations that cannot work, before anything starts.

    * FSDP1 with GRPO's in-process rollouts: every rank's multi-turn rollout runs a different number of forward
      passes (turns, stop strings), and an FSDP forward all-gathers each wrapped block's shards collectively, so ranks
      would wait on each other forever. FSDP2 (the shipped ``fsdp2``) is accepted: the rollout gathers the full
      parameters once around generation (:func:`prorag.training.trl_grpo.fsdp2_full_parameters`); so is ZeRO-3
      (``ds3_gather_for_generation``), DDP / ZeRO-2, or a policy server (``rl.policy_server``).
    * vLLM colocate mode: the rollout function has no generator over the trainer's in-process vLLM engine.
    """
    if vllm_mode == "colocate":
        raise ValueError("vLLM colocate mode is not supported: prorag's rollout function generates in-process with "
                         "transformers or through a vLLM server (rl.policy_server, TRL's server mode); start "
                         "`trl vllm-serve` on its own GPU instead")
    if stage == "grpo" and settings.enabled and not policy_server and fsdp_version(settings.config) == 1:
        raise ValueError(f"launch.config {settings.config!r} is FSDP1 (fsdp_config.fsdp_version 1 or unset), which "
                         "cannot run GRPO's in-process multi-turn rollouts: every forward pass all-gathers each "
                         "wrapped block collectively and the ranks' rollouts run different numbers of passes, so they "
                         "would hang. Use launch.config fsdp2 (FSDP2: full parameters gathered once around "
                         "generation), zero3 (DeepSpeed ZeRO-3, gathered the same way), ddp or zero2, or generate on a "
                         "vLLM server (rl.policy_server)")


def fingerprint(stage: str, payload: Any) -> str:
    """A short hash of everything that determines a launched training (the bundle folder's name)."""
    blob = json.dumps({"stage": stage, "payload": payload}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def content_digest(data: Any) -> str:
    """A digest of JSON-able inputs (examples, pairs, questions) for the fingerprint."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def active_mlflow_run() -> dict[str, str] | None:
    """The MLflow run active in this process (the node's stage run) as ``{tracking_uri, run_id}``; None: none."""
    try:
        import mlflow
    except ImportError:  # pragma: no cover - mlflow is a dependency
        return None
    run = mlflow.active_run()
    if run is None:
        return None
    return {"tracking_uri": mlflow.get_tracking_uri(), "run_id": run.info.run_id}


def launch_command(settings: LaunchSettings, bundle: Path, *, mixed_precision: str = "no",
                   machine_rank: int | str | None = None) -> list[str]:
    """The ``accelerate launch`` command line of one machine (``machine_rank`` overrides the setting)."""
    rank = settings.machine_rank if machine_rank is None else machine_rank
    if rank is None:
        rank = os.environ.get("SLURM_NODEID")
        if rank is None:
            raise ValueError("launch.machine_rank is null and $SLURM_NODEID is not set (not under srun)")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_path(settings.config)),
               "--num_processes", str(settings.world_size), "--num_machines", str(settings.num_machines),
               "--machine_rank", str(rank), "--mixed_precision", mixed_precision, "--dynamo_backend", "no",
               "--main_process_port", str(settings.main_process_port)]
    if settings.num_machines > 1 or settings.main_process_ip:
        command += ["--main_process_ip", settings.main_process_ip or "$MASTER_ADDR"]
    if settings.gpu_ids is not None:
        command += ["--gpu_ids", ",".join(str(gpu) for gpu in settings.gpu_ids)]
    return [*command, "-m", "prorag.launch_worker", str(bundle)]


def srun_command(settings: LaunchSettings, bundle: Path, *, mixed_precision: str = "no") -> list[str]:
    """One ``accelerate launch`` per node of the SLURM allocation (``--machine_rank $SLURM_NODEID``; the rendezvous
    address defaults to the allocation's first node, ``$MASTER_ADDR`` set by the sbatch template)."""
    per_node = launch_command(settings, bundle, mixed_precision=mixed_precision, machine_rank="$SLURM_NODEID")
    quoted = " ".join(part if part.startswith("$") else _quote(part) for part in per_node)
    return ["srun", f"--nodes={settings.num_machines}", "--ntasks-per-node=1", "bash", "-c", quoted]


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


@dataclass
class LaunchResult:
    """What rank 0 reported: the trained adapter (or model) folder, the trainer's ``log_history`` and the run."""

    adapter: Path
    log_history: list[dict[str, Any]]
    world_size: int
    backend: str
    distributed_type: str
    global_step: int
    resumed_from: str | None
    bundle: Path
    extra: dict[str, Any] = field(default_factory=dict)


def prepare_bundle(settings: LaunchSettings, stage: Stage, key: str, *, inputs: Mapping[str, Any],
                   files: Mapping[str, Callable[[Path], None]] | None = None,
                   worker: Mapping[str, Any]) -> Path:
    """Write the bundle folder of a launch (module docstring) and return it.

    ``inputs`` are JSON-able and go to ``inputs/<name>.json``; ``files`` write their own input (``writer(path)``,
    skipped when ``inputs/<name>`` already exists: an index written by an earlier attempt); ``worker`` is what the
    worker needs besides the inputs (settings dumps, model spec, metrics prefix)."""
    bundle = Path(settings.root).resolve() / f"{stage}-{key}"
    folder = bundle / INPUTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in inputs.items():
        _write_json(folder / f"{name}.json", data)
    for name, writer in (files or {}).items():
        if not (folder / name).exists():
            writer(folder / name)
    errors = bundle / ERRORS_DIR
    if errors.is_dir():  # errors of an earlier attempt are not this one's
        for stale in errors.glob("rank_*.json"):
            stale.unlink()
    (bundle / RESULT_FILE).unlink(missing_ok=True)
    for stale in (bundle / EXIT_CODES_DIR).glob("*"):  # an earlier external attempt's
        stale.unlink()
    _write_json(bundle / BUNDLE_FILE, {
        "format": BUNDLE_FORMAT, "stage": stage, "fingerprint": key, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "launch": settings.model_dump(), "mlflow": active_mlflow_run(), "worker": dict(worker),
        "inputs": sorted([*(f"{name}.json" for name in inputs), *(files or {})]), "run_dir": RUN_DIR,
    })
    return bundle


def run_launch(settings: LaunchSettings, bundle: Path, *, mixed_precision: str = "no",
               env: Mapping[str, str] | None = None) -> LaunchResult:
    """Start the launch of a prepared bundle, stream its output, wait, and return rank 0's result (module
    docstring); a failure raises :class:`LaunchError` with the failed rank's traceback."""
    if settings.mode == "external":
        return await_external(settings, bundle, mixed_precision=mixed_precision)
    command = (srun_command(settings, bundle, mixed_precision=mixed_precision) if settings.srun
               else launch_command(settings, bundle, mixed_precision=mixed_precision))
    environment = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    if settings.threads_per_process:
        environment["OMP_NUM_THREADS"] = str(settings.threads_per_process)
    attempt = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": command,
               "world_size": settings.world_size, "mlflow": active_mlflow_run()}
    with (bundle / "attempts.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(attempt) + "\n")
    logger.info("launching %d process(es) (%s) for %s: %s", settings.world_size, settings.config, bundle.name,
                " ".join(command))
    tail: deque[str] = deque(maxlen=80)
    with _process_group(command, environment) as process:
        reader = threading.Thread(target=_stream, args=(process, tail), name="launch-output", daemon=True)
        reader.start()
        try:
            code = process.wait(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            _stop(process)
            reader.join(timeout=2.0)
            raise LaunchError(
                f"the launch of {bundle} ran past launch.timeout ({settings.timeout:.0f} s); stopped its process "
                f"group and every process it started (SIGTERM, then SIGKILL after {STOP_GRACE_S:.0f} s). "
                f"Checkpoints kept in {bundle / RUN_DIR}. Its last output:\n" + "\n".join(list(tail)[-30:]),
                bundle=bundle) from None
        reader.join(timeout=5.0)  # a process the launch left behind may still hold the pipe open
    if code != 0:
        raise _failure(bundle, code, list(tail))
    return _result(bundle, f"the launch of {bundle} exited 0 but rank 0 wrote no {RESULT_FILE}")


def _result(bundle: Path, missing: str) -> LaunchResult:
    result_path = bundle / RESULT_FILE
    if not result_path.is_file():
        raise LaunchError(missing, bundle=bundle)
    result = json.loads(result_path.read_text(encoding="utf-8"))
    return LaunchResult(adapter=Path(result["adapter"]), log_history=result["log_history"],
                        world_size=int(result["world_size"]), backend=str(result["backend"]),
                        distributed_type=str(result["distributed_type"]), global_step=int(result["global_step"]),
                        resumed_from=result.get("resumed_from"), bundle=bundle, extra=result.get("extra", {}))


LAUNCH_SCRIPT: Final = "launch.sh"
"""The stock per-machine command of an external launch, written into its bundle."""
EXIT_CODES_DIR: Final = "exit_codes"
"""``launch.sh`` writes each machine's exit code here (``machine_<rank>``)."""
POLL_S = 2.0
"""How often an external launch's node looks for the result."""


def await_external(settings: LaunchSettings, bundle: Path, *, mixed_precision: str = "no") -> LaunchResult:
    """``launch.mode: external``: the scheduler starts the training, this process only hands the bundle over and
    reads the result. Writes ``<bundle>/launch.sh`` (accelerate's own launcher of the worker, to run once per
    machine: ``--machine_rank`` from ``$MACHINE_RANK``, else ``$SLURM_NODEID``, else 0; the rendezvous at
    ``$MASTER_ADDR``; it records its exit code in ``exit_codes/``), then ``launch.handoff`` (the bundle's folder),
    and waits for rank 0's ``result.json``, a rank's error report or a failed machine's exit code. No process is
    started or watched from here; ``launch.timeout`` bounds the wait."""
    command = launch_command(settings, bundle, mixed_precision=mixed_precision, machine_rank="$rank")
    exports = {"PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
               **({"OMP_NUM_THREADS": str(settings.threads_per_process)} if settings.threads_per_process else {})}
    codes = bundle / EXIT_CODES_DIR
    script = bundle / LAUNCH_SCRIPT
    script.write_text("\n".join([
        "#!/bin/bash",
        "# prorag: the training of this bundle; the scheduler runs it once per machine (docs/distributed.md)",
        "set -uo pipefail",
        "export " + " ".join(f"{name}={value}" for name, value in exports.items()),
        'rank=${MACHINE_RANK:-${SLURM_NODEID:-0}}',
        "code=0",
        " ".join(part if part.startswith("$") else _quote(part) for part in command) + " || code=$?",
        f"mkdir -p {_quote(str(codes))} && echo $code > {_quote(str(codes))}/machine_$rank",
        "exit $code", ""]), encoding="utf-8")
    script.chmod(0o755)
    with (bundle / "attempts.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "external": str(script),
                                 "world_size": settings.world_size, "mlflow": active_mlflow_run()}) + "\n")
    if settings.handoff:
        _write_text(Path(settings.handoff), str(bundle))
    logger.info("waiting for the scheduler to train %s on %d process(es): %s on each machine%s", bundle.name,
                settings.world_size, script, f" (handed over in {settings.handoff})" if settings.handoff else "")
    started = time.monotonic()
    while not (bundle / RESULT_FILE).is_file():
        failed = {path.name: path.read_text().strip() for path in codes.glob("*")
                  if path.read_text().strip() not in ("", "0")} if codes.is_dir() else {}
        if failed or any((bundle / ERRORS_DIR).glob("rank_*.json")):
            time.sleep(POLL_S)  # the other ranks' reports of the same failure
            raise _failure(bundle, ", ".join(f"{code} ({name})" for name, code in sorted(failed.items()))
                           or "an error", [])
        if settings.timeout and time.monotonic() - started > settings.timeout:
            raise LaunchError(f"no result in {bundle} within launch.timeout ({settings.timeout:.0f} s): did the "
                              f"scheduler run {script} on every machine?", bundle=bundle)
        time.sleep(POLL_S)
    return _result(bundle, "")


def _stream(process: subprocess.Popen[str], tail: deque[str]) -> None:
    """Log the launch's output line by line (on its own thread: the deadline does not wait for a line)."""
    assert process.stdout is not None
    with contextlib.suppress(ValueError, OSError):  # the pipe closed under us when the launch was stopped
        for line in process.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            logger.info("[launch] %s", line, extra={"markup": False})  # output is text, not rich markup


@contextlib.contextmanager
def _process_group(command: list[str], env: Mapping[str, str]) -> Iterator[subprocess.Popen[str]]:
    """The launch in its own process group; stopped (SIGTERM, then SIGKILL) if this process leaves early."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env),
                               start_new_session=True, bufsize=1, preexec_fn=_die_with_parent)
    try:
        yield process
    finally:
        if process.poll() is None:
            _stop(process)


def _die_with_parent() -> None:
    """Linux: the launcher process gets SIGTERM when the process that started it dies (``kill -9`` of Kedro)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(process: subprocess.Popen[str]) -> None:
    """Stop the launch's process group and every process it started: torch elastic starts each rank in a session of
    its own, out of the group's reach. SIGTERM to all, SIGKILL to what is left after :data:`STOP_GRACE_S`."""
    tree = [process.pid, *_descendants(process.pid)]
    deadline = time.monotonic() + STOP_GRACE_S
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)
        for pid in tree[1:]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        while time.monotonic() < deadline:
            process.poll()  # reap the launcher: a zombie is not running
            if not _group_running(process.pid) and not any(_running(pid) for pid in tree[1:]):
                return
            time.sleep(0.1)
        deadline = time.monotonic() + 5.0
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=1.0)


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, their children and so on (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for child, stat in _processes():
        children.setdefault(int(stat[1]), []).append(child)
    found: list[int] = []
    queue = list(children.get(pid, []))
    while queue:
        child = queue.pop()
        found.append(child)
        queue.extend(children.get(child, []))
    return found


def _processes() -> Iterator[tuple[int, list[str]]]:
    """``(pid, stat fields after the command name: state, ppid, pgrp, …)`` of every process (Linux ``/proc``)."""
    for entry in Path("/proc").glob("[0-9]*"):
        stat = _stat(int(entry.name))
        if stat is not None:
            yield int(entry.name), stat


def _stat(pid: int) -> list[str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 2 else None


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _group_running(group: int) -> bool:
    """A process of the process group ``group`` is running (zombies left out; without ``/proc``: it exists)."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not Path("/proc/self/stat").exists():
        return True
    return any(stat[2] == str(group) and stat[0] != "Z" for _, stat in _processes())


def _failure(bundle: Path, code: int | str, tail: list[str]) -> LaunchError:
    """The error of a failed launch: the rank whose error file is the earliest, with its traceback."""
    reports = []
    for path in sorted((bundle / ERRORS_DIR).glob("rank_*.json")):
        with contextlib.suppress(OSError, ValueError):
            reports.append(json.loads(path.read_text(encoding="utf-8")))
    if not reports:
        return LaunchError(f"the launch of {bundle} exited with {code} and no rank reported an error; its last "
                           "output:\n" + "\n".join(tail[-30:]), bundle=bundle)
    first = min(reports, key=lambda report: report.get("time", 0.0))
    others = sorted(report["rank"] for report in reports if report is not first)
    also = f" (rank(s) {others} failed after it)" if others else ""
    message = (f"rank {first['rank']} of {first.get('world_size', '?')} failed{also}: {first['error']}\n"
               f"--- rank {first['rank']} traceback ---\n{first['traceback']}"
               f"checkpoints kept in {bundle / RUN_DIR}; run the same command again to resume")
    return LaunchError(message, rank=int(first["rank"]), rank_traceback=first["traceback"], bundle=bundle)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def _write_json(path: Path, data: Any) -> None:
    _write_text(path, json.dumps(data, default=str))


# ------------------------------------------------------------------------------------------ the stages


def _mixed_precision(dtype: str, use_cpu: bool, requested: str = "no", full_parameters: bool = False) -> str:
    return "bf16" if bf16_compute(dtype, use_cpu, requested=requested, full_parameters=full_parameters) else "no"


def launch_sft(model: str, examples: Sequence[Mapping[str, Sequence[int]]], settings: Any,
               launch: LaunchSettings, *, metrics_prefix: str | None = None) -> LaunchResult:
    """:func:`prorag.training.sft.train_sft_lora` under ``accelerate launch`` (``settings``: ``SFTSettings``)."""
    rows = [{"input_ids": list(example["input_ids"]), "labels": list(example["labels"])} for example in examples]
    dumped = settings.model_dump()
    key = fingerprint("sft", {"model": model, "settings": _without(dumped, "resume"), "examples": content_digest(rows),
                              "world_size": launch.world_size, "config": launch.config})
    bundle = prepare_bundle(launch, "sft", key, inputs={"examples": rows},
                            worker={"model": model, "settings": dumped, "metrics_prefix": metrics_prefix})
    return run_launch(launch, bundle, mixed_precision=_mixed_precision(settings.dtype, settings.use_cpu,
                                                                       settings.mixed_precision))


def launch_dpo(model: str, rows: Sequence[Mapping[str, str]], config: Any, launch: LaunchSettings, *,
               metrics_prefix: str | None = None, label: str = "dpo") -> LaunchResult:
    """:func:`prorag.training.dpo.train_dpo_lora` under ``accelerate launch`` (``config``: ``DPOTrainingConfig``;
    ``label`` names the bundle, e.g. ``tearag_dpo_round2``)."""
    pairs = [dict(row) for row in rows]
    dumped = config.model_dump()
    key = fingerprint(label, {"model": model, "settings": _without(dumped, "resume"), "rows": content_digest(pairs),
                              "world_size": launch.world_size, "config": launch.config})
    bundle = prepare_bundle(launch, "dpo", f"{label}-{key}" if label != "dpo" else key, inputs={"rows": pairs},
                            worker={"model": model, "settings": dumped, "metrics_prefix": metrics_prefix})
    return run_launch(launch, bundle, mixed_precision=_mixed_precision(config.dtype, config.use_cpu))


def launch_grpo(model: str, questions: Sequence[Any], index: Any, launch: LaunchSettings, *, trainer: Any,
                retriever: Any, agent: Any, reward: Any, start_adapter: str | None, full_parameters: bool,
                generation_batch_size: int, judge_for_metrics: bool, policy_server: Mapping[str, Any] | None,
                metrics_prefix: str | None = "rl", backend: Mapping[str, Any] | None = None) -> LaunchResult:
    """GRPO with the trainer ``backend`` (``rl.backend``: ``{name, args}``; None: TRL's,
    :mod:`prorag.training.backends`) and :func:`prorag.assembly.build_grpo_rollouts` under
    ``accelerate launch`` (the bundle: :func:`grpo_bundle`)."""
    bundle = grpo_bundle(model, questions, index, launch, trainer=trainer, retriever=retriever, agent=agent,
                         reward=reward, start_adapter=start_adapter, full_parameters=full_parameters,
                         generation_batch_size=generation_batch_size, judge_for_metrics=judge_for_metrics,
                         policy_server=policy_server, metrics_prefix=metrics_prefix, backend=backend)
    return run_launch(launch, bundle, mixed_precision=_mixed_precision(trainer.dtype, trainer.use_cpu,
                                                                       full_parameters=full_parameters))


def grpo_bundle(model: str, questions: Sequence[Any], index: Any, launch: LaunchSettings, *, trainer: Any,
                retriever: Any, agent: Any, reward: Any, start_adapter: str | None, full_parameters: bool,
                generation_batch_size: int, judge_for_metrics: bool, policy_server: Mapping[str, Any] | None,
                metrics_prefix: str | None = "rl", backend: Mapping[str, Any] | None = None) -> Path:
    """The bundle of a GRPO launch. The index is not copied when the ranks can do without a copy
    (:func:`index_reference`): they load the versioned index directory in place, or query the retrieval server.
    ``worker.backend`` (``rl.backend``) is written only when it is not the default (TRL's, no args)."""
    check_stage("grpo", launch, policy_server=bool(policy_server))
    records = [question.to_dict() for question in questions]
    reference = index_reference(index, retriever=retriever, reward=reward, judge_for_metrics=judge_for_metrics)
    worker = {"model": model, "trainer": trainer.model_dump(), "retriever": retriever.model_dump(),
              "agent": agent.model_dump(), "reward": reward.model_dump() if hasattr(reward, "model_dump") else reward,
              "start_adapter": str(Path(start_adapter).resolve()) if start_adapter else None,
              "full_parameters": full_parameters, "generation_batch_size": generation_batch_size,
              "judge_for_metrics": judge_for_metrics, "policy_server": dict(policy_server) if policy_server else None,
              "metrics_prefix": metrics_prefix, "index": reference}
    if backend and dict(backend) != {"name": "trl", "args": {}}:
        worker["backend"] = dict(backend)
    payload = {**worker, "trainer": _without(worker["trainer"], "resume"), "policy_server": None,
               "metrics_prefix": None, "index": _index_identity(index), "questions": content_digest(records),
               "world_size": launch.world_size, "config": launch.config}
    files = {"index": index.save} if reference["mode"] == "copy" else None
    return prepare_bundle(launch, "grpo", fingerprint("grpo", payload), inputs={"questions": records}, files=files,
                          worker=worker)


def index_reference(index: Any, *, retriever: Any, reward: Any, judge_for_metrics: bool) -> dict[str, Any]:
    """How the ranks of a GRPO launch get the retrieval index, without copying it when they can:

    * ``{"mode": "server", "retrieval_url": …}``: ``retriever.retrieval_url`` is set and the reward needs no index
      (no detection judges, no query embedder, no ``judge_for_metrics``): the ranks query the retrieval server over
      HTTP and load no index at all;
    * ``{"mode": "path", "path": …}``: the index was loaded from a directory (the catalog's versioned
      ``retrieval_index``; Kedro never rewrites a version): every rank loads it from there, read-only (memory-mapped);
    * ``{"mode": "copy"}``: an index built in memory (or downloaded to a temporary folder) is written into the
      bundle (``inputs/index``) once.
    """
    if getattr(retriever, "retrieval_url", None) and not judge_for_metrics:
        from prorag.rewards.registry import build_reward

        needs = build_reward(reward).needs
        if not (needs.detection or needs.embedder):
            return {"mode": "server", "retrieval_url": retriever.retrieval_url}
    source = getattr(index, "source_dir", None)
    if source is not None and Path(source).is_dir():
        return {"mode": "path", "path": str(Path(source).resolve())}
    return {"mode": "copy"}


def _index_identity(index: Any) -> str:
    meta = getattr(index, "meta", None)
    return json.dumps(meta.__dict__ if meta is not None and hasattr(meta, "__dict__") else repr(index),
                      sort_keys=True, default=str)


def _without(data: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in keys}
