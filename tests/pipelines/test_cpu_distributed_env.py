"""``kedro run --env cpu_distributed``: the training nodes run under ``accelerate launch`` with 2 gloo processes on the
tiny random Llama, end to end (SFT, then GRPO from its adapter; DPO on preference pairs); the MLflow stage runs show
world size 2 and one set of curves (rank 0 only), and the adapters load back through the catalog and generate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest


def _kedro(project, pipeline: str) -> None:
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "1"}
    completed = subprocess.run([sys.executable, "-m", "kedro", "run", f"--pipelines={pipeline}", "--env",
                                "cpu_distributed"], cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-6000:]


@pytest.mark.integration
@pytest.mark.distributed
@pytest.mark.slow
def test_sft_and_rl_train_on_two_gloo_processes_from_kedro_run(project_copy, mlflow_uri):
    _kedro(project_copy, "train_sft")
    _kedro(project_copy, "rl")

    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("prorag-cpu-distributed")
    stages = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])
              if "distributed.world_size" in run.data.params}
    assert set(stages) == {"sft", "rl"}
    for name, run in stages.items():
        assert run.data.params["distributed.world_size"] == "2"
        assert run.data.params["distributed.backend"] == "gloo"
        assert run.info.status == "FINISHED"
        loss = client.get_metric_history(run.info.run_id, f"{name}.loss")
        assert sorted(point.step for point in loss) == list(range(1, len(loss) + 1))  # one value per step: rank 0
    sft_rollouts = [run for run in client.search_runs([experiment.experiment_id])
                    if run.info.run_name.startswith("hiprag_agent_sft")]
    assert sft_rollouts, "the SFT adapter trained by 2 processes was not rolled out"
    [grpo] = (project_copy / "data" / "06_models" / "launches").glob("grpo-*")
    assert list(grpo.glob("run/checkpoints/checkpoint-2"))
    # the ranks loaded the catalog's versioned index in place: the bundle holds no copy of it
    reference = json.loads((grpo / "bundle.json").read_text())["worker"]["index"]
    assert reference["mode"] == "path" and not (grpo / "inputs" / "index").exists()
    assert Path(reference["path"]).parent.parent == (project_copy / "data" / "06_models" / "retrieval_index").resolve()


def _write_pairs(project, pairs: list[dict[str, str]]) -> None:
    """A ``reasonrag_pairs`` version (the catalog's versioned JSON lines) in the project copy: the DPO pipeline's input
    without the MCTS exploration (the tiny random model writes no valid step, so its trees hold no pair)."""
    name = "reasonrag_pairs.jsonl"
    folder = project / "data" / "05_model_input" / name / "2026-01-01T00.00.00.000Z"
    folder.mkdir(parents=True)
    (folder / name).write_text("".join(json.dumps(pair) + "\n" for pair in pairs), encoding="utf-8")


def _write_cold_start_adapter(project) -> None:
    """A ``reasonrag_sft_adapter`` version (a fresh LoRA of the tiny model): ``dpo`` continues the ReasonRAG recipe's
    cold-start explorer, as ``train_reasonrag`` does."""
    from peft import LoraConfig, get_peft_model

    from prorag.llm.registry import load_causal_lm

    model, _ = load_causal_lm("bundled:tiny-random-llama")
    name = "reasonrag_sft_adapter"
    target = project / "data" / "06_models" / name / "2026-01-01T00.00.00.000Z" / name
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                     task_type="CAUSAL_LM")).save_pretrained(target)


@pytest.mark.integration
@pytest.mark.distributed
@pytest.mark.slow
def test_dpo_trains_on_two_gloo_processes_from_kedro_run(project_copy, mlflow_uri):
    from prorag.llm.factory import build_generator
    from prorag.llm.generation import SamplingParams
    from prorag.protocol import reasonrag

    questions = [("Who wrote Hamlet?", "Shakespeare", "Marlowe"), ("Capital of Peru?", "Lima", "Cusco"),
                 ("Largest planet?", "Jupiter", "Saturn"), ("Author of Faust?", "Goethe", "Schiller")]
    _write_pairs(project_copy, [{"messages": reasonrag.render_prompt(question), "transcript": "",
                                 "chosen": f"So the answer is <answer>{right}</answer>",
                                 "rejected": f"So the answer is <answer>{wrong}</answer>"}
                                for question, right, wrong in questions])
    _write_cold_start_adapter(project_copy)
    _kedro(project_copy, "dpo")

    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("prorag-cpu-distributed")
    stages = [run for run in client.search_runs([experiment.experiment_id])
              if "distributed.world_size" in run.data.params]
    assert [run.info.run_name for run in stages] == ["dpo"]
    run = stages[0]
    assert run.data.params["distributed.world_size"] == "2"
    assert run.data.params["distributed.backend"] == "gloo"
    assert run.info.status == "FINISHED"
    for curve in ("dpo.loss", "dpo.rewards/margins"):  # one value per step (conf/cpu_distributed: 3 steps): rank 0
        assert [point.step for point in client.get_metric_history(run.info.run_id, curve)] == [1, 2, 3]

    adapters = list((project_copy / "data" / "06_models" / "dpo_adapter").glob("*/dpo_adapter"))
    assert len(adapters) == 1 and (adapters[0] / "adapter_model.safetensors").is_file()
    bundles = list((project_copy / "data" / "06_models" / "launches").glob("dpo-*"))
    assert len(bundles) == 1
    assert sorted(path.name for path in (bundles[0] / "run" / "checkpoints").glob("checkpoint-*"))[-1] == "checkpoint-3"
    generator = build_generator("bundled:tiny-random-llama", adapter=str(adapters[0]))  # loads and generates
    [[completion]] = generator.generate(["Who wrote Hamlet?"], SamplingParams(max_new_tokens=4))
    assert len(completion.token_ids) == 4
