"""The multi-stage-reward paper's protocol: ``<think>``, ``<search>``, ``<information>``, ``<reflect>``,
``<answer>`` ("Learning When to Search", §3.2 "Rollout with Search", §3.3 "Format Reward", Appendix B.4).

The paper defines two output structures (§3.3): without retrieval ``think, reflect, answer``; with retrieval
"multiple iterations of think, search, information, reflect, answer". Its prompt (:data:`INSTRUCTION`) adds
that after an ``<information>`` the model reflects, then answers or writes a revised ``<search>``. We read
that as the grammar (white space only between blocks, nothing before the first or after the last)::

    completion := THINK REFLECT ANSWER                                  (no retrieval)
                | THINK ROUND ( THINK? ROUND )* ANSWER                   (retrieval)
    ROUND      := SEARCH INFORMATION REFLECT

with non-empty ``<search>`` and ``<answer>`` contents (other blocks may be empty). :func:`is_valid_format`
decides "they fully match" of eq. 6. Tags are matched literally and case-sensitively; retrieved text is
escaped when inserted (:func:`after_search`), so a passage cannot change the structure.

The paper's prompt is given verbatim in its words but flattened onto one line in our copy; the line breaks of
:data:`INSTRUCTION` are ours. The paper does not say how the question is attached; :func:`render_prompt`
sends the instruction and ``Question: …`` as one user message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, NoReturn

from prorag.protocol.base import Boundary, StepDict, format_documents, split_inserted
from prorag.protocol.escaping import unescape_retrieved
from prorag.protocol.markup import last_between

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "INFORMATION_CLOSE",
    "INFORMATION_OPEN",
    "INSTRUCTION",
    "REFLECT_CLOSE",
    "REFLECT_OPEN",
    "SEARCH_CLOSE",
    "SEARCH_OPEN",
    "STOP_STRINGS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "MultistageParseError",
    "MultistageTrajectory",
    "after_search",
    "count_searches",
    "extract_answer",
    "extract_queries",
    "format_documents",
    "is_valid_format",
    "parse",
    "render_prompt",
]

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
SEARCH_OPEN: Final = "<search>"
SEARCH_CLOSE: Final = "</search>"
INFORMATION_OPEN: Final = "<information>"
INFORMATION_CLOSE: Final = "</information>"
REFLECT_OPEN: Final = "<reflect>"
REFLECT_CLOSE: Final = "</reflect>"
ANSWER_OPEN: Final = "<answer>"
ANSWER_CLOSE: Final = "</answer>"

STOP_STRINGS: Final[tuple[str, ...]] = (SEARCH_CLOSE, ANSWER_CLOSE)
"""Generation boundaries: retrieval after ``</search>``, the end after ``</answer>``."""

INSTRUCTION: Final = """Please answer the given question by following the structured reasoning protocol below:

1. Always begin with `<think>...</think>` to provide a brief internal reasoning sketch.
   - This reasoning must primarily rely on your internal knowledge and reasoning abilities.
   - If your internal knowledge is sufficient to answer the question, do not assume the need for external tools.
2. If your internal knowledge is sufficient to answer the question:
   - Provide a concise summary of your reasoning inside `<reflect>...</reflect>`.
   - Then give the final answer inside `<answer>...</answer>`.
   - Under no circumstances should you generate a `<search>` block if your internal knowledge is adequate.
3. Only if your internal knowledge is genuinely insufficient to answer the question:
   - Generate a brief keyword-based search query inside `<search>...</search>`. The query should be as concise \
as possible but must include sufficient factual clues, such as names, dates, locations, key concepts, etc.
   - The query should be a brief description with multiple keywords instead of a natural language question.
4. When the system returns information inside `<information>...</information>`:
   - If the information is reliable and sufficient, integrate it with your reasoning inside `<reflect>...</reflect>`.
   - Then provide the final concise answer inside `<answer>...</answer>`.
5. If the retrieved information is insufficient or contradicts your internal knowledge:
   - Explain the issue within `<reflect>...</reflect>`.
   - If necessary, generate a revised `<search>` query.
6. Final rule:
   - The final answer must be concise and clear, placed inside `<answer></answer>`.
   - Internal reasoning (in `<think>`) must always be the primary method; tool usage should be a last resort, \
not the default."""
"""Appendix B.4 "Instruction for Trained RLM", verbatim in its words (line breaks ours)."""

_TAG_SPLIT = re.compile(r"(</?(?:think|search|information|reflect|answer)>)")
_SEARCH_BLOCK = re.compile(re.escape(SEARCH_OPEN) + r"(.*?)" + re.escape(SEARCH_CLOSE), re.DOTALL)


class MultistageParseError(ValueError):
    """A completion that does not match the protocol's structure; ``reason`` says where."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class MultistageTrajectory:
    """A well-formed completion: its think / reflect texts, queries, (unescaped) information and answer."""

    thinks: tuple[str, ...]
    queries: tuple[str, ...]
    information: tuple[str, ...]
    reflections: tuple[str, ...]
    answer: str

    @property
    def retrieval_count(self) -> int:
        """RC: the number of searches."""
        return len(self.queries)


def render_prompt(question: str) -> list[dict[str, str]]:
    """Chat messages for one question: the instruction and the question as one user message."""
    return [{"role": "user", "content": f"{INSTRUCTION}\n\nQuestion: {question.strip()}"}]


def after_search(docs_text: str) -> str:
    """What follows a ``</search>`` boundary; ``docs_text`` must already be escaped (:func:`format_documents`)."""
    return f"\n{INFORMATION_OPEN}{docs_text}{INFORMATION_CLOSE}\n"


def count_searches(text: str) -> int:
    """Number of ``</search>`` tags (retrieved text is escaped and has none)."""
    return text.count(SEARCH_CLOSE)


def _fail(reason: str) -> NoReturn:
    raise MultistageParseError(reason)


def parse(text: str) -> MultistageTrajectory:
    """Parse a completion against the grammar of the module docstring; raises :class:`MultistageParseError`."""
    state = "start"
    retrieved = False
    thinks: list[str] = []
    queries: list[str] = []
    information: list[str] = []
    reflections: list[str] = []
    answer: str | None = None
    content: str | None = None
    for part in _TAG_SPLIT.split(text.replace("\r\n", "\n")):
        if not _TAG_SPLIT.fullmatch(part):
            if not part.strip():
                continue
            if not state.startswith("in_"):
                _fail(f"text outside the blocks in state {state}: {part.strip()[:40]!r}")
            content = part.strip()
            continue
        allowed: dict[str, str] = {}
        if state == "start":
            allowed = {THINK_OPEN: "in_think"}
        elif state == "after_think":
            allowed = {SEARCH_OPEN: "in_search"}
            if not retrieved:
                allowed[REFLECT_OPEN] = "in_reflect"
        elif state == "after_search":
            allowed = {INFORMATION_OPEN: "in_information"}
        elif state == "after_information":
            allowed = {REFLECT_OPEN: "in_reflect"}
        elif state == "after_reflect":
            allowed = {ANSWER_OPEN: "in_answer"}
            if retrieved:
                allowed.update({SEARCH_OPEN: "in_search", THINK_OPEN: "in_think"})
        elif state.startswith("in_"):
            name = state.removeprefix("in_")
            allowed = {f"</{name}>": f"after_{name}"}
        following = allowed.get(part)
        if following is None:
            _fail(f"unexpected {part} in state {state}")
        if part.startswith("</"):
            value = content or ""
            if part == THINK_CLOSE:
                thinks.append(value)
            elif part == SEARCH_CLOSE:
                if not value:
                    _fail("empty search query")
                queries.append(value)
            elif part == INFORMATION_CLOSE:
                information.append(unescape_retrieved(value))
                retrieved = True
            elif part == REFLECT_CLOSE:
                reflections.append(value)
            else:
                if not value:
                    _fail("empty answer")
                answer = value
        content = None
        state = following
    if state != "after_answer" or answer is None:
        _fail(f"incomplete completion, ended in state {state}")
    return MultistageTrajectory(tuple(thinks), tuple(queries), tuple(information), tuple(reflections), answer)


def is_valid_format(text: str) -> bool:
    """True when the completion fully matches one of the two structures (eq. 6's "they fully match")."""
    try:
        parse(text)
    except MultistageParseError:
        return False
    return True


def extract_queries(text: str) -> list[str]:
    """Lenient: the stripped contents of every ``<search>…</search>``, in order (empty ones dropped)."""
    return [query for match in _SEARCH_BLOCK.finditer(text) if (query := match.group(1).strip())]


def extract_answer(text: str) -> str | None:
    """Lenient: the stripped content of the last complete ``<answer>…</answer>``, or None."""
    return last_between(text, ANSWER_OPEN, ANSWER_CLOSE)

# ------------------------------------------------------------------------------------------ engine adapter

_BOUNDARIES: Final[dict[str, Boundary]] = {SEARCH_CLOSE: "search", ANSWER_CLOSE: "answer"}


@dataclass(frozen=True)
class MultistageAdapter:
    """The multi-stage-reward paper's think/search/information/reflect/answer (:mod:`prorag.protocol.multistage`).

    The step budget counts searches, as for Search-R1: the search beyond the budget is not executed and
    :meth:`forced_answer` opens ``<answer>`` right after it. That completion has a ``<search>`` without
    ``<information>`` and so fails :func:`~prorag.protocol.is_valid_format` — deliberately, the
    model exceeded the budget. The protocol has no HiPRAG steps: :meth:`steps` is None.
    """

    name: str = "multistage"
    stop_strings: tuple[str, ...] = STOP_STRINGS
    step_on_search: bool = True

    def messages(self, question: str) -> list[dict[str, str]]:
        return render_prompt(question)

    def initial_prefix(self) -> str:
        return ""  # the model opens its first <think> itself

    def boundary(self, stop: str, completion: str) -> Boundary | None:
        return _BOUNDARIES.get(stop)

    def query(self, transcript: str) -> str:
        return last_between(transcript, SEARCH_OPEN, SEARCH_CLOSE) or ""

    def insertion(self, docs_text: str) -> str:
        return after_search(docs_text)

    def after_step(self, step_index: int, budget: int) -> str:
        return ""  # no step-closing boundary

    def forced_answer(self, transcript: str) -> str:
        return f"\n{ANSWER_OPEN}"  # the protocol's block layout (cf. after_search)

    def check_format(self, completion: str) -> tuple[int, int]:
        """``(1, N)`` with ``N`` the search rounds of a well-formed completion, else ``(0, -1)``."""
        if not is_valid_format(completion):
            return 0, -1
        return 1, count_searches(completion)  # every </search> of a valid completion is a tag

    def steps(self, completion: str) -> list[StepDict] | None:
        return None

    def extract_answer(self, completion: str) -> str | None:
        return extract_answer(completion)

    def label_pieces(self, completion: str) -> list[tuple[str, bool]]:
        """Engine-inserted: each ``<information>…</information>`` block with its surrounding newlines."""
        return split_inserted(completion, self)
