"""Item 14 of issue 28: judges at the paper's batch — one rate limiter shared by every judge (and process) of an
endpoint, usage and cost in MLflow, a budget, and a fail-closed cap on the unknown-verdict rate. Against the
project's own OpenAI-compatible server on loopback, and MLflow with a sqlite store."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from prorag.assembly import build_judge_from_spec
from prorag.judges import limits
from prorag.judges.limits import JudgeBudgetExceeded, RateLimiter, UnknownVerdictRateError
from prorag.serving import create_app, serve_in_thread
from prorag.specs import JudgeSpec

from .conftest import gpu_parameters

MODEL = "judge-model"


@pytest.fixture(autouse=True)
def fresh_limits(monkeypatch, tmp_path):
    monkeypatch.setenv("PRORAG_CACHE_DIR", str(tmp_path))
    limits.reset_for_tests()
    yield
    limits.reset_for_tests()


@pytest.fixture(scope="module")
def judge_server(scripted_judge_model):
    """The scripted judge model served as ``judge-model``; arrival times of its chat requests recorded."""
    app = create_app(scripted_judge_model, MODEL, max_batch_size=64, batch_wait_ms=1, max_tokens_limit=4096)
    arrivals: list[float] = []

    async def record(scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            arrivals.append(time.monotonic())
        await app(scope, receive, send)

    url, stop = serve_in_thread(record)
    yield url, arrivals
    stop()


def _spec(url: str, **update) -> JudgeSpec:
    """conf/gpu's over-search judge, pointed at the loopback server."""
    raw = dict(gpu_parameters()["reward"]["over_search_judge"])
    assert {"requests_per_minute", "max_unknown_rate", "budget_usd", "price_per_million_tokens"} <= set(raw)
    return JudgeSpec.model_validate({**raw, "base_url": url, "model": MODEL, "api_key_env": None,
                                     "cache_path": None, "max_retries": 0, **update})


def test_every_judge_of_an_endpoint_shares_one_rate_limit(judge_server):
    url, arrivals = judge_server
    over = build_judge_from_spec(_spec(url, requests_per_minute=600))  # 10 per second, burst 10
    under = build_judge_from_spec(_spec(url, requests_per_minute=600))
    assert over.limiter is under.limiter
    pairs = [(f"statement {index}", f"other {index}") for index in range(15)]
    before = len(arrivals)
    started = time.monotonic()
    threads = [threading.Thread(target=judge.equivalent, args=(pairs,)) for judge in (over, under)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    assert len(arrivals) - before == 30
    assert elapsed >= 1.8, f"30 requests at 600/min (burst 10) took {elapsed:.2f} s"  # (30 - 10) x 0.1 s


def test_processes_share_the_schedule_through_the_state_file(tmp_path):
    """Two limiters on one state file (two processes of the node) hand out distinct, evenly spaced slots."""
    state = tmp_path / "ratelimit"
    first, second = RateLimiter(60, state_file=state), RateLimiter(60, state_file=state)  # 1 per second, burst 1
    waits = [limiter._reserve() for limiter in (first, second, first, second)]
    assert waits[0] == pytest.approx(0.0, abs=0.05)
    for earlier, later in itertools.pairwise(waits):
        assert later - earlier == pytest.approx(1.0, abs=0.05)


def test_usage_and_cost_reach_mlflow_and_the_budget_stops_judging(judge_server, mlflow_uri):
    from mlflow import MlflowClient

    from prorag.hooks.mlflow_tracking import MlflowTrackingHook

    url, _ = judge_server
    judge = build_judge_from_spec(_spec(url, budget_usd=1e-6,
                                        price_per_million_tokens={"input": 1000.0, "output": 1000.0}))
    verdicts = judge.equivalent([("a", "b"), ("c", "d")])
    assert all(verdict.value is not None for verdict in verdicts)
    metrics = limits.usage_metrics()
    tokens = metrics[f"judge_usage/{MODEL}/input_tokens"] + metrics[f"judge_usage/{MODEL}/output_tokens"]
    assert tokens > 0 and metrics["judge_usage/cost_usd"] == pytest.approx(tokens * 1000.0 / 1e6)
    assert judge.stats.input_tokens > 0

    client = MlflowClient(mlflow_uri)
    experiment = client.create_experiment("judges")
    parent, stage = (client.create_run(experiment).info.run_id for _ in range(2))
    hook = MlflowTrackingHook()
    hook._tracking_uri, hook._parent_id = mlflow_uri, parent
    hook._log_judge_usage(stage)
    for run_id in (parent, stage):
        logged = client.get_run(run_id).data.metrics
        assert logged["judge_usage/cost_usd"] == pytest.approx(metrics["judge_usage/cost_usd"])

    with pytest.raises(JudgeBudgetExceeded, match="reached budget_usd"):
        judge.equivalent([("e", "f")])


def failing_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        return JSONResponse({"error": {"message": "rate limited", "type": "rate_limit"}}, status_code=429)

    return app


def test_a_batch_with_too_many_unknown_verdicts_stops_the_run():
    url, stop = serve_in_thread(failing_app())
    try:
        judge = build_judge_from_spec(_spec(url, requests_per_minute=None))
        with pytest.raises(UnknownVerdictRateError, match=r"20 of 20 verdicts unknown.*max_unknown_rate 5\.0%"):
            judge.equivalent([(f"a{index}", f"b{index}") for index in range(20)])
        small = judge.equivalent([("a", "b")] * 3)  # below the minimum batch: unknown verdicts, no stop
        assert all(verdict.value is None for verdict in small)
    finally:
        stop()


# ------------------------------------------------------------------------------ one ledger for every rank and restart

LEDGER_PROCESS = """
import json, sys, time
from prorag.judges.limits import JudgeBudgetExceeded, use_ledger
from prorag.judges.llm_judge import LLMJudge

url, model, ledger, budget, pairs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
with use_ledger(ledger):
    judge = LLMJudge(url, model, None, max_retries=0, requests_per_minute=60, budget_usd=budget,
                     price_per_million_tokens=(1000.0, 1000.0))
    print("ready", flush=True)
    sys.stdin.readline()  # every process judges from the same moment
    try:
        verdicts = judge.equivalent([(f"{sys.argv[6]} a{i}", f"b{i}") for i in range(pairs)])
        print(json.dumps({"judged": sum(v.value is not None for v in verdicts)}))
    except JudgeBudgetExceeded as error:
        print(json.dumps({"budget": str(error)}))
"""


def _judge_process(url: str, ledger, budget: float, pairs: int, tag: str):
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[2] / "src")
    process = subprocess.Popen([sys.executable, "-c", LEDGER_PROCESS, url, MODEL, str(ledger), str(budget),
                                str(pairs), tag], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": src})
    assert process.stdout.readline().strip() == "ready", process.stderr.read()[-3000:]
    return process


def _go(process):
    process.stdin.write("go\n")
    process.stdin.flush()
    return process


def _result(process) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.integration
def test_two_processes_and_a_restart_share_one_judge_budget_and_rate_limit(judge_server, tmp_path):
    """Issue 43 N6: budget, usage and rate limit were per process (per rank, reset by a restart), so spend could
    reach world size x budget and start over after a crash. Two real processes share the run's ledger: their
    calls are spaced by one rate limit and add up to one account; a restarted process sees that spend and stops."""
    from prorag.judges.limits import JudgeLedger

    url, arrivals = judge_server
    ledger = tmp_path / "run" / "judge_ledger"
    before = len(arrivals)
    ranks = [_judge_process(url, ledger, 1e6, 2, f"rank{rank}") for rank in range(2)]
    results = [_result(process) for process in [_go(process) for process in ranks]]
    assert results == [{"judged": 2}, {"judged": 2}]
    ours = sorted(arrivals[before:])
    assert len(ours) == 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(ours)]
    # one shared limit of 1 per second: 0, 1, 2, 3 s (two limits of their own would send at 0, 0, 1, 1 s)
    assert ours[-1] - ours[0] >= 2.5 and min(gaps) >= 0.5, f"the processes did not share the limit: gaps {gaps}"

    usage = JudgeLedger(ledger).usage()[(url.rstrip("/"), MODEL)]
    assert usage.calls == 4 and usage.input_tokens > 0
    assert usage.cost_usd == pytest.approx((usage.input_tokens + usage.output_tokens) * 1000.0 / 1e6)

    # the run restarts: a new process with a budget the two ranks already spent makes no request
    restarted = _result(_go(_judge_process(url, ledger, usage.cost_usd, 2, "after-restart")))
    assert "reached budget_usd" in restarted.get("budget", ""), restarted
    assert str(ledger) in restarted["budget"]
    assert len(arrivals) - before == 4
    # ... and with room left, it goes on from the ledger's total (and its rate-limit schedule)
    assert _result(_go(_judge_process(url, ledger, 1e6, 1, "after-restart"))) == {"judged": 1}
    assert JudgeLedger(ledger).usage()[(url.rstrip("/"), MODEL)].calls == 5
    assert sorted(arrivals[before:])[-1] - ours[-1] >= 0.5  # the restarted process kept to the shared schedule


def test_usage_metrics_report_the_ledger_in_use(judge_server, tmp_path):
    url, _ = judge_server
    judge = build_judge_from_spec(_spec(url, requests_per_minute=None,
                                        price_per_million_tokens={"input": 1.0, "output": 1.0}))
    judge.equivalent([("a", "b")])
    mine = limits.usage_metrics()[f"judge_usage/{MODEL}/calls"]
    with limits.use_ledger(tmp_path / "ledger"):
        limits.JudgeLedger(tmp_path / "ledger").add(url, MODEL, 10, 5, 0.5)  # another rank's call
        judge.equivalent([("c", "d")])
        metrics = limits.usage_metrics()
        assert metrics[f"judge_usage/{MODEL}/calls"] == 2 and metrics["judge_usage/cost_usd"] >= 0.5
        assert limits.endpoint_cost(url) == pytest.approx(metrics["judge_usage/cost_usd"])
    assert limits.usage_metrics()[f"judge_usage/{MODEL}/calls"] == mine + 1  # the process's own count


def test_the_judge_cost_of_a_step_is_logged_summed_over_processes():
    from types import SimpleNamespace

    from prorag.training.trl_grpo import AgentGRPOTrainer

    logged: dict[str, float] = {}
    trainer = SimpleNamespace(accelerator=SimpleNamespace(device="cpu", num_processes=1),
                              log_metric=lambda name, value: logged.__setitem__(name, value))
    AgentGRPOTrainer.record_judge_step_cost(trainer, 0.25)
    assert logged == {"judge_usage/step_cost_usd": 0.25}
