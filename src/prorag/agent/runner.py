"""``build_runner(method, ...)``: the runner of one evaluated method — a baseline or the rollout engine with the
method's protocol (looked up by name in :mod:`prorag.protocol.registry`, so a registered protocol just works)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from prorag.agent.baselines import DirectAnswer, StandardRAG
from prorag.agent.engine import RolloutEngine
from prorag.agent.trajectory import Rollout
from prorag.data.records import Question
from prorag.llm.generation import Generator
from prorag.protocol.registry import build_adapter
from prorag.retrieval.base import Retriever
from prorag.specs import AgentSpec, MethodSpec, PolicySpec, SamplingSpec

Runner = Callable[[Sequence[Question]], list[Rollout]]
"""Questions in, one rollout per question (baselines) or ``samples`` per question (agents), question-major."""


POLICY_METADATA_KEY = "policy"
"""``Rollout.metadata`` key of the policy (model, adapter, backend) that produced the rollout."""
METHOD_METADATA_KEY = "method"
"""``Rollout.metadata`` key of the settings of the method that produced the rollout (:func:`method_settings`)."""
WALL_TIME_METADATA_KEY = "runner_wall_ns"
"""``Rollout.metadata`` key of ``[start, end]``: the wall clock (``time.time_ns``) around the runner call that
produced the rollout with the rest of its method's rollouts (every question and sample of one method)."""


def record_policy(rollouts: Sequence[Rollout], policy: PolicySpec) -> list[Rollout]:
    """Stamp each rollout with the policy that produced it, so reward judging re-asks over-search queries to that
    very policy (model + adapter), not to the base model."""
    produced_by = policy.model_dump()
    for rollout in rollouts:
        rollout.metadata[POLICY_METADATA_KEY] = produced_by
    return list(rollouts)


def producing_policy(rollout: Rollout) -> PolicySpec | None:
    """The policy recorded by :func:`record_policy`, or None for a rollout that has none (older trajectories)."""
    recorded = rollout.metadata.get(POLICY_METADATA_KEY)
    return PolicySpec.model_validate(recorded) if recorded else None


def build_engine(agent: AgentSpec, generator: Generator, retriever: Retriever, *, top_k: int,
                 sampling: SamplingSpec, method: str | None = None, **engine_options: bool) -> RolloutEngine:
    """The rollout engine for an agent spec (its protocol's adapter built with the spec's options)."""
    adapter = build_adapter(agent.protocol, **agent.protocol_options())
    return RolloutEngine(generator, retriever, adapter, step_budget=agent.step_budget, top_k=top_k,
                         max_new_tokens_per_turn=agent.max_new_tokens_per_turn,
                         max_total_new_tokens=agent.max_total_new_tokens, temperature=sampling.temperature,
                         top_p=sampling.top_p, seed=sampling.seed, method=method, **engine_options)


def method_settings(method: MethodSpec) -> dict[str, Any]:
    """What ``method`` runs with, without its name: a baseline's kind and answer budget; an agent's kind,
    protocol, prompt options and budgets (the same keys for an agent before and after training)."""
    if method.kind != "agent":
        return {"kind": method.kind, "max_new_tokens": method.max_new_tokens}
    return method.model_dump(mode="json", exclude={"name", "max_new_tokens"})


def build_runner(method: MethodSpec, generator: Generator, retriever: Retriever, *, top_k: int,
                 sampling: SamplingSpec, samples: int = 1) -> Runner:
    """The runner of ``method``; its rollouts are named ``method.name`` and carry the method's settings and the
    wall clock of the call in their metadata (:data:`METHOD_METADATA_KEY`, :data:`WALL_TIME_METADATA_KEY`).
    ``samples`` applies to agents only (the single-shot baselines answer once)."""
    options = {"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
               "method": method.name}
    runner: Runner
    if method.kind == "direct":
        runner = DirectAnswer(generator, max_new_tokens=method.max_new_tokens, **options).run
    elif method.kind == "standard_rag":
        runner = StandardRAG(generator, retriever, top_k=top_k, max_new_tokens=method.max_new_tokens, **options).run
    else:
        engine = build_engine(method, generator, retriever, top_k=top_k, sampling=sampling, method=method.name)
        runner = partial(engine.run, samples=samples)
    return partial(_stamped, runner, method_settings(method))


def _stamped(runner: Runner, settings: dict[str, Any], questions: Sequence[Question]) -> list[Rollout]:
    started = time.time_ns()
    rollouts = runner(questions)
    wall = [started, time.time_ns()]
    for rollout in rollouts:
        rollout.metadata[METHOD_METADATA_KEY] = dict(settings)
        rollout.metadata[WALL_TIME_METADATA_KEY] = list(wall)
    return rollouts
