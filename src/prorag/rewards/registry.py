"""Rewards by kind: the built-in ones are listed here once; a user's reward is added with :func:`register_reward`
(no scorer, trainer, pipeline or compare code changes), as a protocol is added with
:func:`prorag.protocol.registry.register_protocol`.

A ``reward`` entry of conf is validated by :meth:`RewardSettings.model_validate <prorag.rewards.base.RewardSettings.
model_validate>`: its ``kind`` picks the registered class, whose own ``Settings`` then validate the rest (an unknown
key names the closest valid one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prorag.rewards.base import (
    _BUILTIN,
    Reward,
    RewardSettings,
    _registered,
    reward_class,
    reward_kinds,
)


def register_reward(reward: type[Reward], *, replace: bool = False) -> type[Reward]:
    """Make ``reward`` available under its ``kind``; usable as a class decorator."""
    kind = getattr(reward, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"a reward class needs a non-empty `kind`, got {kind!r} on {reward!r}")
    if not (isinstance(reward, type) and issubclass(reward, Reward)):
        raise TypeError(f"{reward!r} is not a prorag.rewards.base.Reward subclass")
    if reward.Settings.model_fields["kind"].default != kind:
        raise ValueError(f"reward {kind!r}: its Settings need `kind: Literal[{kind!r}] = {kind!r}`")
    if not replace and (kind in _registered or kind in _BUILTIN):
        raise ValueError(f"reward {kind!r} is already registered (pass replace=True to override it)")
    _registered[kind] = reward
    return reward


def unregister_reward(kind: str) -> None:
    """Remove a reward added with :func:`register_reward` (built-ins stay)."""
    _registered.pop(kind, None)


def reward_settings(values: Mapping[str, Any] | RewardSettings) -> RewardSettings:
    """A reward entry validated by its kind's settings (``kind`` defaults to ``hiprag``)."""
    if isinstance(values, RewardSettings):
        return values
    return RewardSettings.model_validate(dict(values))


def build_reward(settings: RewardSettings | Mapping[str, Any]) -> Reward:
    """The reward of a (validated or raw) reward entry."""
    settings = reward_settings(settings)
    return reward_class(settings.kind)(settings)


def check_reward_protocol(reward: RewardSettings, protocol: str) -> None:
    """The reward can score the protocol's trajectories: a reward that checks its own protocol's format (the
    multi-stage reward) goes with that protocol, and only with it."""
    cls = reward_class(reward.kind)
    if cls.protocols is not None and protocol not in cls.protocols:
        raise ValueError(f"reward {reward.kind!r} scores the {', '.join(cls.protocols)} protocol(s), not "
                         f"{protocol!r}")
    if cls.protocols is None:
        claimed = {name: kind for kind in reward_kinds() for name in (reward_class(kind).protocols or ())
                   if reward_class(kind).claims_protocols}
        if protocol in claimed:
            raise ValueError(f"protocol {protocol!r} goes with the {claimed[protocol]!r} reward only (it checks "
                             f"that protocol's format), not with {reward.kind!r}")
