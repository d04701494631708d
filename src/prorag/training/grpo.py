"""The backend-neutral half of GRPO over multi-turn rollouts: what every trainer backend
(:mod:`prorag.training.backends`) drives the same way, whatever does the optimisation.

* :class:`AgentRollouts` rolls a batch of prompts out with the multi-turn :class:`~prorag.agent.RolloutEngine` (the
  HiPRAG step protocol, Search-R1 or multi-stage, one batched retriever call per turn) on a given policy
  :class:`~prorag.llm.generation.Generator`, scores it with :class:`~prorag.rewards.scoring.RolloutScorer` (the same
  policy answers over-search re-asks), runs DAPO's refill (:func:`~prorag.training.dapo.refill_uniform_groups`) and
  returns a :class:`RolloutBatch`: rollouts, reward components, the agent statistics (``process_shaped`` included),
  the refill and judge-usage metrics and, per rollout, the completion token ids, the sampler's log-probabilities and
  the mask of generated tokens (retrieved ``<context>`` and the engine's tags stay out of the loss).
* :class:`PolicyServer` describes an OpenAI-compatible server serving the policy being trained (a backend that keeps
  it in sync, such as TRL's vLLM server mode, may roll out through it).
* :func:`unique_questions` is the training set deduplicated by text (the rollout function knows a prompt by its text).

The probe (:mod:`prorag.training.probe`) samples and scores with the same engine and scorer, with no trainer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from prorag.agent.runner import build_engine
from prorag.judges.limits import process_cost, usage_metrics
from prorag.llm.generation import request_seeds
from prorag.llm.openai_backend import OpenAICompatibleGenerator, api_key_from_env
from prorag.llm.replicas import ReplicatedGenerator, check_serving, shares
from prorag.rewards.diagnostics import process_shaped_groups
from prorag.specs import AgentSpec, SamplingSpec
from prorag.training.checkpoints import COMPLETED_MARKER
from prorag.training.dapo import refill_uniform_groups

if TYPE_CHECKING:
    from prorag.agent.engine import RolloutEngine
    from prorag.agent.trajectory import Rollout
    from prorag.data.records import Question
    from prorag.llm.generation import Generator
    from prorag.retrieval.base import Retriever
    from prorag.rewards.scoring import Ratio, RolloutScorer, ScoredBatch

logger = logging.getLogger(__name__)

__all__ = ["COMPLETED_MARKER", "JUDGE_LEDGER", "STAT_PREFIX", "AgentRollouts", "PolicyServer", "RolloutBatch",
           "completion_arrays", "unique_questions"]

JUDGE_LEDGER: Final = "judge_ledger"
"""The run folder's judge ledger (:class:`prorag.judges.limits.JudgeLedger`): one judge budget, usage and rate limit
for every rank and every restart of the run."""
STAT_PREFIX: Final = "agent/"
"""The logged name of an agent statistic (``agent/format_rate``, ``agent/cem``, ...)."""


@dataclass(frozen=True)
class PolicyServer:
    """The vLLM server(s) (``vllm serve`` as ``trl vllm-serve`` runs it) serving the policy being trained.

    ``base_url`` is a server root (``http://host:8000``) or a list of them: data-parallel replicas, one per GPU,
    each serving the whole policy. TRL syncs the weights into every one (:mod:`prorag.training.trl_private`) and the
    rollouts spread each batch's groups over them through their OpenAI-compatible ``/v1`` APIs (a group stays on one
    server: :meth:`AgentRollouts.roll_out`); ``model`` is the name every server serves the policy under. The
    rollouts send the key held by the environment variable named ``api_key_env`` (``None``: keyless servers, as
    ``trl vllm-serve`` is); a named variable that is unset fails here, before any request, and no other variable
    (``$OPENAI_API_KEY``) is ever sent.
    """

    base_url: str | Sequence[str]
    model: str
    timeout: float = 300.0
    max_retries: int = 2
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        roots = self.roots
        if not roots:
            raise ValueError("a policy server needs at least one base_url")
        if len(set(roots)) != len(roots):
            raise ValueError(f"a policy server base_url is listed twice: {roots}")
        self.api_key()  # an unset named variable is an error now, not at the first rollout

    def api_key(self) -> str:
        """The key to send (see the class docstring)."""
        return api_key_from_env(self.api_key_env, endpoint=f"the policy server at {self.root}", base_url=self.root)

    @property
    def roots(self) -> tuple[str, ...]:
        """Every server's root, in the order given."""
        urls = [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)
        return tuple(url.rstrip("/") for url in urls)

    @property
    def root(self) -> str:
        """The first server's root (TRL's own ``vllm_server_base_url``)."""
        return self.roots[0]

    @property
    def openai_urls(self) -> tuple[str, ...]:
        return tuple(root + "/v1" for root in self.roots)

    @property
    def openai_url(self) -> str:
        return self.openai_urls[0]


@dataclass
class RolloutBatch:
    """One generation batch, rolled out and scored (:meth:`AgentRollouts.roll_out`)."""

    rollouts: list[Rollout]
    scored: ScoredBatch
    stats: dict[str, Ratio]
    """The agent statistics as ``(numerator, denominator)``, to be summed over processes before the ratio."""
    refill: dict[str, float] = field(default_factory=dict)
    """What DAPO's refill did (``dapo/*``)."""
    usage: dict[str, float] = field(default_factory=dict)
    """The judges' calls, tokens and cost so far (every rank's and restart's, with a judge ledger)."""
    judge_cost: float = 0.0
    """What this process's judges spent on this batch (USD)."""

    @property
    def metrics(self) -> dict[str, float]:
        """The refill and usage metrics, logged as they are."""
        return {**self.refill, **self.usage}

    def completions(self) -> list[tuple[list[int], list[float], list[int]]]:
        """Per rollout: completion token ids, the sampler's log-probabilities (0 for inserted tokens) and the mask of
        generated tokens (1) vs inserted ones (0)."""
        return [completion_arrays(rollout) for rollout in self.rollouts]


def completion_arrays(rollout: Rollout) -> tuple[list[int], list[float], list[int]]:
    """A rollout's completion as ids, sampler log-probabilities (0 where inserted or unknown) and generated mask."""
    ids: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    for segment in rollout.segments:
        ids.extend(segment.token_ids)
        mask.extend([int(segment.generated)] * len(segment.token_ids))
        values = segment.logprobs if segment.generated and segment.logprobs is not None else None
        logprobs.extend(values if values is not None else [0.0] * len(segment.token_ids))
    return ids, logprobs, mask


def unique_questions(questions: Sequence[Question]) -> list[Question]:
    """The training questions with duplicates by text dropped (the first kept); none at all is an error."""
    seen: set[str] = set()
    unique = []
    for question in questions:
        if question.question not in seen:
            seen.add(question.question)
            unique.append(question)
    if not unique:
        raise ValueError("no training question for GRPO")
    return unique


class AgentRollouts:
    """Multi-turn rollouts, scored, for a GRPO trainer backend (module docstring).

    ``questions`` are the training questions; prompts arrive as their text. ``seed`` is offset by the step and the
    process index (:meth:`seed_for`), so every step and process samples differently and a resumed run samples as the
    uninterrupted one would. ``refill_rounds``: DAPO's dynamic sampling with refill (rounds of re-drawing groups
    whose rewards are all equal).
    """

    def __init__(self, questions: Sequence[Question], retriever: Retriever, scorer: RolloutScorer, agent: AgentSpec,
                 *, top_k: int = 3, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 8,
                 policy_server: PolicyServer | None = None, refill_rounds: int = 0) -> None:
        self._questions: dict[str, Question] = {}
        for question in questions:
            known = self._questions.setdefault(question.question, question)
            if known is not question and tuple(known.golden_answers) != tuple(question.golden_answers):
                raise ValueError(f"questions {known.key!r} and {question.key!r} have the same text and different "
                                 "answers; deduplicate the training set (unique_questions does)")
        self.retriever = retriever
        self.scorer = scorer
        self.agent = agent
        self.top_k = top_k
        self.sampling = SamplingSpec(temperature=temperature, top_p=top_p, seed=seed)
        self.seed = seed
        self.batch_size = batch_size
        self.policy_server = policy_server
        self.refill_rounds = refill_rounds
        self.last_rollouts: list[Rollout] = []
        self.last_refill: dict[str, float] = {}

    @property
    def reward_components(self) -> tuple[str, ...]:
        return self.scorer.components

    def seed_for(self, step: int, rank: int) -> int:
        """The sampling seed of ``step`` on process ``rank``."""
        return self.seed + 1_000_003 * step + 7_919 * rank

    def roll_out(self, prompts: Sequence[Any], generator: Generator, *, step: int, rank: int, group_size: int,
                 scale_rewards: str) -> RolloutBatch:
        """Roll ``prompts`` (whole groups of ``group_size`` copies of a question's text) out on ``generator`` (the
        current policy), score them, refill uniform groups; ``scale_rewards`` is the trainer's advantage scaling
        (for ``process_shaped``)."""
        questions = [self.question(prompt) for prompt in prompts]
        seed = self.seed_for(step, rank)
        spent_before = process_cost()

        def run(batch: list[Question]) -> list[Rollout]:
            return self._run_groups(batch, generator, seed=seed, group_size=group_size, offset=rank)

        rollouts = run(questions)
        scored = self.scorer.score(rollouts, generator, step=step)
        self.last_refill = {}
        if self.refill_rounds:
            refill = refill_uniform_groups(
                questions, rollouts, scored, pool=list(self._questions.values()), size=group_size,
                rounds=self.refill_rounds, seed=seed, roll_out=run,
                score=lambda batch: self.scorer.score(batch, generator, step=step))
            rollouts, scored, self.last_refill = refill.rollouts, refill.scored, refill.metrics
        shaped = process_shaped_groups(scored, self.scorer.reward, group_size, scale_rewards)
        self.last_rollouts = rollouts
        return RolloutBatch(rollouts, scored, {**scored.stats, **({"process_shaped": shaped} if shaped else {})},
                            dict(self.last_refill), usage_metrics(), process_cost() - spent_before)

    def _run_groups(self, questions: list[Question], generator: Generator, *, seed: int, group_size: int,
                    offset: int) -> list[Rollout]:
        """Roll ``questions`` out; on a :class:`~prorag.llm.replicas.ReplicatedGenerator` each replica takes a
        contiguous share of the whole groups (``group_size`` consecutive copies of a question), with its own
        engine, concurrently, so a group and each trajectory's turns stay on one server (its prefix cache). Share
        ``i`` samples with ``request_seeds(seed, replicas)[i]``; ``offset`` (the rank) picks which replicas take
        the remainder groups."""
        replicas = generator.replicas if isinstance(generator, ReplicatedGenerator) else (generator,)
        if len(replicas) == 1 or len(questions) % group_size:
            return self._engine(generator, seed).run(questions)
        parts = shares(len(questions) // group_size, len(replicas), offset=offset)
        seeds = request_seeds(seed, len(replicas))
        jobs = [(replica, questions[part.start * group_size:part.stop * group_size], share_seed)
                for replica, part, share_seed in zip(replicas, parts, seeds, strict=True) if part]
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="prorag-rollout-share") as pool:
            futures = [pool.submit(self._engine(replica, share_seed).run, batch)
                       for replica, batch, share_seed in jobs]
            return [rollout for future in futures for rollout in future.result()]

    def _engine(self, generator: Generator, seed: int) -> RolloutEngine:
        return build_engine(self.agent, generator, self.retriever, top_k=self.top_k, logprobs=True,
                            sampling=self.sampling.model_copy(update={"seed": seed}), progress=False)

    @contextlib.contextmanager
    def server_generator(self, tokenizer: Any) -> Iterator[Generator]:
        """The policy server(s) (:attr:`policy_server`, which the backend keeps in sync) as a generator: one
        server's, or a :class:`~prorag.llm.replicas.ReplicatedGenerator` over several. Every server must answer
        and serve the policy's name first (a down one is named)."""
        server = self.policy_server
        if server is None:
            raise ValueError("no policy server: the rollouts run on the trainer's policy in-process")
        key = server.api_key()
        for url in server.roots:
            check_serving(url, server.model, api_key=key)
        generators = [OpenAICompatibleGenerator(url, server.model, key, mode="completions",
                                                max_concurrency=self.batch_size, timeout=server.timeout,
                                                max_retries=server.max_retries, tokenizer=tokenizer,
                                                return_token_ids=True) for url in server.openai_urls]
        with generators[0] if len(generators) == 1 else ReplicatedGenerator(generators) as generator:
            yield generator

    def question(self, prompt: Any) -> Question:
        """The training question whose text ``prompt`` is."""
        text = prompt if isinstance(prompt, str) else None
        if text is None or text not in self._questions:
            raise KeyError(f"prompt {str(prompt)[:80]!r} is not one of the rollout function's training questions")
        return self._questions[text]
