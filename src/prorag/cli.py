"""The project's ``kedro run``: Kedro's own command, with expected user errors printed as one line and a hint.

Kedro looks up ``<package>.cli`` for project commands (``kedro run`` and ``python -m prorag`` both find this
``run``). An expected error — an unknown pipeline, an input without a saved version, a mistyped parameter, a bad
data file, a missing API key (any :class:`prorag.errors.UserError`) — prints its message and a hint instead of a
100-line traceback; ``--traceback`` or ``PRORAG_TRACEBACK=1`` shows the traceback. Any other error is raised as
before.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from typing import Any

import click
from kedro.framework.cli.project import run as kedro_run
from kedro.framework.cli.utils import _split_params

from prorag.errors import TRACEBACK_ENV, user_error_message
from prorag.redaction import redact_text

TRACEBACK_HINT = f"(the traceback: add --traceback or set {TRACEBACK_ENV}=1)"
CATALOG_LOGGER = "kedro.io.data_catalog"
"""Kedro's catalog logger: a "Loading data from … / Saving data to …" INFO line per dataset and node."""
STARTUP_LOGGER = "kedro.framework.project"
"""Kedro's start-up logger: "Using 'conf/logging.yml' as logging configuration …" (conf/logging.yml buffers it)."""
CHATTER_LOGGERS = frozenset({CATALOG_LOGGER, STARTUP_LOGGER, "kedro.framework.session.session"})
"""Loggers whose INFO lines stay off the terminal: the catalog's, the start-up line, "Kedro project prorag"."""
RUNNER_CHATTER = ("Using synchronous mode", "Asynchronous mode is enabled")
"""The runner's start-up INFO lines (its per-node lines stay)."""


class ChatterFilter(logging.Filter):
    """Drops Kedro's chatter below WARNING (the catalog's load/save lines, half of a run's records, and the start-up
    lines): the terminal keeps a line per node, info.log everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        if record.name in CHATTER_LOGGERS:
            return False
        return not (record.name.startswith("kedro.runner.") and record.getMessage().startswith(RUNNER_CHATTER))


def _terminal_handlers() -> list[logging.Handler]:
    return [handler for handler in logging.getLogger().handlers if not isinstance(handler, logging.FileHandler)]


def quiet_terminal() -> None:
    """Keep Kedro's chatter off the terminal handlers of the root logger (``conf/logging.yml``'s ``rich``); file
    handlers (``info.log``) keep every record."""
    for handler in _terminal_handlers():
        if not any(isinstance(existing, ChatterFilter) for existing in handler.filters):
            handler.addFilter(ChatterFilter())


def release_startup_lines(verbose: bool) -> None:
    """Kedro's start-up line, logged before any project code runs, waits in ``conf/logging.yml``'s
    ``startup_buffer`` (and is in info.log): printed on the terminal handlers with ``--verbose``, dropped otherwise.
    The start-up logger then goes through the root handlers like any other."""
    logger = logging.getLogger(STARTUP_LOGGER)
    buffers = [handler for handler in logger.handlers if isinstance(handler, logging.handlers.MemoryHandler)]
    if not buffers:  # a logging configuration without the buffer, or already released
        return
    records = [record for handler in buffers for record in handler.buffer]
    for handler in list(logger.handlers):  # the buffer, and info.log (the root logger has it too)
        logger.removeHandler(handler)
    logger.propagate = True
    if verbose:
        for record in records:
            for handler in _terminal_handlers():
                if record.levelno >= handler.level:
                    handler.handle(record)


def _traceback_wanted(flag: bool) -> bool:
    return flag or os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


@click.pass_context
def _run(ctx: click.Context, traceback: bool, verbose: bool, **kwargs: Any) -> Any:
    """Kedro's ``run``; expected errors become one line and a hint (``--traceback``: the traceback too); Kedro's
    start-up lines and the catalog's load/save lines stay in info.log unless ``--verbose``."""
    release_startup_lines(verbose)
    if not verbose:
        quiet_terminal()
    try:
        return ctx.invoke(kedro_run.callback, **kwargs)
    except Exception as error:
        message = user_error_message(error)
        if message is None or _traceback_wanted(traceback):
            raise
        click.secho(f"Error: {redact_text(message)}", fg="red", err=True)  # printed, not logged: no filter
        click.echo(TRACEBACK_HINT, err=True)
        ctx.exit(1)


run = click.Command(
    name="run",
    callback=_run,
    params=[*kedro_run.params,
            click.Option(["--traceback"], is_flag=True, default=False,
                         help=f"Show the traceback of an expected error (also {TRACEBACK_ENV}=1)."),
            click.Option(["--verbose"], is_flag=True, default=False,
                         help="Also print Kedro's start-up and per-dataset load/save lines (always in info.log).")],
    help=kedro_run.help,
    short_help=kedro_run.short_help,
)


@click.group(name="prorag")
def cli() -> None:
    """prorag's project commands (Kedro's, with ``run`` reporting expected errors without a traceback)."""


cli.add_command(run)


@cli.command(name="preflight")
@click.option("--env", "-e", default=None, help="The Kedro environment (e.g. gpu), as for kedro run.")
@click.option("--params", type=click.UNPROCESSED, default="", callback=_split_params,
              help="Runtime parameters, as for kedro run (key1=value1,key2.sub=value2).")
def preflight_command(env: str | None, params: dict[str, Any]) -> None:
    """Run the GPU preflight on the parameters of --env and --params, as `kedro run` would before its first node
    (placement, the launch's GPUs, memory per process), and run nothing else. An sbatch runs it before its steps."""
    from pathlib import Path

    from prorag.config_loader import CONFIG_LOADER_ARGS, ProjectConfigLoader
    from prorag.methods import trainer_blocks
    from prorag.scale.preflight import preflight

    loader = ProjectConfigLoader(str(Path.cwd() / "conf"), env=env, runtime_params=params, **CONFIG_LOADER_ARGS)
    try:
        parameters = loader["parameters"]
        found = preflight(parameters, trainer_blocks(parameters))
    except ValueError as error:
        click.secho(f"Error: preflight refused --env {env} --params: {error}", fg="red", err=True)
        raise SystemExit(1) from error
    for estimate in found.trainers:
        click.echo(f"{estimate.stage}: about {estimate.total:.1f} GiB per training process")
    from prorag.scale.step_time import describe

    for where, (shape, step) in found.step_times.items():
        click.echo(f"{where}: {describe(step, shape)}; rollout concurrency sized for the batch: "
                   f"{where}.generation_batch_size {step.sized}")
    click.echo("preflight passed")
