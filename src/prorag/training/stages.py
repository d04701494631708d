"""What a training node and the launch worker (:mod:`prorag.training.launch_worker`) build the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prorag.data.records import Question
    from prorag.retrieval import RetrievalIndex
    from prorag.specs import AgentSpec, RetrieverSpec
    from prorag.training.config import GRPOSettings
    from prorag.training.grpo import AgentRollouts


def grpo_rollout_function(questions: Sequence[Question], index: RetrievalIndex | None, *, retriever: RetrieverSpec,
                          agent: AgentSpec, reward: Any, trainer: GRPOSettings, generation_batch_size: int,
                          judge_for_metrics: bool, policy_server: Mapping[str, Any] | None,
                          backend: str = "trl") -> AgentRollouts:
    """GRPO's rollouts, as the trainer ``backend`` (:mod:`prorag.training.backends`) drives them, over ``index`` (or
    the retrieval server ``retriever.retrieval_url``: every rank of a launch then queries it over HTTP; ``index``
    may then be None when the reward needs none) with the ``reward`` entry's scorer and the agent's protocol and
    budgets."""
    from prorag.assembly import build_retriever, build_scorer
    from prorag.training.backends import trainer_backend
    from prorag.training.grpo import PolicyServer

    scorer = build_scorer(reward, index, judge_for_metrics=judge_for_metrics, questions=questions)
    return trainer_backend(backend).rollouts(
        questions, build_retriever(retriever, index), scorer, agent, top_k=retriever.top_k,
        temperature=trainer.temperature, top_p=trainer.top_p, seed=trainer.seed,
        batch_size=generation_batch_size, refill_rounds=trainer.refill_rounds,
        policy_server=PolicyServer(**policy_server) if policy_server else None)
