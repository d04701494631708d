"""The project's ``kedro run``: Kedro's own command, with expected user errors printed as one line and a hint.

Kedro looks up ``<package>.cli`` for project commands (``kedro run`` and ``python -m prorag`` both find this
``run``). An expected error — an unknown pipeline, an input without a saved version, a mistyped parameter, a bad
data file, a missing API key (any :class:`prorag.errors.UserError`) — prints its message and a hint instead of a
100-line traceback; ``--traceback`` or ``PRORAG_TRACEBACK=1`` shows the traceback. Any other error is raised as
before.
"""

from __future__ import annotations

import logging
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


class CatalogChatterFilter(logging.Filter):
    """Drops the catalog's INFO lines (half of a run's records): the terminal keeps a line per node, info.log all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == CATALOG_LOGGER and record.levelno < logging.WARNING)


def quiet_terminal() -> None:
    """Keep the catalog's load/save lines off the terminal handlers of the root logger (``conf/logging.yml``'s
    ``rich``); file handlers (``info.log``) keep every record."""
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler) and not any(
                isinstance(existing, CatalogChatterFilter) for existing in handler.filters):
            handler.addFilter(CatalogChatterFilter())


def _traceback_wanted(flag: bool) -> bool:
    return flag or os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


@click.pass_context
def _run(ctx: click.Context, traceback: bool, verbose: bool, **kwargs: Any) -> Any:
    """Kedro's ``run``; expected errors become one line and a hint (``--traceback``: the traceback too); the
    catalog's load/save lines stay in info.log unless ``--verbose``."""
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
                         help="Also print Kedro's per-dataset load/save lines (always in info.log).")],
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
    from prorag.scale.preflight import preflight

    loader = ProjectConfigLoader(str(Path.cwd() / "conf"), env=env, runtime_params=params, **CONFIG_LOADER_ARGS)
    try:
        found = preflight(loader["parameters"])
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
