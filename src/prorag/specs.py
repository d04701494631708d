"""Typed specs of the settings that several pipelines read — declared once, imported everywhere, never copied.

* :class:`ComputeSpec` — the dtype and device every model block shares (top-level ``compute``);
* :class:`PolicySpec` — the policy model and where it runs (top-level ``policy`` parameters);
* :class:`RetrieverSpec` — which retriever over the index (or a retrieval server), and how many passages;
* :class:`JudgeSpec` — one over- or under-search judge;
* the reward entry (top-level ``reward``: read by RL *and* by reward judging, so training and evaluation measure
  the same thing) is validated by its registered reward's own settings (:mod:`prorag.rewards.registry`);
* :class:`AgentSpec` — the agent that SFT and RL train: protocol and budgets (top-level ``agent``: read by SFT,
  RL and the trained-policy rollouts);
* :class:`MethodSpec` — one method evaluated side by side (a baseline or an agent); :class:`MethodSettings` is
  the same without its name.

A protocol is a ``str`` checked by :func:`prorag.protocol.registry.adapter_factory`, so a protocol registered by a
user, or named by its adapter's dotted path (``my_package.protocols:MyAdapter``), is accepted without editing this
module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from prorag.config import Dtype, MixedPrecision, PositiveInt, Seed, StrictModel
from prorag.llm.registry import BUNDLED_SMOLLM2
from prorag.llm.served import TrainedServerSpec
from prorag.protocol.registry import adapter_factory

RetrieverKind = Literal["dense", "bm25", "hybrid", "kag", "kag_concat"]
"""Retrievers over a :class:`~prorag.retrieval.RetrievalIndex`; a new retriever adds its name here."""
MethodKind = Literal["direct", "standard_rag", "agent"]

DEFAULT_JUDGE_CACHE: Final = "data/02_intermediate/judge_cache.sqlite"


def _known_protocol(name: str) -> str:
    adapter_factory(name)  # an unknown name or a dotted path that does not import: an error saying which
    return name


class ComputeSpec(StrictModel):
    """``compute``: how every model is held and where the trainers run, declared once per env.
    :func:`prorag.methods.resolve_parameters` writes ``dtype`` into every block that loads a model and ``use_cpu``
    into every trainer block (:func:`prorag.methods.compute_blocks`) that does not set its own."""

    dtype: Dtype = "float32"
    """The weights' dtype of the policy, the KG extractor and every trainer."""
    use_cpu: bool = True
    """Every trainer on the CPU (false: one CUDA device, ``placement.trainer_gpu``)."""


class PolicySpec(StrictModel):
    """The policy: a registry spec, an optional LoRA adapter, and where it runs."""

    model: str = Field(default=BUNDLED_SMOLLM2, min_length=1)
    """Registry spec (``bundled:...``), Hugging Face name or local folder; SFT and RL train this model."""
    adapter: str | None = None
    backend: Literal["transformers", "openai"] = "transformers"
    base_url: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    """The NAME of the environment variable holding the key (backend openai); null: a keyless local server."""
    dtype: Dtype = "float32"
    mixed_precision: MixedPrecision = "no"
    """transformers backend: ``bf16`` runs the linear layers and attention in bf16 under autocast over ``dtype``'s
    weights (stored in bf16 once), the residual stream and norms as ``dtype``: SFT's forward under
    ``sft.mixed_precision: bf16``, except that a merged adapter's update is rounded into the bf16 weights
    (:mod:`prorag.llm.precision`)."""
    batch_size: PositiveInt = 8
    draft_tokens: int = Field(default=3, ge=0)
    """transformers backend: prompt-lookup ids each greedy decoding step verifies per row (0: one token a step); the
    output is the greedy one either way
    (:meth:`prorag.llm.transformers_backend.TransformersGenerator._decode_greedy`)."""
    device: str = "cpu"
    """transformers backend: the torch device of the in-process model (``cuda`` on a GPU)."""
    trained_server: TrainedServerSpec | None = None
    """backend openai: where a full-parameter trained model is served by name (:mod:`prorag.llm.served`); LoRA
    adapters are loaded into the ``base_url`` server instead."""

    @property
    def label(self) -> str:
        """A short name for progress bars and logs: the model (``smollm2-135m-instruct``) and, when there is one,
        the adapter as ``<dataset>@<version>`` (``+sft_adapter@2026-…``)."""
        model = Path(self.model.removeprefix("bundled:")).name or self.model
        if not self.adapter:
            return model
        adapter = Path(self.adapter)
        versioned = adapter.parent.parent.name == adapter.name  # data/06_models/<name>/<version>/<name>
        return f"{model}+{adapter.name}@{adapter.parent.name}" if versioned else f"{model}+{adapter.name}"

    def with_trained(self, folder: str) -> PolicySpec:
        """This policy after training: ``folder`` is a PEFT adapter (merged into ``model``) or, from full-parameter
        training, a model folder that replaces ``model``."""
        if (Path(folder) / "adapter_config.json").is_file():
            return self.model_copy(update={"adapter": folder})
        return self.model_copy(update={"model": folder, "adapter": None})


class RetrieverSpec(StrictModel):
    """A retriever over the built index (``kind``), or a retrieval server (``retrieval_url``), returning ``top_k``."""

    kind: RetrieverKind = "dense"
    retrieval_url: str | None = Field(default=None, pattern=r"^https?://")
    top_k: PositiveInt = 3


class TokenPrice(StrictModel):
    """A judge model's price in USD per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


class JudgeSpec(StrictModel):
    """One judge: ``reference`` (deterministic, no model) or ``llm`` (any OpenAI-compatible endpoint)."""

    kind: Literal["reference", "llm"] = "reference"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    """The NAME of the environment variable holding the key; null: a keyless local server."""
    cache_path: str | None = DEFAULT_JUDGE_CACHE
    max_concurrency: PositiveInt = 32
    timeout: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    temperature: float | None = Field(default=0.0, ge=0)
    requests_per_minute: float | None = Field(default=None, gt=0)
    """One limiter per endpoint, shared by every judge and process of the node (:mod:`prorag.judges.limits`)."""
    max_unknown_rate: float | None = Field(default=None, ge=0, le=1)
    """Stop the run when a batch has more unknown verdicts than this share (fail closed); None: never."""
    budget_usd: float | None = Field(default=None, gt=0)
    """Stop judging once the endpoint's estimated spend reaches it (needs ``price_per_million_tokens``)."""
    price_per_million_tokens: TokenPrice | None = None
    """USD per million input and output tokens, for the cost in MLflow and the budget."""
    f1_threshold: float = Field(default=0.8, gt=0, le=1)
    grounding_threshold: float = Field(default=0.6, gt=0, le=1)
    top_k: PositiveInt = 5
    equivalence: Literal["f1", "content"] = "f1"
    """Reference judge: ``content`` also counts a statement whose content words the other contains as equivalent
    (a one-word answer vs a sentence stating it; :class:`~prorag.judges.reference.ReferenceJudge`)."""

    @model_validator(mode="after")
    def _budget_has_a_price(self) -> JudgeSpec:
        if self.budget_usd is not None and self.price_per_million_tokens is None:
            raise ValueError("budget_usd needs price_per_million_tokens (the spend is estimated from the usage)")
        return self


class AgentSpec(StrictModel):
    """An agent: a protocol (by registered name) and its budgets."""

    protocol: str = "hiprag"
    few_shot: bool = True
    """Include the prompt's few-shot examples where the protocol has them; false for a policy after SFT."""
    open_next_step: bool = False
    step_budget: PositiveInt = 4
    max_new_tokens_per_turn: PositiveInt = 256
    max_total_new_tokens: PositiveInt = 1024

    @field_validator("protocol")
    @classmethod
    def _registered_protocol(cls, name: str) -> str:
        return _known_protocol(name)

    def protocol_options(self) -> dict[str, bool]:
        """The options this agent's adapter is built with (:func:`~prorag.protocol.registry.build_adapter` passes
        each one only to a protocol that takes it)."""
        return {"open_next_step": self.open_next_step, "few_shot": self.few_shot}


class TrainedAgentSpec(AgentSpec):
    """The agent that SFT and RL train, and that the trained-policy rollouts evaluate (``<name>_sft``/``_rl``)."""

    name: str = Field(default="hiprag_agent", min_length=1)
    few_shot: bool = False
    """Train and roll out with the protocol's prompt alone (the few-shot examples are redundant after SFT)."""


class MethodSettings(AgentSpec):
    """What a method runs, without its name: a non-agentic baseline or the agent with a protocol."""

    kind: MethodKind
    max_new_tokens: PositiveInt = 64
    """Baselines only: the answer's token budget."""


class MethodSpec(MethodSettings):
    """One method evaluated side by side, by name."""

    name: str = Field(min_length=1)


class SamplingSpec(StrictModel):
    """How the policy samples during rollouts."""

    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: Seed = 0
