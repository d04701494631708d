"""Several servers of one model as one generator: data-parallel vLLM replicas, one per GPU.

:class:`ReplicatedGenerator` is a :class:`~prorag.llm.generation.Generator` over replicas that serve the same model
under the same name. A call is cut into contiguous shares, one per replica (:func:`shares`), sent concurrently and
put back in order. A seeded call gives share ``i`` the seed ``request_seeds(seed, replicas)[i]``: each replica
then seeds each of its requests apart (:func:`~prorag.llm.generation.request_seeds`), so no two requests of the call
share a seed and the same call on the same replicas samples the same again.

A caller that must keep requests together on one replica (a GRPO group, a multi-turn trajectory whose prefix the
server caches) routes them itself through :attr:`ReplicatedGenerator.replicas`
(:meth:`prorag.training.grpo.AgentRollouts.roll_out`). :func:`check_serving` refuses, before any request, a replica
that is down or does not serve the model, naming its URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

import httpx

from prorag.errors import UserError
from prorag.llm.generation import Completion, Generator, SamplingParams, request_seeds
from prorag.llm.server_process import auth_headers, server_root

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from prorag.llm.generation import ChatMessage, Prompt

__all__ = ["ReplicatedGenerator", "ServerDownError", "check_serving", "shares"]


class ServerDownError(UserError, ConnectionError):
    """A server the run needs cannot be reached, or does not serve the model it is asked for."""


def shares(count: int, parts: int, *, offset: int = 0) -> list[range]:
    """``range(count)`` cut into ``parts`` contiguous shares whose sizes differ by at most one; the larger shares
    are those of parts ``offset``, ``offset + 1``, … (mod ``parts``), so callers with different offsets load
    different parts with their remainders."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(count, parts)
    sizes = [base + ((index - offset) % parts < extra) for index in range(parts)]
    starts = [sum(sizes[:index]) for index in range(parts)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def check_serving(base_url: str, model: str, *, api_key: str | None = None, timeout: float = 10.0) -> None:
    """Refuse a server at ``base_url`` (root or ``/v1``) that cannot be reached or whose ``GET /v1/models`` does
    not list ``model``, naming the URL."""
    url = server_root(base_url) + "/v1/models"
    try:
        response = httpx.get(url, headers=auth_headers(api_key), timeout=timeout)
        response.raise_for_status()
        served = [str(item.get("id")) for item in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError, AttributeError) as error:
        raise ServerDownError(f"the policy server at {server_root(base_url)} is down or not a model server "
                              f"(GET {url}: {type(error).__name__}: {error}); start it, or remove it from "
                              "rl.policy_server.base_url") from error
    if model not in served:
        raise ServerDownError(f"the policy server at {server_root(base_url)} serves {served}, not {model!r} "
                              "(rl.policy_server.model): every replica serves the policy under the same name")


class ReplicatedGenerator:
    """Replicas of one model as one :class:`~prorag.llm.generation.Generator` (module docstring)."""

    def __init__(self, replicas: Sequence[Generator]) -> None:
        if not replicas:
            raise ValueError("a replicated generator needs at least one replica")
        self.replicas: tuple[Generator, ...] = tuple(replicas)
        self._pool = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix="prorag-replica")

    def __repr__(self) -> str:
        return f"ReplicatedGenerator({list(self.replicas)!r})"

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        return self.replicas[0].tokenizer

    def apply_chat_template(self, messages: Sequence[ChatMessage]) -> str:
        return self.replicas[0].apply_chat_template(messages)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """The call's prompts in contiguous shares over the replicas, concurrently, results in order."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of prompts, not a single string")
        parts = shares(len(prompts), len(self.replicas))
        seeds = request_seeds(params.seed, len(self.replicas))
        futures = [self._pool.submit(replica.generate, [prompts[index] for index in part], replace(params, seed=seed))
                   for replica, part, seed in zip(self.replicas, parts, seeds, strict=True) if part]
        return [completions for future in futures for completions in future.result()]

    def close(self) -> None:
        """Close every replica that can be closed, and the thread pool."""
        for replica in self.replicas:
            close = getattr(replica, "close", None)
            if callable(close):
                close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> ReplicatedGenerator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
