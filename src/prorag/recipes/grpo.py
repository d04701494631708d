"""The GRPO recipes: gold trajectories → SFT → GRPO (``sft_rl``), GRPO from the latest SFT adapter
(``rl_from_sft``) or from the instruct model (``rl_from_instruct``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kedro.pipeline import Pipeline, pipeline

from prorag.recipes.base import Recipe
from prorag.recipes.stages import StagePipelines, concat, renamed


def _outputs(name: str, method: Mapping[str, Any]) -> dict[str, str]:
    return {"rl_adapter": method["adapter"], "rl_training_log": f"{name}_training_log"}


def build_sft_rl(stages: StagePipelines, name: str, method: Mapping[str, Any]) -> Pipeline:
    """index → base rollouts → SFT data → LoRA SFT → GRPO → base, SFT and RL policies evaluated side by side."""
    p = stages.pipelines
    built = (p["index"] + p["rollout"] + stages.evaluated + p["sft_synthesis"] + p["sft"] + p["rl"]
             + stages.trained_rollouts["sft"] + stages.trained_rollouts["rl"]
             + concat("trajectories", "sft_policy_trajectories", "rl_policy_trajectories") + stages.judged)
    return renamed(built, _outputs(name, method))


def build_rl_from_sft(stages: StagePipelines, name: str, method: Mapping[str, Any]) -> Pipeline:
    """GRPO continuing the latest SFT adapter → the method's adapter, evaluated by ``compare``."""
    return stages.evaluated + pipeline(stages.pipelines["rl"], namespace=name, prefix_datasets_with_namespace=False,
                                       outputs=_outputs(name, method))


def build_rl_from_instruct(stages: StagePipelines, name: str, method: Mapping[str, Any]) -> Pipeline:
    """GRPO from the instruct model (no SFT stage), the RL policy evaluated and judged."""
    return renamed(stages.rl_from_instruct(evaluate=True), _outputs(name, method))


SFT_RL = Recipe(("sft_synthesis", "sft", "rl"), build_sft_rl, adapters=("sft_adapter",),
                description="gold trajectories -> LoRA SFT -> GRPO (HiPRAG §4)",
                trainers={"sft": "sft", "rl.trainer": "grpo"})
RL_FROM_SFT = Recipe(("rl",), build_rl_from_sft, description="GRPO continuing the latest SFT adapter",
                     trainers={"rl.trainer": "grpo"})
RL_FROM_INSTRUCT = Recipe(("rl",), build_rl_from_instruct, description="GRPO from the instruct model, no SFT stage",
                          trainers={"rl.trainer": "grpo"})
