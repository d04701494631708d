"""Every top-level parameter key and the schema that owns it — one explicit list (a new pipeline adds a line).

The validation hook (:class:`prorag.hooks.ParameterValidationHook`) checks the whole parameter tree against it
before a run; nodes annotate their ``params:<key>`` arguments with the same schemas.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel

from prorag.config import PARAMETER_SCHEMAS as DECORATED_SCHEMAS
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
from prorag.rewards.base import RewardSettings
from prorag.scale.placement import PlacementSpec
from prorag.specs import PolicySpec, TrainedAgentSpec
from prorag.tracking import TrackingParams

PARAMETER_SCHEMAS: Final[dict[str, type[BaseModel]]] = {
    # shared specs (conf/base/parameters.yml): read by several pipelines, declared once
    "policy": PolicySpec,
    "agent": TrainedAgentSpec,
    "reward": RewardSettings,  # validated by the settings of the reward its `kind` names
    "tracking": TrackingParams,
    "placement": PlacementSpec,  # GPUs and ports of a one-node GPU run (conf/gpu); absent on CPU
    # one per pipeline (conf/base/parameters_<pipeline>.yml)
    "data_preparation": DataPreparationParams,
    "corpus_indexing": CorpusIndexingParams,
    "rollout": RolloutParams,
    "reward_judging": RewardJudgingParams,
    "sft_synthesis": SftSynthesisParams,
    "sft": SftParams,
    "rl": RLParams,
    "search_r1_reward": RewardSettings,  # train_search_r1: the rl pipeline with the Search-R1 reward (λp = 0)
    "kg_extraction": KgExtractionParams,
    "reasonrag_data": ReasonRAGDataParams,
    "reasonrag_agent": TrainedAgentSpec,  # the ReasonRAG agent: MCTS prompt, DPO policy rollouts
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
