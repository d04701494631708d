"""Upstream deprecation warnings of a training run, filtered around the calls that raise them (never globally).

transformers 5 deprecated ``PreTrainedModel.is_gradient_checkpointing`` (a ``FutureWarning``: "removed in v6"), and
PEFT and TRL still read it: ``PeftModel.__init__`` (every trainer given a ``peft_config``, and
``PeftModel.from_pretrained``), TRL's ``unwrap_model_for_generation`` (each GRPO rollout) and TRL's
``disable_gradient_checkpointing`` (twice per DPO step). Each printed 9 lines on
the terminal of ``make train`` (7 times), about code neither prorag nor its user can change. Only that message, raised
by ``transformers.modeling_utils``, is filtered, and only inside :func:`upstream_deprecations`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

GRADIENT_CHECKPOINTING_ALIAS = r"`is_gradient_checkpointing` is deprecated"
"""The start of transformers' message (a regular expression, as :func:`warnings.filterwarnings` takes it)."""


@contextlib.contextmanager
def upstream_deprecations() -> Iterator[None]:
    """Ignore transformers' ``is_gradient_checkpointing`` FutureWarning raised by PEFT or TRL inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=GRADIENT_CHECKPOINTING_ALIAS, category=FutureWarning,
                                module=r"transformers\.modeling_utils")
        yield
