"""Every rollout says what ran it: its method's settings (the same keys for an agent before and after training, a
baseline's own two) and the wall clock of its method's runner call, which the MLflow method runs log."""

from __future__ import annotations

import time

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
