"""Per-node timing hook: a table of wall time and generation tokens, in 08_reporting and the MLflow run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
import pandas as pd

from prorag.hooks.timing import NodeTimingHook
from prorag.llm.generation import SamplingParams
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.transformers_backend import TransformersGenerator


def test_nodes_are_timed_with_their_generation_tokens(tmp_path: Path, mlflow_uri: str, one_torch_thread):
    generator = TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=2)
    hook = NodeTimingHook()
    hook.before_pipeline_run({"project_path": str(tmp_path)}, None)
    with mlflow.start_run() as run:
        prepare, rollout = SimpleNamespace(name="prepare"), SimpleNamespace(name="rollout.run_rollouts")
        hook.before_node_run(prepare)
        hook.after_node_run(prepare)
        hook.before_node_run(rollout)
        prompt = generator.encode("one two three four five six")
        for turn in range(2):  # the second call extends the first: its prompt comes from the cache
            prompt += generator.generate([prompt], SamplingParams(max_new_tokens=4))[0][0].token_ids + [42] * turn
        hook.after_node_run(rollout)
        hook.after_pipeline_run()
    table = pd.read_csv(tmp_path / "data" / "08_reporting" / "node_timing.csv")
    assert list(table["node"]) == ["prepare", "rollout.run_rollouts", "(run wall time)"]
    row = table.iloc[1]
    assert row["decode_tokens"] == 8 and row["cached_tokens"] > 0 and 0 < row["cache_hit_rate"] < 1
    assert pd.isna(table.iloc[0]["decode_tokens"])  # no generation in that node
    assert table.iloc[2]["seconds"] >= table["seconds"].iloc[:2].sum() - 0.02
    assert "| node |" in (tmp_path / "data" / "08_reporting" / "node_timing.md").read_text()
    logged = mlflow.get_run(run.info.run_id)
    assert logged.data.metrics["node_timing.rollout.run_rollouts.decode_tokens"] == 8
    artifacts = [item.path for item in mlflow.MlflowClient().list_artifacts(run.info.run_id, "reporting/node_timing")]
    assert sorted(artifacts) == ["reporting/node_timing/node_timing.csv", "reporting/node_timing/node_timing.md"]
