"""An ``AsyncOpenAI`` client with a concurrency bound, on a private event loop thread.

Shared by the OpenAI-compatible generator and the LLM judge: both offer blocking methods that must work
whether or not the caller already runs an event loop, and ``a…`` variants for async callers.

Each attempt has an overall deadline. The client's own ``timeout`` is httpx's, per phase (connect, one read, one
write): a server that sends its reply one byte per second never trips it. So the client's HTTP transport
(:class:`AttemptDeadlineClient`) bounds every send — connecting, sending the request, the status line and headers
and the whole body — by ``timeout`` seconds, and an attempt past it fails as a timeout, which the client retries
with its usual policy (``max_retries``, backoff, ``Retry-After``) like any other.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import httpx2
import openai

T = TypeVar("T")


class AttemptDeadlineClient(openai.DefaultAsyncHttpxClient):
    """The ``openai`` client's HTTP client, with every :meth:`send` (one attempt: connect, request, status line,
    headers and the whole body) done within ``attempt_timeout`` seconds, or failed with ``httpx2.ReadTimeout``,
    which the ``openai`` client treats as any timeout: retried, then :class:`openai.APITimeoutError`.

    The client sends without ``stream=True`` (the body is read inside ``send``), so the deadline covers the body.
    """

    def __init__(self, *, attempt_timeout: float, **kwargs: Any) -> None:
        if attempt_timeout <= 0:
            raise ValueError(f"attempt_timeout must be > 0, got {attempt_timeout}")
        super().__init__(**kwargs)
        self.attempt_timeout = float(attempt_timeout)

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:  # type: ignore[override]
        try:
            async with asyncio.timeout(self.attempt_timeout):
                return await super().send(request, **kwargs)
        except TimeoutError:
            raise httpx2.ReadTimeout(f"no complete reply within {self.attempt_timeout:g} s (the attempt's deadline)",
                                     request=request) from None


class AsyncOpenAISession:
    """Runs coroutines on a private loop; the client and semaphore are created there, lazily, and reused.

    ``close()`` closes the HTTP client and stops the loop; the session restarts both if used again.
    """

    def __init__(self, name: str, *, base_url: str, api_key: str | None, timeout: float, max_retries: int,
                 max_concurrency: int) -> None:
        self.name = name
        self._client_args = {"base_url": base_url, "api_key": api_key, "timeout": timeout, "max_retries": max_retries}
        self._timeout = timeout
        self._max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the private loop and block until it is done."""
        if self._thread is not None and threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError(f"a blocking call was made from {self.name}'s own event loop; await the a… variant")
        return asyncio.run_coroutine_threadsafe(coroutine, self._ensure_loop()).result()

    async def submit(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` run on the private loop, from any event loop."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._ensure_loop())
        return await asyncio.wrap_future(future)

    def client_and_semaphore(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        """The client and the concurrency bound; call only from coroutines running on the private loop."""
        if self._client is None or self._semaphore is None:
            http_client = AttemptDeadlineClient(attempt_timeout=self._timeout)
            self._client = openai.AsyncOpenAI(**self._client_args, http_client=http_client)
            self._semaphore = asyncio.Semaphore(self._max_concurrency)
        return self._client, self._semaphore

    def close(self) -> None:
        with self._lock:
            loop, thread, client = self._loop, self._thread, self._client
            self._loop = self._thread = self._client = None
            self._semaphore = None
        if loop is None:
            return
        if client is not None:
            asyncio.run_coroutine_threadsafe(client.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=10)
        loop.close()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop
