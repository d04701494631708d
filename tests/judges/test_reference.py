"""ReferenceJudge: string equivalence, retrieval grounding over a real BM25 index, cover exact match."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from prorag.data.records import Passage
from prorag.judges import Judge, ReferenceJudge
from prorag.judges.reference import content_tokens
from prorag.retrieval.base import Hit
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.store import PassageStore

PASSAGES = [
    Passage("p1", "Steven Spielberg", "Steven Allan Spielberg is an American filmmaker. He was born in Cincinnati, "
                                      "Ohio, on December 18, 1946."),
    Passage("p2", "Jaws (film)", "Jaws is a 1975 American thriller film directed by Steven Spielberg."),
    Passage("p3", "Lacy J. Dalton", "Lacy J. Dalton (born Jill Lynne Byrem) is an American country singer from "
                                    "Bloomsburg, Pennsylvania."),
    Passage("p4", "Cincinnati", "Cincinnati is a city in the U.S. state of Ohio on the Ohio River."),
]


class CountingRetriever:
    """Wraps a retriever and records each ``search`` call."""

    def __init__(self, inner: BM25Retriever, *, fail: bool = False) -> None:
        self.inner = inner
        self.fail = fail
        self.calls: list[list[str]] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        if self.fail:
            raise ConnectionError("retrieval server down")
        return self.inner.search(queries, k)


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.build(PassageStore(PASSAGES))


def test_is_a_judge():
    assert isinstance(ReferenceJudge(), Judge)


def test_equivalence_by_normalized_match_or_f1():
    judge = ReferenceJudge(f1_threshold=0.8)
    verdicts = judge.equivalent([
        ("Steven Spielberg was born in Cincinnati, Ohio.", "steven spielberg was born in cincinnati ohio"),
        ("Spielberg was born in Cincinnati Ohio", "Steven Spielberg was born in Cincinnati Ohio"),  # F1 0.92
        ("Paris", "The capital of France is Paris."),  # a short re-ask against a sentence: F1 0.4
        ("Born in 1946", "Born in 1947"),
        ("", "anything"),
    ])
    assert [v.value for v in verdicts] == [True, True, False, False, False]
    assert "f1=" in verdicts[1].raw
    assert ReferenceJudge(f1_threshold=0.3).equivalent([("Paris", "The capital of France is Paris.")])[0].value


def test_content_equivalence_matches_a_short_answer_with_a_sentence_stating_it():
    pairs = [("So the answer is actor.", "Will Smith is an American actor, rapper and record producer."),
             ("So the answer is politician.", "Will Smith is an American actor."),
             ("So the answer is actor.", "It is so."),  # no content words on one side: not equivalent
             ("Born in 1946", "Born in 1947")]
    assert [v.value for v in ReferenceJudge().equivalent(pairs)] == [False, False, False, False]
    content = ReferenceJudge(equivalence="content")
    verdicts = content.equivalent(pairs)
    assert [v.value for v in verdicts] == [True, False, False, False]
    assert "contained=True" in verdicts[0].raw and "equivalence='content'" in repr(content)
    with pytest.raises(ValueError, match="equivalence must be one of"):
        ReferenceJudge(equivalence="cover")  # type: ignore[arg-type]


def test_content_tokens_drop_stop_words_and_punctuation():
    assert content_tokens("The conclusion: Spielberg was born in Cincinnati, Ohio!") == {
        "spielberg", "born", "cincinnati", "ohio"}
    assert content_tokens("It is so.") == frozenset()


def test_grounded_steps_pass_and_unsupported_claims_are_flagged(bm25):
    retriever = CountingRetriever(bm25)
    judge = ReferenceJudge(retriever, top_k=2, grounding_threshold=0.6)
    verdicts = judge.verify_steps([
        ("Where was the director of Jaws born?", "I know who directed Jaws.", "Jaws was directed by Steven Spielberg."),
        ("Where was the director of Jaws born?", "I recall his birthplace.", "Spielberg was born in Cincinnati, Ohio."),
        ("Where was the director of Jaws born?", "I recall his birthplace.", "Spielberg was born in Phoenix, Arizona."),
        ("Who sang Slow Down?", "Known.", "Yes."),  # "yes" is not in any passage
        ("Q?", "It follows.", "It is so."),  # nothing to ground
    ])
    assert [v.value for v in verdicts] == [True, True, False, False, None]
    assert verdicts[1].raw.startswith("grounded 1.000") and "hit:p1" in verdicts[1].raw
    assert verdicts[4].error == "the conclusion has no content words to ground"
    assert len(retriever.calls) == 1 and len(retriever.calls[0]) == 10  # one batched call: 2 queries per step


def test_contexts_ground_steps_and_retrieval_failures_are_unknown(bm25):
    step = ("Where was Lacy J. Dalton born?", "From the earlier search.", "Dalton was born in Bloomsburg.")
    wrong = ("Where was Lacy J. Dalton born?", "Guess.", "Dalton was born in Denver, Colorado.")
    no_retriever = ReferenceJudge(None)
    assert [v.value for v in no_retriever.verify_steps([step])] == [None]
    grounded = no_retriever.verify_steps([step, wrong], contexts=[["Lacy Dalton was born in Bloomsburg, PA."], []])
    assert [v.value for v in grounded] == [True, None]
    failing = ReferenceJudge(CountingRetriever(bm25, fail=True))
    verdicts = failing.verify_steps([step, wrong], contexts=[["Lacy Dalton was born in Bloomsburg."], ["Nothing."]])
    assert verdicts[0].value is True  # the contexts alone ground it
    assert verdicts[1].value is None and "retrieval failed: ConnectionError" in verdicts[1].error
    with pytest.raises(ValueError):
        no_retriever.verify_steps([step], contexts=[])


def test_answer_check_is_cover_exact_match():
    verdicts = ReferenceJudge().answer_correct([
        ("Q", ["Cincinnati"], "He was born in Cincinnati, Ohio."),
        ("Q", ("Bloomsburg", "Bloomsburg, Pennsylvania"), "Denver"),
        ("Q", "1946", "in 1946"),
    ])
    assert [v.value for v in verdicts] == [True, False, True]


def test_invalid_thresholds():
    for options in ({"f1_threshold": 0.0}, {"grounding_threshold": 1.5}, {"top_k": 0}):
        with pytest.raises(ValueError):
            ReferenceJudge(**options)
