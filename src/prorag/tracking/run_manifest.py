"""Run manifests: which versions a run loaded and saved, and whether it completed — so that the inputs of a run
come from completed runs and belong together (issue 11, item 3). Kedro-free; :mod:`prorag.hooks.run_versions`
applies it.

A versioned dataset's version is the id of the session that saved it. Each run writes
``<directory>/<run id>.json`` when it starts (status ``running``, with its host and process id), and rewrites it
when it ends: ``completed``, ``failed``, or ``killed`` (SIGTERM, Ctrl-C). A run killed with SIGKILL cannot write its
end: the next run on the same host marks it ``killed`` when its process is gone (:meth:`RunManifests.mark_lost`).

:func:`choose_load_versions` picks, for each versioned input, the newest version whose run *completed* (a version
without any manifest, written before manifests existed, counts as completed), instead of Kedro's newest version
on disk, which may come from a run that failed halfway (its first outputs saved, the rest not). It then checks
that the chosen versions belong together: the *lineage* of a version is what its run loaded or wrote upstream of
it (``sources``: what the dataset derives from in the run's pipeline; a run that wrote ``index_questions`` from
the raw question files and, in another branch, judged old ``trajectories``, gives ``index_questions`` no
trajectories in its lineage), recursively; two inputs whose lineages name different versions of the same dataset
(e.g. trajectories rolled out over the index of one run, and ``index_questions`` of a later run) fail the run with
both versions named, unless ``--load-versions`` pins them.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from prorag.errors import UserError

logger = logging.getLogger(__name__)

Status = Literal["running", "completed", "failed", "killed"]


class RunVersionError(UserError, RuntimeError):
    """The inputs of a run cannot be taken from completed runs that belong together; the message says which
    datasets and versions, and how to choose them explicitly."""


@dataclass
class RunManifest:
    """One run: its status, the pipelines it ran, and the versions of the versioned datasets it loaded and saved.

    ``sources`` maps each dataset the run writes to the datasets it derives from in the run's pipeline: the inputs
    upstream of it, and the datasets the run writes on the way to it; a dataset missing there (a manifest written
    before ``sources`` existed) derives from all of ``loaded``."""

    run_id: str
    status: Status = "running"
    pipelines: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    loaded: dict[str, str] = field(default_factory=dict)
    saved: dict[str, str] = field(default_factory=dict)
    sources: dict[str, list[str]] = field(default_factory=dict)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    def upstream(self, dataset: str) -> dict[str, str]:
        """The versions this run loaded or saved that ``dataset`` derives from (all it loaded when ``sources`` is
        silent)."""
        if dataset not in self.sources:
            return dict(self.loaded)
        versions = {**self.saved, **self.loaded}
        return {name: versions[name] for name in self.sources[dataset] if name in versions}


class RunManifests:
    """The manifests in ``directory`` (one JSON file per run id), read lazily and cached."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._cache: dict[str, RunManifest | None] = {}

    def path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.json"

    def write(self, manifest: RunManifest) -> None:
        """Write (or replace) a manifest atomically."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(manifest.run_id)
        temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        temporary.write_text(json.dumps(asdict(manifest), indent=1, sort_keys=True), encoding="utf-8")
        temporary.replace(target)
        self._cache[manifest.run_id] = manifest

    def read(self, run_id: str) -> RunManifest | None:
        """The manifest of ``run_id``, or None when there is none (or it cannot be read: a warning says so)."""
        if run_id not in self._cache:
            path = self.path(run_id)
            manifest = None
            if path.is_file():
                try:
                    manifest = RunManifest(**json.loads(path.read_text(encoding="utf-8")))
                except (OSError, ValueError, TypeError) as error:
                    logger.warning("run manifest %s cannot be read (%s); treating the run as not completed", path,
                                   error)
                    manifest = RunManifest(run_id=run_id, status="failed")
            self._cache[run_id] = manifest
        return self._cache[run_id]

    def mark_lost(self) -> list[str]:
        """Mark ``killed`` every ``running`` manifest of this host whose process is gone (SIGKILL, a crash of the
        machine's runner); returns their run ids."""
        lost = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            manifest = self.read(path.stem)
            if manifest is not None and manifest.status == "running" and manifest.host == socket.gethostname() \
                    and not process_alive(manifest.pid):
                manifest.status = "killed"
                self.write(manifest)
                lost.append(manifest.run_id)
        return lost

    def status(self, version: str) -> str:
        """The status of the run that saved ``version`` (``no manifest`` for a version saved before manifests)."""
        manifest = self.read(version)
        return "no manifest" if manifest is None else manifest.status

    def usable(self, version: str) -> bool:
        """Whether a dataset version may be loaded by default: its run completed, or it predates manifests."""
        manifest = self.read(version)
        return manifest is None or manifest.status == "completed"

    def lineage(self, name: str, version: str) -> dict[str, str]:
        """``{dataset: version}`` of ``name@version`` and of what its run loaded upstream of it, recursively."""
        result: dict[str, str] = {}
        pending = [(name, version)]
        while pending:
            dataset, dataset_version = pending.pop()
            if dataset in result:
                continue
            result[dataset] = dataset_version
            manifest = self.read(dataset_version)
            if manifest is not None:
                pending.extend(manifest.upstream(dataset).items())
        return result


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a pid of 0 or less, unknown: assumed alive)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def choose_load_versions(available: Mapping[str, Sequence[str]], manifests: RunManifests,
                         explicit: Mapping[str, str] | None = None) -> dict[str, str]:
    """The version to load for each versioned input (see the module docstring).

    ``available`` maps each input to its stored versions, newest first; ``explicit`` are the versions the user
    pinned (``kedro run --load-versions``), taken as given when stored. Raises :class:`RunVersionError` when a pinned
    version is not stored, when an input has versions but none from a completed run, or when two inputs do not
    belong together.
    """
    explicit = dict(explicit or {})
    chosen: dict[str, str] = {}
    for name, versions in available.items():
        if name in explicit:
            if explicit[name] not in versions:
                stored = ", ".join(versions[:5]) + (", …" if len(versions) > 5 else "") if versions else "none"
                raise RunVersionError(f"--load-versions={name}:{explicit[name]}: {name} has no such version "
                                      f"(stored, newest first: {stored})")
            chosen[name] = explicit[name]
            continue
        usable = next((version for version in versions if manifests.usable(version)), None)
        if usable is None:
            if versions:
                statuses = ", ".join(f"{version} ({manifests.status(version)})" for version in versions[:5])
                raise RunVersionError(
                    f"{name}: no stored version comes from a completed run ({statuses}); re-run the pipeline that "
                    f"produces it, or choose one with --load-versions={name}:<version>")
            continue  # nothing stored: Kedro reports the missing input
        if usable != versions[0]:
            logger.warning("%s: loading %s, the newest version from a completed run; %s is from a run that is %s",
                           name, usable, versions[0], manifests.status(versions[0]))
        chosen[name] = usable
    _check_lineages(chosen, manifests, set(explicit))
    return chosen


def lineage_conflicts(lineages: Mapping[str, Mapping[str, Hashable]]
                      ) -> Iterator[tuple[str, str, Hashable, str, Hashable]]:
    """Every place where two inputs' lineages (``{input: {dataset: version}}``, each input's own version included)
    name a dataset at different versions, inputs in sorted order: ``(dataset, first input, the version through
    it, input, the version through it)``, the first input being the first whose lineage names the dataset."""
    origin: dict[str, tuple[Hashable, str]] = {}
    for name in sorted(lineages):
        for dataset, dataset_version in lineages[name].items():
            first_version, first_input = origin.setdefault(dataset, (dataset_version, name))
            if first_version != dataset_version:
                yield dataset, first_input, first_version, name, dataset_version


def _check_lineages(chosen: Mapping[str, str], manifests: RunManifests, explicit: set[str]) -> None:
    lineages = {name: manifests.lineage(name, version) for name, version in chosen.items()}
    for dataset, first_input, first_version, name, dataset_version in lineage_conflicts(lineages):
        if {name, first_input} <= explicit:
            continue
        first_input_version, version = chosen[first_input], chosen[name]
        raise RunVersionError(
            f"inputs from runs that do not belong together: {_via(first_input, first_input_version, dataset)} "
            f"{dataset} {first_version}, but {_via(name, version, dataset)} {dataset} {dataset_version}. "
            f"Re-run the pipeline that produces the older one, or choose versions explicitly with "
            f"--load-versions (e.g. --load-versions={dataset}:{first_version})")


def _via(name: str, version: str, dataset: str) -> str:
    return f"{name} {version} is" if name == dataset else f"{name} {version} was made from"
