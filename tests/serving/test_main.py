"""``prorag serve`` as a process: ``--mixed-precision bf16`` serves what the in-process bf16 generator computes."""

from __future__ import annotations

import sys

import httpx
import pytest

from prorag.llm.factory import build_generator
from prorag.llm.generation import SamplingParams
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.server_process import free_port, start_server

PROMPT = "Question: who wrote Hamlet?\nAnswer:"


def test_serve_with_mixed_precision_returns_the_in_process_bf16_tokens(tmp_path, one_torch_thread):
    logprobs = {}
    for precision in ("no", "bf16"):
        generator = build_generator(BUNDLED_TINY_LLAMA, mixed_precision=precision)
        params = SamplingParams(max_new_tokens=12, logprobs=True)
        logprobs[precision] = generator.generate([PROMPT], params)[0][0].logprobs
    assert max(abs(a - b) for a, b in zip(logprobs["no"], logprobs["bf16"], strict=True)) > 1e-3  # told apart

    port = free_port()
    server = start_server([sys.executable, "-m", "prorag.console", "serve", "--model", BUNDLED_TINY_LLAMA,
                           "--mixed-precision", "bf16", "--port", str(port), "--torch-threads", "1"],
                          f"http://127.0.0.1:{port}/v1", tmp_path / "serve.log", served_name=BUNDLED_TINY_LLAMA,
                          startup_timeout=120)
    try:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                           json={"model": BUNDLED_TINY_LLAMA, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                 "logprobs": 1})
        assert reply.status_code == 200, reply.text
    finally:
        server.stop()
    assert reply.json()["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(logprobs["bf16"], abs=1e-6)
