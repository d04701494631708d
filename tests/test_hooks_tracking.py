"""The MLflow tracking hook through Kedro's runner: a parent run, a child run per stage and per evaluated method,
traces of sampled rollouts with the judge's verdicts, and a LoRA adapter that loads back from the model registry
and generates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
from kedro.framework.hooks.manager import _create_hook_manager
from kedro.io import DataCatalog, MemoryDataset, Version
from kedro.pipeline import Node, Pipeline
from kedro.runner import SequentialRunner

from prorag.agent.trajectory import Rollout, Segment
from prorag.datasets import DirectoryDataset, JSONLinesDataset
from prorag.hooks.mlflow_tracking import MlflowTrackingHook
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.specs import PolicySpec

SAVE_VERSION = "2026-01-01T00.00.00.000Z"
QUESTIONS = [{"id": str(index), "question": f"Question {index}?", "golden_answers": ["Paris"], "dataset": "popqa"}
             for index in range(3)]


@pytest.fixture(scope="module")
def tiny_adapter(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> str:
    """A freshly initialised LoRA adapter on the tiny random Llama, as PEFT saves it."""
    from peft import LoraConfig, get_peft_model

    from prorag.llm.registry import load_causal_lm

    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    folder = tmp_path_factory.mktemp("trained") / "adapter"
    get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                     task_type="CAUSAL_LM")).save_pretrained(str(folder))
    return str(folder)


def rollout(method: str, question: dict[str, Any], adapter: str | None = None) -> dict[str, Any]:
    """A HiPRAG-shaped rollout: a search step then a non-search step, with the policy that produced it."""
    key = f"popqa/{question['id']}"
    segments = [Segment("<think><step>", [1], "tag"), Segment("Look it up.<search>capital</search>", [2, 3, 4],
                                                                "generated"),
                Segment("<context>Doc 1(Title: Paris) capital</context>", [5, 6], "context"),
                Segment("Paris.</step><answer>Paris</answer>", [7, 8], "generated")]
    steps = [{"kind": "search", "reasoning": "r", "query": "capital", "context": "c", "conclusion": "Paris"},
             {"kind": "non_search", "reasoning": "r", "query": None, "context": None, "conclusion": "Paris"}]
    return Rollout(
        question_key=key, question_id=question["id"], dataset="popqa", question=question["question"],
        golden_answers=("Paris",), method=method, protocol="hiprag", prompt="<prompt>", prompt_token_ids=[0],
        completion="".join(segment.text for segment in segments), segments=segments, steps=steps, format_ok=True,
        n_steps=2, answer="Paris", stop_reason="answer", retrieval_count=1, queries=[f"capital of {key}"],
        retrieved_ids=[["p1", "p2"]], generated_tokens=5, context_tokens=2, tag_tokens=1, turns=2,
        metadata={"policy": {"model": BUNDLED_TINY_LLAMA, "adapter": adapter}}).to_dict()


def prepare(params: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return QUESTIONS, {"questions_total": len(QUESTIONS)}


def run_rollouts(questions: list[dict[str, Any]], policy: dict[str, Any]) -> list[dict[str, Any]]:
    return [rollout("hiprag", question) for question in questions]


def make_train_sft(adapter: str) -> Callable[..., tuple[str, list[dict[str, Any]]]]:
    def train_sft(trajectories: list[dict[str, Any]], sft: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        mlflow.log_metric("sft.live_loss", 3.0, step=1)  # what the trainer callbacks do: into the active run
        return adapter, [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    return train_sft


def run_policy_rollouts(questions: list[dict[str, Any]], adapter: str, policy: dict[str, Any],
                        ) -> list[dict[str, Any]]:
    return [rollout("hiprag_agent_sft", question, adapter) for question in questions]


def concat(*sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for records in sets for record in records]


def evaluate(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    methods = sorted({record["method"] for record in trajectories})
    return {method: {"popqa": {"cem": 0.5 + index / 4, "f1": 0.6}, "all": {"cem": 0.5 + index / 4, "n": 3},
                     "macro": {"cem": 0.5 + index / 4, "cem_low": 0.25, "format_rate": 1.0}}
            for index, method in enumerate(methods)}


def judge(trajectories: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], pd.DataFrame, dict[str, Any]]:
    verdicts = [{"rollout_index": index, "skipped": False, "question_key": record["question_key"],
                 "method": record["method"], "reask_policy": "tiny",
                 "steps": [{"rollout_index": index, "step_index": 0, "kind": "search", "checked": True,
                            "over": True, "under": None, "reask_answer": "Paris", "judge_raw": "same",
                            "judge_error": None},
                           {"rollout_index": index, "step_index": 1, "kind": "non_search", "checked": True,
                            "over": None, "under": None, "reask_answer": None, "judge_raw": "",
                            "judge_error": "no verdict in the reply"}]}
                for index, record in enumerate(trajectories)]
    rewards = pd.DataFrame([{"question_key": record["question_key"], "method": record["method"],
                             "sample_index": 0, "reward": 0.75} for record in trajectories])
    methods = sorted({record["method"] for record in trajectories})
    metrics = {method: {"osr": 1.0, "reward": 0.75, "by_dataset": {"popqa": {"osr": 1.0}}} for method in methods}
    return verdicts, rewards, {**metrics, "skipped_trajectories": 0}


def pipeline(adapter: str) -> Pipeline:
    return Pipeline([
        Node(prepare, "params:data", ["questions", "data_report_metrics"], name="prepare",
             namespace="data_preparation"),
        Node(run_rollouts, ["questions", "params:policy"], "trajectories", name="run_rollouts", namespace="rollout"),
        Node(make_train_sft(adapter), ["trajectories", "params:sft"], ["sft_adapter", "sft_metrics"],
             name="train_sft", namespace="sft"),
        Node(run_policy_rollouts, ["questions", "sft_adapter", "params:policy"], "sft_policy_trajectories",
             name="run_policy_rollouts", namespace="sft"),
        Node(concat, ["trajectories", "sft_policy_trajectories"], "all_trajectories", name="concat",
             namespace="evaluation"),
        Node(evaluate, "all_trajectories", "evaluation_metrics", name="evaluate", namespace="evaluation"),
        Node(judge, "all_trajectories", ["step_verdicts", "trajectory_rewards", "judge_metrics"], name="judge",
             namespace="reward_judging"),
    ])


@pytest.mark.integration
def test_parent_stage_and_method_runs_with_traces_and_a_registered_adapter(
        tmp_path: Path, mlflow_uri: str, tiny_adapter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from prorag.judges.limits import record_usage

    flushes = []  # each waits about a second for MLflow's export thread: once per trace took make train 30 s
    flush = mlflow.flush_trace_async_logging
    monkeypatch.setattr(mlflow, "flush_trace_async_logging", lambda: (flushes.append(1), flush())[1])

    # an earlier judge call in this process (another run, another test): not this run's usage
    record_usage("http://127.0.0.1:9/v1", "earlier-judge", 100, 10, None)
    # artifacts beside the store (the default root is the ./mlruns of the directory the store was opened from)
    mlflow.create_experiment("hooks-test", artifact_location=(tmp_path / "mlruns").as_uri())
    parameters = {"data": {"limit": 3}, "sft": {"lr": 0.1, "api_key": "sk-secret"},
                  # a model, as Kedro 1.7 gives typed nodes their parameters (compare's arms read it so)
                  "policy": PolicySpec(model=BUNDLED_TINY_LLAMA, dtype="float32"),
                  "tracking": {"experiment_name": "hooks-test", "trace_samples": 2, "system_metrics": False}}
    catalog = DataCatalog({
        "questions": JSONLinesDataset(filepath=str(tmp_path / "questions.jsonl")),
        "sft_adapter": DirectoryDataset(filepath=str(tmp_path / "06_models/sft_adapter"),
                                        version=Version(None, SAVE_VERSION)),
        "parameters": MemoryDataset(parameters),
        **{f"params:{name}": MemoryDataset(value) for name, value in parameters.items()},
    })
    hook = MlflowTrackingHook()
    hook_manager = _create_hook_manager()
    hook_manager.register(hook)
    hook.after_catalog_created(catalog)
    work = pipeline(tiny_adapter)
    hook.before_pipeline_run({"run_id": SAVE_VERSION, "project_path": str(tmp_path), "pipeline_names": ["demo"]},
                             work, catalog)
    SequentialRunner().run(work, catalog, hook_manager)
    assert len(flushes) == 1  # the judge's verdicts on the 4 traces: one wait for their export
    hook.after_pipeline_run()

    experiment = mlflow.get_experiment_by_name("hooks-test")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = mlflow.search_runs([experiment.experiment_id], output_format="list")
    [parent] = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = {run.info.run_name: run for run in runs if run is not parent}
    assert set(children) == {"data_preparation", "rollout", "sft", "evaluation", "reward_judging",
                             "hiprag (base)", "hiprag_agent_sft (sft)"}
    assert all(run.data.tags["mlflow.parentRunId"] == parent.info.run_id and run.info.status == "FINISHED"
               and run.data.tags["kedro.session_id"] == SAVE_VERSION for run in children.values())
    assert parent.info.status == "FINISHED" and parent.data.tags["prorag.kind"] == "pipeline"
    assert parent.data.params["sft.api_key"] == "***" and parent.data.params["policy.model"] == BUNDLED_TINY_LLAMA
    [questions] = parent.inputs.dataset_inputs  # saved by one stage, loaded by two: logged once
    assert questions.dataset.name == "questions" and len(questions.dataset.digest) == 16
    assert questions.tags[0].value == "data_preparation"

    client = mlflow.MlflowClient()
    sft = children["sft"]
    assert sft.data.tags["prorag.kind"] == "stage" and sft.data.tags["prorag.stage"] == "sft"
    assert sft.data.params["sft.lr"] == "0.1" and sft.data.params["sft.api_key"] == "***"
    assert [(m.step, m.value) for m in client.get_metric_history(sft.info.run_id, "sft.loss")] == [(1, 2.0), (2, 1.5)]
    assert sft.data.metrics["sft.live_loss"] == 3.0  # the stage run is the active run while its node runs
    assert children["data_preparation"].data.metrics["data_report.questions_total"] == 3
    assert children["reward_judging"].data.metrics["judge.skipped_trajectories"] == 0
    # per-method numbers are not flattened into the parent: only the key ones of its result
    assert parent.data.metrics == {"result.hiprag.cem": 0.5, "result.hiprag_agent_sft.cem": 0.75,
                                   "result.hiprag.osr": 1.0, "result.hiprag_agent_sft.osr": 1.0}

    base, trained = children["hiprag (base)"], children["hiprag_agent_sft (sft)"]
    assert base.data.tags["prorag.policy"] == "base" and "prorag.adapter" not in base.data.tags
    assert trained.data.tags["prorag.policy"] == "sft" and trained.data.tags["prorag.adapter"] == "sft_adapter"
    assert trained.data.tags["prorag.method"] == "hiprag_agent_sft" and trained.data.tags["prorag.stage"] == "sft"
    assert trained.data.params["policy.model"] == BUNDLED_TINY_LLAMA
    # the policy params of a method run are the policy that ran: the trained one names its adapter, not null
    assert trained.data.params["policy.adapter"].endswith("sft_adapter")
    assert base.data.params["policy.adapter"] == "null"
    # the curated metrics, the same keys on every method run; every number in the run's table artifact
    curated = {"evaluation.macro.cem", "evaluation.macro.format_rate", "evaluation.popqa.cem", "judge.osr",
               "judge.reward"}
    assert set(base.data.metrics) == set(trained.data.metrics) == curated
    assert (base.data.metrics["evaluation.macro.cem"], trained.data.metrics["evaluation.macro.cem"]) == (0.5, 0.75)
    assert trained.data.metrics["judge.reward"] == 0.75
    table = mlflow.load_table("metrics_table.json", run_ids=[trained.info.run_id])
    values = dict(zip(table["key"], table["value"], strict=True))
    assert values["evaluation.all.cem"] == 0.75 and values["evaluation.macro.cem_low"] == 0.25
    assert values["evaluation.popqa.f1"] == pytest.approx(0.6) and values["judge.by_dataset.popqa.osr"] == 1.0
    assert set(values) == {*curated, "evaluation.all.cem", "evaluation.all.n", "evaluation.macro.cem_low",
                           "evaluation.popqa.f1", "judge.by_dataset.popqa.osr"}
    assert {key for key, flag in zip(table["key"], table["curated"], strict=True) if flag} == curated
    assert set(table["output"]) == {"evaluation_metrics", "judge_metrics"}  # appended by each output

    traces = {run.info.run_name: mlflow.search_traces(locations=[experiment.experiment_id], run_id=run.info.run_id,
                                                      return_type="list") for run in (base, trained)}
    assert {name: len(found) for name, found in traces.items()} == {"hiprag (base)": 2, "hiprag_agent_sft (sft)": 2}
    assert {t.info.tags["prorag.question_key"] for t in traces["hiprag (base)"]} == {
        t.info.tags["prorag.question_key"] for t in traces["hiprag_agent_sft (sft)"]}  # the same questions
    trace = traces["hiprag_agent_sft (sft)"][0]
    assert [span.name for span in trace.data.spans] == ["hiprag_agent_sft", "generate 1", "search 1", "generate 2"]
    root, search = trace.data.spans[0], trace.data.spans[2]
    assert root.outputs["answer"] == "Paris" and search.inputs["query"].startswith("capital of popqa/")
    assert search.outputs["passage_ids"] == ["p1", "p2"] and search.span_type == "RETRIEVER"
    assert root.start_time_ns <= trace.data.spans[1].start_time_ns < search.start_time_ns <= root.end_time_ns
    assessments = {item.name: item for item in trace.info.assessments}
    assert assessments["over_search"].value is True and assessments["over_search"].span_id == search.span_id
    assert assessments["under_search"].error.error_message == "no verdict in the reply"
    assert assessments["reward"].value == 0.75

    [version] = client.search_model_versions("name='prorag-sft_adapter'")
    assert version.run_id == sft.info.run_id and version.tags["prorag.base_model"] == BUNDLED_TINY_LLAMA
    model = mlflow.pyfunc.load_model("models:/prorag-sft_adapter/1")
    [text] = model.predict(["What is the capital of France?"], params={"max_new_tokens": 4})
    assert isinstance(text, str) and text
    generator = model.unwrap_python_model().generator
    assert generator.tokenizer is not None


def test_a_method_run_carries_its_own_entry_of_the_methods_and_arms_lists():
    """The run of ``direct`` logs the rollout block with its own entry only, not the agent settings of its sibling
    methods (which made ``direct`` look like it ran with HiPRAG's budgets)."""
    from prorag.hooks.mlflow_tracking import _own_entry

    rollout = {"temperature": 0.0, "methods": [{"name": "direct", "kind": "direct", "max_new_tokens": 32},
                                               {"name": "hiprag_agent", "kind": "agent", "step_budget": 3}]}
    compare = {"arms": [{"name": "standard_rag"}, {"name": "hiprag_sft", "method": "hiprag"}], "seed": 0}
    used = _own_entry({"rollout": rollout, "compare": compare, "policy": {"model": "m"}}, "direct")
    assert used["rollout"] == {"temperature": 0.0, "methods": [{"name": "direct", "kind": "direct",
                                                                 "max_new_tokens": 32}]}
    assert used["compare"] == compare and used["policy"] == {"model": "m"}  # no entry named direct: kept whole
    assert _own_entry({"compare": compare}, "hiprag_sft")["compare"]["arms"] == [{"name": "hiprag_sft",
                                                                                  "method": "hiprag"}]


class _RefusingDataset(MemoryDataset):
    """A dataset whose save fails (a full disk, a permission error), after its node has run."""

    def save(self, data: Any) -> None:
        raise OSError("No space left on device (store http://user:sk-secretvalue123456@store.example/v1)")


@pytest.mark.integration  # a fresh store's migrations take ~8 s here
def test_a_stage_whose_output_fails_to_save_is_failed_with_its_parent(tmp_path: Path, mlflow_uri: str) -> None:
    """Kedro calls ``after_node_run`` before it saves the node's outputs: a save that fails then fails the run,
    and the stage run, which had ended FINISHED, is FAILED too (issue 47's weak point)."""
    parameters = {"tracking": {"experiment_name": "save-fails", "system_metrics": False, "trace_samples": 0}}
    catalog = DataCatalog({"answer": _RefusingDataset(), "parameters": MemoryDataset(parameters)})
    hook = MlflowTrackingHook()
    hook_manager = _create_hook_manager()
    hook_manager.register(hook)
    hook.after_catalog_created(catalog)
    work = Pipeline([Node(lambda: 42, None, "answer", name="compute", namespace="stage")])
    hook.before_pipeline_run({"run_id": SAVE_VERSION, "project_path": str(tmp_path), "pipeline_names": ["x"]},
                             work, catalog)
    with pytest.raises(Exception, match="No space left on device") as raised:
        SequentialRunner().run(work, catalog, hook_manager)
    hook.on_pipeline_error(raised.value)

    runs = mlflow.search_runs([mlflow.get_experiment_by_name("save-fails").experiment_id], output_format="list")
    [parent] = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    [stage] = [run for run in runs if run is not parent]
    assert (parent.info.status, stage.info.status) == ("FAILED", "FAILED")
    assert "answer" in stage.data.tags["error"] and "No space left on device" in stage.data.tags["error"]
    assert "sk-secretvalue123456" not in stage.data.tags["error"]  # redacted


@pytest.mark.integration  # the fresh store's migrations alone take ~8 s here
def test_the_parent_run_carries_the_result(tmp_path: Path, mlflow_uri: str) -> None:
    """The run the log links to shows the result: the summary table and OSR/USR as its description and as
    ``result.md``, CEM, retrievals, OSR and USR per method as ``result.*`` metrics (issue 46: it showed node timings
    and an empty description)."""
    from kedro_datasets.text import TextDataset

    summary = "| method | n | CEM [95% CI] |\n|---|---:|---|\n| hiprag_agent_rl | 3 | 0.667 [0.000, 1.000] |\n"
    metrics = {method: {"popqa": {"cem": cem}, "macro": {"cem": cem, "avg_retrieval_count": retrievals}}
               for method, cem, retrievals in (("standard_rag", 0.25, 1.0), ("hiprag_agent_rl", 0.5, 1.5))}
    judged = {"hiprag_agent_rl": {"osr": 0.25, "usr": 0.125, "reward": 0.5}, "skipped_trajectories": 3}
    mlflow.create_experiment("result", artifact_location=(tmp_path / "mlruns").as_uri())
    parameters = {"tracking": {"experiment_name": "result", "system_metrics": False, "trace_samples": 0}}
    catalog = DataCatalog({"evaluation_summary": TextDataset(filepath=str(tmp_path / "evaluation_summary.md")),
                           "parameters": MemoryDataset(parameters)})
    hook = MlflowTrackingHook()
    hook_manager = _create_hook_manager()
    hook_manager.register(hook)
    hook.after_catalog_created(catalog)
    work = Pipeline([
        Node(lambda: (summary, metrics), None, ["evaluation_summary", "evaluation_metrics"], name="evaluate",
             namespace="evaluation"),
        Node(lambda: judged, None, "judge_metrics", name="judge", namespace="reward_judging"),
    ])
    hook.before_pipeline_run({"run_id": SAVE_VERSION, "project_path": str(tmp_path), "pipeline_names": ["x"]},
                             work, catalog)
    SequentialRunner().run(work, catalog, hook_manager)
    hook.after_pipeline_run()

    runs = mlflow.search_runs([mlflow.get_experiment_by_name("result").experiment_id], output_format="list")
    [parent] = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert {key: value for key, value in parent.data.metrics.items() if key.startswith("result.")} == {
        "result.standard_rag.cem": 0.25, "result.standard_rag.retrievals": 1.0,
        "result.hiprag_agent_rl.cem": 0.5, "result.hiprag_agent_rl.retrievals": 1.5,
        "result.hiprag_agent_rl.osr": 0.25, "result.hiprag_agent_rl.usr": 0.125}
    description = parent.data.tags["mlflow.note.content"]
    assert "### evaluation_summary\n\n" + summary.strip() in description
    assert "| hiprag_agent_rl | 25% | 12% |" in description and "standard_rag | –" not in description
    artifact = mlflow.artifacts.load_text(f"runs:/{parent.info.run_id}/result.md")
    assert artifact == description


@pytest.mark.integration  # the fresh store's migrations alone take ~8 s here
def test_method_runs_share_their_settings_keys_and_log_no_machine_paths(tmp_path: Path, mlflow_uri: str) -> None:
    """The base and the trained agent's method runs carry the settings they ran with under the same ``method.*``
    keys (MLflow's Compare diffs ``few_shot``), not under ``rollout.methods`` and ``methods.hiprag.agent.*``; no
    run logs an absolute path of this machine as a parameter; a method run lasts as long as its rollouts took, not
    as long as the pipeline stayed open after them (issue 46)."""
    import time

    from prorag.agent.runner import method_settings
    from prorag.specs import MethodSpec, TrainedAgentSpec

    agent = TrainedAgentSpec(step_budget=3)
    base_entry = {"name": "hiprag_agent", "kind": "agent", "protocol": "hiprag", "step_budget": 3, "few_shot": True}
    adapter = tmp_path / "data" / "06_models" / "sft_adapter" / SAVE_VERSION / "sft_adapter"

    def stamped(method: str, spec: MethodSpec, adapter_dir: Path | None) -> list[dict[str, Any]]:
        started = time.time_ns()
        time.sleep(0.3)  # the rollouts' work
        records = [rollout(method, question, None if adapter_dir is None else str(adapter_dir))
                   for question in QUESTIONS]
        for record in records:  # what build_runner records
            record["metadata"].update(method=method_settings(spec), runner_wall_ns=[started, time.time_ns()])
        return records

    def base_rollouts(rollout_params: dict[str, Any], policy: dict[str, Any]) -> list[dict[str, Any]]:
        return stamped("hiprag_agent", MethodSpec(**base_entry), None)

    def trained_rollouts(rollout_params: dict[str, Any], policy: dict[str, Any], agent_params: dict[str, Any],
                         ) -> list[dict[str, Any]]:
        time.sleep(1.5)  # training, after the base rollouts
        return stamped("hiprag_agent_sft", MethodSpec(kind="agent", **{**agent.model_dump(),
                                                                      "name": "hiprag_agent_sft"}), adapter)

    mlflow.create_experiment("settings", artifact_location=(tmp_path / "mlruns").as_uri())
    parameters = {"data": {"corpus_file": "/srv/corpora/wiki.jsonl", "out": str(tmp_path / "data" / "x.jsonl")},
                  "rollout": {"temperature": 0.0, "methods": [{"name": "direct", "kind": "direct"}, base_entry]},
                  "policy": {"model": BUNDLED_TINY_LLAMA, "adapter": None},
                  "methods": {"hiprag": {"agent": agent.model_dump()}},
                  "tracking": {"experiment_name": "settings", "system_metrics": False, "trace_samples": 0}}
    catalog = DataCatalog({"parameters": MemoryDataset(parameters),
                           "params:methods.hiprag.agent": MemoryDataset(parameters["methods"]["hiprag"]["agent"]),
                           **{f"params:{name}": MemoryDataset(value) for name, value in parameters.items()}})
    hook = MlflowTrackingHook()
    hook_manager = _create_hook_manager()
    hook_manager.register(hook)
    hook.after_catalog_created(catalog)
    work = Pipeline([
        Node(lambda data: None, "params:data", None, name="prepare", namespace="data_preparation"),
        Node(base_rollouts, ["params:rollout", "params:policy"], "trajectories", name="run_rollouts",
             namespace="rollout"),
        Node(trained_rollouts, ["params:rollout", "params:policy", "params:methods.hiprag.agent"],
             "sft_policy_trajectories", name="run_policy_rollouts", namespace="sft"),
    ])
    hook.before_pipeline_run({"run_id": SAVE_VERSION, "project_path": str(tmp_path), "pipeline_names": ["x"]},
                             work, catalog)
    SequentialRunner().run(work, catalog, hook_manager)
    hook.after_pipeline_run()

    runs = mlflow.search_runs([mlflow.get_experiment_by_name("settings").experiment_id], output_format="list")
    by_name = {run.info.run_name: run for run in runs}
    base, trained = by_name["hiprag_agent (base)"].data.params, by_name["hiprag_agent_sft (sft)"].data.params
    assert set(base) == set(trained)
    assert not any(key.startswith(("rollout.methods", "methods.")) for key in base | trained)
    assert (base["method.few_shot"], trained["method.few_shot"]) == ("true", "false")
    assert base["method.step_budget"] == trained["method.step_budget"] == "3"
    assert trained["policy.adapter"] == f"data/06_models/sft_adapter/{SAVE_VERSION}/sft_adapter"
    [parent] = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert parent.data.params["data.corpus_file"] == "<local>/wiki.jsonl"
    assert parent.data.params["data.out"] == "data/x.jsonl"
    durations = {name: run.info.end_time - run.info.start_time for name, run in by_name.items()}
    assert 300 <= durations["hiprag_agent (base)"] < 1000 and 300 <= durations["hiprag_agent_sft (sft)"] < 1000
    assert durations[parent.info.run_name] >= 2100
    logged = [value for run in runs for value in (*run.data.params.values(), *run.data.tags.values())]
    assert not [value for value in logged if str(tmp_path) in value or "/srv/" in value]
