"""Project pipelines.

Registered explicitly rather than with ``find_pipelines``: Kedro 1.7 imports only the packages named on the
command line, and composed pipelines such as ``train`` have no package of their own.

Each stage is a modular pipeline in its own namespace (``data_preparation``, ``corpus_indexing``, ``rollout``,
``sft``, ``rl``, …; a trained policy's rollouts share its trainer's namespace, the concatenation of trajectories
is in ``evaluation``), with datasets not prefixed: node names are ``<stage>.<node>`` (``kedro run --nodes
rl.train_rl``, ``--namespaces rl``) and kedro-viz collapses each stage. Nodes carry the tags of
:mod:`prorag.pipelines.tags` (``kedro run --tags evaluation``).
"""

from __future__ import annotations

from kedro.pipeline import Node, Pipeline, pipeline

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
from prorag.pipelines.rollout.nodes import concat_trajectories
from prorag.pipelines.rollout.pipeline import trained_policy_rollouts


def _concat(*trajectories: str) -> Pipeline:
    """``evaluation.concat_trajectories``: the named trajectory datasets into ``all_trajectories``."""
    return Pipeline([Node(concat_trajectories, list(trajectories), "all_trajectories", name="concat_trajectories")],
                    namespace="evaluation", prefix_datasets_with_namespace=False, tags=[tags.EVALUATION])


def register_pipelines() -> dict[str, Pipeline]:
    """Every pipeline package, plus ``index``, ``evaluate``, ``train_sft`` and ``train`` (the end-to-end job, the
    default)."""
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
        # compare: every arm (baselines, base agent, each trained method's latest adapter) on the same dev questions
        # of every dataset → comparison.csv / .md, paired tests, plots (run after the training pipelines you want)
        "compare": compare.create_pipeline(judging=reward_judging.create_pipeline()),
    }
    pipelines["judge"] = pipelines["reward_judging"]
    pipelines["index"] = pipelines["data_preparation"] + pipelines["corpus_indexing"]
    # evaluate: roll out every configured method on the indexed questions, summarize, judge OSR/USR and rewards
    pipelines["evaluate"] = pipelines["rollout"] + pipelines["evaluation"] + pipelines["reward_judging"]
    # evaluated_questions: every question an evaluation answers (rollout ∪ compare questions); every trainer's
    # question selection excludes it, by key and by question text
    evaluated = (pipelines["rollout"].only_nodes("rollout.select_rollout_questions")
                 + pipelines["compare"].only_nodes("compare.select_compare_questions")
                 + rollout.evaluated_questions_pipeline())
    # the trained agent (the ``agent`` block) rolled out per trained policy: one modular pipeline per stage
    trained_rollouts = {stage: trained_policy_rollouts(stage, tags.TRAINED_AGENT) for stage in ("sft", "rl")}
    judged = pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                      inputs={"trajectories": "all_trajectories"})
    # train: index → base rollouts → SFT data → LoRA SFT → GRPO → base, SFT and RL policies evaluated side by side
    pipelines["train"] = (
        pipelines["index"] + pipelines["rollout"] + evaluated + pipelines["sft_synthesis"] + pipelines["sft"]
        + pipelines["rl"] + trained_rollouts["sft"] + trained_rollouts["rl"]
        + _concat("trajectories", "sft_policy_trajectories", "rl_policy_trajectories")
        + judged)
    # train_sft: the same without RL (index → base rollouts → SFT data → SFT → base and SFT evaluated)
    pipelines["train_sft"] = (
        pipelines["index"] + pipelines["rollout"] + evaluated + pipelines["sft_synthesis"] + pipelines["sft"]
        + trained_rollouts["sft"]
        + _concat("trajectories", "sft_policy_trajectories")
        + judged)
    # train_rl: GRPO from the latest SFT adapter, then the RL policy evaluated and judged (reward experiments)
    pipelines["train_rl"] = (
        evaluated + pipelines["rl"] + trained_rollouts["rl"]
        + pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                   inputs={"trajectories": "rl_policy_trajectories"}))
    # train_rl_instruct: GRPO from the instruct model with no SFT stage (rl.init: instruct; the multi-stage preset and
    # HiPRAG at paper scale), then the RL policy evaluated and judged
    pipelines["train_rl_instruct"] = (
        pipelines["index"] + evaluated + rl.create_pipeline(from_sft=False) + trained_rollouts["rl"]
        + pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                   inputs={"trajectories": "rl_policy_trajectories"}))
    # train_search_r1: the same GRPO run with the Search-R1 reward (λp = 0) → search_r1_adapter, for `compare`
    pipelines["train_search_r1"] = (
        evaluated
        + pipeline(pipelines["rl"], namespace="search_r1", prefix_datasets_with_namespace=False,
                   parameters={"params:reward": "params:search_r1_reward"},
                   outputs={"rl_adapter": "search_r1_adapter", "rl_training_log": "search_r1_training_log"}))
    # train_tearag (TeaRAG §4.3): index → KG → SFT data → SFT → IP-DPO rounds → TeaRAG rollouts → evaluation, judging
    pipelines["tearag"] = tearag.create_pipeline()
    tearag_outputs = {name: f"tearag_{name}" for name in ("evaluation_table", "evaluation_metrics", "step_verdicts",
                                                           "trajectory_rewards", "judge_metrics")}
    pipelines["train_tearag"] = (
        pipelines["index"] + pipelines["kg_extraction"]
        + evaluated + pipelines["tearag"]
        + pipeline(pipelines["evaluation"] + pipelines["reward_judging"],
                   inputs={"trajectories": "tearag_trajectories"}, outputs=tearag_outputs))
    # rollout_kag: the rollout with the knowledge graph attached to the index (rollout.retriever.kind: kag / kag_concat)
    pipelines["rollout_kag"] = kg_extraction.attach_pipeline() + pipeline(
        pipelines["rollout"], inputs={"retrieval_index": "kag_retrieval_index"})
    # train_reasonrag (ReasonRAG §2): index → MCTS trees → step-level pairs → DPO → the DPO policy rolled out as the
    # ReasonRAG agent (reasonrag_agent) beside the base methods on the same dev questions → evaluation and judging
    pipelines["train_reasonrag"] = (
        pipelines["index"] + pipelines["rollout"] + evaluated + pipelines["reasonrag_data"] + pipelines["dpo"]
        + pipeline(trained_policy_rollouts("dpo", [tags.REASONRAG]),
                   parameters={"params:agent": "params:reasonrag_agent"})
        + _concat("trajectories", "dpo_policy_trajectories")
        + judged)
    pipelines["__default__"] = pipelines["train"]
    return pipelines
