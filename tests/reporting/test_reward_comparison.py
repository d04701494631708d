"""The HiPRAG vs Search-R1 report on hand-made runs: per-question tables from trajectory and verdict records,
intervals over questions with seeds pooled per question, the paired Δ with the questions it would need, the share
of training rollouts whose bonus fired, and the report and figure."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from prorag.agent.trajectory import Rollout
from prorag.metrics.compare import paired_test, questions_needed
from prorag.metrics.qa import bootstrap_interval
from prorag.reporting.reward_comparison import (
    POOLED,
    QUESTION_COLUMNS,
    RunResult,
    comparison_rows,
    curves_figure,
    paired_differences,
    pooled_questions,
    question_table,
    ratio_interval,
    render_report,
    training_curve,
)

KEYS = [f"q{index}" for index in range(6)]


def _rollout_record(key: str, answer: str | None, steps: list[dict] | None, retrievals: int) -> dict:
    return Rollout(question_key=key, question_id=key, dataset="popqa" if key < "q3" else "hotpotqa",
                   question=f"question {key}?", golden_answers=("Paris",), method="hiprag_agent_rl",
                   protocol="hiprag", prompt="", prompt_token_ids=[], completion="", segments=[], steps=steps,
                   format_ok=steps is not None, n_steps=len(steps) if steps is not None else -1, answer=answer,
                   stop_reason="answer", retrieval_count=retrievals, queries=[], retrieved_ids=[],
                   generated_tokens=10, context_tokens=0, tag_tokens=0, turns=1).to_dict()


def _questions(cem: list[float], *, over: list[int] | None = None, retrievals: list[float] | None = None
               ) -> pd.DataFrame:
    """A question table over the first len(cem) keys: one search step (over-search where ``over``) and one
    non-search step per question, every verdict known and no under-search."""
    n = len(cem)
    over = over if over is not None else [0] * n
    return pd.DataFrame({
        "question_key": KEYS[:n], "dataset": ["popqa"] * n, "cem": cem, "format_ok": [1.0] * n,
        "retrievals": retrievals if retrievals is not None else [1.0] * n, "search_steps": [1] * n,
        "non_search_steps": [1] * n, "over_search": over, "over_known": [1] * n, "under_search": [0] * n,
        "under_known": [1] * n, "judge_unknown": [0] * n, "judge_checked": [2] * n}, columns=list(QUESTION_COLUMNS))


def _curve(rewards: list[float], bonus: list[float], shaped: list[float] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"step": range(1, len(rewards) + 1), "reward": rewards, "bonus_fired": bonus,
                         "process_shaped": shaped if shaped is not None else [math.nan] * len(rewards),
                         "cem": [math.nan] * len(rewards)})


@pytest.fixture
def runs() -> list[RunResult]:
    return [
        RunResult("hiprag", 0, _questions([1, 1, 0, 1, 0, 1], over=[0, 0, 1, 0, 0, 0]),
                  _curve([0.2, 0.6], [0.0, 0.5], [0.0, 1.0]), seconds=600.0, lambda_p=0.4),
        RunResult("hiprag", 1, _questions([1, 0, 0, 1, 1, 1], over=[1, 0, 1, 0, 0, 0]),
                  _curve([0.3, 0.5], [0.25, 0.25], [0.0, 0.0]), seconds=660.0, lambda_p=0.4),
        RunResult("search_r1", 0, _questions([0, 1, 0, 0, 0, 1], over=[1, 1, 1, 0, 0, 0]),
                  _curve([0.2, 0.3], [0.0, 0.25], [0.0, 0.0]), seconds=500.0, lambda_p=0.0),
        RunResult("search_r1", 1, _questions([0, 0, 0, 1, 0, 1], over=[1, 1, 0, 0, 0, 0]),
                  _curve([0.1, 0.2], [0.0, 0.0]), seconds=540.0, lambda_p=0.0),
    ]


def test_question_table_from_trajectory_and_verdict_records():
    search = {"kind": "search", "reasoning": "r", "query": "q", "context": "c", "conclusion": "Paris"}
    think = {"kind": "non_search", "reasoning": "r", "query": None, "context": None, "conclusion": "Paris"}
    trajectories = [_rollout_record("q0", "It is Paris", [search, think], 1),
                    _rollout_record("q1", None, None, 0),  # broken format: no steps, no verdicts
                    _rollout_record("q2", "Lyon", [search, search, think], 2)]
    verdicts = [
        {"question_key": "q0", "method": "hiprag_agent_rl", "skipped": False,
         "steps": [{"kind": "search", "checked": True, "over": True}, {"kind": "non_search", "checked": True}]},
        {"question_key": "q1", "method": "hiprag_agent_rl", "skipped": True, "steps": []},
        {"question_key": "q2", "method": "hiprag_agent_rl", "skipped": False,
         "steps": [{"kind": "search", "checked": True, "over": False}, {"kind": "search", "checked": True},
                   {"kind": "non_search", "checked": True, "under": True}]}]
    table = question_table(trajectories, verdicts).set_index("question_key")
    assert table["cem"].tolist() == [1.0, 0.0, 0.0]
    assert table["retrievals"].tolist() == [1.0, 0.0, 2.0]
    assert table["format_ok"].tolist() == [1.0, 0.0, 1.0]
    assert table.loc["q0", ["search_steps", "non_search_steps", "over_search", "over_known"]].tolist() == [1, 1, 1, 1]
    assert table.loc["q0", ["judge_unknown", "judge_checked"]].tolist() == [1, 2]  # its non-search verdict: None
    assert table.loc["q2", ["search_steps", "over_search", "over_known", "under_search", "under_known"]].tolist() \
        == [2, 0, 1, 1, 1]
    assert table.loc["q1", ["search_steps", "judge_checked"]].tolist() == [0, 0]
    assert question_table(trajectories, verdicts, method="other").empty
    with pytest.raises(ValueError, match="several methods"):
        question_table([*trajectories, {**trajectories[0], "method": "standard_rag"}])


def test_training_curve_keeps_the_training_steps_and_marks_missing_statistics():
    log = [{"step": 2, "reward": 0.5, "agent/bonus_fired": 0.25, "agent/process_shaped": 0.5, "agent/cem": 0.5,
            "loss": 0.1},
           {"step": 1, "reward": 0.25, "agent/cem": 0.0},  # logged before bonus_fired existed / detection off
           {"step": 2, "train_runtime": 12.0, "train_loss": 0.1}]  # TRL's summary entry: no reward
    curve = training_curve(log)
    assert curve["step"].tolist() == [1, 2]
    assert curve["reward"].tolist() == [0.25, 0.5]
    assert math.isnan(curve["bonus_fired"].iloc[0]) and curve["bonus_fired"].iloc[1] == 0.25
    assert math.isnan(curve["process_shaped"].iloc[0]) and curve["process_shaped"].iloc[1] == 0.5


def test_ratio_interval_is_a_bootstrap_of_a_ratio_of_sums():
    low, high = ratio_interval([1, 2, 3], [2, 4, 6])  # every resample has the ratio 1/2
    assert low == pytest.approx(0.5) and high == pytest.approx(0.5)
    low, high = ratio_interval([0, 1, 1, 0], [1, 1, 1, 1])
    assert 0.0 <= low <= 0.5 <= high <= 1.0
    assert all(math.isnan(value) for value in ratio_interval([0, 0], [0, 0]))
    assert all(math.isnan(value) for value in ratio_interval([1], [1]))
    with pytest.raises(ValueError):
        ratio_interval([1, 2], [1])


def test_arms_pool_seeds_per_question_with_intervals_and_the_bonus_share(runs):
    rows = comparison_rows(runs, ["hiprag", "search_r1"], resamples=500)
    assert rows[["arm", "seed"]].values.tolist() == [["hiprag", POOLED], ["hiprag", "0"], ["hiprag", "1"],
                                                     ["search_r1", POOLED], ["search_r1", "0"], ["search_r1", "1"]]
    hiprag = rows.set_index(["arm", "seed"]).loc[("hiprag", POOLED)]
    per_question = np.array([1, 0.5, 0, 1, 0.5, 1])  # each question's mean over the two seeds
    assert hiprag["cem"] == pytest.approx(per_question.mean())
    assert (hiprag["cem_low"], hiprag["cem_high"]) == pytest.approx(bootstrap_interval(per_question, resamples=500))
    assert hiprag["cem_low"] <= hiprag["cem"] <= hiprag["cem_high"]
    assert hiprag["osr"] == pytest.approx(3 / 12)  # ratio of sums: 3 over-searches in 12 search steps
    assert hiprag["osr_low"] <= hiprag["osr"] <= hiprag["osr_high"]
    assert hiprag["usr"] == 0.0 and hiprag["search_ratio"] == 0.5
    assert hiprag["bonus_fired"] == pytest.approx((0.0 + 0.5 + 0.25 + 0.25) / 4)  # every step of every seed
    assert hiprag["bonus_steps"] == 4
    assert hiprag["process_shaped"] == pytest.approx(1.0 / 4)  # mean per-step share over both seeds
    assert hiprag["train_reward_first"] == pytest.approx(0.25) and hiprag["train_reward_last"] == pytest.approx(0.55)
    assert hiprag["seconds"] == 1260.0 and hiprag["seeds"] == 2 and hiprag["lambda_p"] == 0.4
    seed0 = rows.set_index(["arm", "seed"]).loc[("hiprag", "0")]
    assert seed0["cem"] == pytest.approx(4 / 6) and seed0["bonus_fired"] == 0.25 and seed0["seconds"] == 600.0
    search_r1 = rows.set_index(["arm", "seed"]).loc[("search_r1", POOLED)]
    assert search_r1["bonus_fired"] == pytest.approx(0.25 / 4) and search_r1["lambda_p"] == 0.0
    assert search_r1["process_shaped"] == 0.0  # seed 1's curve predates the statistic: seed 0's steps only


def test_pooling_keeps_a_question_that_only_one_seed_evaluated(runs):
    partial = RunResult("hiprag", 2, _questions([0, 0]), _curve([0.1], [0.0]))
    pooled = pooled_questions([runs[0], partial]).set_index("question_key")
    assert pooled.loc["q0", "cem"] == 0.5 and pooled.loc["q0", "seeds"] == 2
    assert pooled.loc["q5", "cem"] == 1.0 and pooled.loc["q5", "seeds"] == 1


def test_the_paired_difference_uses_per_question_means_over_seeds(runs):
    tests = paired_differences(runs, "hiprag", "search_r1", resamples=500, permutation_resamples=999)
    cem = tests.set_index("metric").loc["cem"]
    a = np.array([1, 0.5, 0, 1, 0.5, 1])
    b = np.array([0, 0.5, 0, 0.5, 0, 1])
    expected = paired_test(a, b, bootstrap_resamples=500, permutation_resamples=999)
    assert cem["difference"] == pytest.approx(a.mean() - b.mean())
    assert (cem["low"], cem["high"], cem["p_value"]) == pytest.approx(
        (expected["low"], expected["high"], expected["p_value"]))
    assert cem["n"] == 6 and (cem["wins"], cem["losses"], cem["ties"]) == (3, 0, 3)
    assert cem["questions_needed"] == questions_needed(a.mean() - b.mean(), float(np.std(a - b, ddof=1)))
    assert cem["questions_needed"] > 0
    retrievals = tests.set_index("metric").loc["retrievals"]
    assert retrievals["difference"] == 0.0 and retrievals["questions_needed"] == -1  # nothing to detect


def test_results_survive_a_json_round_trip(runs):
    again = RunResult.from_dict(json.loads(json.dumps(runs[0].to_dict())))
    assert again.arm == "hiprag" and again.seed == 0 and again.seconds == 600.0 and again.lambda_p == 0.4
    pd.testing.assert_frame_equal(again.questions, runs[0].questions, check_dtype=False)
    pd.testing.assert_frame_equal(again.curve, runs[0].curve, check_dtype=False)


def test_the_report_states_the_bonus_goal_and_the_budget(runs):
    rows = comparison_rows(runs, resamples=200)
    tests = paired_differences(runs, "hiprag", "search_r1", resamples=200, permutation_resamples=199)
    report = render_report(rows, tests, title="HiPRAG vs Search-R1", settings={"GRPO steps": 2},
                           curves_file="curves.png")
    assert "| GRPO steps | 2 |" in report
    assert ("hiprag: the process bonus fired in 25.0% of training rollouts (goal ≥ 10%: goal met); it changed the "
            "GRPO advantages of 25.0% of training groups.") in report
    assert "search_r1: the process bonus fired in 6.2% of training rollouts (goal ≥ 10%: goal NOT met" in report
    assert "of 0.0% of training groups — so the two rewards made the same updates." in report
    assert "Budget: detecting the observed Δ CEM of +0.333" in report
    assert "![training curves](curves.png)" in report
    assert report.count("| hiprag |") == 3 and report.count("| search_r1 |") == 3
    assert "Only one arm ran" in render_report(rows, tests.iloc[0:0], title="t", settings={})


def test_the_curves_figure_has_a_line_per_arm_and_seed(runs):
    figure = curves_figure(runs)
    reward_axes, bonus_axes, shaped_axes = figure.axes
    assert len(reward_axes.lines) == 4
    assert len(bonus_axes.lines) == 5  # four runs and the 10% goal line
    assert len(shaped_axes.lines) == 4
    old_runs = [RunResult(run.arm, run.seed, run.questions, run.curve.drop(columns="process_shaped")) for run in runs]
    assert len(curves_figure(old_runs).axes[2].lines) == 0  # runs from before the statistic: an empty panel, said
    assert [text.get_text() for text in reward_axes.get_legend().get_texts()] == [
        "hiprag seed 0", "hiprag seed 1", "search_r1 seed 0", "search_r1 seed 1"]
