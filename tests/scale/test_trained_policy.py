"""Items 6 and 10 of issue 28: every trained policy under conf/gpu's ``policy`` block (backend openai) is evaluated
and judged through a server — a LoRA adapter loaded into the policy server by vLLM's LoRA support and requested by
its name, a full-parameter model served by name on its own server — and TeaRAG's IP-DPO samples through it too.

conf/gpu's policy is used as it is, except its model: the bundled tiny Llama (offline) instead of Qwen."""

from __future__ import annotations

import socket
import sys

import pytest

from prorag.assembly import build_policy
from prorag.llm.generation import SamplingParams
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.specs import PolicySpec

from .conftest import gpu_parameters

STAGES = ("sft_adapter", "dpo_adapter", "tearag_sft_adapter", "tearag_ip_dpo_adapter", "rl_adapter (lora: true)")


def _gpu_policy(url: str, **update) -> PolicySpec:
    raw = dict(gpu_parameters()["policy"])
    assert raw["backend"] == "openai"
    return PolicySpec.model_validate({**raw, "model": BUNDLED_TINY_LLAMA, "base_url": url, **update})


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    folder = tmp_path_factory.mktemp("trained") / "sft_adapter"
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM")).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def full_model_dir(tmp_path_factory):
    model, tokenizer = load_causal_lm(BUNDLED_TINY_LLAMA)
    folder = tmp_path_factory.mktemp("trained") / "rl_adapter"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("stage", STAGES)
def test_a_lora_trained_policy_is_loaded_into_the_policy_server_and_requested_by_name(stage, adapter_dir,
                                                                                       policy_server):
    url, captured = policy_server
    generator = build_policy(_gpu_policy(url).with_trained(str(adapter_dir)))
    loads = captured.of("/v1/load_lora_adapter")
    assert loads and loads[-1]["lora_path"] == str(adapter_dir.resolve())
    assert generator.model == loads[-1]["lora_name"] != BUNDLED_TINY_LLAMA  # the adapter's served name


@pytest.mark.integration
def test_a_full_parameter_trained_policy_is_served_by_name_on_its_own_server(full_model_dir, policy_server):
    url, _ = policy_server
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    trained_server = dict(gpu_parameters()["policy"]["trained_server"])
    assert trained_server["launch"] is True
    trained_server.update(
        base_url=f"http://127.0.0.1:{port}/v1", startup_timeout=120,
        command=[sys.executable, "-m", "prorag.serving", "--model", "{model}", "--served-model-name", "{name}",
                 "--host", "{host}", "--port", "{port}", "--max-tokens-limit", "64"])  # vLLM's stand-in on CPU
    policy = _gpu_policy(url, trained_server=trained_server).with_trained(str(full_model_dir))
    assert policy.model == str(full_model_dir)
    try:
        generator = build_policy(policy)
        assert generator.model != str(full_model_dir) and generator.model.startswith("trained-")
        assert generator.base_url == trained_server["base_url"]
        [[completion]] = generator.generate(["Question: who?"], SamplingParams(max_new_tokens=4))
        assert completion.token_ids
    finally:
        from prorag.llm.served import stop_launched_servers

        stop_launched_servers()


def test_tearag_ip_dpo_samples_each_round_through_the_policy_server(adapter_dir, policy_server):
    from prorag.pipelines.tearag.nodes import ip_dpo_sampler

    url, captured = policy_server
    before = len(captured.of("/v1/load_lora_adapter"))
    generator = ip_dpo_sampler(_gpu_policy(url))(str(adapter_dir))
    assert len(captured.of("/v1/load_lora_adapter")) == before + 1
    assert generator.base_url == url.rstrip("/") and generator.model.startswith("lora-")
