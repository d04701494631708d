"""What keeps LLM judging at paper scale within bounds: one rate limiter per endpoint shared by every caller, usage
and cost accounting, a spending budget, and a fail-closed cap on the rate of unknown verdicts.

* :class:`RateLimiter` spaces requests to ``requests_per_minute`` (a leaky bucket with a one-second burst). Every
  judge of one endpoint in this process shares one (:func:`shared_limiter`); with ``state_dir`` the schedule lives
  in a small file under an exclusive ``flock``, so every process of the node (``accelerate launch`` ranks, a
  second ``kedro run``) shares it too. It works from any thread or event loop: a slot is reserved under the lock
  and the wait happens outside it.
* :data:`USAGE` adds up, per ``(endpoint, model)``, calls, input and output tokens (from each reply's ``usage``)
  and their cost at the configured price; :func:`usage_metrics` flattens it for MLflow.
* :class:`JudgeBudgetExceeded` is raised before a batch once the endpoint's cost reached ``budget_usd``.
* :class:`UnknownVerdictRateError` is raised when more than ``max_unknown_rate`` of a batch (of at least
  :data:`MIN_ITEMS_FOR_RATE` items) could not be judged: a failed call would otherwise count as "not optimal" and
  lower the process reward silently.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MIN_ITEMS_FOR_RATE: Final = 20
"""A batch smaller than this never trips the unknown-rate cap (one failure in five is noise, not an outage)."""


class JudgeBudgetExceeded(RuntimeError):
    """The estimated spend of a judge endpoint reached its ``budget_usd``."""


class UnknownVerdictRateError(RuntimeError):
    """Too many verdicts of a batch are unknown (failed calls, unparsable replies)."""


class RateLimiter:
    """Requests spaced to ``requests_per_minute`` (module docstring); ``state_file`` shares the schedule between
    processes."""

    def __init__(self, requests_per_minute: float, *, state_file: str | Path | None = None) -> None:
        if requests_per_minute <= 0:
            raise ValueError(f"requests_per_minute must be > 0, got {requests_per_minute}")
        self.interval = 60.0 / requests_per_minute
        self.burst = max(1.0, requests_per_minute / 60.0)
        self.state_file = Path(state_file) if state_file is not None else None
        self._lock = threading.Lock()
        self._next_free = 0.0

    def _reserve(self) -> float:
        """Reserve the next slot; the seconds to wait for it."""
        with self._lock:
            if self.state_file is None:
                return self._advance_local()
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.state_file, "a+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    handle.seek(0)
                    text = handle.read().strip()
                    self._next_free = float(text) if text else 0.0
                    wait = self._advance_local()
                    handle.seek(0)
                    handle.truncate()
                    handle.write(repr(self._next_free))
                    handle.flush()
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
                return wait

    def _advance_local(self) -> float:
        now = time.time()
        earliest = now - (self.burst - 1.0) * self.interval  # up to `burst` requests may go at once
        slot = max(self._next_free, earliest)
        self._next_free = slot + self.interval
        return max(0.0, slot - now)

    async def acquire(self) -> None:
        """Wait for this request's slot (from any event loop)."""
        wait = self._reserve()
        if wait > 0:
            await asyncio.sleep(wait)


_LIMITERS: dict[str, RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def shared_limiter(base_url: str, requests_per_minute: float, *, state_dir: str | Path | None = None) -> RateLimiter:
    """The one limiter of ``base_url`` in this process (and across processes with ``state_dir``); the first caller's
    rate wins, a different one later is refused."""
    key = base_url.rstrip("/")
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.get(key)
        if limiter is None:
            state = None
            if state_dir is not None:
                state = Path(state_dir) / f"ratelimit-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
            limiter = _LIMITERS[key] = RateLimiter(requests_per_minute, state_file=state)
        elif abs(limiter.interval - 60.0 / requests_per_minute) > 1e-9:
            raise ValueError(f"two judges of {key} declare different requests_per_minute "
                             f"({60.0 / limiter.interval:g} and {requests_per_minute:g}): one limit per endpoint")
        return limiter


@dataclass
class Usage:
    """Calls, tokens and estimated cost of one ``(endpoint, model)``."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


USAGE: dict[tuple[str, str], Usage] = {}
_USAGE_LOCK = threading.Lock()


def record_usage(base_url: str, model: str, input_tokens: int, output_tokens: int,
                 price_per_million: tuple[float, float] | None) -> Usage:
    """Add one reply's usage to :data:`USAGE`; the running total of its endpoint and model."""
    with _USAGE_LOCK:
        usage = USAGE.setdefault((base_url.rstrip("/"), model), Usage())
        usage.calls += 1
        usage.input_tokens += input_tokens
        usage.output_tokens += output_tokens
        if price_per_million is not None:
            usage.cost_usd += (input_tokens * price_per_million[0] + output_tokens * price_per_million[1]) / 1e6
        return usage


def endpoint_cost(base_url: str) -> float:
    """The estimated spend on ``base_url`` so far (every model)."""
    key = base_url.rstrip("/")
    with _USAGE_LOCK:
        return sum(usage.cost_usd for (url, _), usage in USAGE.items() if url == key)


def usage_metrics() -> dict[str, float]:
    """:data:`USAGE` as flat metrics: ``judge_usage/<model>/{calls,input_tokens,output_tokens,cost_usd}`` and
    ``judge_usage/cost_usd`` (all judges)."""
    metrics: dict[str, float] = {}
    with _USAGE_LOCK:
        for (_, model), usage in sorted(USAGE.items()):
            name = model.replace(":", "_").replace("/", "_")
            for field in ("calls", "input_tokens", "output_tokens", "cost_usd"):
                key = f"judge_usage/{name}/{field}"
                metrics[key] = metrics.get(key, 0.0) + float(getattr(usage, field))
        if USAGE:
            metrics["judge_usage/cost_usd"] = sum(usage.cost_usd for usage in USAGE.values())
    return metrics


def check_unknown_rate(model: str, task: str, unknown: int, items: int, max_unknown_rate: float | None) -> None:
    """Raise :class:`UnknownVerdictRateError` when ``unknown / items`` exceeds ``max_unknown_rate``."""
    if max_unknown_rate is None or items < MIN_ITEMS_FOR_RATE:
        return
    if unknown / items > max_unknown_rate:
        raise UnknownVerdictRateError(
            f"judge {model} ({task}): {unknown} of {items} verdicts unknown ({unknown / items:.1%}), above "
            f"max_unknown_rate {max_unknown_rate:.1%}: the endpoint is failing (rate limit, outage, wrong model); "
            "the run stops instead of training on a reward that counts every failure as a wrong step. Fix the "
            "endpoint, lower the judges' requests_per_minute, or raise max_unknown_rate")


def default_state_dir() -> str:
    """Where the cross-process limiter schedules live (``$PRORAG_CACHE_DIR/judge_limits``)."""
    root = os.environ.get("PRORAG_CACHE_DIR") or str(Path.home() / ".cache" / "prorag")
    return str(Path(root) / "judge_limits")


def reset_usage() -> None:
    """Start counting usage afresh: what one run reports (and spends against a budget) is its own."""
    with _USAGE_LOCK:
        USAGE.clear()


def reset_for_tests() -> None:
    """Forget every limiter and usage record (tests)."""
    with _LIMITERS_LOCK:
        _LIMITERS.clear()
    with _USAGE_LOCK:
        USAGE.clear()
