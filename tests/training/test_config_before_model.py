"""Every trainer creates its TRL config before it loads the model: under ``accelerate launch`` with DeepSpeed
ZeRO-3, creating the config registers DeepSpeed's settings (``zero3_init_flag``), so ``from_pretrained`` partitions
the weights as it loads them instead of every rank first holding the whole model in host memory (a 7B model in fp32
is ~30 GB per rank)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import transformers

import prorag.llm.registry as registry
from prorag.data.records import Question
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.training.config import GRPOSettings, SFTSettings
from prorag.training.dpo import DPOTrainingConfig, train_dpo_lora
from prorag.training.sft import train_sft_lora
from prorag.training.trl_grpo import build_grpo_trainer


class Loaded(Exception):
    """Raised by the patched loader: the order is all this test needs."""


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    post_init = transformers.TrainingArguments.__post_init__

    def recording_post_init(self, *args, **kwargs):
        seen.append(f"config:{type(self).__name__}")
        return post_init(self, *args, **kwargs)

    def recording_load(*args, **kwargs):
        seen.append("load")
        raise Loaded

    monkeypatch.setattr(transformers.TrainingArguments, "__post_init__", recording_post_init)
    monkeypatch.setattr(registry, "load_causal_lm", recording_load)
    return seen


def test_grpo_creates_its_config_before_loading_the_model(events, tmp_path):
    question = Question(id="q", question="Q?", golden_answers=("A",), dataset="demo", split="train")
    with pytest.raises(Loaded):
        build_grpo_trainer(BUNDLED_TINY_LLAMA, [question], SimpleNamespace(policy_server=None), tmp_path,
                           GRPOSettings(), full_parameters=True)
    assert events == ["config:GRPOConfig", "load"]


def test_sft_creates_its_config_before_loading_the_model(events, tmp_path):
    with pytest.raises(Loaded):
        train_sft_lora(BUNDLED_TINY_LLAMA, [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}], tmp_path,
                       SFTSettings())
    assert events == ["config:SFTConfig", "load"]


def test_dpo_creates_its_config_before_loading_the_model(events, tmp_path):
    with pytest.raises(Loaded):
        train_dpo_lora(BUNDLED_TINY_LLAMA, [{"prompt": "p", "chosen": "a", "rejected": "b"}], tmp_path,
                       DPOTrainingConfig())
    assert events == ["config:DPOConfig", "load"]
