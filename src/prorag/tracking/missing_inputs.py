"""Inputs that have no saved version yet, and which registered pipeline to run first; the values an optional input
loads as (:class:`Available`, :class:`Missing`). Kedro-free;
:class:`prorag.hooks.run_versions.RunVersionHook` applies it before any node runs.

Without this, ``kedro run --pipelines=train_rl`` on a fresh project runs its first nodes and only then fails on a
``VersionNotFoundError`` for ``sft_adapter``; with it, the run does not start and says
``sft_adapter has no version yet: run `kedro run --pipelines=train_sft` (or train) first``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prorag.tracking.run_manifest import RunVersionError


class MissingInputError(RunVersionError):
    """A run's input has no saved version; the message names the pipelines that write it."""


@dataclass(frozen=True)
class PipelineShape:
    """What the suggestions need of a registered pipeline: its name, its free dataset inputs (no parameters),
    every dataset its nodes write, and its number of nodes."""

    name: str
    inputs: frozenset[str]
    outputs: frozenset[str]
    size: int


def producers(dataset: str, pipelines: Iterable[PipelineShape], has_data: Callable[[str], bool]) -> list[str]:
    """The pipelines that write ``dataset``, best first: those whose own inputs all have data (they can run now)
    before the others, then fewer inputs without data, then fewer nodes. Only the best group is returned — the
    pipelines tied on inputs without data — and a pipeline registered twice (an alias, ``__default__``) once."""
    ranked: list[tuple[int, int, str]] = []
    seen: set[tuple[frozenset[str], frozenset[str], int]] = set()
    for shape in sorted(pipelines, key=lambda shape: len(shape.name)):  # an alias: its shortest name (train)
        key = (shape.inputs, shape.outputs, shape.size)
        if dataset not in shape.outputs or shape.name.startswith("__") or key in seen:
            continue
        seen.add(key)
        lacking = sum(not has_data(name) for name in shape.inputs)
        ranked.append((lacking, shape.size, shape.name))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [name for lacking, _, name in ranked if lacking == ranked[0][0]]


def missing_input_line(dataset: str, suggestions: Sequence[str]) -> str:
    """``<dataset> has no version yet: run `kedro run --pipelines=<first>` (or <next two>) first``."""
    if not suggestions:
        return f"{dataset} has no version yet, and no registered pipeline writes it"
    others = f" (or {', '.join(suggestions[1:3])})" if len(suggestions) > 1 else ""
    return f"{dataset} has no version yet: run `kedro run --pipelines={suggestions[0]}`{others} first"


def check_inputs_have_versions(missing: Sequence[str], pipelines: Sequence[PipelineShape],
                               has_data: Callable[[str], bool]) -> None:
    """Raise :class:`MissingInputError` when ``missing`` (inputs of the run without any saved version) is not
    empty: one line per dataset with the pipelines to run first (:func:`producers`)."""
    if not missing:
        return
    lines = [missing_input_line(name, producers(name, pipelines, has_data)) for name in sorted(missing)]
    if len(lines) == 1:
        raise MissingInputError(lines[0])
    raise MissingInputError(f"{len(lines)} inputs of this run have no version yet:\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class Available:
    """An optional input that has a usable version: its data and that version."""

    data: Any
    version: str


@dataclass(frozen=True)
class Missing:
    """An optional input without a usable version, and why (with what makes one)."""

    reason: str
