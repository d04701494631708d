"""Search-R1 protocol (Jin et al., 2025): ``<think>``, ``<search>``, ``<information>``, ``<answer>``.

A completion is a sequence of rounds, each a ``<think>…</think>`` block followed either by a search — the
model writes ``<search>q</search>`` and the engine inserts ``<information>…</information>`` (escaped) — or by
the final ``<answer>…</answer>``::

    <think>…</think>
    <search>q</search>

    <information>Doc 1(Title: …) …</information>

    <think>…</think>
    <answer>…</answer>

Sibling of :mod:`prorag.protocol.hiprag` with the same helper names where they make sense (``render_prompt``,
``initial_prefix``, ``STOP_STRINGS``, ``last_query``, ``format_documents``,
``after_search``, ``forced_answer_prefix``, ``check_format``, ``parse``,
``extract_answer``).

Choices, following the Search-R1 code base where the paper is silent:

* The prompt is Search-R1's template as the single *user* message (its ``infer.py`` applies the chat
  template to ``[{"role": "user", …}]``); the question is stripped and gets a ``?`` if it has none, as in
  Search-R1's data preprocessing (``nq_search.py``). The model writes its first ``<think>`` itself, so
  :func:`initial_prefix` is empty.
* :func:`is_valid_format` is Search-R1's ``is_valid_sequence`` (``qa_em_format.py``) on the completion:
  balanced tags, then the state machine ``think → (search → information → think)* → answer``, only white
  space between blocks, nothing after ``</answer>``. Tags are matched literally and case-sensitively.
* The step budget counts searches (:func:`count_searches`). Search-R1 runs ``max_turns`` search rounds and
  then one last round whose search is not executed; an engine here does the same with ``B`` searches, and
  replaces the ``B+1``-th search by Algorithm 1's forced answer (:func:`forced_answer_prefix`). That completion
  has a ``<search>`` without ``<information>``, so it fails :func:`is_valid_format` — deliberately: the model
  exceeded the budget.
* :func:`check_format` returns ``(1, N)`` with ``N`` the number of ``<think>`` rounds (every round is a step:
  a search step or the final reasoning), ``(0, -1)`` otherwise, like HiPRAG's checker.
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
    "FORMAT_FAILURE",
    "INFORMATION_CLOSE",
    "INFORMATION_OPEN",
    "PROMPT_TEMPLATE",
    "SEARCH_CLOSE",
    "SEARCH_OPEN",
    "STOP_STRINGS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "Round",
    "SearchR1ParseError",
    "SearchR1Trajectory",
    "after_search",
    "check_format",
    "count_searches",
    "extract_answer",
    "forced_answer_prefix",
    "format_documents",
    "initial_prefix",
    "is_valid_format",
    "last_query",
    "normalize_question",
    "parse",
    "render_prompt",
]

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
SEARCH_OPEN: Final = "<search>"
SEARCH_CLOSE: Final = "</search>"
INFORMATION_OPEN: Final = "<information>"
INFORMATION_CLOSE: Final = "</information>"
ANSWER_OPEN: Final = "<answer>"
ANSWER_CLOSE: Final = "</answer>"

STOP_STRINGS: Final[tuple[str, ...]] = (SEARCH_CLOSE, ANSWER_CLOSE)
"""Generation boundaries (the boundary belongs to the generated text)."""

FORMAT_FAILURE: Final[tuple[int, int]] = (0, -1)

PROMPT_TEMPLATE: Final = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
"""Search-R1's instruction template, verbatim (``as your want`` included)."""

_TAGS: Final = ("think", "search", "information", "answer")
_TAG_SPLIT = re.compile(r"(</?(?:think|search|information|answer)>)")
_TAG = re.compile(r"</?(?:think|search|information|answer)>")
_CONTENT_STATES: Final = frozenset({"in_think", "in_search", "in_information", "in_answer"})
_TRANSITIONS: Final[dict[tuple[str, str], str]] = {
    (THINK_OPEN, "start"): "in_think",
    (THINK_OPEN, "information"): "in_think",
    (THINK_CLOSE, "in_think"): "after_think",
    (SEARCH_OPEN, "after_think"): "in_search",
    (SEARCH_CLOSE, "in_search"): "after_search",
    (INFORMATION_OPEN, "after_search"): "in_information",
    (INFORMATION_CLOSE, "in_information"): "information",
    (ANSWER_OPEN, "after_think"): "in_answer",
    (ANSWER_CLOSE, "in_answer"): "end",
}


class SearchR1ParseError(ValueError):
    """A completion that violates the Search-R1 format; ``reason`` says where."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Round:
    """One ``<think>`` block and the search that followed it (``query``/``information`` None for the last).

    ``information`` is unescaped (what the retriever returned).
    """

    think: str
    query: str | None = None
    information: str | None = None


@dataclass(frozen=True)
class SearchR1Trajectory:
    """The rounds of a well-formed completion and its answer."""

    rounds: tuple[Round, ...]
    answer: str

    @property
    def queries(self) -> tuple[str, ...]:
        """The search queries, in order."""
        return tuple(r.query for r in self.rounds if r.query is not None)

    @property
    def n_steps(self) -> int:
        """Number of ``<think>`` rounds."""
        return len(self.rounds)

    @property
    def retrieval_count(self) -> int:
        """Number of searches."""
        return len(self.queries)


# ------------------------------------------------------------------------------------------- prompt


def normalize_question(question: str) -> str:
    """Strip and end with ``?``, as Search-R1's preprocessing does."""
    question = question.strip()
    if question and not question.endswith("?"):
        question += "?"
    return question


def render_prompt(question: str) -> list[dict[str, str]]:
    """Chat messages for one question: the template as the single user message."""
    return [{"role": "user", "content": PROMPT_TEMPLATE.format(question=normalize_question(question))}]


# --------------------------------------------------------------------------------------- generation


def initial_prefix() -> str:
    """Nothing: the model opens its first ``<think>`` itself."""
    return ""


def last_query(transcript: str) -> str | None:
    """The stripped text of the last ``<search>…</search>``; None if there is none."""
    return last_between(transcript, SEARCH_OPEN, SEARCH_CLOSE)


def after_search(docs_text: str) -> str:
    """What follows a ``</search>`` boundary; ``docs_text`` must already be escaped (:func:`format_documents`)."""
    return f"\n\n{INFORMATION_OPEN}{docs_text}{INFORMATION_CLOSE}\n\n"


def count_searches(transcript: str) -> int:
    """Number of searches issued so far (``</search>`` tags; retrieved text is escaped and has none)."""
    return transcript.count(SEARCH_CLOSE)


def forced_answer_prefix() -> str:
    """What the engine writes instead of executing a search beyond the budget; generation then stops at
    ``</answer>``."""
    return f"\n\n{ANSWER_OPEN}"


# ------------------------------------------------------------------------------------ format check


def _fail(reason: str) -> NoReturn:
    raise SearchR1ParseError(reason)


def _scan(text: str) -> SearchR1Trajectory:
    """Search-R1's ``is_valid_sequence``, collecting the rounds on the way."""
    for tag in _TAGS:
        opened, closed = text.count(f"<{tag}>"), text.count(f"</{tag}>")
        if opened != closed:
            _fail(f"unbalanced <{tag}>: {opened} opening vs {closed} closing tags")
    state = "start"
    rounds: list[Round] = []
    think: str | None = None
    query: str | None = None
    answer = ""
    for part in _TAG_SPLIT.split(text):
        if not part.strip():
            continue
        if _TAG.fullmatch(part):
            following = _TRANSITIONS.get((part, state))
            if following is None:
                _fail(f"unexpected tag {part} in state {state}")
            state = following
            if part == THINK_OPEN:
                think = ""
            continue
        if state not in _CONTENT_STATES:
            _fail(f"unexpected content {part.strip()[:40]!r} in state {state}")
        content = part.strip()
        if state == "in_think":
            think = content
        elif state == "in_search":
            query = content
        elif state == "in_information":
            rounds.append(Round(think or "", query or "", unescape_retrieved(content)))
            think, query = None, None
        else:
            answer = content
    if state != "end":
        _fail(f"incomplete sequence, ended in state {state}")
    rounds.append(Round(think or ""))
    return SearchR1Trajectory(rounds=tuple(rounds), answer=answer)


def is_valid_format(text: str) -> bool:
    """Search-R1's structure check on a completion (see the module notes)."""
    try:
        _scan(text)
    except SearchR1ParseError:
        return False
    return True


def check_format(text: str) -> tuple[int, int]:
    """``(1, N)`` for a well-formed completion (``N`` think rounds), else ``(0, -1)``."""
    try:
        trajectory = _scan(text)
    except SearchR1ParseError:
        return FORMAT_FAILURE
    return 1, trajectory.n_steps


def parse(text: str) -> SearchR1Trajectory:
    """Rounds (queries, unescaped information) and answer; raises :class:`SearchR1ParseError` exactly when
    :func:`is_valid_format` is False.

    Empty blocks are accepted, as by Search-R1's check: an empty ``<information></information>`` (a search
    whose information was never filled) parses to ``information=""``.
    """
    return _scan(text)


def extract_answer(text: str) -> str | None:
    """Lenient: the stripped content of the last complete ``<answer>…</answer>``, or None.

    Search-R1 takes the last match too (its prompt contains an example answer); here only the completion is
    searched, and escaped retrieved text cannot contain a literal ``<answer>``.
    """
    return last_between(text, ANSWER_OPEN, ANSWER_CLOSE)

# ------------------------------------------------------------------------------------------ engine adapter

_BOUNDARIES: Final[dict[str, Boundary]] = {SEARCH_CLOSE: "search", ANSWER_CLOSE: "answer"}


@dataclass(frozen=True)
class SearchR1Adapter:
    """Search-R1 think/search/information/answer (:mod:`prorag.protocol.search_r1`); steps are searches."""

    name: str = "search_r1"
    stop_strings: tuple[str, ...] = STOP_STRINGS
    step_on_search: bool = True

    def messages(self, question: str) -> list[dict[str, str]]:
        return render_prompt(question)

    def initial_prefix(self) -> str:
        return initial_prefix()

    def boundary(self, stop: str, completion: str) -> Boundary | None:
        return _BOUNDARIES.get(stop)

    def query(self, transcript: str) -> str:
        return last_query(transcript) or ""

    def insertion(self, docs_text: str) -> str:
        return after_search(docs_text)

    def after_step(self, step_index: int, budget: int) -> str:
        return ""  # Search-R1 has no step-closing boundary

    def forced_answer(self, transcript: str) -> str:
        return forced_answer_prefix()

    def check_format(self, completion: str) -> tuple[int, int]:
        return check_format(completion)

    def steps(self, completion: str) -> list[StepDict] | None:
        try:
            trajectory = parse(completion)
        except SearchR1ParseError:
            return None
        return [
            {"kind": "search" if item.query is not None else "non_search", "reasoning": item.think,
             "query": item.query, "context": item.information, "conclusion": None}
            for item in trajectory.rounds
        ]

    def extract_answer(self, completion: str) -> str | None:
        return extract_answer(completion)

    def label_pieces(self, completion: str) -> list[tuple[str, bool]]:
        """Engine-inserted: each ``<information>…</information>`` block with its surrounding newlines."""
        return split_inserted(completion, self)
