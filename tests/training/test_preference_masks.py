from __future__ import annotations

import json
from pathlib import Path

import pytest
from trl.trainer.dpo_trainer import DataCollatorForPreference

from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_tokenizer
from prorag.protocol import tearag
from prorag.training.dpo import INSERTED, DPOTrainingConfig, preference_rows, train_dpo_lora
from prorag.training.preference_masks import PolicyTokenCollator, policy_token_masks

WRITTEN = "Jaws</entities>\n<subquery>Who directed Jaws?</subquery>"
CONTEXT = tearag.after_subquery("Doc 1(Title: Jaws) Jaws is a 1975 film directed by Steven Spielberg.")
SUMMARY = "Steven Spielberg directed it.</summary>\n</step>\n<answer>Steven Spielberg</answer>"


def _pair(rejected_summary: str = "Nobody.</summary>") -> dict[str, object]:
    chosen, rejected = WRITTEN + CONTEXT + SUMMARY, WRITTEN + CONTEXT + rejected_summary
    context = [[len(WRITTEN), len(WRITTEN + CONTEXT)]]
    return {"messages": tearag.render_prompt("Who directed Jaws?", few_shot=False),
            "transcript": tearag.initial_prefix(), "chosen": chosen, "rejected": rejected,
            "chosen_inserted": context, "rejected_inserted": context}


def _tokenized(tokenizer, row: dict[str, str]) -> dict[str, object]:
    """What TRL 1.16's DPOTrainer writes for a plain-text row (prompt_ids, then the response ids after them)."""
    prompt_ids = tokenizer(row["prompt"])["input_ids"]
    example = dict(row, prompt_ids=prompt_ids)
    for side in ("chosen", "rejected"):
        example[f"{side}_ids"] = tokenizer(row["prompt"] + row[side])["input_ids"][len(prompt_ids):]
    return example


def test_the_masks_leave_out_exactly_the_inserted_context() -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    (row,) = preference_rows(tokenizer, [_pair()])
    assert json.loads(row[INSERTED])["chosen"] == [[len(WRITTEN), len(WRITTEN + CONTEXT)]]
    example = _tokenized(tokenizer, row)
    masks = policy_token_masks(example, tokenizer, INSERTED)
    for side in ("chosen", "rejected"):
        ids, mask = example[f"{side}_ids"], masks[f"{side}_policy_mask"]
        assert len(mask) == len(ids) and 0 in mask and 1 in mask
        left_out = tokenizer.decode([token for token, keep in zip(ids, mask, strict=True) if not keep])
        assert "Steven Spielberg." in left_out and "<Reference>" in left_out  # the retrieved document
        trained = tokenizer.decode([token for token, keep in zip(ids, mask, strict=True) if keep])
        assert "Who directed Jaws?" in trained and "Doc 1" not in trained


def test_the_collator_multiplies_the_masks_into_trls_completion_mask() -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    rows = preference_rows(tokenizer, [_pair(), _pair("A much longer wrong summary of the reference.</summary>")])
    examples = [{**(example := _tokenized(tokenizer, row)), **policy_token_masks(example, tokenizer, INSERTED)}
                for row in rows]
    collator = PolicyTokenCollator(pad_token_id=0)
    batch = collator(examples)
    plain = DataCollatorForPreference(pad_token_id=0)(examples)
    assert batch["input_ids"].equal(plain["input_ids"])
    left_out = int((plain["completion_mask"] - batch["completion_mask"]).sum())
    expected = sum(mask.count(0) for example in examples
                   for mask in (example["chosen_policy_mask"], example["rejected_policy_mask"]))
    assert left_out == expected > 0
    assert int(batch["completion_mask"].sum()) > 0
    truncated = PolicyTokenCollator(pad_token_id=0, max_length=40)(examples)
    assert truncated["completion_mask"].shape == truncated["input_ids"].shape


def test_bad_ranges_and_a_precomputed_reference_are_refused(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    with pytest.raises(ValueError, match=r"pair 0 chosen_inserted: \[5, 900\]"):
        preference_rows(tokenizer, [{**_pair(), "chosen_inserted": [[5, 900]]}])
    rows = preference_rows(tokenizer, [_pair()])
    with pytest.raises(ValueError, match="precompute_ref_log_probs"):
        train_dpo_lora(BUNDLED_TINY_LLAMA, rows, tmp_path, DPOTrainingConfig(precompute_ref_log_probs=True))


@pytest.mark.integration
@pytest.mark.slow
def test_a_masked_dpo_step_trains(tmp_path: Path, one_torch_thread: None) -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    rows = preference_rows(tokenizer, [_pair(), _pair("Jaws.</summary>\n</step>\n<answer>Jaws</answer>")])
    config = DPOTrainingConfig(learning_rate=1e-2, max_steps=1, per_device_train_batch_size=2, append_eos=True,
                               gradient_accumulation_steps=1, warmup_ratio=0.0, lr_scheduler_type="constant",
                               sft_weight=1.0)
    adapter, masked = train_dpo_lora(BUNDLED_TINY_LLAMA, rows, tmp_path / "masked", config)
    assert (adapter / "adapter_model.safetensors").is_file()
    unmasked_rows = [{**row, INSERTED: json.dumps({"chosen": [], "rejected": []})} for row in rows]
    _, unmasked = train_dpo_lora(BUNDLED_TINY_LLAMA, unmasked_rows, tmp_path / "unmasked", config)
    (masked_step,), (unmasked_step,) = ([entry for entry in log if "loss" in entry] for log in (masked, unmasked))
    # the same first step, summed over fewer tokens: the retrieved context is not scored
    assert 0 > masked_step["logps/chosen"] > unmasked_step["logps/chosen"]
    assert 0 > masked_step["logps/rejected"] > unmasked_step["logps/rejected"]
