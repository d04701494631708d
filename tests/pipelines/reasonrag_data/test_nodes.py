"""reasonrag_data nodes: the MCTS judge of eq. 6 is the method's ``value.judge``, every field of it."""

from __future__ import annotations

from typing import Any

from prorag.judges.reference import ReferenceJudge
from prorag.pipelines.reasonrag_data import nodes
from prorag.pipelines.reasonrag_data.params import ReasonRAGDataParams
from prorag.specs import JudgeSpec, PolicySpec, TrainedAgentSpec
from prorag.training.mcts import MCTSValue


class _Index:
    def retriever(self, kind: str) -> str:
        return f"{kind} retriever"


def test_the_answer_matching_judge_is_built_from_the_whole_value_judge_spec(monkeypatch, tmp_path):
    """It was built field by field, and dropped ``equivalence``, the limits and the budget on the way."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(nodes, "build_policy", lambda policy: "policy")
    monkeypatch.setattr(nodes, "mcts_fingerprint", lambda *args: "fingerprint")
    monkeypatch.setattr(nodes, "run_mcts", lambda *args, judge, **kwargs: seen.setdefault("judge", judge) and [])
    value = MCTSValue(kind="judge", judge_prompt="answer_matching",
                      judge=JudgeSpec(equivalence="content", f1_threshold=0.5, max_unknown_rate=0.2))
    params = ReasonRAGDataParams(questions={"sources": ["nq"], "max_per_source": 1}, work_dir=str(tmp_path))
    nodes.run_reasonrag_mcts([], _Index(), params, PolicySpec(),  # type: ignore[arg-type]
                             TrainedAgentSpec(protocol="reasonrag", name="reasonrag_agent"), value)
    judge = seen["judge"]
    assert isinstance(judge, ReferenceJudge)
    assert (judge.equivalence, judge.f1_threshold, judge.retriever) == ("content", 0.5, "bm25 retriever")


def test_spre_searches_without_a_judge(monkeypatch, tmp_path):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(nodes, "build_policy", lambda policy: "policy")
    monkeypatch.setattr(nodes, "mcts_fingerprint", lambda *args: "fingerprint")
    monkeypatch.setattr(nodes, "run_mcts", lambda *args, judge, **kwargs: seen.setdefault("judge", judge) or [])
    params = ReasonRAGDataParams(questions={"sources": ["nq"], "max_per_source": 1}, work_dir=str(tmp_path))
    nodes.run_reasonrag_mcts([], _Index(), params, PolicySpec(),  # type: ignore[arg-type]
                             TrainedAgentSpec(protocol="reasonrag", name="reasonrag_agent"), MCTSValue(kind="spre"))
    assert seen["judge"] is None
