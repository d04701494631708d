"""Generation through an OpenAI-compatible HTTP server (vLLM, OpenAI, ``prorag serve``).

Requests go through the official ``openai`` ``AsyncOpenAI`` client, one request per prompt (with ``n``
samples), at most ``max_concurrency`` in flight. The client runs on a private event loop in a daemon
thread, so the synchronous :meth:`OpenAICompatibleGenerator.generate` works whether or not the caller has
an event loop running; async callers may ``await`` :meth:`~OpenAICompatibleGenerator.agenerate`.

Timeouts and retries: each attempt — connecting, sending, and receiving the whole reply, body included — has an
overall deadline of ``timeout`` seconds (:class:`~prorag.llm.async_session.AttemptDeadlineClient`; a server that
trickles its reply a byte at a time fails the attempt at the deadline, not never). Attempts are retried by the
client up to ``max_retries`` times on connection errors, timeouts, 408/409/429 and 5xx answers, with exponential
backoff (0.5 s doubling up to 8 s, 0–25 % jitter; a ``Retry-After`` header is honoured), so a request ends within
about ``timeout × (max_retries + 1)`` plus the backoff. A request that still fails raises
:class:`~prorag.llm.generation.GenerationTimeoutError` (timeouts) or
:class:`~prorag.llm.generation.GenerationError` (anything else, including 4xx answers, never retried).

A 200 reply that is no completion — an HTML page (a proxy's login page), a body declared JSON that does not decode
(HTML, bytes that are no UTF-8, an integer of more digits than Python converts, nesting deeper than it parses), fewer
or more than ``n`` choices, a text holding a lone surrogate, ``token_ids`` that are not non-negative integers —
raises :class:`~prorag.llm.generation.GenerationError` naming the endpoint, never a raw ``AttributeError``,
``JSONDecodeError`` or ``RecursionError``.

Token ids: with ``return_token_ids=True`` (the default) the request carries vLLM's ``return_token_ids``
extra field, and the server's ``token_ids`` / ``prompt_token_ids`` are used (vLLM ≥ 0.10.2 and
``prorag serve`` return them). When the server gives none (OpenAI's API: set ``return_token_ids=False``,
it rejects unknown fields), ids are obtained by tokenizing the text locally with ``tokenizer`` if given — an
approximation of what the model generated — and are empty otherwise. ``prompt_tokens`` falls back to the
server's ``usage``.

Stop strings: OpenAI-style servers drop the matched stop string from the text; vLLM and ``prorag serve``
name it in ``stop_reason``, and it is appended back so that ``text`` ends with it, as the
:mod:`prorag.llm.generation` contract says. A server without ``stop_reason`` gives ``stop=None`` and a text
without the stop string.

Seeds: a seeded call sends each of its requests its own seed (:func:`~prorag.llm.generation.request_seeds`), so the
G copies of one prompt are G samples, as in-process, and the same call gives the same samples again.

Sampling fields: every request states its whole sampler. vLLM fills each field a request leaves out from the
model's ``generation_config.json`` (``--generation-config auto``, its default: Qwen2.5-Instruct brings ``top_k`` 20
and ``repetition_penalty`` 1.05), and with ``--logprobs-mode processed_logprobs`` the returned log-probabilities
include those processors while a trainer's do not. So ``temperature`` and ``top_p`` are always sent, and with
``neutral_sampling=True`` (the default) so are :data:`NEUTRAL_SAMPLING` — ``top_k`` 0 (the whole vocabulary),
``min_p`` 0, ``repetition_penalty`` 1, ``presence_penalty`` and ``frequency_penalty`` 0 — the values TRL's own vLLM
client and the in-process backend sample with. Set ``neutral_sampling=False`` for OpenAI's API (it rejects the
vLLM-only fields); ``extra_body`` still overrides any of them.

Chat requests carry ``max_completion_tokens`` (OpenAI's current name for ``max_tokens``; vLLM and
``prorag serve`` accept it too). Log-probabilities are those the server reports for the sampled tokens
(vLLM: by default from the raw model logits; ``prorag serve``: at the sampling temperature).

The API key is ``api_key`` and nothing else: ``None`` sends the placeholder ``"EMPTY"`` (keyless local servers
accept it), never ``$OPENAI_API_KEY`` or any other variable the caller did not name (see :func:`api_key_from_env`,
which reads the one variable a parameter names). It is never logged or shown in ``repr``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import urlsplit

import openai

from prorag.errors import UserError
from prorag.llm.async_session import AsyncOpenAISession
from prorag.llm.generation import (
    ChatMessage,
    Completion,
    GenerationError,
    GenerationTimeoutError,
    Prompt,
    SamplingParams,
    render_chat,
    request_seeds,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

Mode = Literal["completions", "chat"]

NEUTRAL_SAMPLING: Final[dict[str, float | int]] = {
    "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""Sampler fields sent explicitly so a server's generation-config defaults never apply (module docstring)."""

KEYLESS: Final = "EMPTY"
"""What is sent as the key to a keyless server (the ``openai`` client needs some key; vLLM and an unkeyed
``prorag serve`` ignore it)."""


class MissingApiKeyError(UserError, ValueError):
    """The environment variable a parameter names as holding the API key is not set."""


OPENAI_KEY_ENV: Final = "OPENAI_API_KEY"
"""The default ``api_key_env`` of the project's specs: the OpenAI key, paired with OpenAI's API only."""
OPENAI_HOSTS: Final = frozenset({"api.openai.com"})
"""Where the key of :data:`OPENAI_KEY_ENV` may go (over https)."""


def api_key_from_env(api_key_env: str | None, *, endpoint: str, base_url: str | None = None) -> str:
    """The key held by the environment variable named ``api_key_env`` — that variable only.

    ``None`` means a keyless server (:data:`KEYLESS` is sent). A named variable that is unset or empty raises
    :class:`MissingApiKeyError` before any request, so no other key (e.g. ``$OPENAI_API_KEY``) can leak to
    ``endpoint``; set the variable to ``EMPTY`` to talk to a keyless local server under a named variable.

    Pairing rule: ``OPENAI_API_KEY`` (the specs' default) is sent only to ``https://api.openai.com``. Any other
    ``base_url`` with ``api_key_env: OPENAI_API_KEY`` raises :class:`UnpairedApiKeyError` before any request: name
    a variable for that server (``VLLM_API_KEY``, ``JUDGE_API_KEY`` …), or ``null`` for a keyless one. Any other
    variable is paired with the ``base_url`` configured beside it (docs/serving.md, "Keys").
    """
    if api_key_env is None:
        return KEYLESS
    if api_key_env == OPENAI_KEY_ENV and base_url is not None and not _is_openai(base_url):
        raise UnpairedApiKeyError(
            f"api_key_env {OPENAI_KEY_ENV} is sent only to https://api.openai.com, not to {endpoint}: name the "
            "environment variable that holds this server's key (e.g. api_key_env: VLLM_API_KEY), or set "
            "api_key_env to null for a server without a key")
    value = os.environ.get(api_key_env, "").strip()
    if not value:
        raise MissingApiKeyError(
            f"api_key_env names the environment variable {api_key_env!r} for {endpoint}, and it is not set: export "
            f"{api_key_env}=<key> (or {api_key_env}=EMPTY for a keyless local server), or set api_key_env to null "
            "for a server without a key; no other variable is ever read")
    return value


class UnpairedApiKeyError(UserError, ValueError):
    """The OpenAI key variable is configured for an endpoint that is not OpenAI's API."""


def _is_openai(base_url: str) -> bool:
    parts = urlsplit(base_url)
    return parts.scheme == "https" and (parts.hostname or "").lower() in OPENAI_HOSTS


class OpenAICompatibleGenerator:
    """A :class:`~prorag.llm.generation.Generator` backed by an OpenAI-compatible server.

    ``mode="completions"`` sends prompts (strings or token ids) to ``/v1/completions``; ``mode="chat"`` sends
    each string prompt as one user message to ``/v1/chat/completions`` (token-id prompts are decoded with
    ``tokenizer``); :meth:`generate_chat` sends whole conversations. ``tokenizer`` (a registry spec or a
    tokenizer) is optional: it serves :meth:`apply_chat_template`, token-id fallbacks and decoding.
    ``extra_body`` is merged into every request (server-specific fields such as vLLM's ``top_k``).
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, mode: Mode = "completions",
                 max_concurrency: int = 16, timeout: float = 60.0, max_retries: int = 3,
                 tokenizer: str | PreTrainedTokenizerBase | None = None, return_token_ids: bool = True,
                 extra_body: Mapping[str, Any] | None = None, neutral_sampling: bool = True) -> None:
        if mode not in ("completions", "chat"):
            raise ValueError(f"mode must be 'completions' or 'chat', got {mode!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.mode: Mode = mode
        self.max_concurrency = max_concurrency
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.return_token_ids = return_token_ids
        self.extra_body = dict(extra_body or {})
        self.neutral_sampling = neutral_sampling
        self._api_key = api_key or KEYLESS  # never a variable the caller did not name (issue 11)
        if isinstance(tokenizer, str):
            from prorag.llm.registry import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self._tokenizer = tokenizer
        self._session = AsyncOpenAISession("prorag-openai-client", base_url=self.base_url, api_key=self._api_key,
                                           timeout=self.timeout, max_retries=self.max_retries,
                                           max_concurrency=self.max_concurrency)

    def __repr__(self) -> str:
        return (f"OpenAICompatibleGenerator(base_url={self.base_url!r}, model={self.model!r}, mode={self.mode!r}, "
                f"max_concurrency={self.max_concurrency}, timeout={self.timeout}, max_retries={self.max_retries})")

    # ------------------------------------------------------------------------------------ interface

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The local tokenizer, if one was given."""
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[ChatMessage]) -> str:
        """Template a conversation locally (needs ``tokenizer``)."""
        if self._tokenizer is None:
            raise ValueError("apply_chat_template needs a local tokenizer: pass tokenizer=… "
                             "or use generate_chat, which lets the server apply its template")
        return render_chat(self._tokenizer, messages)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """Generate ``params.n`` completions per prompt (blocks; safe inside or outside an event loop)."""
        return self._session.run(self._requests(prompts, params))

    def generate_chat(self, conversations: Sequence[Sequence[ChatMessage]],
                      params: SamplingParams) -> list[list[Completion]]:
        """Generate for whole conversations (chat mode: the server templates; completions mode: locally)."""
        return self._session.run(self._chat_requests(conversations, params))

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """Async :meth:`generate`, usable from any event loop."""
        return await self._session.submit(self._requests(prompts, params))

    async def agenerate_chat(self, conversations: Sequence[Sequence[ChatMessage]],
                             params: SamplingParams) -> list[list[Completion]]:
        """Async :meth:`generate_chat`, usable from any event loop."""
        return await self._session.submit(self._chat_requests(conversations, params))

    def _requests(self, prompts: Sequence[Prompt],
                  params: SamplingParams) -> Coroutine[Any, Any, list[list[Completion]]]:
        """Validate the prompts now (errors raise in the caller) and return the coroutine doing the requests."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of prompts, not a single string")
        if self.mode == "chat":
            conversations = [[{"role": "user", "content": self._as_text(prompt)}] for prompt in prompts]
            return self._gather(self._chat, conversations, params)
        return self._gather(self._complete, [self._check_prompt(prompt) for prompt in prompts], params)

    def _chat_requests(self, conversations: Sequence[Sequence[ChatMessage]],
                       params: SamplingParams) -> Coroutine[Any, Any, list[list[Completion]]]:
        if self.mode == "completions":
            return self._requests([self.apply_chat_template(messages) for messages in conversations], params)
        checked = [[dict(message) for message in messages] for messages in conversations]
        if any(not messages for messages in checked):
            raise ValueError("empty conversation")
        return self._gather(self._chat, checked, params)

    def close(self) -> None:
        """Close the HTTP client and stop the private event loop (the generator restarts them if used again)."""
        self._session.close()

    def __enter__(self) -> OpenAICompatibleGenerator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -------------------------------------------------------------------------------- requests

    @staticmethod
    async def _gather(request: Callable[[Any, SamplingParams], Awaitable[list[Completion]]], items: list[Any],
                      params: SamplingParams) -> list[list[Completion]]:
        # one seed per request, not the call's seed on all: a server seeds each request alone (generation.py)
        tasks = [asyncio.ensure_future(request(item, replace(params, seed=seed)))
                 for item, seed in zip(items, request_seeds(params.seed, len(items)), strict=True)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:  # one request failed for good: do not leave the others running
                task.cancel()
            raise

    def _common(self, params: SamplingParams) -> dict[str, Any]:
        options: dict[str, Any] = {"model": self.model, "n": params.n, "temperature": params.temperature,
                                   "top_p": params.top_p}
        if self.neutral_sampling:  # OpenAI fields as top-level options, vLLM's own through extra_body
            options["presence_penalty"] = NEUTRAL_SAMPLING["presence_penalty"]
            options["frequency_penalty"] = NEUTRAL_SAMPLING["frequency_penalty"]
        if params.stop:
            options["stop"] = list(params.stop)
        if params.seed is not None:
            options["seed"] = params.seed
        extra: dict[str, Any] = {}
        if self.neutral_sampling:
            extra.update({key: NEUTRAL_SAMPLING[key] for key in ("top_k", "min_p", "repetition_penalty")})
        extra.update(self.extra_body)
        if self.return_token_ids:
            extra.setdefault("return_token_ids", True)
        if extra:
            options["extra_body"] = extra
        return options

    async def _complete(self, prompt: Prompt, params: SamplingParams) -> list[Completion]:
        options = self._common(params)
        options.update(prompt=prompt, max_tokens=params.max_new_tokens)
        if params.logprobs:
            options["logprobs"] = 1
        response = await self._call("completions", options)
        completions = []
        for choice in self._choices(response, "completions", params.n):
            try:
                text = choice.text
                token_logprobs = choice.logprobs.token_logprobs if choice.logprobs is not None else None
            except AttributeError as error:
                raise self._malformed("completions", f"a choice without {error.name}") from None
            completions.append(self._completion(choice, self._text(text, "completions"), token_logprobs, response,
                                                prompt, params, "completions"))
        return completions

    async def _chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> list[Completion]:
        options = self._common(params)
        options.update(messages=messages, max_completion_tokens=params.max_new_tokens)
        if params.logprobs:
            options["logprobs"] = True
        response = await self._call("chat", options)
        completions = []
        for choice in self._choices(response, "chat", params.n):
            try:
                content = choice.logprobs.content if choice.logprobs is not None else None
                token_logprobs = [item.logprob for item in content] if content is not None else None
                text = choice.message.content
            except (AttributeError, TypeError) as error:
                raise self._malformed("chat", f"a choice without a message: {error}") from None
            completions.append(self._completion(choice, self._text(text, "chat"), token_logprobs, response, None,
                                                params, "chat"))
        return completions

    def _malformed(self, endpoint: str, detail: str) -> GenerationError:
        return GenerationError(f"{self.base_url} ({endpoint}) answered 200 with a malformed reply: {detail}")

    def _choices(self, response: Any, endpoint: str, n: int) -> list[Any]:
        """The reply's ``n`` choices in index order, or a :class:`GenerationError` naming the endpoint (an HTML page
        comes back from the client as a plain string; garbage JSON as a completion without choices)."""
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list):
            shown = response if isinstance(response, str) else type(response).__name__
            raise self._malformed(endpoint, f"not a completion: {str(shown)[:200]!r}")
        if len(choices) != n or not all(isinstance(getattr(choice, "index", None), int) for choice in choices):
            raise self._malformed(endpoint, f"{len(choices)} choices with indexes, expected n={n}")
        return sorted(choices, key=lambda choice: choice.index)

    def _text(self, text: Any, endpoint: str) -> str:
        """A choice's text: a string that encodes as UTF-8 (a lone surrogate cannot be tokenized or saved)."""
        if text is None:
            return ""
        if not isinstance(text, str):
            raise self._malformed(endpoint, f"the text is {type(text).__name__}, not a string")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise self._malformed(endpoint, f"the text holds a lone surrogate U+{ord(text[error.start]):04X} at "
                                            f"character {error.start}") from None
        return text

    async def _call(self, endpoint: str, options: dict[str, Any]) -> Any:
        client, semaphore = self._session.client_and_semaphore()
        async with semaphore:
            try:
                if endpoint == "chat":
                    return await client.chat.completions.create(**options)
                return await client.completions.create(**options)
            except openai.APITimeoutError as error:
                raise GenerationTimeoutError(
                    f"request to {self.base_url} ({endpoint}) timed out after {self.timeout:g} s per attempt "
                    f"and {self.max_retries} retries") from error
            except openai.APIConnectionError as error:
                raise GenerationError(f"cannot reach {self.base_url} ({endpoint}) after {self.max_retries} "
                                      f"retries: {error}") from error
            except openai.APIStatusError as error:
                raise GenerationError(f"{self.base_url} ({endpoint}) answered {error.status_code}: "
                                      f"{_error_message(error)}") from error
            except (ValueError, RecursionError) as error:  # a body declared JSON that the client cannot decode
                raise self._malformed(endpoint, f"not JSON ({type(error).__name__}: {str(error)[:120]})") from None

    def _completion(self, choice: Any, text: str, token_logprobs: list[float | None] | None, response: Any,
                    prompt: Prompt | None, params: SamplingParams, endpoint: str) -> Completion:
        extra = getattr(choice, "model_extra", None) or {}
        finish = "length" if choice.finish_reason == "length" else "stop"
        stop_reason = extra.get("stop_reason")
        stop = stop_reason if finish == "stop" and isinstance(stop_reason, str) and stop_reason else None
        if stop is not None and not text.endswith(stop):
            text += stop
        token_ids = extra.get("token_ids")
        if token_ids is None:
            token_ids = self._local_ids(text)
        elif not isinstance(token_ids, list) or not all(isinstance(token, int) and not isinstance(token, bool)
                                                        and token >= 0 for token in token_ids):
            raise self._malformed(endpoint, f"token_ids must be a list of non-negative integers, got "
                                            f"{json.dumps(token_ids, default=str)[:120]}")
        prompt_ids = extra.get("prompt_token_ids") or (getattr(response, "model_extra", None) or {}).get(
            "prompt_token_ids")
        usage = getattr(response, "usage", None)
        if isinstance(prompt_ids, list):
            prompt_tokens = len(prompt_ids)
        elif isinstance(prompt, list):
            prompt_tokens = len(prompt)
        elif isinstance(getattr(usage, "prompt_tokens", None), int):
            prompt_tokens = usage.prompt_tokens
        else:
            prompt_tokens = len(self._local_ids(prompt)) if isinstance(prompt, str) else 0
        logprobs = None
        if params.logprobs and token_logprobs is not None:
            try:
                logprobs = [float(value) if value is not None else float("nan") for value in token_logprobs]
            except (TypeError, ValueError):
                raise self._malformed(endpoint, "log-probabilities that are not numbers") from None
        return Completion(text=text, token_ids=[int(token) for token in token_ids], logprobs=logprobs,
                          finish_reason=finish, stop=stop, prompt_tokens=prompt_tokens)

    # --------------------------------------------------------------------------------- helpers

    def _local_ids(self, text: str) -> list[int]:
        if self._tokenizer is None:
            return []
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def _check_prompt(self, prompt: Prompt) -> Prompt:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("empty prompt")
            return prompt
        ids = list(prompt)
        if not ids or any(isinstance(token, bool) or not isinstance(token, int) or token < 0 for token in ids):
            raise ValueError("a token-id prompt must be a non-empty list of non-negative ints")
        return ids

    def _as_text(self, prompt: Prompt) -> str:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("empty prompt")
            return prompt
        if self._tokenizer is None:
            raise ValueError("chat mode needs a local tokenizer to send token-id prompts")
        return self._tokenizer.decode(list(prompt))


def _error_message(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(error.message)
