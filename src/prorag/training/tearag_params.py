"""The ``tearag`` parameter block (conf/base/parameters_tearag.yml): the TeaRAG agent, its retriever, SFT data,
IP-DPO. In the library because two pipelines read it (tearag, and compare for the agent and retriever);
:mod:`prorag.pipelines.tearag.params` re-exports it.

The policy is the shared ``policy`` block; the KG extractor, its cache and the KAG settings are the
``kg_extraction`` block's (the SFT data's triplets come from the same extraction as the knowledge graph).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import Field, model_validator

from prorag.config import StrictModel
from prorag.specs import PositiveInt, SamplingSpec, Seed, TrainedAgentSpec
from prorag.training.config import SFTSettings
from prorag.training.dpo import DPOTrainingConfig

MOVED_REWARD_KEYS: Final = ("similarity", "normalization", "weight_consistency", "weight_subquery", "weight_context",
                             "weight_summary")
"""Keys ``tearag.ip_dpo`` once had: the knowledge-matching reward's settings, now only the method's ``reward``."""


class TeaRAGAgent(TrainedAgentSpec):
    """The TeaRAG agent that SFT and IP-DPO train and that the evaluation rolls out."""

    protocol: str = "tearag"
    name: str = Field(default="tearag_agent", min_length=1)
    step_budget: PositiveInt = 4
    max_new_tokens_per_turn: PositiveInt = 96
    max_total_new_tokens: PositiveInt = 384


class TeaRAGRetriever(StrictModel):
    """The retriever of the agent: ``kag`` (KAG + PPR, the paper's), ``kag_concat`` (TeaRAG-Con) or ``dense``."""

    kind: Literal["kag", "kag_concat", "dense"] = "kag"
    top_k: PositiveInt = 5


class SftDataParams(StrictModel):
    """§4.3.1 SFT data (:class:`prorag.training.tearag_sft.SFTDataSettings`)."""

    sources: list[str] = Field(default=["musique_train"], min_length=1)
    max_questions: PositiveInt | None = None
    """The first N records of the sources (null: all)."""
    extra_triplets: int = Field(default=2, ge=0)
    distractors: int = Field(default=0, ge=0)
    single_hop_steps: bool = False
    max_supporting: PositiveInt = 2
    seed: Seed = 0


class QuestionMixParams(StrictModel):
    """§4.3.2 sampling set (per group); the evaluation questions are always excluded."""

    nq: int = Field(default=4000, ge=0)
    hotpotqa_bridge: int = Field(default=2500, ge=0)
    hotpotqa_comparison: int = Field(default=2500, ge=0)
    musique: int = Field(default=1000, ge=0)
    nq_sources: list[str] = Field(default=["nq"], min_length=1)
    hotpotqa_sources: list[str] = Field(default=["hotpotqa"], min_length=1)
    musique_sources: list[str] = Field(default=["musique_train"], min_length=1)


class IPDPOParams(StrictModel):
    """§4.3.2 IP-DPO: rounds, sampling, pair rules and the DPO + SFT loss (eqs. 14–17). The reward its samples
    are scored with is the method's ``reward`` (``knowledge_matching``), not a setting of this block."""

    rounds: PositiveInt = 3
    samples_per_question: int = Field(default=8, ge=2)
    sampling: SamplingSpec = SamplingSpec(temperature=1.0)
    min_outcome: float = Field(default=0.8, ge=0)
    min_process: float = Field(default=0.5, ge=0)
    easy_max_f1: float = Field(default=0.0, ge=0)
    trainer: DPOTrainingConfig = DPOTrainingConfig(beta=0.1, sft_weight=1.0, append_eos=True)
    """The DPO + SFT trainer (:mod:`prorag.training.dpo`): ``beta`` is β of eq. 15, ``sft_weight`` α of eq. 17;
    ``init_adapter`` is set by each round (the previous round's adapter)."""

    @model_validator(mode="before")
    @classmethod
    def _reward_moved(cls, values: Any) -> Any:
        moved = sorted(set(values) & set(MOVED_REWARD_KEYS)) if isinstance(values, Mapping) else []
        if moved:
            raise ValueError(f"tearag.ip_dpo.{moved[0]} moved: IP-DPO trains with its method's reward, the one "
                             f"judging scores with; set methods.<name>.reward.{moved[0]} (methods.tearag.reward "
                             "in conf/base/parameters_methods.yml)")
        return values


class TeaRAGParams(StrictModel):
    """``tearag`` parameters."""

    agent: TeaRAGAgent = TeaRAGAgent()
    retriever: TeaRAGRetriever = TeaRAGRetriever()
    sft_data: SftDataParams = SftDataParams()
    sft: SFTSettings = SFTSettings()
    questions: QuestionMixParams = QuestionMixParams()
    ip_dpo: IPDPOParams = IPDPOParams()
    evaluate_base: bool = True
    """Also roll out the untrained policy with the TeaRAG protocol (few-shot prompt) as the base row."""
    evaluation_sampling: SamplingSpec = SamplingSpec()
