"""Runs ``kedro run`` subprocesses one after another, each one's output in its own log, and tabulates their wall
times: the runner that ``scripts/train_all.py`` and ``scripts/run_every_pipeline.py`` share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

Result = tuple[str, float, int]
"""(pipeline, wall seconds, exit status) of one run."""


def kedro_command(pipeline: str, env: str | None, params: str | None = None) -> list[str]:
    """``kedro run`` of one pipeline in this interpreter (the project's virtualenv), with ``--params`` if given."""
    return [sys.executable, "-m", "kedro", "run", f"--pipelines={pipeline}", *(["--env", env] if env else []),
            *(["--params", params] if params else [])]


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour)."""
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def run_all(pipelines: Sequence[str], command: Callable[[str], list[str]], log_dir: Path, *, cwd: Path | None = None,
            echo: Callable[[str], None] = print, stop_on_failure: bool = False,
            env: Mapping[str, str] | None = None) -> list[Result]:
    """Run each pipeline's command in ``cwd`` (default: this process's) in order, its output to
    ``<log_dir>/<pipeline>.log``; a failing run shows its log's tail and the others go on (``stop_on_failure``: none
    after it). ``env`` is added to this process's environment. Returns (pipeline, seconds, exit status) of every run
    made."""
    log_dir.mkdir(parents=True, exist_ok=True)
    cwd = cwd or Path.cwd()
    results: list[Result] = []
    started = time.monotonic()
    for position, pipeline in enumerate(pipelines, start=1):
        log = log_dir / f"{pipeline}.log"
        shown = log.relative_to(cwd) if log.is_relative_to(cwd) else log
        echo(f"[{position}/{len(pipelines)}] {pipeline} (log: {shown}; {clock(time.monotonic() - started)} elapsed)")
        begin = time.monotonic()
        with log.open("w", encoding="utf-8") as output:
            status = subprocess.run(command(pipeline), cwd=cwd, stdout=output, stderr=subprocess.STDOUT,
                                    env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", **(env or {})},
                                    check=False).returncode
        results.append((pipeline, time.monotonic() - begin, status))
        echo(f"      {pipeline}: {'done' if status == 0 else f'FAILED (exit {status})'} in {clock(results[-1][1])}")
        if status != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            echo("\n".join(f"      | {line}" for line in tail))
            if stop_on_failure:
                break
    return results


def timings_table(results: Sequence[Result], total: float, logs: Mapping[str, str] | None = None) -> str:
    """The wall time and status of every run as Markdown, with each run's log where ``logs`` names it."""
    log_column = logs is not None
    header = "| pipeline | seconds | wall time | status |" + (" log |" if log_column else "")
    lines = [header, "|---|---:|---:|---|" + ("---|" if log_column else "")]
    for pipeline, seconds, status in results:
        row = f"| {pipeline} | {seconds:.0f} | {clock(seconds)} | {'ok' if status == 0 else f'failed ({status})'} |"
        lines.append(row + (f" {(logs or {}).get(pipeline, '')} |" if log_column else ""))
    return "\n".join([*lines, f"| **all** | **{total:.0f}** | **{clock(total)}** | |" + (" |" if log_column else "")
                      ]) + "\n"
