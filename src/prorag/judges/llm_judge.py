"""An LLM judge behind any OpenAI-compatible chat endpoint (OpenAI, vLLM, ``prorag serve``).

:class:`LLMJudge` sends the papers' prompts (:mod:`prorag.judges.prompts`) through the official ``openai``
``AsyncOpenAI`` client:

* **bounded concurrency** — at most ``max_concurrency`` requests in flight (a semaphore);
* **timeouts and retries** — each attempt (connecting, sending, and receiving the whole reply, body included) has
  an overall deadline of ``timeout`` seconds, so a server that trickles its reply a byte at a time fails it at the
  deadline (:class:`~prorag.llm.async_session.AttemptDeadlineClient`); attempts are retried up to ``max_retries``
  times by the client on connection errors, timeouts, 408/409/429 and 5xx answers, with exponential backoff
  (0.5 s doubling up to 8 s, with jitter; ``Retry-After`` honoured). An item that still fails gets an unknown
  verdict with ``error`` set (``timeout: …`` for timeouts); the rest of the batch is unaffected;
* **persistent cache** — with a :class:`~prorag.judges.cache.JudgeCache`, every reply that parsed is written as
  soon as it arrives, keyed by the endpoint, the model, the messages and the sampling parameters; a re-run, or a
  run after a crash, sends only what is missing. Identical requests within one batch are sent once;
* **limits at scale** (:mod:`prorag.judges.limits`) — ``requests_per_minute``: one rate limiter per endpoint
  shared by every judge of the process (and, through a file lock, by every process of the node); each reply's
  ``usage`` is added up with its cost at ``price_per_million_tokens``; ``budget_usd`` stops judging once the
  endpoint's spend reaches it (the spend of every rank and restart when a ledger is in use: GRPO training keeps
  one in its run folder, which also carries the rate limit across machines); ``max_unknown_rate`` stops the run
  when a batch has more unknown verdicts than that share (fail closed);
* **strict parsing** — an unparsable reply, and a reply that is no chat completion at all (an HTML page from a
  wrong ``base_url`` or a proxy, garbage JSON), is an unknown verdict, counted and logged, never cached: no
  per-item failure raises.

Separate instances may use separate models per task (e.g. one judge for over-search, another for
under-search). The synchronous methods work inside or outside a running event loop: requests run on a
private event loop in a daemon thread (the same arrangement as
:class:`prorag.llm.openai_backend.OpenAICompatibleGenerator`, whose loop helper is private to that class);
async callers may ``await`` the ``a…`` variants.

The API key is ``api_key`` only (``None``: a keyless server, ``"EMPTY"`` is sent; no environment variable is read
here — :func:`prorag.judges.factory.build_judge` reads the one a parameter names); it is never logged or shown in
``repr``. Reasoning models that only accept their default sampling
(e.g. ``gpt-5-mini`` rejects ``temperature=0``) take ``temperature=None``, which leaves the field out.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import openai

from prorag.judges.base import (
    AnswerItem,
    EquivalencePair,
    StepItem,
    Verdict,
    check_answers,
    check_pairs,
    check_steps,
)
from prorag.judges.cache import JudgeCache, cache_key
from prorag.judges.limits import (
    JudgeBudgetExceeded,
    RateLimiter,
    active_ledger,
    check_unknown_rate,
    endpoint_cost,
    record_usage,
    shared_limiter,
)
from prorag.judges.prompts import (
    Messages,
    answer_messages,
    equivalence_messages,
    parse_boolean_answer,
    parse_yes_no,
    step_messages,
)
from prorag.llm.async_session import AsyncOpenAISession
from prorag.llm.openai_backend import KEYLESS

logger = logging.getLogger(__name__)

T = TypeVar("T")
Parser = Callable[[str | None], bool | None]


@dataclass
class JudgeStats:
    """Counters of one judge: items judged, items served from the cache, requests sent (distinct prompts; the
    client's retries not counted), requests that failed for good, unparsable replies (cached ones included)."""

    items: int = 0
    cache_hits: int = 0
    http_calls: int = 0
    errors: int = 0
    unparsable: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(vars(self))


class LLMJudge:
    """A :class:`~prorag.judges.base.Judge` that asks an LLM (see the module docstring).

    ``temperature`` / ``max_tokens`` of ``None`` leave the field out of the request; ``max_tokens`` is sent as
    ``max_completion_tokens`` (reasoning models count their hidden reasoning against it, so leave room).
    ``extra_body`` is merged into every request (server-specific fields) and is part of the cache key.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, max_concurrency: int = 32,
                 timeout: float = 30.0, max_retries: int = 2, temperature: float | None = 0.0,
                 max_tokens: int | None = 1024, cache: JudgeCache | None = None,
                 extra_body: Mapping[str, Any] | None = None, requests_per_minute: float | None = None,
                 rate_limit_dir: str | None = None, max_unknown_rate: float | None = None,
                 budget_usd: float | None = None,
                 price_per_million_tokens: tuple[float, float] | None = None) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if temperature is not None and temperature < 0:
            raise ValueError(f"temperature must be >= 0 or None, got {temperature}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.cache = cache
        self.extra_body = dict(extra_body or {})
        self.stats = JudgeStats()
        self.limiter: RateLimiter | None = (shared_limiter(self.base_url, requests_per_minute,
                                                           state_dir=rate_limit_dir)
                                            if requests_per_minute is not None else None)
        self.max_unknown_rate = max_unknown_rate
        self.budget_usd = budget_usd
        self.price_per_million_tokens = price_per_million_tokens
        if budget_usd is not None and price_per_million_tokens is None:
            raise ValueError("budget_usd needs price_per_million_tokens (the cost is estimated from the usage)")
        self._api_key = api_key or KEYLESS  # never a variable the caller did not name (issue 11)
        self._session = AsyncOpenAISession(f"prorag-judge-{model}", base_url=self.base_url, api_key=self._api_key,
                                           timeout=self.timeout, max_retries=self.max_retries,
                                           max_concurrency=self.max_concurrency)

    def __repr__(self) -> str:
        return (f"LLMJudge(base_url={self.base_url!r}, model={self.model!r}, max_concurrency={self.max_concurrency}, "
                f"timeout={self.timeout}, max_retries={self.max_retries}, temperature={self.temperature}, "
                f"max_tokens={self.max_tokens}, cache={self.cache!r})")

    # ------------------------------------------------------------------------------------ interface

    def equivalent(self, pairs: Sequence[EquivalencePair]) -> list[Verdict]:
        """Figure 5 for each ``(statement_a, statement_b)``: True = equivalent (over-search)."""
        return self._session.run(self._equivalent(pairs))

    def verify_steps(self, steps: Sequence[StepItem], *,
                     contexts: Sequence[Sequence[str]] | None = None) -> list[Verdict]:
        """Figure 6 for each ``(question, reasoning, conclusion)``: True = correct, False = under-search.

        ``contexts`` is validated and ignored: the paper's verifier judges the step in isolation.
        """
        return self._session.run(self._verify_steps(steps, contexts))

    def answer_correct(self, items: Sequence[AnswerItem]) -> list[Verdict]:
        """The multi-stage paper's YES/NO answer check for each ``(question, golden_answers, prediction)``."""
        return self._session.run(self._answer_correct(items))

    async def aequivalent(self, pairs: Sequence[EquivalencePair]) -> list[Verdict]:
        """Async :meth:`equivalent`, usable from any event loop."""
        return await self._session.submit(self._equivalent(pairs))

    async def averify_steps(self, steps: Sequence[StepItem], *,
                            contexts: Sequence[Sequence[str]] | None = None) -> list[Verdict]:
        """Async :meth:`verify_steps`, usable from any event loop."""
        return await self._session.submit(self._verify_steps(steps, contexts))

    async def aanswer_correct(self, items: Sequence[AnswerItem]) -> list[Verdict]:
        """Async :meth:`answer_correct`, usable from any event loop."""
        return await self._session.submit(self._answer_correct(items))

    def close(self) -> None:
        """Close the HTTP client and stop the private loop (both restart if the judge is used again)."""
        self._session.close()

    def __enter__(self) -> LLMJudge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------- coroutines
    # Arguments are validated when the coroutine starts; the caller sees the exception either way.

    async def _equivalent(self, pairs: Sequence[EquivalencePair]) -> list[Verdict]:
        conversations = [equivalence_messages(a, b) for a, b in check_pairs(pairs)]
        return await self._judge("equivalence", conversations, parse_boolean_answer)

    async def _verify_steps(self, steps: Sequence[StepItem],
                            contexts: Sequence[Sequence[str]] | None) -> list[Verdict]:
        items, _ = check_steps(steps, contexts)
        conversations = [step_messages(*item) for item in items]
        return await self._judge("step_verification", conversations, parse_boolean_answer)

    async def _answer_correct(self, items: Sequence[AnswerItem]) -> list[Verdict]:
        conversations = [answer_messages(golden, prediction) for _, golden, prediction in check_answers(items)]
        return await self._judge("answer_check", conversations, parse_yes_no)

    def _params(self) -> dict[str, Any]:
        params: dict[str, Any] = dict(self.extra_body)
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.max_tokens is not None:
            params["max_completion_tokens"] = self.max_tokens
        return params

    async def _judge(self, task: str, conversations: list[Messages], parse: Parser) -> list[Verdict]:
        spent = endpoint_cost(self.base_url) if self.budget_usd is not None else 0.0
        if self.budget_usd is not None and spent >= self.budget_usd:
            ledger = active_ledger()
            raise JudgeBudgetExceeded(f"judge {self.model} at {self.base_url}: the estimated spend ${spent:.2f} "
                                      f"reached budget_usd ${self.budget_usd:g}"
                                      + (f" (ledger {ledger.path}, shared by every rank and restart)"
                                         if ledger is not None else ""))
        params = self._params()
        keys = [cache_key(self.model, messages, params, endpoint=self.base_url) for messages in conversations]
        cached: dict[str, str] = {}
        if self.cache is not None and keys:
            try:
                cached = await asyncio.to_thread(self.cache.get_many, keys)
            except sqlite3.Error as error:  # judge without the cache rather than fail the batch
                logger.warning("judge cache %s: cannot read: %s", self.cache.path, error)
            cached = {key: raw for key, raw in cached.items() if parse(raw) is not None}  # stale rows: ask again
        missing = {key: messages for key, messages in zip(keys, conversations, strict=True) if key not in cached}
        results = await asyncio.gather(*(self._request(task, key, messages, params, parse)
                                         for key, messages in missing.items()))
        fresh = dict(zip(missing, results, strict=True))
        verdicts = []
        for key in keys:
            if key in cached:
                raw, error, from_cache = cached[key], None, True
            else:
                (raw, error), from_cache = fresh[key], False
            if error is not None:
                verdicts.append(Verdict(None, raw="", error=error, cached=False))
                continue
            value = parse(raw)
            verdicts.append(Verdict(value, raw=raw, error=None if value is not None else "unparsable reply",
                                    cached=from_cache))
        errors = sum(error is not None for _, error in results)
        self._count(task, verdicts, hits=sum(key in cached for key in keys), calls=len(missing), errors=errors)
        check_unknown_rate(self.model, task, sum(verdict.value is None for verdict in verdicts), len(verdicts),
                           self.max_unknown_rate)
        return verdicts

    async def _request(self, task: str, key: str, messages: Messages, params: dict[str, Any],
                       parse: Parser) -> tuple[str, str | None]:
        """One chat call: ``(raw reply, None)`` or ``("", error)``; a reply that parses is cached at once."""
        client, semaphore = self._session.client_and_semaphore()
        options = dict(params)
        extra = {name: options.pop(name) for name in self.extra_body}
        async with semaphore:
            if self.limiter is not None:
                await self.limiter.acquire()
            try:
                response = await client.chat.completions.create(model=self.model, messages=messages,
                                                                extra_body=extra or None, **options)
            except openai.APITimeoutError:
                return "", (f"timeout: no answer within {self.timeout:g} s per attempt, "
                            f"{self.max_retries} retries")
            except openai.APIConnectionError as error:
                return "", f"connection error after {self.max_retries} retries: {error}"
            except openai.APIStatusError as error:
                return "", f"HTTP {error.status_code}: {_error_message(error)}"
            except Exception as error:  # malformed answer, client-side error: an unknown verdict, never a crash
                return "", f"{type(error).__name__}: {error}"
        self._record_usage(response)
        raw, error = _reply_text(response)
        if error is not None:
            return "", error
        if self.cache is not None and parse(raw) is not None:
            try:
                await asyncio.to_thread(self.cache.put, key, raw, task=task, model=self.model)
            except sqlite3.Error as error:  # the verdict stands; only its persistence failed
                logger.warning("judge cache %s: cannot store a reply: %s", self.cache.path, error)
        return raw, None

    def _record_usage(self, response: object) -> None:
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        self.stats.input_tokens += prompt
        self.stats.output_tokens += completion
        record_usage(self.base_url, self.model, prompt, completion, self.price_per_million_tokens)

    def _count(self, task: str, verdicts: list[Verdict], *, hits: int, calls: int, errors: int) -> None:
        unparsable = sum(verdict.error == "unparsable reply" for verdict in verdicts)
        self.stats.items += len(verdicts)
        self.stats.cache_hits += hits
        self.stats.http_calls += calls
        self.stats.errors += errors
        self.stats.unparsable += unparsable
        if verdicts:
            logger.info("judge %s (%s): %d items, %d from cache, %d calls, %d failed, %d unparsable", self.model,
                        task, len(verdicts), hits, calls, errors, unparsable)
        first_error = next((verdict.error for verdict in verdicts if verdict.error is not None), None)
        if first_error is not None:
            logger.warning("judge %s at %s (%s): %d of %d verdicts unknown (%d failed, %d unparsable); first: %s",
                           self.model, self.base_url, task, errors + unparsable, len(verdicts), errors, unparsable,
                           first_error[:300])


def _reply_text(response: object) -> tuple[str, str | None]:
    """The reply text of a chat completion, or an error when the answer is no chat completion (an HTML page
    is returned by the client as a plain string; garbage JSON as a completion without choices)."""
    try:
        choices = response.choices  # type: ignore[attr-defined]
        if not choices:
            return "", "malformed reply: the server answered without choices"
        content = choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        shown = response if isinstance(response, str) else type(response).__name__
        return "", f"malformed reply: not a chat completion: {str(shown)[:200]!r}"
    if content is not None and not isinstance(content, str):
        return "", f"malformed reply: message content is {type(content).__name__}, not text"
    try:
        (content or "").encode("utf-8")
    except UnicodeEncodeError as error:  # neither parsable nor storable in the cache: unknown, never a verdict
        return "", f"malformed reply: a lone surrogate U+{ord(content[error.start]):04X} at character {error.start}"
    return content or "", None


def _error_message(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(error.message)
