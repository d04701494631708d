"""Iterative process-aware DPO (TeaRAG §4.3.2): scored paths → preference pairs → DPO + SFT → resample.

Pair construction (eq. 14 and the three rejection kinds), rebuilt from the prose (the seed text lost the
symbols; thresholds are parameters of :class:`PairRules`):

* chosen set, eq. 14 — multi-hop: ``C(x) = {y : r_f(y) = 1 ∧ r_o(y) ≥ τ_o ∧ r_p(y) ≥ τ_p}``; the outcome
  condition is relaxed (``τ_o < 1``) because a good path often differs from the ground truth only in wording.
  Single-hop: no process reward; ``C(x) = {y : r_f(y) = 1 ∧ r_o(y)/T ≥ τ_o}`` (the outcome divided by the path
  length, so a one-step path is preferred);
* the sampled paths of the question that are not chosen are ranked by ``r_o + r_f + r_p`` ascending and
  traversed once; each chosen path (best first) takes the next path that is a rejection of one of the kinds
  below, and the traversal goes on from the position after it, so no rejected path is used twice:

  - *format* rejection: ``r_f = 0``;
  - *easy* rejection: ``r_f = 1 ∧ F1 ≤ ε`` (well-formed but the answer is wrong; ``ε`` = ``easy_max_f1``);
  - *hard* rejection (multi-hop only): ``r_f = 1 ∧ F1 > ε ∧ y ∉ C(x)`` — it progresses toward the answer but
    its outcome or its process falls short of the chosen set;

  a candidate must also score strictly below its chosen path (``total(y_l) < total(y_w)``); a path that is no
  rejection is passed over. Single-hop questions use format and easy rejections only.

Training, eqs. 15–17 (round ``k``, policy ``π_θk`` initialized from ``θ_{k-1}``; ``θ_0`` is the SFT policy,
and ``π_ref = π_θ{k-1}``)::

    L_DPO = −E log σ( β log π_θ(y_w|x)/π_ref(y_w|x) − β log π_θ(y_l|x)/π_ref(y_l|x) )      (15)
    L_SFT = −E log π_θ(y_w|x) / |y_w|                                                       (16)
    L     = L_DPO + α · L_SFT                                                               (17)

with ``β`` and ``α`` parameters. The trainer is :mod:`prorag.training.dpo` (one DPO trainer for every method:
TRL's ``DPOTrainer`` with ``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1, α]``; TRL's ``"sft"`` term is the
per-token mean NLL of the chosen responses, i.e. eq. 16 as reconstructed). Each round continues the previous
round's LoRA adapter, whose frozen copy is TRL's reference: ``π_ref = π_θ{k-1}`` as eqs. 15–17 require.
``log π(y|x)`` in eqs. 15–16 covers what the policy wrote only: the retrieved ``<Reference>`` contexts and the
engine's step closers inside a path (:attr:`ScoredPath.inserted_spans`, from the rollout's segments) are left out,
as SFT leaves them out of its labels (eq. 4) — :mod:`prorag.training.dpo` masks them per token.

One round (:func:`run_ip_dpo`): roll out ``samples`` paths per question with the current policy and the batched
engine (TeaRAG protocol, ``kag`` retriever), score them (:func:`prorag.rewards.tearag.tearag_reward`), build the
pairs, train DPO + SFT, and resample with the new policy in the next round.
"""

from __future__ import annotations

import gc
import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prorag.data.records import Question
from prorag.data.selection import select_questions
from prorag.rewards.scoring import RolloutScorer, ScoredBatch

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from prorag.agent.trajectory import Rollout
    from prorag.llm.generation import Generator
    from prorag.retrieval.base import Retriever
    from prorag.rewards.base import Reward
    from prorag.specs import AgentSpec, SamplingSpec
    from prorag.training.dpo import DPOTrainingConfig

logger = logging.getLogger(__name__)

RejectionKind = Literal["format", "easy", "hard"]
REJECTION_KINDS: tuple[RejectionKind, ...] = ("format", "easy", "hard")


@dataclass(frozen=True)
class PairRules:
    """Thresholds of eq. 14 and the rejection kinds."""

    min_outcome: float = 0.8
    """``τ_o``: the relaxed outcome condition of the chosen set (for single-hop, on ``r_o / T``)."""
    min_process: float = 0.5
    """``τ_p``: the process condition of the chosen set (multi-hop)."""
    easy_max_f1: float = 0.0
    """``ε``: an answer with F1 at most this is wrong (easy rejection); above it a path is a hard candidate."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not math.isfinite(value):
                raise ValueError(f"PairRules.{name} must be finite, got {value}")


@dataclass(frozen=True)
class ScoredPath:
    """One sampled path of a question with its reward components (see :mod:`prorag.rewards.tearag`)."""

    question_key: str
    path_id: str
    completion: str
    outcome: float
    f1: float
    format: float
    process: float
    single_hop: bool
    n_steps: int = 0
    generated_tokens: int = 0
    inserted_spans: tuple[tuple[int, int], ...] = ()
    """Character ranges of ``completion`` the engine inserted (:attr:`prorag.agent.trajectory.Rollout.inserted_spans`):
    DPO does not train on them."""

    @property
    def total(self) -> float:
        return self.outcome + self.format + self.process

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ScoredPath:
        names = {name for name in cls.__dataclass_fields__}
        values = {key: value for key, value in raw.items() if key in names}
        values["inserted_spans"] = tuple((int(start), int(end)) for start, end in raw.get("inserted_spans") or ())
        return cls(**values)


@dataclass(frozen=True)
class PreferencePair:
    """A chosen and a rejected path of the same question, with the kind of rejection."""

    question_key: str
    chosen: ScoredPath
    rejected: ScoredPath
    kind: RejectionKind

    def to_dict(self) -> dict[str, Any]:
        return {"question_key": self.question_key, "kind": self.kind, "chosen": self.chosen.to_dict(),
                "rejected": self.rejected.to_dict()}


def is_chosen(path: ScoredPath, rules: PairRules) -> bool:
    """Eq. 14: membership of the chosen set."""
    if path.format != 1.0 or path.outcome < rules.min_outcome:
        return False
    return path.single_hop or path.process >= rules.min_process


def rejection_kind(candidate: ScoredPath, rules: PairRules) -> RejectionKind | None:
    """The kind of rejection ``candidate`` (not chosen) can be, or None (hard is multi-hop only)."""
    if candidate.format != 1.0:
        return "format"
    if candidate.f1 <= rules.easy_max_f1:
        return "easy"
    if not candidate.single_hop and not is_chosen(candidate, rules):
        return "hard"
    return None


def build_question_pairs(paths: Sequence[ScoredPath], rules: PairRules) -> list[PreferencePair]:
    """The pairs of one question's sampled paths (see the module docstring); no rejected path is reused."""
    keys = {path.question_key for path in paths}
    if len(keys) > 1:
        raise ValueError(f"paths of several questions given together: {sorted(keys)}")
    chosen = sorted((path for path in paths if is_chosen(path, rules)), key=lambda path: -path.total)
    ranked = sorted((path for path in paths if not is_chosen(path, rules)), key=lambda path: path.total)
    pairs: list[PreferencePair] = []
    cursor = 0
    for winner in chosen:
        while cursor < len(ranked):
            candidate = ranked[cursor]
            cursor += 1
            kind = rejection_kind(candidate, rules)
            if kind is not None and candidate.total < winner.total:
                pairs.append(PreferencePair(winner.question_key, winner, candidate, kind))
                break
    return pairs


def build_pairs(paths: Iterable[ScoredPath], rules: PairRules) -> list[PreferencePair]:
    """Pairs of every question (grouped by ``question_key``, in first-seen order)."""
    grouped: dict[str, list[ScoredPath]] = defaultdict(list)
    for path in paths:
        grouped[path.question_key].append(path)
    return [pair for group in grouped.values() for pair in build_question_pairs(group, rules)]


def pair_counts(pairs: Sequence[PreferencePair]) -> dict[str, int]:
    """Number of pairs by rejection kind (every kind present, zeros included) and in all."""
    counts = Counter(pair.kind for pair in pairs)
    return {**{f"pairs_{kind}": counts.get(kind, 0) for kind in REJECTION_KINDS}, "pairs_total": len(pairs)}


# ------------------------------------------------------------------------------------ question mix


@dataclass(frozen=True)
class QuestionMix:
    """The sampling set of §4.3.2 "Dataset collection": NQ single-hop, HotpotQA bridge and comparison (hard),
    MuSiQue 2-, 3- and 4-hop (evenly). Counts are per group; the paper's are 4,000 / 2,500 + 2,500 / 1,000."""

    nq: int = 4000
    hotpotqa_bridge: int = 2500
    hotpotqa_comparison: int = 2500
    musique: int = 1000
    nq_sources: tuple[str, ...] = ("nq",)
    hotpotqa_sources: tuple[str, ...] = ("hotpotqa",)
    musique_sources: tuple[str, ...] = ("musique_train",)


def question_group(question: Question, mix: QuestionMix) -> str | None:
    """``nq``, ``hotpotqa_bridge``, ``hotpotqa_comparison``, ``musique_<n>hop`` or None (not in the mix)."""
    if question.source in mix.nq_sources:
        return "nq"
    if question.source in mix.hotpotqa_sources:
        kind = question.metadata.get("type")
        return f"hotpotqa_{kind}" if kind in ("bridge", "comparison") else None
    if question.source in mix.musique_sources:
        hops = re.match(r"(\d)hop", question.id)
        return f"musique_{hops.group(1)}hop" if hops and hops.group(1) in "234" else None
    return None


def select_question_mix(questions: Sequence[Question], mix: QuestionMix, *, exclude: Iterable[Question] = ()
                        ) -> list[Question]:
    """The mix, in input order within each group; MuSiQue's share is split evenly over 2/3/4 hops (a hop count
    with too few questions leaves its remainder to the others). The ``exclude`` questions (the evaluated ones)
    never enter, by key nor by question text (:func:`prorag.data.select_questions` ``exclude=``)."""
    candidates = select_questions(questions, exclude=exclude)
    groups: dict[str, list[Question]] = defaultdict(list)
    for question in candidates:
        group = question_group(question, mix)
        if group is not None:
            groups[group].append(question)
    chosen = [*groups["nq"][: mix.nq], *groups["hotpotqa_bridge"][: mix.hotpotqa_bridge],
              *groups["hotpotqa_comparison"][: mix.hotpotqa_comparison]]
    hops = ["musique_2hop", "musique_3hop", "musique_4hop"]
    remaining = mix.musique
    for position, hop in enumerate(sorted(hops, key=lambda name: len(groups[name]))):
        share = remaining // (len(hops) - position)
        taken = groups[hop][:share]
        chosen.extend(taken)
        remaining -= len(taken)
    return chosen


# ----------------------------------------------------------------------------------------- scoring


def scored_paths(rollouts: Sequence[Rollout], scored: ScoredBatch) -> list[tuple[ScoredPath, dict[str, Any]]]:
    """Each rollout's :class:`ScoredPath` and its reward components (eqs. 5–13), from a batch scored with the
    knowledge-matching reward (:class:`~prorag.rewards.tearag.KnowledgeMatchingReward`)."""
    if scored.details is None or len(scored.details) != len(rollouts):
        raise ValueError("IP-DPO pairs need the knowledge-matching reward's per-path details (reward kind "
                         "knowledge_matching)")
    paths = []
    for rollout, reward in zip(rollouts, scored.details, strict=True):
        path = ScoredPath(question_key=rollout.question_key,
                          path_id=f"{rollout.question_key}#{rollout.sample_index}", completion=rollout.completion,
                          outcome=reward["outcome"], f1=reward["f1"], format=reward["format"],
                          process=reward["process"], single_hop=reward["single_hop"], n_steps=reward["n_steps"],
                          generated_tokens=rollout.generated_tokens, inserted_spans=tuple(rollout.inserted_spans))
        paths.append((path, reward))
    return paths


def preference_records(pairs: Sequence[PreferencePair], messages: Callable[[str], list[dict[str, str]]],
                       questions: Mapping[str, str], prefix: str) -> list[dict[str, Any]]:
    """:func:`prorag.training.dpo.preference_rows` input: the chat prompt, the engine's initial prefix as the
    transcript, the two paths after it, and the ranges of each the engine inserted (the ``<Reference>`` contexts
    and step closers), which DPO does not train on — as SFT masks them (eq. 4)."""
    records = []
    for pair in pairs:
        for side in (pair.chosen, pair.rejected):
            if not side.completion.startswith(prefix):
                raise ValueError(f"path {side.path_id} does not start with the engine's initial prefix {prefix!r}")
        records.append({"messages": messages(questions[pair.question_key]), "transcript": prefix,
                        "chosen": pair.chosen.completion[len(prefix):],
                        "rejected": pair.rejected.completion[len(prefix):], "kind": pair.kind,
                        "chosen_inserted": _after(pair.chosen.inserted_spans, len(prefix)),
                        "rejected_inserted": _after(pair.rejected.inserted_spans, len(prefix))})
    return records


def _after(spans: Sequence[tuple[int, int]], offset: int) -> list[list[int]]:
    """``spans`` of a completion as ranges of its text after the first ``offset`` characters."""
    return [[max(start, offset) - offset, end - offset] for start, end in spans if end > offset]


# -------------------------------------------------------------------------------------------- rounds


@dataclass(frozen=True)
class IPDPOSettings:
    """Everything one IP-DPO run needs besides the policy, the questions and the retriever."""

    rounds: int = 3
    samples_per_question: int = 8
    rules: PairRules = field(default_factory=PairRules)
    top_k: int = 5

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.samples_per_question < 2 or self.top_k < 1:
            raise ValueError("rounds >= 1, samples_per_question >= 2 and top_k >= 1 are required")


@dataclass
class RoundResult:
    """What one round produced: its adapter (None if no pair was found and nothing was trained) and metrics."""

    round: int
    adapter: str | None
    metrics: dict[str, float]
    pairs: list[dict[str, Any]]
    paths: list[dict[str, Any]]
    log_history: list[dict[str, Any]]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def candidate_counts(paths: Sequence[ScoredPath], rules: PairRules) -> dict[str, int]:
    """The chosen set's size and the paths that could be each kind of rejection, before pairing.

    They say why a kind has no pair: the traversal gives each chosen path the lowest-ranked rejection of its
    question, so a hard candidate (ranked above the format and easy ones) is paired only on a question with more
    chosen paths than rejections ranked below it: a policy right on under half its samples of a question gets none."""
    kinds = Counter(rejection_kind(path, rules) for path in paths if not is_chosen(path, rules))
    counts = {f"candidates_{kind}": kinds[kind] for kind in REJECTION_KINDS}
    return {"chosen_set": sum(is_chosen(path, rules) for path in paths), **counts}


def round_metrics(scored: Sequence[tuple[ScoredPath, dict[str, Any]]], pairs: Sequence[PreferencePair],
                  rules: PairRules) -> dict[str, float]:
    """Pair counts by kind, the candidates they came from (:func:`candidate_counts`), mean reward components,
    mean steps and generated tokens of one round's samples."""
    rewards = [reward for _, reward in scored]
    metrics: dict[str, float] = {key: float(value) for key, value in pair_counts(pairs).items()}
    metrics.update({key: float(value) for key, value in candidate_counts([path for path, _ in scored], rules).items()})
    for key in ("outcome", "f1", "format", "process", "consistency", "subquery_match", "context_match",
                "summary_match", "total"):
        metrics[f"reward_{key}"] = _mean([float(reward[key]) for reward in rewards])
    multi = [reward for reward in rewards if not reward["single_hop"]]
    metrics["reward_process_multi_hop"] = _mean([float(reward["process"]) for reward in multi])
    metrics["mean_steps"] = _mean([float(path.n_steps) for path, _ in scored if path.format == 1.0])
    metrics["mean_output_tokens"] = _mean([float(path.generated_tokens) for path, _ in scored])
    metrics["format_rate"] = _mean([path.format for path, _ in scored])
    metrics["chosen_paths"] = float(len({pair.chosen.path_id for pair in pairs}))
    metrics["samples"] = float(len(scored))
    return metrics


def run_ip_dpo(model: str, sft_adapter: str, questions: Sequence[Question], retriever: Retriever,
               agent: AgentSpec, sampling: SamplingSpec, reward: Reward, settings: IPDPOSettings,
               dpo: DPOTrainingConfig, output_dir: str | Path, *, generator_factory: Callable[[str], Generator],
               callbacks: Callable[[int], list[TrainerCallback]] | None = None,
               train_dpo: Callable[..., tuple[Path, list[dict[str, Any]]]] | None = None) -> list[RoundResult]:
    """Rounds of sample → score → pair → DPO + SFT (module docstring); round ``k`` starts from round ``k-1``'s
    adapter (the SFT adapter first). A round without pairs trains nothing and keeps the adapter.

    ``generator_factory(adapter_dir)`` builds the sampling policy (the tearag node's: the composition root's
    policy with the round's adapter, :func:`prorag.assembly.build_policy`). ``train_dpo(model, rows, output_dir,
    config, *, callbacks, round_index)`` trains a round (default: :func:`prorag.training.dpo.train_dpo_lora` in this
    process; the tearag node passes a launcher under ``launch.mode: accelerate``)."""
    from prorag.agent.runner import build_engine
    from prorag.llm.registry import load_tokenizer
    from prorag.protocol.registry import build_adapter
    from prorag.training.dpo import preference_rows, train_dpo_lora

    scorer = RolloutScorer(reward, questions={question.key: question for question in questions})
    texts = {question.key: question.question for question in questions}
    adapter_view = build_adapter(agent.protocol, **agent.protocol_options())
    tokenizer = load_tokenizer(model)
    current = sft_adapter
    results: list[RoundResult] = []
    for round_index in range(1, settings.rounds + 1):
        generator = generator_factory(current)
        engine = build_engine(agent, generator, retriever, top_k=settings.top_k,
                              sampling=sampling.model_copy(update={"seed": sampling.seed + round_index}),
                              method=f"tearag_ip_dpo_round{round_index}")
        rollouts = engine.run(questions, samples=settings.samples_per_question)
        scored = scored_paths(rollouts, scorer.score(rollouts, generator))
        del engine, generator
        gc.collect()
        pairs = build_pairs([path for path, _ in scored], settings.rules)
        metrics = round_metrics(scored, pairs, settings.rules)
        logger.info("IP-DPO round %d: %d samples, %s, mean total reward %.3f", round_index, len(scored),
                    {key: int(value) for key, value in metrics.items() if key.startswith(("pairs_", "chosen_set",
                                                                                          "candidates_"))},
                    metrics["reward_total"])
        history: list[dict[str, Any]] = []
        trained: str | None = None
        if pairs:
            rows = preference_rows(tokenizer, preference_records(pairs, adapter_view.messages, texts,
                                                                 adapter_view.initial_prefix()))
            config = dpo.model_copy(update={"init_adapter": current, "append_eos": True,
                                            "seed": dpo.seed + round_index})
            round_callbacks = callbacks(round_index) if callbacks else None
            if train_dpo is None:
                adapter_dir, history = train_dpo_lora(model, rows, Path(output_dir) / f"round_{round_index}", config,
                                                      callbacks=round_callbacks)
            else:
                adapter_dir, history = train_dpo(model, rows, Path(output_dir) / f"round_{round_index}", config,
                                                 callbacks=round_callbacks, round_index=round_index)
            trained = current = str(adapter_dir)
        results.append(RoundResult(round_index, trained, metrics, [pair.to_dict() for pair in pairs],
                                   [{**path.to_dict(), "reward": reward} for path, reward in scored], history))
    return results
