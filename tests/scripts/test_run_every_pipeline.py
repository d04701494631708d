"""scripts/run_every_pipeline.py: every registered pipeline once, each after the pipelines that write what it needs,
with tiny-slice overrides that name existing parameters (no kedro run here: see `make every-pipeline`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from kedro.pipeline import Node, Pipeline

from prorag.config_loader import CONFIG_LOADER_ARGS, ProjectConfigLoader
from prorag.pipeline_registry import register_pipelines

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # as when the script runs: its folder first (scripts/pipeline_runs.py)
spec = importlib.util.spec_from_file_location("run_every_pipeline", ROOT / "scripts" / "run_every_pipeline.py")
every = importlib.util.module_from_spec(spec)
spec.loader.exec_module(every)


def _step(*_: object) -> int:
    return 0


def _pipe(*steps: tuple[list[str], str]) -> Pipeline:
    return Pipeline([Node(_step, inputs, output, name=f"make_{output}") for inputs, output in steps])


@pytest.fixture(scope="module")
def project() -> tuple[dict[str, Pipeline], dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loader = ProjectConfigLoader(str(ROOT / "conf"), **CONFIG_LOADER_ARGS)
        return register_pipelines(), dict(loader["parameters"]), every.versioned_datasets(loader["catalog"])


def test_a_reader_runs_once_a_writer_of_each_need_has_run_and_ties_keep_registry_order():
    pipelines = {
        "report": _pipe((["table"], "report")),
        "evaluate": _pipe((["index"], "table")),
        "build": _pipe((["raw"], "index")),
        "everything": _pipe((["raw"], "index"), (["index"], "table"), (["table"], "report")),
        "alone": _pipe((["raw"], "other")),
    }
    order = every.run_order(pipelines)
    assert order == ["build", "evaluate", "report", "everything", "alone"]
    assert every.needs(pipelines["report"]) == {"table"}


def test_a_writer_along_the_way_that_needs_the_reader_does_not_make_a_cycle():
    # train_rl writes evaluated_questions along the way but needs the sft_adapter that sft writes from
    # sft_synthesis, which needs evaluated_questions: sft_synthesis runs after `full`, train_rl after sft
    pipelines = {
        "train_rl": _pipe((["index"], "evaluated"), (["evaluated", "adapter"], "rl_adapter")),
        "sft_synthesis": _pipe((["evaluated"], "sft_data")),
        "sft": _pipe((["sft_data"], "adapter")),
        "full": _pipe((["raw"], "index"), (["index"], "evaluated")),
    }
    order = every.run_order(pipelines)
    assert order == ["full", "sft_synthesis", "sft", "train_rl"]
    with pytest.raises(SystemExit, match="sft_synthesis needs evaluated, which no pipeline before it writes"):
        every.run_order({name: pipelines[name] for name in ("train_rl", "sft_synthesis", "sft")})


def test_a_pipeline_that_would_rewrite_what_a_ready_reader_needs_waits_for_it():
    # rl reads evaluated and the adapter that sft made from synth's data, which synth made from `full`'s evaluated:
    # train_rl (before rl in the registry) would write evaluated again and leave rl with inputs of two runs
    pipelines = {
        "full": _pipe((["raw"], "evaluated")),
        "synth": _pipe((["evaluated"], "sft_data")),
        "sft": _pipe((["sft_data"], "adapter")),
        "train_rl": _pipe((["raw"], "evaluated"), (["evaluated"], "rl_adapter")),
        "rl": _pipe((["evaluated", "adapter"], "rl_stage_adapter")),
    }
    assert every.run_order(pipelines) == ["full", "synth", "sft", "rl", "train_rl"]
    alone = {name: pipelines[name] for name in ("train_rl", "full")}
    assert every.run_order(alone) == ["train_rl", "full"]  # nothing reads evaluated: registry order


def test_a_reader_waits_for_a_run_whose_outputs_belong_together():
    # stage reads questions and a graph extracted from earlier questions: after `train` rewrote questions, it runs
    # only after train_kg has written questions, graph and evaluated in one run
    pipelines = {
        "prep": _pipe((["raw"], "questions")),
        "kg": _pipe((["questions"], "graph")),
        "train": _pipe((["raw"], "questions"), (["questions"], "evaluated")),
        "stage": _pipe((["questions", "graph", "evaluated"], "adapter")),
        "train_kg": _pipe((["raw"], "questions"), (["questions"], "graph"), (["graph"], "evaluated")),
    }
    assert every.run_order(pipelines) == ["prep", "kg", "train", "train_kg", "stage"]
    # a dataset that is not versioned has no lineage: the stage may run as soon as its needs are written
    assert every.run_order(pipelines, versioned={"graph", "evaluated"}) == ["prep", "kg", "train", "stage",
                                                                            "train_kg"]


def test_an_output_s_lineage_is_its_upstream_loads_not_every_load_of_its_run(capsys):
    # the CI failure at 4fadfd6: train_rl_instruct rebuilt index_questions and, in another branch, read old
    # trajectories; rollout_kag then wrote trajectories over the new index_questions, and judge read both
    pipelines = {
        "index": _pipe((["raw"], "index_questions")),
        "rollout": _pipe((["index_questions"], "trajectories")),
        "instruct": _pipe((["raw"], "index_questions"), (["trajectories"], "judged_old"), (["raw"], "instructed")),
        "kag": _pipe((["index_questions", "instructed"], "trajectories"), (["index_questions"], "graph")),
        "judge": _pipe((["index_questions", "trajectories", "graph"], "judged")),
    }
    assert every.run_order(pipelines) == ["index", "rollout", "instruct", "kag", "judge"]
    assert "no order found" not in capsys.readouterr().err


def test_a_selection_must_write_what_its_pipelines_need_but_optional_inputs():
    pipelines = {"build": _pipe((["raw"], "index")), "evaluate": _pipe((["index"], "table")),
                 "report": _pipe((["table"], "report"))}
    assert list(every.select(pipelines, ["report", "evaluate", "build"])) == ["build", "evaluate", "report"]
    with pytest.raises(SystemExit, match="report needs table, which none of the chosen pipelines writes"):
        every.select(pipelines, ["build", "report"])
    with pytest.raises(SystemExit, match="--pipelines nope: not registered"):
        every.select(pipelines, ["nope"])


def test_the_ci_selection_and_the_whole_registry_run_in_an_order_whose_runs_belong_together(project, capsys):
    """.ci/run's selection: every need is written by a chosen pipeline, and an order passes the lineage check (at
    f5be23d none did: ``tearag`` read a knowledge graph of an index that ``index`` had since rewritten)."""
    pipelines, _, versioned = project
    listed = (ROOT / ".ci" / "run").read_text(encoding="utf-8").split("CI_PIPELINES=(", 1)[1].split(")", 1)[0]
    chosen = every.select(pipelines, listed.split())
    order, _ = every.plan(chosen, versioned)
    assert sorted(order) == sorted(set(listed.split()))
    every.plan(pipelines, versioned)
    assert "no order found" not in capsys.readouterr().err


def test_an_order_is_searched_when_the_preferred_first_step_leads_nowhere(capsys):
    # `kg` is ready first and runs first by preference; then `train` rewrites questions and writes evaluated, and
    # `stage` reads a graph of the old questions with evaluated of the new ones: only train, kg, stage passes
    pipelines = {
        "prep": _pipe((["raw"], "questions")),
        "kg": _pipe((["questions"], "graph")),
        "train": _pipe((["raw"], "questions"), (["questions"], "evaluated")),
        "stage": _pipe((["graph", "evaluated"], "adapter")),
    }
    order = every.run_order(pipelines)
    assert order.index("train") < order.index("kg") < order.index("stage")
    assert "no order found" not in capsys.readouterr().err


def test_compare_runs_after_the_pipelines_that_write_the_adapters_it_reads():
    pipelines = {"compare": _pipe((["adapter", "rl_adapter"], "comparison")), "train": _pipe((["raw"], "adapter")),
                 "train_rl": _pipe((["adapter"], "rl_adapter"))}
    assert every.run_order(pipelines) == ["train", "train_rl", "compare"]


def test_every_registered_pipeline_is_run_once_or_named_as_the_alias_of_one_that_is(project, capsys):
    pipelines, _, versioned = project
    order, same = every.plan(pipelines, versioned)
    assert "lineage check" not in capsys.readouterr().err  # every run's inputs belong together
    assert sorted(order + list(same)) == sorted(pipelines)
    assert len(set(order)) == len(order)
    # judge gathers the trained policies' trajectories before judging (issue 46), so it is no alias of reward_judging
    assert same == {"train": "train_hiprag", "__default__": "train_hiprag"}
    position = order.index
    assert position("data_preparation") < position("corpus_indexing") < position("rollout") < position("evaluation")
    assert position("sft_synthesis") < position("sft") and position("kg_extraction") < position("rollout_kag")
    assert position("train_reasonrag") < min(position("reasonrag_data"), position("dpo"))
    assert position("compare") > max(position("train_reasonrag"), position("tearag"), position("rl"))


def test_the_tiny_overrides_name_existing_parameters_and_pass_as_one_params_option(project):
    _, parameters, _ = project
    every.check_overrides(parameters, every.TINY)
    with pytest.raises(SystemExit, match=r"rollout\.questions\.max_per_sorce"):
        every.check_overrides(parameters, {"rollout.questions.max_per_sorce": 1})
    option = every.params_option({"a.b": 1, "c": None, "d": True, "e": "x"})
    assert option == "a.b=1,c=null,d=true,e=x"
    with pytest.raises(ValueError, match="a=1,2"):
        every.params_option({"a": "1,2"})


def test_the_fresh_copy_holds_the_tracked_files_only(tmp_path):
    source = tmp_path / "source"
    (source / "data" / "01_raw").mkdir(parents=True)
    (source / "data" / "01_raw" / "q.jsonl").write_text("{}\n")
    (source / "kept.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=source, check=True)
    subprocess.run(["git", "add", "kept.py", "data/01_raw/q.jsonl"], cwd=source, check=True)
    (source / "data" / "08_reporting").mkdir()
    (source / "data" / "08_reporting" / "old.csv").write_text("stale\n")
    (source / "kept.py").write_text("x = 2\n")  # the working tree's content of a tracked file
    assert every.copy_project(source, tmp_path / "copy") == 2
    assert (tmp_path / "copy" / "kept.py").read_text() == "x = 2\n"
    assert not (tmp_path / "copy" / "data" / "08_reporting").exists()
