"""A method is one entry of the ``methods`` map (conf/base/parameters_methods.yml).

An entry names its training ``recipe`` (the stages it runs), the ``adapter`` dataset its trained policy is saved
to, and only what differs from the settings every method shares:

- ``agent`` — merged over the shared ``agent`` block (protocol, budgets);
- ``reward`` — merged over the shared ``reward`` block; when the entry names another ``kind``, only the keys that
  kind's settings take are inherited (the detection settings, for one);
- ``retriever`` — merged over the shared ``retriever`` block;
- ``stages`` — per stage of the recipe, keys merged over that stage's shared block (``rl``, ``sft``, …);
- ``value`` — for a recipe that searches trees (MCTS), the value function they are searched for and its pairs
  ranked by (:class:`prorag.training.mcts.MCTSValue`: SPRE or eq. 6's judgment); the ``reward`` is then the
  yardstick its rollouts are judged with.

:func:`resolve_parameters` turns the map into complete entries (the project's config loader calls it, so
``params:methods.<name>.agent`` and ``params:methods.<name>.stages.rl`` are complete blocks) and gives every
stage block the retriever of the method that runs it: the shared retriever is declared once, and an evaluated
arm and its training cannot use different retrievers unless the entry says so.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from pydantic import Field, field_validator

from prorag.config import ParameterError, StrictModel
from prorag.plugins import PluginError
from prorag.recipes import UnknownRecipeError, get_recipe, recipe_names

if TYPE_CHECKING:
    from prorag.training.launch import Stage

VALUE_STAGE: Final = "reasonrag_data"
"""The stage that searches trees for its method's ``value`` (MCTS)."""

SHARED_BLOCKS: Final = ("agent", "reward", "retriever")
MODEL_BLOCKS: Final = ("policy", "kg_extraction.extractor")
"""The blocks besides the trainers that hold a model, and take ``compute.dtype``."""
RETRIEVER_BLOCKS: Final = ("rollout", "sft_synthesis", "rl", "reasonrag_data", "compare", "tearag")
"""Stage blocks that retrieve: a block that sets no ``retriever`` gets the shared one (standalone runs) or its
method's (``stages`` of a resolved entry)."""

KNOWLEDGE_GRAPH: Final = "knowledge_graph"
"""The dataset the ``kag`` retrievers need (``kedro run --pipelines=kg_extraction``)."""

EVALUATION_SAMPLING: Final[dict[str, str]] = {"tearag": "evaluation_sampling"}
"""Blocks that evaluate with the rollout's sampling (``rollout.temperature``, ``top_p``, ``seed``), as ``compare``
does, unless they set their own."""

def trainer_blocks(parameters: Mapping[str, Any] | None = None) -> dict[str, Stage]:
    """Every trainer block, as a dotted path from a stage block (``tearag.ip_dpo.trainer``), with the algorithm it
    trains: those of the built-in recipes and of every recipe the ``methods`` of ``parameters`` name
    (:attr:`~prorag.recipes.Recipe.trainers`). What the config loader fans ``compute`` into and what the GPU
    preflight estimates."""
    methods = (parameters or {}).get("methods") or {}
    named = [method.get("recipe") for method in methods.values() if isinstance(method, Mapping)]
    blocks: dict[str, Stage] = {}
    for recipe in dict.fromkeys([*recipe_names(), *(name for name in named if isinstance(name, str))]):
        try:
            blocks.update(get_recipe(recipe).trainers)
        except (UnknownRecipeError, PluginError):
            continue  # the entry's validation names it (MethodEntry)
    return blocks


def compute_blocks(parameters: Mapping[str, Any] | None = None) -> dict[str, tuple[str, ...]]:
    """Where each key of the shared ``compute`` block is written: ``dtype`` into :data:`MODEL_BLOCKS` and every
    trainer block (:func:`trainer_blocks`), ``use_cpu`` into every trainer block. A block that sets the key keeps
    its own value."""
    trainers = tuple(trainer_blocks(parameters))
    return {"dtype": (*MODEL_BLOCKS, *trainers), "use_cpu": trainers}


def stage_owners(methods: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each stage of a recipe's own loop (:attr:`~prorag.recipes.Recipe.own_stages`) -> the first method of
    ``methods`` whose recipe it is: the method its pipeline run alone trains."""
    owners: dict[str, str] = {}
    for name, method in methods.items():
        if isinstance(method, Mapping) and method.get("recipe"):
            for stage in get_recipe(method["recipe"]).own_stages:
                owners.setdefault(stage, name)
    return owners


class MethodEntry(StrictModel):
    """One entry of ``methods`` as written in conf: the recipe, the adapter, and overrides of shared settings."""

    recipe: str
    """A built-in recipe (:func:`prorag.recipes.recipe_names`) or a dotted path to a :class:`~prorag.recipes.Recipe`."""
    adapter: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_]+$")
    """The catalog dataset the method's trained policy is saved as (an input of ``compare``)."""
    description: str = ""
    agent: dict[str, Any] = Field(default_factory=dict)
    reward: dict[str, Any] = Field(default_factory=dict)
    retriever: dict[str, Any] = Field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = Field(default_factory=dict)
    value: dict[str, Any] | None = None
    """The MCTS value function (recipes with a :data:`VALUE_STAGE`); None for other recipes."""

    @field_validator("recipe")
    @classmethod
    def _known(cls, recipe: str) -> str:
        get_recipe(recipe)
        return recipe

    def check_stages(self, name: str) -> None:
        stages = get_recipe(self.recipe).stages
        extra = sorted(set(self.stages) - set(stages))
        if extra:
            raise ValueError(f"methods.{name}.stages: {extra} are not stages of recipe {self.recipe!r} "
                             f"({', '.join(stages)})")
        if self.value is not None and VALUE_STAGE not in stages:
            raise ValueError(f"methods.{name}.value: recipe {self.recipe!r} searches no tree (a value function is "
                             f"for recipes with a {VALUE_STAGE} stage); its training signal is the entry's reward")


def compare_artifacts(methods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The trained datasets ``compare`` takes as inputs, one per adapter of the ``methods`` map (each method's
    ``adapter``, and its recipe's other :attr:`~prorag.recipes.Recipe.adapters`) and the knowledge graph: each is
    optional there (an arm whose adapter has no usable version is skipped, naming why)."""
    names = [*(method.get("adapter") for method in methods.values()),
             *(extra for method in methods.values() if method.get("recipe")
               for extra in get_recipe(method["recipe"]).adapters),
             KNOWLEDGE_GRAPH]
    return list(dict.fromkeys(name for name in names if name))


def merge(base: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict[str, Any]:
    """``override`` merged key by key over ``base`` (nested mappings merged, everything else replaced)."""
    merged = copy.deepcopy(dict(base or {}))
    for key, value in (override or {}).items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``parameters`` with every ``methods`` entry complete and every retrieving block given its retriever.

    Raw entries are validated by :class:`MethodEntry` (an error names ``methods.<name>``); the complete blocks are
    validated by their own schemas afterwards (the validation hook). Parameters without a ``methods`` map are
    returned with only the shared retriever filled in."""
    resolved = copy.deepcopy(dict(parameters))
    resolved = _with_rollout_sampling(_with_compute(resolved, resolved.get("compute"), compute_blocks(resolved)))
    shared_retriever = resolved.get("retriever")
    methods: dict[str, Any] = {}
    for name, raw in (resolved.get("methods") or {}).items():
        try:
            entry = MethodEntry.model_validate(raw or {})
            entry.check_stages(name)
        except ValueError as error:
            raise ParameterError(f"invalid parameters: methods.{name}: {error}") from None
        methods[name] = _resolve_entry(entry, resolved)
    if "methods" in resolved:
        resolved["methods"] = methods
    for block, owner in stage_owners(methods).items():
        if isinstance(resolved.get(block), Mapping):
            resolved[block] = _with_method(block, resolved[block], methods[owner])
    for block in RETRIEVER_BLOCKS:
        values = resolved.get(block)
        if isinstance(values, Mapping) and values.get("retriever") is None and shared_retriever is not None:
            resolved[block] = {**values, "retriever": _retriever_for(block, shared_retriever)}
    return resolved


def _with_compute(blocks: dict[str, Any], compute: Any, targets: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """``blocks`` with the shared ``compute`` keys written into ``targets`` (:func:`compute_blocks`): the
    top-level blocks before the methods are resolved, so that each method's stage blocks inherit them, and a
    method's stages again for blocks only its entry has. Only blocks whose top-level block exists are written; a
    missing nested block (``rl.trainer``) is created."""
    if not isinstance(compute, Mapping):
        return blocks
    for key, paths in targets.items():
        if key not in compute:
            continue
        for path in paths:
            top, *inner = path.split(".")
            block = blocks.get(top)
            if not isinstance(block, Mapping):
                continue
            block = blocks[top] = dict(block)
            for part in inner:
                child = block.get(part)
                block[part] = dict(child) if isinstance(child, Mapping) else {}
                block = block[part]
            block.setdefault(key, copy.deepcopy(compute[key]))
    return blocks


def _resolve_entry(entry: MethodEntry, parameters: Mapping[str, Any]) -> dict[str, Any]:
    reward = merge(_inheritable_reward(parameters.get("reward") or {}, entry.reward.get("kind")), entry.reward)
    method = {
        "recipe": entry.recipe,
        "adapter": entry.adapter,
        "description": entry.description,
        "agent": merge(parameters.get("agent"), entry.agent),
        "reward": reward,
        "retriever": merge(parameters.get("retriever"), entry.retriever),
    }
    stages = get_recipe(entry.recipe).stages
    if VALUE_STAGE in stages:
        method["value"] = dict(entry.value or {})
    method["stages"] = {stage: _with_method(stage, merge(parameters.get(stage), entry.stages.get(stage)), method,
                                            explicit=entry.stages.get(stage) or {})
                        for stage in stages}
    trainers = tuple(get_recipe(entry.recipe).trainers)
    _with_compute(method["stages"], parameters.get("compute"), {"dtype": trainers, "use_cpu": trainers})
    return method


def _with_method(block: str, values: Mapping[str, Any], method: Mapping[str, Any],
                 explicit: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A stage block with its method's retriever (and agent, for blocks that carry one), unless the entry's own
    stage override sets them."""
    explicit = explicit or {}
    values = dict(values)
    if block in RETRIEVER_BLOCKS and "retriever" not in explicit:
        values["retriever"] = _retriever_for(block, method["retriever"])
    if block in get_recipe(method["recipe"]).agent_stages and "agent" not in explicit:
        values["agent"] = copy.deepcopy(method["agent"])
    return values


def _with_rollout_sampling(parameters: dict[str, Any]) -> dict[str, Any]:
    """:data:`EVALUATION_SAMPLING` blocks given the rollout's sampling where they set none."""
    rollout = parameters.get("rollout")
    if not isinstance(rollout, Mapping):
        return parameters
    sampling = {key: copy.deepcopy(rollout[key]) for key in ("temperature", "top_p", "seed") if key in rollout}
    for block, key in EVALUATION_SAMPLING.items():
        values = parameters.get(block)
        if isinstance(values, Mapping) and values.get(key) is None:
            parameters[block] = {**values, key: sampling}
    return parameters


def _retriever_for(block: str, retriever: Mapping[str, Any]) -> dict[str, Any]:
    # TeaRAG's retriever is built over the in-process index and its graph (no retrieval_url)
    if block == "tearag":
        return {key: value for key, value in retriever.items() if key in ("kind", "top_k")}
    return copy.deepcopy(dict(retriever))


def _inheritable_reward(shared: Mapping[str, Any], kind: str | None) -> dict[str, Any]:
    """The shared reward's keys that a reward of ``kind`` takes (all of them for the same kind)."""
    if kind is None or kind == shared.get("kind"):
        return dict(shared)
    from prorag.rewards.base import reward_class  # deferred: rewards import the judges and the engine

    fields = set(reward_class(kind).Settings.model_fields)
    return {key: value for key, value in shared.items() if key in fields and key != "kind"}
