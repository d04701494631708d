"""The run-versions hook: inputs from completed runs that belong together, and a manifest per run (issue 11, item 3);
a ``--load-versions`` pin on a dataset the run writes is refused (issue 47, bug 7)."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Final, Literal

from kedro.framework.hooks import hook_impl
from kedro.io import AbstractDataset, AbstractVersionedDataset, DataCatalog, Version
from kedro.pipeline import Node, Pipeline

from prorag.datasets import OptionalVersionDataset
from prorag.datasets.optional_version_dataset import stored_versions
from prorag.hooks.support import on_termination
from prorag.tracking.missing_inputs import (
    PipelineShape,
    check_inputs_have_versions,
    missing_input_line,
    producers,
)
from prorag.tracking.run_manifest import (
    RunManifest,
    RunManifests,
    RunVersionError,
    choose_load_versions,
)

logger = logging.getLogger(__name__)


RUN_MANIFEST_DIR = Path("data") / "runs"
"""Where run manifests live, relative to the project root (see :mod:`prorag.tracking.run_manifest`)."""


class RunVersionHook:
    """Inputs from completed runs that belong together, and a manifest per run (issue 11, item 3).

    Before the pipeline runs, a versioned input with no saved version fails the run naming the registered
    pipelines that write it (:func:`~prorag.tracking.missing_inputs.check_inputs_have_versions`); every other
    versioned input without a ``--load-versions`` pin is pinned to the newest
    version saved by a *completed* run, and the chosen versions must share their lineage, else the run fails
    naming both versions (:func:`~prorag.tracking.run_manifest.choose_load_versions`). An optional input
    (:func:`optional_inputs`: compare's adapters) is pinned the same way, each on its own, and loads through an
    :class:`~prorag.datasets.OptionalVersionDataset`: ``Available(data, version)``, or ``Missing(reason)`` when no
    version is usable (none saved, or only by runs that did not complete). The run's manifest in
    :data:`RUN_MANIFEST_DIR` records what it loaded and saved and ends ``completed``, ``failed`` or ``killed``.
    """

    def __init__(self) -> None:
        self._catalog: DataCatalog | None = None
        self._manifests: RunManifests | None = None
        self._manifest: RunManifest | None = None
        self._exit_handler_installed = False

    @hook_impl
    def after_catalog_created(self, catalog: DataCatalog) -> None:
        self._catalog = catalog

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline, catalog: DataCatalog) -> None:
        project_path = Path(run_params.get("project_path") or Path.cwd())
        self._manifests = manifests = RunManifests(project_path / RUN_MANIFEST_DIR)
        for run_id in manifests.mark_lost():
            logger.warning("run %s was killed (its process is gone): its manifest now says killed", run_id)
        versioned = {name: dataset for name in sorted(pipeline.inputs())
                     if (dataset := _versioned(catalog, name)) is not None}
        available = {name: stored_versions(dataset) for name, dataset in versioned.items()}
        pins = run_params.get("load_versions") or {}
        refuse_pinned_outputs(pins, pipeline)
        optional = optional_inputs(pipeline) & set(versioned)
        required = {name: versions for name, versions in available.items() if name not in optional}
        check_inputs_have_versions([name for name, versions in required.items() if not versions and name not in pins],
                                   _registered_pipeline_shapes(), lambda name: _has_data(catalog, name))
        chosen = choose_load_versions(required, manifests, pins)
        for name, version in chosen.items():
            dataset = versioned[name]
            if dataset._version.load != version and available[name][:1] != [version]:
                _replace(catalog, name, dataset._copy(_version=Version(version, dataset._version.save)))
        for name in sorted(optional):
            version, reason = _optional_version(catalog, name, available[name], manifests, pins)
            dataset = versioned[name]
            if version is not None:
                chosen[name] = version
                dataset = dataset._copy(_version=Version(version, dataset._version.save))
            _replace(catalog, name, OptionalVersionDataset(dataset=dataset, reason=reason,
                                                           metadata=getattr(dataset, "metadata", None)))
        self._manifest = RunManifest(run_id=run_params["run_id"], pipelines=run_params.get("pipeline_names")
                                     or ["__default__"], loaded=chosen, sources=derived_from(pipeline, chosen))
        manifests.write(self._manifest)
        if not self._exit_handler_installed:
            on_termination(self._mark_killed)
            self._exit_handler_installed = True

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        if self._manifest is None or self._catalog is None:
            return
        dataset = _versioned(self._catalog, dataset_name)
        if dataset is not None:
            self._manifest.saved[dataset_name] = dataset.resolve_save_version() or self._manifest.run_id

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._finish("completed")

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._finish("failed")

    def _mark_killed(self) -> None:
        self._finish("killed")

    def _finish(self, status: Literal["completed", "failed", "killed"]) -> None:
        if self._manifest is None or self._manifests is None:
            return
        self._manifest.status = status
        self._manifest.finished_at = time.time()
        self._manifests.write(self._manifest)
        self._manifest = None


def made_from(pipeline: Pipeline, dataset: str) -> set[str]:
    """The datasets ``dataset`` is computed from in a run of ``pipeline``: the free inputs of the nodes upstream of
    it and what those nodes write on the way (``questions`` before ``evaluated_questions``), not what its own node
    writes beside it."""
    part = pipeline.to_outputs(dataset)
    beside = {output for node in part.nodes if dataset in node.outputs for output in node.outputs}
    return part.inputs() | (part.all_outputs() - beside)


def derived_from(pipeline: Pipeline, loaded: Collection[str]) -> dict[str, list[str]]:
    """Each dataset ``pipeline`` writes -> the datasets it is made from (:func:`made_from`) that the run loads
    (``loaded``) or writes: its lineage, where the run's other branches play no part."""
    outputs = pipeline.all_outputs()
    return {output: sorted(made_from(pipeline, output) & (set(loaded) | outputs)) for output in sorted(outputs)}


def refuse_pinned_outputs(pins: Mapping[str, str], pipeline: Pipeline) -> None:
    """Refuses a ``--load-versions`` pin on a dataset that ``pipeline`` writes: Kedro would load the pinned (another
    run's) version wherever the run reads it back, beside this run's own outputs, and the manifest would record
    neither (issue 47, bug 7)."""
    written = sorted(set(pins) & pipeline.all_outputs())
    if written:
        pinned = ", ".join(f"{name}:{pins[name]}" for name in written)
        raise RunVersionError(f"--load-versions={pinned}: {', '.join(written)} "
                              f"{'is' if len(written) == 1 else 'are'} written by this run; --load-versions pins "
                              f"inputs only (run the pipelines that read it without the one that writes it)")


OPTIONAL_ARTIFACTS: Final = "artifacts"
"""The ``**kwargs`` parameter of a node function through which the node takes optional inputs (compare's
``run_compare_rollouts``: each trained adapter and the knowledge graph)."""


def optional_inputs(pipeline: Pipeline) -> set[str]:
    """The inputs that ``pipeline``'s nodes read only as optional: those a node passes to its function's
    ``**artifacts`` (:data:`OPTIONAL_ARTIFACTS`). An input that another node of the run needs stays required (e.g.
    ``sft_adapter`` in ``kedro run --pipelines=train_rl,compare``)."""
    optional: set[str] = set()
    required: set[str] = set()
    for node in pipeline.nodes:
        through = _optional_node_inputs(node)
        optional.update(through)
        required.update(set(node.inputs) - through)
    return optional - required


def _optional_node_inputs(node: Node) -> set[str]:
    parameters = inspect.signature(node.func).parameters.values()
    if not any(parameter.kind is parameter.VAR_KEYWORD and parameter.name == OPTIONAL_ARTIFACTS
               for parameter in parameters):
        return set()
    named = [parameter for parameter in parameters if parameter.kind is not parameter.VAR_KEYWORD]
    return set(node.inputs[len(named):])  # Kedro orders dict inputs as bound: the named ones, then **artifacts


def _optional_version(catalog: DataCatalog, name: str, stored: list[str], manifests: RunManifests,
                      pins: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The version an optional input loads — its ``--load-versions`` pin, else the newest version saved by a
    completed run — or None and why there is none (the inputs are independent, so lineages are not compared)."""
    version = pins.get(name) or next((version for version in stored if manifests.usable(version)), None)
    if version is not None:
        return version, None
    if stored:
        statuses = ", ".join(f"{version} ({manifests.status(version)})" for version in stored[:3])
        reason = (f"{name}: no stored version comes from a completed run ({statuses}); re-run its pipeline, or "
                  f"choose one with --load-versions={name}:<version>")
        logger.warning("%s", reason)
    else:  # never made: the node says what it skips
        reason = missing_input_line(name, producers(name, _registered_pipeline_shapes(),
                                                    lambda dataset: _has_data(catalog, dataset)))
    return None, reason


class _WithoutReplacingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Replacing dataset '%s'"


def _replace(catalog: DataCatalog, name: str, dataset: AbstractDataset) -> None:
    """``catalog[name] = dataset`` without Kedro's "Replacing dataset" warning: the hook replaces an input by the
    version it pins on purpose, and the warning would read as a problem on every run."""
    kedro_logger = logging.getLogger(DataCatalog.__module__)  # the catalog's own logger (its class may be derived)
    quiet = _WithoutReplacingWarning()
    kedro_logger.addFilter(quiet)
    try:
        catalog[name] = dataset
    finally:
        kedro_logger.removeFilter(quiet)


def _registered_pipeline_shapes() -> list[PipelineShape]:
    """The project's registered pipelines as :class:`PipelineShape` (none outside a Kedro project)."""
    from kedro.framework.project import pipelines

    return [PipelineShape(name, frozenset(dataset for dataset in pipe.inputs()
                                          if dataset != "parameters" and not dataset.startswith("params:")),
                          frozenset(pipe.all_outputs()), len(pipe.nodes))
            for name, pipe in pipelines.items()]


def _has_data(catalog: DataCatalog, name: str) -> bool:
    """Whether ``name`` can be loaded now: a saved version of a versioned dataset, else the dataset exists."""
    if name not in catalog:
        return False
    dataset = _versioned(catalog, name)
    return bool(dataset._get_versions()) if dataset is not None else catalog.exists(name)


def _versioned(catalog: DataCatalog, name: str) -> AbstractVersionedDataset | None:
    """The versioned dataset ``name`` of the catalog, or None (parameters, memory, unversioned, unknown)."""
    if name == "parameters" or name.startswith("params:") or name not in catalog:
        return None
    dataset = catalog.get(name)
    if isinstance(dataset, AbstractVersionedDataset) and dataset._version is not None:
        return dataset
    return None
