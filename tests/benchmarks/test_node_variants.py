"""benchmarks/node_variants.py: variant parsing, the comparison of outputs, and a real run of a stand-in kedro."""

from __future__ import annotations

import argparse
import importlib.util
import json
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:  # a module of benchmarks/, which is not a package
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


node_variants = _load("node_variants")


def test_variant_parses_label_params_and_environment() -> None:
    variant = node_variants.Variant.parse("bf16::policy.dtype=bfloat16,rollout.batch=4::A=1;B=x=y")
    assert variant == node_variants.Variant("bf16", "policy.dtype=bfloat16,rollout.batch=4", {"A": "1", "B": "x=y"})
    assert node_variants.Variant.parse("plain") == node_variants.Variant("plain")
    with pytest.raises(argparse.ArgumentTypeError, match="LABEL::PARAMS"):
        node_variants.Variant.parse("label::p::NOEQUALS")


def _fake_project(tmp_path: Path) -> Path:
    """A project whose `kedro` writes node_timing.csv, a loss line and a new version of a JSON-lines output whose
    completion depends on its --params (the node's seconds: 2 with `fast`, else 4)."""
    project = tmp_path / "project"
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / "data" / "08_reporting").mkdir(parents=True)
    kedro = project / ".venv" / "bin" / "kedro"
    kedro.write_text(f"""#!{sys.executable}
import json, pathlib, sys, time
params = sys.argv[sys.argv.index("--params") + 1] if "--params" in sys.argv else ""
seconds = 2.0 if "fast" in params else 4.0
pathlib.Path("data/08_reporting/node_timing.csv").write_text(f"node,seconds\\nsome.node,{{seconds}}\\n")
version = pathlib.Path("data/out.jsonl") / f"v{{time.time_ns()}}"
version.mkdir(parents=True)
rows = [{{"completion": "a"}}, {{"completion": "b" if "fast" in params else "c"}}]
(version / "out.jsonl").write_text("".join(json.dumps(row) + "\\n" for row in rows))
print("{{'loss': '0.5'}}", "{{'loss': '0.25'}}")
""")
    kedro.chmod(kedro.stat().st_mode | stat.S_IEXEC)
    return project


def test_measure_runs_each_variant_and_reports_ratio_loss_and_same_rows(tmp_path: Path) -> None:
    project = _fake_project(tmp_path)
    variants = [node_variants.Variant("slow", "x=1"), node_variants.Variant("fast", "x=fast")]
    csv_path = node_variants.measure(variants, project=project, node="some.node", params="shared=1",
                                     output="data/out.jsonl", name="check", output_dir=tmp_path / "reports")
    table = csv_path.with_suffix(".md").read_text()
    assert "| slow | 1 | run | 4.0 |" in table and "1.00x" in table
    assert "| fast | 1 | run | 2.0 |" in table and "2.00x" in table
    assert "last loss 0.25" in table
    assert "1 of 2 completions as the first" in table


def test_a_failing_variant_names_its_log(tmp_path: Path) -> None:
    project = _fake_project(tmp_path)
    (project / ".venv" / "bin" / "kedro").write_text(f"#!{sys.executable}\nraise SystemExit(3)\n")
    with pytest.raises(SystemExit, match=r"check_0\.log"):
        node_variants.measure([node_variants.Variant("a"), node_variants.Variant("b")], project=project,
                              node="some.node", params="", output="", name="check", output_dir=tmp_path)


def test_newest_completions_reads_the_newest_versions_oldest_first(tmp_path: Path) -> None:
    folder = tmp_path / "rows.jsonl"
    for index, completion in enumerate(["old", "mid", "new"]):
        (folder / f"2026-0{index}").mkdir(parents=True)
        (folder / f"2026-0{index}" / "rows.jsonl").write_text(json.dumps({"completion": completion}) + "\n")
    assert node_variants.newest_completions(folder, 2) == [["mid"], ["new"]]


def test_variants_may_share_a_label(tmp_path: Path) -> None:
    """Repeats of one setting (a noise check) are rows of their own, not one row overwritten."""
    project = _fake_project(tmp_path)
    csv_path = node_variants.measure([node_variants.Variant("same", "fast"), node_variants.Variant("same", "x")],
                                     project=project, node="some.node", params="", output="", name="repeat",
                                     output_dir=tmp_path / "reports")
    table = csv_path.with_suffix(".md").read_text()
    assert "| same | 1 | run | 2.0 |" in table and "| same | 1 | run | 4.0 |" in table and "0.50x" in table
    assert "CPUs" in table
