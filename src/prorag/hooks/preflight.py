"""The GPU preflight hook: a GPU run that cannot work is refused before any node runs (and before MLflow opens a
run (:func:`prorag.scale.preflight.preflight`)."""

from __future__ import annotations

from typing import Any

from kedro.framework.hooks import hook_impl
from kedro.io import DataCatalog
from kedro.pipeline import Pipeline

from prorag.hooks.support import catalog_parameters


class GpuPreflightHook:
    """Refuses, before any node (and before MLflow opens a run), a GPU run that cannot work: colliding GPUs or
    ports, a trainer process that would see several GPUs (it is given ``placement.trainer_gpu`` when CUDA is not
    initialised yet), a process that cannot fit its GPU (:func:`prorag.scale.preflight.preflight`). Runs after
    :class:`ParameterValidationHook` (both ``tryfirst``; registered before it in ``settings.HOOKS``)."""

    @hook_impl(tryfirst=True)
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline, catalog: DataCatalog) -> None:
        from prorag.methods import trainer_blocks
        from prorag.scale.preflight import preflight

        parameters = catalog_parameters(catalog)
        preflight(parameters, trainer_blocks(parameters))
