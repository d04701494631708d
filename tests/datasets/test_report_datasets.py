"""What kedro-viz previews of a run's reports, through kedro-viz's own metadata model and the catalog's entries:
the evaluation summary as its table, and trajectories and evaluation tables with every method, the trained agents
listed after the baselines included (issue 46: the summary had no preview, the others showed baselines only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from kedro.io import AbstractDataset

CATALOG = Path(__file__).resolve().parents[2] / "conf" / "base" / "catalog.yml"
METHODS = ["direct", "standard_rag", "hiprag_agent", "hiprag_agent_sft", "hiprag_agent_rl"]


def _dataset(name: str, tmp_path: Path) -> AbstractDataset:
    """The catalog's entry ``name``, its file under ``tmp_path``."""
    config = dict(yaml.safe_load(CATALOG.read_text(encoding="utf-8"))[name])
    config["filepath"] = str(tmp_path / Path(config["filepath"]).name)
    return AbstractDataset.from_config(name, config)


def _viz_preview(name: str, dataset: AbstractDataset) -> tuple[Any, str | None]:
    """``(preview, preview type)`` as kedro-viz computes them for the dataset's panel."""
    from kedro_viz.models.flowchart.node_metadata import DataNodeMetadata
    from kedro_viz.models.flowchart.nodes import GraphNode

    node = GraphNode.create_data_node(dataset_id=name, dataset_name=name, layer=None, tags=set(), dataset=dataset,
                                      modular_pipelines=set())
    metadata = DataNodeMetadata(data_node=node)
    return metadata.preview, metadata.preview_type


def test_the_evaluation_summary_previews_as_its_table(tmp_path: Path) -> None:
    from prorag.agent.trajectory import Rollout
    from prorag.reporting.summary import render_summary, result_summary

    rollouts = [Rollout(question_key=f"q{index}", question_id=str(index), dataset="popqa", question="?",
                        golden_answers=("Paris",), method=method, protocol="hiprag", prompt="", prompt_token_ids=[],
                        completion="", segments=[], steps=[], format_ok=True, n_steps=0,
                        answer="Paris" if index < 2 else "Rome", stop_reason="answer", retrieval_count=1,
                        queries=[], retrieved_ids=[], generated_tokens=10, context_tokens=0, tag_tokens=0, turns=1)
                for method in ("standard_rag", "hiprag_agent_rl") for index in range(4)]
    dataset = _dataset("evaluation_summary", tmp_path)
    dataset.save(render_summary(result_summary(rollouts, resamples=50)))
    preview, kind = _viz_preview("evaluation_summary", dataset)
    assert kind == "TablePreview"
    assert preview["columns"][:3] == ["method", "n", "CEM [95% CI]"]
    assert [row[0] for row in preview["data"]] == ["standard_rag", "hiprag_agent_rl"]
    assert preview["data"][1][2].startswith("0.500 [")


def test_the_trajectories_preview_shows_every_method(tmp_path: Path) -> None:
    dataset = _dataset("trajectories", tmp_path)
    dataset.save([{"method": method, "question": f"{method} {index}?", "answer": "Paris", "retrieval_count": 1}
                  for method in METHODS for index in range(3)])  # the baselines first, as the pipelines concat
    preview, kind = _viz_preview("trajectories", dataset)
    assert kind == "TablePreview" and preview["columns"][0] == "method"
    shown = [row[0] for row in preview["data"]]
    assert shown == METHODS * 2  # two of each method, in turn
    assert preview["index"][:2] == [1, 4]  # the file's line numbers


def test_the_evaluation_table_preview_shows_every_methods_pooled_row(tmp_path: Path) -> None:
    dataset = _dataset("evaluation_table", tmp_path)
    dataset.save(pd.DataFrame([{"method": method, "dataset": dataset_name, "cem": 0.5}
                               for method in METHODS for dataset_name in ("all", "hotpotqa", "nq", "popqa")]))
    preview, kind = _viz_preview("evaluation_table", dataset)
    assert kind == "TablePreview"
    rows = [dict(zip(preview["columns"], row, strict=True)) for row in preview["data"]]
    assert [(row["method"], row["dataset"]) for row in rows[:5]] == [(method, "all") for method in METHODS]
    assert [row["method"] for row in rows[5:10]] == METHODS and len(rows) == 12


def test_a_report_previews_the_table_asked_for(tmp_path: Path) -> None:
    from kedro.io.core import DatasetError

    dataset = _dataset("comparison_report", tmp_path)
    dataset.save("# Method comparison\n\n| arm | status |\n|---|---|\n| rag | ran |\n\n## Results\n\n"
                 "| arm | CEM | OSR |\n|---|---|---:|\n| rag | 0.300 | – |\n| hiprag_sft | 0.500 | 10% |\n")
    preview, _ = _viz_preview("comparison_report", dataset)  # preview_args: {table: 1}
    assert preview["columns"] == ["arm", "CEM", "OSR"] and preview["data"][1] == ["hiprag_sft", "0.500", "10%"]
    with pytest.raises(DatasetError, match="preview table 5 asked for, the report has 2"):
        dataset.preview(table=5)


def test_markdown_tables_pad_short_rows_and_skip_prose():
    from prorag.datasets.report_datasets import markdown_tables

    text = "Intro | not a table\n\n| a | b |\n|:--|--:|\n| 1 |\n| 2 | 3 | 4 |\ntext\n"
    assert markdown_tables(text) == [(["a", "b"], [["1", ""], ["2", "3"]])]
