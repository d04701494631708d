"""Every rollout says what ran it: its method's settings (the same keys for an agent before and after training, a
baseline's own two) and the wall clock of its method's runner call, which the MLflow method runs log."""

from __future__ import annotations

import time

import pytest

from prorag.agent import build_runner
from prorag.agent.runner import METHOD_METADATA_KEY, WALL_TIME_METADATA_KEY, method_settings
from prorag.specs import MethodSpec, SamplingSpec, TrainedAgentSpec

QUESTION = "Between Harvey Pekar and Denise Levertov who was born earlier?"


def test_rollouts_record_their_methods_settings_and_wall_clock(scripted, keyword_retriever, hotpot_questions):
    question = hotpot_questions[0]
    direct = MethodSpec(name="direct", kind="direct", max_new_tokens=8)
    before = time.time_ns()
    (rollout,) = build_runner(direct, scripted({question.question: "Harvey Pekar"}), keyword_retriever(), top_k=2,
                              sampling=SamplingSpec())([question])
    start, end = rollout.metadata[WALL_TIME_METADATA_KEY]
    assert before <= start <= end <= time.time_ns()
    assert rollout.metadata[METHOD_METADATA_KEY] == {"kind": "direct", "max_new_tokens": 8}  # no agent budgets
    assert rollout.to_dict()["metadata"][METHOD_METADATA_KEY] == {"kind": "direct", "max_new_tokens": 8}

    base = MethodSpec(name="hiprag_agent", kind="agent", protocol="hiprag", step_budget=3, few_shot=True)
    trained_agent = TrainedAgentSpec(step_budget=3)  # as run_trained_rollouts makes the trained method
    trained = MethodSpec(kind="agent", **{**trained_agent.model_dump(), "name": "hiprag_agent_rl"})
    assert method_settings(base).keys() == method_settings(trained).keys()
    assert (method_settings(base)["few_shot"], method_settings(trained)["few_shot"]) == (True, False)
    budgets = {"protocol", "step_budget", "max_new_tokens_per_turn", "max_total_new_tokens"}
    assert budgets <= method_settings(base).keys()
    assert "name" not in method_settings(base) and "max_new_tokens" not in method_settings(base)


@pytest.mark.integration  # the MLflow store's migrations alone take ~8 s here
def test_a_search_span_lasts_as_long_as_the_search_took(scripted, keyword_retriever, hotpot_questions, tmp_path,
                                                        mlflow_uri):
    """The engine clocks each turn's generate and search calls, and the rollout's trace shows those times: a slow
    retriever's span is its measured call, not a share of the wall time by token count (issue 46: a BM25 lookup
    showed 2.58 min)."""
    import mlflow

    from prorag.agent.engine import TURN_CLOCK_METADATA_KEY
    from prorag.tracking.traces import MEASURED_TIMING_NOTE, log_rollout_trace

    question = hotpot_questions[0]
    retriever = keyword_retriever()
    search = retriever.search

    def slow_search(queries, k):
        time.sleep(0.2)
        return search(queries, k)

    retriever.search = slow_search
    script = ("<think><step><reasoning>Look it up.</reasoning><search>Harvey Pekar</search>"
              "<step><reasoning>Done.</reasoning><conclusion>Pekar</conclusion></step></think><answer>Pekar</answer>")
    method = MethodSpec(name="hiprag_agent", kind="agent", protocol="hiprag", step_budget=3)
    (rollout,) = build_runner(method, scripted({question.question: script}), retriever, top_k=2,
                              sampling=SamplingSpec())([question])
    clock = rollout.metadata[TURN_CLOCK_METADATA_KEY]
    assert [kind for kind, _, _ in clock][:3] == ["generate", "search", "generate"]
    assert clock[1][2] - clock[1][1] >= 200_000_000 and clock[0][2] <= clock[1][1] <= clock[1][2] <= clock[2][1]

    experiment = mlflow.create_experiment("clocked", (tmp_path / "mlruns").as_uri())
    run = mlflow.MlflowClient().create_run(experiment)
    record = rollout.to_dict()
    log_rollout_trace(record, experiment_id=experiment, run_id=run.info.run_id, start_ns=0, end_ns=10**18)
    mlflow.flush_trace_async_logging()
    [trace] = mlflow.search_traces(locations=[experiment], run_id=run.info.run_id, return_type="list")
    spans = {span.name: span for span in trace.data.spans}
    searched = spans["search 1"]
    assert (searched.start_time_ns, searched.end_time_ns) == (clock[1][1], clock[1][2])  # the measured call
    assert spans["generate 1"].end_time_ns - spans["generate 1"].start_time_ns < 200_000_000
    root = spans["hiprag_agent"]
    assert (root.start_time_ns, root.end_time_ns) == (clock[0][1], clock[-1][2])  # not the window given
    assert root.attributes["prorag.timing"] == MEASURED_TIMING_NOTE
