"""HiPRAG parsable-step protocol (paper §3.1, Appendix C Algorithms 1–3, Appendix D Figure 4).

A completion is one ``<think>`` block holding a sequence of ``<step>`` blocks, followed by ``<answer>``::

    <think>
    <step>
    <reasoning>…</reasoning>
    <search>…</search>
    <context>…</context>          (search step only; written by the engine, escaped)
    <conclusion>…</conclusion>
    </step>
    </think>
    <answer>…</answer>

This module gives the system prompt (:data:`SYSTEM_PROMPT`, :func:`render_prompt`), the generation
boundaries of Algorithm 1 (:func:`initial_prefix`, :data:`STOP_STRINGS`, :func:`after_search`,
:func:`after_conclusion`, :func:`close_think`, :func:`forced_answer_prefix`), the format checker of
Algorithms 2–3 (:func:`check_format`), a parser that agrees with it (:func:`parse`), a lenient
:func:`extract_answer`, and :func:`render` (the inverse of :func:`parse`).

Reading of the pseudocode where it is ambiguous (tags are matched literally and case-sensitively):

* ``SPANBETWEEN(s, open, close)`` returns the index where the opening tag starts and the index where the
  closing tag starts (lines 4, 6, 7, 8 and 15 only make sense that way, although Algorithm 2's comment says
  "indices of content"). It fails, and the trajectory is rejected at that line, when the closing tag does not
  follow the opening tag — the "properly nested" postcondition of Algorithm 3. Without this, Algorithm 3
  would accept ``<reasoning>a</search><context>b</reasoning><search>q</context><conclusion>o</conclusion>``.
* The gap checks of Algorithm 3 lines 16 and 21 (``TRIM(s[r_c : q_o])`` …) measure the text between the end
  of the closing tag and the start of the next opening tag; read literally the slice would contain the
  closing tag itself and never be empty.
* ``TRIM`` is :meth:`str.strip`; ``NORMALIZE`` maps ``\\r\\n`` and ``\\r`` to ``\\n``; ``COUNT`` counts
  literal occurrences; ``FINDFROM`` is :meth:`str.find`.
* Lines 10 and 20 of Algorithm 3 test only the *opening* tags ``<search>``/``<context>``, as written. Hence
  line 20 is unreachable (its condition equals line 10's), and a non-search step whose text contains a bare
  ``</search>`` or ``</context>`` is accepted. A step body is the text up to the *first* ``</step>``, so a
  body may contain a literal ``<step>`` inside a field; that is accepted too, as written.
* Algorithm 1 line 8 reads ``LASTBETWEEN(y, <search>, <search>)``; we take it as ``<search>…</search>``
  (:func:`last_query`). Line 20 appends ``</think>`` unconditionally; if the model itself closed the think
  block and wrote the answer (the ``</answer>`` boundary), a second ``</think>`` would always fail Algorithm
  2 line 2, so an engine should append it only when :func:`needs_close_think` says so.
* Algorithm 1 lines 15–16 open a new step after every conclusion while the budget allows, so the model can
  only finish early by closing that open step itself; :func:`after_conclusion` follows the paper, and its
  ``open_next_step=False`` variant lets the model choose between another ``<step>`` and ``</think>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, NoReturn

from prorag.protocol.base import Boundary, StepDict, split_inserted
from prorag.protocol.base import format_documents as format_documents  # re-exported
from prorag.protocol.escaping import escape_retrieved, unescape_retrieved
from prorag.protocol.markup import last_between

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
STEP_OPEN: Final = "<step>"
STEP_CLOSE: Final = "</step>"
REASONING_OPEN: Final = "<reasoning>"
REASONING_CLOSE: Final = "</reasoning>"
SEARCH_OPEN: Final = "<search>"
SEARCH_CLOSE: Final = "</search>"
CONTEXT_OPEN: Final = "<context>"
CONTEXT_CLOSE: Final = "</context>"
CONCLUSION_OPEN: Final = "<conclusion>"
CONCLUSION_CLOSE: Final = "</conclusion>"
ANSWER_OPEN: Final = "<answer>"
ANSWER_CLOSE: Final = "</answer>"

PROTOCOL_TAGS: Final[tuple[str, ...]] = (
    THINK_OPEN,
    THINK_CLOSE,
    STEP_OPEN,
    STEP_CLOSE,
    REASONING_OPEN,
    REASONING_CLOSE,
    SEARCH_OPEN,
    SEARCH_CLOSE,
    CONTEXT_OPEN,
    CONTEXT_CLOSE,
    CONCLUSION_OPEN,
    CONCLUSION_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
)
"""Every tag of the format; none may occur in a model-written field that :func:`render` writes."""

STOP_STRINGS: Final[tuple[str, ...]] = (SEARCH_CLOSE, CONCLUSION_CLOSE, ANSWER_CLOSE)
"""Generation boundaries of Algorithm 1 line 3 (the boundary itself belongs to the generated text)."""

FORMAT_FAILURE: Final[tuple[int, int]] = (0, -1)


# --------------------------------------------------------------------------------------------- errors


class TrajectoryParseError(ValueError):
    """A completion that violates the HiPRAG format; ``reason`` names the algorithm line (``alg3.line12``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# ----------------------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class NonSearchStep:
    """A step answered from parametric knowledge: ``(r_i, o_i)``."""

    reasoning: str
    conclusion: str


@dataclass(frozen=True)
class SearchStep:
    """A step with retrieval: ``(r_i, q_i, c_i, o_i)``.

    ``context`` is the retrieved text, unescaped (what the retriever returned); ``raw_context`` is the text as
    it stands in the trajectory (escaped). ``raw_context`` defaults to ``escape_retrieved(context)`` and takes
    no part in equality.
    """

    reasoning: str
    query: str
    context: str
    conclusion: str
    raw_context: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.raw_context and self.context:
            object.__setattr__(self, "raw_context", escape_retrieved(self.context))


Step = SearchStep | NonSearchStep


@dataclass(frozen=True)
class Trajectory:
    """``T = {s_1, …, s_n, a}``: the steps of one completion and its final answer."""

    steps: tuple[Step, ...]
    answer: str

    @property
    def n_steps(self) -> int:
        """``N(T)``, the number of steps."""
        return len(self.steps)

    @property
    def search_steps(self) -> tuple[SearchStep, ...]:
        """The steps with a search, in order."""
        return tuple(step for step in self.steps if isinstance(step, SearchStep))

    @property
    def non_search_steps(self) -> tuple[NonSearchStep, ...]:
        """The steps without a search, in order."""
        return tuple(step for step in self.steps if isinstance(step, NonSearchStep))

    @property
    def retrieval_count(self) -> int:
        """Number of retriever calls (one per search step)."""
        return len(self.search_steps)


# ------------------------------------------------------------------------------------ Algorithm 1


def initial_prefix() -> str:
    """What the engine appends to the prompt before the first generation (Algorithm 1 line 1)."""
    return f"{THINK_OPEN}\n{STEP_OPEN}\n{REASONING_OPEN}"


def last_query(transcript: str) -> str | None:
    """``LASTBETWEEN(y, <search>, </search>)`` of Algorithm 1 line 8, stripped; None if there is none."""
    return last_between(transcript, SEARCH_OPEN, SEARCH_CLOSE)


def after_search(docs_text: str) -> str:
    """What follows a ``</search>`` boundary (Algorithm 1 line 10).

    ``docs_text`` must already be escaped: the output of :func:`format_documents` or
    :func:`~prorag.protocol.escaping.escape_retrieved`.
    """
    return f"\n{CONTEXT_OPEN}{docs_text}{CONTEXT_CLOSE}\n{CONCLUSION_OPEN}"


def after_conclusion(step_index: int, budget: int, *, open_next_step: bool = True) -> str:
    """What follows a ``</conclusion>`` boundary (Algorithm 1 lines 13–17).

    ``step_index`` is the 1-based index ``i`` of the step just concluded and ``budget`` is ``B``. The next
    step is opened only while ``i + 1 <= B`` (and ``open_next_step``, see the module notes).
    """
    if step_index < 1 or budget < 1:
        raise ValueError(f"step_index and budget must be >= 1, got {step_index} and {budget}")
    suffix = f"\n{STEP_CLOSE}"
    if open_next_step and step_index + 1 <= budget:
        suffix += f"\n{STEP_OPEN}\n{REASONING_OPEN}"
    return suffix


def close_think() -> str:
    """The closing of the think block (Algorithm 1 line 20); append only if :func:`needs_close_think`."""
    return f"\n{THINK_CLOSE}"


def needs_close_think(transcript: str) -> bool:
    """True if the completion does not yet contain ``</think>``."""
    return THINK_CLOSE not in transcript


def forced_answer_prefix() -> str:
    """What precedes the forced final generation (Algorithm 1 line 22), which stops at ``</answer>``."""
    return f"\n{ANSWER_OPEN}"


# --------------------------------------------------------------------------------------- prompt

INSTRUCTIONS: Final = (
    "Answer user questions by thinking step-by-step. Your entire reasoning process must be encapsulated "
    "within a single <think></think> block, which contains one or more <step></step> blocks. Each step must "
    "begin with your analysis in <reasoning>. If you identify a knowledge gap, you may use "
    "<search>query</search> to query a search engine; search results will then be provided in a <context> "
    "tag. Every step must end with a <conclusion> summarizing what you learned in that step. After your "
    "thinking process is complete, provide the final, conclusive answer inside an <answer> tag placed "
    "immediately after the closing </think> tag. You can use as many steps as you need. Ensure all XML tags "
    "are properly formed and nested."
)
"""Figure 4's instruction paragraph, verbatim."""

_OUTPUT_FORMAT: Final = """# Output Format Specification

Your output must follow this overall structure. The <think> block contains all the steps, and the <answer> \
block follows it.

<think>
<step>
...
</step>
<step>
...
</step>
</think>
<answer>Your final, conclusive answer to the user's question.</answer>

# Step Formats (to be used inside <think>)

**Format 1: Step with a Search**

<step>
<reasoning>Your detailed analysis...</reasoning>
<search>The precise search query...</search>
<context>[Provided by system]</context>
<conclusion>Your conclusion for this step.</conclusion>
</step>

**Format 2: Step without a Search (Internal Reasoning)**

<step>
<reasoning>Your detailed analysis...</reasoning>
<conclusion>Your conclusion for this step.</conclusion>
</step>"""

FEW_SHOT_EXAMPLES: Final[tuple[tuple[str, str], ...]] = (
    # MuSiQue *train* 2hop__150763_14904 (data/01_raw/qa/musique_train.jsonl, its supporting paragraph quoted),
    # not the paper's 2WikiMultiHopQA case-study question, which is a test question: 2Wiki stays evaluable.
    (
        "Who was the first president of the association which published Journal of Psychotherapy Integration?",
        """<think>
<step>
<reasoning>First I need the publisher of the Journal of Psychotherapy Integration. I am not certain of it, so I \
will search for it.</reasoning>
<search>Journal of Psychotherapy Integration publisher</search>
<context>Doc 1(Title: "Journal of Psychotherapy Integration") The Journal of Psychotherapy Integration is a \
peer-reviewed academic journal published by the American Psychological Association on behalf of the Society for \
the Exploration of Psychotherapy Integration.</context>
<conclusion>The journal is published by the American Psychological Association.</conclusion>
</step>
<step>
<reasoning>Now I need the first president of the American Psychological Association. This is well known: the \
psychologist G. Stanley Hall founded it and was its first president in 1892, so this needs no search.</reasoning>
<conclusion>The first president of the American Psychological Association was G. Stanley Hall.</conclusion>
</step>
</think>
<answer>G. Stanley Hall</answer>""",
    ),
    (
        "Where was the director of the film Jaws born?",
        """<think>
<step>
<reasoning>This is a two-hop question. First I need the director of the film Jaws, then that person's place \
of birth. I will search for the director first.</reasoning>
<search>director of the film Jaws</search>
<context>Doc 1(Title: "Jaws (film)") Jaws is a 1975 American thriller film directed by Steven Spielberg and \
based on the 1974 novel by Peter Benchley.
Doc 2(Title: "Jaws (novel)") Jaws is a 1974 novel by American writer Peter Benchley.</context>
<conclusion>The film Jaws was directed by Steven Spielberg.</conclusion>
</step>
<step>
<reasoning>Now I need the place of birth of Steven Spielberg. I will search for it.</reasoning>
<search>Steven Spielberg place of birth</search>
<context>Doc 1(Title: "Steven Spielberg") Steven Allan Spielberg (born December 18, 1946) is an American \
filmmaker. He was born in Cincinnati, Ohio.</context>
<conclusion>Steven Spielberg was born in Cincinnati, Ohio.</conclusion>
</step>
</think>
<answer>Cincinnati, Ohio</answer>""",
    ),
)
"""``(question, completion)`` pairs shown in the system prompt; each passes :func:`check_format`."""


def _examples_section() -> str:
    blocks = [
        f"Example {index}\nQuestion: {question}\nOutput:\n{completion}"
        for index, (question, completion) in enumerate(FEW_SHOT_EXAMPLES, start=1)
    ]
    return "# Examples\n\n" + "\n\n".join(blocks)


SYSTEM_PROMPT_ZERO_SHOT: Final = f"{INSTRUCTIONS}\n\n{_OUTPUT_FORMAT}"
"""Figure 4's system prompt alone (about a third of the tokens: for a policy that learned the format)."""

SYSTEM_PROMPT: Final = f"{SYSTEM_PROMPT_ZERO_SHOT}\n\n{_examples_section()}"
"""Figure 4's system prompt followed by the few-shot examples."""


def render_prompt(question: str, *, few_shot: bool = True) -> list[dict[str, str]]:
    """Chat messages (system + user) for one question; ``few_shot=False`` leaves out the examples."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT if few_shot else SYSTEM_PROMPT_ZERO_SHOT},
        {"role": "user", "content": f"Question: {question.strip()}"},
    ]


# ------------------------------------------------------------------------------- Algorithms 2 and 3


def normalize(text: str) -> str:
    """``NORMALIZE``: canonicalize newlines (``\\r\\n`` and ``\\r`` → ``\\n``), keep the text otherwise."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _fail(reason: str, detail: str) -> NoReturn:
    raise TrajectoryParseError(reason, detail)


def _span(text: str, open_tag: str, close_tag: str, reason: str) -> tuple[int, int]:
    """``SPANBETWEEN``: start of the opening tag, start of the first closing tag after it."""
    start = text.find(open_tag)
    if start == -1:
        _fail(reason, f"no {open_tag}")
    end = text.find(close_tag, start + len(open_tag))
    if end == -1:
        _fail(reason, f"{close_tag} does not follow {open_tag}")
    return start, end


def _validate_step(body: str) -> Step:
    """Algorithm 3 (VALIDATESTEP), returning the parsed step instead of True."""
    s = body.strip()  # line 1
    if s.count(REASONING_OPEN) != 1 or s.count(REASONING_CLOSE) != 1:  # line 2
        _fail("alg3.line2", "a step needs exactly one <reasoning> and one </reasoning>")
    r_o, r_c = _span(s, REASONING_OPEN, REASONING_CLOSE, "alg3.line3")  # line 3
    if s[:r_o].strip():  # line 4
        _fail("alg3.line4", "text before <reasoning>")
    if s.count(CONCLUSION_OPEN) != 1 or s.count(CONCLUSION_CLOSE) != 1:  # line 5
        _fail("alg3.line5", "a step needs exactly one <conclusion> and one </conclusion>")
    c_o, c_c = _span(s, CONCLUSION_OPEN, CONCLUSION_CLOSE, "alg3.line6")  # line 6
    if c_o <= r_c:  # line 7
        _fail("alg3.line7", "<conclusion> before </reasoning>")
    if s[c_c + len(CONCLUSION_CLOSE) :].strip():  # line 8
        _fail("alg3.line8", "text after </conclusion>")
    reasoning = s[r_o + len(REASONING_OPEN) : r_c].strip()
    conclusion = s[c_o + len(CONCLUSION_OPEN) : c_c].strip()
    if SEARCH_OPEN in s or CONTEXT_OPEN in s:  # line 10: Case A, step with search
        if s.count(SEARCH_OPEN) != 1 or s.count(SEARCH_CLOSE) != 1:  # line 11
            _fail("alg3.line11", "a search step needs exactly one <search> and one </search>")
        if s.count(CONTEXT_OPEN) != 1 or s.count(CONTEXT_CLOSE) != 1:  # line 12
            _fail("alg3.line12", "a search step needs exactly one <context> and one </context>")
        q_o, q_c = _span(s, SEARCH_OPEN, SEARCH_CLOSE, "alg3.line13")  # line 13
        x_o, x_c = _span(s, CONTEXT_OPEN, CONTEXT_CLOSE, "alg3.line14")  # line 14
        if r_c >= q_o or q_c >= x_o or x_c >= c_o:  # line 15
            _fail("alg3.line15", "tags out of order: reasoning, search, context, conclusion")
        if (
            s[r_c + len(REASONING_CLOSE) : q_o].strip()
            or s[q_c + len(SEARCH_CLOSE) : x_o].strip()
            or s[x_c + len(CONTEXT_CLOSE) : c_o].strip()
        ):  # line 16
            _fail("alg3.line16", "text between the blocks of a search step")
        raw_context = s[x_o + len(CONTEXT_OPEN) : x_c].strip()
        return SearchStep(
            reasoning=reasoning,
            query=s[q_o + len(SEARCH_OPEN) : q_c].strip(),
            context=unescape_retrieved(raw_context),
            conclusion=conclusion,
            raw_context=raw_context,
        )
    # Case B: step without search.
    if SEARCH_OPEN in s or CONTEXT_OPEN in s:  # line 20 (unreachable: same condition as line 10)
        _fail("alg3.line20", "a non-search step contains <search> or <context>")
    if s[r_c + len(REASONING_CLOSE) : c_o].strip():  # line 21
        _fail("alg3.line21", "text between </reasoning> and <conclusion>")
    return NonSearchStep(reasoning=reasoning, conclusion=conclusion)


def _scan(text: str) -> Trajectory:
    """Algorithm 2 (format checker F(T)), returning the parsed trajectory instead of ``(1, N)``."""
    y = normalize(text)  # line 1
    if y.count(THINK_OPEN) != 1 or y.count(THINK_CLOSE) != 1:  # line 2
        _fail("alg2.line2", "need exactly one <think> and one </think>")
    i_open, i_close = _span(y, THINK_OPEN, THINK_CLOSE, "alg2.line3")  # line 3
    if y[:i_open].strip():  # line 4
        _fail("alg2.line4", "text before <think>")
    t = y[i_open + len(THINK_OPEN) : i_close]  # line 5
    post = y[i_close + len(THINK_CLOSE) :]  # line 6
    if not post.lstrip().startswith(ANSWER_OPEN):  # line 7
        _fail("alg2.line7", "</think> must be followed by <answer>")
    if post.count(ANSWER_OPEN) != 1 or post.count(ANSWER_CLOSE) != 1:  # line 8
        _fail("alg2.line8", "need exactly one <answer> and one </answer> after </think>")
    a_o, a_c = _span(post, ANSWER_OPEN, ANSWER_CLOSE, "alg2.line9")  # line 9
    answer = post[a_o + len(ANSWER_OPEN) : a_c].strip()
    if not answer:  # line 10
        _fail("alg2.line10", "empty answer")
    if post[a_c + len(ANSWER_CLOSE) :].strip():  # line 11
        _fail("alg2.line11", "text after </answer>")
    p = 0  # line 13
    steps: list[Step] = []
    while True:  # line 14
        j = t.find(STEP_OPEN, p)  # line 15
        if j == -1:  # line 16
            if t[p:].strip():  # line 17
                _fail("alg2.line17", "text after the last step")
            break  # line 18
        if t[p:j].strip():  # line 20
            _fail("alg2.line20", "text before a <step>")
        k = t.find(STEP_CLOSE, j)  # line 21
        if k == -1:  # line 22
            _fail("alg2.line22", "<step> without </step>")
        body = t[j + len(STEP_OPEN) : k]  # line 23
        try:
            steps.append(_validate_step(body))  # line 24
        except TrajectoryParseError as error:
            raise TrajectoryParseError(error.reason, f"step {len(steps) + 1}: {error.detail}") from None
        p = k + len(STEP_CLOSE)  # line 25
    if len(steps) < 1:  # line 27
        _fail("alg2.line27", "no step")
    return Trajectory(steps=tuple(steps), answer=answer)


def check_format(text: str) -> tuple[int, int]:
    """``F(T)`` and ``N(T)`` of Algorithms 2–3: ``(1, N)`` for a well-formed completion, else ``(0, -1)``."""
    try:
        trajectory = _scan(text)
    except TrajectoryParseError:
        return FORMAT_FAILURE
    return 1, trajectory.n_steps


def parse(text: str) -> Trajectory:
    """Parse a completion into steps and answer; fields are stripped, contexts unescaped.

    Succeeds exactly when :func:`check_format` returns ``(1, N)`` (and then has ``N`` steps); otherwise raises
    :class:`TrajectoryParseError` whose ``reason`` names the violated algorithm line.
    """
    return _scan(text)


def extract_answer(text: str) -> str | None:
    """Lenient answer extraction: the stripped content of the last complete ``<answer>…</answer>``, or None.

    Escaped retrieved text cannot contain a literal ``<answer>``, so a passage cannot supply the answer.
    """
    return last_between(normalize(text), ANSWER_OPEN, ANSWER_CLOSE)


def _model_field(name: str, value: str) -> str:
    for tag in PROTOCOL_TAGS:
        if tag in value:
            raise ValueError(f"{name} contains the protocol tag {tag!r}; model-written text is never escaped")
    return value


def render(trajectory: Trajectory) -> str:
    """Canonical text of a trajectory, one tag block per line as in Figure 4; contexts are escaped.

    Raises ValueError when the result could not be parsed back: no steps, an answer that is empty after
    stripping, or a model-written field (reasoning, query, conclusion, answer) that contains a protocol tag —
    those fields are the model's own markup and are never escaped. ``parse(render(t)) == t`` whenever every
    field is already stripped and model-written fields contain no ``\\r`` (``parse`` strips fields and
    canonicalizes newlines).
    """
    if not trajectory.steps:
        raise ValueError("a trajectory needs at least one step")
    if not trajectory.answer.strip():
        raise ValueError("the answer is empty")
    lines = [THINK_OPEN]
    for step in trajectory.steps:
        lines.append(STEP_OPEN)
        lines.append(f"{REASONING_OPEN}{_model_field('reasoning', step.reasoning)}{REASONING_CLOSE}")
        if isinstance(step, SearchStep):
            lines.append(f"{SEARCH_OPEN}{_model_field('query', step.query)}{SEARCH_CLOSE}")
            lines.append(f"{CONTEXT_OPEN}{escape_retrieved(step.context)}{CONTEXT_CLOSE}")
        elif not isinstance(step, NonSearchStep):
            raise TypeError(f"not a step: {step!r}")
        lines.append(f"{CONCLUSION_OPEN}{_model_field('conclusion', step.conclusion)}{CONCLUSION_CLOSE}")
        lines.append(STEP_CLOSE)
    lines.append(THINK_CLOSE)
    lines.append(f"{ANSWER_OPEN}{_model_field('answer', trajectory.answer)}{ANSWER_CLOSE}")
    return "\n".join(lines)

# ------------------------------------------------------------------------------------------ engine adapter

_BOUNDARIES: Final[dict[str, Boundary]] = {SEARCH_CLOSE: "search", CONCLUSION_CLOSE: "step", ANSWER_CLOSE: "answer"}


@dataclass(frozen=True)
class HiPRAGAdapter:
    """HiPRAG parsable steps (:mod:`prorag.protocol.hiprag`)."""

    open_next_step: bool = False
    few_shot: bool = True
    name: str = "hiprag"
    stop_strings: tuple[str, ...] = STOP_STRINGS
    step_on_search: bool = False

    def messages(self, question: str) -> list[dict[str, str]]:
        return render_prompt(question, few_shot=self.few_shot)

    def initial_prefix(self) -> str:
        return initial_prefix()

    def boundary(self, stop: str, completion: str) -> Boundary | None:
        """A ``</search>`` with no ``<search>`` opened since the last retrieval is ``malformed``: Algorithm 1's
        ``LASTBETWEEN`` would re-issue the query already answered, the same passages would come back, and the step
        budget (which counts conclusions) would never end the loop. make train's SFT agent closed its conclusion with
        ``</search>`` in 2 of 30 rollouts and re-searched 13 and 15 times, to 9.7k tokens, until its token budget ran
        out. Nothing is retrieved and the rollout ends as a format failure (it had no answer either way)."""
        boundary = _BOUNDARIES.get(stop)
        if boundary == "search" and SEARCH_OPEN not in completion[completion.rfind(CONTEXT_CLOSE) + 1:]:
            return "malformed"
        return boundary

    def query(self, transcript: str) -> str:
        return last_query(transcript) or ""

    def insertion(self, docs_text: str) -> str:
        return after_search(docs_text)

    def after_step(self, step_index: int, budget: int) -> str:
        return after_conclusion(step_index, budget, open_next_step=self.open_next_step)

    def forced_answer(self, transcript: str) -> str:
        closing = close_think() if needs_close_think(transcript) else ""
        return closing + forced_answer_prefix()

    def check_format(self, completion: str) -> tuple[int, int]:
        return check_format(completion)

    def steps(self, completion: str) -> list[StepDict] | None:
        try:
            trajectory = parse(completion)
        except TrajectoryParseError:
            return None
        return [
            {"kind": "search", "reasoning": step.reasoning, "query": step.query, "context": step.context,
             "conclusion": step.conclusion} if isinstance(step, SearchStep) else
            {"kind": "non_search", "reasoning": step.reasoning, "query": None, "context": None,
             "conclusion": step.conclusion}
            for step in trajectory.steps
        ]

    def extract_answer(self, completion: str) -> str | None:
        return extract_answer(completion)

    def label_pieces(self, completion: str) -> list[tuple[str, bool]]:
        """Engine-inserted: the initial prefix, each ``\\n<context>…</context>\\n<conclusion>`` and each
        ``\\n</step>`` after a conclusion (the ``open_next_step=False`` layout that SFT trains)."""
        if self.open_next_step:
            raise ValueError("the SFT label mask is defined for open_next_step=False (the model opens each step)")
        return split_inserted(completion, self, (CONCLUSION_CLOSE, after_conclusion(1, 1, open_next_step=False)))

    def render(self, steps: Sequence[StepDict], answer: str) -> str:
        """A gold trajectory (Figure 4's layout) from steps (``context`` unescaped) and the answer."""
        return render(Trajectory(steps=tuple(
            SearchStep(reasoning=step["reasoning"] or "", query=step["query"] or "", context=step["context"] or "",
                       conclusion=step["conclusion"] or "") if step["kind"] == "search" else
            NonSearchStep(reasoning=step["reasoning"] or "", conclusion=step["conclusion"] or "")
            for step in steps), answer=answer))
