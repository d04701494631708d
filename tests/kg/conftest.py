"""A scripted generator for extraction tests: replies chosen by the passage in the prompt, calls recorded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from prorag.llm.generation import Completion, SamplingParams


class ScriptedExtractor:
    """Implements the Generator protocol; ``reply(prompt)`` gives the text; ``fail_after`` calls raise."""

    def __init__(self, reply: Callable[[str], str], fail_after: int | None = None) -> None:
        self.reply = reply
        self.fail_after = fail_after
        self.calls = 0
        self.prompts: list[str] = []

    @staticmethod
    def passage_of(prompt: str) -> str:
        """The passage of an extraction prompt rendered by :meth:`apply_chat_template`."""
        return prompt.rsplit("<user>", 1)[1]

    @property
    def tokenizer(self) -> None:
        return None

    def apply_chat_template(self, messages: Sequence[dict[str, Any]]) -> str:
        return "\n".join(f"<{message['role']}>{message['content']}" for message in messages)

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Completion]]:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        self.prompts.extend(prompts)
        out = []
        for prompt in prompts:
            text = self.reply(prompt)
            out.append([Completion(text=text, token_ids=list(range(len(text.split()) + 1)), logprobs=None,
                                   finish_reason="stop", stop=None, prompt_tokens=len(prompt.split()))])
        return out


@pytest.fixture
def scripted() -> type[ScriptedExtractor]:
    return ScriptedExtractor
