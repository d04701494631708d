"""How nodes, outputs and rollouts map onto MLflow runs; datasets as run inputs; how to open a run."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from prorag.tracking.runs import (
    POLICY_METADATA_KEY,
    adapter_key,
    dataset_input,
    is_curated_method_metric,
    is_peft_adapter,
    rollout_policy,
    split_method_metrics,
    stage_name,
    ui_hint,
)


@pytest.mark.parametrize(("module", "namespace", "node", "stage"), [
    ("prorag.pipelines.rollout.pipeline", "sft", "sft.run_policy_rollouts", "sft"),
    ("prorag.pipelines.rl.nodes", None, "train_rl", "rl"),
    ("prorag.pipelines.rl.nodes", "search_r1.rl", "search_r1.rl.train_rl", "search_r1.rl"),
    ("experiments.custom", None, "custom.step", "custom"),
    (None, None, "lambda", "lambda"),
])
def test_stage_is_the_namespace_else_the_pipeline_package(module, namespace, node, stage):
    assert stage_name(module, namespace, node) == stage


def test_per_method_metrics_are_split_from_the_rest():
    judge = {"hiprag": {"osr": 0.1, "by_dataset": {"nq": {"osr": 0.2}}}, "skipped_trajectories": 3}
    assert split_method_metrics("judge_metrics", judge) == (
        "judge", {"hiprag": judge["hiprag"]}, {"skipped_trajectories": 3})
    prefix, methods, rest = split_method_metrics("tearag_evaluation_metrics", {"tearag": {"all": {"cem": 1}}})
    assert (prefix, list(methods), rest) == ("evaluation", ["tearag"], {})  # the same keys for every method
    prefix, methods, _ = split_method_metrics("comparison_metrics", {"hiprag_rl": {"macro": {"cem": 0.2}}})
    assert (prefix, list(methods)) == ("evaluation", ["hiprag_rl"])  # compare's arms: the evaluation keys too
    assert split_method_metrics("sft_metrics", {"loss": 1}) is None
    assert split_method_metrics("judge_metrics", [{"step": 1}]) is None


def test_a_method_run_logs_the_curated_keys_of_any_pipeline():
    curated = ["evaluation.macro.cem", "evaluation.macro.f1", "evaluation.macro.format_rate",
               "evaluation.macro.avg_retrieval_count", "evaluation.macro.avg_generated_tokens", "evaluation.nq.cem",
               "evaluation.bamboogle.cem", "judge.osr", "judge.usr", "judge.reward"]
    table_only = ["evaluation.all.cem", "evaluation.macro.cem_low", "evaluation.nq.f1", "evaluation.nq.osr",
                  "evaluation.macro.stop_answer", "judge.by_dataset.nq.osr", "judge.pooled_osr", "evaluation.cem",
                  "evaluation.nq.cem.x"]
    assert [key for key in curated + table_only if is_curated_method_metric(key)] == curated


def test_the_policy_metadata_key_is_the_rollouts():
    from prorag.agent.runner import POLICY_METADATA_KEY as RECORDED

    assert POLICY_METADATA_KEY == RECORDED


def _record(model: str, adapter: str | None) -> dict:
    return {"method": "m", "metadata": {"policy": {"model": model, "adapter": adapter}}}


def test_the_policy_of_a_rollout_is_named_after_its_adapter_dataset(tmp_path: Path):
    versioned = "data/06_models/rl_adapter/2026-01-01T00.00.00.000Z/rl_adapter"
    assert rollout_policy(_record("bundled:x", None), {}) == ("base", None, "bundled:x")
    assert rollout_policy(_record("bundled:x", versioned), {}) == ("rl", "rl_adapter", "bundled:x")
    trained = str(tmp_path / "trained")  # a folder named otherwise: known from the dataset that loaded it
    assert rollout_policy(_record("bundled:x", trained), {adapter_key(trained): "tearag_sft_adapter"}) == (
        "tearag_sft", "tearag_sft_adapter", "bundled:x")
    assert rollout_policy(_record(versioned, None), {}) == ("rl", "rl_adapter", None)  # full-parameter RL
    assert rollout_policy({"method": "m", "metadata": {}}, {}) == ("unrecorded", None, None)


def test_a_peft_adapter_folder_names_its_peft_type(tmp_path: Path):
    assert not is_peft_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    assert not is_peft_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    assert is_peft_adapter(tmp_path)


def test_a_dataset_input_carries_its_file_digest_rows_and_context(tmp_path: Path):
    path = tmp_path / "questions.jsonl"
    rows = [{"id": "1", "question": "q"}, {"id": "2", "question": "r"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    logged = dataset_input("questions", rows, str(path), "data_preparation")
    assert logged.dataset.name == "questions"
    assert logged.dataset.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert json.loads(logged.dataset.source) == {"uri": str(path.resolve())}
    assert json.loads(logged.dataset.profile) == {"num_rows": 2, "columns": ["id", "question"]}
    assert [(tag.key, tag.value) for tag in logged.tags] == [("mlflow.data.context", "data_preparation")]
    in_memory = dataset_input("rollout_questions", rows, None, "rollout")
    assert in_memory.dataset.source_type == "code" and len(in_memory.dataset.digest) == 16
    assert in_memory.dataset.digest != dataset_input("rollout_questions", rows[:1], None, "rollout").dataset.digest


def test_how_to_open_a_run_hides_credentials():
    # issue 34: the training view (MLflow 3 opens the GenAI one), and a command that exists (no bare `mlflow ui`)
    assert ui_hint("sqlite:////p/mlflow.db", "3", "abc", project_path="/p") == (
        "make mlflow-ui   (then http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning)")
    other = ui_hint("sqlite:////q/other.db", "3", "abc", project_path="/p")
    assert other.startswith(f"{Path(sys.executable).with_name('mlflow')} ui --backend-store-uri sqlite:////q/other.db")
    assert ui_hint("https://me:pw@mlflow.example/", "3", "abc") == (
        "https://***@mlflow.example/#/experiments/3/runs/abc?workflowType=machine_learning")
