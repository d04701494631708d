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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kedro.pipeline import Pipeline

    from prorag.recipes.stages import StagePipelines
    from prorag.training.launch import Stage

Build = Callable[["StagePipelines", str, Mapping[str, Any]], "Pipeline"]
"""``build(stages, name, method)``: method ``name``'s training pipeline from its resolved entry ``method``."""
Standalone = Callable[[str, Mapping[str, Any]], "Mapping[str, Pipeline]"]
"""``standalone(name, method)``: the recipe's own versions of its :attr:`Recipe.own_stages` pipelines for method
``name`` run alone (a stage it returns nothing for stays the registered one)."""


def _registered(name: str, method: Mapping[str, Any]) -> Mapping[str, Pipeline]:
    return {}


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
    own_stages: tuple[str, ...] = ()
    """Stages of its own loop, registered as pipelines of the same name (``reasonrag_data``, ``tearag``): run
    alone, such a pipeline trains the first method of the ``methods`` map with this recipe, with that method's
    parameters (its top-level block is resolved with the method's retriever, and agent: :attr:`agent_stages`)."""
    agent_stages: tuple[str, ...] = ()
    """Stage blocks that carry the agent they train (TeaRAG's ``tearag``): the method's ``agent``, unless the
    entry's own stage override sets one."""
    standalone: Standalone = _registered
    """The own stages' pipelines as this recipe runs them alone (:data:`Standalone`; ReasonRAG's cold start)."""
    trainers: Mapping[str, Stage] = field(default_factory=dict)
    """Its stages' trainer blocks, as dotted paths from a stage block (``tearag.ip_dpo.trainer``), each with the
    algorithm it trains (``sft``, ``dpo``, ``grpo``): the shared ``compute`` keys are written into them
    (:func:`prorag.methods.compute_blocks`) and the GPU preflight estimates their memory
    (:func:`prorag.scale.preflight.trainer_loads`)."""
