"""Project pipelines.

Registered explicitly rather than with ``find_pipelines``: Kedro 1.7 imports only the packages named on the
command line, and composed pipelines such as ``train`` have no package of their own.

Training pipelines are built from the ``methods`` map (conf/base/parameters_methods.yml, plus conf/local): one
``train_<method>`` per entry, composed by its ``recipe`` with the method's parameters mapped in
(``params:agent`` -> ``params:methods.<method>.agent``, ``params:rl`` -> ``params:methods.<method>.stages.rl``, …).
``train`` (the default) is ``train_hiprag``.

Each stage is a modular pipeline in its own namespace (``data_preparation``, ``corpus_indexing``, ``rollout``,
``sft``, ``rl``, …; a trained policy's rollouts share its trainer's namespace, the concatenation of trajectories
is in ``evaluation``), with datasets not prefixed: node names are ``<stage>.<node>`` (``kedro run --nodes
rl.train_rl``, ``--namespaces rl``) and kedro-viz collapses each stage. Nodes carry the tags of
:mod:`prorag.pipelines.tags` (``kedro run --tags evaluation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kedro.pipeline import Node, Pipeline, pipeline

from prorag.config_loader import configured_methods
from prorag.methods import RECIPE_STAGES, compare_artifacts
from prorag.pipelines import (
    compare,
    corpus_indexing,
    data_preparation,
    dpo,
    evaluation,
    kg_extraction,
    reasonrag_data,
    reward_judging,
    rl,
    rollout,
    sft,
    sft_synthesis,
    tags,
    tearag,
)
from prorag.pipelines.rollout.nodes import TRAINED_AGENT_STAGES, gather_trajectories, run_latest_policy_rollouts
from prorag.pipelines.rollout.pipeline import trained_policy_rollouts


def _concat(base: str, *others: str) -> Pipeline:
    """``evaluation.concat_trajectories``: ``base`` and the ``others`` trajectory sets into ``all_trajectories``
    (:func:`~prorag.pipelines.rollout.nodes.gather_trajectories`). A set among ``others`` that the run does not
    make is an optional input: its newest version from a completed run, or named in a warning."""
    inputs = {"base": base, **{name: name for name in others}}  # the others: its **artifacts
    return Pipeline([Node(gather_trajectories, inputs, "all_trajectories", name="concat_trajectories")],
                    namespace="evaluation", prefix_datasets_with_namespace=False, tags=[tags.EVALUATION])


POLICY_TRAJECTORIES = tuple(f"{stage}_policy_trajectories" for stage in (*TRAINED_AGENT_STAGES, "dpo"))
"""The trained policies' rollouts on the rollout questions that the evaluation summary shows beside the base
methods (the trained agent's SFT and RL policies, ReasonRAG's DPO policy)."""


def _latest_policy_rollouts() -> Pipeline:
    """``rollout.run_latest_policy_rollouts``: the trained agent with each stage's newest adapter (optional inputs)
    on the rollout questions → ``latest_policy_trajectories``."""
    inputs = {"question_records": "rollout_questions", "index": "retrieval_index", "params": "params:rollout",
              "policy": "params:policy", "agent": "params:agent",
              **{f"{stage}_adapter": f"{stage}_adapter" for stage in TRAINED_AGENT_STAGES}}
    return Pipeline([Node(run_latest_policy_rollouts, inputs, "latest_policy_trajectories",
                          name="run_latest_policy_rollouts")],
                    namespace="rollout", prefix_datasets_with_namespace=False,
                    tags=[tags.ROLLOUT, *tags.TRAINED_AGENT])


DEFAULT_METHOD = "hiprag"
"""The method ``train`` (the default pipeline) trains."""


def for_method(name: str, method: Mapping[str, Any], stages: Pipeline) -> Pipeline:
    """``stages`` reading method ``name``'s parameters: its agent, reward, retriever and value and its recipe's stage
    blocks (only the ``params:`` inputs the pipeline has are mapped)."""
    used = {dataset for dataset in stages.inputs() if dataset.startswith("params:")}
    mapping = {f"params:{block}": f"params:methods.{name}.{block}"
               for block in ("agent", "reward", "retriever", "value")}
    mapping |= {f"params:{stage}": f"params:methods.{name}.stages.{stage}" for stage in RECIPE_STAGES[method["recipe"]]}
    return pipeline(stages, parameters={source: target for source, target in mapping.items() if source in used})


def cold_start_adapter(name: str, method: Mapping[str, Any]) -> str | None:
    """The dataset of method ``name``'s cold-start SFT adapter (recipe ``sft_mcts_dpo``: the MCTS explores with it
    and DPO continues it), None for a recipe without one."""
    return f"{name}_sft_adapter" if method["recipe"] == "sft_mcts_dpo" else None


def register_pipelines() -> dict[str, Pipeline]:
    """Every pipeline package, ``train_<method>`` per ``methods`` entry, plus ``index``, ``evaluate``,
    ``train_sft``, ``train_rl``, ``train_rl_instruct`` and ``train`` (the end-to-end job, the default)."""
    methods = configured_methods()
    pipelines = {
        "data_preparation": data_preparation.create_pipeline(),
        "corpus_indexing": corpus_indexing.create_pipeline(),
        "rollout": rollout.create_pipeline(),
        "evaluation": evaluation.create_pipeline(),
        "reward_judging": reward_judging.create_pipeline(),
        "sft_synthesis": sft_synthesis.create_pipeline(),
        "sft": sft.create_pipeline(),
        "rl": rl.create_pipeline(),
        "kg_extraction": kg_extraction.create_pipeline(),
        "reasonrag_data": reasonrag_data.create_pipeline(),
        "dpo": dpo.create_pipeline(),
        "tearag": tearag.create_pipeline(),
        # compare: every arm (baselines, base agent, each trained method's latest adapter — each adapter of the methods
        # map its own input) on the same dev questions
        # of every dataset → comparison.csv / .md, paired tests, plots (run after the training pipelines you want)
        "compare": compare.create_pipeline(judging=reward_judging.create_pipeline(),
                                           artifacts=compare_artifacts(methods)),
    }
    # the stage pipelines of a method with its own agent read that method's parameters when run alone, and
    # ReasonRAG's explore with and continue its recipe's cold start (sft_mcts_dpo: the <name>_sft_adapter that
    # train_<name> saves; the base SmolLM2 alone finds no pair, so dpo would have nothing to train on)
    if "reasonrag" in methods and (cold := cold_start_adapter("reasonrag", methods["reasonrag"])) is not None:
        pipelines["reasonrag_data"] = reasonrag_data.create_pipeline(explorer_adapter=cold)
        pipelines["dpo"] = dpo.create_pipeline(init_adapter=cold)
    for stage, owner in (("reasonrag_data", "reasonrag"), ("dpo", "reasonrag"), ("tearag", "tearag")):
        if owner in methods:
            pipelines[stage] = for_method(owner, methods[owner], pipelines[stage])
    pipelines["index"] = pipelines["data_preparation"] + pipelines["corpus_indexing"]
    recipes = _Recipes(pipelines)
    for name, method in methods.items():
        pipelines[f"train_{name}"] = for_method(name, method, recipes.build(name, method))
    # train_sft: index → base rollouts → SFT data → SFT → base and SFT evaluated (HiPRAG's agent, no RL)
    pipelines["train_sft"] = (
        pipelines["index"] + pipelines["rollout"] + recipes.evaluated + pipelines["sft_synthesis"] + pipelines["sft"]
        + recipes.trained_rollouts["sft"] + _concat("trajectories", "sft_policy_trajectories") + recipes.judged)
    # train_rl: GRPO from the latest SFT adapter, then the RL policy evaluated and judged (reward experiments)
    pipelines["train_rl"] = (
        recipes.evaluated + pipelines["rl"] + recipes.trained_rollouts["rl"] + recipes.judged_with_earlier_rollouts())
    # train_rl_instruct: GRPO from the instruct model with no SFT stage (rl.init: instruct; HiPRAG at paper scale)
    pipelines["train_rl_instruct"] = recipes.rl_from_instruct(evaluate=True)
    # rollout_kag: the rollout with the knowledge graph attached to the index (rollout.retriever.kind: kag / kag_concat)
    pipelines["rollout_kag"] = kg_extraction.attach_pipeline() + pipeline(
        pipelines["rollout"], inputs={"retrieval_index": "kag_retrieval_index"})
    # run alone, evaluation and judging read the latest trained policies' rollouts beside the base ones, and evaluate
    # rolls out the newest adapters too: a re-evaluation never drops a trained policy from the summary silently
    # (the stage pipelines stay as the recipes compose them; reward_judging is the bare stage compare reuses)
    stages_evaluated = pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                                inputs={"trajectories": "all_trajectories"})
    pipelines["evaluation"] = _concat("trajectories", *POLICY_TRAJECTORIES) + pipeline(
        pipelines["evaluation"], inputs={"trajectories": "all_trajectories"})
    pipelines["judge"] = _concat("trajectories", *POLICY_TRAJECTORIES) + pipeline(
        pipelines["reward_judging"], inputs={"trajectories": "all_trajectories"})
    pipelines["evaluate"] = (pipelines["rollout"] + _latest_policy_rollouts()
                             + _concat("trajectories", "latest_policy_trajectories", "dpo_policy_trajectories")
                             + stages_evaluated)
    pipelines["train"] = pipelines.get(f"train_{DEFAULT_METHOD}", pipelines["train_sft"])
    pipelines["__default__"] = pipelines["train"]
    return pipelines


class _Recipes:
    """The stage compositions a method's ``recipe`` names (:data:`prorag.methods.RECIPE_STAGES`)."""

    def __init__(self, pipelines: dict[str, Pipeline]) -> None:
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

    def build(self, name: str, method: Mapping[str, Any]) -> Pipeline:
        recipe, adapter = method["recipe"], method["adapter"]
        if recipe == "sft_rl":
            # index → base rollouts → SFT data → LoRA SFT → GRPO → base, SFT and RL policies evaluated side by side
            built = (self.pipelines["index"] + self.pipelines["rollout"] + self.evaluated
                     + self.pipelines["sft_synthesis"] + self.pipelines["sft"] + self.pipelines["rl"]
                     + self.trained_rollouts["sft"] + self.trained_rollouts["rl"]
                     + _concat("trajectories", "sft_policy_trajectories", "rl_policy_trajectories") + self.judged)
            return _renamed(built, {"rl_adapter": adapter, "rl_training_log": f"{name}_training_log"})
        if recipe == "rl_from_sft":
            # GRPO continuing the latest SFT adapter → <adapter>, evaluated by `compare`
            return self.evaluated + pipeline(
                self.pipelines["rl"], namespace=name, prefix_datasets_with_namespace=False,
                outputs={"rl_adapter": adapter, "rl_training_log": f"{name}_training_log"})
        if recipe == "rl_from_instruct":
            return _renamed(self.rl_from_instruct(evaluate=True),
                            {"rl_adapter": adapter, "rl_training_log": f"{name}_training_log"})
        if recipe in ("mcts_dpo", "sft_mcts_dpo"):
            # ReasonRAG §2: index → MCTS trees → step-level pairs → DPO → the DPO policy rolled out with the method's
            # agent beside the base methods on the same dev questions → evaluation and judging. sft_mcts_dpo first
            # trains a cold start in the method's protocol (gold trajectories → LoRA SFT): it explores the trees and
            # DPO continues it (the paper explores with GPT-4o; a 135M policy alone never answers right)
            cold = cold_start_adapter(name, method)
            built = (self.pipelines["index"] + self.pipelines["rollout"] + self.evaluated
                     + reasonrag_data.create_pipeline(explorer_adapter=cold) + dpo.create_pipeline(init_adapter=cold)
                     + trained_policy_rollouts("dpo", [tags.REASONRAG])
                     + _concat("trajectories", "dpo_policy_trajectories") + self.judged)
            if cold is not None:
                renamed = {output: f"{name}_{output}" for output in (
                    "sft_trajectories", "sft_synthesis_metrics", "sft_adapter", "sft_metrics")}
                built += pipeline(self.pipelines["sft_synthesis"] + self.pipelines["sft"], outputs=renamed)
            return _renamed(built, {"dpo_adapter": adapter})
        if recipe == "tearag":
            # TeaRAG §4.3: index → KG → SFT data → SFT → IP-DPO rounds → TeaRAG rollouts → evaluation, judging
            outputs = {name: f"tearag_{name}" for name in (
                "evaluation_table", "evaluation_metrics", "evaluation_summary", "step_verdicts", "trajectory_rewards",
                "judge_metrics")}
            built = (self.pipelines["index"] + self.pipelines["kg_extraction"] + self.evaluated
                     + tearag.create_pipeline()
                     + pipeline(self.pipelines["evaluation"] + self.pipelines["reward_judging"],
                                inputs={"trajectories": "tearag_trajectories"}, outputs=outputs))
            return _renamed(built, {"tearag_adapter": adapter})
        raise ValueError(f"methods.{name}.recipe: unknown recipe {recipe!r}")

    def judged_with_earlier_rollouts(self) -> Pipeline:
        """The RL policy's rollouts evaluated and judged beside the newest base and other trained policies' rollouts
        on the same questions (optional inputs: a run that trains only the RL policy keeps the other arms)."""
        others = [name for name in ("trajectories", *POLICY_TRAJECTORIES) if name != "rl_policy_trajectories"]
        return _concat("rl_policy_trajectories", *others) + self.judged

    def rl_from_instruct(self, *, evaluate: bool) -> Pipeline:
        """index → GRPO from ``policy.model`` (no SFT stage) → the RL policy evaluated and judged."""
        built = self.pipelines["index"] + self.evaluated + rl.create_pipeline(from_sft=False)
        if evaluate:
            built += self.trained_rollouts["rl"] + self.judged_with_earlier_rollouts()
        return built


def _renamed(built: Pipeline, names: dict[str, str]) -> Pipeline:
    """``built`` with datasets renamed (the identity names left out, so the default method's names are kept)."""
    renames = {old: new for old, new in names.items() if old != new}
    if not renames:
        return built
    inputs = {old: new for old, new in renames.items() if old in built.inputs()}
    outputs = {old: new for old, new in renames.items() if old in built.all_outputs()}
    return pipeline(built, inputs=inputs or None, outputs=outputs or None)
