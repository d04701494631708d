"""The reward contract: what a reward plug-in is, what it needs, and what it returns.

A reward is a class registered by its ``kind`` (:mod:`prorag.rewards.registry`), the way a protocol adapter is
registered by name. It brings

* ``Settings`` — its own typed settings (a :class:`RewardSettings` subclass whose ``kind`` is the reward's name),
  validated from the ``reward`` entry of a method's conf;
* ``components`` — the names of its additive components (TRL sums them; evaluation reports each);
* ``needs`` — what the scorer must hand it (:class:`RewardNeeds`: step verdicts from the over-/under-search
  judges, a query embedder, an answer judge, the questions' gold evidence);
* ``score(rollouts, context)`` — the components and the total of every rollout (:class:`RewardScores`).

The scorer (:class:`prorag.rewards.scoring.RolloutScorer`) runs what the reward needs — detection above all, batched
over the whole batch — and the batch statistics; no trainer or pipeline names a reward.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

import numpy as np
from pydantic import Field

from prorag.config import StrictModel
from prorag.errors import UserError
from prorag.plugins import PluginError, is_plugin_path, load_plugin
from prorag.specs import JudgeSpec

if TYPE_CHECKING:
    from prorag.agent.trajectory import Rollout
    from prorag.data.records import Question
    from prorag.judges.base import Judge
    from prorag.judges.detection import StepVerdicts
    from prorag.rewards.hiprag import OptimalCount

logger = logging.getLogger(__name__)

Embed = Callable[[Sequence[str]], np.ndarray]

DEFAULT_DETECTION_RETRIEVER: Final = "bm25"


class RewardSettings(StrictModel):
    """What every reward's settings share: its ``kind`` and the over-/under-search detection it may run (for its
    own process term, or only to report OSR/USR with ``judge_for_metrics``)."""

    kind: str
    """The registered reward (:func:`prorag.rewards.registry.reward_kinds`)."""
    reask_max_new_tokens: int = Field(default=48, ge=1)
    """Tokens the policy may write when a search step's query is re-asked alone (over-search detection, §3.2)."""
    reask: Literal["paper", "instructed"] = "paper"
    """Over-search re-ask (§3.2): ``paper`` — the query alone, sampled as in training (temperature 1); ``instructed``
    — an instruction before it, greedy (prorag's earlier behaviour; :mod:`prorag.judges.detection`)."""
    under_search_input: Literal["step", "step_and_question"] = "step"
    """What the under-search verifier reads (Fig. 6): the step alone (``step``, the paper) or the question too."""
    over_search_judge: JudgeSpec = JudgeSpec()
    under_search_judge: JudgeSpec = JudgeSpec()
    judge_retriever: str = DEFAULT_DETECTION_RETRIEVER
    """What the reference judge grounds non-search steps with (a retriever kind of the index)."""

    @classmethod
    def schema_for(cls, values: Any) -> type[RewardSettings]:
        """The settings class of the reward a raw entry names (``kind``, default ``hiprag``)."""
        if cls is not RewardSettings or not isinstance(values, Mapping):
            return cls
        if "method" in values and "kind" not in values:
            raise ValueError("`method` was renamed: name the reward with `kind:` (hiprag, search_r1, multistage, ...)")
        return reward_class(values.get("kind", DEFAULT_REWARD)).Settings

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """On this base class, validate with the settings of the reward the entry names (Kedro instantiates a
        node's ``reward: RewardSettings`` parameter this way); on a reward's own settings class, as usual.

        Keys that are settings of *another* registered reward (``lambda_p`` in a ``multistage`` entry that a preset
        layered over conf/base's ``hiprag`` one) are left out with a warning naming them; any other unknown key is
        an error."""
        target = cls.schema_for(obj)
        kind = obj.get("kind") if isinstance(obj, Mapping) else None
        if is_plugin_path(kind):  # validated as the class's own kind; the path stays the kind every process reads
            own = target.model_fields["kind"].default
            checked = target.model_validate({**obj, "kind": own if isinstance(own, str) else ""}, **kwargs)
            return checked.model_copy(update={"kind": kind})
        if isinstance(obj, Mapping):
            obj = _without_foreign_keys(target, obj)
            obj.setdefault("kind", target.model_fields["kind"].default)
        if target is not cls:
            return target.model_validate(obj, **kwargs)
        return super().model_validate(obj, **kwargs)


def _without_foreign_keys(settings: type[RewardSettings], values: Mapping[str, Any]) -> dict[str, Any]:
    own = set(settings.model_fields)
    others = {key for kind in reward_kinds() for key in reward_class(kind).Settings.model_fields} - own
    foreign = sorted(key for key in values if key in others)
    if foreign:
        logger.warning("reward %r takes no %s (settings of other rewards): left out",
                       values.get("kind", settings.model_fields["kind"].default), ", ".join(foreign))
    return {key: value for key, value in values.items() if key not in others}


@dataclass(frozen=True)
class RewardNeeds:
    """What a reward needs the scorer to provide."""

    detection: bool = False
    """Step verdicts from the over-/under-search judges (re-asks to the current policy)."""
    embedder: bool = False
    """A query embedder (``context.embed``)."""
    answer_judge: bool = False
    """An answer-correctness judge when its settings name one (``context.answer_judge``; None: cover EM)."""
    evidence: bool = False
    """The rollouts' questions with their gold evidence (``context.questions``)."""


@dataclass
class ScoringContext:
    """What the scorer hands a reward's :meth:`Reward.score`, aligned with the rollouts where per rollout."""

    step: int | None = None
    """The training step (None: evaluation, scored as the reward's final stage)."""
    verdicts: Sequence[StepVerdicts] | None = None
    embed: Embed | None = None
    answer_judge: Judge | None = None
    questions: Mapping[str, Question] = field(default_factory=dict)
    """The rollouts' questions by key (rewards that need gold evidence)."""


@dataclass
class RewardScores:
    """Per-rollout components and totals; what else a reward reports per rollout (None: not applicable)."""

    components: dict[str, list[float]]
    totals: list[float]
    optimal: list[OptimalCount | None] = field(default_factory=list)
    """Eq. 1 rewards: each rollout's optimal/over/under/unknown step counts (None where not counted)."""
    answer_correct: list[bool | None] | None = None
    """Rewards with an answer judge: each rollout's correctness (None: unknown verdict)."""
    stage: int | None = None
    """Staged rewards: the stage the batch was scored in."""
    details: list[dict[str, Any]] | None = None
    """Anything else per rollout a caller may want (the TeaRAG path scores, ...)."""


class Reward:
    """Base of every reward plug-in (module docstring). Subclasses set ``kind``, ``Settings``, ``components`` and
    implement :meth:`score`."""

    kind: ClassVar[str]
    Settings: ClassVar[type[RewardSettings]] = RewardSettings
    components: ClassVar[tuple[str, ...]] = ()
    protocols: ClassVar[tuple[str, ...] | None] = None
    """The protocols whose format the reward checks; None: any protocol not claimed by another reward."""
    claims_protocols: ClassVar[bool] = False
    """True: the protocols in ``protocols`` go with this reward only (the multi-stage format reward)."""
    detection_mode: ClassVar[str] = "both"
    """Which steps detection checks when it runs (``both``, ``over_only``, ``under_only``)."""

    def __init__(self, settings: RewardSettings) -> None:
        if not isinstance(settings, self.Settings):
            raise TypeError(f"reward {self.kind!r} takes {self.Settings.__name__}, got {type(settings).__name__}")
        self.settings = settings

    @property
    def needs(self) -> RewardNeeds:
        return RewardNeeds()

    def mode(self) -> str:
        """The detection mode of this reward's settings (a reward whose mode is a setting overrides this)."""
        return self.detection_mode

    def stage(self, step: int | None) -> int | None:
        """The stage a training step (None: evaluation) is scored in; None for an unstaged reward."""
        return None

    def process_terms(self, scores: RewardScores, verdicts: Sequence[StepVerdicts] | None,
                      bonus_fired: Sequence[bool | None] | None) -> tuple[list[float], float] | None:
        """The reward's process term per rollout (NaN: unknown) and its weight, for the shaping diagnostic
        (:func:`prorag.rewards.diagnostics.process_shaped_groups`); None: the reward has no process term."""
        return None

    def score(self, rollouts: Sequence[Rollout], context: ScoringContext) -> RewardScores:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings!r})"


# ------------------------------------------------------------------------------------------ the lookup
# The tables live here, beside the contract, so that validating a reward entry needs no import of the registry
# module (which builds on this one); `prorag.rewards.registry` adds and removes entries.

DEFAULT_REWARD: Final = "hiprag"

# The built-in rewards, imported on first use: "module:attribute" of each reward class.
_BUILTIN: Final[dict[str, str]] = {
    "hiprag": "prorag.rewards.hiprag:HiPRAGReward",
    "search_r1": "prorag.rewards.hiprag:SearchR1Reward",
    "multistage": "prorag.rewards.multistage:MultistageReward",
    "knowledge_matching": "prorag.rewards.tearag:KnowledgeMatchingReward",
}

_registered: dict[str, type[Reward]] = {}


class UnknownRewardError(UserError, ValueError):
    """A reward kind that is neither built in nor registered."""


def reward_kinds() -> list[str]:
    """Every reward kind :func:`reward_class` accepts."""
    return sorted({*_BUILTIN, *_registered})


def reward_class(kind: str) -> type[Reward]:
    """The reward class registered as ``kind``."""
    if kind in _registered:
        return _registered[kind]
    target = _BUILTIN.get(kind)
    if target is None and is_plugin_path(kind):
        found = load_plugin(kind, "reward kind")
        if not (isinstance(found, type) and issubclass(found, Reward)):
            raise PluginError(f"reward kind {kind!r} names {found!r}, not a prorag.rewards.base.Reward subclass")
        return found
    if target is None:
        close = difflib.get_close_matches(str(kind), reward_kinds(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownRewardError(f"unknown reward kind {kind!r}{hint} (known: {', '.join(reward_kinds())}, or "
                                 "a class of your own as 'package.module:Class')")
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)
