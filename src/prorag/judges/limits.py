"""What keeps LLM judging at paper scale within bounds: one rate limiter per endpoint shared by every caller, usage
and cost accounting, a spending budget, and a fail-closed cap on the rate of unknown verdicts.

* :class:`RateLimiter` spaces requests to ``requests_per_minute`` (a leaky bucket with a one-second burst). Every
  judge of one endpoint in this process shares one (:func:`shared_limiter`); with ``state_dir`` the schedule lives
  in a small file under an exclusive ``flock``, so every process of the node (``accelerate launch`` ranks, a
  second ``kedro run``) shares it too. It works from any thread or event loop: a slot is reserved under the lock
  and the wait happens outside it.
* :data:`USAGE` adds up, per ``(endpoint, model)``, calls, input and output tokens (from each reply's ``usage``)
  and their cost at the configured price, in this process; :func:`usage_metrics` flattens it for MLflow.
* :class:`JudgeLedger` keeps the same totals in a folder, under a file lock: while a ledger is in use
  (:func:`use_ledger`; GRPO training uses ``<run folder>/judge_ledger``), every process that names the folder —
  each rank, on any machine that mounts it, and the same run restarted — adds to one account, the budget is checked
  against it, :func:`usage_metrics` reports it, and the rate limiters keep their schedules there.
* :class:`JudgeBudgetExceeded` is raised before a batch once the endpoint's cost reached ``budget_usd``.
* :class:`UnknownVerdictRateError` is raised when more than ``max_unknown_rate`` of a batch (of at least
  :data:`MIN_ITEMS_FOR_RATE` items) could not be judged: a failed call would otherwise count as "not optimal" and
  lower the process reward silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

MIN_ITEMS_FOR_RATE: Final = 20
"""A batch smaller than this never trips the unknown-rate cap (one failure in five is noise, not an outage)."""


class JudgeBudgetExceeded(RuntimeError):
    """The estimated spend of a judge endpoint reached its ``budget_usd``."""


class UnknownVerdictRateError(RuntimeError):
    """Too many verdicts of a batch are unknown (failed calls, unparsable replies)."""


class RateLimiter:
    """Requests spaced to ``requests_per_minute`` (module docstring); ``state_file`` shares the schedule between
    processes."""

    def __init__(self, requests_per_minute: float, *, state_file: str | Path | None = None,
                 name: str | None = None) -> None:
        if requests_per_minute <= 0:
            raise ValueError(f"requests_per_minute must be > 0, got {requests_per_minute}")
        self.interval = 60.0 / requests_per_minute
        self.burst = max(1.0, requests_per_minute / 60.0)
        self.state_file = Path(state_file) if state_file is not None else None
        self.name = name or (self.state_file.name if self.state_file is not None else None)
        """The schedule's file name in a ledger folder (:func:`use_ledger`), which then replaces ``state_file``."""
        self._lock = threading.Lock()
        self._next_free = 0.0

    def _state_path(self) -> Path | None:
        ledger = active_ledger()
        if ledger is not None and self.name is not None:
            return ledger.folder / self.name
        return self.state_file

    def _reserve(self) -> float:
        """Reserve the next slot; the seconds to wait for it."""
        with self._lock:
            state_file = self._state_path()
            if state_file is None:
                return self._advance_local()
            state_file.parent.mkdir(parents=True, exist_ok=True)
            with open(state_file, "a+") as handle:
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
            name = f"ratelimit-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
            state = Path(state_dir) / name if state_dir is not None else None
            limiter = _LIMITERS[key] = RateLimiter(requests_per_minute, state_file=state, name=name)
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

LEDGER_FILE: Final = "judge_ledger.json"


class JudgeLedger:
    """Calls, tokens and cost per ``(endpoint, model)`` in ``folder/judge_ledger.json``, shared by every process
    that opens the folder: each update reads, adds and atomically replaces the file under an exclusive ``flock`` of
    ``folder/judge_ledger.lock`` (a crash mid-update leaves the previous total), so concurrent ranks never lose a
    call and a restarted run goes on from what was spent. The folder also holds the rate limiters' schedules."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LEDGER_FILE

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "judge_ledger.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[tuple[str, str], Usage]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise RuntimeError(f"judge ledger {self.path}: unreadable ({error}); the spend it held is unknown, so "
                               "judging stops rather than overrun the budget (move the file away to start over)"
                               ) from error
        return {(entry["endpoint"], entry["model"]): Usage(**{key: entry[key] for key in asdict(Usage())})
                for entry in raw.get("usage", [])}

    def _write(self, usage: dict[tuple[str, str], Usage]) -> None:
        entries: list[dict[str, Any]] = [{"endpoint": url, "model": model, **asdict(item)}
                                         for (url, model), item in sorted(usage.items())]
        temporary = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        temporary.write_text(json.dumps({"usage": entries}, indent=1), encoding="utf-8")
        temporary.replace(self.path)

    def add(self, base_url: str, model: str, input_tokens: int, output_tokens: int, cost_usd: float) -> Usage:
        """Add one reply's usage; the ledger's running total of its endpoint and model."""
        with self._locked():
            usage = self._read()
            item = usage.setdefault((base_url.rstrip("/"), model), Usage())
            item.calls += 1
            item.input_tokens += input_tokens
            item.output_tokens += output_tokens
            item.cost_usd += cost_usd
            self._write(usage)
            return item

    def usage(self) -> dict[tuple[str, str], Usage]:
        """Every ``(endpoint, model)``'s totals."""
        with self._locked():
            return self._read()


_LEDGER: JudgeLedger | None = None


def active_ledger() -> JudgeLedger | None:
    """The ledger in use in this process (:func:`use_ledger`), if any."""
    return _LEDGER


@contextlib.contextmanager
def use_ledger(folder: str | Path | None) -> Iterator[JudgeLedger | None]:
    """Within the block, judges of this process account to the :class:`JudgeLedger` in ``folder`` (None: the
    process's own :data:`USAGE`): spend, budget, :func:`usage_metrics` and the rate-limit schedules."""
    global _LEDGER
    previous = _LEDGER
    _LEDGER = JudgeLedger(folder) if folder is not None else None
    try:
        yield _LEDGER
    finally:
        _LEDGER = previous


def _usage_cost(input_tokens: int, output_tokens: int, price_per_million: tuple[float, float] | None) -> float:
    if price_per_million is None:
        return 0.0
    return (input_tokens * price_per_million[0] + output_tokens * price_per_million[1]) / 1e6


def record_usage(base_url: str, model: str, input_tokens: int, output_tokens: int,
                 price_per_million: tuple[float, float] | None) -> Usage:
    """Add one reply's usage to :data:`USAGE` (and to the ledger in use); the running total of its endpoint and
    model (the ledger's when one is in use)."""
    cost = _usage_cost(input_tokens, output_tokens, price_per_million)
    with _USAGE_LOCK:
        usage = USAGE.setdefault((base_url.rstrip("/"), model), Usage())
        usage.calls += 1
        usage.input_tokens += input_tokens
        usage.output_tokens += output_tokens
        usage.cost_usd += cost
        usage = Usage(**asdict(usage))
    ledger = active_ledger()
    return ledger.add(base_url, model, input_tokens, output_tokens, cost) if ledger is not None else usage


def _current_usage() -> dict[tuple[str, str], Usage]:
    ledger = active_ledger()
    if ledger is not None:
        return ledger.usage()
    with _USAGE_LOCK:
        return {key: Usage(**asdict(value)) for key, value in USAGE.items()}


def endpoint_cost(base_url: str) -> float:
    """The estimated spend on ``base_url`` so far (every model): the ledger's when one is in use (every process and
    restart that shares it), else this process's."""
    key = base_url.rstrip("/")
    return sum(usage.cost_usd for (url, _), usage in _current_usage().items() if url == key)


def process_cost() -> float:
    """What this process's judges spent so far (every endpoint), whatever ledger is in use."""
    with _USAGE_LOCK:
        return sum(usage.cost_usd for usage in USAGE.values())


def usage_metrics() -> dict[str, float]:
    """The usage as flat metrics: ``judge_usage/<model>/{calls,input_tokens,output_tokens,cost_usd}`` and
    ``judge_usage/cost_usd`` (all judges); the ledger's totals when one is in use, else this process's."""
    metrics: dict[str, float] = {}
    usage = _current_usage()
    for (_, model), item in sorted(usage.items()):
        name = model.replace(":", "_").replace("/", "_")
        for field in ("calls", "input_tokens", "output_tokens", "cost_usd"):
            key = f"judge_usage/{name}/{field}"
            metrics[key] = metrics.get(key, 0.0) + float(getattr(item, field))
    if usage:
        metrics["judge_usage/cost_usd"] = sum(item.cost_usd for item in usage.values())
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
