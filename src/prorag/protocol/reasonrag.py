"""ReasonRAG protocol (Zhang et al., 2025, §2.4, Algorithm 1, Appendix F): Reasoning → Grounding → … → Terminal.

Three stages, each one model generation (a *round* of Algorithm 1):

* **Reasoning** — the model reasons and ends with ``So the next query is <query>q</query>`` (query generation)
  or ``So the answer is <answer>a</answer>`` (answer generation → Terminal);
* **Grounding** — after a query the engine retrieves, inserts the escaped documents and opens the evidence
  span; the model writes the evidence it extracts and closes it (evidence extraction), back to Reasoning;
* **Terminal** — the answer has been written.

One completion (the engine's transcript, what MCTS nodes extend and what DPO prompts contain)::

    … So the next query is <query>q</query>
    <documents>
    Doc 1(Title: …) …            ← inserted, escaped with prorag.protocol.escaping
    </documents>
    Based on the query, the relevant evidence is <evidence>e</evidence>
    … So the answer is <answer>a</answer>

Choices where the paper leaves room or the engine contract constrains:

* The paper switches the *system prompt* by stage (eq. 2/4: ``p_stage``). The adapter contract has one
  ``messages(question)`` per trajectory, so the system prompt holds both Appendix F prompts (Figure 12 for
  Reasoning, Figure 13 for Grounding); the stage is marked in the transcript by the inserted ``<documents>``
  block and the opened ``<evidence>`` (Figure 13's own response prefix). MCTS and DPO use the same text, so
  training prompts equal inference prompts.
* The round limit ``N`` of Algorithm 1 maps to the engine's step budget ``B = (N - 1) // 2`` evidence steps
  (:func:`step_budget_for_rounds`): a query–evidence cycle is two rounds, the answer one, so ``2B + 1 ≤ N``.
  Algorithm 1 returns the unfinished ``y`` after ``N`` rounds; the engine (as for every protocol) appends the
  forced answer ``So the answer is <answer>`` instead, as the anchor code's last-round answer generation does.
* :func:`check_format` returns ``(1, S)`` with ``S`` the number of *steps* (search cycles plus the answer step,
  the length of :meth:`ReasonRAGAdapter.steps`), ``(0, -1)`` on any violation; :func:`rounds` counts rounds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from prorag.protocol.base import Boundary, StepDict, split_inserted
from prorag.protocol.escaping import escape_retrieved, unescape_retrieved
from prorag.protocol.markup import last_between

QUERY_OPEN: Final = "<query>"
QUERY_CLOSE: Final = "</query>"
EVIDENCE_OPEN: Final = "<evidence>"
EVIDENCE_CLOSE: Final = "</evidence>"
ANSWER_OPEN: Final = "<answer>"
ANSWER_CLOSE: Final = "</answer>"
DOCUMENTS_OPEN: Final = "<documents>"
DOCUMENTS_CLOSE: Final = "</documents>"
PROTOCOL_TAGS: Final = (QUERY_OPEN, QUERY_CLOSE, EVIDENCE_OPEN, EVIDENCE_CLOSE, ANSWER_OPEN, ANSWER_CLOSE,
                        DOCUMENTS_OPEN, DOCUMENTS_CLOSE)
STOP_STRINGS: Final = (QUERY_CLOSE, EVIDENCE_CLOSE, ANSWER_CLOSE)
EVIDENCE_PREFIX: Final = "Based on the query, the relevant evidence is "
ANSWER_PREFIX: Final = "So the answer is "
QUERY_PREFIX: Final = "So the next query is "
FORMAT_FAILURE: Final = (0, -1)

Stage = Literal["reasoning", "grounding", "terminal"]
Action = Literal["query", "evidence", "answer"]

# Appendix F, Figure 12 (Reasoning), with the anchor code's answer placeholder "answer".
REASONING_PROMPT: Final = (
    "You are a question-answering assistant with access to a retrieval tool. Your goal is to provide a concise "
    "and accurate reasoning process.\n"
    "Instructions:\n"
    "* Error Reflection: If errors exist in previous thoughts, identify and correct them. Skip this step if no "
    "errors are present.\n"
    "* Information Sufficiency: Evaluate whether the current information is sufficient to fully and accurately "
    "answer the question. If additional retrieval is needed, deconstruct the question and generate the next "
    "query. Avoid repeating previous queries. If no meaningful new query can be generated, explain why and "
    "provide an answer based on the current information.\n"
    "* Conciseness: Ensure both queries and answers are concise, using nouns or short phrases whenever possible.\n"
    "* Conclusion:\n"
    'If generating an answer: "So the answer is <answer>answer</answer>".\n'
    'If more retrieval is needed: "So the next query is <query>query</query>".'
)
# Appendix F, Figure 13 (Grounding / evidence extraction).
GROUNDING_PROMPT: Final = (
    "You are an information retrieval assistant. Your task is to extract relevant evidence from the provided "
    "Wikipedia documents based on the latest query.\n"
    "Instructions:\n"
    "* Identify key terms or concepts in the query.\n"
    "* Search the documents for evidence that supports the query.\n"
    "* Response format: If relevant evidence is found, output: Based on the query, the relevant evidence is "
    "<evidence>evidence</evidence>. If no relevant evidence is found, output: <evidence>None</evidence>."
)
SYSTEM_PROMPT: Final = (
    f"{REASONING_PROMPT}\n\n"
    f"After each query, the retrieved documents appear between {DOCUMENTS_OPEN} and {DOCUMENTS_CLOSE}. "
    f"Then:\n{GROUNDING_PROMPT}\n"
    "After the evidence, continue reasoning as above."
)
# Worked examples for small policies (``few_shot=True``): a two-hop question of MuSiQue's *train* split
# (2hop__639451_47353 in data/01_raw/qa/musique_train.jsonl, its supporting paragraphs quoted), written in this
# transcript format, and an invented direct answer. The paper's prompt has none ("no extra prompt design is
# needed"); its own case (Appendix B) is a 2WikiMultihopQA dev question and stays out of every prompt.
FEW_SHOT_EXAMPLES: Final = (
    "Example 1\nQuestion: Who played the It'll Be Me singer in Walk the Line?\n"
    "So the next query is <query>singer of It'll Be Me</query>\n"
    "<documents>\nDoc 1(Title: It'll Be Me (Jerry Lee Lewis song)) \"It'll Be Me\" is a song written by Jack "
    "Clement, first released in April 1957 by Jerry Lee Lewis.\n</documents>\n"
    "Based on the query, the relevant evidence is <evidence>It'll Be Me was first released by Jerry Lee Lewis."
    "</evidence>\n"
    "So the next query is <query>actor who played Jerry Lee Lewis in Walk the Line</query>\n"
    "<documents>\nDoc 1(Title: Waylon Payne) Waylon Malloy Payne (born April 5, 1972) is an American country "
    "singer, songwriter, musician and actor. He played Jerry Lee Lewis in Walk the Line.\n</documents>\n"
    "Based on the query, the relevant evidence is <evidence>Waylon Payne played Jerry Lee Lewis in Walk the Line."
    "</evidence>\n"
    "So the answer is <answer>Waylon Payne</answer>\n\n"
    "Example 2\nQuestion: What is the capital of France?\n"
    "This is well known. So the answer is <answer>Paris</answer>"
)
# Appendix F, Figure 14 (process evaluation, eq. 6).
PROCESS_EVALUATION_PROMPT: Final = (
    "An agent is tasked with answering a question using a retrieval tool. Critically assess its intermediate "
    "reasoning process to determine if it leads to the correct answer. Identify all flaws, inconsistencies, and "
    "mistakes in the thought process. Every imperfection, no matter how small, must be acknowledged. Evaluate how "
    "effectively the reasoning supports the final answer and the overall accuracy of the response. Ensure the "
    "evaluation is extremely harsh, leaving no leniency. Even if the answer seems close to correct, do not award "
    "full marks to maintain strict grading standards. Assign a score between [0, 1] based on the severity of "
    "flaws and the reasoning's accuracy in leading to the golden answer. Respond briefly and conclude with: So "
    "the score is [Score]."
)

_TAG_RE: Final = re.compile("|".join(re.escape(tag) for tag in PROTOCOL_TAGS))


# "So the score is s" with s bare, bracketed or in markdown (`[0.88]`, `**88**`), optionally "s%", "s/100" or "s out
# of 10"; a sentence period may follow. A number that runs on (`1,000`, `1.5.3`) or a range (`0.5-0.7`) is no score.
_SCORE_RE: Final = re.compile(
    r"the\s+(?:final\s+)?score\s+is\s*[:=]?\s*[\[(*_\"'`$]*\s*(?P<value>\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*(?P<percent>%)|\s*(?:/|out\s+of)\s*(?P<scale>\d+(?:\.\d+)?))?"
    r"(?!\d|[.,]\d|\s*[-\u2013]\s*\d)",
    re.IGNORECASE)


def process_evaluation_messages(question: str, golden_answers: tuple[str, ...] | list[str],
                                process: str) -> list[dict[str, str]]:
    """Eq. 6's input ``(x, y_1:t, answer, p_eval)`` as chat messages: Figure 14 as the system prompt, then the
    question, the golden answer(s) and the agent's intermediate process (the paper does not print the layout)."""
    answers = " | ".join(answer.strip() for answer in golden_answers)
    user = (f"Question: {question.strip()}\nGolden answer: {answers}\n"
            f"Intermediate reasoning process:\n{process.strip()}")
    return [{"role": "system", "content": PROCESS_EVALUATION_PROMPT}, {"role": "user", "content": user}]


def parse_process_score(reply: str | None) -> float | None:
    """The score in [0, 1] of a Figure 14 reply's last ``So the score is s``; None (unknown) without one.

    Figure 14 asks for a score in [0, 1], but the paper's own judge replies (Appendix B: "So the score is 15.",
    "So the score is **88**.") use 0-100, so a bare ``s`` in (1, 100] is read as s/100; ``s%`` and ``s/n`` (``s
    out of n``) are read as such. Anything else, a negative number, one above 100, or above its own ``n``, is
    unknown, never a score."""
    if not reply:
        return None
    matches = list(_SCORE_RE.finditer(reply))
    if not matches:
        return None
    found = matches[-1]
    value = float(found["value"])
    if found["percent"]:
        scale = 100.0
    elif found["scale"]:
        scale = float(found["scale"])
    else:
        scale = 1.0 if value <= 1.0 else 100.0
    return value / scale if scale > 0 and 0.0 <= value <= scale else None


class ReasonRAGParseError(ValueError):
    """A completion that violates the ReasonRAG format; ``reason`` says where."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Round:
    """One model generation: ``action`` with its free ``reasoning`` text and the tag ``content``; a query round
    also carries the (unescaped) ``documents`` inserted after it."""

    action: Action
    reasoning: str
    content: str
    documents: str | None = None


@dataclass(frozen=True)
class Trajectory:
    """A parsed, complete ReasonRAG completion."""

    rounds: tuple[Round, ...]

    @property
    def answer(self) -> str:
        return self.rounds[-1].content


def render_prompt(question: str, *, few_shot: bool = False) -> list[dict[str, str]]:
    """The chat messages: the Appendix F system prompt(s) (plus :data:`FEW_SHOT_EXAMPLES` when ``few_shot``) and
    ``Question: …`` (the anchor code's user turn)."""
    system = f"{SYSTEM_PROMPT}\n\n{FEW_SHOT_EXAMPLES}" if few_shot else SYSTEM_PROMPT
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Question: {question.strip()}"}]


def after_query(docs_text: str) -> str:
    """What follows ``</query>``: the escaped documents and the opened evidence span (Figure 13's prefix).

    ``docs_text`` must already be escaped (:func:`prorag.protocol.hiprag.format_documents` or
    :func:`~prorag.protocol.escaping.escape_retrieved`).
    """
    return f"\n{DOCUMENTS_OPEN}\n{docs_text}\n{DOCUMENTS_CLOSE}\n{EVIDENCE_PREFIX}{EVIDENCE_OPEN}"


def after_evidence() -> str:
    """What follows ``</evidence>``: a new line, then the next Reasoning round."""
    return "\n"


def forced_answer_prefix() -> str:
    """Appended when the round limit is reached in the Reasoning stage: the model only writes the answer."""
    return f"{ANSWER_PREFIX}{ANSWER_OPEN}"


def step_budget_for_rounds(max_rounds: int) -> int:
    """Evidence steps allowed by Algorithm 1's round limit ``N`` (each cycle is 2 rounds, the answer 1)."""
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 3:
        raise ValueError(f"the round limit N must be an int >= 3 (one query, its evidence, the answer), "
                         f"got {max_rounds!r}")
    return (max_rounds - 1) // 2


def classify_action(text: str, stage: Stage) -> tuple[Action, str] | None:
    """The action and tag content of one generated round in ``stage``; None when it is malformed.

    Reasoning: free text (no protocol tag) then ``<query>q</query>`` or ``<answer>a</answer>`` ending the text;
    Grounding: the evidence (no tag) ending with ``</evidence>`` (the engine opened ``<evidence>``).
    Contents must be non-empty after stripping.
    """
    tags = [(match.start(), match.group(0)) for match in _TAG_RE.finditer(text)]
    if stage == "grounding":
        if [tag for _, tag in tags] != [EVIDENCE_CLOSE] or not text.endswith(EVIDENCE_CLOSE):
            return None
        content = text[: -len(EVIDENCE_CLOSE)].strip()
        return ("evidence", content) if content else None
    if stage != "reasoning" or len(tags) != 2:
        return None
    (open_at, open_tag), (_, close_tag) = tags
    pair = {QUERY_OPEN: (QUERY_CLOSE, "query"), ANSWER_OPEN: (ANSWER_CLOSE, "answer")}.get(open_tag)
    if pair is None or close_tag != pair[0] or not text.endswith(close_tag):
        return None
    content = text[open_at + len(open_tag): -len(close_tag)].strip()
    return (pair[1], content) if content else None  # type: ignore[return-value]


def parse(text: str) -> Trajectory:
    """Parse a complete completion; raises :class:`ReasonRAGParseError` (never anything else) on a violation."""
    text = text.replace("\r\n", "\n")
    tokens = [(match.start(), match.end(), match.group(0)) for match in _TAG_RE.finditer(text)]
    rounds: list[Round] = []
    cursor = 0
    index = 0

    def take(expected: str, where: str) -> tuple[int, int]:
        nonlocal index
        if index >= len(tokens) or tokens[index][2] != expected:
            found = tokens[index][2] if index < len(tokens) else "the end"
            raise ReasonRAGParseError(f"{where}: expected {expected!r}, found {found!r}")
        start, end, _ = tokens[index]
        index += 1
        return start, end

    while True:
        if index >= len(tokens):
            raise ReasonRAGParseError("the completion has no <answer>")
        start, end, tag = tokens[index]
        reasoning = text[cursor:start].strip()
        if tag == ANSWER_OPEN:
            index += 1
            close_start, close_end = take(ANSWER_CLOSE, "answer")
            answer = text[end:close_start].strip()
            if not answer:
                raise ReasonRAGParseError("empty answer")
            if text[close_end:].strip():
                raise ReasonRAGParseError("text after </answer>")
            rounds.append(Round("answer", reasoning, answer))
            return Trajectory(tuple(rounds))
        if tag != QUERY_OPEN:
            raise ReasonRAGParseError(f"round {len(rounds) + 1}: expected <query> or <answer>, found {tag!r}")
        index += 1
        close_start, close_end = take(QUERY_CLOSE, "query")
        query = text[end:close_start].strip()
        if not query:
            raise ReasonRAGParseError("empty query")
        docs_start, docs_end = take(DOCUMENTS_OPEN, "after </query>")
        if text[close_end:docs_start].strip():
            raise ReasonRAGParseError("text between </query> and <documents>")
        docs_close_start, docs_close_end = take(DOCUMENTS_CLOSE, "documents")
        documents = unescape_retrieved(text[docs_end:docs_close_start].strip("\n"))
        evidence_start, evidence_end = take(EVIDENCE_OPEN, "after </documents>")
        evidence_close_start, evidence_close_end = take(EVIDENCE_CLOSE, "evidence")
        evidence = text[evidence_end:evidence_close_start].strip()
        if not evidence:
            raise ReasonRAGParseError("empty evidence")
        rounds.append(Round("query", reasoning, query, documents))
        rounds.append(Round("evidence", text[docs_close_end:evidence_start].strip(), evidence))
        cursor = evidence_close_end


def check_format(text: str) -> tuple[int, int]:
    """``(1, S)`` for a well-formed completion with ``S`` steps (searches + the answer step), else ``(0, -1)``."""
    try:
        trajectory = parse(text)
    except ReasonRAGParseError:
        return FORMAT_FAILURE
    return 1, sum(item.action != "evidence" for item in trajectory.rounds)


def render(steps: Sequence[StepDict], answer: str) -> str:
    """A gold transcript in the engine's layout, as concise as Figure 12 asks: each search step a Reasoning round
    ``So the next query is <query>q</query>``, the documents (``context``, unescaped, escaped here) and its
    conclusion as the evidence; then ``So the answer is <answer>a</answer>``. The planners' reasoning prose (and the
    non-search steps) are left out: a round then opens exactly as the MCTS's action leads open it."""
    text = ""
    for step in steps:
        if step["kind"] != "search":
            continue
        text += f"{QUERY_PREFIX}{QUERY_OPEN}{step['query']}{QUERY_CLOSE}"
        text += after_query(escape_retrieved(step["context"] or "")) + f"{step['conclusion']}{EVIDENCE_CLOSE}"
        text += after_evidence()
    return text + f"{ANSWER_PREFIX}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def rounds(text: str) -> int:
    """Algorithm 1's rounds of a well-formed completion (queries + evidences + 1), -1 when it is malformed."""
    try:
        return len(parse(text).rounds)
    except ReasonRAGParseError:
        return -1


def last_query(transcript: str) -> str | None:
    """The stripped content of the last complete ``<query>…</query>``."""
    return last_between(transcript, QUERY_OPEN, QUERY_CLOSE)


def extract_answer(text: str) -> str | None:
    """The stripped content of the last complete ``<answer>…</answer>`` (a passage cannot supply it: escaped)."""
    return last_between(text, ANSWER_OPEN, ANSWER_CLOSE)


# ------------------------------------------------------------------------------------------ engine adapter

_BOUNDARIES: Final[dict[str, Boundary]] = {QUERY_CLOSE: "search", EVIDENCE_CLOSE: "step", ANSWER_CLOSE: "answer"}


@dataclass(frozen=True)
class ReasonRAGAdapter:
    """ReasonRAG for the rollout engine: the step budget counts evidence steps (see
    :func:`step_budget_for_rounds` for Algorithm 1's ``N``); ``few_shot`` adds two worked examples to the prompt."""

    few_shot: bool = False
    name: str = "reasonrag"
    stop_strings: tuple[str, ...] = STOP_STRINGS
    step_on_search: bool = False

    def messages(self, question: str) -> list[dict[str, str]]:
        return render_prompt(question, few_shot=self.few_shot)

    def initial_prefix(self) -> str:
        return ""

    def boundary(self, stop: str, completion: str) -> Boundary | None:
        """A query or an answer closed inside the evidence span the engine opened (Grounding stage, where
        Algorithm 1 allows only the evidence) is ``malformed``, not a search: no retrieval, and the trajectory
        ends as a format failure."""
        boundary = _BOUNDARIES.get(stop)
        if boundary in ("search", "answer") and completion.rfind(EVIDENCE_OPEN) > completion.rfind(EVIDENCE_CLOSE):
            return "malformed"
        return boundary

    def query(self, transcript: str) -> str:
        return last_query(transcript) or ""

    def insertion(self, docs_text: str) -> str:
        return after_query(docs_text)

    def after_step(self, step_index: int, budget: int) -> str:
        return after_evidence()

    def forced_answer(self, transcript: str) -> str:
        return forced_answer_prefix()

    def check_format(self, completion: str) -> tuple[int, int]:
        return check_format(completion)

    def steps(self, completion: str) -> list[StepDict] | None:
        """Search steps (query, documents, evidence as the conclusion) and the final answer step."""
        try:
            trajectory = parse(completion)
        except ReasonRAGParseError:
            return None
        steps: list[StepDict] = []
        for position, item in enumerate(trajectory.rounds):
            if item.action == "query":
                evidence = trajectory.rounds[position + 1]
                steps.append({"kind": "search", "reasoning": item.reasoning, "query": item.content,
                              "context": item.documents, "conclusion": evidence.content})
            elif item.action == "answer":
                steps.append({"kind": "non_search", "reasoning": item.reasoning, "query": None, "context": None,
                              "conclusion": item.content})
        return steps

    def extract_answer(self, completion: str) -> str | None:
        return extract_answer(completion)

    def label_pieces(self, completion: str) -> list[tuple[str, bool]]:
        """Engine-inserted: each documents block with the opened evidence span, and the new line after each
        ``</evidence>``."""
        return split_inserted(completion, self, (EVIDENCE_CLOSE, after_evidence()))

    def render(self, steps: Sequence[StepDict], answer: str) -> str:
        """A gold transcript from steps (``context`` unescaped) and the answer (:func:`render`)."""
        return render(steps, answer)
