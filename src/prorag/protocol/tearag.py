"""TeaRAG reasoning-step protocol (paper §4.2, Fig. 4a).

A TeaRAG reasoning step is *key entities → subquery → hybrid retrieval → summary* (§4.2.1–4.2.6); after each
step the model either starts another step or writes the final answer (§4.2.7). A completion (the first step of
:data:`EXAMPLE_COMPLETION`, a MuSiQue *train* question; the paper's Table 11 case study is a 2WikiMultihopQA dev
question and appears nowhere in the code) is::

    <step>
    <entities>Greenfield-Central High School</entities>
    <subquery>In which state is Greenfield-Central High School?</subquery>
    <Reference>
    Doc 1(Title: …) …                 (written by the engine, escaped; KAG/PPR output of the ``kag`` retriever)
    </Reference>
    <summary>…</summary>
    </step>
    <step> … </step>
    <answer>3 a.m.</answer>

Deviations from the paper's rendering, both forced by a stop-string engine: the paper writes the fields as
labelled lines ("Important entity: …", "Subquery: …", "Summary: …", "Final answer: …"); a line end cannot be a
stop string, so each model-written field is closed by a tag (``</subquery>`` runs the retrieval, ``</summary>``
closes the step, ``</answer>`` ends the path) and the "Final answer:" prefix of §4.2.7 becomes ``<answer>``.
The retrieved context is wrapped in ``<Reference>…</Reference>`` exactly as in §4.2.5, and escaped with
:mod:`prorag.protocol.escaping` (an escaped passage holds no ``<``, so no protocol tag).

Several key entities are written separated by ``"; "`` (:data:`ENTITY_SEPARATOR`). Every path has at least one
step (the engine's initial prefix opens it): TeaRAG always retrieves before answering.

Format check (eq. 6's ``r_f``): the completion is one or more steps, each holding exactly the four blocks in
order with only white space between them, then one ``<answer>`` and nothing after it; every model-written field
is non-empty and contains no protocol tag. :func:`check_format` returns ``(1, T)`` or ``(0, -1)`` like HiPRAG's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NoReturn

from prorag.protocol import hiprag
from prorag.protocol.base import Boundary, StepDict, split_inserted
from prorag.protocol.escaping import escape_retrieved, unescape_retrieved
from prorag.protocol.markup import last_between

STEP_OPEN: Final = "<step>"
STEP_CLOSE: Final = "</step>"
ENTITIES_OPEN: Final = "<entities>"
ENTITIES_CLOSE: Final = "</entities>"
SUBQUERY_OPEN: Final = "<subquery>"
SUBQUERY_CLOSE: Final = "</subquery>"
REFERENCE_OPEN: Final = "<Reference>"
REFERENCE_CLOSE: Final = "</Reference>"
SUMMARY_OPEN: Final = "<summary>"
SUMMARY_CLOSE: Final = "</summary>"
ANSWER_OPEN: Final = "<answer>"
ANSWER_CLOSE: Final = "</answer>"
ENTITY_SEPARATOR: Final = "; "

PROTOCOL_TAGS: Final[tuple[str, ...]] = (
    STEP_OPEN, STEP_CLOSE, ENTITIES_OPEN, ENTITIES_CLOSE, SUBQUERY_OPEN, SUBQUERY_CLOSE, REFERENCE_OPEN,
    REFERENCE_CLOSE, SUMMARY_OPEN, SUMMARY_CLOSE, ANSWER_OPEN, ANSWER_CLOSE,
)
"""Every tag of the format; none may occur in a model-written field."""

STOP_STRINGS: Final[tuple[str, ...]] = (SUBQUERY_CLOSE, SUMMARY_CLOSE, ANSWER_CLOSE)
"""Generation boundaries: retrieve after the subquery, close the step after the summary, stop at the answer."""

FORMAT_FAILURE: Final[tuple[int, int]] = (0, -1)


class TeaRAGParseError(ValueError):
    """A completion that violates the TeaRAG format; ``reason`` says which rule."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TeaRAGStep:
    """One reasoning step ``s_t = (E_t, q_t, c_t, o_t)``: key entities, subquery, context (unescaped), summary."""

    entities: tuple[str, ...]
    subquery: str
    context: str
    summary: str


@dataclass(frozen=True)
class TeaRAGPath:
    """``P = {s_1, …, s_T}`` and the final answer ``a``."""

    steps: tuple[TeaRAGStep, ...]
    answer: str

    @property
    def n_steps(self) -> int:
        """``T``, the number of reasoning steps."""
        return len(self.steps)


# ------------------------------------------------------------------------------------------- prompt

INSTRUCTIONS: Final = (
    "Answer the question by reasoning in steps, retrieving knowledge at each step. Each step is wrapped in "
    "<step></step> and does four things in order: (1) name the key entities the step is about in "
    "<entities></entities> (several are separated by '; '); (2) write the subquery to solve now, built around "
    "those entities, in <subquery></subquery>; (3) the system then retrieves documents and knowledge triplets "
    "and gives them to you between <Reference> and </Reference>; (4) summarize in <summary></summary> the "
    "supporting facts you found and the answer to the subquery. After a step, start another step if the "
    "information is not yet sufficient; otherwise write the final answer, a short phrase, in <answer></answer>. "
    "Use as few steps as the question needs."
)

EXAMPLE_QUESTION: Final = "What time does the state where Greenfield-Central High is stop selling booze?"
EXAMPLE_COMPLETION: Final = (
    "<step>\n<entities>Greenfield-Central High School</entities>\n"
    "<subquery>In which state is Greenfield-Central High School?</subquery>\n<Reference>\n"
    "Doc 1(Title: Greenfield-Central High School) Greenfield-Central High School is a secondary school located "
    "in the city of Greenfield, Indiana.\n"
    "Doc 2(Title: Greenfield-Central High School) Greenfield-Central High School | located in | Indiana\n"
    "</Reference>\n"
    "<summary>The triplet (Greenfield-Central High School, located in, Indiana) shows the state is Indiana."
    "</summary>\n</step>\n"
    "<step>\n<entities>Indiana</entities>\n"
    "<subquery>When do stores stop selling alcohol in Indiana?</subquery>\n<Reference>\n"
    "Doc 1(Title: Alcohol laws of Indiana) In Indiana, alcohol may be sold only to those 21 years of age or older "
    "during the hours 7 a.m. to 3 a.m.\n</Reference>\n"
    "<summary>Alcohol may be sold in Indiana from 7 a.m. to 3 a.m., so sales stop at 3 a.m.</summary>\n"
    "</step>\n<answer>3 a.m.</answer>"
)
"""A two-hop question of MuSiQue's *train* split (2hop__129962_69002 in data/01_raw/qa/musique_train.jsonl, its
supporting paragraphs quoted) in this format. The paper's case study (Table 11) is a 2WikiMultihopQA dev question
and stays out of every prompt."""


def system_prompt(*, few_shot: bool = True) -> str:
    """The instruction, with the worked example (:data:`EXAMPLE_COMPLETION`) when ``few_shot``."""
    if not few_shot:
        return INSTRUCTIONS
    return f"{INSTRUCTIONS}\n\nExample\nQuestion: {EXAMPLE_QUESTION}\nOutput:\n{EXAMPLE_COMPLETION}"


def render_prompt(question: str, *, few_shot: bool = True) -> list[dict[str, str]]:
    """Chat messages (system + user) for one question."""
    return [{"role": "system", "content": system_prompt(few_shot=few_shot)},
            {"role": "user", "content": f"Question: {question.strip()}"}]


# ------------------------------------------------------------------------------------ engine pieces


def initial_prefix() -> str:
    """What the engine writes before the first generation: the first step is opened, entities first."""
    return f"{STEP_OPEN}\n{ENTITIES_OPEN}"


def after_subquery(docs_text: str) -> str:
    """What follows ``</subquery>``: the escaped context in ``<Reference>`` and the opened summary.

    ``docs_text`` must already be escaped (the engine's documents text or :func:`escape_retrieved`).
    """
    return f"\n{REFERENCE_OPEN}\n{docs_text}\n{REFERENCE_CLOSE}\n{SUMMARY_OPEN}"


def after_summary() -> str:
    """What follows ``</summary>``: the step is closed; the model opens the next step or the answer."""
    return f"\n{STEP_CLOSE}\n"


def forced_answer_prefix() -> str:
    """What the engine writes when the step budget is used up (after :func:`after_summary`)."""
    return ANSWER_OPEN


def split_entities(text: str) -> tuple[str, ...]:
    """Key entities of an ``<entities>`` field: split on ``;``, stripped, empty pieces dropped."""
    return tuple(piece.strip() for piece in text.split(";") if piece.strip())


def last_entities_and_subquery(transcript: str) -> tuple[tuple[str, ...], str]:
    """The key entities and the subquery of the step being written (the last complete blocks)."""
    entities = last_between(transcript, ENTITIES_OPEN, ENTITIES_CLOSE) or ""
    subquery = last_between(transcript, SUBQUERY_OPEN, SUBQUERY_CLOSE) or ""
    return split_entities(entities), subquery


def format_documents(documents: Sequence[tuple[str, str]]) -> str:
    """The engine's numbered, escaped documents (``Doc i(Title: …) …``), so SFT contexts match rollouts."""
    return hiprag.format_documents(documents)


# ------------------------------------------------------------------------------------------- parsing

_BLOCKS: Final[tuple[tuple[str, str, str], ...]] = (
    ("entities", ENTITIES_OPEN, ENTITIES_CLOSE),
    ("subquery", SUBQUERY_OPEN, SUBQUERY_CLOSE),
    ("context", REFERENCE_OPEN, REFERENCE_CLOSE),
    ("summary", SUMMARY_OPEN, SUMMARY_CLOSE),
)


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _block(text: str, position: int, open_tag: str, close_tag: str, what: str) -> tuple[str, int]:
    """The raw content of ``open_tag…close_tag`` starting at ``position`` (after white space) and the end."""
    position = _skip_space(text, position)
    if not text.startswith(open_tag, position):
        _fail(f"{what}: expected {open_tag}")
    start = position + len(open_tag)
    end = text.find(close_tag, start)
    if end == -1:
        _fail(f"{what}: {open_tag} without {close_tag}")
    return text[start:end], end + len(close_tag)


def normalize(text: str) -> str:
    """Canonical newlines (``\\r\\n`` and ``\\r`` → ``\\n``)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _fail(reason: str) -> NoReturn:
    raise TeaRAGParseError(reason)


def _field(name: str, value: str, step: int | None) -> str:
    where = f"step {step}: " if step is not None else ""
    for tag in PROTOCOL_TAGS:
        if tag in value:
            _fail(f"{where}{name} contains the tag {tag}")
    value = value.strip()
    if not value:
        _fail(f"{where}empty {name}")
    return value


def parse(text: str) -> TeaRAGPath:
    """Parse a completion; raises :class:`TeaRAGParseError` (and nothing else) on a format violation.

    Fields are stripped and the context unescaped. Succeeds exactly when :func:`check_format` gives ``(1, T)``.
    """
    if not isinstance(text, str):
        raise TypeError(f"a completion must be a str, got {type(text).__name__}")
    y = normalize(text)  # scanned left to right with str.find: linear time, no regex backtracking
    position = _skip_space(y, 0)
    steps: list[TeaRAGStep] = []
    while y.startswith(STEP_OPEN, position):
        number = len(steps) + 1
        position += len(STEP_OPEN)
        fields: dict[str, str] = {}
        for name, open_tag, close_tag in _BLOCKS:
            fields[name], position = _block(y, position, open_tag, close_tag, f"step {number}")
        position = _skip_space(y, position)
        if not y.startswith(STEP_CLOSE, position):
            _fail(f"step {number}: expected {STEP_CLOSE} after the summary")
        position = _skip_space(y, position + len(STEP_CLOSE))
        entities = split_entities(_field("entities", fields["entities"], number))
        if not entities:
            _fail(f"step {number}: no key entity")
        context = fields["context"]
        for tag in PROTOCOL_TAGS:
            if tag in context:
                _fail(f"step {number}: context contains the tag {tag}")
        steps.append(TeaRAGStep(entities=entities, subquery=_field("subquery", fields["subquery"], number),
                                context=unescape_retrieved(context.strip()),
                                summary=_field("summary", fields["summary"], number)))
    if not steps:
        _fail("no step before the answer")
    answer, end = _block(y, position, ANSWER_OPEN, ANSWER_CLOSE, "answer")
    if y[end:].strip():
        _fail("text after </answer>")
    return TeaRAGPath(steps=tuple(steps), answer=_field("answer", answer, None))


def check_format(text: str) -> tuple[int, int]:
    """``(1, T)`` for a well-formed completion with ``T`` steps, else ``(0, -1)``."""
    try:
        return 1, parse(text).n_steps
    except TeaRAGParseError:
        return FORMAT_FAILURE


def extract_answer(text: str) -> str | None:
    """Lenient: the stripped content of the last complete ``<answer>…</answer>`` (None if there is none)."""
    return last_between(normalize(text), ANSWER_OPEN, ANSWER_CLOSE) or None


def render(path: TeaRAGPath) -> str:
    """Canonical text of a path (contexts escaped); ``parse(render(p)) == p`` for stripped, tag-free fields."""
    if not path.steps:
        raise ValueError("a TeaRAG path needs at least one step")
    parts: list[str] = []
    for step in path.steps:
        entities = ENTITY_SEPARATOR.join(step.entities)
        for name, value in (("entities", entities), ("subquery", step.subquery), ("summary", step.summary)):
            _model_field(name, value)
        parts.append(f"{STEP_OPEN}\n{ENTITIES_OPEN}{entities}{ENTITIES_CLOSE}\n"
                     f"{SUBQUERY_OPEN}{step.subquery}{SUBQUERY_CLOSE}"
                     f"{after_subquery(escape_retrieved(step.context))}{step.summary}{SUMMARY_CLOSE}"
                     f"{after_summary()}")
    _model_field("answer", path.answer)
    return "".join(parts) + f"{ANSWER_OPEN}{path.answer}{ANSWER_CLOSE}"


def _model_field(name: str, value: str) -> None:
    if not value.strip():
        raise ValueError(f"{name} is empty")
    if any(tag in value for tag in PROTOCOL_TAGS):
        raise ValueError(f"{name} contains a protocol tag; model-written text is never escaped")


# ------------------------------------------------------------------------------------------ SFT mask


def completion_pieces(completion: str) -> list[tuple[str, bool]]:
    """Split a rendered completion into ``(text, written_by_policy)`` pieces in order (eq. 4's mask).

    Not trained (``False``): the engine's initial prefix, every retrieval insertion (``\\n<Reference>``, the
    context, ``</Reference>\\n<summary>``: the ``<Reference>`` content is masked as §4.3.1 requires) and every
    ``\\n</step>\\n`` the engine writes after a summary. The completion must have :func:`render`'s layout.
    """
    return split_inserted(completion, TeaRAGAdapter(), (SUMMARY_CLOSE, after_summary()))


# ------------------------------------------------------------------------------------------ engine adapter

_BOUNDARIES: Final[dict[str, Boundary]] = {SUBQUERY_CLOSE: "search", SUMMARY_CLOSE: "step", ANSWER_CLOSE: "answer"}


def encode_retrieval_query(entities: Sequence[str], subquery: str) -> str:
    """One string carrying the key entities and the subquery to the ``kag`` retriever (its own encoding)."""
    from prorag.kg.query import format_kag_query

    return format_kag_query(subquery, list(entities))


@dataclass(frozen=True)
class TeaRAGAdapter:
    """TeaRAG steps (:mod:`prorag.protocol.tearag`); the query carries the key entities for the ``kag`` retriever."""

    few_shot: bool = True
    name: str = "tearag"
    stop_strings: tuple[str, ...] = STOP_STRINGS
    step_on_search: bool = False

    def messages(self, question: str) -> list[dict[str, str]]:
        return render_prompt(question, few_shot=self.few_shot)

    def initial_prefix(self) -> str:
        return initial_prefix()

    def boundary(self, stop: str, completion: str) -> Boundary | None:
        """A second ``</subquery>`` in a step that already has its ``<Reference>``, or a ``</summary>`` before the
        step's retrieval, is ``malformed``: no TeaRAG step holds either (§4.2), so nothing is retrieved and the
        path ends as a format failure instead of looping until the token budget runs out."""
        boundary = _BOUNDARIES.get(stop)
        if boundary in ("search", "step"):
            retrieved = REFERENCE_OPEN in completion[max(completion.rfind(STEP_OPEN), 0):]
            if retrieved == (boundary == "search"):
                return "malformed"
        return boundary

    def query(self, transcript: str) -> str:
        """The key entities and subquery of the open step (empty when the subquery is)."""
        entities, subquery = last_entities_and_subquery(transcript)
        return encode_retrieval_query(entities, subquery) if subquery else ""

    def insertion(self, docs_text: str) -> str:
        return after_subquery(docs_text)

    def after_step(self, step_index: int, budget: int) -> str:
        return after_summary()

    def forced_answer(self, transcript: str) -> str:
        return forced_answer_prefix()

    def check_format(self, completion: str) -> tuple[int, int]:
        return check_format(completion)

    def steps(self, completion: str) -> list[StepDict] | None:
        try:
            path = parse(completion)
        except TeaRAGParseError:
            return None
        return [{"kind": "search", "reasoning": ENTITY_SEPARATOR.join(step.entities), "query": step.subquery,
                 "context": step.context, "conclusion": step.summary} for step in path.steps]

    def extract_answer(self, completion: str) -> str | None:
        return extract_answer(completion)

    def label_pieces(self, completion: str) -> list[tuple[str, bool]]:
        return completion_pieces(completion)

    def render(self, steps: Sequence[StepDict], answer: str) -> str:
        """A gold path from :meth:`steps`-style dicts (``reasoning`` holds the ``"; "``-joined key entities)."""
        return render(TeaRAGPath(tuple(TeaRAGStep(entities=split_entities(step.get("reasoning") or ""),
                                                  subquery=step.get("query") or "", context=step.get("context") or "",
                                                  summary=step.get("conclusion") or "") for step in steps), answer))
