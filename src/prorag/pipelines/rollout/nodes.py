"""Nodes of the rollout pipeline."""

from __future__ import annotations

from collections import Counter
from typing import Any, Final, Literal

from pydantic import Field, model_validator

from prorag.agent import DirectAnswer, Rollout, RolloutEngine, StandardRAG, get_adapter
from prorag.config import StrictModel, register_parameters
from prorag.data import Question
from prorag.llm.factory import build_generator
from prorag.llm.generation import Generator
from prorag.llm.registry import BUNDLED_SMOLLM2
from prorag.retrieval import RetrievalClient, RetrievalIndex, Retriever

TRAINING_STAGES: Final = ("sft", "rl")


class PolicyParams(StrictModel):
    """The policy: a registry spec, an optional LoRA adapter, and where it runs."""

    model: str = BUNDLED_SMOLLM2
    adapter: str | None = None
    backend: Literal["transformers", "openai"] = "transformers"
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_size: int = Field(default=8, ge=1)


class MethodParams(StrictModel):
    """One method evaluated side by side: a non-agentic baseline or the agent with a protocol."""

    name: str = Field(min_length=1)
    kind: Literal["direct", "standard_rag", "agent"]
    protocol: Literal["hiprag", "search_r1", "multistage"] = "hiprag"
    step_budget: int = Field(default=4, ge=1)
    max_new_tokens: int = Field(default=64, ge=1)
    max_new_tokens_per_turn: int = Field(default=256, ge=1)
    max_total_new_tokens: int = Field(default=1024, ge=1)
    open_next_step: bool = False
    few_shot: bool = True
    """HiPRAG only: include the prompt's few-shot examples (~2/3 of its tokens); false for a policy after SFT."""


class QuestionSelection(StrictModel):
    """Which prepared questions to roll out: by source file stem, first N of each."""

    sources: list[str] | None = None
    max_per_source: int | None = Field(default=None, ge=1)


@register_parameters("rollout")
class RolloutParams(StrictModel):
    """``rollout`` parameters; see conf/base/parameters_rollout.yml."""

    questions: QuestionSelection = QuestionSelection()
    policy: PolicyParams = PolicyParams()
    methods: list[MethodParams] = Field(min_length=1)
    retriever: Literal["dense", "bm25", "hybrid"] = "dense"
    retrieval_url: str | None = None
    top_k: int = Field(default=3, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int = 0
    samples: int = Field(default=1, ge=1)
    """Trajectories per question for agent methods (GRPO-style groups); baselines answer once."""
    trained_methods: list[MethodParams] = Field(default_factory=list)
    """Methods rolled out with each trained adapter (SFT, RL) merged into the policy; their names get the
    training stage as a suffix (``hiprag_agent`` → ``hiprag_agent_sft``, ``hiprag_agent_rl``)."""

    @model_validator(mode="after")
    def _unique_names(self) -> RolloutParams:
        names = [method.name for method in self.methods]
        names += [f"{method.name}_{stage}" for method in self.trained_methods for stage in TRAINING_STAGES]
        repeated = [name for name, count in Counter(names).items() if count > 1]
        if repeated:
            raise ValueError(f"method names (methods, and trained_methods with their stage suffixes) must be "
                             f"unique, repeated: {repeated}")
        return self


def select_rollout_questions(question_records: list[dict[str, Any]], params: RolloutParams) -> list[dict[str, Any]]:
    """The first ``max_per_source`` questions of each selected source; unknown sources are an error."""
    selection = params.questions
    available = list(dict.fromkeys(record.get("source") or record["dataset"] for record in question_records))
    if selection.sources is not None:
        unknown = sorted(set(selection.sources) - set(available))
        if unknown:
            raise ValueError(f"rollout.questions.sources names {unknown}, not among the prepared sources {available}")
    taken: Counter[str] = Counter()
    selected = []
    for record in question_records:
        source = record.get("source") or record["dataset"]
        if selection.sources is not None and source not in selection.sources:
            continue
        if selection.max_per_source is None or taken[source] < selection.max_per_source:
            taken[source] += 1
            selected.append(record)
    if not selected:
        raise ValueError("rollout.questions selects no question")
    return selected


def run_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex,
                 params: RolloutParams) -> list[dict[str, Any]]:
    """Every configured method over the selected questions, with one policy and one retriever."""
    return _run_methods(params.methods, question_records, index, params, params.policy.adapter)


def run_sft_policy_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex, adapter_dir: str,
                            params: RolloutParams) -> list[dict[str, Any]]:
    """``rollout.trained_methods`` with the SFT adapter merged into the policy (methods named ``*_sft``)."""
    return run_trained_rollouts(question_records, index, adapter_dir, params, "sft")


def run_rl_policy_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex, adapter_dir: str,
                           params: RolloutParams) -> list[dict[str, Any]]:
    """``rollout.trained_methods`` with the RL adapter merged into the policy (methods named ``*_rl``)."""
    return run_trained_rollouts(question_records, index, adapter_dir, params, "rl")


def run_trained_rollouts(question_records: list[dict[str, Any]], index: RetrievalIndex, adapter_dir: str,
                         params: RolloutParams, stage: str) -> list[dict[str, Any]]:
    """``rollout.trained_methods`` with a trained adapter merged in; method names get ``_<stage>``."""
    if not params.trained_methods:
        raise ValueError("rollout.trained_methods is empty: nothing to roll out with the trained adapter")
    methods = [method.model_copy(update={"name": f"{method.name}_{stage}"}) for method in params.trained_methods]
    return _run_methods(methods, question_records, index, params, adapter_dir)


def concat_trajectories(*trajectory_sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One trajectory table from several rollouts (e.g. base and SFT policies side by side)."""
    return [record for records in trajectory_sets for record in records]


def _run_methods(methods: list[MethodParams], question_records: list[dict[str, Any]], index: RetrievalIndex,
                 params: RolloutParams, adapter: str | None) -> list[dict[str, Any]]:
    questions = [Question.from_dict(record) for record in question_records]
    retriever: Retriever = (RetrievalClient(params.retrieval_url) if params.retrieval_url
                            else index.retriever(params.retriever))
    policy = params.policy
    generator = build_generator(policy.model, backend=policy.backend, adapter=adapter, dtype=policy.dtype,
                                batch_size=policy.batch_size, base_url=policy.base_url,
                                api_key_env=policy.api_key_env)
    rollouts: list[Rollout] = []
    for method in methods:
        rollouts.extend(_run_method(method, generator, retriever, questions, params))
    return [rollout.to_dict() for rollout in rollouts]


def _run_method(method: MethodParams, generator: Generator, retriever: Retriever, questions: list[Question],
                params: RolloutParams) -> list[Rollout]:
    sampling = {"temperature": params.temperature, "top_p": params.top_p, "seed": params.seed}
    if method.kind == "direct":
        runner = DirectAnswer(generator, max_new_tokens=method.max_new_tokens, **sampling)
    elif method.kind == "standard_rag":
        runner = StandardRAG(generator, retriever, top_k=params.top_k, max_new_tokens=method.max_new_tokens,
                             **sampling)
    else:
        adapter = get_adapter(method.protocol, open_next_step=method.open_next_step, few_shot=method.few_shot)
        runner = RolloutEngine(generator, retriever, adapter, step_budget=method.step_budget,
                               top_k=params.top_k, max_new_tokens_per_turn=method.max_new_tokens_per_turn,
                               max_total_new_tokens=method.max_total_new_tokens, method=method.name, **sampling)
        return runner.run(questions, samples=params.samples)
    rollouts = runner.run(questions)  # single-shot baselines: one sample (rollout.samples is for the agent)
    for rollout in rollouts:
        rollout.method = method.name
    return rollouts
