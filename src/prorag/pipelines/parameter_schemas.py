"""Every top-level parameter key and the schema that owns it — one explicit list (a new pipeline adds a line).

The validation hook (:class:`prorag.hooks.validation.ParameterValidationHook`) checks the whole parameter tree
against it before a run; nodes annotate their ``params:<key>`` arguments with the same schemas.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from pydantic import BaseModel, create_model, model_validator

from prorag.config import PARAMETER_SCHEMAS as DECORATED_SCHEMAS
from prorag.config import ParameterError, StrictModel
from prorag.methods import KNOWLEDGE_GRAPH, compare_artifacts
from prorag.pipelines.compare.params import CompareParams
from prorag.pipelines.corpus_indexing.params import CorpusIndexingParams
from prorag.pipelines.data_preparation.params import DataPreparationParams
from prorag.pipelines.dpo.params import DPOParams
from prorag.pipelines.kg_extraction.params import KgExtractionParams
from prorag.pipelines.reasonrag_data.params import ReasonRAGDataParams
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.pipelines.rl.params import RLParams
from prorag.pipelines.rollout.params import RolloutParams
from prorag.pipelines.sft.params import SftParams
from prorag.pipelines.sft_synthesis.params import SftSynthesisParams
from prorag.pipelines.tearag.params import TeaRAGParams
from prorag.recipes import get_recipe
from prorag.rewards.base import RewardSettings
from prorag.rewards.registry import check_reward_protocol
from prorag.scale.placement import PlacementSpec
from prorag.specs import ComputeSpec, PolicySpec, RetrieverSpec, TrainedAgentSpec
from prorag.tracking import TrackingParams
from prorag.training.launch import LaunchSettings
from prorag.training.mcts import MCTSValue


class MethodStages(StrictModel):
    """A resolved method's stage blocks (the shared block with the entry's overrides and the method's retriever):
    only the stages of its recipe are set."""

    sft_synthesis: SftSynthesisParams | None = None
    sft: SftParams | None = None
    rl: RLParams | None = None
    reasonrag_data: ReasonRAGDataParams | None = None
    dpo: DPOParams | None = None
    tearag: TeaRAGParams | None = None


class MethodParams(StrictModel):
    """One resolved ``methods`` entry (:func:`prorag.methods.resolve_parameters`): every block complete."""

    recipe: str
    adapter: str
    description: str = ""
    agent: TrainedAgentSpec
    reward: dict[str, Any]
    """Validated by the settings of the reward its ``kind`` names (:class:`RewardSettings`)."""
    retriever: RetrieverSpec
    stages: MethodStages
    value: MCTSValue | None = None
    """The MCTS value function (recipes that search trees; :class:`prorag.training.mcts.MCTSValue`)."""

    @model_validator(mode="after")
    def _consistent(self) -> MethodParams:
        reward = RewardSettings.model_validate(self.reward)
        check_reward_protocol(reward, self.agent.protocol)
        missing = [stage for stage in get_recipe(self.recipe).stages if getattr(self.stages, stage, None) is None]
        if missing:
            raise ValueError(f"recipe {self.recipe!r} needs the stage block(s) {missing}")
        return self

    def reward_settings(self) -> RewardSettings:
        return RewardSettings.model_validate(self.reward)


class MethodsParams(StrictModel):
    """``methods``: one :class:`MethodParams` per method name (``schema_for`` builds the model with a field per
    name, so an error names ``methods.<name>.<key>``)."""

    NAME_PATTERN: ClassVar[str] = r"^[a-z][a-z0-9_]*$"

    @classmethod
    def schema_for(cls, values: Any) -> type[BaseModel]:
        names = list(values) if isinstance(values, Mapping) else []
        bad = [name for name in names if not re.match(cls.NAME_PATTERN, str(name))]
        if bad:
            raise ValueError(f"method names must be lower-case identifiers (train_<name> pipelines), got {bad}")
        return create_model("Methods", __base__=StrictModel, **{name: (MethodParams, ...) for name in names})

PARAMETER_SCHEMAS: Final[dict[str, type[BaseModel]]] = {
    # shared specs (conf/base/parameters.yml): read by several pipelines, declared once
    "compute": ComputeSpec,  # dtype and use_cpu, fanned out into every model / trainer block by the resolver
    "policy": PolicySpec,
    "agent": TrainedAgentSpec,
    "reward": RewardSettings,  # validated by the settings of the reward its `kind` names
    "retriever": RetrieverSpec,
    "methods": MethodsParams,  # conf/base/parameters_methods.yml: one entry per method, resolved over the above
    "tracking": TrackingParams,
    "placement": PlacementSpec,  # GPUs and ports of a one-node GPU run (conf/gpu); absent on CPU
    "launch": LaunchSettings,  # conf/base/parameters_launch.yml: how every training node runs its trainer
    # one per pipeline (conf/base/parameters_<pipeline>.yml)
    "data_preparation": DataPreparationParams,
    "corpus_indexing": CorpusIndexingParams,
    "rollout": RolloutParams,
    "reward_judging": RewardJudgingParams,
    "sft_synthesis": SftSynthesisParams,
    "sft": SftParams,
    "rl": RLParams,
    "kg_extraction": KgExtractionParams,
    "reasonrag_data": ReasonRAGDataParams,
    "dpo": DPOParams,
    "tearag": TeaRAGParams,
    "compare": CompareParams,
}


def all_parameter_schemas() -> dict[str, type[BaseModel]]:
    """:data:`PARAMETER_SCHEMAS` plus any schema registered with ``@register_parameters``; a key owned twice is an
    error."""
    shared = sorted(key for key, schema in DECORATED_SCHEMAS.items()
                    if key in PARAMETER_SCHEMAS and PARAMETER_SCHEMAS[key] is not schema)
    if shared:
        raise ValueError(f"parameter key(s) {shared} are owned by two schemas")
    return {**DECORATED_SCHEMAS, **PARAMETER_SCHEMAS}


def check_method_references(parameters: Mapping[str, Any], catalog: Mapping[str, Any],
                            registered: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """What the schemas cannot see: every ``compare`` arm names a ``methods`` entry that exists, every adapter a
    method names is a catalog dataset, every adapter an arm names is an input of ``compare`` (an adapter of the
    methods map, :func:`prorag.methods.compare_artifacts`), and (given the methods the
    pipeline registry built ``train_<method>`` from) the run's env declares the same methods with the same recipes
    and adapters."""
    methods = dict(parameters.get("methods") or {})
    artifacts = set(compare_artifacts(methods)) - {KNOWLEDGE_GRAPH}
    problems = []
    for name, method in methods.items():
        adapter = method.get("adapter")
        if adapter not in catalog:
            problems.append(f"methods.{name}.adapter: {adapter!r} is not a catalog dataset (conf/base/catalog.yml)")
    for index, arm in enumerate((parameters.get("compare") or {}).get("arms") or []):
        method = arm.get("method")
        if isinstance(method, str) and method not in methods:
            close = difflib.get_close_matches(method, list(methods), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"compare.arms[{index}] ({arm.get('name')}): method {method!r} is not a methods "
                            f"entry{hint} (known: {', '.join(sorted(methods))})")
        adapter = arm.get("adapter")
        if adapter is not None and adapter not in artifacts:
            problems.append(f"compare.arms[{index}] ({arm.get('name')}): adapter {adapter!r} is not an adapter of "
                            f"the methods map, which compare takes ({', '.join(sorted(artifacts))})")
    if registered is not None:
        for name in sorted(set(methods) | set(registered)):
            declared, built = methods.get(name), registered.get(name)
            if declared is None or built is None:
                where = "conf/base or conf/local" if declared is not None else "this env"
                problems.append(f"methods.{name}: declared in {where} only; methods are added in conf/base (or "
                                "conf/local), where train_<method> pipelines are built from; an env changes their "
                                "settings")
            elif (declared["recipe"], declared["adapter"]) != (built["recipe"], built["adapter"]):
                problems.append(f"methods.{name}: recipe/adapter {declared['recipe']}/{declared['adapter']} differ "
                                f"from {built['recipe']}/{built['adapter']}, which train_{name} was built with "
                                "(conf/base or conf/local); change them there")
    if problems:
        raise ParameterError("invalid parameters:\n  " + "\n  ".join(problems))
