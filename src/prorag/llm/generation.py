"""One generation interface for every backend: sampling parameters, completions, the ``Generator`` protocol.

Backends:

- :class:`prorag.llm.transformers_backend.TransformersGenerator`: in-process transformers model, batched.
- :class:`prorag.llm.openai_backend.OpenAICompatibleGenerator`: any OpenAI-compatible HTTP server (vLLM,
  OpenAI, ``prorag serve``).

Contract shared by all backends:

- ``generate(prompts, params)`` takes prompt strings or already-tokenized id lists and returns, per prompt,
  ``params.n`` :class:`Completion` objects.
- A completion that hit one of ``params.stop`` has ``finish_reason="stop"``, ``stop`` set to that string and a
  ``text`` that *ends with* it (unlike the OpenAI API, which drops it); the token ids run up to and including
  the token that completed the stop string. End of sequence also gives ``finish_reason="stop"`` with
  ``stop=None`` (the EOS id is the last of ``token_ids`` and is not in ``text``). ``finish_reason="length"``
  means ``max_new_tokens`` were generated without a stop.
- With several stop strings, the first one to be *completed* ends generation; if two complete at the same
  token, the one that starts first wins (as :func:`prorag.protocol.markup.cut_at_first_stop`).
- ``params.seed`` makes a *call* reproducible; the prompts of one call still draw independent samples, even when
  they are the same prompt (the G copies of a question in a GRPO group). The in-process backend seeds one RNG for
  the batch; a server backend seeds a generator per request, so it sends prompt ``i`` the seed
  :func:`request_seeds` derives from ``(seed, i)`` — one seed on every request would give G identical samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length"]
Prompt = str | list[int]
ChatMessage = Mapping[str, Any]


class GenerationError(RuntimeError):
    """A backend could not produce completions (server error, connection failure, bad response)."""


class GenerationTimeoutError(GenerationError, TimeoutError):
    """A request did not complete within its timeout, retries included."""


class GenerationCancelled(GenerationError):
    """A generate call stopped early because its ``cancelled`` check said no one waits for the result."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``temperature=0`` is greedy decoding; ``seed`` makes sampling reproducible.

    ``stop`` may be given as a string or any sequence of strings; it is stored as a tuple.
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive int, got {self.n!r}")
        if any(not isinstance(item, str) or not item for item in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """True for deterministic argmax decoding."""
        return self.temperature == 0.0


@dataclass(frozen=True)
class Completion:
    """One generated sample.

    ``logprobs`` (when requested) has one entry per token id: the log-probability of the chosen token.
    ``prompt_tokens`` is the length of the prompt in tokens.
    """

    text: str
    token_ids: list[int] = field(repr=False)
    logprobs: list[float] | None = field(repr=False)
    finish_reason: FinishReason
    stop: str | None
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)


@runtime_checkable
class Generator(Protocol):
    """A text generator: prompts (strings or token ids) in, ``n`` completions per prompt out."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The tokenizer of the model (``None`` for a remote backend configured without one)."""
        ...

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """Generate ``params.n`` completions for each prompt, in prompt order."""
        ...

    def apply_chat_template(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt string for a conversation, ready for the assistant's turn."""
        ...


REQUEST_SEED_BITS: Final = 62
"""Derived request seeds lie in [0, 2**62): inside every server's int64 seed field, with room for vLLM's ``seed + j``
of the j-th sample of an ``n > 1`` request."""


def request_seeds(seed: int | None, count: int) -> list[int | None]:
    """One seed per request of a call seeded with ``seed``: distinct per position, the same for the same call.

    NumPy's ``SeedSequence`` spawns the children, so seeds of neighbouring calls (the engine's ``seed + turn``) share
    no structure; ``None`` (unseeded) stays ``None`` on every request.
    """
    if seed is None:
        return [None] * count
    children = np.random.SeedSequence(seed % 2**64).spawn(count)
    return [int(child.generate_state(1, np.uint64)[0]) >> (64 - REQUEST_SEED_BITS) for child in children]


def policy_label(generator: object) -> str:
    """What progress bars call a policy: the ``label`` the composition root gives it (model and adapter version,
    :attr:`prorag.specs.PolicySpec.label`), else the generator's class name."""
    return str(getattr(generator, "label", None) or type(generator).__name__)


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[ChatMessage],
                add_generation_prompt: bool = True) -> str:
    """Apply the tokenizer's chat template, returning text (tokenize it without adding special tokens)."""
    text = tokenizer.apply_chat_template([dict(message) for message in messages], tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise TypeError(f"chat template returned {type(text).__name__}, expected str")
    return text


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Cut ``text`` right after its first stop string (earliest start); ``(text, None)`` when none occurs."""
    hits = [(index, stop) for stop in stops if (index := text.find(stop)) != -1]
    if not hits:
        return text, None
    index, stop = min(hits)
    return text[: index + len(stop)], stop


def generate_chat(generator: Generator, conversations: Sequence[Sequence[ChatMessage]],
                  params: SamplingParams) -> list[list[Completion]]:
    """Generate for chat conversations with any backend (its own ``generate_chat`` when it has one)."""
    native = getattr(generator, "generate_chat", None)
    if callable(native):
        return native(conversations, params)
    return generator.generate([generator.apply_chat_template(messages) for messages in conversations], params)
