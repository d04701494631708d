"""``rl.questions.min_metadata``: RL questions limited by a metadata field (PopQA's popular subjects, issue 31)."""

from __future__ import annotations

from pathlib import Path

from prorag.data.records import load_questions
from prorag.pipelines.rl.nodes import select_rl_questions
from prorag.pipelines.rl.params import RLParams

ROOT = Path(__file__).resolve().parents[3]


def test_rl_questions_can_be_limited_to_popular_subjects() -> None:
    records = [question.to_dict() for question in load_questions(ROOT / "data" / "01_raw" / "qa" / "popqa.jsonl")]
    params = RLParams.model_validate({"questions": {"sources": ["popqa"], "min_metadata": {"s_pop": 2000}}})
    selected = select_rl_questions(records, records[:3], params)
    expected = [record for record in records[3:] if record["metadata"]["s_pop"] >= 2000]
    assert expected and [record["id"] for record in selected] == [record["id"] for record in expected]
