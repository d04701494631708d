"""Test doubles for the served app: a scripted ``Generator`` that ``prorag serve``'s
:func:`prorag.serving.create_app` can serve on loopback, so judges and clients are tested (and benchmarked)
over real HTTP without model weights.

Written by hand because the served app needs only a sliver of a tokenizer (encode, decode, length) and a
model that answers from a rule; a real tokenizer or model would make every such test download or load weights.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from prorag.llm.generation import Completion, SamplingParams


class CharTokenizer:
    """A character-level tokenizer: one token per Unicode code point."""

    def __len__(self) -> int:
        return 0x110000

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(char) for char in text]}

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return "".join(chr(token) for token in ids)


class ScriptedModel:
    """A deterministic ``Generator``: :meth:`reply` maps a prompt to the completion (override it); every prompt
    is recorded in :attr:`prompts` and every ``generate`` call counted in :attr:`calls`."""

    def __init__(self) -> None:
        self._tokenizer = CharTokenizer()
        self.prompts: list[str] = []
        self.calls = 0
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> CharTokenizer:
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[dict[str, Any]]) -> str:
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"

    def reply(self, prompt: str) -> str:
        raise NotImplementedError

    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams) -> list[list[Completion]]:
        texts = [prompt if isinstance(prompt, str) else self._tokenizer.decode(prompt) for prompt in prompts]
        with self._lock:
            self.calls += 1
            self.prompts.extend(texts)
        results = []
        for text in texts:
            reply = self.reply(text)
            ids = self._tokenizer(reply)["input_ids"]
            results.append([Completion(text=reply, token_ids=list(ids), logprobs=None, finish_reason="stop",
                                       stop=None, prompt_tokens=len(text))] * params.n)
        return results
