"""Parameter schema of the SFT pipeline (``sft``; see conf/base/parameters_sft.yml): the trainer's own config object.

The model is ``policy.model`` and the prompt (protocol, few-shot) is the ``agent`` block's: the policy is trained
with the prompt it is later rolled out with.
"""

from __future__ import annotations

from prorag.training.config import SFTSettings

SftParams = SFTSettings
"""``sft`` parameters: LoRA SFT settings (TRL SFTTrainer + PEFT names)."""
