"""Nodes of the DPO pipeline."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Final

from prorag.llm.registry import load_tokenizer
from prorag.pipelines.dpo.params import DPOParams
from prorag.specs import PolicySpec
from prorag.tracking.callbacks import MlflowStepMetrics
from prorag.training.dpo import preference_rows, train_dpo_lora
from prorag.training.launch import IN_PROCESS, LaunchSettings, launch_dpo

CURVE_KEYS: Final = ("loss", "learning_rate", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins",
                     "rewards/accuracies", "logps/chosen", "logps/rejected")


def train_dpo_from_adapter(pair_records: list[dict[str, Any]], params: DPOParams, policy: PolicySpec,
                           init_adapter: str, launch: LaunchSettings = IN_PROCESS
                           ) -> tuple[str, dict[str, float], list[dict[str, Any]]]:
    """:func:`train_dpo` continuing ``init_adapter`` (the explorer's cold-start SFT adapter; the reference is its
    frozen copy) instead of a new adapter."""
    if params.trainer.init_adapter is not None:
        raise ValueError("dpo.trainer.init_adapter is set, and recipe sft_mcts_dpo continues its cold-start SFT "
                         "adapter: leave dpo.trainer.init_adapter null")
    trainer = params.trainer.model_copy(update={"init_adapter": init_adapter})
    return train_dpo(pair_records, params.model_copy(update={"trainer": trainer}), policy, launch)


def train_dpo(pair_records: list[dict[str, Any]], params: DPOParams, policy: PolicySpec,
              launch: LaunchSettings = IN_PROCESS) -> tuple[str, dict[str, float], list[dict[str, Any]]]:
    """Train a LoRA adapter on the pairs; returns its folder (versioned by the catalog), a summary (``dpo.*`` in
    MLflow; the per-step curves are logged live as ``dpo.loss``, ``dpo.rewards/margins``, ``dpo.rewards/accuracies``
    …) and the training log (a reporting file). In this process, or under ``accelerate launch`` with
    ``launch.mode: accelerate`` (:mod:`prorag.training.launch`; rank 0 logs the curves)."""
    if not pair_records:
        raise ValueError(
            "reasonrag_pairs is empty: no two sibling MCTS steps differ in value by reasonrag_data.min_reward_gap "
            "(reasonrag_data_report has the tree statistics; when the explorer answers every simulated question "
            "wrongly, every Q is 0). Explore more (reasonrag_data.questions.max_per_source, mcts.iterations), train "
            "the cold-start explorer longer (methods.<name>.stages.sft, recipe sft_mcts_dpo) or explore with a "
            "stronger model (recipe mcts_dpo with reasonrag_data.policy)")
    tokenizer = load_tokenizer(policy.model)
    rows = preference_rows(tokenizer, pair_records)
    if launch.enabled:
        result = launch_dpo(policy.model, rows, params.trainer, launch, metrics_prefix="dpo")
        adapter_dir, history = result.adapter, result.log_history
    else:
        adapter_dir, history = train_dpo_lora(policy.model, rows, Path(tempfile.mkdtemp(prefix="prorag-dpo-")),
                                              params.trainer, callbacks=[MlflowStepMetrics("dpo")])
    curve = [{"step": int(entry["step"]), **{key: float(entry[key]) for key in CURVE_KEYS if key in entry}}
             for entry in history if "step" in entry and "loss" in entry]
    summary: dict[str, float] = {"pairs": len(rows), "steps": max((entry["step"] for entry in curve), default=0)}
    for key in ("loss", "rewards/margins", "rewards/accuracies"):
        values = [entry[key] for entry in curve if key in entry]
        if values:
            name = key.replace("rewards/", "")
            summary[f"{name}_first"], summary[f"{name}_last"] = values[0], values[-1]
            summary[f"{name}_mean"] = sum(values) / len(values)
    return str(adapter_dir), summary, curve
