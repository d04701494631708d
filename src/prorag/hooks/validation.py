"""The parameter validation hook: every parameter key and type is checked against the pipelines' schema list (and
the methods' references) before any node runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.config import MissingConfigException
from kedro.framework.context import KedroContext
from kedro.framework.hooks import hook_impl
from kedro.io import DataCatalog
from kedro.pipeline import Pipeline

from prorag.config import validate_parameters
from prorag.config_loader import configured_methods
from prorag.hooks.support import catalog_parameters


class ParameterValidationHook:
    """Fails a run before any node runs when a parameter key is unknown or a value has the wrong type.

    It validates as soon as the context exists, before Kedro's own typed-parameter check (which runs when the
    catalog is built and reports a bare pydantic error), so that a mistyped key gets :func:`validate_parameters`'
    message with the closest valid key; and again before the pipeline runs (hooks driven without a context).
    """

    @hook_impl(tryfirst=True)
    def after_context_created(self, context: KedroContext) -> None:
        from prorag.pipelines.parameter_schemas import (  # the one explicit list
            all_parameter_schemas,
            check_method_references,
        )

        try:
            parameters = context.config_loader["parameters"]  # raw, runtime parameters merged; not context.params
        except MissingConfigException:
            return
        # the shared blocks first: a method entry merges them, so a typo there would be reported again per method
        validate_parameters({key: value for key, value in parameters.items() if key != "methods"},
                            all_parameter_schemas())
        validate_parameters(parameters, all_parameter_schemas())
        try:
            catalog = context.config_loader["catalog"]
        except MissingConfigException:
            catalog = {}
        registered = configured_methods(Path(context.project_path)) if "methods" in parameters else None
        check_method_references(parameters, catalog, registered)

    @hook_impl(tryfirst=True)  # before the tracking hook opens an MLflow run for a run that cannot start
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Pipeline,
                            catalog: DataCatalog) -> None:
        from prorag.pipelines.parameter_schemas import all_parameter_schemas  # the one explicit list

        validate_parameters(catalog_parameters(catalog), all_parameter_schemas())
