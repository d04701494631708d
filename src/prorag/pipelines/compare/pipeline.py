"""Compare: questions → every arm's rollouts → search judging → optional LLM answer judge → table, tests, report."""

from collections.abc import Sequence

from kedro.pipeline import Node, Pipeline, pipeline

from prorag.pipelines import tags
from prorag.pipelines.compare.nodes import (
    judge_compare_answers,
    report_comparison,
    run_compare_rollouts,
    select_compare_questions,
)


def create_pipeline(judging: Pipeline | None = None, artifacts: Sequence[str] = (), **kwargs: object) -> Pipeline:
    """Needs ``index_questions`` and ``retrieval_index`` (``kedro run --pipelines=index``) and takes each of
    ``artifacts`` — the trained adapters and the knowledge graph, :func:`prorag.methods.compare_artifacts` — as its
    own input, optional: an arm whose adapter has no usable version is skipped with the reason (the run-version
    hook loads it as :class:`~prorag.tracking.missing_inputs.Missing`). OSR/USR come from ``judging`` — the
    reward-judging pipeline, which the pipeline registry passes in — run on the compare trajectories (without it,
    ``compare_judge_metrics`` is an input)."""
    if judging is None:
        return pipeline(_compare_nodes(artifacts), namespace="compare", prefix_datasets_with_namespace=False)
    judged = pipeline(judging, inputs={"trajectories": "compare_trajectories"},
                      outputs={"step_verdicts": "compare_step_verdicts",
                               "trajectory_rewards": "compare_trajectory_rewards",
                               "judge_metrics": "compare_judge_metrics"})
    return pipeline(_compare_nodes(artifacts) + judged, namespace="compare", prefix_datasets_with_namespace=False)


def _compare_nodes(artifacts: Sequence[str]) -> Pipeline:
    # each artifact is passed by name to run_compare_rollouts' **artifacts: the run-version hook reads the inputs a
    # node takes there as optional (prorag.hooks.run_versions.optional_inputs)
    rollout_inputs = {"question_records": "compare_questions", "index": "retrieval_index", "params": "params:compare",
                      "policy": "params:policy", "methods": "params:methods", "kg": "params:kg_extraction",
                      **{name: name for name in artifacts}}
    return Pipeline([
        Node(select_compare_questions, ["index_questions", "params:compare"], "compare_questions",
             name="select_compare_questions", tags=[tags.DATA]),
        Node(run_compare_rollouts, rollout_inputs, ["compare_trajectories", "compare_arms"],
             name="run_compare_rollouts", tags=[tags.ROLLOUT]),
        Node(judge_compare_answers, ["compare_trajectories", "params:compare"], "compare_answer_verdicts",
             name="judge_compare_answers", tags=[tags.EVALUATION]),
        Node(report_comparison,
             ["compare_trajectories", "compare_arms", "compare_judge_metrics", "compare_answer_verdicts",
              "params:compare"],
             ["comparison_table", "comparison_tests", "comparison_report", "comparison_accuracy_plot",
              "comparison_efficiency_plot", "comparison_search_plot", "comparison_metrics"],
             name="report_comparison", tags=[tags.EVALUATION]),
    ])
