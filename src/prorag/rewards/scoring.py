"""Score a batch of agent rollouts with any registered reward: its components per rollout and the batch statistics.

:class:`RolloutScorer` is the one loop every consumer uses — the GRPO rollout function, reward judging, DAPO
refill, probes and any other training backend. It runs what the reward needs (:class:`~prorag.rewards.base.
RewardNeeds`): over-/under-search detection re-asks search queries to the *current* policy (the generator passed to
:meth:`RolloutScorer.score`) and judges non-search steps; an unknown verdict (judge timeout, garbage, error) never
counts as optimal, so a judge outage lowers ``N_corr`` and shows up as ``unknown_rate`` — it cannot inflate a
reward.

Statistics are returned as ``(numerator, denominator)`` pairs so that several processes' batches can be summed
before the ratio is taken (OSR and USR are ratios of sums, eq. 2). Whenever detection ran, ``bonus_fired`` is the
share of rollouts whose eq. 1 bonus gate ``A·F·N_corr`` is non-zero, computed the same way whatever the reward (a
Search-R1 run with ``judge_for_metrics`` reports how often HiPRAG's bonus *would* have fired).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prorag.judges.detection import StepVerdicts, detect
from prorag.metrics.qa import cover_exact_match
from prorag.metrics.search import search_behaviour
from prorag.rewards.base import Embed, Reward, ScoringContext
from prorag.rewards.hiprag import process_bonus_fires

if TYPE_CHECKING:
    from prorag.agent.trajectory import Rollout
    from prorag.data.records import Question
    from prorag.judges.base import Judge
    from prorag.llm.generation import Generator
    from prorag.rewards.hiprag import OptimalCount

Ratio = tuple[float, float]
"""A statistic as ``(numerator, denominator)``."""


@dataclass
class ScoredBatch:
    """Per-rollout reward components (``components[name][i]``) and the batch statistics."""

    components: dict[str, list[float]]
    totals: list[float]
    stats: dict[str, Ratio] = field(default_factory=dict)
    verdicts: list[StepVerdicts] | None = None
    optimal: list[OptimalCount | None] = field(default_factory=list)
    """Eq. 1 rewards: each rollout's optimal/over/under/unknown step counts (None where not counted)."""
    bonus_fired: list[bool | None] | None = None
    """Per rollout, whether eq. 1's process-bonus gate ``A·F·N_corr`` is non-zero, whatever ``λp``
    (:func:`~prorag.rewards.hiprag.process_bonus_fires`); None when detection did not run."""
    answer_correct: list[bool | None] | None = None
    """Rewards with an answer judge: each rollout's answer correctness (None: unknown verdict)."""
    stage: int | None = None
    """Staged rewards: the stage the batch was scored in."""
    details: list[dict[str, Any]] | None = None
    """Whatever else the reward reports per rollout (:attr:`~prorag.rewards.base.RewardScores.details`)."""


class RolloutScorer:
    """Reward a batch of rollouts with one registered reward (module docstring).

    ``judge_for_metrics`` runs detection even when the reward does not need it, to report OSR/USR. ``questions``
    (by key) give the rewards that need gold evidence their questions; more can be added with :meth:`know`.
    """

    def __init__(self, reward: Reward, *, over_judge: Judge | None = None, under_judge: Judge | None = None,
                 embed: Embed | None = None, answer_judge: Judge | None = None, judge_for_metrics: bool = False,
                 questions: Mapping[str, Question] | None = None) -> None:
        needs = reward.needs
        self.reward = reward
        self.detects = needs.detection or judge_for_metrics
        if self.detects and (over_judge is None or under_judge is None):
            raise ValueError(f"reward {reward.kind!r} needs an over-search and an under-search judge")
        if needs.embedder and embed is None:
            raise ValueError(f"reward {reward.kind!r} needs embed (a query embedder)")
        self.over_judge = over_judge
        self.under_judge = under_judge
        self.embed = embed
        self.answer_judge = answer_judge
        self.questions: dict[str, Question] = dict(questions or {})

    @property
    def components(self) -> tuple[str, ...]:
        return self.reward.components

    def know(self, questions: Sequence[Question]) -> None:
        """Add questions (with their gold evidence) the scorer can look rollouts up in."""
        self.questions.update((question.key, question) for question in questions)

    def score(self, rollouts: Sequence[Rollout], policy: Generator, step: int | None = None, *,
              progress: bool = False) -> ScoredBatch:
        """Score ``rollouts``; ``policy`` answers the re-asked queries; ``step`` is the training step (None:
        evaluation, scored as the reward's final stage); ``progress``: a bar over the judged steps."""
        reward = self.reward
        verdicts: list[StepVerdicts] | None = None
        if self.detects:  # an empty batch still reports the same statistics (ranks must agree)
            assert self.over_judge is not None and self.under_judge is not None
            verdicts = detect(rollouts, policy, self.over_judge, self.under_judge,
                              reask_max_new_tokens=reward.settings.reask_max_new_tokens,
                              mode=reward.mode(), reask=reward.settings.reask,  # type: ignore[arg-type]
                              under_search_input=reward.settings.under_search_input,
                              progress=progress) if rollouts else []
        if reward.needs.evidence:
            missing = sorted({rollout.question_key for rollout in rollouts} - set(self.questions))
            if missing:
                raise KeyError(f"reward {reward.kind!r} needs the gold evidence of questions it was not given: "
                               f"{missing[:5]}")
        context = ScoringContext(step=step, verdicts=verdicts, embed=self.embed, answer_judge=self.answer_judge,
                                 questions=self.questions)
        scores = reward.score(rollouts, context)
        if len(scores.totals) != len(rollouts):
            raise ValueError(f"reward {reward.kind!r} scored {len(scores.totals)} of {len(rollouts)} rollouts")
        optimal = scores.optimal if len(scores.optimal) == len(rollouts) else [None] * len(rollouts)
        bonus = None if verdicts is None else [process_bonus_fires(rollout, verdicts[index], reward.mode())
                                               for index, rollout in enumerate(rollouts)]
        stats = batch_stats(rollouts, verdicts, bonus_fired=bonus, answer_correct=scores.answer_correct,
                            stage=scores.stage)
        return ScoredBatch(scores.components, scores.totals, stats, verdicts, optimal, bonus, scores.answer_correct,
                           scores.stage, scores.details)


def batch_stats(rollouts: Sequence[Rollout], verdicts: Sequence[StepVerdicts] | None, *,
                bonus_fired: Sequence[bool | None] | None = None,
                answer_correct: Sequence[bool | None] | None = None, stage: int | None = None) -> dict[str, Ratio]:
    """Format rate, CEM, steps, search ratio, retrievals, tokens and — with verdicts — OSR, USR, unknown rate.

    Per-rollout extras, each aligned with ``rollouts``: ``bonus_fired`` gives ``bonus_fired`` (the share of
    rollouts whose eq. 1 bonus gate is open, :attr:`ScoredBatch.bonus_fired`); ``answer_correct`` and ``stage``
    give ``answer_correct``, ``answer_unknown_rate`` and ``stage``.
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
