"""A recipe: the stages a method trains with, composed into its ``train_<method>`` pipeline.

A :class:`Recipe` declares the parameter blocks its stages read (``stages``: each becomes
``methods.<name>.stages.<stage>``), the adapters it trains besides the method's ``adapter`` that ``compare``
evaluates, and ``build``: the composition, from the registered stage pipelines
(:class:`prorag.recipes.stages.StagePipelines`), the method's name and its resolved entry. The pipeline registry
maps the method's parameters in (:func:`prorag.pipeline_registry.for_method`). A method with its own loop is one
module defining a ``Recipe`` and one conf entry naming it (``recipe: my_package.recipes:MY_RECIPE``), or that
module and a line in :data:`prorag.recipes.registry._BUILTIN`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kedro.pipeline import Pipeline

    from prorag.recipes.stages import StagePipelines

Build = Callable[["StagePipelines", str, Mapping[str, Any]], "Pipeline"]
"""``build(stages, name, method)``: method ``name``'s training pipeline from its resolved entry ``method``."""


@dataclass(frozen=True)
class Recipe:
    """A registered composition of stages (module docstring)."""

    stages: tuple[str, ...]
    """The parameter blocks its stages read (besides ``agent``, ``reward``, ``retriever``, ``value`` and
    ``policy``): an entry's ``stages`` may override these, and only these."""
    build: Build
    adapters: tuple[str, ...] = ()
    """Adapters it trains besides its method's ``adapter`` that ``compare`` evaluates (HiPRAG's SFT stage)."""
    description: str = ""
