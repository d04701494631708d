"""Score a batch of agent rollouts for RL: the reward method's components per rollout, and batch statistics.

Methods (``RewardSettings.method``):

* ``hiprag`` — HiPRAG eq. 1 with over- and under-search detection (``λf``, ``λp`` from the settings);
* ``search_r1`` — the outcome + format baseline: eq. 1 with ``λp = 0`` (no detection needed);
* ``over_only`` / ``under_only`` — eq. 1 whose ``N_corr`` counts only one kind of suboptimal step (the paper's
  ablations);
* ``multistage`` — "Learning When to Search" eq. 12 (answer + search + format) with stage 1 before
  ``stage_switch_step`` and stage 2 from it on. Its format reward checks its own protocol, so roll out with the
  ``multistage`` protocol.

Detection re-asks search queries to the *current* policy (the generator passed to :meth:`RolloutScorer.score`)
and judges non-search steps; an unknown verdict (judge timeout, garbage, error) never counts as optimal, so a
judge outage lowers ``N_corr`` and shows up as ``unknown_rate`` — it cannot inflate a reward.

Statistics are returned as ``(numerator, denominator)`` pairs so that several processes' batches can be summed
before the ratio is taken (OSR and USR are ratios of sums, eq. 2). Whenever detection ran, ``bonus_fired`` is the
share of rollouts whose eq. 1 bonus gate ``A·F·N_corr`` is non-zero, computed the same way whatever ``λp`` (a
Search-R1 run with ``judge_for_metrics`` reports how often the bonus *would* have fired).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, get_args

from prorag.judges.detection import StepVerdicts, detect
from prorag.metrics.qa import cover_exact_match
from prorag.metrics.search import search_behaviour
from prorag.rewards.hiprag import process_bonus_fires, rollout_reward
from prorag.rewards.multistage import multistage_reward

if TYPE_CHECKING:
    import numpy as np

    from prorag.agent.trajectory import Rollout
    from prorag.judges.base import Judge
    from prorag.llm.generation import Generator
    from prorag.retrieval.index import RetrievalIndex
    from prorag.rewards.hiprag import OptimalCount
    from prorag.specs import RewardSpec

RewardMethod = Literal["hiprag", "search_r1", "over_only", "under_only", "multistage"]
REWARD_METHODS: Final[tuple[str, ...]] = get_args(RewardMethod)
HIPRAG_COMPONENTS: Final = ("outcome", "format", "process")
MULTISTAGE_COMPONENTS: Final = ("answer", "search", "format")

logger = logging.getLogger(__name__)

Ratio = tuple[float, float]
"""A statistic as ``(numerator, denominator)``."""


@dataclass(frozen=True)
class RewardSettings:
    """Which reward to train with and its coefficients (the paper's defaults)."""

    method: RewardMethod = "hiprag"
    lambda_f: float = 0.2
    lambda_p: float = 0.4
    beta: float = 0.3
    """Multi-stage: the retrieval penalty of the stage-2 answer reward."""
    stage_switch_step: int = 1
    """Multi-stage: the first training step of stage 2 (0: stage 2 only, the paper's "w/o stage one" ablation)."""
    judge_for_metrics: bool = False
    """Run detection even when the reward does not need it (search_r1, multistage), to log OSR/USR."""
    reask_max_new_tokens: int = 48

    def __post_init__(self) -> None:
        if self.method not in REWARD_METHODS:
            raise ValueError(f"reward method must be one of {REWARD_METHODS}, got {self.method!r}")
        if not 0 <= self.lambda_f <= 1 or self.lambda_p < 0:
            raise ValueError(f"need 0 <= lambda_f <= 1 and lambda_p >= 0, got {self.lambda_f}, {self.lambda_p}")

    @classmethod
    def from_spec(cls, spec: RewardSpec, *, judge_for_metrics: bool = False) -> RewardSettings:
        """The settings of the shared ``reward`` block (:class:`prorag.specs.RewardSpec`)."""
        return cls(method=spec.method, lambda_f=spec.lambda_f, lambda_p=spec.lambda_p, beta=spec.beta,
                   stage_switch_step=spec.stage_switch_step, judge_for_metrics=judge_for_metrics,
                   reask_max_new_tokens=spec.reask_max_new_tokens)

    def stage(self, step: int) -> int:
        """The multi-stage stage of a training step: 1 before ``stage_switch_step``, 2 from it on."""
        return 1 if step < self.stage_switch_step else 2

    @property
    def effective_lambda_p(self) -> float:
        return 0.0 if self.method == "search_r1" else self.lambda_p

    @property
    def detection_mode(self) -> Literal["both", "over_only", "under_only"]:
        return self.method if self.method in ("over_only", "under_only") else "both"  # type: ignore[return-value]

    @property
    def needs_detection(self) -> bool:
        hierarchical = self.method in ("hiprag", "over_only", "under_only") and self.effective_lambda_p > 0
        return hierarchical or self.judge_for_metrics

    @property
    def components(self) -> tuple[str, ...]:
        return MULTISTAGE_COMPONENTS if self.method == "multistage" else HIPRAG_COMPONENTS


@dataclass
class ScoredBatch:
    """Per-rollout reward components (``components[name][i]``) and the batch statistics."""

    components: dict[str, list[float]]
    totals: list[float]
    stats: dict[str, Ratio] = field(default_factory=dict)
    verdicts: list[StepVerdicts] | None = None
    optimal: list[OptimalCount | None] = field(default_factory=list)
    """Eq. 1 methods: each rollout's optimal/over/under/unknown step counts (None where not counted)."""
    bonus_fired: list[bool | None] | None = None
    """Per rollout, whether eq. 1's process-bonus gate ``A·F·N_corr`` is non-zero, whatever ``λp``
    (:func:`~prorag.rewards.hiprag.process_bonus_fires`); None when detection did not run."""
    answer_correct: list[bool | None] | None = None
    """Multi-stage: each rollout's answer correctness (None: unknown verdict); None for other methods."""
    stage: int | None = None
    """Multi-stage: the stage the batch was scored in; None for other methods."""


class RolloutScorer:
    """Reward a batch of rollouts with one method (see the module docstring)."""

    def __init__(self, settings: RewardSettings, over_judge: Judge | None = None, under_judge: Judge | None = None,
                 embed: Callable[[Sequence[str]], np.ndarray] | None = None, answer_judge: Judge | None = None,
                 ) -> None:
        if settings.needs_detection and (over_judge is None or under_judge is None):
            raise ValueError(f"reward method {settings.method!r} needs an over-search and an under-search judge")
        if settings.method == "multistage" and embed is None:
            raise ValueError("reward method 'multistage' needs embed (its search reward compares query embeddings)")
        self.settings = settings
        self.over_judge = over_judge
        self.under_judge = under_judge
        self.embed = embed
        self.answer_judge = answer_judge
        """Multi-stage answer correctness (LasJ); None: cover exact match."""
        if settings.method == "multistage" and settings.stage_switch_step == 0:
            logger.warning("reward.stage_switch_step is 0: stage 2 from the first step (the paper's 'w/o stage one' "
                           "ablation)")

    def score(self, rollouts: Sequence[Rollout], policy: Generator, step: int = 0) -> ScoredBatch:
        """Score ``rollouts``; ``policy`` answers the re-asked queries; ``step`` picks the multi-stage stage."""
        settings = self.settings
        verdicts: list[StepVerdicts] | None = None
        if settings.needs_detection:  # an empty batch still reports the same statistics (ranks must agree)
            assert self.over_judge is not None and self.under_judge is not None
            verdicts = detect(rollouts, policy, self.over_judge, self.under_judge,
                              reask_max_new_tokens=settings.reask_max_new_tokens,
                              mode=settings.detection_mode) if rollouts else []
        components: dict[str, list[float]] = {name: [] for name in settings.components}
        totals: list[float] = []
        optimal: list[OptimalCount | None] = []
        stage = settings.stage(step)
        correctness = self.answers_correct(rollouts) if settings.method == "multistage" else []
        for index, rollout in enumerate(rollouts):
            if settings.method == "multistage":
                correct = correctness[index] is True  # unknown (None) is never rewarded as correct
                result = multistage_reward(rollout.completion, correct, stage, beta=settings.beta, embed=self.embed,
                                           queries=rollout.queries, retrieval_count=rollout.retrieval_count)
                values = {"answer": result.answer, "search": result.search, "format": result.format}
                total = result.total
                optimal.append(None)
            else:
                scored = rollout_reward(rollout, None if verdicts is None else verdicts[index],
                                        lambda_f=settings.lambda_f, lambda_p=settings.effective_lambda_p,
                                        mode=settings.detection_mode)
                reward = scored.reward
                values = {"outcome": reward.outcome, "format": reward.format, "process": reward.process}
                total = reward.total
                optimal.append(scored.optimal)
            for name in settings.components:
                components[name].append(float(values[name]))
            totals.append(float(total))
        bonus = None if verdicts is None else [process_bonus_fires(rollout, verdicts[index], settings.detection_mode)
                                               for index, rollout in enumerate(rollouts)]
        multistage = settings.method == "multistage"
        answer_correct = correctness if multistage else None
        batch_stage = stage if multistage else None
        stats = batch_stats(rollouts, verdicts, bonus_fired=bonus, answer_correct=answer_correct, stage=batch_stage)
        return ScoredBatch(components, totals, stats, verdicts, optimal, bonus, answer_correct, batch_stage)

    def answers_correct(self, rollouts: Sequence[Rollout]) -> list[bool | None]:
        """Each rollout's answer judged against its golden answers: the answer judge's verdict (None: unknown, and
        a rollout without an answer is incorrect without asking), or cover exact match without a judge."""
        if self.answer_judge is None:
            return [bool(cover_exact_match(rollout.answer, rollout.golden_answers)) for rollout in rollouts]
        asked = [index for index, rollout in enumerate(rollouts) if rollout.answer and rollout.answer.strip()]
        verdicts = self.answer_judge.answer_correct(
            [(rollouts[index].question, tuple(rollouts[index].golden_answers), str(rollouts[index].answer))
             for index in asked]) if asked else []
        correct: list[bool | None] = [False] * len(rollouts)
        for index, verdict in zip(asked, verdicts, strict=True):
            correct[index] = verdict.value
        return correct


def build_scorer(spec: RewardSpec, index: RetrievalIndex, *, judge_for_metrics: bool = False) -> RolloutScorer:
    """The scorer of the shared ``reward`` block — the one RL trains with and reward judging evaluates with: its
    judges (the reference judge grounds with ``spec.judge_retriever`` over ``index``), and for the multi-stage
    reward the index's query embedder."""
    from prorag.judges.factory import build_judge

    settings = RewardSettings.from_spec(spec, judge_for_metrics=judge_for_metrics)
    over_judge = under_judge = None
    if settings.needs_detection:
        retriever = index.retriever(spec.judge_retriever)
        over_judge, under_judge = (build_judge(**judge.model_dump(), retriever=retriever)
                                   for judge in (spec.over_search_judge, spec.under_search_judge))
    embed = index.embedder.encode_queries if spec.method == "multistage" else None
    answer_judge = None
    if spec.method == "multistage" and spec.answer_judge.kind == "llm":
        answer_judge = build_judge(**spec.answer_judge.model_dump())
    return RolloutScorer(settings, over_judge, under_judge, embed=embed, answer_judge=answer_judge)


def batch_stats(rollouts: Sequence[Rollout], verdicts: Sequence[StepVerdicts] | None, *,
                bonus_fired: Sequence[bool | None] | None = None,
                answer_correct: Sequence[bool | None] | None = None, stage: int | None = None) -> dict[str, Ratio]:
    """Format rate, CEM, steps, search ratio, retrievals, tokens and — with verdicts — OSR, USR, unknown rate.

    Per-rollout extras, each aligned with ``rollouts``: ``bonus_fired`` gives ``bonus_fired`` (the share of
    rollouts whose eq. 1 bonus gate is open, :attr:`ScoredBatch.bonus_fired`); ``answer_correct`` and ``stage``
    give the multi-stage ``answer_correct``, ``answer_unknown_rate`` and ``stage``.
    """
    count = float(len(rollouts))
    behaviour = search_behaviour(verdicts if verdicts is not None else rollouts)
    stats: dict[str, Ratio] = {
        "format_rate": (float(sum(rollout.format_ok for rollout in rollouts)), count),
        "cem": (float(sum(cover_exact_match(rollout.answer, rollout.golden_answers) for rollout in rollouts)),
                count),
        "retrieval_count": (float(sum(rollout.retrieval_count for rollout in rollouts)), count),
        "steps": (float(sum(rollout.n_steps for rollout in rollouts if rollout.format_ok)),
                  float(sum(rollout.format_ok for rollout in rollouts))),
        "generated_tokens": (float(sum(rollout.generated_tokens for rollout in rollouts)), count),
        "context_tokens": (float(sum(rollout.context_tokens for rollout in rollouts)), count),
        "search_ratio": (float(behaviour.search_steps), float(behaviour.search_steps + behaviour.non_search_steps)),
    }
    if verdicts is not None:
        stats["osr"] = (float(behaviour.over_search), float(behaviour.over_known))
        stats["usr"] = (float(behaviour.under_search), float(behaviour.under_known))
        unknown = behaviour.over_unknown + behaviour.under_unknown
        stats["unknown_rate"] = (float(unknown), float(unknown + behaviour.over_known + behaviour.under_known))
    for name, values in (("bonus_fired", bonus_fired), ("answer_correct", answer_correct)):
        if values is not None and len(values) != len(rollouts):
            raise ValueError(f"{len(values)} {name} values for {len(rollouts)} rollouts")
    if bonus_fired is not None:
        stats["bonus_fired"] = (float(sum(value is True for value in bonus_fired)), count)
    if answer_correct is not None:
        stats["answer_correct"] = (float(sum(value is True for value in answer_correct)), count)
        stats["answer_unknown_rate"] = (float(sum(value is None for value in answer_correct)), count)
    if stage is not None:
        stats["stage"] = (float(stage) * count, count)
    return stats
