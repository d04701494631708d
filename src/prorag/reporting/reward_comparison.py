"""HiPRAG's process reward against the Search-R1 baseline over several seeds, as a report (issue 18, item 4).

``experiments/rl_reward_comparison.py`` trains and evaluates each arm × seed; this module only aggregates (no
Kedro): one :class:`RunResult` per run — its per-question evaluation figures (:func:`question_table`, from the RL
policy's trajectories and their step verdicts) and its training curve (:func:`training_curve`, from the RL
training log) — becomes

* a row per run and a row per arm pooled over seeds (:func:`comparison_rows`): CEM and retrievals per question
  with percentile-bootstrap intervals over questions, OSR, USR and the search ratio as ratios of sums (HiPRAG
  eq. 2) with intervals from the same bootstrap over questions, and the share of training rollouts whose process
  bonus fired (``A·F·N_corr > 0``, the same gate whatever ``λp``) and the share of training groups whose GRPO
  advantages the process term changed (``process_shaped``: firing is necessary, not sufficient). Pooling seeds
  takes each question's mean over the seeds that evaluated it, so a question weighs the same however many seeds
  ran;
* the paired difference between two arms on the questions both evaluated (:func:`paired_differences`: Δ with a
  bootstrap interval and a permutation p-value, :func:`prorag.metrics.compare.paired_test`) and the questions a
  paired test would need to call that Δ significant with 80% power (:func:`~prorag.metrics.compare.questions_needed`);
* a Markdown report (:func:`render_report`) and a figure of the training curves (:func:`curves_figure`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from prorag.agent.trajectory import Rollout
from prorag.metrics.compare import paired_test, question_scores, questions_needed
from prorag.metrics.qa import bootstrap_interval
from prorag.metrics.search import search_behaviour
from prorag.redaction import redact_text
from prorag.reporting.cells import missing, percent, with_interval

QUESTION_COLUMNS: Final = ("question_key", "dataset", "cem", "format_ok", "retrievals", "search_steps",
                           "non_search_steps", "over_search", "over_known", "under_search", "under_known",
                           "judge_unknown", "judge_checked")
"""Per question of one run: CEM, format and retrievals are means over the question's samples; the step and
verdict columns are counts (the numerators and denominators of OSR, USR, the search ratio and the unknown rate)."""
CURVE_KEYS: Final = {"reward": "reward", "bonus_fired": "agent/bonus_fired",
                     "process_shaped": "agent/process_shaped", "cem": "agent/cem"}
"""Curve column -> the RL training log's key (TRL's mean reward; the rollout function's agent statistics)."""
RATIOS: Final = {"osr": ("over_search", "over_known"), "usr": ("under_search", "under_known"),
                 "search_ratio": ("search_steps", "all_steps"), "judge_unknown_rate": ("judge_unknown",
                                                                                       "judge_checked")}
MEANS: Final = ("cem", "retrievals")
BONUS_GOAL: Final = 0.10
"""The share of training rollouts in which the process bonus should fire for the comparison to test it."""
POOLED: Final = "all"


@dataclass(frozen=True)
class RunResult:
    """One arm × seed run: per-question evaluation figures, training curve, and what it cost."""

    arm: str
    seed: int
    questions: pd.DataFrame
    """:data:`QUESTION_COLUMNS`, one row per evaluated question."""
    curve: pd.DataFrame
    """``step`` and the :data:`CURVE_KEYS` columns, one row per training step (a missing column becomes NaN: a run
    from before that statistic was logged)."""
    seconds: float = math.nan
    lambda_p: float = math.nan
    run_id: str = ""
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "curve", self.curve.reindex(columns=["step", *CURVE_KEYS]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN stays NaN: ``json`` writes it)."""
        return {"arm": self.arm, "seed": self.seed, "seconds": self.seconds, "lambda_p": self.lambda_p,
                "run_id": self.run_id, "extras": dict(self.extras),
                "questions": self.questions.to_dict("records"), "curve": self.curve.to_dict("records")}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RunResult:
        """Inverse of :meth:`to_dict`."""
        return cls(arm=str(raw["arm"]), seed=int(raw["seed"]),
                   questions=pd.DataFrame(raw["questions"], columns=list(QUESTION_COLUMNS)),
                   curve=pd.DataFrame(raw["curve"]),  # columns completed by __post_init__
                   seconds=float(raw.get("seconds", math.nan)), lambda_p=float(raw.get("lambda_p", math.nan)),
                   run_id=str(raw.get("run_id", "")), extras=dict(raw.get("extras") or {}))


def question_table(trajectories: Iterable[Mapping[str, Any]], step_verdicts: Iterable[Mapping[str, Any]] = (),
                   *, method: str | None = None) -> pd.DataFrame:
    """Per-question figures of one run (:data:`QUESTION_COLUMNS`) from its trajectory records and the step-verdict
    records reward judging wrote for them (``question_key``, ``method``, ``skipped``, ``steps``); ``method`` keeps
    only that method's records (None: all, which must then be one method)."""
    rollouts = [rollout for rollout in map(Rollout.from_dict, trajectories)
                if method is None or rollout.method == method]
    methods = {rollout.method for rollout in rollouts}
    if len(methods) > 1:
        raise ValueError(f"trajectories of several methods {sorted(methods)}: name the one to tabulate")
    if not rollouts:
        return pd.DataFrame(columns=list(QUESTION_COLUMNS))
    scores = question_scores(rollouts).set_index("question_key")
    verdicts: dict[str, list[list[Any] | None]] = {}
    for record in step_verdicts:
        if method is not None and record.get("method", method) != method:
            continue
        steps = None if record.get("skipped") else list(record.get("steps") or [])
        verdicts.setdefault(str(record["question_key"]), []).append(steps)
    by_question: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        by_question.setdefault(rollout.question_key, []).append(rollout)
    rows = []
    for key, items in by_question.items():
        steps = search_behaviour(items)
        judged = search_behaviour(verdicts.get(key, []))
        rows.append({"question_key": key, "dataset": scores.loc[key, "dataset"], "cem": float(scores.loc[key, "cem"]),
                     "format_ok": float(np.mean([item.format_ok for item in items])),
                     "retrievals": float(np.mean([item.retrieval_count for item in items])),
                     "search_steps": steps.search_steps, "non_search_steps": steps.non_search_steps,
                     "over_search": judged.over_search, "over_known": judged.over_known,
                     "under_search": judged.under_search, "under_known": judged.under_known,
                     "judge_unknown": judged.over_unknown + judged.under_unknown,
                     "judge_checked": judged.over_known + judged.under_known + judged.over_unknown
                     + judged.under_unknown})
    return pd.DataFrame(rows, columns=list(QUESTION_COLUMNS))


def training_curve(log: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """``step`` and :data:`CURVE_KEYS` per training step from the RL training log (TRL's per-step log entries; the
    final summary entry, which has no reward, is left out). A statistic a step did not log is NaN."""
    rows = [{"step": int(entry["step"]),
             **{column: float(entry[key]) if key in entry else math.nan for column, key in CURVE_KEYS.items()}}
            for entry in log if "step" in entry and CURVE_KEYS["reward"] in entry]
    return pd.DataFrame(rows, columns=["step", *CURVE_KEYS]).sort_values("step", ignore_index=True)


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], *, confidence: float = 0.95,
                   resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of a ratio of sums (``Σ numerators / Σ denominators``, eq. 2) with questions
    resampled; resamples whose denominator is 0 are left out. NaN without two questions or without a denominator."""
    top, bottom = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if top.shape != bottom.shape:
        raise ValueError(f"{top.size} numerators for {bottom.size} denominators")
    if top.size < 2 or bottom.sum() <= 0:
        return math.nan, math.nan
    picks = np.random.default_rng(seed).integers(0, top.size, size=(resamples, top.size))
    sums_top, sums_bottom = top[picks].sum(axis=1), bottom[picks].sum(axis=1)
    ratios = sums_top[sums_bottom > 0] / sums_bottom[sums_bottom > 0]
    tail = (1.0 - confidence) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1.0 - tail))


def pooled_questions(runs: Sequence[RunResult]) -> pd.DataFrame:
    """The runs' question tables pooled: each question's mean over the runs (seeds) that evaluated it, and
    ``seeds``, how many did."""
    frames = [run.questions.assign(run=index) for index, run in enumerate(runs) if len(run.questions)]
    if not frames:
        return pd.DataFrame(columns=[*QUESTION_COLUMNS, "seeds"])
    stacked = pd.concat(frames, ignore_index=True)
    numeric = [column for column in QUESTION_COLUMNS if column not in ("question_key", "dataset")]
    stacked[numeric] = stacked[numeric].astype(float)
    pooled = stacked.groupby("question_key", sort=False).agg(
        dataset=("dataset", "first"), seeds=("run", "nunique"), **{column: (column, "mean") for column in numeric})
    return pooled.reset_index()[[*QUESTION_COLUMNS, "seeds"]]


def figures(questions: pd.DataFrame, *, confidence: float = 0.95, resamples: int = 2000,
            seed: int = 0) -> dict[str, float]:
    """CEM, format rate and retrievals (means over questions) and OSR, USR, search ratio and judge-unknown rate
    (ratios of sums), each metric with ``<metric>_low`` / ``<metric>_high`` bootstrap intervals over questions."""
    table = questions.assign(all_steps=questions["search_steps"] + questions["non_search_steps"])
    row: dict[str, float] = {"n_questions": float(len(table))}
    for metric in MEANS:
        values = table[metric].astype(float).tolist()
        row[metric] = float(np.mean(values)) if values else math.nan
        row[f"{metric}_low"], row[f"{metric}_high"] = bootstrap_interval(values, confidence=confidence,
                                                                         resamples=resamples, seed=seed)
    row["format_rate"] = float(table["format_ok"].astype(float).mean()) if len(table) else math.nan
    for metric, (top, bottom) in RATIOS.items():
        total = float(table[bottom].sum())
        row[metric] = float(table[top].sum()) / total if total > 0 else math.nan
        row[f"{metric}_low"], row[f"{metric}_high"] = ratio_interval(
            table[top].tolist(), table[bottom].tolist(), confidence=confidence, resamples=resamples, seed=seed)
    return row


def training_figures(curves: Sequence[pd.DataFrame]) -> dict[str, float]:
    """From training curves: the share of all training rollouts whose process bonus fired (the mean of the
    per-step shares over every logged step: each step rolls out the same number of completions), the steps it is
    over, the share of training groups whose advantages the process term changed (the mean per-step share, NaN
    for logs from before it was logged), and the first, last and mean training reward (mean over the curves for
    several runs)."""
    bonus = pd.concat([curve["bonus_fired"] for curve in curves], ignore_index=True).dropna() if curves else []
    shaped = pd.concat([curve["process_shaped"] for curve in curves], ignore_index=True).dropna() if curves else []
    rewards = [curve["reward"].dropna() for curve in curves if curve["reward"].notna().any()]
    return {"bonus_fired": float(np.mean(bonus)) if len(bonus) else math.nan,
            "bonus_steps": float(len(bonus)),
            "process_shaped": float(np.mean(shaped)) if len(shaped) else math.nan,
            "train_reward_first": float(np.mean([r.iloc[0] for r in rewards])) if rewards else math.nan,
            "train_reward_last": float(np.mean([r.iloc[-1] for r in rewards])) if rewards else math.nan,
            "train_reward_mean": float(np.mean(pd.concat(rewards))) if rewards else math.nan,
            "steps": float(np.mean([len(curve) for curve in curves])) if curves else math.nan}


def comparison_rows(runs: Sequence[RunResult], arms: Sequence[str] | None = None, *, confidence: float = 0.95,
                    resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per arm pooled over its seeds (``seed`` = ``"all"``: means of per-question means over seeds; the
    bonus share over every step of every seed; ``seconds`` summed) followed by one row per run."""
    arms = list(arms or dict.fromkeys(run.arm for run in runs))
    rows: list[dict[str, Any]] = []
    for arm in arms:
        mine = sorted((run for run in runs if run.arm == arm), key=lambda run: run.seed)
        if not mine:
            continue
        lambdas = {run.lambda_p for run in mine if not math.isnan(run.lambda_p)}
        rows.append({"arm": arm, "seed": POOLED, "seeds": len(mine),
                     "lambda_p": lambdas.pop() if len(lambdas) == 1 else math.nan,
                     **figures(pooled_questions(mine), confidence=confidence, resamples=resamples, seed=seed),
                     **training_figures([run.curve for run in mine]),
                     "seconds": float(sum(run.seconds for run in mine)), "run_id": ""})
        for run in mine:
            rows.append({"arm": arm, "seed": str(run.seed), "seeds": 1, "lambda_p": run.lambda_p,
                         **figures(run.questions, confidence=confidence, resamples=resamples, seed=seed),
                         **training_figures([run.curve]), "seconds": run.seconds, "run_id": run.run_id})
    return pd.DataFrame(rows)


def paired_differences(runs: Sequence[RunResult], arm_a: str, arm_b: str, *, metrics: Sequence[str] = MEANS,
                       confidence: float = 0.95, resamples: int = 2000, permutation_resamples: int = 9999,
                       seed: int = 0, power: float = 0.8) -> pd.DataFrame:
    """``arm_a − arm_b`` per metric on the questions both arms evaluated, each question's score its mean over the
    arm's seeds (:func:`~prorag.metrics.compare.paired_test`), with ``questions_needed``: the questions a paired
    test at 5% would need to detect the observed Δ with ``power`` (-1: no difference observed)."""
    pooled_a = pooled_questions([run for run in runs if run.arm == arm_a]).set_index("question_key")
    pooled_b = pooled_questions([run for run in runs if run.arm == arm_b]).set_index("question_key")
    common = pooled_a.index.intersection(pooled_b.index)
    rows = []
    for metric in metrics:
        result = paired_test(pooled_a.loc[common, metric].astype(float).to_numpy(),
                             pooled_b.loc[common, metric].astype(float).to_numpy(), confidence=confidence,
                             bootstrap_resamples=resamples, permutation_resamples=permutation_resamples, seed=seed)
        rows.append({"metric": metric, "arm_a": arm_a, "arm_b": arm_b, **result,
                     "questions_needed": questions_needed(float(result["difference"]),
                                                          float(result["sd_difference"]), power=power)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ the report


TABLE_HEADER: Final = ("| arm | seed | λp | questions | CEM | retrievals | OSR (%) | USR (%) | search ratio (%) "
                       "| format | bonus fired (train) | groups shaped (train) | reward first → last | minutes |")


def table_lines(rows: pd.DataFrame) -> list[str]:
    """The comparison rows as a Markdown table (intervals in brackets)."""
    lines = [TABLE_HEADER, "|---" * (TABLE_HEADER.count("|") - 1) + "|"]
    for row in rows.to_dict("records"):
        lines.append(
            f"| {row['arm']} | {row['seed']} | {row['lambda_p']:.2f} | {int(row['n_questions'])} | "
            f"{with_interval(row, 'cem')} | {with_interval(row, 'retrievals')} | "
            f"{with_interval(row, 'osr', percent=True)} | {with_interval(row, 'usr', percent=True)} | "
            f"{with_interval(row, 'search_ratio', percent=True)} | {percent(row['format_rate'], digits=1)} | "
            f"{percent(row['bonus_fired'], digits=1)} ({int(row['bonus_steps'])} steps) | "
            f"{percent(row['process_shaped'], digits=1)} | "
            f"{row['train_reward_first']:.3f} → {row['train_reward_last']:.3f} | {row['seconds'] / 60:.1f} |")
    return lines


def render_report(rows: pd.DataFrame, tests: pd.DataFrame, *, title: str, settings: Mapping[str, Any],
                  confidence: float = 0.95, curves_file: str = "") -> str:
    """The Markdown report: settings, the per-arm and per-seed table, the paired differences with the questions a
    significant difference would need, whether the bonus fired often enough, and how to read it."""
    pct = round(confidence * 100)
    lines = [f"# {title}", "", "## Settings", "", "| setting | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in settings.items()]
    lines += ["", f"## Results ({pct}% bootstrap intervals over questions)", "", *table_lines(rows), ""]
    pooled = rows[rows["seed"] == POOLED]
    for row in pooled.to_dict("records"):
        share = row["bonus_fired"]
        verdict = ("no step logged it (detection off?)" if missing(share)
                   else "goal met" if share >= BONUS_GOAL else "goal NOT met: the bonus rarely shaped the updates")
        shaped = row["process_shaped"]
        lines.append(f"- {row['arm']}: the process bonus fired in {percent(share, digits=1)} of training rollouts "
                     f"(goal ≥ {BONUS_GOAL:.0%}: {verdict})"
                     + ("." if missing(shaped) else f"; it changed the GRPO advantages of {percent(shaped, digits=1)} "
                        "of training groups" + (" — so the two rewards made the same updates." if shaped == 0
                                                else ".")))
    lines += ["", "## Paired differences", ""]
    if tests.empty:
        lines.append("Only one arm ran: nothing to compare.")
    else:
        lines += [f"| metric | Δ ({tests['arm_a'].iloc[0]} − {tests['arm_b'].iloc[0]}) [{pct}% CI] | questions | "
                  "better / worse / tied | p | questions for 80% power |", "|---|---|---|---|---|---|"]
        for test in tests.to_dict("records"):
            needed = int(test["questions_needed"])
            lines.append(f"| {test['metric']} | {test['difference']:+.3f} [{test['low']:+.3f}, {test['high']:+.3f}] "
                         f"| {int(test['n'])} | {test['wins']} / {test['losses']} / {test['ties']} "
                         f"| {test['p_value']:.3g} | {needed if needed >= 0 else '–'} |")
        lines += ["", _budget_sentence(tests)]
    lines += ["", "## How to read this", "",
              "- Every run of an arm trains GRPO from the same SFT adapter with that arm's reward (λp = 0 is the "
              "Search-R1 outcome + format reward), then rolls the RL policy out greedily on the same evaluation "
              "questions, which reward judging labels step by step.",
              "- **seed `all`**: the arm pooled over its seeds — each question's mean over the seeds, then the mean "
              "(CEM, retrievals) or the ratio of sums (OSR, USR, search ratio) over questions; intervals resample "
              "questions. Per-seed rows show how much a seed alone moves the figures.",
              "- **CEM**: cover exact match of the final answer; **retrievals**: search calls per question; **OSR** / "
              "**USR**: over-/under-search rates over steps with a known verdict (HiPRAG eq. 2); **search ratio**: "
              "search steps among all steps.",
              "- **bonus fired (train)**: share of training rollouts with A·F·N_corr > 0 — correct, well-formed "
              "and at least one optimal step —, the gate of eq. 1's process bonus, measured the same way in both "
              "arms (for λp = 0 it is how often the bonus *would* have fired). Below "
              f"{BONUS_GOAL:.0%} the two rewards barely differ during training, so equal results say little.",
              "- **groups shaped (train)**: share of training groups (one question's generations) whose GRPO "
              "advantages change when eq. 1's process term λp·A·F·N_corr/N is added (for λp = 0: HiPRAG's λp = 0.4 "
              "term). Firing is not enough: when every correct rollout of a group has the same N_corr/N and the "
              "others share one reward, the term is an affine map of the outcome + format reward within the group "
              "and group normalization cancels it. At 0% both arms train identically, whatever the bonus rate. "
              "'–': the runs predate this statistic.",
              "- **Δ**: paired difference on the questions both arms answered; **p**: two-sided paired permutation "
              "test; **questions for 80% power**: evaluation questions a paired test at 5% would need to call the "
              "observed Δ significant (normal approximation with the observed spread of per-question differences).",
              ""]
    if curves_file:
        lines += ["## Training curves", "", f"![training curves]({curves_file})", "",
                  "Mean training reward, share of rollouts whose bonus fired and share of groups whose advantages "
                  "it changed, per step, one line per arm × seed.",
                  ""]
    return redact_text("\n".join(lines))  # settings may name endpoints with credentials


def _budget_sentence(tests: pd.DataFrame) -> str:
    cem = tests[tests["metric"] == "cem"]
    if cem.empty:
        return ""
    test = cem.iloc[0]
    needed = int(test["questions_needed"])
    if needed < 0:
        return (f"CEM did not differ on these {int(test['n'])} questions: no budget can be derived from a zero "
                "difference; any real difference is smaller than this evaluation resolves.")
    significant = not missing(test["p_value"]) and test["p_value"] < 0.05
    return (f"Budget: detecting the observed Δ CEM of {test['difference']:+.3f} (per-question spread "
            f"{test['sd_difference']:.3f}) with 80% power at 5% needs about {needed} evaluation questions per arm; "
            f"this run had {int(test['n'])} ({'significant' if significant else 'not significant'} here, "
            f"p = {test['p_value']:.3g}).")


def curves_figure(runs: Sequence[RunResult]) -> Figure:
    """Training reward, the share of rollouts whose process bonus fired and the share of groups whose advantages
    it changed, per step, one line per arm × seed."""
    figure = Figure(figsize=(15.0, 4.0), layout="constrained")
    panels = (("reward", "mean training reward"), ("bonus_fired", "rollouts whose process bonus fired"),
              ("process_shaped", "groups whose advantages the bonus changed"))
    arms = list(dict.fromkeys(run.arm for run in runs))
    styles = ("-", "--", ":", "-.")
    for axes, (column, label) in zip(figure.subplots(1, 3), panels, strict=True):
        axes.set_ylabel(label)
        if not any(run.curve[column].notna().any() for run in runs):
            axes.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=axes.transAxes)
            axes.set_xticks([])
            axes.set_yticks([])
            continue
        for run in runs:
            curve = run.curve.dropna(subset=[column])
            color = f"C{arms.index(run.arm) % 10}"
            axes.plot(curve["step"], curve[column], styles[run.seed % len(styles)], color=color, marker=".",
                      label=f"{run.arm} seed {run.seed}")
        axes.set_xlabel("GRPO step")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        if column != "reward":
            axes.set_ylim(0, 1)
        if column == "bonus_fired":
            axes.axhline(BONUS_GOAL, color="grey", linewidth=0.8, linestyle=":")
        axes.legend(fontsize="small")
    figure.suptitle("Training curves per arm and seed")
    return figure
