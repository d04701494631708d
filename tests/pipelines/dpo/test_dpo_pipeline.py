"""The DPO node with the tiny random policy: adapter, summary, and live curves in MLflow."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from prorag.llm import BUNDLED_TINY_LLAMA
from prorag.pipelines.dpo.nodes import train_dpo
from prorag.pipelines.dpo.params import DPOParams
from prorag.protocol import reasonrag
from prorag.specs import PolicySpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAIRS = [
    {"messages": reasonrag.render_prompt("Who wrote Hamlet?"), "transcript": "",
     "chosen": "So the answer is <answer>Shakespeare</answer>",
     "rejected": "So the next query is <query>Hamlet</query>"},
    {"messages": reasonrag.render_prompt("Capital of Peru?"), "transcript": "",
     "chosen": "So the answer is <answer>Lima</answer>", "rejected": "So the answer is <answer>Cusco</answer>"},
]


@pytest.mark.integration
@pytest.mark.slow
def test_train_dpo_logs_curves_and_returns_the_adapter(mlflow_uri: str) -> None:
    params = DPOParams(trainer={"learning_rate": 1e-3, "max_steps": 2, "per_device_train_batch_size": 1,
                                "gradient_accumulation_steps": 1, "warmup_ratio": 0.0})
    with mlflow.start_run() as run:
        adapter, summary, curve = train_dpo(PAIRS, params, PolicySpec(model=BUNDLED_TINY_LLAMA))
    assert (Path(adapter) / "adapter_config.json").is_file()
    assert summary["pairs"] == 2 and summary["steps"] == 2 and "margins_last" in summary
    assert [entry["step"] for entry in curve] == [1, 2]
    history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "dpo.rewards/margins")
    assert [point.step for point in history] == [1, 2]


def test_train_dpo_without_pairs_says_why_and_what_to_change() -> None:
    with pytest.raises(ValueError, match=r"reasonrag_pairs is empty.*min_reward_gap.*reasonrag_data\.policy"):
        train_dpo([], DPOParams(), PolicySpec(model=BUNDLED_TINY_LLAMA))
