"""Gold HiPRAG trajectories from real MuSiQue decompositions and HotpotQA supporting facts."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from prorag.data.records import Passage, Question, load_passages, load_questions
from prorag.metrics.qa import normalize_answer
from prorag.protocol.hiprag import NonSearchStep, SearchStep, check_format, parse
from prorag.retrieval.base import Hit
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.store import PassageStore
from prorag.training.synthesis import (
    FIRST_HOP_DATASET,
    SynthesizedTrajectory,
    hop_questions,
    split_for_synthesis,
    synthesis_summary,
    synthesize_hotpotqa,
    synthesize_musique,
    synthesize_trajectories,
)

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw"
UNRELATED = [Passage(id=f"unrelated-{i}", title=f"Unrelated {i}", text=f"Nothing useful here, number {i}.")
             for i in range(3)]


class UnrelatedRetriever:
    """Always returns the same three unrelated passages: the gold passage is never retrieved."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        return [[Hit.from_passage(passage, 1.0) for passage in UNRELATED[:k]] for _ in queries]


@pytest.fixture(scope="module")
def musique() -> list[Question]:
    return load_questions(RAW / "qa" / "musique_train.jsonl")


@pytest.fixture(scope="module")
def hotpotqa() -> list[Question]:
    return load_questions(RAW / "qa" / "hotpotqa.jsonl")[:40]


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    passages = load_passages(RAW / "corpus" / "musique_train.jsonl") + load_passages(RAW / "corpus" / "hotpotqa.jsonl")
    return BM25Retriever.build(PassageStore(passages))


@pytest.fixture(scope="module")
def synthesized(musique, hotpotqa, bm25) -> tuple[list[SynthesizedTrajectory], dict[str, str]]:
    return synthesize_trajectories([*musique, *hotpotqa], bm25, top_k=3, seed=0, protocol="hiprag")


def test_every_trajectory_passes_the_format_check(synthesized, musique, hotpotqa):
    trajectories, skipped = synthesized
    summary = synthesis_summary(trajectories, skipped)
    print(json.dumps(summary, indent=1))
    by_source = summary["by_source"]
    assert by_source["musique_train"]["trajectories"] == 111
    assert by_source["hotpotqa"]["trajectories"] == 40
    assert set(skipped.values()) == {"unanswerable record (answerable: false)"}
    assert len(skipped) == 9
    answerable = {question.key for question in musique if question.metadata["answerable"]}
    assert {t.question_key for t in trajectories if t.source == "musique_train"} == answerable
    assert summary["total"]["steps"] == summary["total"]["search_steps"] + summary["total"]["non_search_steps"]
    questions = {question.key: question for question in [*musique, *hotpotqa]}
    for trajectory in trajectories:
        assert check_format(trajectory.completion) == (1, trajectory.n_steps)
        parsed = parse(trajectory.completion)
        assert parsed.answer == questions[trajectory.question_key].golden_answers[0]
        assert len(parsed.search_steps) == trajectory.n_search == len(trajectory.context_ids)
        assert [step.query for step in parsed.search_steps] == list(trajectory.queries)
        assert 0 <= trajectory.gold_inserted <= trajectory.n_search
        # the gold passages of the question are shown, whether retrieved or inserted
        shown = {identifier for ids in trajectory.context_ids for identifier in ids}
        assert set(questions[trajectory.question_key].supporting_passage_ids) <= shown
        assert all(1 <= len(ids) <= 3 for ids in trajectory.context_ids)


def test_musique_steps_follow_the_decomposition(synthesized, musique):
    trajectories, _ = synthesized
    by_key = {t.question_key: t for t in trajectories}
    first = by_key[musique[0].key]  # Journal of Psychotherapy Integration -> American Psychological Association
    assert first.queries == ("What company published Journal of Psychotherapy Integration",
                             "Who was the first president of American Psychological Association")
    steps = parse(first.completion).steps
    assert all(isinstance(step, SearchStep) for step in steps)
    assert "American Psychological Association" in steps[0].conclusion
    assert "G. Stanley Hall" in steps[1].conclusion
    for trajectory in trajectories:
        if trajectory.source == "musique_train":
            for step in parse(trajectory.completion).steps:  # model-written fields (passages may hold "#1")
                written = f"{step.reasoning} {step.conclusion} {getattr(step, 'query', '')}"
                assert re.search(r"#\d", written) is None and ">>" not in written
    relation = by_key[musique[1].key]  # "Hello Love >> performer", then "#1 ..." placeholders up to #3
    assert relation.queries[0] == "Hello Love performer"
    assert relation.queries[1] == "What city did Hank Snow live when he died"
    assert "The performer of Hello Love is Hank Snow." in relation.completion


def test_gold_passage_is_inserted_when_the_retriever_misses(musique):
    retriever = UnrelatedRetriever()
    skipped: dict[str, str] = {}
    trajectory = synthesize_musique(musique[1], retriever, top_k=3, rng=random.Random(0), protocol="hiprag",
                                    skipped=skipped)
    assert trajectory is not None and not skipped
    assert retriever.calls == [list(trajectory.queries)]  # one batched call per question
    assert trajectory.n_search == 4 and trajectory.gold_inserted == 4
    gold_ids = [musique[1].context_passage_ids[entry["paragraph_support_idx"]]
                for entry in musique[1].metadata["question_decomposition"]]
    positions = []
    for ids, gold in zip(trajectory.context_ids, gold_ids, strict=True):
        assert len(ids) == 3 and gold in ids  # the last unrelated hit was replaced
        assert [i for i in ids if i != gold] == ["unrelated-0", "unrelated-1"]
        positions.append(ids.index(gold))
    again = synthesize_musique(musique[1], UnrelatedRetriever(), top_k=3, rng=random.Random(0), protocol="hiprag")
    assert again == trajectory  # the positions come from the caller's rng
    for step in parse(trajectory.completion).search_steps:
        assert "Nothing useful here" in step.context


def test_retrieved_gold_passage_is_not_counted_as_inserted(musique):
    question = musique[0]
    paragraphs = {p["idx"]: p for p in question.metadata["paragraphs"]}

    class GoldFirst:
        def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
            decomposition = question.metadata["question_decomposition"]
            return [[Hit(id=question.context_passage_ids[entry["paragraph_support_idx"]],
                         title=paragraphs[entry["paragraph_support_idx"]]["title"],
                         text=paragraphs[entry["paragraph_support_idx"]]["paragraph_text"], score=2.0),
                     Hit.from_passage(UNRELATED[0], 1.0)] for entry in decomposition]

    trajectory = synthesize_musique(question, GoldFirst(), top_k=3, rng=random.Random(0), protocol="hiprag")
    assert trajectory is not None and trajectory.gold_inserted == 0
    assert all(len(ids) == 2 for ids in trajectory.context_ids)


def test_without_a_retriever_the_context_is_the_gold_passage(hotpotqa):
    trajectory = synthesize_hotpotqa(hotpotqa[0], None, rng=random.Random(0), protocol="hiprag")
    assert trajectory is not None
    assert trajectory.gold_inserted == trajectory.n_search == 2
    assert all(len(ids) == 1 for ids in trajectory.context_ids)


def test_yes_no_comparison_ends_with_a_non_search_decision(hotpotqa):
    question = next(q for q in hotpotqa if q.metadata["type"] == "comparison" and q.golden_answers[0] == "yes")
    trajectory = synthesize_hotpotqa(question, UnrelatedRetriever(), rng=random.Random(1), protocol="hiprag")
    assert trajectory is not None and trajectory.kind == "hotpotqa/comparison"
    parsed = parse(trajectory.completion)
    assert [type(step) for step in parsed.steps] == [SearchStep, SearchStep, NonSearchStep]
    assert parsed.answer == "yes"
    assert parsed.steps[-1].conclusion.endswith("the answer is yes.")
    # each search step quotes the supporting sentence of its entity
    assert question.question.startswith("Are Centaurium and Dacrydium")
    assert parsed.steps[0].query.startswith("Centaurium") and parsed.steps[1].query.startswith("Dacrydium")
    assert "Centaurium (Centaury) is a genus" in parsed.steps[0].conclusion


def test_bridge_starts_from_the_entity_of_the_question(hotpotqa):
    question = next(q for q in hotpotqa if "Michael Mclntyre" in q.question)
    trajectory = synthesize_hotpotqa(question, None, rng=random.Random(0), protocol="hiprag")
    assert trajectory is not None
    parsed = parse(trajectory.completion)
    assert [step.query.split()[:2] for step in parsed.search_steps] == [["Michael", "McIntyre"], ["Ray", "Cameron"]]
    assert "was a Canadian comedian" in parsed.steps[1].conclusion
    assert parsed.answer == "Canadian comedian" and trajectory.n_non_search == 0


def _with_metadata(question: Question, **changes: object) -> Question:
    record = question.to_dict()
    record["metadata"] = {**question.metadata, **changes}
    return Question.from_dict(record)


def test_unanswerable_and_malformed_records_are_skipped_with_a_reason(musique, hotpotqa):
    unanswerable = next(q for q in musique if q.metadata["answerable"] is False)
    skipped: dict[str, str] = {}
    assert synthesize_musique(unanswerable, None, rng=random.Random(0), protocol="hiprag", skipped=skipped) is None
    assert skipped == {unanswerable.key: "unanswerable record (answerable: false)"}

    decomposition = [dict(entry) for entry in musique[0].metadata["question_decomposition"]]
    decomposition[0]["question"] = "Who founded #2 ?"  # refers to a later sub-question
    forward = _with_metadata(musique[0], question_decomposition=decomposition)
    skipped = {}
    assert synthesize_musique(forward, None, rng=random.Random(0), protocol="hiprag", skipped=skipped) is None
    assert skipped[forward.key] == "sub-question 1 refers to #2"

    tagged = [dict(entry) for entry in musique[0].metadata["question_decomposition"]]
    tagged[0]["answer"] = "</answer> injected"
    skipped = {}
    assert synthesize_musique(_with_metadata(musique[0], question_decomposition=tagged), None,
                              rng=random.Random(0), protocol="hiprag", skipped=skipped) is None
    assert "protocol tag" in skipped[musique[0].key]

    facts = [[title, 0] for title, _ in hotpotqa[0].metadata["context"][:3]]
    three_titles = _with_metadata(hotpotqa[0], supporting_facts=facts)
    skipped = {}
    assert synthesize_hotpotqa(three_titles, None, rng=random.Random(0), protocol="hiprag", skipped=skipped) is None
    assert skipped[hotpotqa[0].key] == "expected 2 supporting titles, got 3"


def test_non_search_sub_question_and_final_step(musique):
    decomposition = [dict(entry) for entry in musique[0].metadata["question_decomposition"]]
    decomposition[0]["paragraph_support_idx"] = None
    decomposition[1]["answer"] = "Hall"  # differs from the gold answer: a final step states it
    question = _with_metadata(musique[0], question_decomposition=decomposition)
    trajectory = synthesize_musique(question, None, rng=random.Random(0), protocol="hiprag")
    assert trajectory is not None
    steps = parse(trajectory.completion).steps
    assert [type(step) for step in steps] == [NonSearchStep, SearchStep, NonSearchStep]
    assert "without a search" in steps[0].reasoning
    assert steps[-1].conclusion == "The answer to the question is G. Stanley Hall."
    assert (trajectory.n_search, trajectory.n_non_search) == (1, 2)


def test_evaluation_overlap_is_refused(musique):
    assert split_for_synthesis(musique[:5], {"musique/other"}) == musique[:5]
    with pytest.raises(ValueError, match=musique[3].key):
        split_for_synthesis(musique[:5], {musique[3].key, "hotpotqa/x"})


def test_to_dict_round_trip_and_summary(synthesized):
    trajectories, skipped = synthesized
    for trajectory in trajectories[:5]:
        record = json.loads(json.dumps(trajectory.to_dict()))
        assert SynthesizedTrajectory.from_dict(record) == trajectory
    summary = synthesis_summary(trajectories, skipped)
    hotpot = summary["by_source"]["hotpotqa"]
    assert hotpot["non_search_steps"] == sum(1 for t in trajectories if t.kind == "hotpotqa/comparison") + sum(
        1 for t in trajectories if t.kind == "hotpotqa/bridge" and t.answer in ("yes", "no"))
    assert summary["skip_reasons"] == {"unanswerable record (answerable: false)": 9}
    assert synthesis_summary([])["total"]["search_share"] == 0.0


# ------------------------------------------------------------------------------------ single search


class FixedRetriever:
    """Returns the given passages, in order, for every query."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [[Hit.from_passage(passage, 1.0 - rank / 10) for rank, passage in enumerate(self.passages[:k])]
                for _ in queries]


def _popqa_question(answers: tuple[str, ...] = ("politician", "pol")) -> Question:
    return Question(id="0", question="What is George Rankin's occupation?", golden_answers=answers,
                    dataset="popqa", split="test")


def test_single_search_quotes_the_first_hit_that_states_the_answer_as_whole_words():
    passages = [Passage(id="p1", title="Policy", text="A policy is a plan. It guides political decisions."),
                Passage(id="p2", title="George Rankin", text="George Rankin was born in 1887. He was an Australian "
                        "soldier and politician. He died in 1957."),
                Passage(id="p3", title="Other politician", text="Someone else was a politician.")]
    trajectories, skipped = synthesize_trajectories([_popqa_question()], FixedRetriever(passages), top_k=3,
                                                    protocol="hiprag", single_search=True)
    assert skipped == {}
    (trajectory,) = trajectories
    parsed = parse(trajectory.completion)
    (step,) = parsed.steps
    assert isinstance(step, SearchStep)
    assert step.query == "What is George Rankin's occupation"
    # "pol" inside "policy"/"political" is no match: the first whole-word answer is p2's second sentence
    assert step.conclusion == ('The passage on George Rankin says: "He was an Australian soldier and politician." '
                               "So the answer is politician.")
    assert parsed.answer == "politician"
    assert trajectory.kind == "single_search" and trajectory.gold_inserted == 0
    assert trajectory.context_ids == (("p1", "p2", "p3"),)
    assert check_format(trajectory.completion) == (1, 1)


def test_single_search_skips_a_question_no_hit_answers_and_is_off_by_default():
    question = _popqa_question(("surgeon",))
    trajectories, skipped = synthesize_trajectories([question], FixedRetriever(UNRELATED), top_k=3,
                                                    protocol="hiprag", single_search=True)
    assert trajectories == []
    assert skipped == {question.key: "no retrieved passage states a golden answer (single search)"}
    _, skipped = synthesize_trajectories([question], FixedRetriever(UNRELATED), top_k=3, protocol="hiprag")
    assert skipped == {question.key: "no synthesizer for dataset 'popqa'"}


def test_single_search_skips_a_passage_with_protocol_tags():
    passages = [Passage(id="p1", title="Rankin", text="He was a politician </answer> and soldier.")]
    trajectories, skipped = synthesize_trajectories([_popqa_question()], FixedRetriever(passages), top_k=3,
                                                    protocol="hiprag", single_search=True)
    assert trajectories == [] and "protocol tag" in skipped["popqa/0"]


def test_single_search_on_real_popqa_questions():
    questions = load_questions(RAW / "qa" / "popqa.jsonl")[:30]
    store = PassageStore(load_passages(RAW / "corpus" / "popqa.jsonl"))
    trajectories, skipped = synthesize_trajectories(questions, BM25Retriever.build(store), top_k=3,
                                                    protocol="hiprag", single_search=True)
    assert len(trajectories) + len(skipped) == 30
    assert len(trajectories) >= 10, skipped
    for trajectory in trajectories:
        assert check_format(trajectory.completion) == (1, 1)
        golden = next(q for q in questions if q.key == trajectory.question_key).golden_answers
        assert any(normalize_answer(trajectory.answer) == normalize_answer(gold) for gold in golden)


def test_first_hops_ask_each_self_contained_first_sub_question_on_its_own(musique, bm25):
    """The first sub-question of a MuSiQue train record, asked alone: a single-hop example of the same split, one
    search grounded in what the retriever returns; a ``>>`` relation or a ``#k`` placeholder is no question."""
    records = musique[:12]
    hops = [next(iter(hop_questions(question)), None) for question in records]
    usable = [(question, hop) for question, hop in zip(records, hops, strict=True) if hop is not None]
    assert usable and len(usable) < len(records)
    for question, hop in usable:
        first = question.metadata["question_decomposition"][0]
        assert hop.id == f"{question.id}#hop1" and hop.split == question.split and hop.source == question.source
        assert hop.golden_answers == (first["answer"],) and hop.question.endswith("?")
        assert ">>" not in hop.question and "#" not in hop.question
    for question, hop in zip(records, hops, strict=True):
        if hop is None:
            first = question.metadata["question_decomposition"][0]["question"]
            assert ">>" in first or re.search(r"#\d", first)
    plain, _ = synthesize_trajectories(records, bm25, top_k=3, seed=0, protocol="hiprag")
    with_hops, skipped = synthesize_trajectories(records, bm25, top_k=3, seed=0, protocol="hiprag", first_hops=True)
    extra = [trajectory for trajectory in with_hops if trajectory.dataset == FIRST_HOP_DATASET]
    assert [trajectory for trajectory in with_hops if trajectory.dataset != FIRST_HOP_DATASET] == plain
    assert extra and len(extra) + sum(key.startswith(f"{FIRST_HOP_DATASET}/") for key in skipped) == len(usable)
    for trajectory in extra:
        assert trajectory.kind == "single_search" and trajectory.n_search == 1 and trajectory.n_non_search == 0
        assert check_format(trajectory.completion) == (1, 1)
        hop = next(hop for _, hop in usable if hop.key == trajectory.question_key)
        assert normalize_answer(trajectory.answer) == normalize_answer(hop.golden_answers[0])


def test_reasonrag_gold_transcripts_parse_as_the_engine_writes_them(musique, bm25):
    """ReasonRAG renders gold trajectories (the cold start of its explorer): each planned search a query round with
    the retrieved documents and its conclusion as the evidence, the label mask training only what the model writes."""
    from prorag.protocol.reasonrag import ReasonRAGAdapter, parse

    adapter = ReasonRAGAdapter()
    trajectories, _ = synthesize_trajectories(musique[:10], bm25, top_k=3, seed=0, protocol=adapter,
                                              first_hops=True)
    hiprag, _ = synthesize_trajectories(musique[:10], bm25, top_k=3, seed=0, protocol="hiprag", first_hops=True)
    assert [t.question_key for t in trajectories] == [t.question_key for t in hiprag]
    for trajectory, twin in zip(trajectories, hiprag, strict=True):
        parsed = parse(trajectory.completion)
        queries = [item.content for item in parsed.rounds if item.action == "query"]
        assert queries == list(twin.queries) and parsed.rounds[-1].content == trajectory.answer
        pieces = adapter.label_pieces(trajectory.completion)
        assert "".join(text for text, _ in pieces) == trajectory.completion
        trained = "".join(text for text, written in pieces if written)
        assert "<documents>" not in trained and "Doc 1(Title:" not in trained
        assert trained.count("</evidence>") == len(queries) and trained.endswith("</answer>")


def test_later_hops_fill_in_the_earlier_sub_answers(musique, bm25):
    """With ``later_hops`` every sub-question becomes a single-hop question, ``#j`` replaced by the j-th
    sub-answer; ``>>`` relations are no question, but their answers still fill the later hops."""
    records = musique[:12]
    for question in records:
        decomposition = question.metadata["question_decomposition"]
        hops = hop_questions(question, later=True)
        assert [hop.id for hop in hops] == [f"{question.id}#hop{index}" for index, step in enumerate(decomposition, 1)
                                            if ">>" not in step["question"]]
        for hop in hops:
            step = decomposition[int(hop.id.rsplit("#hop", 1)[1]) - 1]
            assert hop.golden_answers == (step["answer"],) and not re.search(r"#\d", hop.question)
            for j in re.findall(r"#(\d+)", step["question"]):
                assert decomposition[int(j) - 1]["answer"] in hop.question
    first_only, _ = synthesize_trajectories(records, bm25, top_k=3, seed=0, protocol="hiprag", first_hops=True)
    every, _ = synthesize_trajectories(records, bm25, top_k=3, seed=0, protocol="hiprag", first_hops=True,
                                       later_hops=True)
    assert set(t.question_key for t in first_only) < set(t.question_key for t in every)
    later_only, _ = synthesize_trajectories(records, bm25, top_k=3, seed=0, protocol="hiprag", later_hops=True)
    assert not any(t.question_key.endswith("#hop1") for t in later_only)
    assert any(t.question_key.endswith("#hop2") for t in later_only)
