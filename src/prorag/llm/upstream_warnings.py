"""Upstream deprecation warnings of PEFT and TRL, filtered around the calls that raise them (never globally).

transformers 5 deprecated ``PreTrainedModel.is_gradient_checkpointing``, ``gradient_checkpointing_enable`` and
``gradient_checkpointing_disable`` (``FutureWarning``: "removed in v6"), and PEFT and TRL still call them:
``PeftModel.__init__`` (every trainer given a ``peft_config``, and ``PeftModel.from_pretrained``: a trained policy
loaded to roll out, serve, ask or export), TRL's ``unwrap_model_for_generation`` (each GRPO rollout: disable on
entering, enable on leaving) and TRL's ``disable_gradient_checkpointing`` (twice per DPO step). Each printed 9 lines on
the terminal of ``make train``, about code neither prorag nor its user can change. Only those messages, raised by
``transformers.modeling_utils``, are filtered, and only inside :func:`upstream_deprecations`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

DEPRECATED_ALIASES = ("is_gradient_checkpointing", "gradient_checkpointing_enable", "gradient_checkpointing_disable")
GRADIENT_CHECKPOINTING_ALIAS = rf"`({'|'.join(DEPRECATED_ALIASES)})` is deprecated"
"""The start of transformers' messages (a regular expression, as :func:`warnings.filterwarnings` takes it)."""


@contextlib.contextmanager
def upstream_deprecations() -> Iterator[None]:
    """Ignore transformers' FutureWarnings for its gradient-checkpointing aliases raised by PEFT or TRL inside the
    block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=GRADIENT_CHECKPOINTING_ALIAS, category=FutureWarning,
                                module=r"transformers\.modeling_utils")
        yield
