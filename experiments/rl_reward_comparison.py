"""HiPRAG's process reward (λp = 0.4) vs the Search-R1 outcome + format baseline (λp = 0), same seeds and budget.

Each arm is one ``kedro run --pipeline=train_rl`` (GRPO from the latest SFT adapter, then the RL policy rolled
out greedily on the evaluation questions and judged), tracked in MLflow as usual. The script then reads both
runs' metrics back from MLflow and writes them side by side to ``data/08_reporting/rl_reward_comparison.csv``
(and ``.md``). An arm overrides the shared ``reward`` block, which RL trains with *and* reward judging evaluates
with, so each arm's judged reward uses that arm's λp (the ``lambda_p`` column, read back from the run's logged
parameters). Run ``kedro run --pipeline=train_sft`` (or ``train``) first, so an SFT adapter and an index exist.

    python experiments/rl_reward_comparison.py --steps 3 --batch 8 --micro-batch 4 --questions-per-source 4
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import mlflow
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"hiprag": {"reward.method": "hiprag", "reward.lambda_p": 0.4},
        "search_r1": {"reward.method": "search_r1", "reward.lambda_p": 0.0}}
METHOD = "hiprag_agent_rl"
COLUMNS = ("lambda_p", "cem", "format_rate", "avg_retrievals", "osr", "usr", "search_ratio", "unknown_rate", "reward",
           "train_reward_first", "train_reward_last", "train_seconds")


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


def run_arm(name: str, overrides: dict[str, object]) -> dict[str, object]:
    """One train_rl run; its evaluation, judging and training numbers from MLflow."""
    started = time.perf_counter()
    with KedroSession.create(project_path=ROOT, runtime_params=nested(overrides)) as session:
        session_id = session.session_id
        session.run(pipeline_names=["train_rl"])
    seconds = time.perf_counter() - started
    # the kedro run's parent MLflow run, its rl stage run (training curves) and the RL policy's method run
    wanted = {"pipeline": None, "stage": "rl", "method": METHOD}  # prorag.kind -> its prorag.stage / prorag.method
    runs = {kind: run for run in mlflow.search_runs(
                search_all_experiments=True, output_format="list",
                filter_string=f"tags.`kedro.session_id` = '{session_id}'")
            if (kind := run.data.tags.get("prorag.kind")) in wanted
            and wanted[kind] in (None, run.data.tags.get("prorag.stage" if kind == "stage" else "prorag.method"))}
    if "pipeline" not in runs:
        raise RuntimeError(f"no MLflow run tagged with session {session_id}")
    run = runs["pipeline"]
    metrics = runs["method"].data.metrics if "method" in runs else {}
    client = mlflow.tracking.MlflowClient()
    curve = [point.value for point in sorted(client.get_metric_history(runs["stage"].info.run_id, "rl.reward"),
                                             key=lambda point: point.step)] if "stage" in runs else []

    def pick(*names: str) -> float:
        for key in names:
            if key in metrics:
                return float(metrics[key])
        return float("nan")

    logged_lambda_p = run.data.params.get("reward.lambda_p")
    return {
        "arm": name, "mlflow_run_id": run.info.run_id,
        "lambda_p": float(logged_lambda_p if logged_lambda_p is not None else overrides["reward.lambda_p"]),
        "cem": pick("evaluation.all.cem"),
        "format_rate": pick("evaluation.all.format_rate"),
        "avg_retrievals": pick("evaluation.all.avg_retrieval_count"),
        "osr": pick("judge.osr"), "usr": pick("judge.usr"),
        "search_ratio": pick("judge.search_ratio"), "unknown_rate": pick("judge.unknown_rate"),
        "reward": pick("judge.reward"),
        "train_reward_first": curve[0] if curve else float("nan"),
        "train_reward_last": curve[-1] if curve else float("nan"),
        "train_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="completions per step (questions x generations)")
    parser.add_argument("--micro-batch", type=int, default=4, help="completions per forward/backward pass")
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--questions-per-source", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", nargs="+", default=None,
                        help="RL question sources (default: parameters_rl.yml's); evaluated questions stay excluded")
    parser.add_argument("--name", default="rl_reward_comparison", help="report file stem in data/08_reporting")
    args = parser.parse_args()
    os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
    bootstrap_project(ROOT)
    if args.batch % args.micro_batch:
        parser.error("--batch must be a multiple of --micro-batch")
    shared = {"rl.trainer.max_steps": args.steps, "rl.trainer.per_device_train_batch_size": args.micro_batch,
              "rl.trainer.gradient_accumulation_steps": args.batch // args.micro_batch,
              "rl.trainer.num_generations": args.generations, "rl.trainer.seed": args.seed,
              "rl.trainer.save_steps": args.steps, "rollout.questions.max_per_source": args.questions_per_source,
              "rollout.seed": args.seed}
    if args.sources:
        shared["rl.questions.sources"] = args.sources
    rows = [run_arm(name, {**shared, **overrides}) for name, overrides in ARMS.items()]

    table = Table(title=f"HiPRAG vs Search-R1 reward: {args.steps} GRPO steps x {args.batch} completions, "
                        f"seed {args.seed}, RL questions from {args.sources or 'parameters_rl.yml'}")
    for column in ("arm", *COLUMNS):
        table.add_column(column)
    for row in rows:
        table.add_row(row["arm"], *(f"{row[column]:.3f}" for column in COLUMNS))
    Console().print(table)
    out = ROOT / "data" / "08_reporting" / args.name
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["arm", *COLUMNS, "mlflow_run_id"])
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| arm | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {row['arm']} | " + " | ".join(f"{row[column]:.3f}" for column in COLUMNS) + " |" for row in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
