"""HiPRAG's process reward (λp = 0.4) vs the Search-R1 outcome + format baseline (λp = 0), same seeds and budget.

Each arm × seed is one ``kedro run --pipelines=train_rl`` (GRPO from the latest SFT adapter, then the RL policy
rolled out greedily on the evaluation questions and judged), tracked in MLflow as usual. An arm overrides the
shared ``reward`` block, which RL trains with *and* reward judging evaluates with. Every run sets
``rl.judge_for_metrics``, so the Search-R1 arm detects over-/under-search too and logs ``agent/bonus_fired`` (MLflow
``rl.agent/bonus_fired``): the share of its rollouts where HiPRAG's bonus *would* have fired (A·F·N_corr > 0).

Per run the script reads the session's own versions of ``rl_policy_trajectories`` (per-question CEM, retrievals),
``step_verdicts`` (OSR, USR, search ratio) and ``rl_training_log`` (reward and bonus curves), and caches them in
``data/08_reporting/<name>_runs/<arm>_seed<seed>.json``: re-running the same command skips the runs whose cached
settings match (``--rerun`` forces them), and an interrupted GRPO run resumes from its last checkpoint
(``--save-steps``). The report (:mod:`prorag.reporting.reward_comparison`): per arm pooled over seeds and per seed,
CEM / retrievals / OSR / USR / search ratio with 95% bootstrap intervals over questions, the share of training
rollouts whose bonus fired, the paired HiPRAG − Search-R1 Δ with its interval, p-value and the questions a
significant difference would need, wall time per run — printed, and written to ``data/08_reporting/<name>.csv``
(``_tests.csv``), ``.md`` and ``_curves.png`` (reward and bonus_fired per step, one line per arm × seed).

Run ``kedro run --pipelines=train_sft`` (or ``train``; ``--env cpu_long`` for the longer SFT) first, so an SFT
adapter and an index exist. A quick smoke run::

    python experiments/rl_reward_comparison.py --steps 3 --batch 8 --micro-batch 4 --questions-per-source 4

Preset ``--preset cpu_2h`` (issue 18, item 4: ≤ 2 h per arm on this 2-core CPU, 2 seeds per arm)::

    python experiments/rl_reward_comparison.py --preset cpu_2h

* RL questions from popqa and hotpotqa (the first 100 of each that are not evaluated): the sources the SFT policy
  is expected to answer *sometimes* — the bonus can only fire on a correct, well-formed rollout, so RL questions it
  never answers would leave both arms with the same outcome + format signal.
* 16 GRPO steps × 4 completions (1 question × 4 generations: 64 training rollouts per run), seeds 0 and 1; learning
  rate, temperature and the rest from ``parameters_rl.yml``. Sizing (estimates, not measurements of this preset):
  a GRPO step with 4 completions takes ≈ 80–180 s here (``benchmarks/rollout.py --grpo``: 77.8 s; ``make train``:
  143 s for its 2 steps; the README's older table says 2.5–4 min), so 16 steps take ≈ 21–48 min; the RL policy's
  rollouts and judging on 30 questions took 111 s + 6 s in ``make train``. That is ≲ 1 h per run, so an arm's two
  seeds fit in 2 h (the experiment ≲ 4 h). At 4 min per step use ``--steps 12``; if 2 h is meant per run, ``--steps
  32`` stays under ≈ 1.7 h at 180 s per step.
* 30 evaluation questions (10 each of hotpotqa, musique, popqa: ``rollout.questions``), the same in every run.
* ``--probe 4 8`` trains nothing: it samples groups from the SFT policy on ``--probe-questions`` RL questions as
  GRPO's first step would (temperature, judges and reward from the config) and reports, per group size, CEM, how
  often the bonus fires, how many groups are uniform (no gradient), how many the process term changes (``groups
  shaped``) and, of those, the *ratio-shaped* ones (two correct, well-formed rollouts whose N_corr/N differ: the
  only groups in which HiPRAG ranks correct rollouts by their share of optimal steps) apart from the ones it merely
  re-weights (correct vs wrong vs malformed, no search information), with the mean advantage gap between correct
  rollouts that did not search and correct ones that did, with λp = 0.4 and with λp = 0. Run it first and go on
  only when ratio-shaped groups reach 25% at the group size you train with: ``groups shaped`` alone passes on
  re-weighting and says nothing about search (issue 44).
* The goal to verify, not a measured figure: the bonus fires in ≥ 10% of training rollouts (the report says whether
  it did). If it does not, the SFT policy is too weak on these questions: train SFT longer first (``kedro run --env
  cpu_long --pipelines=train_sft``), or raise ``--generations`` so that a group holds a correct rollout more often.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from rich.console import Console
from rich.table import Table

from prorag.reporting.reward_comparison import (
    POOLED,
    RunResult,
    comparison_rows,
    curves_figure,
    paired_differences,
    question_table,
    render_report,
    training_curve,
)

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"hiprag": {"reward.kind": "hiprag", "reward.lambda_p": 0.4},
        "search_r1": {"reward.kind": "hiprag", "reward.lambda_p": 0.0}}
"""Search-R1 is HiPRAG's eq. 1 with λp = 0 (the ``search_r1`` reward kind is the same formula); both arms keep
the ``hiprag`` kind so that they share every detection setting of the ``reward`` block."""
PRESETS: dict[str, dict[str, Any]] = {
    "cpu_2h": {"steps": 16, "batch": 4, "micro_batch": 4, "generations": 4, "seeds": [0, 1],
               "sources": ["popqa", "hotpotqa"], "rl_questions_per_source": 100, "questions_per_source": 10},
    # issue 31, item 3: groups of 8, 4 questions per step, PopQA's popular subjects, an LLM judge on loopback
    # (conf/hiprag_vs_search_r1; start `prorag serve ... --served-model-name judge --port 8011` first)
    "separable": {"steps": 50, "batch": 32, "micro_batch": 8, "generations": 8, "seeds": [0, 1],
                  "sources": ["popqa"], "rl_questions_per_source": 200, "questions_per_source": 10,
                  "env": "hiprag_vs_search_r1", "probe_questions": 16, "save_steps": 10},
}
logger = logging.getLogger("rl_reward_comparison")


def nested(overrides: dict[str, object]) -> dict[str, object]:
    """``{"a.b": 1}`` → ``{"a": {"b": 1}}``: the runtime-params shape ``kedro run --params`` builds."""
    tree: dict[str, object] = {}
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})  # type: ignore[assignment]
        node[leaf] = value  # type: ignore[index]
    return tree


def mlflow_run(session_id: str) -> tuple[str, float | None]:
    """The kedro run's parent MLflow run id and its logged ``reward.lambda_p`` (``""``, None without tracking)."""
    runs = [run for run in mlflow.search_runs(search_all_experiments=True, output_format="list",
                                              filter_string=f"tags.`kedro.session_id` = '{session_id}'")
            if run.data.tags.get("prorag.kind") == "pipeline"]
    if not runs:
        logger.warning("no MLflow run tagged with session %s (tracking off?)", session_id)
        return "", None
    logged = runs[0].data.params.get("reward.lambda_p")
    return runs[0].info.run_id, float(logged) if logged is not None else None


def run_arm(arm: str, seed: int, overrides: dict[str, object], env: str | None) -> RunResult:
    """One train_rl run; its per-question evaluation, step verdicts and training curve from the session's own
    dataset versions."""
    started = time.perf_counter()
    with KedroSession.create(project_path=ROOT, env=env, runtime_params=nested(overrides)) as session:
        session_id = session.session_id
        session.run(pipeline_names=["train_rl"])
        seconds = time.perf_counter() - started
        catalog = session.load_context().catalog
        trajectories = catalog.load("rl_policy_trajectories", version=session_id)
        verdicts = catalog.load("step_verdicts", version=session_id)
        log = catalog.load("rl_training_log", version=session_id)
    run_id, logged_lambda_p = mlflow_run(session_id)
    lambda_p = logged_lambda_p if logged_lambda_p is not None else float(str(overrides["reward.lambda_p"]))
    questions = question_table(trajectories, verdicts)
    return RunResult(arm=arm, seed=seed, questions=questions, curve=training_curve(log), seconds=seconds,
                     lambda_p=lambda_p, run_id=run_id, extras={"session_id": session_id})


def cached_run(path: Path, arm: str, seed: int, overrides: dict[str, object], env: str | None,
               rerun: bool) -> RunResult:
    """The run's cached result when its settings match, else a fresh run (cached afterwards)."""
    settings = json.loads(json.dumps({"overrides": overrides, "env": env}))
    if path.is_file() and not rerun:
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("settings") == settings:
            logger.info("%s seed %d: reusing %s", arm, seed, path)
            return RunResult.from_dict(cached["result"])
        logger.info("%s seed %d: %s has other settings, running again", arm, seed, path)
    result = run_arm(arm, seed, overrides, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "result": result.to_dict()}, indent=1), encoding="utf-8")
    return result


def print_table(title: str, rows: Any, tests: Any) -> None:
    """The comparison as a rich table, then the paired differences."""
    def cell(row: dict[str, Any], metric: str, scale: float = 1.0) -> str:
        value, low, high = row[metric], row[f"{metric}_low"], row[f"{metric}_high"]
        if math.isnan(value):
            return "–"
        return f"{scale * value:.3g}" if math.isnan(low) else \
            f"{scale * value:.3g} [{scale * low:.3g}, {scale * high:.3g}]"

    table = Table(title=title)
    for column in ("arm", "seed", "λp", "n", "CEM", "retrievals", "OSR %", "USR %", "search %", "bonus fired %",
                   "groups shaped %", "reward first→last", "min"):
        table.add_column(column)
    for row in rows.to_dict("records"):
        table.add_row(row["arm"], row["seed"], f"{row['lambda_p']:.2f}", str(int(row["n_questions"])),
                      cell(row, "cem"), cell(row, "retrievals"), cell(row, "osr", 100), cell(row, "usr", 100),
                      cell(row, "search_ratio", 100), f"{100 * row['bonus_fired']:.1f}",
                      "–" if math.isnan(row["process_shaped"]) else f"{100 * row['process_shaped']:.1f}",
                      f"{row['train_reward_first']:.3f}→{row['train_reward_last']:.3f}", f"{row['seconds'] / 60:.1f}",
                      style="bold" if row["seed"] == POOLED else None)
    console = Console(width=max(Console().width, 200))  # a pipe gets 80 columns: too narrow for the intervals
    console.print(table)
    for test in tests.to_dict("records"):
        console.print(f"Δ {test['metric']} ({test['arm_a']} − {test['arm_b']}): {test['difference']:+.3f} "
                      f"[{test['low']:+.3f}, {test['high']:+.3f}] on {test['n']} questions, p = {test['p_value']:.3g}, "
                      f"questions for 80% power: {test['questions_needed'] if test['questions_needed'] >= 0 else '–'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a ``--preset`` fills the defaults, explicit flags override them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="named settings (see above); flags override them")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="completions per step (questions x generations)")
    parser.add_argument("--micro-batch", type=int, default=4, help="completions per forward/backward pass")
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--questions-per-source", type=int, default=4,
                        help="evaluation questions per rollout.questions source")
    parser.add_argument("--rl-questions-per-source", type=int, default=None,
                        help="RL training questions per source (default: parameters_rl.yml's, all)")
    parser.add_argument("--seed", type=int, default=0, help="one seed (ignored when --seeds is given)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="every arm runs once per seed")
    parser.add_argument("--sources", nargs="+", default=None,
                        help="RL question sources (default: parameters_rl.yml's); evaluated questions stay excluded")
    parser.add_argument("--learning-rate", type=float, default=None, help="default: parameters_rl.yml's")
    parser.add_argument("--save-steps", type=int, default=4, help="GRPO checkpoint interval (resume point)")
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    parser.add_argument("--env", default=None, help="Kedro config env (as kedro run --env)")
    parser.add_argument("--rerun", action="store_true", help="run again even where a cached result matches")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--name", default="rl_reward_comparison", help="report file stem in data/08_reporting")
    parser.add_argument("--probe", type=int, nargs="+", metavar="G", default=None,
                        help="no training: sample groups of each size G from the SFT policy on --probe-questions RL "
                             "questions and report how often the bonus fires and changes the GRPO advantages")
    parser.add_argument("--probe-questions", type=int, default=16)
    preset = parser.parse_known_args(argv)[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    args = parser.parse_args(argv)
    if args.batch % args.micro_batch:
        parser.error("--batch must be a multiple of --micro-batch")
    if args.batch % args.generations:
        parser.error("--batch must be a multiple of --generations (whole groups per step)")
    if args.seeds is None:
        args.seeds = [args.seed]
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, int, dict[str, object]]]:
    """``(arm, seed, runtime parameters)`` of every run, seed by seed (both arms of a seed before the next)."""
    runs = []
    for seed in args.seeds:
        shared: dict[str, object] = {
            "rl.trainer.max_steps": args.steps, "rl.trainer.per_device_train_batch_size": args.micro_batch,
            "rl.trainer.gradient_accumulation_steps": args.batch // args.micro_batch,
            "rl.trainer.num_generations": args.generations, "rl.trainer.seed": seed,
            "rl.trainer.save_steps": max(1, min(args.save_steps, args.steps)), "rl.judge_for_metrics": True,
            "rollout.questions.max_per_source": args.questions_per_source, "rollout.seed": seed}
        if args.sources:
            shared["rl.questions.sources"] = args.sources
        if args.rl_questions_per_source is not None:
            shared["rl.questions.max_per_source"] = args.rl_questions_per_source
        if args.learning_rate is not None:
            shared["rl.trainer.learning_rate"] = args.learning_rate
        runs.extend((arm, seed, {**shared, **ARMS[arm]}) for arm in args.arms)
    return runs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
    bootstrap_project(ROOT)
    out = ROOT / "data" / "08_reporting" / args.name
    if args.probe:
        probe(args, plan(args)[0][2], out.parent / f"{args.name}_probe")
        return
    runs = [cached_run(out.parent / f"{args.name}_runs" / f"{arm}_seed{seed}.json", arm, seed, overrides, args.env,
                       args.rerun) for arm, seed, overrides in plan(args)]
    report(runs, args, out)


def probe(args: argparse.Namespace, overrides: dict[str, object], out: Path) -> None:
    """``--probe``: what GRPO's first step would see with each group size (:func:`prorag.training.probe.probe_groups`),
    on ``--probe-questions`` RL questions drawn with the first seed; printed and written to ``<out>.csv``."""
    from prorag.assembly import build_policy, build_retriever, build_scorer
    from prorag.data import Question
    from prorag.pipelines.rl.nodes import select_rl_questions
    from prorag.pipelines.rl.params import RLParams
    from prorag.rewards.base import RewardSettings
    from prorag.specs import PolicySpec, TrainedAgentSpec
    from prorag.training.probe import probe_groups

    with KedroSession.create(project_path=ROOT, env=args.env, runtime_params=nested(overrides)) as session:
        context = session.load_context()
        params, catalog = context.params, context.catalog
        rl = RLParams.model_validate(params["rl"])
        policy, agent = PolicySpec.model_validate(params["policy"]), TrainedAgentSpec.model_validate(params["agent"])
        reward = RewardSettings.model_validate(params["reward"])
        records = select_rl_questions(catalog.load("index_questions"), catalog.load("evaluated_questions"), rl)
        index, adapter = catalog.load("retrieval_index"), catalog.load("sft_adapter")
    questions = [Question.from_dict(record) for record in records]
    questions = random.Random(args.seeds[0]).sample(questions, min(args.probe_questions, len(questions)))
    generator = build_policy(policy.with_trained(str(adapter)))
    scorer = build_scorer(reward, index, judge_for_metrics=True, questions=questions)
    started = time.perf_counter()
    rows = pd.DataFrame(probe_groups(
        questions, generator, build_retriever(rl.retriever, index), scorer, agent, group_sizes=args.probe,
        top_k=rl.retriever.top_k, temperature=rl.trainer.temperature, top_p=rl.trainer.top_p, seed=args.seeds[0],
        scale_rewards=rl.trainer.scale_rewards))
    table = Table(title=f"Probe: {len(questions)} RL questions from {', '.join(args.sources or ['config'])}, "
                        f"T = {rl.trainer.temperature}, {time.perf_counter() - started:.0f} s")
    def share(value: float) -> str:
        return "–" if math.isnan(value) else f"{100 * value:.1f}"

    for column in ("group size", "rollouts", "CEM", "correct w/o search %", "bonus fired %", "uniform groups %",
                   "groups shaped %", "ratio-shaped %", "re-weighted only %", "gap λp=0.4", "gap λp=0"):
        table.add_column(column)
    for row in rows.to_dict("records"):
        table.add_row(str(int(row["group_size"])), str(int(row["rollouts"])), f"{row['cem']:.3f}",
                      share(row["no_search_correct"]), share(row["bonus_fired"]), share(row["uniform_groups"]),
                      share(row["process_shaped"]), share(row["ratio_shaped"]), share(row["reweighted"]),
                      f"{row['gap_with']:+.3f}", f"{row['gap_without']:+.3f}")
    Console(width=max(Console().width, 180)).print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out.with_suffix(".csv"), index=False)
    print(f"wrote {out.with_suffix('.csv')}")


def report(runs: list[RunResult], args: argparse.Namespace, out: Path) -> None:
    """Print the comparison and write ``<out>.csv``, ``<out>_tests.csv``, ``<out>.md`` and ``<out>_curves.png``."""
    rows = comparison_rows(runs, args.arms, resamples=args.resamples)
    tests = (paired_differences(runs, args.arms[0], args.arms[1], resamples=args.resamples)
             if len(args.arms) > 1 else rows.iloc[0:0])
    title = (f"HiPRAG vs Search-R1 reward: {args.steps} GRPO steps x {args.batch} completions "
             f"({args.generations} per question), seeds {args.seeds}")
    print_table(title, rows, tests)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out.with_suffix(".csv"), index=False)
    tests.to_csv(out.parent / f"{out.name}_tests.csv", index=False)
    curves = out.parent / f"{out.name}_curves.png"
    curves_figure(runs).savefig(curves, dpi=120)
    settings = {"preset": args.preset or "–", "GRPO steps": args.steps,
                "completions per step": f"{args.batch} ({args.batch // args.generations} question(s) x "
                                        f"{args.generations} generations)",
                "seeds": ", ".join(map(str, args.seeds)), "RL question sources": ", ".join(args.sources or ["config"]),
                "RL questions per source": args.rl_questions_per_source or "config",
                "evaluation questions per source": args.questions_per_source,
                "learning rate": args.learning_rate or "config", "Kedro env": args.env or "local (default)",
                "arms": ", ".join(f"{arm} (λp = {ARMS[arm]['reward.lambda_p']})" for arm in args.arms)}
    out.with_suffix(".md").write_text(render_report(rows, tests, title="HiPRAG vs Search-R1 reward",
                                                    settings=settings, curves_file=curves.name), encoding="utf-8")
    print(f"wrote {out.with_suffix('.csv')}, {out.with_suffix('.md')}, {curves.name} and {out.name}_tests.csv")


if __name__ == "__main__":
    main()
