"""HiPRAG's hierarchical process reward (paper §3.3, eq. 1) and the Search-R1 outcome + format reward.

    R(T) = A(T)·(1 − λf) + λf·F(T) + λp·A(T)·F(T)·N_corr(T)/N(T)

``A`` is answer correctness (cover exact match in the paper), ``F`` the format check, ``N`` the number of
steps, ``N_corr`` the number of optimal steps: search steps that are not over-search plus non-search steps
that are not under-search (the §3.2 detectors). With ``λp = 0`` this is the Search-R1 outcome + format reward
(:func:`search_r1_reward`); with ``A = F = 1`` it is ``1 + λp·N_corr/N``.

Unknown verdicts (a judge that failed or answered unparsably) are **not** optimal: they never raise the
reward, and :func:`count_optimal` reports how many there were. The authors' released code differs from the
paper on two points that we do not copy: it counts judge failures as optimal steps, and it computes the bonus
over search steps only; we follow eq. 1 — every step counts in ``N`` and in ``N_corr``. In the ablation modes
(Table 4, "over-search only" / "under-search only") the steps of the kind that is not checked count as optimal,
so the bonus measures only the checked detector.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from pydantic import Field

from prorag.metrics.qa import cover_exact_match
from prorag.rewards.base import Reward, RewardNeeds, RewardScores, RewardSettings, ScoringContext

if TYPE_CHECKING:
    from prorag.judges.detection import StepVerdict, StepVerdicts

COUNT_MODES: Final = ("both", "over_only", "under_only")


@dataclass(frozen=True)
class RewardBreakdown:
    """``total = outcome + format + process`` and the inputs they came from."""

    total: float
    outcome: float  # A·(1 − λf)
    format: float  # λf·F
    process: float  # λp·A·F·N_corr/N
    answer_correct: float
    format_ok: float
    n_steps: int
    n_optimal: int
    lambda_f: float
    lambda_p: float


@dataclass(frozen=True)
class OptimalCount:
    """``N_corr`` of one trajectory and what went into it."""

    n_optimal: int
    n_steps: int
    n_search: int
    n_non_search: int
    n_over: int
    n_under: int
    n_unknown: int
    mode: str


def _unit(value: bool | float, name: str) -> float:
    """A bool or a number in [0, 1] (NumPy scalars included) as a float."""
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        raise ValueError(f"{name} must be a bool or a number in [0, 1], got {value!r}")
    number = float(value)
    if math.isnan(number) or not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must be a bool or a number in [0, 1], got {value!r}")
    return number


def _count(value: int, name: str) -> int:
    """An integer (NumPy integers included, bools and floats refused)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def hierarchical_reward(answer_correct: bool | float, format_ok: bool | float, n_steps: int, n_optimal: int,
                        lambda_f: float = 0.2, lambda_p: float = 0.4) -> RewardBreakdown:
    """Eq. 1: ``R = A(1−λf) + λf·F + λp·A·F·N_corr/N``.

    ``A`` and ``F`` are bools or numbers in [0, 1]; ``λf ∈ [0, 1]``, ``λp ≥ 0``. When the process term can be
    non-zero (``F > 0`` and ``λp > 0``) the step counts must satisfy ``N ≥ 1`` and ``0 ≤ N_corr ≤ N``; when
    ``F = 0`` (e.g. ``check_format`` gave ``(0, −1)``) or ``λp = 0`` the process term is 0 whatever the counts.
    """
    a = _unit(answer_correct, "answer_correct")
    f = _unit(format_ok, "format_ok")
    if not 0.0 <= lambda_f <= 1.0:
        raise ValueError(f"lambda_f must be in [0, 1], got {lambda_f}")
    if not 0.0 <= lambda_p <= 1.0:  # above 1 the process bonus outweighs the answer itself (paper: 0.4)
        raise ValueError(f"lambda_p must be in [0, 1], got {lambda_p}")
    n_steps, n_optimal = _count(n_steps, "n_steps"), _count(n_optimal, "n_optimal")
    process = 0.0
    if f > 0.0 and lambda_p > 0.0:
        if n_steps < 1:
            raise ValueError(f"a well-formed trajectory has n_steps >= 1, got {n_steps}")
        if not 0 <= n_optimal <= n_steps:
            raise ValueError(f"need 0 <= n_optimal <= n_steps, got n_optimal={n_optimal}, n_steps={n_steps}")
        process = lambda_p * a * f * n_optimal / n_steps
    outcome = a * (1.0 - lambda_f)
    format_term = lambda_f * f
    return RewardBreakdown(total=outcome + format_term + process, outcome=outcome, format=format_term,
                           process=process, answer_correct=a, format_ok=f, n_steps=n_steps, n_optimal=n_optimal,
                           lambda_f=lambda_f, lambda_p=lambda_p)


def search_r1_reward(answer_correct: bool | float, format_ok: bool | float,
                     lambda_f: float = 0.2) -> RewardBreakdown:
    """The Search-R1 outcome + format reward ``A(1−λf) + λf·F``: eq. 1 with ``λp = 0``."""
    return hierarchical_reward(answer_correct, format_ok, n_steps=0, n_optimal=0, lambda_f=lambda_f, lambda_p=0.0)


def count_optimal(step_verdicts: StepVerdicts | Iterable[StepVerdict], mode: str = "both") -> OptimalCount:
    """``N_corr``: non-over-search search steps + non-under-search non-search steps.

    ``mode="over_only"`` counts every non-search step as optimal, ``"under_only"`` every search step. A checked
    step with an unknown verdict is not optimal (and is counted in ``n_unknown``). A step the mode needs but
    that detection did not check (detection ran in another mode) is an error.
    """
    if mode not in COUNT_MODES:
        raise ValueError(f"mode must be one of {COUNT_MODES}, got {mode!r}")
    steps: list[Any] = list(getattr(step_verdicts, "steps", step_verdicts))
    n_optimal = n_over = n_under = n_unknown = n_search = 0
    for step in steps:
        if step.kind == "search":
            n_search += 1
            needed = mode != "under_only"
            verdict = step.over
        elif step.kind == "non_search":
            needed = mode != "over_only"
            verdict = step.under
        else:
            raise ValueError(f"unknown step kind {step.kind!r}")
        if not needed:
            n_optimal += 1
            continue
        if not step.checked:
            raise ValueError(f"step {step.step_index} ({step.kind}) was not checked by detection; "
                             f"run detection with a mode that covers mode={mode!r}")
        if verdict is None:
            n_unknown += 1
        elif verdict:
            if step.kind == "search":
                n_over += 1
            else:
                n_under += 1
        else:
            n_optimal += 1
    return OptimalCount(n_optimal=n_optimal, n_steps=len(steps), n_search=n_search,
                        n_non_search=len(steps) - n_search, n_over=n_over, n_under=n_under, n_unknown=n_unknown,
                        mode=mode)


@dataclass(frozen=True)
class RolloutReward:
    """The reward of one rollout with the step count it used."""

    reward: RewardBreakdown
    optimal: OptimalCount | None


def rollout_reward(rollout: Any, step_verdicts: StepVerdicts | None, *, lambda_f: float = 0.2,
                   lambda_p: float = 0.4, mode: str = "both") -> RolloutReward:
    """Eq. 1 for a :class:`~prorag.agent.trajectory.Rollout`: ``A`` = cover exact match of its answer,
    ``F`` = its format check, ``N`` = its step count, ``N_corr`` from ``step_verdicts`` (needed only when the
    process term can be non-zero: format passed and ``λp > 0``)."""
    answer = cover_exact_match(rollout.answer, rollout.golden_answers)
    format_ok = bool(rollout.format_ok)
    if not format_ok or lambda_p == 0.0:
        return RolloutReward(hierarchical_reward(answer, format_ok, rollout.n_steps, 0, lambda_f, lambda_p), None)
    if step_verdicts is None:
        raise ValueError("a well-formed rollout needs its step verdicts when lambda_p > 0")
    optimal = count_optimal(step_verdicts, mode)
    if optimal.n_steps != rollout.n_steps:
        raise ValueError(f"{optimal.n_steps} step verdicts for a rollout of {rollout.n_steps} steps")
    return RolloutReward(hierarchical_reward(answer, format_ok, rollout.n_steps, optimal.n_optimal, lambda_f,
                                             lambda_p), optimal)


def process_bonus_fires(rollout: Any, step_verdicts: StepVerdicts | None, mode: str = "both") -> bool | None:
    """Whether eq. 1's process bonus is non-zero for a rollout, whatever ``λp``: ``A·F·N_corr > 0``.

    The same gate for every ``λp``, so a ``λp = 0`` run (Search-R1) reports how often the bonus *would* have fired.
    False when the answer is wrong or the format failed (no verdicts needed); None when the gate depends on
    ``N_corr`` and there are no verdicts (detection did not run). ``N_corr`` is counted over ``step_verdicts``
    (:func:`count_optimal`); unlike :func:`rollout_reward` the step count is not checked against the rollout's,
    so a statistic never stops a λp = 0 training run.
    """
    if not cover_exact_match(rollout.answer, rollout.golden_answers) or not rollout.format_ok:
        return False
    if step_verdicts is None:
        return None
    return count_optimal(step_verdicts, mode).n_optimal > 0


# ------------------------------------------------------------------------------------------ the plug-ins


class HiPRAGSettings(RewardSettings):
    """HiPRAG's reward (eq. 1) and its ablations (``check``: which suboptimal steps ``N_corr`` counts, Table 4)."""

    kind: Literal["hiprag"] = "hiprag"
    lambda_f: float = Field(default=0.2, ge=0, le=1)
    """Format weight λf."""
    lambda_p: float = Field(default=0.4, ge=0, le=1)
    """Process-bonus weight λp in [0, 1] (0: the Search-R1 reward, with no detection; above 1 the bonus would outweigh
    the answer)."""
    check: Literal["both", "over_only", "under_only"] = "both"
    """Which detector the bonus measures: both (the paper's reward), over_only or under_only (its ablations)."""


class SearchR1Settings(RewardSettings):
    """The Search-R1 outcome + format reward: eq. 1 with λp = 0."""

    kind: Literal["search_r1"] = "search_r1"
    lambda_f: float = Field(default=0.2, ge=0, le=1)


REFERENCE_LAMBDA_P: Final = HiPRAGSettings.model_fields["lambda_p"].default
"""The paper's λp: what the shaping diagnostic of a λp = 0 run measures HiPRAG's term with."""


class HiPRAGReward(Reward):
    """Eq. 1 per rollout: ``A`` = cover exact match, ``F`` = the protocol's format check, ``N_corr`` from the step
    verdicts of over-/under-search detection (run by the scorer when ``λp > 0``)."""

    kind: ClassVar[str] = "hiprag"
    Settings: ClassVar[type[RewardSettings]] = HiPRAGSettings
    components: ClassVar[tuple[str, ...]] = ("outcome", "format", "process")

    @property
    def lambda_f(self) -> float:
        return float(self.settings.lambda_f)  # type: ignore[attr-defined]

    @property
    def lambda_p(self) -> float:
        return float(self.settings.lambda_p)  # type: ignore[attr-defined]

    @property
    def needs(self) -> RewardNeeds:
        return RewardNeeds(detection=self.lambda_p > 0)

    def mode(self) -> str:
        return str(getattr(self.settings, "check", "both"))

    def score(self, rollouts: Sequence[Any], context: ScoringContext) -> RewardScores:
        verdicts = context.verdicts
        components: dict[str, list[float]] = {name: [] for name in self.components}
        totals: list[float] = []
        optimal: list[OptimalCount | None] = []
        for index, rollout in enumerate(rollouts):
            scored = rollout_reward(rollout, None if verdicts is None else verdicts[index], lambda_f=self.lambda_f,
                                    lambda_p=self.lambda_p, mode=self.mode())
            reward = scored.reward
            for name, value in (("outcome", reward.outcome), ("format", reward.format), ("process", reward.process)):
                components[name].append(float(value))
            totals.append(float(reward.total))
            optimal.append(scored.optimal)
        return RewardScores(components, totals, optimal)

    def process_terms(self, scores: RewardScores, verdicts: Sequence[StepVerdicts] | None,
                      bonus_fired: Sequence[bool | None] | None) -> tuple[list[float], float] | None:
        """``A·F·N_corr/N`` per rollout (NaN where the gate is unknown) and λp (the paper's 0.4 for a λp = 0 run, so
        it reports what HiPRAG's term *would* have changed)."""
        if bonus_fired is None:
            return None
        counts = list(scores.optimal)
        if verdicts is not None and len(verdicts) == len(counts):  # λp = 0 scores no N_corr: count it here
            counts = [optimal if optimal is not None or not fired else count_optimal(step_verdicts, self.mode())
                      for optimal, fired, step_verdicts in zip(counts, bonus_fired, verdicts, strict=True)]
        terms = [math.nan if fired is None or (fired and optimal is None)
                 else optimal.n_optimal / optimal.n_steps if fired and optimal is not None else 0.0
                 for fired, optimal in zip(bonus_fired, counts, strict=True)]
        return terms, self.lambda_p or REFERENCE_LAMBDA_P


class SearchR1Reward(HiPRAGReward):
    """The Search-R1 baseline: eq. 1 with λp = 0 (outcome + format; detection only for metrics)."""

    kind: ClassVar[str] = "search_r1"
    Settings: ClassVar[type[RewardSettings]] = SearchR1Settings

    @property
    def lambda_p(self) -> float:
        return 0.0
