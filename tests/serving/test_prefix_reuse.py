"""``prorag serve`` reuses its KV cache for a request whose prompt extends an earlier one and reports the hit rate."""

from __future__ import annotations

import httpx
import openai

from prorag.llm.generation import SamplingParams
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.serving import create_app, serve_in_thread


def test_a_prompt_extending_an_earlier_one_reuses_the_cache(tiny_generator):
    generator = TransformersGenerator((tiny_generator.model, tiny_generator.tokenizer), batch_size=4)
    fresh = TransformersGenerator((tiny_generator.model, tiny_generator.tokenizer), batch_size=4, prefix_cache_mb=0)
    url, stop = serve_in_thread(create_app(generator, "tiny", max_batch_size=4, batch_wait_ms=1))
    try:
        with openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30) as client:
            prompt = generator.encode("Question: who wrote Moby-Dick? Think step by step.")
            first = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                              extra_body={"return_token_ids": True}).choices[0]
            turn = [*prompt, *first.model_extra["token_ids"], *generator.encode(" <context>Melville</context>")]
            second = client.completions.create(model="tiny", prompt=turn, max_tokens=6, temperature=0,
                                               extra_body={"return_token_ids": True}).choices[0]
        health = httpx.get(url.removesuffix("/v1") + "/health", timeout=10).json()["stats"]["prefix_cache"]
    finally:
        stop()
    expected = fresh.generate([turn], SamplingParams(max_new_tokens=6))[0][0]
    assert second.model_extra["token_ids"] == expected.token_ids  # reuse changes nothing in the reply
    assert health["cached_tokens"] >= len(prompt) + len(first.model_extra["token_ids"]) - 1
    assert health["cache_hit_rate"] == round(health["cached_tokens"] / health["prompt_tokens"], 4) > 0.4
