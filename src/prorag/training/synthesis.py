"""Gold step-by-step trajectories built from real decompositions, for SFT.

Every trajectory is rendered by the protocol adapter's ``render`` (:class:`~prorag.protocol.base.GoldRenderer`;
HiPRAG's is :func:`prorag.protocol.hiprag.render`) and must pass the adapter's format check (a failure raises
``RuntimeError``: it is a bug here, not bad data). The context of a search step is what the retriever *actually*
returns for the step's query (top-k hits, formatted with :func:`~prorag.protocol.base.format_documents`). When the
gold passage is not among the hits, it replaces the last hit at a random position (drawn from the caller's ``rng``)
and the step is counted in ``gold_inserted``; without a retriever (``None``) the context is the gold passage alone,
and every search step counts as inserted. A hit is the gold passage when its id is the gold id, when title and text
are equal, or when it is a window (``"<id>#w<n>"``) of the gold passage that contains the step's evidence (the sub-
answer for MuSiQue, the first supporting sentence for HotpotQA).

MuSiQue (``metadata.question_decomposition``): sub-question ``i`` has its placeholders ``#k`` replaced by the
gold answer of sub-question ``k`` (``k < i``, else the record is malformed). A sub-question with a supporting
paragraph (``paragraph_support_idx``) is a search step, one without is a non-search step. Query rule: the
resolved sub-question with white space collapsed, no space before punctuation or inside brackets, and the
trailing ``?``/``.`` dropped; a leading wh-word is kept. Sub-questions of the Wikidata form ``"X >> relation"``
become ``"X relation"`` (one long relation name is shortened, see ``_RELATIONS``). Reasoning is a templated plan
sentence naming the needed fact; the conclusion states the sub-answer verbatim. A final non-search step is
added only when the last sub-answer differs from the gold answer (after answer normalization). The answer is
``golden_answers[0]``. Unanswerable records (``answerable: false``) are skipped.

HotpotQA (``metadata.supporting_facts`` / ``context`` / ``type``), heuristics:

* the two supporting titles give two search steps; a record with another number of titles is skipped;
* query = the title without its parenthetical disambiguation plus up to four question keywords (question
  words that are not stop words and not words of either title, in question order);
* conclusion = the title's supporting sentences, quoted;
* bridge: the first hop is the page the question starts from. Each order (A, B) is scored: +2 if the answer
  occurs in B's title or supporting sentences, −2 if in A's (the answer lives on the second page), +1 if B's
  title occurs in A's sentences (A leads to B), plus the share of A's title words that occur in the question
  minus that share for B; the higher score wins, ties keep the ``supporting_facts`` order. The last search
  step's conclusion adds "So the answer is …" unless the answer is yes/no, in which case a non-search
  decision step follows;
* comparison: one search step per entity, in the order the titles occur in the question, then one non-search
  comparison step whose conclusion states the answer (for yes/no answers this is the decision step).

Records whose fields contain a protocol tag (which :func:`render` rejects in model-written text) or whose
supporting facts do not resolve are skipped with a reason.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from prorag.data.records import Passage, Question, normalize_text
from prorag.metrics.qa import normalize_answer
from prorag.protocol.base import GoldRenderer, ProtocolAdapter, StepDict, format_documents
from prorag.protocol.escaping import unescape_retrieved
from prorag.protocol.hiprag import PROTOCOL_TAGS, NonSearchStep  # the planners' tag check and reasoning-step record
from prorag.protocol.registry import build_adapter
from prorag.retrieval.base import Hit, Retriever
from prorag.retrieval.corpus import source_passage_id

logger = logging.getLogger(__name__)

YES_NO: Final = frozenset({"yes", "no"})

# Wikidata relation -> (query wording, plan phrase, conclusion); {x} the subject, {a} the answer.
_RELATIONS: Final[dict[str, tuple[str, str, str]]] = {
    "located in the administrative territorial entity": (
        "located in", "where {x} is located", "{x} is located in {a}."),
    "located in or next to body of water": (
        "located in or next to body of water", "which body of water {x} is located in or next to",
        "{x} is located in or next to {a}."),
    "shares border with": ("shares border with", "what {x} shares a border with", "{x} shares a border with {a}."),
    "capital of": ("capital of", "what {x} is the capital of", "{x} is the capital of {a}."),
    "part of": ("part of", "what {x} is part of", "{x} is part of {a}."),
    "instance of": ("instance of", "what kind of entity {x} is", "{x} is an instance of {a}."),
    "follows": ("follows", "what {x} follows", "{x} follows {a}."),
    "applies to jurisdiction": (
        "applies to jurisdiction", "which jurisdiction {x} applies to", "{x} applies to the jurisdiction of {a}."),
    "member of sports team": (
        "member of sports team", "which sports team {x} was a member of", "{x} was a member of the team {a}."),
    "member of political party": (
        "member of political party", "which political party {x} is a member of",
        "{x} is a member of the political party {a}."),
    "educated at": ("educated at", "where {x} was educated", "{x} was educated at {a}."),
    "licensed to broadcast to": (
        "licensed to broadcast to", "where {x} is licensed to broadcast to", "{x} is licensed to broadcast to {a}."),
    "founded by": ("founded by", "who founded {x}", "{x} was founded by {a}."),
    "conflict": ("conflict", "which conflict {x} took part in", "{x} took part in the conflict {a}."),
}

_STOPWORD_TEXT: Final = (
    "a an the of in on at to for from by with and or but as is are was were be been being do does did has have "
    "had what which who whom whose when where why how that this these those it its he she his her they their "
    "there than then also both either neither same more most less many much any some into about between "
    "during after before over under while not no yes if so such can could would should will may might one "
    "two first second other another s"
)
_STOPWORDS: Final = frozenset(_STOPWORD_TEXT.split())
_PLACEHOLDER: Final = re.compile(r"#(\d+)")
_WORD: Final = re.compile(r"[\w][\w'’.-]*")
_PARENTHETICAL: Final = re.compile(r"\s*\([^)]*\)\s*$")


class SynthesisSkipped(ValueError):
    """A record that cannot become a gold trajectory; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SynthesizedTrajectory:
    """One gold trajectory: ``completion`` is the HiPRAG text from ``<think>`` to ``</answer>``."""

    question_key: str
    source: str
    dataset: str
    question: str
    answer: str
    completion: str
    n_search: int
    n_non_search: int
    gold_inserted: int
    """Search steps whose gold passage was not retrieved and was put into the context by the synthesizer."""
    queries: tuple[str, ...] = ()
    context_ids: tuple[tuple[str, ...], ...] = ()
    """Passage ids shown in each search step's context, in order."""
    kind: str = ""
    """Record type: ``musique``, ``hotpotqa/bridge`` or ``hotpotqa/comparison``."""

    @property
    def n_steps(self) -> int:
        return self.n_search + self.n_non_search

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (lists and plain values)."""
        record = asdict(self)
        record["queries"] = list(self.queries)
        record["context_ids"] = [list(ids) for ids in self.context_ids]
        return record

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SynthesizedTrajectory:
        """Inverse of :meth:`to_dict`."""
        values = dict(raw)
        values["queries"] = tuple(values.get("queries") or ())
        values["context_ids"] = tuple(tuple(ids) for ids in values.get("context_ids") or ())
        return cls(**values)


# ------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class _Gold:
    """The passage that holds a search step's fact; ``evidence`` must occur in a window to count as it."""

    passage: Passage
    evidence: str


@dataclass(frozen=True)
class _PlannedSearch:
    reasoning: str
    query: str
    gold: _Gold
    conclusion: str


@dataclass(frozen=True)
class _Plan:
    question: Question
    kind: str
    steps: tuple[_PlannedSearch | NonSearchStep, ...]
    answer: str
    queries: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        queries = tuple(step.query for step in self.steps if isinstance(step, _PlannedSearch))
        object.__setattr__(self, "queries", queries)


def _check_no_tags(*texts: str) -> None:
    for text in texts:
        for tag in PROTOCOL_TAGS:
            if tag in text:
                raise SynthesisSkipped(f"a field contains the protocol tag {tag!r}")


def _tidy(text: str) -> str:
    """Collapse white space; no space before punctuation or inside brackets."""
    text = " ".join(text.split())
    text = re.sub(r"\s+([?.,;:!)])", r"\1", text)
    return re.sub(r"\(\s+", "(", text)


def _trim_query(text: str) -> str:
    return _tidy(text).rstrip("?. ").strip()


def _resolve(text: str, answers: Sequence[str], position: int) -> str:
    """Replace ``#k`` by the answer of sub-question ``k`` (1-based, earlier than ``position``)."""

    def substitute(match: re.Match[str]) -> str:
        index = int(match.group(1))
        if not 1 <= index < position:
            raise SynthesisSkipped(f"sub-question {position} refers to #{index}")
        return answers[index - 1]

    return _PLACEHOLDER.sub(substitute, text)


def _same_answer(left: str, right: str) -> bool:
    return normalize_answer(left) == normalize_answer(right)


# --------------------------------------------------------------------------------------- MuSiQue


def _musique_gold(question: Question, support_idx: int, evidence: str) -> _Gold:
    paragraphs = question.metadata.get("paragraphs")
    if not isinstance(paragraphs, list):
        raise SynthesisSkipped("metadata.paragraphs is missing")
    for position, paragraph in enumerate(paragraphs):
        if isinstance(paragraph, dict) and paragraph.get("idx") == support_idx:
            title = normalize_text(str(paragraph.get("title") or ""))
            text = normalize_text(str(paragraph.get("paragraph_text") or ""))
            if not text:
                raise SynthesisSkipped(f"supporting paragraph {support_idx} is empty")
            ids = question.context_passage_ids
            identifier = ids[position] if len(ids) == len(paragraphs) else f"{question.key}#paragraph{support_idx}"
            return _Gold(Passage(id=identifier, title=title, text=text), evidence)
    raise SynthesisSkipped(f"no paragraph with idx {support_idx}")


def _musique_wording(raw: str, answer: str) -> tuple[str, str, str]:
    """(query, plan phrase, conclusion) of one resolved sub-question."""
    if ">>" in raw:
        parts = [part.strip() for part in raw.split(">>")]
        if len(parts) != 2 or not all(parts):
            raise SynthesisSkipped(f"malformed relation sub-question {raw!r}")
        subject, relation = _tidy(parts[0]), " ".join(parts[1].split())
        query_words, plan, conclusion = _RELATIONS.get(
            relation, (relation, "the {r} of {x}", "The {r} of {x} is {a}."))
        return (f"{subject} {query_words}", plan.format(x=subject, r=relation),
                conclusion.format(x=subject, r=relation, a=answer))
    question = _tidy(raw)
    if not question.endswith("?"):
        question = question.rstrip(".") + "?"
    query = _trim_query(question)
    return query, f'the answer to "{question}"', f'The answer to "{question}" is {answer}.'


def _plan_musique(question: Question) -> _Plan:
    metadata = question.metadata
    if metadata.get("answerable") is False:
        raise SynthesisSkipped("unanswerable record (answerable: false)")
    decomposition = metadata.get("question_decomposition")
    if not isinstance(decomposition, list) or not decomposition:
        raise SynthesisSkipped("no question_decomposition")
    answer = question.golden_answers[0]
    answers: list[str] = []
    steps: list[_PlannedSearch | NonSearchStep] = []
    for position, entry in enumerate(decomposition, start=1):
        if not isinstance(entry, dict):
            raise SynthesisSkipped(f"sub-question {position} is not an object")
        raw, sub_answer = entry.get("question"), entry.get("answer")
        if not isinstance(raw, str) or not raw.strip() or not isinstance(sub_answer, str) or not sub_answer.strip():
            raise SynthesisSkipped(f"sub-question {position} lacks a question or an answer")
        sub_answer = normalize_text(sub_answer)
        resolved = normalize_text(_resolve(raw, answers, position))
        answers.append(sub_answer)
        query, need, conclusion = _musique_wording(resolved, sub_answer)
        _check_no_tags(query, need, conclusion)
        if position == 1:
            opener = (f"This question needs {len(decomposition)} facts, which I will find one at a time. "
                      f"First I need {need}.")
        else:
            opener = f"Using what I found so far, next I need {need}."
        support_idx = entry.get("paragraph_support_idx")
        if support_idx is None:
            reasoning = f"{opener} This is common knowledge, so I can answer it without a search."
            steps.append(NonSearchStep(reasoning=reasoning, conclusion=conclusion))
        elif isinstance(support_idx, int) and not isinstance(support_idx, bool):
            gold = _musique_gold(question, support_idx, sub_answer)
            reasoning = f"{opener} I am not certain of it, so I will search for it."
            steps.append(_PlannedSearch(reasoning=reasoning, query=query, gold=gold, conclusion=conclusion))
        else:
            raise SynthesisSkipped(f"sub-question {position} has paragraph_support_idx {support_idx!r}")
    _check_no_tags(answer)
    if not _same_answer(answers[-1], answer):
        steps.append(NonSearchStep(
            reasoning="Putting the facts of the previous steps together answers the original question.",
            conclusion=f"The answer to the question is {answer}."))
    return _Plan(question=question, kind="musique", steps=tuple(steps), answer=answer)


# -------------------------------------------------------------------------------------- HotpotQA


def _core_title(title: str) -> str:
    return _PARENTHETICAL.sub("", title).strip() or title


def _words(text: str) -> list[str]:
    words = (word.strip(".'’-").lower() for word in _WORD.findall(text))
    return [re.sub(r"['’]s$", "", word) for word in words]


def _keywords(question: str, titles: Iterable[str], limit: int = 4) -> list[str]:
    excluded = set(_STOPWORDS)
    for title in titles:
        excluded.update(_words(title))
    found: list[str] = []
    for word in _words(question):
        if word and word not in excluded and word not in found:
            found.append(word)
    return found[:limit]


def _contains(haystack: str, needle: str) -> bool:
    return bool(needle) and needle.lower() in haystack.lower()


def _hotpot_pages(question: Question) -> list[tuple[str, list[str], _Gold]]:
    """(title, supporting sentences, gold passage) of each supporting title, in supporting_facts order."""
    metadata = question.metadata
    facts, context = metadata.get("supporting_facts"), metadata.get("context")
    if not isinstance(facts, list) or not isinstance(context, list):
        raise SynthesisSkipped("metadata.supporting_facts or metadata.context is missing")
    positions = {entry[0]: position for position, entry in enumerate(context)
                 if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)}
    wanted: dict[str, list[int]] = {}
    for fact in facts:
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str) and isinstance(fact[1], int)):
            raise SynthesisSkipped(f"malformed supporting fact {fact!r}")
        wanted.setdefault(fact[0], []).append(fact[1])
    if len(wanted) != 2:
        raise SynthesisSkipped(f"expected 2 supporting titles, got {len(wanted)}")
    pages = []
    ids = question.context_passage_ids
    for title, indices in wanted.items():
        if title not in positions:
            raise SynthesisSkipped(f"supporting title {title!r} is not in the context")
        position = positions[title]
        sentences = context[position][1]
        if not isinstance(sentences, list) or any(not 0 <= index < len(sentences) for index in indices):
            raise SynthesisSkipped(f"supporting sentence of {title!r} is out of range")
        chosen = [normalize_text(str(sentences[index])) for index in sorted(set(indices))]
        chosen = [sentence for sentence in chosen if sentence]
        if not chosen:
            raise SynthesisSkipped(f"supporting sentences of {title!r} are empty")
        identifier = ids[position] if len(ids) == len(context) else f"{question.key}#{title}"
        text = normalize_text(" ".join(str(sentence) for sentence in sentences))
        gold = _Gold(Passage(id=identifier, title=normalize_text(title), text=text), chosen[0])
        pages.append((normalize_text(title), chosen, gold))
    return pages


def _bridge_order(pages: list[Any], question: str, answer: str) -> list[Any]:
    question_words = set(_words(question))

    def mentioned(title: str) -> float:
        words = [word for word in _words(_core_title(title)) if word]
        return sum(word in question_words for word in words) / len(words) if words else 0.0

    def score(first: Any, second: Any) -> float:
        first_text, second_text = " ".join(first[1]), " ".join(second[1])
        value = float(_contains(first_text, _core_title(second[0])))
        value += mentioned(first[0]) - mentioned(second[0])
        if answer.lower() not in YES_NO:
            in_second = _contains(f"{second[0]} {second_text}", answer)
            value += 2 * (in_second - _contains(f"{first[0]} {first_text}", answer))
        return value

    forward, backward = score(pages[0], pages[1]), score(pages[1], pages[0])
    return pages if forward >= backward else [pages[1], pages[0]]


def _comparison_order(pages: list[Any], question: str) -> list[Any]:
    lowered = question.lower()

    def position(page: Any) -> int:
        found = lowered.find(_core_title(page[0]).lower())
        return found if found >= 0 else len(lowered)

    return sorted(pages, key=position)  # stable: ties keep the supporting_facts order


def _quote(title: str, sentences: Sequence[str]) -> str:
    return f'The passage on {title} says: "{" ".join(sentences)}"'


def _plan_hotpotqa(question: Question) -> _Plan:
    kind = question.metadata.get("type")
    if kind not in ("bridge", "comparison"):
        raise SynthesisSkipped(f"unknown HotpotQA type {kind!r}")
    answer = question.golden_answers[0]
    yes_no = answer.lower() in YES_NO
    pages = _hotpot_pages(question)
    pages = _bridge_order(pages, question.question, answer) if kind == "bridge" else _comparison_order(
        pages, question.question)
    titles = [page[0] for page in pages]
    keywords = _keywords(question.question, titles)
    steps: list[_PlannedSearch | NonSearchStep] = []
    for position, (title, sentences, gold) in enumerate(pages):
        core = _core_title(title)
        query = " ".join([core, *keywords])
        if kind == "bridge" and position == 0:
            reasoning = (f"To answer this I first need the relevant facts about {core}, which the question "
                         "builds on. I will search for them.")
        elif kind == "bridge":
            reasoning = (f"The first step leads to {core}. Now I need the relevant facts about {core}, so I "
                         "will search for them.")
        elif position == 0:
            reasoning = (f"The question compares {_core_title(titles[0])} and {_core_title(titles[1])}. First "
                         f"I need the relevant facts about {core}; I will search for them.")
        else:
            reasoning = f"Next I need the same kind of facts about {core}; I will search for them."
        conclusion = _quote(title, sentences)
        if kind == "bridge" and position == 1 and not yes_no:
            conclusion += f" So the answer is {answer}."
        steps.append(_PlannedSearch(reasoning=reasoning, query=query, gold=gold, conclusion=conclusion))
    first, second = _core_title(titles[0]), _core_title(titles[1])
    if kind == "comparison":
        steps.append(NonSearchStep(
            reasoning=(f"I now have the facts about {first} and {second}. Comparing them on what the question "
                       "asks decides the answer; no further search is needed."),
            conclusion=f"Comparing {first} and {second}, the answer is {answer}."))
    elif yes_no:
        steps.append(NonSearchStep(
            reasoning="With the facts of both steps I can decide the yes/no question without another search.",
            conclusion=f"The answer to the question is {answer}."))
    for step in steps:
        _check_no_tags(step.reasoning, step.conclusion, step.query if isinstance(step, _PlannedSearch) else "")
    _check_no_tags(answer)
    return _Plan(question=question, kind=f"hotpotqa/{kind}", steps=tuple(steps), answer=answer)


# ------------------------------------------------------------------------------------ realization


def _is_gold(hit: Hit, gold: _Gold) -> bool:
    passage = gold.passage
    if hit.id == passage.id:
        return True
    if normalize_text(hit.title) == passage.title and normalize_text(hit.text) == passage.text:
        return True
    return source_passage_id(hit.id) == passage.id and _contains(hit.text, gold.evidence)


def _context(hits: Sequence[Hit], gold: _Gold, top_k: int, rng: random.Random) -> tuple[list[Passage], bool]:
    """The top-k hits, with the gold passage put in place of the last hit when it was not retrieved."""
    documents = [hit.passage for hit in hits[:top_k]]
    if any(_is_gold(hit, gold) for hit in hits[:top_k]):
        return documents, False
    if len(documents) >= top_k:
        documents = documents[: top_k - 1]
    documents.insert(rng.randint(0, len(documents)), gold.passage)
    return documents, True


def _realize(plan: _Plan, hits: Sequence[Sequence[Hit]], top_k: int, rng: random.Random,
             adapter: ProtocolAdapter) -> SynthesizedTrajectory:
    """Render a plan in the adapter's protocol with the retrieved hits of its queries; raises ``RuntimeError`` if
    the format check fails."""
    search_hits = iter(hits)
    steps: list[StepDict] = []
    context_ids: list[tuple[str, ...]] = []
    inserted_texts: list[str] = []
    inserted = 0
    for planned in plan.steps:
        if isinstance(planned, NonSearchStep):
            steps.append({"kind": "non_search", "reasoning": planned.reasoning, "query": None, "context": None,
                          "conclusion": planned.conclusion})
            continue
        documents, was_inserted = _context(next(search_hits), planned.gold, top_k, rng)
        inserted += was_inserted
        docs_text = format_documents([(document.title, document.text) for document in documents])
        inserted_texts.append(adapter.insertion(docs_text))
        context_ids.append(tuple(document.id for document in documents))
        steps.append({"kind": "search", "reasoning": planned.reasoning, "query": planned.query,
                      "context": unescape_retrieved(docs_text), "conclusion": planned.conclusion})
    if not isinstance(adapter, GoldRenderer):
        raise ValueError(f"protocol {adapter.name!r} cannot render gold trajectories (its adapter has no render())")
    completion = adapter.render(steps, plan.answer)
    parsed = adapter.steps(completion) if adapter.check_format(completion)[0] == 1 else None
    planned_queries = [step["query"] for step in steps if step["kind"] == "search"]
    if (parsed is None or [step["query"] for step in parsed if step["kind"] == "search"] != planned_queries
            or any(text not in completion for text in inserted_texts)):
        raise RuntimeError(f"synthesized trajectory of {plan.question.key!r} fails the {adapter.name} format check "
                           f"(a bug in prorag.training.synthesis):\n{completion}")
    n_search = sum(step["kind"] == "search" for step in steps)
    return SynthesizedTrajectory(
        question_key=plan.question.key, source=plan.question.source,
        dataset=plan.question.dataset, question=plan.question.question, answer=plan.answer,
        completion=completion, n_search=n_search, n_non_search=len(steps) - n_search, gold_inserted=inserted,
        queries=plan.queries, context_ids=tuple(context_ids), kind=plan.kind)


def _search(retriever: Retriever | None, queries: Sequence[str], top_k: int) -> list[list[Hit]]:
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if retriever is None or not queries:
        return [[] for _ in queries]
    results = retriever.search(list(queries), top_k)
    if len(results) != len(queries):
        raise RuntimeError(f"the retriever returned {len(results)} results for {len(queries)} queries")
    return results


def _synthesize_one(planner: Callable[[Question], _Plan], question: Question, retriever: Retriever | None,
                    top_k: int, rng: random.Random, skipped: dict[str, str] | None,
                    protocol: str | ProtocolAdapter) -> SynthesizedTrajectory | None:
    try:
        plan = planner(question)
    except SynthesisSkipped as error:
        logger.debug("no trajectory for %s: %s", question.key, error.reason)
        if skipped is not None:
            skipped[question.key] = error.reason
        return None
    return _realize(plan, _search(retriever, plan.queries, top_k), top_k, rng, build_adapter(protocol))


def synthesize_musique(question: Question, retriever: Retriever | None, *, top_k: int = 3, rng: random.Random,
                       skipped: dict[str, str] | None = None,
                       protocol: str | ProtocolAdapter) -> SynthesizedTrajectory | None:
    """A gold trajectory from a MuSiQue decomposition, or None (the reason goes to ``skipped[key]``)."""
    return _synthesize_one(_plan_musique, question, retriever, top_k, rng, skipped, protocol)


def synthesize_hotpotqa(question: Question, retriever: Retriever | None, *, top_k: int = 3, rng: random.Random,
                        skipped: dict[str, str] | None = None,
                        protocol: str | ProtocolAdapter) -> SynthesizedTrajectory | None:
    """A gold trajectory from HotpotQA supporting facts, or None (the reason goes to ``skipped[key]``)."""
    return _synthesize_one(_plan_hotpotqa, question, retriever, top_k, rng, skipped, protocol)


PLANNERS: Final[dict[str, Callable[[Question], _Plan]]] = {"musique": _plan_musique, "hotpotqa": _plan_hotpotqa}
"""Datasets with a decomposition synthesizer (``Question.dataset``); others may use the single-search planner."""


# ------------------------------------------------------------------------- single search (any dataset)

_SENTENCE_END: Final = re.compile(r"(?<=[.!?])\s+(?=[\"“(\[A-Z0-9])")
_MIN_ANSWER_CHARS: Final = 2
SINGLE_SEARCH_REASONING: Final = ("This question asks for one fact, and I am not certain of it, so I will search "
                                  "for it.")


def _token_span(haystack: str, needle: str) -> bool:
    """Whether the normalized ``needle`` occurs in the normalized ``haystack`` as whole words (so the PopQA alias
    "pol" does not match "political")."""
    needle_words = normalize_answer(needle).split()
    if not needle_words or len("".join(needle_words)) < _MIN_ANSWER_CHARS:
        return False
    return f" {' '.join(needle_words)} " in f" {normalize_answer(haystack)} "


def _answer_evidence(hits: Sequence[Hit], answers: Sequence[str]) -> tuple[Hit, str, str] | None:
    """(hit, sentence, answer) of the best-ranked hit with a sentence that holds a golden answer as whole words;
    golden answers are tried in their listed order, so the canonical one wins over an alias."""
    for hit in hits:
        sentences = [sentence.strip() for sentence in _SENTENCE_END.split(normalize_text(hit.text))]
        for answer in answers:
            for sentence in sentences:
                if _token_span(sentence, answer):
                    return hit, sentence, answer
    return None


def _plan_single_search(question: Question, hits: Sequence[Hit]) -> _Plan:
    """One search step with the question as the query, concluded from the retrieved passage that states a golden
    answer (the first such hit in rank order, its answer sentence quoted). The context is what the retriever
    returned, so nothing is inserted; a question with no such hit is skipped."""
    found = _answer_evidence(hits, question.golden_answers)
    if found is None:
        raise SynthesisSkipped("no retrieved passage states a golden answer (single search)")
    hit, sentence, answer = found
    answer = normalize_text(answer)
    query = _trim_query(normalize_text(question.question))
    conclusion = f"{_quote(normalize_text(hit.title), [sentence])} So the answer is {answer}."
    _check_no_tags(query, conclusion, answer)
    gold = _Gold(hit.passage, sentence)
    step = _PlannedSearch(reasoning=SINGLE_SEARCH_REASONING, query=query, gold=gold, conclusion=conclusion)
    return _Plan(question=question, kind="single_search", steps=(step,), answer=answer)


def _single_search_plans(questions: Sequence[Question], retriever: Retriever | None, top_k: int,
                         skipped: dict[str, str]) -> dict[str, tuple[_Plan, list[list[Hit]]]]:
    """Single-search plans of ``questions`` with the hits of their one query (one batched retriever call), keyed
    by question key."""
    if retriever is None:
        for question in questions:
            skipped[question.key] = "single search needs a retriever"
        return {}
    hits = _search(retriever, [_trim_query(normalize_text(question.question)) for question in questions], top_k)
    plans: dict[str, tuple[_Plan, list[list[Hit]]]] = {}
    for question, question_hits in zip(questions, hits, strict=True):
        try:
            plans[question.key] = (_plan_single_search(question, question_hits[:top_k]), [question_hits])
        except SynthesisSkipped as error:
            skipped[question.key] = error.reason
    return plans


FIRST_HOP_DATASET: Final = "first_hop"
"""``Question.dataset`` of a sub-question asked on its own (:func:`hop_questions`)."""


def hop_questions(question: Question, *, first: bool = True, later: bool = False) -> list[Question]:
    """Sub-questions of a MuSiQue-style decomposition (``metadata.question_decomposition``) as single-hop questions
    of their own — same split and source, id ``<id>#hop<k>``, the sub-answer as the golden answer. The first one
    (``first``) and, with ``later``, every later one, its ``#j`` placeholders replaced by the earlier sub-answers
    ("Who was the first president of #1?" → "... of American Psychological Association?"). A hop that is no
    question on its own (a ``>>`` relation, an unknown ``#j``) or lacks an answer is left out."""
    decomposition = question.metadata.get("question_decomposition")
    if not isinstance(decomposition, list):
        return []
    answers: list[str] = []
    hops: list[Question] = []
    for index, hop in enumerate(decomposition if later else decomposition[:1], start=1):
        text, answer = (hop.get("question"), hop.get("answer")) if isinstance(hop, dict) else (None, None)
        if not isinstance(text, str) or not isinstance(answer, str) or not text.strip() or not answer.strip():
            break  # the later hops refer to this one's answer
        answers.append(normalize_text(answer))
        unknown = any(int(j) > len(answers) - 1 or int(j) < 1 for j in _PLACEHOLDER.findall(text))
        if (index == 1 and not first) or ">>" in text or unknown:
            continue
        text = _tidy(normalize_text(_PLACEHOLDER.sub(lambda match: answers[int(match.group(1)) - 1], text)))
        text = text if text.endswith("?") else f"{text}?"
        hops.append(replace(question, id=f"{question.id}#hop{index}", question=text,
                            golden_answers=(answers[-1],), dataset=FIRST_HOP_DATASET, metadata={},
                            supporting_passage_ids=(), context_passage_ids=()))
    return hops


def synthesize_trajectories(questions: Sequence[Question], retriever: Retriever | None, *, top_k: int = 3,
                            seed: int = 0, protocol: str | ProtocolAdapter, single_search: bool = False,
                            first_hops: bool = False, later_hops: bool = False,
                            ) -> tuple[list[SynthesizedTrajectory], dict[str, str]]:
    """Trajectories of every question whose dataset has a synthesizer, with batched retriever calls.

    With ``single_search``, a question whose dataset has no decomposition synthesizer (NQ, TriviaQA, PopQA, ...)
    gets a one-search trajectory grounded in what the retriever returns for it (:func:`_plan_single_search`);
    otherwise it is skipped. With ``first_hops``, the first sub-question of every decomposed question is asked on
    its own as well (:func:`hop_questions`) and gets a one-search trajectory the same way: single-hop examples
    from the same train split; ``later_hops`` adds the later sub-questions, the earlier sub-answers filled in.
    Each question draws its insertion positions from its own
    ``random.Random(f"{seed}/{key}")``, so a result does not depend on which other questions are in the batch.
    Returns the trajectories (in question order, its hops after each question) and ``{question key: reason}``
    for the questions that were skipped.
    """
    if first_hops or later_hops:
        questions = [derived for question in questions
                     for derived in (question, *hop_questions(question, first=first_hops, later=later_hops))]
    skipped: dict[str, str] = {}
    decomposed: dict[str, _Plan] = {}
    single: list[Question] = []
    for question in questions:
        planner = PLANNERS.get(question.dataset)
        if planner is None:
            if single_search or question.dataset == FIRST_HOP_DATASET:
                single.append(question)
            else:
                skipped[question.key] = f"no synthesizer for dataset {question.dataset!r}"
            continue
        try:
            decomposed[question.key] = planner(question)
        except SynthesisSkipped as error:
            skipped[question.key] = error.reason
    planned = _single_search_plans(single, retriever, top_k, skipped) if single else {}
    hits = _search(retriever, [query for plan in decomposed.values() for query in plan.queries], top_k)
    start = 0
    for key, plan in decomposed.items():
        planned[key] = (plan, hits[start : start + len(plan.queries)])
        start += len(plan.queries)
    adapter = build_adapter(protocol)
    trajectories: list[SynthesizedTrajectory] = []
    for question in questions:
        if question.key in planned:
            plan, plan_hits = planned[question.key]
            rng = random.Random(f"{seed}/{question.key}")
            trajectories.append(_realize(plan, plan_hits, top_k, rng, adapter))
    if skipped:
        logger.info("skipped %d of %d questions: %s", len(skipped), len(questions),
                    dict(Counter(skipped.values())))
    return trajectories, skipped


# ---------------------------------------------------------------------------------- split and summary


def split_for_synthesis(questions: Iterable[Question], eval_keys: Iterable[str]) -> list[Question]:
    """The questions, refusing any whose key is in the evaluation set (``ValueError`` naming the keys)."""
    selected = list(questions)
    evaluation = set(eval_keys)
    overlap = sorted({question.key for question in selected if question.key in evaluation})
    if overlap:
        shown = ", ".join(overlap[:10]) + (f", … ({len(overlap)} in all)" if len(overlap) > 10 else "")
        raise ValueError(f"{len(overlap)} synthesis question(s) are in the evaluation set: {shown}")
    return selected


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def synthesis_summary(trajectories: Sequence[SynthesizedTrajectory],
                      skipped: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Counts per source and overall: trajectories, steps, search/non-search share, gold insertions."""

    def totals(items: Sequence[SynthesizedTrajectory]) -> dict[str, Any]:
        search = sum(item.n_search for item in items)
        non_search = sum(item.n_non_search for item in items)
        inserted = sum(item.gold_inserted for item in items)
        return {"trajectories": len(items), "steps": search + non_search, "search_steps": search,
                "non_search_steps": non_search, "search_share": _share(search, search + non_search),
                "non_search_share": _share(non_search, search + non_search), "gold_inserted": inserted,
                "gold_inserted_share": _share(inserted, search)}

    by_source: dict[str, list[SynthesizedTrajectory]] = {}
    for item in trajectories:
        by_source.setdefault(item.source, []).append(item)
    summary: dict[str, Any] = {"total": totals(trajectories),
                               "by_source": {source: totals(items) for source, items in sorted(by_source.items())}}
    if skipped is not None:
        summary["skipped"] = len(skipped)
        summary["skip_reasons"] = dict(Counter(skipped.values()).most_common())
    return summary
