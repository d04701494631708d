"""The project as Kedro tools see it: registry, kedro-viz build."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kedro.framework.startup import bootstrap_project

from prorag.pipeline_registry import register_pipelines

KEDRO = str(Path(sys.executable).with_name("kedro"))


def test_registry_has_train_as_default():
    pipelines = register_pipelines()
    assert {"data_preparation", "corpus_indexing", "index", "train", "__default__"} <= set(pipelines)
    assert pipelines["__default__"].nodes == pipelines["train"].nodes
    assert set(pipelines["index"].nodes) <= set(pipelines["train"].nodes)


@pytest.mark.integration
def test_kedro_registry_list(project_root):
    result = subprocess.run([KEDRO, "registry", "list"], cwd=project_root, capture_output=True, text=True,
                            env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}, timeout=120, check=True)
    assert "- train" in result.stdout
    assert "- data_preparation" in result.stdout
    assert "- index" in result.stdout


@pytest.mark.integration
def test_kedro_viz_build_shows_the_pipelines(project_copy):
    bootstrap_project(project_copy)
    subprocess.run([KEDRO, "viz", "build"], cwd=project_copy, capture_output=True, text=True,
                   env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}, timeout=300, check=True)
    api = project_copy / "build" / "api"
    main = json.loads((api / "main").read_text())
    pipeline_ids = {pipeline["id"] for pipeline in main["pipelines"]}
    assert {"train", "data_preparation", "corpus_indexing", "index"} <= pipeline_ids
    train = json.loads((api / "pipelines" / "train").read_text())
    node_names = {node["name"] for node in train["nodes"]}
    assert {"load_question_files", "load_corpus_files", "build_data_report", "select_index_corpus", "build_index",
            "evaluate_retrieval"} <= node_names
    assert {"questions", "raw_question_files", "raw_corpus_files"} <= node_names
    # layers are on (kedro-viz empties the list when a later layer feeds an earlier one), in the convention's order
    assert train["layers"] == ["raw", "intermediate", "primary", "feature", "model_input", "models", "model_output",
                               "reporting"]
    # each stage collapses into its namespace
    assert {"data_preparation", "corpus_indexing", "rollout", "sft_synthesis", "sft", "rl", "evaluation",
            "reward_judging"} <= set(train["modular_pipelines"])
