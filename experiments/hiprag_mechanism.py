"""HiPRAG's mechanism on 2 CPU cores in about an hour (issue 44, item 1): does the process bonus λp·A·F·N_corr/N
teach the policy to answer a question it knows *without searching*, where the Search-R1 reward (λp = 0) does not?

One command (``make experiment-hiprag``), every stage from a fresh clone (no SFT adapter, no index needed):

1. **Index** the passages of PopQA's popular questions (``metadata.s_pop >= --min-pop``) plus background leads.
2. **SFT with non-search steps.** The single-hop sub-questions of MuSiQue *train* (``hop_questions``: the train
   split, never an evaluated question) become one-step trajectories, half with a search step (the gold paragraph
   among the question's distractors as context), half with a non-search step (``mixed_hop_examples``). The few-shot
   prompt alone does not put non-search steps in reach: the bundled SmolLM2-135M closes 1 of 12 rollouts in the
   format with it (measured while building this), so a short LoRA SFT on these examples starts every arm.
3. **Screen** the popular questions closed-book with the SFT policy, greedy, through the over-search detector's
   own re-ask path (``reask_messages(question, "instructed")``): a question it answers right (cover EM) is one it
   knows, so a correct search on it is over-search by construction and a correct direct answer is optimal.
4. **Split** the known questions deterministically (``split_known``: sha256 of ``"<seed>/<key>"``, lowest first):
   the first ``--train-questions`` train both arms, the next ``--eval-questions`` are held out; the split is
   written to ``data/08_reporting/hiprag_mechanism_split.csv``.
5. **Probe** (:func:`prorag.training.probe.probe_groups`, groups of ``--generations``) on the training questions:
   the ratio-shaped groups (>= 2 correct, well-formed rollouts whose N_corr/N differ: HiPRAG's own signal),
   the re-weighted ones (the term only re-weights correct / wrong / malformed), and the mean advantage gap
   correct-without-search − correct-with-search with λp = 0.4 and with λp = 0. **Gate:** training goes on only
   when at least ``--gate`` of the probe's groups are ratio-shaped (default 25%, i.e. 2 of 6 groups).
6. **Train** both arms with GRPO (the RL pipeline's ``train_rl`` node: same SFT adapter, questions, seeds, G,
   steps; only ``reward.lambda_p`` differs).
7. **Evaluate** the SFT policy and both RL policies greedily on the held-out questions: CEM, the share of questions
   answered correctly without any search, retrievals, OSR and USR (the same detectors), with bootstrap intervals
   and paired HiPRAG − Search-R1 tests (:func:`prorag.metrics.compare.paired_test`).

Judges: the reference judge (no model). Over-search equivalence is ``content`` (the one-word answers of PopQA
against the re-asked sentence, which token F1 misses: ``ReferenceJudge``); under-search is BM25 grounding.
Writes ``data/08_reporting/hiprag_mechanism{.md,.csv,_tests.csv,_probe.csv,_split.csv}``; stages are cached under
``data/06_models/hiprag_mechanism/`` (the SFT adapter, the RL runs' checkpoints), so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prorag.data import Question
from prorag.metrics.compare import paired_test
from prorag.metrics.qa import bootstrap_interval, cover_exact_match
from prorag.protocol.base import format_documents
from prorag.protocol.hiprag import NonSearchStep, SearchStep, Trajectory, render
from prorag.reporting.reward_comparison import ratio_interval
from prorag.training.synthesis import hop_questions

ROOT = Path(__file__).resolve().parents[1]
NAME = "hiprag_mechanism"
SEARCH_REASONING = "I am not certain of this, so I will search for it."
DIRECT_REASONING = "I know this well, so it needs no search."
ARMS = {"hiprag": 0.4, "search_r1": 0.0}
logger = logging.getLogger(NAME)


# ---------------------------------------------------------------------------------------------- data


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def popular_questions(records: Sequence[dict[str, Any]], min_pop: float) -> list[dict[str, Any]]:
    """PopQA records whose subject's popularity ``metadata.s_pop`` is at least ``min_pop`` (in file order)."""
    return [record for record in records
            if isinstance((record.get("metadata") or {}).get("s_pop"), int | float)
            and record["metadata"]["s_pop"] >= min_pop]


def _hop_paragraphs(question: Question) -> list[tuple[str, str, int]]:
    """``(title, text, idx)`` of a MuSiQue question's paragraphs."""
    return [(str(item["title"]), str(item["paragraph_text"]), int(item["idx"]))
            for item in question.metadata.get("paragraphs") or []]


def mixed_hop_examples(questions: Sequence[Question], *, seed: int = 0,
                       top_k: int = 3) -> list[tuple[str, str, str]]:
    """One-step HiPRAG trajectories ``(question, completion, kind)`` for every single-hop sub-question of the
    MuSiQue train questions (:func:`hop_questions`, later hops with the earlier answers filled in). Each sub-question
    gets, by a hash of ``"<seed>/<sub-question id>"``, either a search step (its gold paragraph and ``top_k − 1``
    distractors of the same question as the context, in a seeded order) or a non-search step; both conclude
    "So the answer is <answer>." A sub-question whose gold paragraph is missing is left out."""
    examples = []
    for question in questions:
        paragraphs = _hop_paragraphs(question)
        decomposition = question.metadata.get("question_decomposition") or []
        for hop in hop_questions(question, first=True, later=True):
            position = int(hop.id.rsplit("#hop", 1)[1]) - 1
            support = decomposition[position].get("paragraph_support_idx") if position < len(decomposition) else None
            gold = [item for item in paragraphs if item[2] == support]
            if not gold:
                continue
            answer = hop.golden_answers[0]
            conclusion = f"So the answer is {answer}."
            digest = hashlib.sha256(f"{seed}/{hop.id}".encode()).digest()
            if digest[0] % 2:
                rng = random.Random(digest)
                others = [item for item in paragraphs if item[2] != support]
                documents = [*gold, *rng.sample(others, min(top_k - 1, len(others)))]
                rng.shuffle(documents)
                step: SearchStep | NonSearchStep = SearchStep(
                    reasoning=SEARCH_REASONING, query=hop.question,
                    context=format_documents([(title, text) for title, text, _ in documents]), conclusion=conclusion)
                kind = "search"
            else:
                step, kind = NonSearchStep(reasoning=DIRECT_REASONING, conclusion=conclusion), "non_search"
            examples.append((hop.question, render(Trajectory(steps=(step,), answer=answer)), kind))
    return examples


def split_known(records: Sequence[dict[str, Any]], known: Sequence[bool], *, n_train: int, n_eval: int,
                seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The known questions (``known[i]``) ordered by sha256 of ``"<seed>/<dataset>:<id>"``: the first ``n_train``
    for training, the next ``n_eval`` held out. Deterministic, and independent of the file order."""
    if len(records) != len(known):
        raise ValueError(f"{len(records)} questions but {len(known)} screening results")
    chosen = [record for record, ok in zip(records, known, strict=True) if ok]
    chosen.sort(key=lambda record: hashlib.sha256(f"{seed}/{record['dataset']}:{record['id']}".encode()).hexdigest())
    if len(chosen) < n_train + 2:
        raise ValueError(f"only {len(chosen)} questions answered right closed-book: need {n_train} for training and "
                         f"at least 2 held out (lower --min-pop or --train-questions)")
    return chosen[:n_train], chosen[n_train:n_train + n_eval]


# ------------------------------------------------------------------------------------------ evaluation


def question_rows(rollouts: Sequence[Any], verdicts: Sequence[Any] | None) -> pd.DataFrame:
    """One row per rollout (greedy: one per question): CEM, format, correct without any retrieval, retrievals, and
    the over-/under-search counts of its step verdicts (unknown verdicts left out of the denominators)."""
    rows = []
    for index, rollout in enumerate(rollouts):
        steps = list(verdicts[index].steps) if verdicts is not None and not verdicts[index].skipped else []
        over = [step.over for step in steps if step.kind == "search"]
        under = [step.under for step in steps if step.kind == "non_search"]
        correct = float(cover_exact_match(rollout.answer, rollout.golden_answers))
        rows.append({"question_key": rollout.question_key, "cem": correct, "format_ok": float(rollout.format_ok),
                     "no_search_correct": float(correct > 0 and rollout.retrieval_count == 0),
                     "retrievals": float(rollout.retrieval_count),
                     "over_search": float(sum(value is True for value in over)),
                     "over_known": float(sum(value is not None for value in over)),
                     "under_search": float(sum(value is True for value in under)),
                     "under_known": float(sum(value is not None for value in under))})
    return pd.DataFrame(rows)


MEAN_METRICS = ("cem", "no_search_correct", "retrievals", "format_ok")
RATIO_METRICS = {"osr": ("over_search", "over_known"), "usr": ("under_search", "under_known")}


def summary_row(name: str, table: pd.DataFrame, *, resamples: int = 2000) -> dict[str, Any]:
    """Means (CEM, no-search-correct share, retrievals, format) and ratios of sums (OSR, USR) with 95% bootstrap
    intervals over questions."""
    row: dict[str, Any] = {"policy": name, "questions": len(table)}
    for metric in MEAN_METRICS:
        values = table[metric].astype(float).tolist()
        row[metric] = float(np.mean(values)) if values else math.nan
        row[f"{metric}_low"], row[f"{metric}_high"] = bootstrap_interval(values, resamples=resamples)
    for metric, (top, bottom) in RATIO_METRICS.items():
        total = float(table[bottom].sum())
        row[metric] = float(table[top].sum()) / total if total else math.nan
        row[f"{metric}_low"], row[f"{metric}_high"] = ratio_interval(table[top].tolist(), table[bottom].tolist(),
                                                                     resamples=resamples)
    return row


def paired_rows(a: pd.DataFrame, b: pd.DataFrame, name_a: str, name_b: str, *,
                resamples: int = 2000) -> pd.DataFrame:
    """``a − b`` per question (same questions): CEM, no-search-correct, retrievals, and each question's own
    over-search share where both policies searched (OSR per question)."""
    joined = a.set_index("question_key").join(b.set_index("question_key"), lsuffix="_a", rsuffix="_b", how="inner")
    rows = []
    for metric in ("cem", "no_search_correct", "retrievals"):
        rows.append({"metric": metric, "a": name_a, "b": name_b,
                     **paired_test(joined[f"{metric}_a"], joined[f"{metric}_b"], bootstrap_resamples=resamples)})
    both = joined[(joined["over_known_a"] > 0) & (joined["over_known_b"] > 0)]
    rows.append({"metric": "osr_per_question", "a": name_a, "b": name_b,
                 **paired_test(both["over_search_a"] / both["over_known_a"],
                               both["over_search_b"] / both["over_known_b"], bootstrap_resamples=resamples)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-pop", type=float, default=0,
                        help="PopQA s_pop threshold (0: every question; screening picks the ones the policy knows)")
    parser.add_argument("--screen-limit", type=int, default=None, help="screen only the first N popular questions")
    parser.add_argument("--background", type=int, default=300, help="background passages in the index")
    parser.add_argument("--sft-steps", type=int, default=12, help="LoRA SFT steps of 4 examples")
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--train-questions", type=int, default=6)
    parser.add_argument("--eval-questions", type=int, default=60)
    parser.add_argument("--probe-questions", type=int, default=6)
    parser.add_argument("--generations", type=int, default=8, help="G: rollouts per question (probe and GRPO)")
    parser.add_argument("--gate", type=float, default=0.25, help="least share of ratio-shaped probe groups")
    parser.add_argument("--steps", type=int, default=5, help="GRPO steps per arm (one question x G per step)")
    parser.add_argument("--lr", type=float, default=2e-4, help="GRPO LoRA learning rate")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--step-budget", type=int, default=2)
    parser.add_argument("--max-total-new-tokens", type=int, default=192)
    parser.add_argument("--skip-gate", action="store_true", help="train even when the probe fails the gate")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--env", default=None, help="Kedro config env the settings start from (as kedro run --env; "
                                                   "hiprag_vs_search_r1: the policy, SFT and GRPO on one GPU)")
    parser.add_argument("--judge", choices=["reference", "config"], default="reference",
                        help="reference: the reference judge with content equivalence and the instructed re-ask; "
                             "config: the env's reward judges and re-ask (an LLM judge on a GPU)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(stage: str, since: float) -> float:
        timings[stage] = time.perf_counter() - since
        logger.info("%s: %.0f s", stage, timings[stage])
        return time.perf_counter()

    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from prorag.agent.runner import build_engine
    from prorag.assembly import build_policy, build_retriever, build_scorer
    from prorag.judges.detection import reask_messages, reask_sampling
    from prorag.llm.generation import generate_chat
    from prorag.llm.registry import load_tokenizer
    from prorag.pipelines.corpus_indexing.nodes import build_index
    from prorag.pipelines.corpus_indexing.params import CorpusIndexingParams
    from prorag.pipelines.rl.nodes import train_rl
    from prorag.pipelines.rl.params import RLParams
    from prorag.rewards.base import RewardSettings
    from prorag.specs import PolicySpec, SamplingSpec, TrainedAgentSpec
    from prorag.training.config import SFTSettings
    from prorag.training.probe import probe_groups
    from prorag.training.sft import build_sft_example, train_sft_lora

    bootstrap_project(ROOT)
    with KedroSession.create(project_path=ROOT, env=args.env) as session:
        params = session.load_context().params
    raw = ROOT / "data" / "01_raw"
    work = ROOT / "data" / "06_models" / args.name
    report = ROOT / "data" / "08_reporting"
    work.mkdir(parents=True, exist_ok=True)
    report.mkdir(parents=True, exist_ok=True)
    seed = args.seeds[0]

    params = {name: value.model_dump() if hasattr(value, "model_dump") else value for name, value in params.items()}
    policy = PolicySpec.model_validate(params["policy"])
    agent = TrainedAgentSpec.model_validate({**params["agent"], "few_shot": False, "step_budget": args.step_budget,
                                             "max_total_new_tokens": args.max_total_new_tokens})
    base_reward = {**params["reward"], "kind": "hiprag"}
    if args.judge == "reference":
        base_reward.update(reask="instructed", over_search_judge={**params["reward"]["over_search_judge"],
                                                                  "kind": "reference", "equivalence": "content"})
    base_reward.pop("lambda_p", None)
    rl = RLParams.model_validate(params["rl"])

    # 1. index
    clock = time.perf_counter()
    popular = popular_questions(read_jsonl(raw / "qa" / "popqa.jsonl"), args.min_pop)[:args.screen_limit]
    wanted = {pid for record in popular for pid in record.get("context_passage_ids") or []}
    passages = [record for record in read_jsonl(raw / "corpus" / "popqa.jsonl") if record["id"] in wanted]
    background = read_jsonl(raw / "corpus" / "wikipedia_vital_leads.jsonl")
    passages += random.Random(seed).sample(background, min(args.background, len(background)))
    index = build_index(passages, CorpusIndexingParams.model_validate(params["corpus_indexing"]))
    retriever = build_retriever(rl.retriever, index)
    clock = lap("index", clock)

    # 2. SFT with non-search steps (cached by its settings)
    musique = [Question.from_dict(record) for record in read_jsonl(raw / "qa" / "musique_train.jsonl")]
    examples = mixed_hop_examples(musique, seed=seed)
    sft = SFTSettings.model_validate({**params["sft"], "max_steps": args.sft_steps, "learning_rate": args.sft_lr,
                                      "seed": seed})
    key = hashlib.sha256(json.dumps([sft.model_dump(), policy.model, examples], default=str).encode()).hexdigest()
    sft_dir = work / f"sft_{key[:12]}"
    adapter = sft_dir / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        tokenizer = load_tokenizer(policy.model)
        rows = [build_sft_example(tokenizer, question, completion, protocol=agent.protocol, few_shot=False)
                for question, completion, _ in examples]
        random.Random(seed).shuffle(rows)
        adapter, _ = train_sft_lora(policy.model, rows, sft_dir, sft)
    kinds = pd.Series([kind for _, _, kind in examples]).value_counts().to_dict()
    clock = lap("sft", clock)
    sft_policy = policy.with_trained(str(adapter))
    generator = build_policy(sft_policy)

    # 3. screen closed-book through the re-ask path, 4. split
    answers = generate_chat(generator, [reask_messages(record["question"], "instructed") for record in popular],
                            reask_sampling("instructed", int(base_reward.get("reask_max_new_tokens", 48))))
    # screening is greedy and instructed whatever the env's re-ask: "does the policy know it" must be deterministic
    known = [cover_exact_match(items[0].text, record["golden_answers"]) for items, record in zip(answers, popular,
                                                                                                strict=True)]
    train, held_out = split_known(popular, known, n_train=args.train_questions, n_eval=args.eval_questions,
                                  seed=seed)
    split = pd.DataFrame([{"dataset": record["dataset"], "id": record["id"], "question": record["question"],
                           "s_pop": record["metadata"]["s_pop"], "part": part}
                          for part, records in (("train", train), ("held_out", held_out)) for record in records])
    split.to_csv(report / f"{args.name}_split.csv", index=False)
    clock = lap("screen", clock)
    logger.info("screened %d popular questions: %d known; %d train, %d held out", len(popular), sum(known),
                len(train), len(held_out))

    # 5. probe (λp = 0.4: the term's shares and both gaps come out of one sampling)
    train_questions = [Question.from_dict(record) for record in train]
    scorer = build_scorer(RewardSettings.model_validate({**base_reward, "lambda_p": 0.4}), index,
                          judge_for_metrics=True, questions=train_questions)
    probe = pd.DataFrame(probe_groups(train_questions[:args.probe_questions], generator, retriever, scorer, agent,
                                      group_sizes=[args.generations], top_k=rl.retriever.top_k,
                                      temperature=rl.trainer.temperature, top_p=rl.trainer.top_p, seed=seed,
                                      scale_rewards=rl.trainer.scale_rewards))
    probe.to_csv(report / f"{args.name}_probe.csv", index=False)
    clock = lap("probe", clock)
    ratio_shaped = float(probe["ratio_shaped"].iloc[0])
    passed = not math.isnan(ratio_shaped) and ratio_shaped >= args.gate
    logger.info("probe: %s; gate (ratio-shaped >= %.0f%%): %s", probe.iloc[0].to_dict(), 100 * args.gate,
                "pass" if passed else "FAIL")

    # 6. train both arms per seed, 7. evaluate on the held-out questions
    held = [Question.from_dict(record) for record in held_out]
    eval_scorer = build_scorer(RewardSettings.model_validate({**base_reward, "lambda_p": 0.4}), index,
                               judge_for_metrics=True, questions=held)

    def evaluate(spec: PolicySpec, name: str) -> pd.DataFrame:
        evaluated = build_policy(spec)
        engine = build_engine(agent, evaluated, retriever, top_k=rl.retriever.top_k,
                              sampling=SamplingSpec(temperature=0.0, seed=seed))
        rollouts = engine.run(held)
        scored = eval_scorer.score(rollouts, evaluated, step=0)
        with (work / f"eval_{name}.jsonl").open("w", encoding="utf-8") as handle:
            for index, rollout in enumerate(rollouts):
                verdicts = scored.verdicts[index].to_dict() if scored.verdicts is not None else None
                handle.write(json.dumps({"rollout": rollout.to_dict(), "verdicts": verdicts}, default=str) + "\n")
        return question_rows(rollouts, scored.verdicts)

    tables: dict[str, pd.DataFrame] = {"sft": evaluate(sft_policy, "sft")}
    clock = lap("eval sft", clock)
    runs: list[dict[str, Any]] = []
    if passed or args.skip_gate:
        for run_seed in args.seeds:
            for arm, lambda_p in ARMS.items():
                run_params = rl.model_copy(update={
                    "init": "sft", "lora": True, "judge_for_metrics": True, "run_root": str(work / "rl_runs"),
                    "trainer": rl.trainer.model_copy(update={
                        "max_steps": args.steps, "per_device_train_batch_size": args.generations,
                        "num_generations": args.generations, "gradient_accumulation_steps": 1,
                        "learning_rate": args.lr, "seed": run_seed, "save_steps": args.steps, "beta": 0.0})})
                reward = RewardSettings.model_validate({**base_reward, "lambda_p": lambda_p})
                train_clock = time.perf_counter()
                rl_adapter, log = train_rl(train, index, str(adapter), run_params, policy, agent, reward)
                seconds = time.perf_counter() - train_clock
                rewards = [float(entry["reward"]) for entry in log if "reward" in entry]  # not the summary entry
                runs.append({"arm": arm, "seed": run_seed, "lambda_p": lambda_p, "train_s": seconds,
                             "reward_first": rewards[0] if rewards else math.nan,
                             "reward_last": rewards[-1] if rewards else math.nan})
                eval_clock = time.perf_counter()
                tables[f"{arm}_seed{run_seed}"] = evaluate(policy.with_trained(rl_adapter), f"{arm}_seed{run_seed}")
                runs[-1]["eval_s"] = time.perf_counter() - eval_clock
                logger.info("%s seed %d: trained %.0f s, evaluated %.0f s", arm, run_seed, seconds,
                            runs[-1]["eval_s"])
        clock = lap("train and evaluate arms", clock)

    summary = pd.DataFrame([summary_row(name, table, resamples=args.resamples) for name, table in tables.items()])
    tests = [paired_rows(tables[f"hiprag_seed{run_seed}"], tables[f"search_r1_seed{run_seed}"],
                         f"hiprag_seed{run_seed}", f"search_r1_seed{run_seed}", resamples=args.resamples)
             for run_seed in args.seeds if f"hiprag_seed{run_seed}" in tables]
    tests_frame = pd.concat(tests, ignore_index=True) if tests else pd.DataFrame()
    summary.to_csv(report / f"{args.name}.csv", index=False)
    tests_frame.to_csv(report / f"{args.name}_tests.csv", index=False)
    pd.concat([table.assign(policy=name) for name, table in tables.items()]).to_csv(
        report / f"{args.name}_questions.csv", index=False)
    total = time.perf_counter() - started
    text = render_markdown(args, summary, tests_frame, probe, runs, timings, total,
                           {"popular": len(popular), "known": int(sum(known)), "train": len(train),
                            "held_out": len(held_out), "sft_examples": kinds}, passed)
    (report / f"{args.name}.md").write_text(text, encoding="utf-8")
    print(text)


def _cell(row: dict[str, Any], metric: str, scale: float = 1.0, digits: int = 3) -> str:
    value, low, high = row[metric], row.get(f"{metric}_low", math.nan), row.get(f"{metric}_high", math.nan)
    if value is None or math.isnan(value):
        return "–"
    if math.isnan(low):
        return f"{scale * value:.{digits}g}"
    return f"{scale * value:.{digits}g} [{scale * low:.{digits}g}, {scale * high:.{digits}g}]"


def render_markdown(args: argparse.Namespace, summary: pd.DataFrame, tests: pd.DataFrame, probe: pd.DataFrame,
                    runs: list[dict[str, Any]], timings: dict[str, float], total: float, counts: dict[str, Any],
                    passed: bool) -> str:
    """The report: settings, probe and gate, the held-out table, the paired tests, the wall times."""
    row = probe.iloc[0].to_dict()
    lines = [f"# HiPRAG mechanism: λp = 0.4 vs 0 ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"Popular PopQA questions (s_pop >= {args.min_pop:g}): {counts['popular']}; answered right closed-book by "
             f"the SFT policy (greedy re-ask): {counts['known']}; train {counts['train']}, held out "
             f"{counts['held_out']} (`{args.name}_split.csv`). SFT: {args.sft_steps} steps on MuSiQue-train "
             f"sub-questions {counts['sft_examples']}. G = {args.generations}, {args.steps} GRPO steps per arm, "
             f"lr {args.lr:g}, seeds {args.seeds}.", "",
             "## Probe (SFT policy, training questions, T as in GRPO)", "",
             "| groups | rollouts | CEM | correct without search | bonus fired | uniform | ratio-shaped | "
             "re-weighted only | gap λp=0.4 | gap λp=0 | groups with both |",
             "|---|---|---|---|---|---|---|---|---|---|---|",
             f"| {int(row['groups'])} | {int(row['rollouts'])} | {row['cem']:.3f} | {row['no_search_correct']:.3f} | "
             f"{100 * row['bonus_fired']:.1f}% | {100 * row['uniform_groups']:.1f}% | "
             f"{100 * row['ratio_shaped']:.1f}% | {100 * row['reweighted']:.1f}% | {row['gap_with']:+.3f} | "
             f"{row['gap_without']:+.3f} | {int(row['gap_groups'])} |", "",
             f"Gate: ratio-shaped groups >= {100 * args.gate:.0f}%: **{'pass' if passed else 'fail'}**"
             f"{'' if passed or not runs else ' (trained anyway: --skip-gate)'}.", "",
             "## Held-out questions (greedy)", "",
             "| policy | questions | CEM | correct without search | retrievals | OSR | USR | format |",
             "|---|---|---|---|---|---|---|---|"]
    for item in summary.to_dict("records"):
        lines.append(f"| {item['policy']} | {item['questions']} | {_cell(item, 'cem')} | "
                     f"{_cell(item, 'no_search_correct')} | {_cell(item, 'retrievals')} | {_cell(item, 'osr')} | "
                     f"{_cell(item, 'usr')} | {_cell(item, 'format_ok')} |")
    if len(tests):
        lines += ["", "## Paired HiPRAG − Search-R1 (same questions)", "",
                  "| metric | n | Δ [95% CI] | p | won / lost / tied |", "|---|---|---|---|---|"]
        for test in tests.to_dict("records"):
            lines.append(f"| {test['metric']} ({test['a']} − {test['b']}) | {test['n']} | "
                         f"{test['difference']:+.3f} [{test['low']:+.3f}, {test['high']:+.3f}] | "
                         f"{test['p_value']:.3g} | {test['wins']} / {test['losses']} / {test['ties']} |")
    lines += ["", "## Wall time", "", *(f"- {stage}: {seconds / 60:.1f} min" for stage, seconds in timings.items()),
              *(f"- {run['arm']} seed {run['seed']}: GRPO {run['train_s'] / 60:.1f} min, evaluation "
                f"{run['eval_s'] / 60:.1f} min, mean reward first → last step {run['reward_first']:.3f} → "
                f"{run['reward_last']:.3f}" for run in runs),
              f"- total: {total / 60:.1f} min", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
