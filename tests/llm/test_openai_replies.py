"""A 200 reply that is no completion (issue 32, bug 6) — an HTML page, no choices, a lone surrogate, non-integer
``token_ids`` — is a :class:`GenerationError` naming the endpoint from the OpenAI-compatible backend (KG extraction
and ``policy.backend: openai`` use it), and an unknown verdict from the LLM judge, never a good one."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from prorag.data.records import Passage
from prorag.judges.cache import JudgeCache
from prorag.judges.llm_judge import LLMJudge
from prorag.kg import ExtractionSettings, extract_triplets
from prorag.llm.generation import GenerationError, SamplingParams
from prorag.llm.openai_backend import OpenAICompatibleGenerator


def _completion(content: str, **choice: Any) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content},
                         "text": content, **choice}]}  # both shapes: a chat and a text completion


# What the server answers, chosen by a word of the request. Raw JSON bytes: "\ud800" must reach the client as is.
REPLIES: dict[str, tuple[bytes, str]] = {
    "html": (b"<!doctype html><html><body>Please sign in</body></html>", "text/html"),
    "nochoices": (json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                              "choices": []}).encode(), "application/json"),
    "surrogate": (json.dumps(_completion("SURROGATE")).replace("SURROGATE", "\\ud800 <answer>True</answer>").encode(),
                  "application/json"),
    "badids": (json.dumps(_completion("fine", token_ids=["a", 1.5])).encode(), "application/json"),
    "flood": (json.dumps(_completion("\n".join(f"Town 1 | has | river R{n}" for n in range(2000))
                                     + "\n" + "x" * (2 << 20))).encode(), "application/json"),
}


class ScriptedHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
        word = next((word for word in REPLIES if word in body), "html")
        reply, kind = REPLIES[word]
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.mark.parametrize("word", ["html", "nochoices", "surrogate", "badids"])
@pytest.mark.parametrize("mode", ["chat", "completions"])
def test_a_malformed_200_is_a_generation_error_naming_the_endpoint(url, word, mode):
    with OpenAICompatibleGenerator(url, "m", mode=mode, max_retries=0, timeout=10) as generator, \
            pytest.raises(GenerationError) as raised:
        generator.generate([f"say {word}"], SamplingParams(max_new_tokens=4))
    message = str(raised.value)
    assert url in message and mode in message and "malformed reply" in message, message


def test_a_judge_given_a_lone_surrogate_reply_returns_an_unknown_verdict(url, tmp_path):
    with LLMJudge(url, "m", max_retries=0, timeout=10, cache=JudgeCache(tmp_path / "judge.db")) as judge:
        (verdict,) = judge.equivalent([("surrogate a", "b")])
    assert verdict.value is None and "malformed reply" in verdict.error


def test_kg_extraction_caps_a_flooding_endpoint(url):
    chunk = Passage(id="p1", title="Town 1", text="Town 1 lies on river R1 flood.")
    settings = ExtractionSettings(model="m", endpoint=url, filter_ungrounded=False, show_progress=False)
    with OpenAICompatibleGenerator(url, "m", mode="chat", max_retries=0, timeout=30) as generator:
        result = extract_triplets(generator, [chunk], settings)
    assert len(result.triplets) == settings.max_triplets_per_reply == 64
    assert result.stats.triplets_over_cap > 0 and result.stats.oversized_replies == 1
