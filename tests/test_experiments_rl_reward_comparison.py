"""experiments/rl_reward_comparison.py without training: the preset and the old flags, the run plan (arms × seeds,
detection on in both arms), cached results reused only for the same settings, and the files the report writes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from prorag.reporting.reward_comparison import QUESTION_COLUMNS, RunResult

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "rl_reward_comparison.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rl_reward_comparison", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _result(arm: str, seed: int, cem: list[float]) -> RunResult:
    n = len(cem)
    questions = pd.DataFrame({"question_key": [f"q{i}" for i in range(n)], "dataset": ["popqa"] * n, "cem": cem,
                              "format_ok": [1.0] * n, "retrievals": [1.0] * n, "search_steps": [1] * n,
                              "non_search_steps": [0] * n, "over_search": [0] * n, "over_known": [1] * n,
                              "under_search": [0] * n, "under_known": [0] * n, "judge_unknown": [0] * n,
                              "judge_checked": [1] * n}, columns=list(QUESTION_COLUMNS))
    curve = pd.DataFrame({"step": [1, 2], "reward": [0.2, 0.4], "bonus_fired": [0.0, 0.25], "cem": [0.0, 0.25]})
    return RunResult(arm, seed, questions, curve, seconds=60.0, lambda_p=0.4 if arm == "hiprag" else 0.0)


def test_the_preset_fills_defaults_that_flags_override(script):
    args = script.parse_args(["--preset", "cpu_2h"])
    assert (args.steps, args.batch, args.micro_batch, args.generations) == (16, 4, 4, 4)
    assert args.seeds == [0, 1] and args.sources == ["popqa", "hotpotqa"]
    assert (args.rl_questions_per_source, args.questions_per_source) == (100, 10)
    assert script.parse_args(["--preset", "cpu_2h", "--steps", "32"]).steps == 32


def test_the_old_command_line_still_means_one_seed(script):
    args = script.parse_args(["--steps", "3", "--batch", "8", "--micro-batch", "4", "--questions-per-source", "4"])
    assert args.seeds == [0] and args.preset is None and args.arms == ["hiprag", "search_r1"]
    assert script.parse_args(["--seed", "3"]).seeds == [3]
    with pytest.raises(SystemExit):
        script.parse_args(["--batch", "6", "--micro-batch", "4"])


def test_the_plan_runs_every_arm_for_every_seed_with_detection_on(script):
    runs = script.plan(script.parse_args(["--preset", "cpu_2h"]))
    assert [(arm, seed) for arm, seed, _ in runs] == [("hiprag", 0), ("search_r1", 0), ("hiprag", 1),
                                                      ("search_r1", 1)]
    for arm, seed, overrides in runs:
        assert overrides["rl.judge_for_metrics"] is True  # Search-R1 logs how often the bonus would have fired
        assert overrides["rl.trainer.seed"] == seed and overrides["rollout.seed"] == seed
        assert overrides["reward.lambda_p"] == (0.4 if arm == "hiprag" else 0.0)
        assert overrides["rl.trainer.max_steps"] == 16 and overrides["rl.trainer.gradient_accumulation_steps"] == 1
        assert overrides["rl.questions.sources"] == ["popqa", "hotpotqa"]
        assert overrides["rl.questions.max_per_source"] == 100 and overrides["rl.trainer.save_steps"] == 4


def test_a_cached_run_is_reused_only_for_the_same_settings(script, tmp_path, monkeypatch):
    calls = []

    def fake_run(arm, seed, overrides, env):
        calls.append((arm, seed))
        return _result(arm, seed, [1.0, 0.0])

    monkeypatch.setattr(script, "run_arm", fake_run)
    path = tmp_path / "runs" / "hiprag_seed0.json"
    first = script.cached_run(path, "hiprag", 0, {"rl.trainer.max_steps": 2}, None, rerun=False)
    again = script.cached_run(path, "hiprag", 0, {"rl.trainer.max_steps": 2}, None, rerun=False)
    assert len(calls) == 1 and json.loads(path.read_text())["settings"]["overrides"] == {"rl.trainer.max_steps": 2}
    assert again.questions["cem"].tolist() == first.questions["cem"].tolist()
    script.cached_run(path, "hiprag", 0, {"rl.trainer.max_steps": 3}, None, rerun=False)  # other settings
    script.cached_run(path, "hiprag", 0, {"rl.trainer.max_steps": 3}, None, rerun=True)
    assert len(calls) == 3


def test_the_report_writes_the_table_tests_markdown_and_curves(script, tmp_path):
    runs = [_result("hiprag", 0, [1, 1, 0, 1]), _result("search_r1", 0, [0, 1, 0, 0]),
            _result("hiprag", 1, [1, 0, 0, 1]), _result("search_r1", 1, [0, 0, 0, 1])]
    args = script.parse_args(["--seeds", "0", "1", "--resamples", "100"])
    script.report(runs, args, tmp_path / "comparison")
    table = pd.read_csv(tmp_path / "comparison.csv")
    assert table[["arm", "seed"]].astype(str).values.tolist() == [
        ["hiprag", "all"], ["hiprag", "0"], ["hiprag", "1"], ["search_r1", "all"], ["search_r1", "0"],
        ["search_r1", "1"]]
    assert {"cem_low", "cem_high", "osr_low", "bonus_fired", "seconds"} <= set(table.columns)
    tests = pd.read_csv(tmp_path / "comparison_tests.csv")
    assert tests.loc[tests["metric"] == "cem", "difference"].item() == pytest.approx(0.375)
    assert "## Paired differences" in (tmp_path / "comparison.md").read_text()
    assert (tmp_path / "comparison_curves.png").stat().st_size > 0


def test_the_probe_takes_group_sizes_and_uses_the_first_runs_settings(script):
    args = script.parse_args(["--preset", "cpu_2h", "--probe", "4", "8", "--probe-questions", "12"])
    assert args.probe == [4, 8] and args.probe_questions == 12
    overrides = script.plan(args)[0][2]
    assert overrides["rl.questions.sources"] == ["popqa", "hotpotqa"] and overrides["rl.judge_for_metrics"] is True
    assert script.parse_args([]).probe is None
