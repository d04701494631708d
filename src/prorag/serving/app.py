"""An OpenAI-compatible HTTP server for any :class:`~prorag.llm.generation.Generator`.

Endpoints: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/completions``, ``POST /v1/chat/completions``
and ``GET /health`` (status and batching counters; no key needed). Supported request fields: ``model``,
``prompt`` (string, list of strings, token ids or list of token-id lists) or ``messages``, ``max_tokens``
(chat: also ``max_completion_tokens``), ``n``, ``temperature``, ``top_p``, ``stop`` (string or list),
``seed``, ``logprobs`` (completions: 0 or 1; chat: bool with ``top_logprobs`` 0 or 1 — only the sampled
token's log-probability is known, at the sampling temperature), and vLLM's extras ``return_token_ids``
(``token_ids`` and ``prompt_token_ids`` on each choice, and top level for chat) and
``include_stop_str_in_output``. As in the OpenAI API the matched stop string is dropped from the text
unless asked for; ``stop_reason`` names it (``null`` at end of sequence). Other OpenAI fields (penalties,
``user`` …) are accepted and ignored; ``stream``, ``echo`` and ``suffix`` are refused. Without
``max_tokens`` a request gets ``default_max_tokens``. ``usage`` counts each prompt once and every generated
token of every choice.

Batching: requests arriving within ``batch_wait_ms`` of each other (up to ``max_batch_size`` prompts and at most
four windows after the first, plus whatever queued while the previous batch ran) are grouped by identical
sampling parameters, and each group becomes one ``generator.generate`` call on a single worker thread, so the
event loop stays responsive. A seeded sampling request runs on its own, so its samples do not depend on other
traffic. A generate call decodes at most ``max_share_tokens`` tokens per sequence; unfinished sequences queue again,
continued from what they generated, so a small request never waits behind a whole long completion. A request whose
client disconnects is dropped before its next share (``stats.abandoned``), and a generate call running for clients
that have all left stops at its next decoded token (``stats.cancelled_calls``). Tokenizing and
chat templating run on their own thread, after a refusal by length alone of a text too long for the context window.
Counters are on ``app.state.stats`` (:class:`ServerStats`).

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for bad requests
(malformed JSON, JSON nested too deeply, a lone surrogate in a string, unknown model, empty prompt or messages,
out-of-range ``n``/``max_tokens``/…), 401 for a missing or wrong key when ``api_key`` is set
(``Authorization: Bearer <key>``), 404 for unknown routes, 413 for oversized bodies, 415 for a body that is not
``application/json``, 500 only when generation fails; a bad request never drops the keep-alive connection
(:mod:`prorag.serving.guard`). By default only loopback ``Host`` names are answered (400 otherwise): pass
``allowed_hosts=None`` when the server is deliberately bound to another interface.

Hand-written rather than ``transformers serve`` (5.23): that server ignores ``logprobs``/``top_logprobs``/``n`` with
a warning, has no API key, no LoRA adapters and no Host check, and loads any model on an unauthenticated
``/load_model``; vLLM has no CPU build here. Point ``policy.backend: openai`` at vLLM on GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import inspect
import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from prorag.llm.generation import (
    Completion,
    GenerationCancelled,
    Generator,
    SamplingParams,
    cut_at_stop,
    request_seeds,
)
from prorag.llm.prefix_cache import GenerationStats
from prorag.serving.batching import MicroBatcher
from prorag.serving.guard import (
    BODY_DEADLINE_S,
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_TIMEOUT_S,
    LOOPBACK_HOSTS,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    BadRequestBody,
    ConnectionLimits,
    check_content_type,
    check_request_limits,
    parse_json_body,
    read_body,
    restrict_hosts,
    server_config,
)

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
T = TypeVar("T")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MAX_STOP_STRINGS = 16
_PLACEHOLDER = re.compile("(\ue000\\d+\ue001)")
DISCONNECT_POLL_S = 0.2  # how often a waiting request checks that its client is still connected


class ApiError(Exception):
    """A request error answered with ``status`` and an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        return _error_body(self.message, self.kind, self.param, self.code)


def _error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class ServerStats:
    """Counters of the server and its micro-batcher."""

    requests: int = 0  # generation requests accepted (valid)
    prompts: int = 0
    generate_calls: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))  # prompts per generate call
    largest_batch: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generate_seconds: float = 0.0
    rejected: int = 0  # 4xx answers
    abandoned: int = 0  # requests dropped because their client disconnected before the answer
    cancelled_calls: int = 0  # generate calls stopped mid-decoding because every client of their batch had left
    errors: int = 0  # failed generate calls
    started_at: float = field(default_factory=time.time)
    generation: GenerationStats | None = None  # the in-process generator's prefill / KV-reuse / decode counters

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy of the counters (``prefix_cache``: tokens reused from the KV cache and the hit rate)."""
        sizes = list(self.batch_sizes)
        cache = {} if self.generation is None else {"prefix_cache": self.generation.snapshot()}
        return {**cache,
            "requests": self.requests, "prompts": self.prompts, "generate_calls": self.generate_calls,
            "largest_batch": self.largest_batch, "mean_batch": sum(sizes) / len(sizes) if sizes else 0.0,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "generate_seconds": round(self.generate_seconds, 4), "rejected": self.rejected, "abandoned": self.abandoned,
            "cancelled_calls": self.cancelled_calls, "errors": self.errors,
            "uptime_s": round(time.time() - self.started_at, 1),
        }


@dataclass
class _Pending:
    prompts: list[list[int]]
    params: SamplingParams
    future: asyncio.Future[list[list[Completion]]]


class GenerationBatcher(MicroBatcher[_Pending]):
    """Gathers concurrent requests; those with identical sampling parameters share one ``generate`` call."""

    def __init__(self, generator: Generator, stats: ServerStats, *, max_batch_size: int = 8,
                 batch_wait_s: float = 0.005) -> None:
        super().__init__(name="prorag-serve-batcher", window_s=batch_wait_s, max_size=max_batch_size)
        self.generator = generator
        self.stats = stats
        # a generator that takes a ``cancelled`` check (the in-process one) stops decoding for clients that left
        self.cancellable = "cancelled" in inspect.signature(generator.generate).parameters

    async def submit(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """Queue one request's prompts and wait for their completions."""
        future: asyncio.Future[list[list[Completion]]] = asyncio.get_running_loop().create_future()
        return await self.enqueue(_Pending(prompts, params, future))

    def size(self, item: _Pending) -> int:
        return len(item.prompts)

    async def execute(self, batch: list[_Pending]) -> None:
        groups: dict[Any, list[_Pending]] = {}
        for item in batch:
            # Seeded sampling runs alone: its samples must not depend on what else shares the batch.
            key = item.params if item.params.greedy or item.params.seed is None else id(item)
            groups.setdefault(key, []).append(item)
        for group in groups.values():
            await self._generate(group)

    async def _generate(self, group: list[_Pending]) -> None:
        group = [item for item in group if not item.future.done()]  # drop requests whose client left
        if not group:
            return
        prompts = [prompt for item in group for prompt in item.prompts]
        started = time.perf_counter()
        self.stats.generate_calls += 1
        self.stats.batch_sizes.append(len(prompts))
        self.stats.largest_batch = max(self.stats.largest_batch, len(prompts))
        generate: Callable[..., list[list[Completion]]] = self.generator.generate
        if self.cancellable:
            # read on the worker thread after every decoded token: a cancelled future is done
            generate = functools.partial(generate, cancelled=lambda: all(item.future.done() for item in group))
        try:
            results = await self.run_blocking(generate, prompts, group[0].params)
            if len(results) != len(prompts):
                raise RuntimeError(f"generator returned {len(results)} results for {len(prompts)} prompts")
        except GenerationCancelled:
            self.stats.cancelled_calls += 1
            logger.info("every client of a batch of %d prompts left: its generate call stopped", len(prompts))
            return
        except Exception as error:
            self.stats.errors += 1
            logger.exception("generation failed for a batch of %d prompts", len(prompts))
            for item in group:
                if not item.future.done():
                    item.future.set_exception(error)
            return
        finally:
            self.stats.generate_seconds += time.perf_counter() - started
        offset = 0
        for item in group:
            share = results[offset : offset + len(item.prompts)]
            offset += len(item.prompts)
            if not item.future.done():
                item.future.set_result(share)


class _ClientGone(Exception):
    """The client of a request disconnected before its answer."""


def _longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters of text one token can stand for (the longest vocabulary entry: a byte-level or
    SentencePiece entry is at least as long as the text it decodes to); None when the vocabulary is unknown."""
    try:
        longest = max((len(token) for token in tokenizer.get_vocab()), default=0)
    except Exception:  # a tokenizer without a readable vocabulary: no cheap refusal, encoding still off the loop
        return None
    return longest or None


# ------------------------------------------------------------------------------------ field parsing


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(body: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise ApiError(400, f"{name} must be an integer, got {json.dumps(value)}", param=name, code="invalid_type")
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}, got {value}", param=name,
                       code="invalid_value")
    return value


def _float_field(body: dict[str, Any], name: str, default: float, low: float, high: float,
                 *, open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{name} must be a number, got {json.dumps(value)}", param=name, code="invalid_type")
    if not (low < value if open_low else low <= value) or not value <= high:
        bounds = f"({low}, {high}]" if open_low else f"[{low}, {high}]"
        raise ApiError(400, f"{name} must be in {bounds}, got {value}", param=name, code="invalid_value")
    return float(value)


def _bool_field(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean, got {json.dumps(value)}", param=name, code="invalid_type")
    return value


def _stop_field(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) and item for item in items):
        raise ApiError(400, "stop must be a non-empty string or a list of non-empty strings", param="stop",
                       code="invalid_value")
    if len(items) > _MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {_MAX_STOP_STRINGS} stop strings, got {len(items)}", param="stop",
                       code="invalid_value")
    return tuple(dict.fromkeys(items))


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise ApiError(400, "streaming is not supported by this server; send stream=false", param="stream",
                       code="unsupported_parameter")
    if body.get("echo"):
        raise ApiError(400, "echo is not supported by this server", param="echo", code="unsupported_parameter")
    if body.get("suffix"):
        raise ApiError(400, "suffix is not supported by this server", param="suffix", code="unsupported_parameter")


def _message_text(message: Any, position: int) -> dict[str, str]:
    param = f"messages[{position}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{param} must be an object with role and content", param=param, code="invalid_type")
    role = message.get("role")
    if role not in _ROLES:
        raise ApiError(400, f"{param}.role must be one of {sorted(_ROLES)}, got {json.dumps(role)}",
                       param=f"{param}.role", code="invalid_value")
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{param}.content: only text parts are supported", param=f"{param}.content",
                               code="invalid_value")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise ApiError(400, f"{param}.content must be a string or a list of text parts", param=f"{param}.content",
                       code="invalid_type")
    return {"role": role, "content": content}


# --------------------------------------------------------------------------------------- the app


def create_app(generator: Generator, model_name: str, max_batch_size: int = 8, batch_wait_ms: float = 5, *,
               api_key: str | None = None, max_tokens_limit: int = 4096, default_max_tokens: int | None = None,
               max_n: int = 16, max_prompts: int = 64, context_window: int | None = None,
               max_request_sequences: int = 256, max_share_tokens: int | None = None, max_body_bytes: int = 8 << 20,
               body_timeout_s: float = BODY_TIMEOUT_S, body_deadline_s: float = BODY_DEADLINE_S,
               max_json_depth: int = MAX_JSON_DEPTH, max_int_digits: int = MAX_INT_DIGITS,
               keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S, header_timeout_s: float = HEADER_TIMEOUT_S,
               max_connections: int | None = None,
               allowed_hosts: Sequence[str] | None = LOOPBACK_HOSTS) -> FastAPI:
    """The FastAPI app serving ``generator`` as ``model_name`` (see the module docstring for the contract).

    Every limit of ``docs/serving.md`` is an argument here; the connection ones (``keep_alive_timeout_s``,
    ``header_timeout_s``, ``max_connections``) are kept in ``app.state.connection_limits`` and applied by
    :func:`prorag.serving.guard.server_config` (:func:`serve_in_thread`, ``prorag serve``).

    ``max_share_tokens`` bounds the tokens one generate call decodes for a request: longer completions are
    continued in later calls, so a small request waits for at most one such segment of a long one (default: no
    bound, one call per share: with 64 a staying heavy request was not seen to finish on a loaded 2-core machine,
    not yet explained; see docs/serving.md).
    ``context_window`` bounds prompt + ``max_tokens`` (default: the model's ``max_position_embeddings`` when
    the generator exposes its model). ``default_max_tokens`` applies to requests without ``max_tokens``
    (default: 256, capped at ``max_tokens_limit``). ``api_key``, when given, is required as a bearer token
    on ``/v1``. ``allowed_hosts`` are the ``Host`` names answered (default: loopback names only; ``None``: any,
    for a server bound to another interface — see :func:`prorag.serving.guard.allowed_hosts_for`).
    """
    tokenizer = generator.tokenizer
    if tokenizer is None:
        raise ValueError("the served generator needs a tokenizer (to count tokens and template chats)")
    if max_share_tokens is None:
        max_share_tokens = max_tokens_limit
    if min(max_batch_size, max_n, max_tokens_limit, max_prompts, max_share_tokens) < 1:
        raise ValueError("max_batch_size, max_n, max_tokens_limit, max_prompts and max_share_tokens must be >= 1")
    check_request_limits(max_json_depth=max_json_depth, max_int_digits=max_int_digits, body_timeout_s=body_timeout_s,
                         body_deadline_s=body_deadline_s)
    connection_limits = ConnectionLimits(keep_alive_timeout_s, header_timeout_s, max_connections)
    if default_max_tokens is None:
        default_max_tokens = min(256, max_tokens_limit)
    if not 1 <= default_max_tokens <= max_tokens_limit:
        raise ValueError(f"need 1 <= default_max_tokens <= max_tokens_limit, got {default_max_tokens}")
    if context_window is None:
        config = getattr(getattr(generator, "model", None), "config", None)
        context_window = getattr(config, "max_position_embeddings", None)
    vocab_size = int(getattr(generator, "vocab_size", len(tokenizer)))
    encode: Callable[[str], list[int]] = getattr(generator, "encode", None) or (
        lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    special_tokens = [token for token in getattr(tokenizer, "all_special_tokens", []) if token]
    # Tokenizing and templating run on their own thread, one at a time, so a large prompt never holds the event loop
    # (``/health`` and every other request stay answered). Before that, a text too long for the context window is
    # refused by its length alone: no token is longer than ``longest_token`` characters, so a text of more than
    # ``longest_token * (context_window - max_tokens)`` characters cannot fit whatever its tokens are.
    encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prorag-serve-encode")
    longest_token = _longest_token_chars(tokenizer)
    stats = ServerStats(generation=getattr(generator, "stats", None))
    batcher = GenerationBatcher(generator, stats, max_batch_size=max_batch_size, batch_wait_s=batch_wait_ms / 1000.0)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await batcher.aclose()
        encoder.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="prorag OpenAI-compatible server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    restrict_hosts(app, None if allowed_hosts is None else tuple(allowed_hosts))
    app.state.stats = stats
    app.state.connection_limits = connection_limits
    app.state.batcher = batcher
    app.state.generator = generator
    app.state.model_name = model_name

    # ----------------------------------------------------------------------------- helpers

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "missing or invalid API key: send Authorization: Bearer <key>",
                           code="invalid_api_key")

    async def read_json(request: Request) -> dict[str, Any]:
        try:
            check_content_type(request.headers.get("content-type"))
        except BadRequestBody as error:
            raise ApiError(error.status, error.message, code="unsupported_media_type") from None
        try:
            raw = await read_body(request, max_bytes=max_body_bytes, timeout_s=body_timeout_s,
                                  deadline_s=body_deadline_s)
        except BadRequestBody as error:
            raise ApiError(error.status, error.message,
                           code="request_too_large" if error.status == 413 else "request_timeout") from None
        try:
            body = parse_json_body(raw, max_depth=max_json_depth, max_int_digits=max_int_digits)
        except BadRequestBody as error:
            raise ApiError(error.status, error.message, code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json")
        model = body.get("model")
        if model is not None and model != model_name:
            raise ApiError(400, f"the model {json.dumps(model)} does not exist; this server serves "
                           f"{json.dumps(model_name)}", param="model", code="model_not_found")
        _refuse_unsupported(body)
        return body

    def sampling(body: dict[str, Any], max_tokens: int | None, logprobs: bool) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_tokens or default_max_tokens,
            temperature=_float_field(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_float_field(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
            n=_int_field(body, "n", 1, 1, max_n) or 1,
            stop=_stop_field(body),
            seed=_int_field(body, "seed", None, -(2**63), 2**64 - 1),
            logprobs=logprobs,
        )

    def check_context(prompts: list[list[int]], params: SamplingParams, param: str) -> None:
        longest = max(len(ids) for ids in prompts)
        if context_window is not None and longest + params.max_new_tokens > context_window:
            raise ApiError(400, f"the prompt ({longest} tokens) plus max_tokens ({params.max_new_tokens}) exceeds "
                           f"the context window of {context_window} tokens", param=param,
                           code="context_length_exceeded")

    def check_length(texts: Sequence[str], params: SamplingParams, param: str) -> None:
        """Refuse, before any tokenizing, a text that cannot fit the context window whatever its tokens are."""
        if context_window is None or longest_token is None:
            return
        room = context_window - params.max_new_tokens
        longest = max((len(text) for text in texts), default=0)
        if longest > longest_token * max(room, 0):
            raise ApiError(400, f"the prompt ({longest} characters, so more than {longest // longest_token} tokens) "
                           f"plus max_tokens ({params.max_new_tokens}) exceeds the context window of "
                           f"{context_window} tokens", param=param, code="context_length_exceeded")

    async def off_loop(function: Callable[..., T], *args: Any) -> T:
        """Run tokenizing or templating on the encoder thread, keeping the event loop free."""
        return await asyncio.get_running_loop().run_in_executor(encoder, function, *args)

    def encode_text(text: str, param: str) -> list[int]:
        if not text:
            raise ApiError(400, f"{param} must not be empty", param=param, code="invalid_value")
        try:
            ids = encode(text)
        except ValueError as error:
            raise ApiError(400, f"{param}: {error}", param=param, code="invalid_value") from None
        if not ids:
            raise ApiError(400, f"{param} has no tokens", param=param, code="invalid_value")
        return ids

    def template(conversation: list[dict[str, str]]) -> str:
        try:
            return generator.apply_chat_template(conversation)
        except Exception as error:  # the template rejects the conversation (e.g. roles that must alternate)
            raise ApiError(400, f"cannot apply the chat template: {error}", param="messages",
                           code="invalid_value") from None

    def encode_chat(conversation: list[dict[str, str]]) -> list[int]:
        """The templated conversation's ids; the text of a message is data: a special token written in it
        (``<|im_end|>``) is encoded as plain text, never as the token (a user cannot forge turns)."""
        if not any(special in message["content"] for message in conversation for special in special_tokens):
            return encode_text(template(conversation), "messages")
        marks = [f"\ue000{index}\ue001" for index in range(len(conversation))]
        rendered = template([{**message, "content": mark} for message, mark in zip(conversation, marks, strict=True)])
        ids: list[int] = []
        for piece in _PLACEHOLDER.split(rendered):
            if _PLACEHOLDER.fullmatch(piece):
                content = conversation[int(piece[1:-1])]["content"]
                ids += tokenizer(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            elif piece:
                ids += encode(piece)
        if not ids:
            raise ApiError(400, "messages has no tokens", param="messages", code="invalid_value")
        return ids

    def parse_prompts(value: Any) -> list[list[int]]:
        if isinstance(value, str):
            return [encode_text(value, "prompt")]
        if not isinstance(value, list) or not value:
            raise ApiError(400, "prompt must be a non-empty string, list of strings, token ids or lists of token "
                           "ids", param="prompt", code="invalid_value")
        if all(_is_int(item) for item in value):
            batch: list[Any] = [value]
        elif all(isinstance(item, str) for item in value):
            batch = [encode_text(item, f"prompt[{index}]") for index, item in enumerate(value)]
        elif all(isinstance(item, list) for item in value):
            batch = value
        else:
            raise ApiError(400, "prompt must not mix strings, token ids and token-id lists", param="prompt",
                           code="invalid_value")
        if len(batch) > max_prompts:
            raise ApiError(400, f"at most {max_prompts} prompts per request, got {len(batch)}", param="prompt",
                           code="invalid_value")
        for index, ids in enumerate(batch):
            if not ids or not all(_is_int(token) and 0 <= token < vocab_size for token in ids):
                raise ApiError(400, f"prompt[{index}] must be a non-empty list of token ids in [0, {vocab_size})",
                               param="prompt", code="invalid_value")
        return [list(ids) for ids in batch]

    async def share_or_drop(request: Request, prompts: list[list[int]],
                            params: SamplingParams) -> list[list[Completion]]:
        """One share's completions; :class:`_ClientGone` as soon as the client has disconnected. Cancelling the
        wait cancels the queued request's future, so the batcher drops it before its generate call."""
        task = asyncio.ensure_future(batcher.submit(prompts, params))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    raise _ClientGone
        finally:
            if not task.done():
                task.cancel()

    def extend(first: Completion, more: Completion, stops: tuple[str, ...]) -> Completion:
        """``first`` (stopped by the share's length bound) continued by ``more``: text decoded whole, and cut at a
        stop string that straddles the two (the generator sees only the tokens it generated)."""
        tokens = first.token_ids + more.token_ids
        logprobs = None if first.logprobs is None or more.logprobs is None else first.logprobs + more.logprobs
        ended = more.finish_reason == "stop" and more.stop is None  # the last id is the end-of-sequence token
        body = tokens[:-1] if ended else tokens
        text = tokenizer.decode(body, skip_special_tokens=True)
        if not stops or cut_at_stop(text, stops)[1] is None:
            return dataclasses.replace(first, text=text, token_ids=tokens, logprobs=logprobs,
                                       finish_reason=more.finish_reason, stop=more.stop)
        low, high = len(first.token_ids) + 1, len(body)  # the shortest prefix of body whose text holds a stop
        while low < high:
            middle = (low + high) // 2
            if cut_at_stop(tokenizer.decode(body[:middle], skip_special_tokens=True), stops)[1] is None:
                low = middle + 1
            else:
                high = middle
        text, stop = cut_at_stop(tokenizer.decode(body[:low], skip_special_tokens=True), stops)
        return dataclasses.replace(first, text=text, token_ids=body[:low], stop=stop, finish_reason="stop",
                                   logprobs=None if logprobs is None else logprobs[:low])

    async def continue_share(request: Request, prompts: list[list[int]],
                             params: SamplingParams) -> list[list[Completion]]:
        """One share's completions, decoded ``max_share_tokens`` at a time: after each segment the sequences that
        hit the bound queue again as prompts extended by what they generated (the generator's KV cache keeps
        their past), behind any request that arrived meanwhile. Segment ``k`` of a seeded request is seeded
        with the ``k``-th :func:`request_seeds` of its seed; greedy samples are continued once per prompt."""
        limit = params.max_new_tokens
        step = dataclasses.replace(params, max_new_tokens=min(limit, max_share_tokens))
        results = await share_or_drop(request, prompts, step)
        for segment in itertools.count(1):
            going = [(index, sample) for index, samples in enumerate(results)
                     for sample, completion in enumerate(samples)
                     if completion.finish_reason == "length" and len(completion.token_ids) < limit
                     and not (params.greedy and sample)]
            if not going:
                return results
            more: list[list[Completion]] = []
            for start in range(0, len(going), max_batch_size):
                rows = going[start:start + max_batch_size]
                room = min(limit - len(results[index][sample].token_ids) for index, sample in rows)
                step = dataclasses.replace(params, n=1, max_new_tokens=min(room, max_share_tokens),
                                           seed=request_seeds(params.seed, segment + 1)[segment])
                more += await share_or_drop(request, [prompts[index] + results[index][sample].token_ids
                                                      for index, sample in rows], step)
            for (index, sample), [completion] in zip(going, more, strict=True):
                joined = extend(results[index][sample], completion, params.stop)
                results[index] = ([joined] * len(results[index]) if params.greedy
                                  else [*results[index][:sample], joined, *results[index][sample + 1:]])
        raise AssertionError("unreachable")

    async def run(request: Request, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        sequences = len(prompts) * params.n
        if sequences > max_request_sequences:
            raise ApiError(400, f"{len(prompts)} prompts x n={params.n} = {sequences} sequences exceed the limit of "
                                f"{max_request_sequences} per request (max_request_sequences)", param="n",
                           code="request_too_large")
        stats.requests += 1
        stats.prompts += len(prompts)
        # Fairness: a request larger than one batch is served in batch-sized shares, one after the other, so a
        # request arriving meanwhile joins the next share's batch instead of waiting for the whole request; a share
        # decodes at most max_share_tokens tokens before its unfinished sequences queue again (continue_share).
        share = max(1, max_batch_size // params.n)
        results: list[list[Completion]] = []
        # A client that disconnects is noticed within DISCONNECT_POLL_S: its queued shares are dropped, and a
        # generate call under way for it alone stops at its next decoded token (the batcher's cancelled check).
        try:
            for start in range(0, len(prompts), share):
                results += await continue_share(request, prompts[start:start + share], params)
        except _ClientGone:
            stats.abandoned += 1
            logger.info("client disconnected: dropped the rest of a request of %d prompts x n=%d", len(prompts),
                        params.n)
            raise ApiError(499, "the client closed the request", code="client_closed_request") from None
        except Exception as error:
            raise ApiError(500, f"generation failed: {type(error).__name__}: {error}", kind="server_error",
                           code="generation_failed") from error
        stats.prompt_tokens += sum(len(ids) for ids in prompts)
        stats.completion_tokens += sum(len(c.token_ids) for samples in results for c in samples)
        return results

    def visible_text(completion: Completion, include_stop: bool) -> str:
        text = completion.text
        if completion.stop and not include_stop and text.endswith(completion.stop):
            text = text[: -len(completion.stop)]
        return text

    def token_strings(ids: Sequence[int]) -> list[str]:
        return [tokenizer.decode([token]) for token in ids]

    def usage(prompts: list[list[int]], results: list[list[Completion]]) -> dict[str, int]:
        prompt_tokens = sum(len(ids) for ids in prompts)
        completion_tokens = sum(len(c.token_ids) for samples in results for c in samples)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    # ---------------------------------------------------------------------------- handlers

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        if error.status < 499:  # 499: the client left (counted as abandoned)
            stats.rejected += 1
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        stats.rejected += 1
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {error.detail}"
        return JSONResponse(_error_body(message, kind), status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        stats.rejected += 1
        return JSONResponse(_error_body(str(error), "invalid_request_error"), status_code=400)

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "prorag",
                "max_model_len": context_window}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        if model_id != model_name:
            raise ApiError(404, f"the model {json.dumps(model_id)} does not exist", param="model",
                           code="model_not_found", kind="not_found_error")
        return model_card()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "stats": stats.snapshot()}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        authorize(request)
        body = await read_json(request)
        if "prompt" not in body:
            raise ApiError(400, "prompt is required", param="prompt", code="missing_required_parameter")
        max_tokens = _int_field(body, "max_tokens", None, 1, max_tokens_limit)
        top = _int_field(body, "logprobs", None, 0, 1)
        params = sampling(body, max_tokens, top is not None)
        prompt = body["prompt"]
        texts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
        check_length([text for text in texts if isinstance(text, str)], params, "prompt")
        prompts = await off_loop(parse_prompts, prompt)
        check_context(prompts, params, "prompt")
        include_stop = _bool_field(body, "include_stop_str_in_output")
        with_ids = _bool_field(body, "return_token_ids")
        results = await run(request, prompts, params)
        choices = []
        for prompt_ids, samples in zip(prompts, results, strict=True):
            for completion in samples:
                choice: dict[str, Any] = {
                    "index": len(choices), "text": visible_text(completion, include_stop),
                    "finish_reason": completion.finish_reason, "stop_reason": completion.stop, "logprobs": None,
                }
                if top is not None:
                    tokens = token_strings(completion.token_ids)
                    offsets, position = [], 0
                    for token in tokens:
                        offsets.append(position)
                        position += len(token)
                    values = completion.logprobs or []
                    choice["logprobs"] = {
                        "tokens": tokens, "token_logprobs": values, "text_offset": offsets,
                        "top_logprobs": ([{token: value} for token, value in zip(tokens, values, strict=False)]
                                         if top else None),
                    }
                if with_ids:
                    choice["token_ids"] = completion.token_ids
                    choice["prompt_token_ids"] = prompt_ids
                choices.append(choice)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model_name, "choices": choices, "usage": usage(prompts, results)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> dict[str, Any]:
        authorize(request)
        body = await read_json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages", code="invalid_value")
        conversation = [_message_text(message, index) for index, message in enumerate(messages)]
        max_tokens = _int_field(body, "max_completion_tokens", None, 1, max_tokens_limit)
        max_tokens = _int_field(body, "max_tokens", max_tokens, 1, max_tokens_limit)
        want_logprobs = _bool_field(body, "logprobs")
        top = _int_field(body, "top_logprobs", 0, 0, 1) or 0
        params = sampling(body, max_tokens, want_logprobs)
        # The templated text holds every message's content, so their total length bounds its tokens from below.
        check_length(["".join(message["content"] for message in conversation)], params, "messages")
        prompts = [await off_loop(encode_chat, conversation)]
        check_context(prompts, params, "messages")
        include_stop = _bool_field(body, "include_stop_str_in_output")
        with_ids = _bool_field(body, "return_token_ids")
        results = await run(request, prompts, params)
        choices = []
        for completion in results[0]:
            choice: dict[str, Any] = {
                "index": len(choices),
                "message": {"role": "assistant", "content": visible_text(completion, include_stop)},
                "finish_reason": completion.finish_reason, "stop_reason": completion.stop, "logprobs": None,
            }
            if want_logprobs:
                content = []
                for token, value in zip(token_strings(completion.token_ids), completion.logprobs or [],
                                        strict=False):
                    entry = {"token": token, "logprob": value, "bytes": list(token.encode())}
                    content.append({**entry, "top_logprobs": [entry] if top else []})
                choice["logprobs"] = {"content": content}
            if with_ids:
                choice["token_ids"] = completion.token_ids
                choice["prompt_token_ids"] = prompts[0]
            choices.append(choice)
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model_name, "choices": choices, "usage": usage(prompts, results),
        }
        if with_ids:
            response["prompt_token_ids"] = prompts[0]
        return response

    return app


# ------------------------------------------------------------------------------ background server


def serve_in_thread(app: FastAPI, host: str = DEFAULT_HOST, port: int = 0, *, log_level: str = "warning",
                    timeout: float = 30.0, access_log: bool = False) -> tuple[str, Callable[[], None]]:
    """Run ``app`` with ``uvicorn.Server`` on a daemon thread; returns ``(base_url, stop)``.

    ``port=0`` picks a free port. ``base_url`` ends with ``/v1`` (what ``OpenAI(base_url=…)`` expects);
    ``stop()`` asks the server to exit and joins the thread (idempotent). The connection limits are the app's
    (``create_app``'s arguments) and the logs are redacted, as on the command line
    (:func:`prorag.serving.guard.server_config`).
    """
    server = uvicorn.Server(server_config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                                          lifespan="on", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, name=f"prorag-serve-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"server failed to start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=15)

    return f"http://{shown}:{bound}/v1", stop
