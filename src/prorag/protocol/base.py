"""What every trajectory protocol gives the rollout engine, the SFT example builder and the judges.

A protocol module (``prorag.protocol.hiprag``, ``search_r1``, ``multistage``, ...) defines one adapter class that
satisfies :class:`ProtocolAdapter` and is registered by name in :mod:`prorag.protocol.registry`; nothing above
this layer names a protocol.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

Boundary = Literal["search", "step", "answer"]
"""What a stop string means to the engine: run a search, close a step, or end with the answer."""

StepDict = dict[str, str | None]
"""A parsed step: ``kind`` (``"search"``/``"non_search"``), ``reasoning``, ``query``, ``context``,
``conclusion`` (``query``/``context`` None for a non-search step; ``conclusion`` None where the protocol has
none, as Search-R1)."""


@runtime_checkable
class ProtocolAdapter(Protocol):
    """What the engine needs from a protocol."""

    name: str
    stop_strings: tuple[str, ...]
    step_on_search: bool
    """True if the step budget counts searches (Search-R1); False if it counts closed steps (HiPRAG)."""

    def messages(self, question: str) -> list[dict[str, str]]: ...
    def initial_prefix(self) -> str: ...
    def boundary(self, stop: str) -> Boundary | None: ...
    def query(self, transcript: str) -> str: ...
    def insertion(self, docs_text: str) -> str: ...
    def after_step(self, step_index: int, budget: int) -> str: ...
    def forced_answer(self, transcript: str) -> str: ...
    def check_format(self, completion: str) -> tuple[int, int]: ...
    def steps(self, completion: str) -> list[StepDict] | None: ...
    def extract_answer(self, completion: str) -> str | None: ...
