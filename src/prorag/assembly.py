"""The composition root: specs in, objects out — the policy, a retriever, a judge, a reward's scorer, GRPO's
rollouts.

Nodes, experiments and training backends build what they run here and nowhere else, so a spec is turned into an
object in one place (the library packages below never assemble each other's objects).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prorag.judges.factory import build_judge
from prorag.llm.factory import build_generator
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import RolloutScorer

if TYPE_CHECKING:
    from prorag.data.records import Question
    from prorag.judges.base import Judge
    from prorag.kg.params import ExtractorSpec
    from prorag.llm.generation import Generator
    from prorag.retrieval.base import Retriever
    from prorag.retrieval.index import RetrievalIndex
    from prorag.rewards.base import Reward, RewardSettings
    from prorag.specs import AgentSpec, JudgeSpec, PolicySpec, RetrieverSpec
    from prorag.training.config import GRPOSettings
    from prorag.training.grpo import AgentRollouts


# The rollout engine passes every live trajectory to each turn's call, so KV that two calls in a row did not use
# belongs to finished trajectories. Kept until the cache filled, it held 2 GiB of them while the last two of make
# train's SFT-agent rollouts ran to 9k tokens: make train's peak (8.7 GiB).
POLICY_PREFIX_CACHE_IDLE_CALLS = 2


def build_policy(policy: PolicySpec) -> Generator:
    """The policy's generator (in-process transformers with the adapter merged, or an OpenAI-compatible server that
    serves a trained adapter or full model by name: :mod:`prorag.llm.served`), labelled with
    :attr:`PolicySpec.label` for progress bars (:func:`prorag.llm.generation.policy_label`)."""
    generator = build_generator(policy.model, backend=policy.backend, adapter=policy.adapter, dtype=policy.dtype,
                                batch_size=policy.batch_size, base_url=policy.base_url,
                                api_key_env=policy.api_key_env, trained_server=policy.trained_server,
                                device=policy.device, prefix_cache_idle_calls=POLICY_PREFIX_CACHE_IDLE_CALLS,
                                draft_tokens=policy.draft_tokens, mixed_precision=policy.mixed_precision)
    with contextlib.suppress(AttributeError):  # a generator with __slots__ keeps its class name as the label
        generator.label = policy.label  # type: ignore[attr-defined]
    return generator


def build_extractor(spec: ExtractorSpec) -> Generator:
    """The knowledge-graph extraction model an :class:`~prorag.kg.params.ExtractorSpec` describes."""
    return build_generator(spec.model, backend=spec.backend, dtype=spec.dtype, batch_size=spec.batch_size,
                           base_url=spec.base_url, api_key_env=spec.api_key_env, mode=spec.mode,
                           max_concurrency=spec.max_concurrency, timeout=spec.timeout)


def build_retriever(spec: RetrieverSpec, index: RetrievalIndex | None) -> Retriever:
    """A retrieval server's client when ``spec.retrieval_url`` is set, else the index's ``spec.kind`` retriever."""
    if spec.retrieval_url:
        from prorag.retrieval.client import RetrievalClient

        return RetrievalClient(spec.retrieval_url)
    if index is None:
        raise ValueError(f"retriever {spec.kind!r} needs the retrieval index, or retrieval_url (a retrieval server)")
    return index.retriever(spec.kind)


def build_judge_from_spec(spec: JudgeSpec, retriever: Retriever | None = None) -> Judge:
    """The judge of a :class:`~prorag.specs.JudgeSpec` (the reference judge grounds with ``retriever``)."""
    return build_judge(**spec.model_dump(), retriever=retriever)


def build_method_reward(reward: RewardSettings | Mapping[str, Any]) -> Reward:
    """The registered reward of a reward entry (``methods.<name>.reward``), with no judges attached: what a method's
    own loop scores with (TeaRAG's IP-DPO)."""
    return build_reward(reward)


def build_scorer(reward: RewardSettings | Mapping[str, Any], index: RetrievalIndex | None = None, *,
                 judge_for_metrics: bool = False, questions: Sequence[Question] = ()) -> RolloutScorer:
    """The scorer of a reward entry: the registered reward and what it needs — detection judges (the reference judge
    grounds with ``judge_retriever`` over ``index``), the index's query embedder, an answer judge, the questions'
    gold evidence. ``judge_for_metrics`` runs detection for OSR/USR even when the reward does not need it. ``index``
    may be None for a reward that needs neither detection nor an embedder."""
    scoring = build_reward(reward)
    settings = scoring.settings
    needs = scoring.needs
    if index is None and (needs.detection or judge_for_metrics or needs.embedder):
        raise ValueError(f"reward {scoring.kind!r} needs the retrieval index (its judges' retriever or embedder)")
    over_judge = under_judge = None
    if needs.detection or judge_for_metrics:
        retriever = index.retriever(settings.judge_retriever)  # type: ignore[union-attr]
        over_judge = build_judge_from_spec(settings.over_search_judge, retriever)
        under_judge = build_judge_from_spec(settings.under_search_judge, retriever)
    answer_spec = getattr(settings, "answer_judge", None)
    answer_judge = (build_judge_from_spec(answer_spec) if needs.answer_judge and answer_spec is not None
                    and answer_spec.kind == "llm" else None)
    embed = index.embedder.encode_queries if needs.embedder and index is not None else None
    return RolloutScorer(scoring, over_judge=over_judge, under_judge=under_judge, embed=embed,
                         answer_judge=answer_judge, judge_for_metrics=judge_for_metrics,
                         questions={question.key: question for question in questions})


def build_grpo_rollouts(questions: Sequence[Question], index: RetrievalIndex | None, *, retriever: RetrieverSpec,
                        agent: AgentSpec, reward: Any, trainer: GRPOSettings, generation_batch_size: int,
                        judge_for_metrics: bool, policy_server: Mapping[str, Any] | None,
                        backend: str = "trl") -> AgentRollouts:
    """GRPO's rollouts, as the trainer ``backend`` (:mod:`prorag.training.backends`) drives them, over ``index`` (or
    the retrieval server ``retriever.retrieval_url``: every rank of a launch then queries it over HTTP; ``index``
    may then be None when the reward needs none) with the ``reward`` entry's scorer and the agent's protocol and
    budgets. The rl node and each rank of a launch (:mod:`prorag.launch_worker`) build them here."""
    from prorag.training.backends import trainer_backend
    from prorag.training.grpo import PolicyServer

    scorer = build_scorer(reward, index, judge_for_metrics=judge_for_metrics, questions=questions)
    return trainer_backend(backend).rollouts(
        questions, build_retriever(retriever, index), scorer, agent, top_k=retriever.top_k,
        temperature=trainer.temperature, top_p=trainer.top_p, seed=trainer.seed,
        batch_size=generation_batch_size, refill_rounds=trainer.refill_rounds,
        policy_server=PolicyServer(**policy_server) if policy_server else None)
