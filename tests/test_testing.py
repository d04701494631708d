"""The served app's test doubles: the character tokenizer round-trips, the scripted model answers by rule."""

from __future__ import annotations

from prorag.llm.generation import SamplingParams
from prorag.serving import create_app, serve_in_thread
from prorag.testing import CharTokenizer, ScriptedModel


class Echo(ScriptedModel):
    def reply(self, prompt: str) -> str:
        return prompt.rsplit("<|user|>\n", 1)[-1].split("\n")[0].upper()


def test_char_tokenizer_round_trips_any_text() -> None:
    tokenizer = CharTokenizer()
    text = "Zürich <search>q</search> 東京"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text) and tokenizer.decode(ids) == text


def test_scripted_model_replies_per_prompt_and_records_prompts_and_calls() -> None:
    model = Echo()
    prompt = model.apply_chat_template([{"role": "user", "content": "paris"}])
    token_prompt = model.tokenizer(model.apply_chat_template([{"role": "user", "content": "rome"}]))["input_ids"]
    results = model.generate([prompt, token_prompt], SamplingParams(max_new_tokens=8, n=2))
    assert [[c.text for c in result] for result in results] == [["PARIS", "PARIS"], ["ROME", "ROME"]]
    assert results[0][0].token_ids == [ord(char) for char in "PARIS"]
    assert results[0][0].prompt_tokens == len(prompt)
    assert model.calls == 1 and model.prompts[1].endswith("rome\n<|assistant|>\n")


def test_scripted_model_is_served_over_loopback_http() -> None:
    import httpx

    url, stop = serve_in_thread(create_app(Echo(), "echo", max_batch_size=4, batch_wait_ms=1))
    try:
        reply = httpx.post(f"{url}/chat/completions", timeout=10,
                           json={"model": "echo", "messages": [{"role": "user", "content": "berlin"}]})
    finally:
        stop()
    assert url.startswith("http://127.0.0.1:")
    assert reply.json()["choices"][0]["message"]["content"] == "BERLIN"
