"""The agent: a batched multi-turn rollout engine (HiPRAG Algorithm 1, Search-R1) and non-agentic baselines.

``RolloutEngine(generator, retriever, protocol).run(questions)`` returns :class:`Rollout` records with the
exact token segments the policy saw; :class:`DirectAnswer` and :class:`StandardRAG` return the same record;
:func:`build_runner` picks the runner of a :class:`~prorag.specs.MethodSpec`.
"""

from prorag.agent.baselines import DirectAnswer, StandardRAG
from prorag.agent.engine import (
    EMPTY_QUERY_NOTE,
    NO_RESULTS_NOTE,
    RetrievalFailedError,
    RolloutEngine,
    RolloutError,
)
from prorag.agent.runner import (
    Runner,
    build_engine,
    build_runner,
    producing_policy,
    record_policy,
)
from prorag.agent.trajectory import (
    STOP_REASONS,
    Rollout,
    Segment,
    StopReason,
    completion_ids_and_mask,
    stop_reason_counts,
)
from prorag.protocol.base import ProtocolAdapter
from prorag.protocol.hiprag import HiPRAGAdapter
from prorag.protocol.multistage import MultistageAdapter
from prorag.protocol.search_r1 import SearchR1Adapter

__all__ = [
    "EMPTY_QUERY_NOTE",
    "NO_RESULTS_NOTE",
    "STOP_REASONS",
    "DirectAnswer",
    "HiPRAGAdapter",
    "MultistageAdapter",
    "ProtocolAdapter",
    "RetrievalFailedError",
    "Rollout",
    "RolloutEngine",
    "RolloutError",
    "Runner",
    "SearchR1Adapter",
    "Segment",
    "StandardRAG",
    "StopReason",
    "build_engine",
    "build_runner",
    "completion_ids_and_mask",
    "producing_policy",
    "record_policy",
    "stop_reason_counts",
]
