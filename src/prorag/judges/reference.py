"""A deterministic judge with no model: string matching and retrieval grounding.

It stands in for the LLM judges where no judge model is available (the embedded CPU demo, tests). It is a
weak, lexical proxy — see :class:`ReferenceJudge` for exactly what it can and cannot catch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final, Literal

from prorag.judges.base import (
    AnswerItem,
    EquivalencePair,
    StepItem,
    Verdict,
    check_answers,
    check_pairs,
    check_steps,
)
from prorag.metrics.qa import cover_exact_match, f1_score, normalize_answer
from prorag.retrieval.base import Hit, Retriever

logger = logging.getLogger(__name__)

Equivalence = Literal["f1", "content"]
EQUIVALENCES: Final[tuple[str, ...]] = ("f1", "content")

STOP_WORDS: Final = frozenset({
    "a", "about", "above", "according", "after", "again", "against", "all", "also", "am", "an", "and", "answer",
    "any", "are", "as", "at", "based", "be", "because", "been", "before", "being", "below", "between", "both", "but",
    "by", "called", "can", "conclusion", "could", "did", "do", "does", "doing", "down", "during", "each", "few",
    "for", "from", "further", "had", "has", "have", "having", "he", "hence", "her", "here", "hers", "herself", "him",
    "himself", "his", "how", "i", "if", "in", "information", "into", "is", "it", "its", "itself", "just", "known",
    "me", "more", "most", "my", "myself", "named", "no", "nor", "not", "now", "of", "off", "on", "once", "only",
    "or", "other", "our", "ours", "ourselves", "out", "over", "own", "question", "same", "search", "she", "should",
    "since", "so", "some", "step", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then",
    "there", "therefore", "these", "they", "this", "those", "through", "thus", "to", "too", "under", "until", "up",
    "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with",
    "would", "you", "your", "yours", "yourself", "yourselves",
})
"""English function words plus step boilerplate ("conclusion", "based", "according" …): not content."""


def content_tokens(text: str) -> frozenset[str]:
    """The normalized (SQuAD normalization) tokens of ``text`` minus stop words and one-letter non-digits."""
    return frozenset(token for token in normalize_answer(text).split()
                     if token not in STOP_WORDS and (len(token) > 1 or token.isdigit()))


class ReferenceJudge:
    """A :class:`~prorag.judges.base.Judge` by string matching and retrieval grounding (deterministic).

    **Equivalence** (over-search): the two statements are equivalent when their SQuAD-normalized forms are
    equal or their token F1 is at least ``f1_threshold`` (F1 is symmetric); ``equivalence="content"`` also when
    one statement's content tokens are a subset of the other's (a one-word answer and a sentence stating it, which
    F1 misses: "Paris" vs "The capital is Paris" is F1 0.5).

    **Step verification** (under-search): a step is *grounded* — verdict True — when some single passage
    contains at least ``grounding_threshold`` of the conclusion's content tokens (:func:`content_tokens`: the
    normalized tokens minus stop words). The passages searched are, per step, the ``top_k`` hits for the step's
    conclusion, the ``top_k`` hits for the question followed by the step's reasoning (all steps in *one*
    batched ``retriever.search`` call), and any ``contexts`` passed in (e.g. what the trajectory retrieved
    earlier); a search that returns nothing grounds nothing (False). Unknown: a conclusion without content
    tokens, no retriever and no contexts, or a failed retrieval (unless the contexts alone ground the step).

    **Answer check**: cover exact match (a normalized golden answer is a substring of the normalized
    prediction).

    What it catches: a factual claim whose words are absent from every relevant passage of the corpus —
    typically a hallucinated name, date or number; a re-generated answer that restates the step's conclusion in
    nearly the same words. What it cannot catch, or gets wrong:

    * it cannot judge logic: a conclusion that does not follow from its reasoning but whose words occur in a
      passage passes, and a wrong combination of true facts ("born in 1946 in Ohio" from two passages) passes
      when the words are in one passage;
    * it flags true facts the retriever cannot surface (absent from the corpus, or retrieved poorly) as
      under-search, and correct inferences phrased with new words ("therefore they are the same age");
    * negation and word order are invisible ("X was not born in Y" is grounded by "X was born in Y");
    * paraphrases fool the F1 test both ways: "Paris" vs "The capital is Paris" scores F1 0.5 (not equivalent,
      so over-search is under-detected when the re-asked answer is short), while two sentences sharing most
      words but differing in the one that matters ("born 1946" / "born 1947") can pass a low threshold.
    """

    def __init__(self, retriever: Retriever | None = None, *, f1_threshold: float = 0.8, top_k: int = 5,
                 grounding_threshold: float = 0.6, equivalence: Equivalence = "f1") -> None:
        if equivalence not in EQUIVALENCES:
            raise ValueError(f"equivalence must be one of {EQUIVALENCES}, got {equivalence!r}")
        if not 0.0 < f1_threshold <= 1.0:
            raise ValueError(f"f1_threshold must be in (0, 1], got {f1_threshold}")
        if not 0.0 < grounding_threshold <= 1.0:
            raise ValueError(f"grounding_threshold must be in (0, 1], got {grounding_threshold}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.retriever = retriever
        self.f1_threshold = f1_threshold
        self.top_k = top_k
        self.grounding_threshold = grounding_threshold
        self.equivalence = equivalence

    def __repr__(self) -> str:
        return (f"ReferenceJudge(retriever={type(self.retriever).__name__ if self.retriever else None}, "
                f"f1_threshold={self.f1_threshold}, top_k={self.top_k}, "
                f"grounding_threshold={self.grounding_threshold}, equivalence={self.equivalence!r})")

    # ------------------------------------------------------------------------------- equivalence

    def equivalent(self, pairs: Sequence[EquivalencePair]) -> list[Verdict]:
        """Normalized exact match or token F1 ≥ ``f1_threshold``; with ``equivalence="content"`` also when the
        content tokens of one statement (:func:`content_tokens`, not empty) all occur in the other: a short answer
        ("So the answer is actor.") and a sentence that states it ("He is an American actor.")."""
        verdicts = []
        for a, b in check_pairs(pairs):
            left, right = normalize_answer(a), normalize_answer(b)
            if not left or not right:
                verdicts.append(Verdict(False, raw="empty statement"))
                continue
            f1 = f1_score(left, [right])
            same = left == right or f1 >= self.f1_threshold
            raw = f"exact={left == right} f1={f1:.3f}"
            if self.equivalence == "content":
                first, second = content_tokens(a), content_tokens(b)
                contained = bool(first and second) and (first <= second or second <= first)
                same = same or contained
                raw += f" contained={contained}"
            verdicts.append(Verdict(same, raw=raw))
        return verdicts

    # --------------------------------------------------------------------------- verification

    def verify_steps(self, steps: Sequence[StepItem], *,
                     contexts: Sequence[Sequence[str]] | None = None) -> list[Verdict]:
        """Retrieval grounding of each step's conclusion (see the class docstring)."""
        items, context_lists = check_steps(steps, contexts)
        if not items:
            return []
        hits: list[list[Hit]] = [[] for _ in items]
        retrieval_error: str | None = None
        if self.retriever is not None:
            queries = []
            for question, reasoning, conclusion in items:
                queries.extend([conclusion, f"{question} {reasoning}".strip()])
            try:
                results = self.retriever.search(queries, self.top_k)
            except Exception as error:  # a failing retriever makes the verdicts unknown, not wrong
                logger.warning("reference judge: retrieval failed: %s", error)
                retrieval_error = f"retrieval failed: {type(error).__name__}: {error}"
            else:
                if len(results) != len(queries):
                    retrieval_error = f"retriever returned {len(results)} results for {len(queries)} queries"
                else:
                    hits = [[*results[2 * i], *results[2 * i + 1]] for i in range(len(items))]
        verdicts = []
        for (_, _, conclusion), step_hits, extra in zip(items, hits, context_lists, strict=True):
            tokens = content_tokens(conclusion)
            if not tokens:
                verdicts.append(Verdict(None, error="the conclusion has no content words to ground"))
                continue
            passages: dict[str, str] = {}
            for hit in step_hits:
                passages.setdefault(f"hit:{hit.id}", f"{hit.title} {hit.text}")
            for index, text in enumerate(extra):
                passages.setdefault(f"context:{index}", text)
            if not passages:
                if self.retriever is not None and retrieval_error is None:  # searched, nothing came back
                    verdicts.append(Verdict(False, raw="no passage retrieved"))
                else:
                    error = retrieval_error or "no retriever and no context to ground the step in"
                    verdicts.append(Verdict(None, error=error))
                continue
            best_source, best = "", -1.0
            for source, text in passages.items():
                found = len(tokens & content_tokens(text)) / len(tokens)
                if found > best:
                    best_source, best = source, found
            grounded = best >= self.grounding_threshold
            if not grounded and retrieval_error is not None:  # the missing passages might have grounded it
                verdicts.append(Verdict(None, raw=f"grounded {best:.3f} in the contexts", error=retrieval_error))
                continue
            verdicts.append(Verdict(grounded, raw=f"grounded {best:.3f} of {len(tokens)} content tokens in "
                                                  f"{best_source}"))
        return verdicts

    # ------------------------------------------------------------------------------ answers

    def answer_correct(self, items: Sequence[AnswerItem]) -> list[Verdict]:
        """Cover exact match of the prediction against the golden answers."""
        verdicts = []
        for _, golden, prediction in check_answers(items):
            score = cover_exact_match(prediction, golden)
            verdicts.append(Verdict(score >= 1.0, raw=f"cem={score:g}"))
        return verdicts
