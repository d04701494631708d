"""GRPO trainer backends by name (``rl.backend.name``): what optimises the policy over the backend-neutral rollouts
of :mod:`prorag.training.grpo`.

A backend is an object with

* ``name``;
* ``rollouts``: the :class:`~prorag.training.grpo.AgentRollouts` class it drives (the rollout function is built
  from it, :func:`prorag.assembly.build_grpo_rollouts`);
* ``check_args(args, where) -> dict``: the check of its passthrough settings (``rl.backend.args``), a clear error
  naming ``where`` and the field;
* ``train(model, questions, rollouts, output_dir, settings, *, args, adapter_dir, full_parameters, callbacks)``,
  returning the trained adapter (or full model) folder and one log entry per step, with the run-folder conventions
  of :func:`prorag.training.trl_grpo.train_grpo_lora` (``adapter/``, ``checkpoints/``, the ``COMPLETED`` marker).

A new backend is a sibling module and one line of :data:`TRAINER_BACKENDS`; one outside the package is named by
``package.module:OBJECT`` in conf, with no edit here. Modules are imported when a backend is used, so naming one
costs nothing until it trains.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from prorag.data.records import Question
    from prorag.training.config import GRPOSettings
    from prorag.training.grpo import AgentRollouts

TRAINER_BACKENDS: Final[dict[str, str]] = {
    "trl": "prorag.training.trl_grpo:TRL_BACKEND",        # TRL's GRPOTrainer (the default)
    "torch": "prorag.training.torch_grpo:TORCH_BACKEND",  # plain PyTorch GRPO, one process
}
"""Backend name -> ``module:OBJECT``."""


class TrainerBackend(Protocol):
    """What the rl node and the launch worker need of a GRPO trainer backend (module docstring)."""

    name: str
    rollouts: type[AgentRollouts]

    def check_args(self, args: Mapping[str, Any], where: str) -> dict[str, Any]: ...

    def train(self, model: str, questions: Sequence[Question], rollouts: AgentRollouts, output_dir: str | Path,
              settings: GRPOSettings, *, args: Mapping[str, Any], adapter_dir: str | Path | None,
              full_parameters: bool, callbacks: list[Any]) -> tuple[Path, list[dict[str, Any]]]: ...


def check_backend_name(name: str) -> str:
    """``name`` when it is a registered backend or a ``module:OBJECT`` path; otherwise an error listing them."""
    if name in TRAINER_BACKENDS or ":" in name:
        return name
    raise ValueError(f"unknown trainer backend {name!r} in rl.backend.name: one of {sorted(TRAINER_BACKENDS)}, or "
                     "package.module:OBJECT")


def trainer_backend(name: str) -> TrainerBackend:
    """The backend called ``name`` (:data:`TRAINER_BACKENDS`, or a ``package.module:OBJECT`` path)."""
    target = TRAINER_BACKENDS.get(check_backend_name(name), name)
    module_name, _, attribute = target.partition(":")
    try:
        backend = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"trainer backend {name!r} ({target}) cannot be loaded: {error}") from error
    missing = [member for member in ("rollouts", "check_args", "train") if not hasattr(backend, member)]
    if missing:
        raise TypeError(f"trainer backend {name!r} ({target}) has no {', '.join(missing)} (see "
                        "prorag.training.backends)")
    return backend
