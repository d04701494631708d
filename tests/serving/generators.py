"""Test doubles around a real generator, shared by the serving tests."""

from __future__ import annotations


class WrappedGenerator:
    """The tiny model behind a test's wrapper: the server-facing attributes forwarded, ``generate`` passed through.
    Subclasses add what the test needs (a delay, a signal) before the call; a wrapper whose ``generate`` takes no
    ``cancelled`` is, to the server, a generator that cannot stop a running call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.vocab_size = inner.vocab_size
        self.encode = inner.encode
        self.apply_chat_template = inner.apply_chat_template

    def generate(self, prompts, params):
        return self.inner.generate(prompts, params)
