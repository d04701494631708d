"""What every trajectory protocol gives the rollout engine, the SFT example builder and the judges.

A protocol module (``prorag.protocol.hiprag``, ``search_r1``, ``multistage``, ...) defines one adapter class that
satisfies :class:`ProtocolAdapter` and is registered by name in :mod:`prorag.protocol.registry`; nothing above
this layer names a protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, Protocol, runtime_checkable

from prorag.protocol.escaping import escape_retrieved

Boundary = Literal["search", "step", "answer", "malformed"]
"""What a stop string means to the engine: run a search, close a step, end with the answer, or end the trajectory
as a format failure (``malformed``: an action closed where the protocol does not allow one, e.g. a ReasonRAG
query written inside the evidence span)."""

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
    def boundary(self, stop: str, completion: str) -> Boundary | None:
        """What ``stop`` means where it was written: ``completion`` is the trajectory so far, ending with it."""
        ...
    def query(self, transcript: str) -> str: ...
    def insertion(self, docs_text: str) -> str: ...
    def after_step(self, step_index: int, budget: int) -> str: ...
    def forced_answer(self, transcript: str) -> str: ...
    def check_format(self, completion: str) -> tuple[int, int]: ...
    def steps(self, completion: str) -> list[StepDict] | None: ...
    def extract_answer(self, completion: str) -> str | None: ...
    def label_pieces(self, completion: str) -> list[tuple[str, bool]]:
        """The SFT label mask: a well-formed completion split into ``(text, written_by_policy)`` pieces in order;
        what the engine inserts (initial prefix, retrieval insertions, step closers) is not trained."""
        ...


@runtime_checkable
class GoldRenderer(Protocol):
    """A protocol that can write a gold trajectory (SFT synthesis) from parsed steps and an answer."""

    def render(self, steps: Sequence[StepDict], answer: str) -> str: ...


PIECE_MARK: Final = "\x00"
"""Splits an adapter's ``insertion`` into the text before and after the documents (no protocol emits it)."""


def format_documents(documents: Sequence[tuple[str, str]]) -> str:
    """Number ``(title, text)`` pairs like Search-R1 (``Doc 1(Title: …) …``), one per line, each escaped."""
    return "\n".join(
        escape_retrieved(f"Doc {index}(Title: {title}) {text}")
        for index, (title, text) in enumerate(documents, start=1)
    )


def split_inserted(completion: str, adapter: ProtocolAdapter, step_closer: tuple[str, str] | None = None,
                   ) -> list[tuple[str, bool]]:
    """:meth:`ProtocolAdapter.label_pieces` for a protocol whose engine inserts the initial prefix, one
    ``insertion(docs)`` per search and, optionally, a fixed ``step_closer = (anchor, inserted)``: ``inserted``
    right after each model-written ``anchor`` (HiPRAG: ``"\n</step>"`` after ``</conclusion>``).

    The completion must pass the adapter's format check and start with its initial prefix.
    """
    if adapter.check_format(completion)[0] != 1:
        raise ValueError(f"the completion fails the {adapter.name} format check")
    prefix = adapter.initial_prefix()
    if not completion.startswith(prefix):
        raise ValueError(f"the completion must start with the engine's initial prefix {prefix!r}")
    head, tail = adapter.insertion(PIECE_MARK).split(PIECE_MARK)
    pieces: list[tuple[str, bool]] = [(prefix, False)]
    cursor = len(prefix)
    while True:
        context_at = completion.find(head, cursor)
        step_at = completion.find("".join(step_closer), cursor) if step_closer else -1
        if context_at == -1 and step_at == -1:
            break
        if context_at != -1 and (step_at == -1 or context_at < step_at):
            tail_at = completion.find(tail, context_at + len(head))
            if tail_at == -1:
                raise ValueError(f"an insertion {head!r} is not followed by {tail!r}")
            start, end = context_at, tail_at + len(tail)
        else:
            assert step_closer is not None
            start = step_at + len(step_closer[0])
            end = start + len(step_closer[1])
        pieces.append((completion[cursor:start], True))
        pieces.append((completion[start:end], False))
        cursor = end
    pieces.append((completion[cursor:], True))
    return [(text, trained) for text, trained in pieces if text]
