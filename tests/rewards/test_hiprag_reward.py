"""HiPRAG's hierarchical reward (eq. 1), the Search-R1 reward (λp = 0) and N_corr with unknown verdicts."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prorag.judges import StepVerdict, StepVerdicts
from prorag.rewards import (
    count_optimal,
    hierarchical_reward,
    process_bonus_fires,
    rollout_reward,
    search_r1_reward,
)

lambdas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def steps_and_optimal(draw: st.DrawFn) -> tuple[int, int]:
    n_steps = draw(st.integers(min_value=1, max_value=50))
    return n_steps, draw(st.integers(min_value=0, max_value=n_steps))


@settings(max_examples=200, deadline=None)
@given(counts=steps_and_optimal(), lambda_f=lambdas, lambda_p=st.floats(min_value=0.0, max_value=1.0))
def test_correct_and_well_formed_gets_one_plus_the_bonus(counts, lambda_f, lambda_p):
    n_steps, n_optimal = counts
    reward = hierarchical_reward(True, True, n_steps, n_optimal, lambda_f=lambda_f, lambda_p=lambda_p)
    assert reward.total == pytest.approx(1 + lambda_p * n_optimal / n_steps)
    assert reward.total == pytest.approx(reward.outcome + reward.format + reward.process)
    assert reward.process == pytest.approx(lambda_p * n_optimal / n_steps)


@settings(max_examples=100, deadline=None)
@given(counts=steps_and_optimal(), lambda_f=lambdas)
def test_lambda_p_zero_is_outcome_plus_format_for_all_four_cases(counts, lambda_f):
    n_steps, n_optimal = counts
    for a, f in itertools.product((0, 1), repeat=2):
        expected = a * (1 - lambda_f) + lambda_f * f
        reward = hierarchical_reward(bool(a), bool(f), n_steps if f else -1, n_optimal if f else 0,
                                     lambda_f=lambda_f, lambda_p=0.0)
        assert reward.total == pytest.approx(expected) and reward.process == 0.0
        assert search_r1_reward(bool(a), bool(f), lambda_f=lambda_f).total == pytest.approx(expected)


def test_defaults_and_gating():
    assert hierarchical_reward(True, True, 4, 3).total == pytest.approx(1 + 0.4 * 0.75)
    assert hierarchical_reward(False, True, 4, 4).total == pytest.approx(0.2)  # no bonus without A
    assert hierarchical_reward(True, False, -1, 0).total == pytest.approx(0.8)  # F = 0: (0, -1) from check_format
    assert hierarchical_reward(False, False, -1, 7).total == 0.0
    assert hierarchical_reward(0.5, 1.0, 2, 1).total == pytest.approx(0.5 * 0.8 + 0.2 + 0.4 * 0.5 * 0.5)


@pytest.mark.parametrize(("args", "error"), [
    ((True, True, 0, 0), ValueError),  # a well-formed trajectory has a step
    ((True, True, 3, 4), ValueError),  # n_optimal > n_steps
    ((True, True, 3, -1), ValueError),
    ((1.5, True, 3, 1), ValueError),
    ((True, True, 3.0, 1), TypeError),
])
def test_invalid_inputs(args, error):
    with pytest.raises(error):
        hierarchical_reward(*args)
    with pytest.raises(ValueError):
        hierarchical_reward(True, True, 3, 1, lambda_f=1.5)
    with pytest.raises(ValueError):
        hierarchical_reward(True, True, 3, 1, lambda_p=-0.1)


def steps(*spec: tuple[str, bool | None]) -> StepVerdicts:
    """``("s", over)`` for a search step, ``("n", under)`` for a non-search step."""
    items = tuple(StepVerdict(0, index, "search", True, over=flag) if kind == "s"
                  else StepVerdict(0, index, "non_search", True, under=flag)
                  for index, (kind, flag) in enumerate(spec))
    return StepVerdicts(0, items)


def test_count_optimal_counts_both_kinds_and_modes():
    trajectory = steps(("s", False), ("s", True), ("n", False), ("n", True), ("n", False))
    both = count_optimal(trajectory)
    assert (both.n_optimal, both.n_steps, both.n_over, both.n_under, both.n_unknown) == (3, 5, 1, 1, 0)
    assert (both.n_search, both.n_non_search) == (2, 3)
    assert count_optimal(trajectory, "over_only").n_optimal == 4  # non-search steps all optimal
    assert count_optimal(trajectory, "under_only").n_optimal == 4  # search steps all optimal
    with pytest.raises(ValueError):
        count_optimal(trajectory, "all")


@settings(max_examples=100, deadline=None)
@given(flags=st.lists(st.tuples(st.sampled_from("sn"), st.sampled_from([True, False, None])), min_size=1,
                      max_size=12),
       mode=st.sampled_from(["both", "over_only", "under_only"]))
def test_unknown_verdicts_never_raise_the_reward(flags, mode):
    """Resolving an unknown verdict either way never lowers the reward: unknown is the worst case."""
    unknown = steps(*flags)
    count = count_optimal(unknown, mode)
    as_bad = count_optimal(steps(*[(kind, True if flag is None else flag) for kind, flag in flags]), mode)
    as_good = count_optimal(steps(*[(kind, False if flag is None else flag) for kind, flag in flags]), mode)
    assert count.n_optimal == as_bad.n_optimal <= as_good.n_optimal
    checked_unknown = sum(flag is None and (mode == "both" or (kind == "s") == (mode == "over_only"))
                          for kind, flag in flags)
    assert count.n_unknown == checked_unknown and as_good.n_optimal - count.n_optimal == checked_unknown
    n = len(flags)
    assert hierarchical_reward(True, True, n, count.n_optimal).total <= \
        hierarchical_reward(True, True, n, as_good.n_optimal).total


class _Rollout:
    def __init__(self, answer: str | None, format_ok: bool, n_steps: int) -> None:
        self.answer, self.golden_answers, self.format_ok, self.n_steps = answer, ("Paris",), format_ok, n_steps


def test_rollout_reward_uses_cem_format_and_verdicts():
    verdicts = steps(("s", True), ("n", False))
    result = rollout_reward(_Rollout("It is Paris, France", True, 2), verdicts)
    assert result.reward.total == pytest.approx(1 + 0.4 * 0.5) and result.optimal.n_over == 1
    assert rollout_reward(_Rollout("Lyon", True, 2), verdicts).reward.total == pytest.approx(0.2)
    assert rollout_reward(_Rollout(None, False, -1), None).reward.total == 0.0
    assert rollout_reward(_Rollout("Paris", True, 2), None, lambda_p=0.0).reward.total == pytest.approx(1.0)
    with pytest.raises(ValueError):
        rollout_reward(_Rollout("Paris", True, 3), verdicts)  # step count mismatch
    with pytest.raises(ValueError):
        rollout_reward(_Rollout("Paris", True, 2), None)


def test_the_process_bonus_gate_is_a_f_n_corr_whatever_lambda_p():
    one_optimal = steps(("s", True), ("n", False))
    none_optimal = steps(("s", True), ("n", None))  # over-search, then an unknown verdict: N_corr = 0
    assert process_bonus_fires(_Rollout("It is Paris", True, 2), one_optimal) is True
    assert process_bonus_fires(_Rollout("It is Paris", True, 2), none_optimal) is False
    assert process_bonus_fires(_Rollout("Lyon", True, 2), one_optimal) is False  # A = 0
    assert process_bonus_fires(_Rollout(None, False, -1), None) is False  # F = 0: no verdicts needed
    assert process_bonus_fires(_Rollout("Paris", True, 2), None) is None  # depends on N_corr, which is unknown
    assert process_bonus_fires(_Rollout("Paris", True, 2), steps(("s", True), ("n", True)), "over_only") is True
    # the gate is open exactly where eq. 1 with λp > 0 pays a bonus
    for rollout, verdicts in ((_Rollout("Paris", True, 2), one_optimal), (_Rollout("Paris", True, 2), none_optimal),
                              (_Rollout("Lyon", True, 2), one_optimal)):
        assert process_bonus_fires(rollout, verdicts) == (rollout_reward(rollout, verdicts).reward.process > 0)
