"""Every use of TRL's private API, in one place, written against the pinned TRL version (pyproject: ``trl==1.16.0``).

TRL has no public hook for these, so the GRPO trainer reaches into ``GRPOTrainer`` here and nowhere else:

* ``_generate_and_score_completions`` — wrapped to post-process a scored batch (DAPO's dynamic sampling, which
  TRL 1.16 lacks); the batch keys it edits (``advantages``, ``completion_mask``, ``tool_mask``,
  ``num_items_in_batch``) are that method's output in 1.16;
* ``_metrics[mode][name]`` — TRL's per-step metric buffer, which its ``log`` averages and reports.

A TRL upgrade re-checks this module (and tests/training/test_grpo.py) first; a different installed version logs a
warning at import.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import trl
from trl import GRPOTrainer

logger = logging.getLogger(__name__)

PINNED_TRL_VERSION: Final = "1.16.0"

if trl.__version__ != PINNED_TRL_VERSION:
    logger.warning("TRL %s is installed; prorag.training.trl_private is written against TRL %s",
                   trl.__version__, PINNED_TRL_VERSION)


class GRPOTrainerHooks(GRPOTrainer):
    """``GRPOTrainer`` with two hooks over its private API: :meth:`after_scoring` and :meth:`log_metric`."""

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        self.after_scoring(output)
        return output

    def after_scoring(self, output: dict[str, Any]) -> None:
        """Edit a scored generation batch in place before the loss sees it (no-op here)."""

    def log_metric(self, name: str, value: float, *, mode: str | None = None) -> None:
        """Add ``value`` to the metrics TRL averages and logs at the next logging step."""
        self._metrics[mode or ("train" if self.model.training else "eval")][name].append(value)
