"""scripts/train_all.py: every method's training run in dependency order, then compare; it stops at the first
failing run, naming its log, and writes the wall time of every run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from prorag.config_loader import configured_methods

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # as when the script runs: its folder first (scripts/pipeline_runs.py)
spec = importlib.util.spec_from_file_location("train_all", ROOT / "scripts" / "train_all.py")
train_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_all)


def test_every_configured_method_trains_before_compare_and_search_r1_after_the_sft_it_continues():
    methods = configured_methods(ROOT)
    pipelines = train_all.plan(methods)
    assert pipelines[-1] == "compare"
    assert sorted(pipelines[:-1]) == sorted(f"train_{name}" for name in methods)
    assert pipelines.index("train_search_r1") > pipelines.index("train_hiprag")
    assert train_all.plan(methods, ["search_r1", "hiprag"]) == ["train_hiprag", "train_search_r1", "compare"]
    with pytest.raises(SystemExit, match="--methods nope"):
        train_all.plan(methods, ["nope"])


def test_a_failing_run_shows_its_log_and_the_others_go_on_unless_told_to_stop(tmp_path):
    exits = {"train_a": 0, "train_b": 3, "compare": 0}

    def command(name: str) -> list[str]:
        return [sys.executable, "-c", f"print('running {name}'); raise SystemExit({exits[name]})"]

    lines: list[str] = []
    results = train_all.run_all(list(exits), command, tmp_path / "on", echo=lines.append)
    assert [(name, status) for name, _, status in results] == [("train_a", 0), ("train_b", 3), ("compare", 0)]
    stopped = train_all.run_all(list(exits), command, tmp_path, echo=lines.append, stop_on_failure=True)
    assert [(name, status) for name, _, status in stopped] == [("train_a", 0), ("train_b", 3)]
    assert (tmp_path / "train_b.log").read_text().strip() == "running train_b"
    assert not (tmp_path / "compare.log").exists()
    assert any("FAILED (exit 3)" in line for line in lines) and any("| running train_b" in line for line in lines)
    table = train_all.timings_table(results, 1.0)
    assert "| train_b |" in table and "failed (3)" in table and "**all**" in table


def test_dry_run_prints_one_kedro_run_per_pipeline(capsys):
    assert train_all.main(["--dry-run", "--env", "cpu_long", "--methods", "hiprag"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("--pipelines=")[1] for line in lines] == ["train_hiprag --env cpu_long",
                                                                 "compare --env cpu_long"]
