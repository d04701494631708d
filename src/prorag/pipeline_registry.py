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
from prorag.methods import compare_artifacts, stage_owners
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
from prorag.pipelines.rollout.nodes import TRAINED_AGENT_STAGES, run_latest_policy_rollouts
from prorag.recipes import get_recipe
from prorag.recipes.stages import POLICY_TRAJECTORIES, StagePipelines, concat


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
    mapping |= {f"params:{stage}": f"params:methods.{name}.stages.{stage}"
                for stage in get_recipe(method["recipe"]).stages}
    return pipeline(stages, parameters={source: target for source, target in mapping.items() if source in used})


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
    # the stages of a recipe's own loop, run alone, train the first method with that recipe, as the recipe runs
    # them alone (ReasonRAG's explore with and continue its cold start), with that method's parameters
    for stage, owner in stage_owners(methods).items():
        own = get_recipe(methods[owner]["recipe"]).standalone(owner, methods[owner])
        pipelines[stage] = for_method(owner, methods[owner], own.get(stage, pipelines[stage]))
    pipelines["index"] = pipelines["data_preparation"] + pipelines["corpus_indexing"]
    recipes = StagePipelines(pipelines)
    for name, method in methods.items():
        pipelines[f"train_{name}"] = for_method(name, method, get_recipe(method["recipe"]).build(recipes, name, method))
    # train_sft: index → base rollouts → SFT data → SFT → base and SFT evaluated (HiPRAG's agent, no RL)
    pipelines["train_sft"] = (
        pipelines["index"] + pipelines["rollout"] + recipes.evaluated + pipelines["sft_synthesis"] + pipelines["sft"]
        + recipes.trained_rollouts["sft"] + concat("trajectories", "sft_policy_trajectories") + recipes.judged)
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
    pipelines["evaluation"] = concat("trajectories", *POLICY_TRAJECTORIES) + pipeline(
        pipelines["evaluation"], inputs={"trajectories": "all_trajectories"})
    pipelines["judge"] = concat("trajectories", *POLICY_TRAJECTORIES) + pipeline(
        pipelines["reward_judging"], inputs={"trajectories": "all_trajectories"})
    pipelines["evaluate"] = (pipelines["rollout"] + _latest_policy_rollouts()
                             + concat("trajectories", "latest_policy_trajectories", "dpo_policy_trajectories")
                             + stages_evaluated)
    pipelines["train"] = pipelines.get(f"train_{DEFAULT_METHOD}", pipelines["train_sft"])
    pipelines["__default__"] = pipelines["train"]
    return pipelines
