"""Engine-inserted text left out of DPO: per-token masks of TRL's tokenized responses and the collator that
applies them (:mod:`prorag.training.dpo`'s module docstring says why; imported only when a pair needs it, since
it imports TRL)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from trl.trainer.dpo_trainer import DataCollatorForPreference

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def policy_token_masks(example: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase, spans_column: str
                       ) -> dict[str, list[int]]:
    """``chosen_policy_mask`` / ``rejected_policy_mask``: 1 for each token of TRL's ``chosen_ids`` /
    ``rejected_ids`` that holds a character the policy wrote, 0 for one inside the ranges the engine inserted
    (``spans_column``: JSON ``{"chosen": [[start, end], ...], "rejected": [...]}``).

    The offsets come from tokenizing ``prompt + response`` as TRL does; the ids must agree with TRL's."""
    spans = json.loads(example[spans_column])
    prompt = example["prompt"]
    masks = {}
    for side in ("chosen", "rejected"):
        ids = list(example[f"{side}_ids"])
        start = len(example["prompt_ids"])
        encoded = tokenizer(prompt + example[side], return_offsets_mapping=True)
        if list(encoded["input_ids"][start:start + len(ids)]) != ids:
            raise ValueError(f"the {side} tokens differ from TRL's tokenization; the inserted ranges cannot be mapped")
        inserted = [(begin + len(prompt), end + len(prompt)) for begin, end in spans[side]]
        masks[f"{side}_policy_mask"] = [
            int(not any(begin <= first and last <= end for begin, end in inserted) or first == last)
            for first, last in encoded["offset_mapping"][start:start + len(ids)]]
    return masks


@dataclass
class PolicyTokenCollator(DataCollatorForPreference):
    """TRL's preference collator with each example's ``chosen_policy_mask`` / ``rejected_policy_mask``
    (:func:`policy_token_masks`) multiplied into its ``completion_mask``, truncated as TRL truncates."""

    @classmethod
    def from_collator(cls, collator: DataCollatorForPreference) -> PolicyTokenCollator:
        return cls(**{item.name: getattr(collator, item.name) for item in fields(collator)})

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        output = super().torch_call(examples)
        masks = [[0] * len(example["prompt_ids"]) + list(example[f"{side}_policy_mask"])
                 for side in ("chosen", "rejected") for example in examples]
        if self.max_length is not None:
            keep_start = self.truncation_mode == "keep_start"
            masks = [mask[:self.max_length] if keep_start else mask[-self.max_length:] for mask in masks]
        completion = output["completion_mask"]
        width = completion.shape[1]
        policy = torch.tensor([mask + [0] * (width - len(mask)) for mask in masks], dtype=completion.dtype)
        output["completion_mask"] = completion * policy
        return output
