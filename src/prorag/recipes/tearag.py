"""TeaRAG's recipe (§4.3): index → KG → SFT data → SFT → IP-DPO rounds → TeaRAG rollouts → evaluation, judging."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kedro.pipeline import Pipeline, pipeline

from prorag.pipelines import tearag
from prorag.recipes.base import Recipe
from prorag.recipes.stages import StagePipelines, renamed

_JUDGED = ("evaluation_table", "evaluation_metrics", "evaluation_summary", "step_verdicts", "trajectory_rewards",
           "judge_metrics")


def build_tearag(stages: StagePipelines, name: str, method: Mapping[str, Any]) -> Pipeline:
    """The TeaRAG stages (its own block, ``tearag``) with its rollouts evaluated and judged as ``tearag_*``."""
    p = stages.pipelines
    built = (p["index"] + p["kg_extraction"] + stages.evaluated + tearag.create_pipeline()
             + pipeline(p["evaluation"] + p["reward_judging"], inputs={"trajectories": "tearag_trajectories"},
                        outputs={output: f"tearag_{output}" for output in _JUDGED}))
    return renamed(built, {"tearag_adapter": method["adapter"]})


TEARAG = Recipe(("tearag",), build_tearag, description="TeaRAG: SFT -> IP-DPO rounds (its own block)",
                own_stages=("tearag",), agent_stages=("tearag",),
                trainers={"tearag.sft": "sft", "tearag.ip_dpo.trainer": "dpo"})
