"""ReasonRAG's recipes (§2): MCTS trees searched for the method's ``value`` → step-level pairs → DPO
(``mcts_dpo``), optionally from a cold start SFT'd on gold trajectories in the method's protocol, which explores
the trees and which DPO continues (``sft_mcts_dpo``; the paper explores with GPT-4o, and a 135M policy alone never
answers right)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kedro.pipeline import Pipeline, pipeline

from prorag.pipelines import dpo, reasonrag_data, tags
from prorag.pipelines.rollout.pipeline import trained_policy_rollouts
from prorag.recipes.base import Recipe
from prorag.recipes.stages import StagePipelines, concat, renamed


def cold_start_adapter(name: str, method: Mapping[str, Any]) -> str | None:
    """The dataset of method ``name``'s cold-start SFT adapter (recipe ``sft_mcts_dpo``: the MCTS explores with it
    and DPO continues it), None for a recipe without one."""
    return f"{name}_sft_adapter" if method["recipe"] == "sft_mcts_dpo" else None


def build_mcts_dpo(stages: StagePipelines, name: str, method: Mapping[str, Any]) -> Pipeline:
    """index → MCTS trees → step-level pairs → DPO → the DPO policy rolled out with the method's agent beside the
    base methods on the same dev questions → evaluation and judging (with a cold start first: module docstring)."""
    p = stages.pipelines
    cold = cold_start_adapter(name, method)
    built = (p["index"] + p["rollout"] + stages.evaluated
             + reasonrag_data.create_pipeline(explorer_adapter=cold) + dpo.create_pipeline(init_adapter=cold)
             + trained_policy_rollouts("dpo", [tags.REASONRAG])
             + concat("trajectories", "dpo_policy_trajectories") + stages.judged)
    if cold is not None:
        outputs = {output: f"{name}_{output}" for output in (
            "sft_trajectories", "sft_synthesis_metrics", "sft_adapter", "sft_metrics")}
        built += pipeline(p["sft_synthesis"] + p["sft"], outputs=outputs)
    return renamed(built, {"dpo_adapter": method["adapter"]})


def standalone_mcts_dpo(name: str, method: Mapping[str, Any]) -> dict[str, Pipeline]:
    """``reasonrag_data`` and ``dpo`` run alone explore with and continue the method's cold start, the
    ``<name>_sft_adapter`` that ``train_<name>`` saves (the base SmolLM2 alone finds no pair, so dpo would have
    nothing to train on); without a cold start, the registered ones."""
    cold = cold_start_adapter(name, method)
    if cold is None:
        return {}
    return {"reasonrag_data": reasonrag_data.create_pipeline(explorer_adapter=cold),
            "dpo": dpo.create_pipeline(init_adapter=cold)}


MCTS_DPO = Recipe(("reasonrag_data", "dpo"), build_mcts_dpo, description="ReasonRAG: MCTS + SPRE pairs -> DPO",
                  own_stages=("reasonrag_data", "dpo"), standalone=standalone_mcts_dpo,
                  trainers={"dpo.trainer": "dpo"})
SFT_MCTS_DPO = Recipe(("sft_synthesis", "sft", "reasonrag_data", "dpo"), build_mcts_dpo,
                      description="ReasonRAG with a cold-start SFT explorer that DPO continues",
                      own_stages=("reasonrag_data", "dpo"), standalone=standalone_mcts_dpo,
                      trainers={"sft": "sft", "dpo.trainer": "dpo"})
