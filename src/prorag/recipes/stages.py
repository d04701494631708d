"""What recipes compose: the registered stage pipelines and the pieces several recipes share."""

from __future__ import annotations

from collections.abc import Mapping

from kedro.pipeline import Node, Pipeline, pipeline

from prorag.pipelines import rl, rollout, tags
from prorag.pipelines.rollout.nodes import TRAINED_AGENT_STAGES, gather_trajectories
from prorag.pipelines.rollout.pipeline import trained_policy_rollouts

POLICY_TRAJECTORIES = tuple(f"{stage}_policy_trajectories" for stage in (*TRAINED_AGENT_STAGES, "dpo"))
"""The trained policies' rollouts on the rollout questions that the evaluation summary shows beside the base
methods (the trained agent's SFT and RL policies, ReasonRAG's DPO policy)."""


def concat(base: str, *others: str) -> Pipeline:
    """``evaluation.concat_trajectories``: ``base`` and the ``others`` trajectory sets into ``all_trajectories``
    (:func:`~prorag.pipelines.rollout.nodes.gather_trajectories`). A set among ``others`` that the run does not
    make is an optional input: its newest version from a completed run, or named in a warning."""
    inputs = {"base": base, **{name: name for name in others}}  # the others: its **artifacts
    return Pipeline([Node(gather_trajectories, inputs, "all_trajectories", name="concat_trajectories")],
                    namespace="evaluation", prefix_datasets_with_namespace=False, tags=[tags.EVALUATION])


def renamed(built: Pipeline, names: dict[str, str]) -> Pipeline:
    """``built`` with datasets renamed (the identity names left out, so the default method's names are kept)."""
    renames = {old: new for old, new in names.items() if old != new}
    if not renames:
        return built
    inputs = {old: new for old, new in renames.items() if old in built.inputs()}
    outputs = {old: new for old, new in renames.items() if old in built.all_outputs()}
    return pipeline(built, inputs=inputs or None, outputs=outputs or None)


class StagePipelines:
    """What a recipe composes: the registered stage pipelines (``pipelines["rl"]``, ``pipelines["index"]``, …) and
    the pieces several recipes share."""

    def __init__(self, pipelines: Mapping[str, Pipeline]) -> None:
        self.pipelines = pipelines
        # evaluated_questions: every question an evaluation answers (rollout ∪ compare questions); every trainer's
        # question selection excludes it, by key and by question text
        self.evaluated = (pipelines["rollout"].only_nodes("rollout.select_rollout_questions")
                          + pipelines["compare"].only_nodes("compare.select_compare_questions")
                          + rollout.evaluated_questions_pipeline())
        # the trained agent (the ``agent`` block) rolled out per trained policy: one modular pipeline per stage
        self.trained_rollouts = {stage: trained_policy_rollouts(stage, tags.TRAINED_AGENT) for stage in ("sft", "rl")}
        self.judged = pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                               inputs={"trajectories": "all_trajectories"})

    def judged_with_earlier_rollouts(self) -> Pipeline:
        """The RL policy's rollouts evaluated and judged beside the newest base and other trained policies' rollouts
        on the same questions (optional inputs: a run that trains only the RL policy keeps the other arms)."""
        others = [name for name in ("trajectories", *POLICY_TRAJECTORIES) if name != "rl_policy_trajectories"]
        return concat("rl_policy_trajectories", *others) + self.judged

    def rl_from_instruct(self, *, evaluate: bool) -> Pipeline:
        """index → GRPO from ``policy.model`` (no SFT stage) → the RL policy evaluated and judged."""
        built = self.pipelines["index"] + self.evaluated + rl.create_pipeline(from_sft=False)
        if evaluate:
            built += self.trained_rollouts["rl"] + self.judged_with_earlier_rollouts()
        return built
