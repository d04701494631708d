"""TeaRAG SFT data from MuSiQue decompositions (paper §4.3.1) and its label mask (eq. 4).

For a MuSiQue record (``metadata.question_decomposition``), each sub-question with a supporting paragraph becomes
one TeaRAG step, built as the paper's five steps:

1. *knowledge extraction*: the triplets of the golden evidence paragraph come from the kg extraction function
   (:func:`prorag.kg.extraction.extract_triplets`, the same prompt and cache as the knowledge graph); the
   *supporting* triplets are those with the sub-answer as head or tail (cover exact match after answer
   normalization) whose other entity, or a content word of whose relation, occurs in the subquery. The paper
   asks Qwen2.5-72B which triplets answer the subquery; this rule replaces that judge.
   A step with no supporting triplet is kept, counted in ``steps_without_support``, and its summary states the
   sub-answer alone;
2. *important entities*: the entities of the supporting triplets other than the answer that occur in the
   subquery; else the earlier sub-answers the subquery names; else the subject of a ``"X >> relation"``
   sub-question; else the paragraph title if the subquery names it. Every anchor is covered by its subquery
   (eq. 7's consistency holds by construction). A step with no anchor skips the record;
3. *subquery*: the resolved sub-question (``#k`` replaced by earlier sub-answers, the helpers of
   :mod:`prorag.training.synthesis`) as a question; Wikidata ``"X >> relation"`` sub-questions are made fluent
   with templates (the paper rewrites them with Qwen2.5-72B);
4. *context simulation*: the golden paragraph, optional distractor paragraphs of the record, and the evidence
   triplets (the supporting ones plus up to ``extra_triplets`` other triplets of the paragraph) each inserted at a
   random position (the caller's ``rng``), numbered like the engine's documents; triplets are shown as the
   ``kag`` retriever shows them (empty title, ``"head relation tail"``);
5. *summary*: one of :data:`SUMMARY_TEMPLATES` at random: the supporting triplets, then the sub-answer.

The steps are concatenated in MuSiQue's order and closed with the gold answer (``golden_answers[0]``). With
``single_hop_steps`` every step is also an example of its own (its subquery as the question). Records with an
unsupported sub-question, unanswerable records and fields holding a protocol tag are skipped with a reason.

Training: :func:`prorag.training.sft.build_sft_example` with ``protocol="tearag"`` tokenizes an example like the
rollout engine does, with labels ``-100`` on the prompt and on everything the engine inserts (the adapter's
``label_pieces``): the ``<Reference>`` context is never trained (eq. 4, reconstructed:
``L_SFT = −Σ_t 1[y_t ∉ <Reference>…</Reference>] log π_θ(y_t | x, y_<t)``); :func:`prorag.training.sft.train_sft_lora`
trains the LoRA adapter.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Protocol

from prorag.data.records import Passage, Question, normalize_text
from prorag.metrics.qa import normalize_answer
from prorag.protocol.escaping import unescape_retrieved
from prorag.protocol.tearag import PROTOCOL_TAGS, TeaRAGPath, TeaRAGStep, format_documents, render
from prorag.training.synthesis import _STOPWORDS, SynthesisSkipped, _musique_gold, _resolve, _tidy

logger = logging.getLogger(__name__)

SUMMARY_TEMPLATES: Final[tuple[str, ...]] = (
    "The reference gives {facts}. So the answer to the subquery is {answer}.",
    "According to {facts}, the answer is {answer}.",
    "Key facts: {facts}. Therefore the subquery is answered by {answer}.",
    "From {facts} it follows that the answer is {answer}.",
    "The supporting knowledge is {facts}, which shows that the answer is {answer}.",
)
"""Two-part summaries: the supporting triplets, then the sub-answer (§4.3.1 step 5)."""

NO_SUPPORT_TEMPLATE: Final = "The reference answers the subquery: {answer}."

# Fluent questions for the Wikidata relations of MuSiQue ("X >> relation"); {x} the subject.
_FLUENT: Final[dict[str, str]] = {
    "located in the administrative territorial entity": "Where is {x} located?",
    "located in or next to body of water": "Which body of water is {x} located in or next to?",
    "shares border with": "What does {x} share a border with?",
    "capital of": "What is {x} the capital of?",
    "part of": "What is {x} part of?",
    "instance of": "What kind of entity is {x}?",
    "follows": "What does {x} follow?",
    "applies to jurisdiction": "Which jurisdiction does {x} apply to?",
    "member of sports team": "Which sports team was {x} a member of?",
    "member of political party": "Which political party is {x} a member of?",
    "educated at": "Where was {x} educated?",
    "licensed to broadcast to": "Where is {x} licensed to broadcast to?",
    "founded by": "Who founded {x}?",
    "conflict": "Which conflict did {x} take part in?",
    "country": "Which country is {x} in?",
    "country of citizenship": "What is the country of citizenship of {x}?",
    "performer": "Who is the performer of {x}?",
    "place of birth": "Where was {x} born?",
    "place of death": "Where did {x} die?",
}


class TripletLike(Protocol):
    """What the builder reads of an extracted triplet (:class:`prorag.kg.extraction.ExtractedTriplet`)."""

    head: str
    relation: str
    tail: str
    chunk_id: str


@dataclass(frozen=True)
class SFTDataSettings:
    """How the TeaRAG SFT data is built (see the module docstring)."""

    extra_triplets: int = 2
    distractors: int = 0
    single_hop_steps: bool = False
    max_supporting: int = 2

    def __post_init__(self) -> None:
        if self.extra_triplets < 0 or self.distractors < 0 or self.max_supporting < 1:
            raise ValueError("extra_triplets and distractors must be >= 0 and max_supporting >= 1")


@dataclass(frozen=True)
class TeaRAGSFTExample:
    """One SFT example: ``completion`` is the TeaRAG text from the first ``<step>`` to ``</answer>``."""

    question_key: str
    kind: str
    """``musique_path`` (a whole decomposition) or ``musique_step`` (one step as a single-hop question)."""
    question: str
    answer: str
    completion: str
    n_steps: int
    supporting_triplets: int
    steps_without_support: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TeaRAGSFTExample:
        return cls(**{name: raw[name] for name in cls.__dataclass_fields__})


# ---------------------------------------------------------------------------------------- helpers


def _covered(name: str, text: str) -> bool:
    """Cover exact match of a whole normalized phrase (eq. 7's test)."""
    needle = normalize_answer(name)
    return bool(needle) and f" {needle} " in f" {normalize_answer(text)} "


def _same(left: str, right: str) -> bool:
    return normalize_answer(left) == normalize_answer(right)


def fluent_subquery(resolved: str) -> tuple[str, str | None]:
    """The fluent subquery of a resolved sub-question and the subject of a ``"X >> relation"`` form."""
    if ">>" in resolved:
        parts = [part.strip() for part in resolved.split(">>")]
        if len(parts) != 2 or not all(parts):
            raise SynthesisSkipped(f"malformed relation sub-question {resolved!r}")
        subject, relation = _tidy(parts[0]), " ".join(parts[1].split())
        template = _FLUENT.get(relation, "What is the {r} of {x}?")
        return template.format(x=subject, r=relation), subject
    question = _tidy(resolved)
    return (question if question.endswith("?") else question.rstrip(".") + "?"), None


def supporting_triplets(triplets: Sequence[TripletLike], subquery: str, answer: str,
                        limit: int) -> list[TripletLike]:
    """Triplets that answer the subquery: the sub-answer is their head or tail (equal, or covered by it), and
    the other entity occurs in the subquery or a content word of the relation does."""
    found = []
    for t in triplets:
        for answer_side, other in ((t.tail, t.head), (t.head, t.tail)):
            if not (_same(answer_side, answer) or _covered(answer, answer_side)):
                continue
            relation_words = [w for w in normalize_answer(t.relation).split() if w not in _STOPWORDS]
            query_words = set(normalize_answer(subquery).split())
            if _covered(other, subquery) or any(word in query_words for word in relation_words):
                found.append(t)
                break
    return found[:limit]


def anchor_entities(subquery: str, support: Sequence[TripletLike], answer: str, earlier_answers: Sequence[str],
                    subject: str | None, title: str) -> tuple[str, ...]:
    """Key entities of a step (module docstring, step 2); every one is covered by ``subquery``."""
    anchors: list[str] = []
    for triplet in support:
        for entity in (triplet.head, triplet.tail):
            if not _same(entity, answer) and _covered(entity, subquery) and entity not in anchors:
                anchors.append(entity)
    if not anchors:
        anchors = [a for a in dict.fromkeys(earlier_answers) if _covered(a, subquery)]
    if not anchors and subject and _covered(subject, subquery):
        anchors = [subject]
    if not anchors and _covered(title, subquery):
        anchors = [title]
    return tuple(" ".join(anchor.replace(";", ",").split()) for anchor in anchors)


def triplet_text(triplet: TripletLike) -> str:
    """How the ``kag`` retriever shows a triplet: ``"head relation tail"``."""
    return f"{triplet.head} {triplet.relation} {triplet.tail}"


def _facts(support: Sequence[TripletLike]) -> str:
    return "; ".join(f"({t.head}, {t.relation}, {t.tail})" for t in support)


def simulated_context(gold: Passage, distractors: Sequence[Passage], evidence: Sequence[TripletLike],
                      rng: random.Random) -> str:
    """Golden (and distractor) paragraphs with the evidence triplets inserted at random positions (unescaped)."""
    documents: list[tuple[str, str]] = [(gold.title, gold.text)]
    for passage in distractors:
        documents.insert(rng.randint(0, len(documents)), (passage.title, passage.text))
    for triplet in evidence:
        documents.insert(rng.randint(0, len(documents)), ("", triplet_text(triplet)))
    return unescape_retrieved(format_documents(documents))


def _distractor_passages(question: Question, gold_ids: set[str], count: int, rng: random.Random) -> list[Passage]:
    paragraphs = question.metadata.get("paragraphs") or []
    pool = [Passage(id=f"{question.key}#p{p.get('idx')}", title=normalize_text(str(p.get("title") or "")),
                    text=normalize_text(str(p.get("paragraph_text") or "")))
            for p in paragraphs if isinstance(p, dict) and not p.get("is_supporting") and p.get("paragraph_text")]
    pool = [passage for passage in pool if passage.id not in gold_ids]
    return rng.sample(pool, min(count, len(pool)))


def golden_paragraphs(question: Question) -> list[Passage]:
    """The supporting paragraphs of a MuSiQue record, in decomposition order (what the kg extraction reads)."""
    passages: list[Passage] = []
    for entry in question.metadata.get("question_decomposition") or []:
        if isinstance(entry, dict) and isinstance(entry.get("paragraph_support_idx"), int):
            try:
                passage = _musique_gold(question, entry["paragraph_support_idx"], "").passage
            except SynthesisSkipped:
                continue
            if passage.id not in {p.id for p in passages}:
                passages.append(passage)
    return passages


# ------------------------------------------------------------------------------------------ builder


def build_path(question: Question, triplets_by_chunk: Mapping[str, Sequence[TripletLike]],
               settings: SFTDataSettings, rng: random.Random) -> list[TeaRAGSFTExample]:
    """The example(s) of one MuSiQue record; raises :class:`SynthesisSkipped` with a reason."""
    metadata = question.metadata
    if metadata.get("answerable") is False:
        raise SynthesisSkipped("unanswerable record (answerable: false)")
    decomposition = metadata.get("question_decomposition")
    if not isinstance(decomposition, list) or not decomposition:
        raise SynthesisSkipped("no question_decomposition")
    if not question.golden_answers:
        raise SynthesisSkipped("no golden answer")
    answers: list[str] = []
    steps: list[TeaRAGStep] = []
    support_counts: list[int] = []
    for position, entry in enumerate(decomposition, start=1):
        if not isinstance(entry, dict):
            raise SynthesisSkipped(f"sub-question {position} is not an object")
        raw, sub_answer = entry.get("question"), entry.get("answer")
        if not isinstance(raw, str) or not raw.strip() or not isinstance(sub_answer, str) or not sub_answer.strip():
            raise SynthesisSkipped(f"sub-question {position} lacks a question or an answer")
        support_idx = entry.get("paragraph_support_idx")
        if not isinstance(support_idx, int) or isinstance(support_idx, bool):
            raise SynthesisSkipped(f"sub-question {position} has no supporting paragraph")
        sub_answer = normalize_text(sub_answer)
        resolved = normalize_text(_resolve(raw, answers, position))
        subquery, subject = fluent_subquery(resolved)
        gold = _musique_gold(question, support_idx, sub_answer).passage
        paragraph_triplets = list(triplets_by_chunk.get(gold.id, ()))
        support = supporting_triplets(paragraph_triplets, subquery, sub_answer, settings.max_supporting)
        entities = anchor_entities(subquery, support, sub_answer, answers, subject, gold.title)
        if not entities:
            raise SynthesisSkipped(f"sub-question {position}: no anchor entity occurs in the subquery")
        others = [t for t in paragraph_triplets if t not in support]
        evidence = [*support, *rng.sample(others, min(settings.extra_triplets, len(others)))]
        distractors = _distractor_passages(question, {gold.id}, settings.distractors, rng)
        context = simulated_context(gold, distractors, evidence, rng)
        summary = (rng.choice(SUMMARY_TEMPLATES).format(facts=_facts(support), answer=sub_answer) if support
                   else NO_SUPPORT_TEMPLATE.format(answer=sub_answer))
        steps.append(TeaRAGStep(entities=entities, subquery=subquery, context=context, summary=summary))
        support_counts.append(len(support))
        answers.append(sub_answer)
    answer = normalize_text(question.golden_answers[0])
    for text in (answer, *(s.subquery for s in steps), *(s.summary for s in steps), *(e for s in steps
                                                                                       for e in s.entities)):
        if any(tag in text for tag in PROTOCOL_TAGS):
            raise SynthesisSkipped("a field contains a protocol tag")
    examples = [TeaRAGSFTExample(question.key, "musique_path", question.question, answer,
                                 render(TeaRAGPath(tuple(steps), answer)), len(steps), sum(support_counts),
                                 support_counts.count(0))]
    if settings.single_hop_steps:
        for index, (step, count) in enumerate(zip(steps, support_counts, strict=True), start=1):
            examples.append(TeaRAGSFTExample(f"{question.key}#step{index}", "musique_step", step.subquery,
                                             answers[index - 1], render(TeaRAGPath((step,), answers[index - 1])),
                                             1, count, int(count == 0)))
    return examples


def build_tearag_sft_data(questions: Sequence[Question], triplets_by_chunk: Mapping[str, Sequence[TripletLike]],
                          settings: SFTDataSettings, *, seed: int = 0) -> tuple[list[TeaRAGSFTExample], Counter[str]]:
    """Examples of every MuSiQue record (in order) and the skip reasons counted."""
    rng = random.Random(seed)
    examples: list[TeaRAGSFTExample] = []
    skipped: Counter[str] = Counter()
    for question in questions:
        try:
            examples.extend(build_path(question, triplets_by_chunk, settings, rng))
        except SynthesisSkipped as skip:
            skipped[re.sub(r"\d+", "N", skip.reason)] += 1
    logger.info("TeaRAG SFT data: %d examples from %d records, %d skipped %s", len(examples), len(questions),
                sum(skipped.values()), dict(skipped))
    return examples, skipped


def group_triplets(triplets: Sequence[TripletLike]) -> dict[str, list[TripletLike]]:
    """Triplets by source chunk id, in order."""
    grouped: dict[str, list[TripletLike]] = {}
    for triplet in triplets:
        grouped.setdefault(triplet.chunk_id, []).append(triplet)
    return grouped
