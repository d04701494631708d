from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_tokenizer
from prorag.protocol import reasonrag
from prorag.training.dpo import DPOTrainingConfig, preference_rows, train_dpo_lora

PAIRS = [
    {"messages": reasonrag.render_prompt("Capital of France?"), "transcript": "",
     "chosen": "So the answer is <answer>Paris</answer>", "rejected": "So the next query is <query>France</query>"},
    {"messages": reasonrag.render_prompt("Capital of Italy?"),
     "transcript": "So the next query is <query>Italy capital</query>" + reasonrag.after_query("Doc 1(Title: Rome)"),
     "chosen": "Rome is the capital.</evidence>", "rejected": "None</evidence>"},
]


def _lora_tensors(adapter_dir: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors"))


def test_preference_rows_render_the_protocol_prompt() -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    rows = preference_rows(tokenizer, PAIRS)
    assert rows[1]["prompt"].endswith("<evidence>") and "Question: Capital of Italy?" in rows[1]["prompt"]
    assert rows[0]["chosen"] == PAIRS[0]["chosen"]
    with pytest.raises(ValueError, match="pair 0 lacks"):
        preference_rows(tokenizer, [{"chosen": "a"}])
    with pytest.raises(ValueError, match="identical"):
        preference_rows(tokenizer, [{**PAIRS[0], "rejected": PAIRS[0]["chosen"] + " "}])


def test_loss_configuration() -> None:
    assert DPOTrainingConfig().loss() == (["sigmoid"], [1.0])
    assert DPOTrainingConfig(sft_weight=0.5).loss() == (["sigmoid", "sft"], [1.0, 0.5])
    with pytest.raises(ValueError, match="beta"):  # pydantic ValidationError is a ValueError
        DPOTrainingConfig(beta=0)


@pytest.mark.integration
@pytest.mark.slow
def test_a_dpo_step_changes_the_adapter(tmp_path: Path, one_torch_thread: None) -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    rows = preference_rows(tokenizer, PAIRS)
    config = DPOTrainingConfig(learning_rate=1e-2, max_steps=1, per_device_train_batch_size=2,
                               gradient_accumulation_steps=1, warmup_ratio=0.0, lr_scheduler_type="constant")
    with warnings.catch_warnings(record=True) as caught:  # TRL/PEFT's upstream FutureWarning is filtered (issue 46)
        warnings.simplefilter("always")
        first, history = train_dpo_lora(BUNDLED_TINY_LLAMA, rows, tmp_path / "a", config)
    assert not [str(item.message) for item in caught if "is_gradient_checkpointing" in str(item.message)]
    weights = _lora_tensors(first)
    lora_b = [tensor for name, tensor in weights.items() if "lora_B" in name]
    assert lora_b and any(float(tensor.abs().sum()) > 0 for tensor in lora_b)  # B starts at zero
    logged = [entry for entry in history if "loss" in entry]
    assert logged and "rewards/margins" in logged[0] and "rewards/accuracies" in logged[0]
    # continuing the adapter, with the SFT term of IP-DPO, changes it again
    second, history = train_dpo_lora(BUNDLED_TINY_LLAMA, rows, tmp_path / "b",
                                     config.model_copy(update={"init_adapter": str(first),
                                                        "sft_weight": 1.0}))
    after = _lora_tensors(second)
    assert set(after) == set(weights)
    assert any(float((after[name] - weights[name]).abs().sum()) > 0 for name in weights)


def test_the_appended_eos_is_dropped_from_step_responses() -> None:
    from datasets import Dataset
    from prorag.training.dpo import _drop_appended_eos

    data = Dataset.from_list([{"chosen_ids": [5, 6, 2], "rejected_ids": [7, 2]},
                              {"chosen_ids": [2], "rejected_ids": [9]}])
    stripped = _drop_appended_eos(data, eos_token_id=2)
    assert stripped[0]["chosen_ids"] == [5, 6] and stripped[0]["rejected_ids"] == [7]
    assert stripped[1]["chosen_ids"] == [2] and stripped[1]["rejected_ids"] == [9]  # never emptied
