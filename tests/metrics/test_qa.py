import pytest
from hypothesis import given
from hypothesis import strategies as st

from prorag.metrics import cover_exact_match, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  An   apple, a day ", "apple day"),
        ("Theatre of the Absurd", "theatre of absurd"),
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_exact_match_takes_best_golden_answer():
    assert exact_match("the Pittsburgh Pirates", ["Orioles", "Pittsburgh Pirates"]) == 1.0
    assert exact_match("Pirates of Pittsburgh", ["Orioles", "Pittsburgh Pirates"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0


def test_cover_exact_match_is_normalized_substring():
    assert cover_exact_match("I think it was Denise Levertov, born 1923.", ["Denise Levertov"]) == 1.0
    assert cover_exact_match("Levertov", ["Denise Levertov"]) == 0.0
    # plain substring, as the paper and its reference evaluators define CEM
    assert cover_exact_match("in 1990", ["199"]) == 1.0
    # a golden answer that normalizes to nothing never matches
    assert cover_exact_match("anything", ["The", "!!"]) == 0.0


def test_f1_partial_overlap_and_yes_no_rule():
    assert f1_score("Pittsburgh", ["Pittsburgh Pirates"]) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1_score("no", ["yes"]) == 0.0
    assert f1_score("yes it is", ["yes"]) == 0.0
    assert f1_score("yes", ["yes"]) == 1.0
    assert f1_score("", ["a b"]) == 0.0


def test_string_golden_answer_is_one_answer_not_characters():
    assert exact_match("paris", "Paris") == 1.0
    assert cover_exact_match("x", "Paris") == 0.0


@given(st.text(), st.lists(st.text(), max_size=4))
def test_metrics_are_bounded_and_ordered(prediction, golden):
    em = exact_match(prediction, golden)
    cem = cover_exact_match(prediction, golden)
    f1 = f1_score(prediction, golden)
    for value in (em, cem, f1):
        assert 0.0 <= value <= 1.0
    if em == 1.0 and normalize_answer(prediction):
        assert cem == 1.0
        assert f1 == pytest.approx(1.0)


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    from prorag.metrics.qa import bootstrap_interval

    scores = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0] * 3  # mean 0.3 over 30 questions
    low, high = bootstrap_interval(scores, seed=3)
    assert (low, high) == bootstrap_interval(scores, seed=3)
    assert 0.05 < low < 0.3 < high < 0.55
    narrow = bootstrap_interval(scores * 10, seed=3)  # 10x the questions: a narrower interval
    assert narrow[1] - narrow[0] < 0.6 * (high - low)
    assert bootstrap_interval([0.0] * 10) == (0.0, 0.0)
    assert all(value != value for value in bootstrap_interval([1.0]))  # one question: no interval (nan)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval(scores, confidence=1.5)


def test_answer_intervals_cover_cem_em_f1():
    from prorag.metrics.qa import answer_intervals

    intervals = answer_intervals(["Paris", "the Paris city", None, "Rome"], [["Paris"], ["Paris"], ["Oslo"], ["Oslo"]])
    assert set(intervals) == {f"{m}_{side}" for m in ("cem", "em", "f1") for side in ("low", "high")}
    assert intervals["cem_low"] <= 0.5 <= intervals["cem_high"]
    assert intervals["em_low"] <= 0.25 <= intervals["em_high"]
    with pytest.raises(ValueError, match="predictions"):
        answer_intervals(["a"], [])
