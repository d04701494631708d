"""transformers' FutureWarnings for its gradient-checkpointing aliases, called by PEFT and TRL, are filtered around the
calls that raise them and nowhere else (issue 46, item 5)."""

from __future__ import annotations

import warnings

import pytest

from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.llm.upstream_warnings import upstream_deprecations
from prorag.training.config import GRPOSettings
from prorag.training.torch_grpo import _policy

DEPRECATED = "`is_gradient_checkpointing` is deprecated"


def _caught(function) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function()
    return [str(warning.message) for warning in caught]


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    return load_causal_lm(BUNDLED_TINY_LLAMA)


def test_only_that_message_is_filtered_and_only_inside_the_block(tiny):
    model, _ = tiny
    assert any(DEPRECATED in message for message in _caught(lambda: model.is_gradient_checkpointing))

    def inside() -> None:
        with upstream_deprecations():
            _ = model.is_gradient_checkpointing
            warnings.warn("another deprecation", FutureWarning, stacklevel=1)
            warnings.warn(f"{DEPRECATED} (not from transformers)", FutureWarning, stacklevel=1)

    # the same text raised by another module, and any other FutureWarning, still show
    assert _caught(inside) == ["another deprecation", f"{DEPRECATED} (not from transformers)"]


def test_wrapping_the_policy_in_lora_warns_nothing_upstream(tiny):
    messages = _caught(lambda: _policy(tiny, GRPOSettings(), adapter_dir=None, full_parameters=False))
    assert not [message for message in messages if DEPRECATED in message]


def test_the_checkpointing_switches_trl_calls_around_generation_warn_only_outside_the_block(tiny):
    model, _ = tiny
    outside = _caught(lambda: (model.gradient_checkpointing_enable(), model.gradient_checkpointing_disable()))
    assert [message.split("`")[1] for message in outside if "is deprecated" in message] == [
        "gradient_checkpointing_enable", "gradient_checkpointing_disable"]

    def inside() -> None:
        with upstream_deprecations():
            model.gradient_checkpointing_enable()
            model.gradient_checkpointing_disable()

    assert _caught(inside) == []


def test_merging_a_trained_adapter_warns_nothing_upstream(one_torch_thread, tmp_path):
    """``prorag ask``, ``prorag serve --adapter``, the rollouts and the MLflow export load a trained policy through
    ``merged_policy`` or the generator factory: PEFT's read of the deprecated alias stays off their terminal."""
    from peft import LoraConfig, get_peft_model

    from prorag.llm.factory import build_generator
    from prorag.llm.registry import merged_policy

    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    with upstream_deprecations():
        adapted = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    adapted.save_pretrained(str(tmp_path / "adapter"))

    for load in (lambda: merged_policy(BUNDLED_TINY_LLAMA, tmp_path / "adapter"),
                 lambda: build_generator(BUNDLED_TINY_LLAMA, adapter=str(tmp_path / "adapter"))):
        assert not [message for message in _caught(load) if "is deprecated" in message]
