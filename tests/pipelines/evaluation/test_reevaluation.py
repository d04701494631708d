"""Re-evaluating or re-judging keeps the trained policies (issue 46, item 1): ``evaluation``, ``judge`` and
``evaluate`` run alone read the latest trained policies' rollouts (or roll the newest adapters out) beside the base
methods, and name in a warning what they leave out; a real ``kedro run --pipelines=evaluation`` in a copy of the
project writes a summary with every trained arm."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kedro.io import Version

from prorag.agent import Rollout
from prorag.datasets import JSONLinesDataset
from prorag.hooks.run_versions import optional_inputs
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.rollout.nodes import gather_trajectories
from prorag.tracking.missing_inputs import Available, Missing

VERSION = "2026-01-01T00.00.00.000Z"


def rollout(key: str, method: str, answer: str = "Paris") -> dict:
    return Rollout(question_key=key, question_id=key, dataset="hotpotqa", question=f"q {key}",
                   golden_answers=("Paris",), method=method, protocol="hiprag", prompt="p", prompt_token_ids=[1],
                   completion=f"<answer>{answer}</answer>", segments=[], steps=None, format_ok=True, n_steps=0,
                   answer=answer, stop_reason="answer", retrieval_count=0, queries=[], retrieved_ids=[],
                   generated_tokens=3, context_tokens=0, tag_tokens=0, turns=1).to_dict()


def rollouts(method: str, keys: tuple[str, ...] = ("a", "b", "c")) -> list[dict]:
    return [rollout(key, method, "Paris" if index % 2 == 0 else "Rome") for index, key in enumerate(keys)]


def test_gather_keeps_trained_sets_and_names_missing_and_stale_ones(caplog):
    caplog.set_level(logging.INFO)
    base = rollouts("direct") + rollouts("hiprag_agent")
    gathered = gather_trajectories(base, sft_policy_trajectories=Available(rollouts("hiprag_agent_sft"), VERSION),
                                   rl_policy_trajectories=rollouts("hiprag_agent_rl"),  # made by this run
                                   dpo_policy_trajectories=Missing("dpo_policy_trajectories has no version yet"),
                                   other_policy_trajectories=Available(rollouts("old", ("a", "z")), VERSION))
    assert [record["method"] for record in gathered[::3]] == ["direct", "hiprag_agent", "hiprag_agent_sft",
                                                               "hiprag_agent_rl"]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings[0] == "not evaluated: dpo_policy_trajectories (dpo_policy_trajectories has no version yet)"
    assert warnings[1].startswith(f"not evaluated: other_policy_trajectories {VERSION} was rolled out on other "
                                  "questions (2, of which 1 are not among the 3 evaluated here)")
    assert "kedro run --pipelines=evaluate" in warnings[1]
    assert "evaluating direct, hiprag_agent, hiprag_agent_sft, hiprag_agent_rl" in caplog.text


@pytest.fixture(scope="module")
def pipelines():
    return register_pipelines()


@pytest.mark.parametrize("name", ["evaluation", "judge", "evaluate", "train_rl", "train_rl_instruct"])
def test_pipelines_run_alone_read_every_trained_policy(pipelines, name):
    optional = optional_inputs(pipelines[name])
    trained = {"sft_policy_trajectories", "rl_policy_trajectories", "dpo_policy_trajectories"}
    if name == "evaluate":  # it rolls the newest adapters out
        trained = {"sft_adapter", "rl_adapter", "dpo_policy_trajectories"}
    elif name.startswith("train_rl"):  # the RL policy is this run's; the base rollouts are an earlier run's
        trained = {"trajectories", "sft_policy_trajectories", "dpo_policy_trajectories"}
    assert trained <= optional & pipelines[name].inputs()
    summary = pipelines[name].to_outputs("evaluation_summary") if name != "judge" else pipelines[name]
    assert trained <= summary.inputs()


@pytest.mark.integration
def test_kedro_run_evaluation_keeps_the_trained_policies(project_copy: Path):
    """A real ``kedro run --pipelines=evaluation`` over saved base, SFT and RL rollouts (none for DPO)."""
    outputs = project_copy / "data" / "07_model_output"
    saved = {"trajectories": rollouts("direct") + rollouts("standard_rag") + rollouts("hiprag_agent"),
             "sft_policy_trajectories": rollouts("hiprag_agent_sft"),
             "rl_policy_trajectories": rollouts("hiprag_agent_rl")}
    for name, records in saved.items():  # as a completed run saves them (versions without a manifest load too)
        JSONLinesDataset(filepath=str(outputs / f"{name}.jsonl"), version=Version(None, VERSION)).save(records)
    completed = subprocess.run([sys.executable, "-m", "kedro", "run", "--pipelines=evaluation"], cwd=project_copy,
                               capture_output=True, text=True, timeout=300,
                               env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "COLUMNS": "200",
                                    "MLFLOW_TRACKING_URI": f"sqlite:///{project_copy / 'mlflow.db'}"})
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    (summary,) = (project_copy / "data" / "08_reporting" / "evaluation_summary.md").glob("*/evaluation_summary.md")
    text = summary.read_text(encoding="utf-8")
    for method in ("direct", "standard_rag", "hiprag_agent", "hiprag_agent_sft", "hiprag_agent_rl"):
        assert f"| {method} " in text, text
    assert "not evaluated: dpo_policy_trajectories (dpo_policy_trajectories has no version yet" in output
    # the terminal has a line per node, not the catalog's per-dataset lines (info.log keeps them; --verbose too)
    assert "Completed node" in output or "Running node" in output
    assert "Loading data from" not in output and "Saving data to" not in output
    assert "Loading data from trajectories" in (project_copy / "info.log").read_text(encoding="utf-8")
