"""Micro-batching for asyncio servers: requests that arrive close together are served by one blocking call.

Shared by ``prorag serve`` (generation) and the retrieval server (search). A subclass says how large a request
is and how a gathered batch is executed; the gathering loop, the single worker thread that runs the blocking
model/index call off the event loop, and shutdown live here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, Protocol, TypeVar


class Pending(Protocol):
    """A queued request: anything with the future its caller awaits."""

    future: asyncio.Future[Any]


_MAX_WINDOWS = 4  # a batch waits at most this many windows after its first request
ItemT = TypeVar("ItemT", bound=Pending)
T = TypeVar("T")


class MicroBatcher(Generic[ItemT]):
    # Kept: `transformers serve` batches (continuous batching runs on CPU) but ignores logprobs and n and has no key,
    # LoRA or Host checks; vLLM has no CPU build here; `batched` sleeps its full window on every short queue and has no
    # multi-unit requests or grouping by sampling parameters. This one also batches the retrieval server's searches.
    """Gathers requests arriving within ``window_s`` of each other (up to ``max_size`` units) into one batch.

    A batch closes when ``max_size`` units are queued, when no request arrived for ``window_s``, or
    ``4 * window_s`` after its first request. The window runs from the last arrival, not the first: a burst
    of concurrent requests whose HTTP handling takes longer than one window in all (16 clients answered
    at once come back spread over ~20 ms) still makes one batch instead of splitting in two that then
    alternate. Requests queued while a batch is executing are taken without waiting. The blocking work of
    :meth:`execute` goes through :meth:`run_blocking`, one worker thread, so the event loop keeps accepting
    requests meanwhile.
    """

    def __init__(self, *, name: str, window_s: float, max_size: int) -> None:
        self.name = name
        self.window_s = window_s
        self.max_size = max_size
        self._queue: asyncio.Queue[ItemT] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def size(self, item: ItemT) -> int:
        """How many units (prompts, queries) a request adds to a batch."""
        raise NotImplementedError

    async def execute(self, batch: list[ItemT]) -> None:
        """Serve a gathered batch: set every item's future (result or exception)."""
        raise NotImplementedError

    async def enqueue(self, item: ItemT) -> Any:
        """Queue one request and wait for its result."""
        if self._task is None or self._task.done():
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._gather(), name=self.name)
        assert self._queue is not None
        await self._queue.put(item)
        return await item.future

    async def run_blocking(self, function: Callable[..., T], *args: Any) -> T:
        """Run a blocking call on the batcher's worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def aclose(self) -> None:
        """Stop gathering, fail queued requests, release the worker thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._queue is not None and not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.set_exception(RuntimeError(f"{self.name} is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _gather(self) -> None:
        assert self._queue is not None
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            size = self.size(batch[0])
            cutoff = loop.time() + _MAX_WINDOWS * self.window_s
            while size < self.max_size:
                if queue.empty():
                    remaining = min(self.window_s, cutoff - loop.time())
                    if remaining <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(queue.get(), remaining)
                    except TimeoutError:
                        # A starved event loop (the GIL held by the worker and client threads) sees a request
                        # and the timeout in the same pass, and runs the timeout first: one more pass lets
                        # the request reach the queue instead of waiting a whole batch.
                        await asyncio.sleep(0)
                        if queue.empty():
                            break
                        continue
                else:
                    item = queue.get_nowait()
                batch.append(item)
                size += self.size(item)
            await self.execute(batch)
