"""How long a launch and its ranks live (:mod:`prorag.training.launch`, :mod:`prorag.launch_worker`), with
real subprocesses: ``launch.timeout`` stops a launch that prints nothing (a deadlocked collective is silent) and its
whole process tree; a rank ends when its launcher on its own machine is gone, whatever its pipes do; a rank on
another machine does not watch the first machine's process ids."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prorag.training.launch import FAULT_ENV, LaunchError, LaunchSettings, prepare_bundle, run_launch

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    return [pid for pid in pids if _alive(pid)]


def _read_pid(path: Path, seconds: float = 60.0) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text())
        time.sleep(0.2)
    raise AssertionError(f"{path} was not written within {seconds:.0f} s")


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------ launch.timeout


SILENT_LAUNCH = """
import os, signal, subprocess, sys, time
# a rank in its own session that ignores SIGTERM, as torch elastic starts its workers (start_new_session)
rank = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "time.sleep(120)"], start_new_session=True)
open(sys.argv[1], "w").write(str(rank.pid))
print("started", flush=True)
time.sleep(30)  # then silence: what a deadlocked collective prints
"""


@pytest.mark.integration
def test_a_silent_launch_is_stopped_at_its_deadline_with_its_whole_process_tree(tmp_path, monkeypatch):
    import prorag.training.launch as launch

    settings = LaunchSettings(mode="accelerate", root=str(tmp_path / "launches"), timeout=3.0)
    bundle = prepare_bundle(settings, "sft", "silent", inputs={}, worker={})
    rank_pid = tmp_path / "rank.pid"
    monkeypatch.setattr(launch, "launch_command",
                        lambda *args, **kwargs: [sys.executable, "-c", SILENT_LAUNCH, str(rank_pid)])
    monkeypatch.setattr(launch, "STOP_GRACE_S", 2.0)
    started = time.monotonic()
    try:
        with pytest.raises(LaunchError, match=r"ran past launch\.timeout \(3 s\).*stopped") as failed:
            run_launch(settings, bundle)
        elapsed = time.monotonic() - started
        assert elapsed < 10, f"the deadline fired after {elapsed:.1f} s"
        assert "started" in str(failed.value)  # the launch's last output
        rank = _read_pid(rank_pid, 1)
        assert _wait_gone([rank], 3) == [], "a rank that ignores SIGTERM outlived the stopped launch"
    finally:
        with contextlib.suppress(AssertionError):
            _kill([_read_pid(rank_pid, 0)])


@pytest.mark.integration
@pytest.mark.distributed
def test_a_rank_hung_in_a_collective_is_stopped_at_the_deadline(tmp_path, monkeypatch, caplog):
    """Two gloo ranks of a real SFT launch; rank 1 sleeps silently after step 1 while rank 0 waits in the next
    collective: the launch fails at ``launch.timeout`` and no rank is left."""
    from prorag.training.config import SFTSettings
    from prorag.training.launch import launch_sft

    from .test_launch import EXAMPLES, TINY, _ranks_of

    root = tmp_path / "launches"
    settings = LaunchSettings(mode="accelerate", processes_per_machine=2, root=str(root), threads_per_process=1,
                              timeout=75.0)  # reaching step 1 takes ~15 s alone, ~30 s under make test
    monkeypatch.setenv(FAULT_ENV, "rank=1,step=1,action=sleep:900")
    caplog.set_level(logging.INFO, logger="prorag.training.launch")
    started = time.monotonic()
    try:
        with pytest.raises(LaunchError, match=r"ran past launch\.timeout \(75 s\)"):
            launch_sft(TINY, EXAMPLES, SFTSettings(max_steps=3, per_device_train_batch_size=1, save_steps=1,
                                                   lora_r=4, lora_alpha=8), settings)
        assert time.monotonic() - started < 75 + 40
        # it hung after training had started, not while loading
        assert any("fault injection: sleeping at step 1" in record.getMessage() for record in caplog.records)
        deadline = time.monotonic() + 10
        while _ranks_of(root) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _ranks_of(root), "ranks outlived the stopped launch"
    finally:
        _kill(_ranks_of(root))


# ------------------------------------------------------------------------------------------ the ranks' watch


RANK = """
import os, sys, time
from prorag.launch_worker import _watch_launcher
_watch_launcher()
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""

KEDRO = """
import sys
import prorag.training.launch as launch
root, rank_script, rank_pid = sys.argv[1:4]
settings = launch.LaunchSettings(mode="accelerate", root=root)
bundle = launch.prepare_bundle(settings, "sft", "killed", inputs={}, worker={})
# accelerate's own launcher with one process (its simple launcher: Popen, then wait), starting a stand-in rank
launch.launch_command = lambda *args, **kwargs: [
    sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
    "--mixed_precision", "no", "--dynamo_backend", "no", rank_script, rank_pid]
launch.run_launch(settings, bundle)
"""


@pytest.mark.integration
def test_kill_9_of_the_launching_process_leaves_no_rank_behind(tmp_path):
    """kedro (stand-in) → ``accelerate launch`` → a rank whose stdout and stderr are the pipe to kedro: ``kill -9`` of
    kedro closes the pipe and ends accelerate's launcher (SIGTERM on its parent's death); the rank ends too."""
    rank_script = tmp_path / "rank.py"
    rank_script.write_text(RANK)
    rank_pid = tmp_path / "rank.pid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    kedro = subprocess.Popen([sys.executable, "-c", KEDRO, str(tmp_path / "launches"), str(rank_script),
                              str(rank_pid)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rank = None
    try:
        rank = _read_pid(rank_pid, 120)
        time.sleep(1.5)  # the watch is running
        os.kill(kedro.pid, signal.SIGKILL)
        kedro.wait()
        assert _wait_gone([rank], 10) == [], "the rank outlived the killed launching process"
    finally:
        kedro.kill()
        if rank is not None:
            _kill([rank])


@pytest.mark.integration
def test_a_rank_on_another_machine_does_not_watch_the_first_machines_pid(tmp_path):
    """Machine 1's ranks inherit machine 0's environment through ``srun``: a launcher pid there names a process of
    another machine (here: one that does not exist). The rank keeps running while its own launcher lives."""
    rank_pid = tmp_path / "rank.pid"
    env = {**os.environ, "PRORAG_LAUNCHER_PID": "4194000", "RANK": "8", "LOCAL_RANK": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(rank_pid)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _read_pid(rank_pid, 60)
        time.sleep(4)
        assert rank.poll() is None, f"the rank exited with {rank.returncode}: {rank.communicate()[0]}"
    finally:
        rank.kill()
        rank.wait()


# ------------------------------------------------------------------------------------------ the scheduler trains


def _external(tmp_path: Path, **overrides: object) -> LaunchSettings:
    return LaunchSettings(**{"mode": "external", "root": str(tmp_path / "launches"), "threads_per_process": 1,
                             "handoff": str(tmp_path / "handoff"), **overrides})


def _in_thread(function, *args, **kwargs):
    import threading

    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = function(*args, **kwargs)
        except BaseException as error:  # handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _handed_over(handoff: Path, seconds: float = 120.0) -> Path:
    deadline = time.monotonic() + seconds
    while not handoff.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    return Path(handoff.read_text())


def test_an_external_launch_reports_the_scheduler_s_failed_job_with_the_rank_s_traceback(tmp_path, monkeypatch):
    """The node hands the bundle over and starts nothing; the scheduler runs ``launch.sh``, whose rank fails: the
    node fails with that rank's traceback."""
    import prorag.training.launch as launch

    monkeypatch.setattr(launch, "POLL_S", 0.2)
    settings = _external(tmp_path)
    bundle = prepare_bundle(settings, "sft", "external", inputs={}, worker={})
    (bundle / "bundle.json").write_text((bundle / "bundle.json").read_text().replace('"stage": "sft"',
                                                                                      '"stage": "unknown"'))
    thread, outcome = _in_thread(run_launch, settings, bundle)
    handed = _handed_over(tmp_path / "handoff", 10)
    assert handed == bundle and thread.is_alive()  # waiting, with nothing started
    script = (bundle / "launch.sh").read_text()
    assert "accelerate.commands.launch" in script and "--machine_rank $rank" in script
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["bash", str(bundle / "launch.sh")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    assert (bundle / "exit_codes" / "machine_0").read_text().strip() == str(done.returncode)
    thread.join(30)
    error = outcome.get("error")
    assert isinstance(error, LaunchError), outcome
    assert "rank 0 of 1 failed: ValueError" in str(error) and "unknown stage 'unknown'" in str(error)


def test_an_external_launch_without_a_result_stops_waiting_at_its_timeout(tmp_path, monkeypatch):
    import prorag.training.launch as launch

    monkeypatch.setattr(launch, "POLL_S", 0.2)
    settings = _external(tmp_path, timeout=1.0)
    bundle = prepare_bundle(settings, "sft", "nobody", inputs={}, worker={})
    with pytest.raises(LaunchError, match=r"no result .* within launch\.timeout \(1 s\): did the scheduler run "):
        run_launch(settings, bundle)


@pytest.mark.integration
@pytest.mark.distributed
def test_the_scheduler_trains_an_external_launch_and_the_node_reads_its_result(tmp_path):
    """SFT on the tiny Llama: the node (a thread here) writes the bundle and waits; the scheduler (this test) runs the
    bundle's stock ``launch.sh``; the node returns rank 0's result."""
    from prorag.training.config import SFTSettings
    from prorag.training.launch import launch_sft

    from .test_launch import EXAMPLES, TINY

    settings = _external(tmp_path)
    thread, outcome = _in_thread(launch_sft, TINY, EXAMPLES, SFTSettings(max_steps=2, per_device_train_batch_size=1,
                                                                          save_steps=1, lora_r=4, lora_alpha=8),
                                 settings)
    bundle = _handed_over(tmp_path / "handoff")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["bash", str(bundle / "launch.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    thread.join(60)
    result = outcome.get("result")
    assert result is not None, outcome
    assert result.bundle == bundle and result.world_size == 1 and result.global_step == 2
    assert (result.adapter / "adapter_model.safetensors").is_file()
