"""A fifth method's reward, written as a user would, outside ``src/prorag``: StepSearch-style information gain.

Each search step earns the share of the question's supporting passages that it retrieves *first* (information
gain: passages an earlier step already found earn nothing, so redundant searches are worth 0):

    R = A·(1 − λf) + λf·F + λg · Σ_t |S ∩ D_t \\ (D_1 ∪ … ∪ D_{t−1})| / |S|

with ``A`` cover exact match, ``F`` the protocol's format check, ``S`` the question's supporting passage ids and
``D_t`` the ids retrieved by search step ``t``. A question without supporting passages gets no gain term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from prorag.metrics.qa import cover_exact_match
from prorag.rewards.base import Reward, RewardNeeds, RewardScores, RewardSettings, ScoringContext


class InfoGainSettings(RewardSettings):
    kind: Literal["info_gain"] = "info_gain"
    lambda_f: float = Field(default=0.2, ge=0, le=1)
    lambda_g: float = Field(default=0.5, ge=0)


class InfoGainReward(Reward):
    kind: ClassVar[str] = "info_gain"
    Settings: ClassVar[type[RewardSettings]] = InfoGainSettings
    components: ClassVar[tuple[str, ...]] = ("outcome", "format", "gain")

    @property
    def needs(self) -> RewardNeeds:
        return RewardNeeds(evidence=True)

    def score(self, rollouts: Sequence[Any], context: ScoringContext) -> RewardScores:
        settings: Any = self.settings
        components: dict[str, list[float]] = {name: [] for name in self.components}
        for rollout in rollouts:
            supporting = set(context.questions[rollout.question_key].supporting_passage_ids)
            seen: set[str] = set()
            gain = 0.0
            for ids in rollout.retrieved_ids:
                found = (set(ids) & supporting) - seen
                gain += len(found) / len(supporting) if supporting else 0.0
                seen |= set(ids)
            correct = float(cover_exact_match(rollout.answer, rollout.golden_answers))
            components["outcome"].append(correct * (1 - settings.lambda_f))
            components["format"].append(settings.lambda_f * float(rollout.format_ok))
            components["gain"].append(settings.lambda_g * gain)
        totals = [sum(values) for values in zip(*components.values(), strict=True)]
        return RewardScores(components, totals)
