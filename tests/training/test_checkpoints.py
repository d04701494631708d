"""Continuing a saved adapter: trainable, its base read from the local folder while training, portable once saved."""

from __future__ import annotations

import json
import warnings

from peft import LoraConfig, get_peft_model

from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm, make_adapter_portable, portable_name
from prorag.training.checkpoints import continue_adapter


def test_a_continued_adapter_saves_without_looking_its_base_up_and_stays_portable(one_torch_thread, tmp_path):
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    local = model.name_or_path
    first = tmp_path / "sft"
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM")).save_pretrained(first)
    portable = make_adapter_portable(first)
    assert portable == portable_name(local) != local  # what the saved adapter records: no path of this machine

    continued = continue_adapter(load_causal_lm(BUNDLED_TINY_LLAMA)[0], first)
    assert continued.peft_config["default"].base_model_name_or_path == local
    assert any(parameter.requires_grad for parameter in continued.parameters())
    second = tmp_path / "rl"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        continued.save_pretrained(second)
    assert not [str(w.message) for w in caught if "Could not find a config file" in str(w.message)]
    assert make_adapter_portable(second) == portable
    assert json.loads((second / "adapter_config.json").read_text())["base_model_name_or_path"] == portable
