"""Key/value cache reuse across generate calls: a bounded LRU of per-sequence KV states keyed by token ids.

A multi-turn rollout calls ``generate`` every turn with prompts that extend the previous turn's prompt by the
generated ids and the inserted text (retrieved context, protocol tags); the ``n`` samples of a GRPO group and
the sibling expansions of a tree node share their whole prompt. :class:`PrefixKVCache` keeps the KV states of
each sequence a backend computed, keyed by its token ids, and answers "the longest cached prefix of this
prompt" so that only the new suffix is prefilled. :class:`GenerationStats` counts prefill, reused and decoded
tokens (the cache hit rate). The batching of ragged cached prefixes lives in the backend
(:mod:`prorag.llm.transformers_backend`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]  # (keys, values), each (kv_heads, tokens, head_dim)


@dataclass
class GenerationStats:
    """Token counters of a generator (cumulative; :meth:`reset` zeroes them).

    ``prompt_tokens`` = ``cached_tokens`` (KV reused from the cache) + the prompt tokens prefilled by the call;
    ``prefill_tokens`` counts every token run through a prefill forward pass, including the shared prefixes
    prefilled once for groups of identical prompts (``shared_prefill_tokens``); ``decode_tokens`` counts the
    generated tokens kept in the completions; ``draft_tokens`` the prompt-lookup ids greedy decoding verified, of
    which the model agreed with ``accepted_draft_tokens``.
    """

    calls: int = 0
    prompts: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_hits: int = 0
    prefill_tokens: int = 0
    shared_prefill_tokens: int = 0
    decode_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, **counts: int) -> None:
        """Add to counters by name (thread-safe)."""
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    @property
    def cache_hit_rate(self) -> float:
        """Fraction of prompt tokens whose KV came from the cache (0 before any prompt)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def snapshot(self) -> dict[str, float]:
        """The counters and the hit rate as a plain dict (for logs, MLflow, ``/health``)."""
        values: dict[str, float] = {item.name: getattr(self, item.name) for item in fields(self)}
        values["cache_hit_rate"] = round(self.cache_hit_rate, 4)
        return values

    def since(self, earlier: dict[str, float]) -> dict[str, float]:
        """Counters accumulated since an earlier :meth:`snapshot` (with the hit rate of that span)."""
        delta: dict[str, float] = {item.name: getattr(self, item.name) - earlier.get(item.name, 0)
                                   for item in fields(self)}
        delta["cache_hit_rate"] = round(delta["cached_tokens"] / delta["prompt_tokens"], 4) \
            if delta["prompt_tokens"] else 0.0
        return delta

    def reset(self) -> None:
        """Zero every counter."""
        with self._lock:
            for item in fields(self):
                setattr(self, item.name, 0)


PROCESS_GENERATION_STATS = GenerationStats()
"""The sum of every in-process generator's counters (read per pipeline node by :mod:`prorag.hooks.timing`)."""


@dataclass
class CacheEntry:
    """The KV states of one token sequence: ``layers[l]`` holds exactly ``len(ids)`` positions."""

    ids: np.ndarray
    layers: list[LayerKV]
    nbytes: int
    call: int = 0  # the generate call that last used it


class PrefixKVCache:
    """LRU of per-sequence KV states bounded by ``max_bytes``; lookups find the longest common token prefix.

    ``fingerprint`` ties the entries to the model weights: when it changes (an optimizer step, loaded weights)
    every entry is dropped. Storing a sequence drops the cached entries that are prefixes of it (the new one
    serves every lookup they would serve). Eviction is least-recently-used, except that entries used by the
    current generate call (:meth:`begin_call`) are kept and a new entry that does not fit is dropped instead: a
    rollout whose trajectories need more than ``max_bytes`` then keeps reusing the ones that fit, instead of
    cycling through evictions with no hit at all. ``idle_calls``: entries that no call of the last ``idle_calls``
    used are dropped when a call begins (for callers that pass every live sequence to every call, as the rollout
    engine does each turn: a finished trajectory's KV is never used again). Thread-safe.
    """

    def __init__(self, max_bytes: int, idle_calls: int | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if idle_calls is not None and idle_calls < 1:
            raise ValueError(f"idle_calls must be >= 1 or None, got {idle_calls}")
        self.max_bytes = max_bytes
        self.idle_calls = idle_calls
        self.nbytes = 0
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._next_key = 0
        self._fingerprint: object = None
        self._call = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def validate(self, fingerprint: object) -> None:
        """Drop every entry if the model's ``fingerprint`` changed since the entries were stored."""
        with self._lock:
            if fingerprint != self._fingerprint:
                self._entries.clear()
                self.nbytes = 0
                self._fingerprint = fingerprint

    def begin_call(self) -> None:
        """Mark the start of a generate call (entries it uses are not evicted for its new entries); with
        ``idle_calls``, drop the entries that none of the last ``idle_calls`` calls used or stored."""
        with self._lock:
            self._call += 1
            if self.idle_calls is not None:
                for key in [key for key, entry in self._entries.items() if entry.call < self._call - self.idle_calls]:
                    self.nbytes -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def lookup(self, prompt: Sequence[int]) -> tuple[CacheEntry | None, int]:
        """The entry sharing the longest prefix with ``prompt`` and the reusable length.

        At most ``len(prompt) - 1`` tokens are reusable: the last prompt token is always run to get the
        next-token logits.
        """
        limit = len(prompt) - 1
        if limit < 1 or not self._entries:
            return None, 0
        query = np.asarray(prompt[:limit], dtype=np.int64)
        best: tuple[int, int] | None = None
        with self._lock:
            for key, entry in self._entries.items():
                if entry.ids[0] != query[0]:
                    continue
                span = min(limit, len(entry.ids))
                mismatch = np.flatnonzero(entry.ids[:span] != query[:span])
                shared = int(mismatch[0]) if mismatch.size else span
                if best is None or shared > best[1]:
                    best = (key, shared)
            if best is None:
                return None, 0
            self._entries.move_to_end(best[0])
            entry = self._entries[best[0]]
            entry.call = self._call
            return entry, best[1]

    def store(self, ids: Sequence[int], layers: list[LayerKV]) -> None:
        """Keep the KV states of ``ids`` (each layer's tensors hold ``len(ids)`` positions)."""
        if not ids:
            return
        nbytes = sum(keys.numel() * keys.element_size() + values.numel() * values.element_size()
                     for keys, values in layers)
        if nbytes > self.max_bytes:
            return
        array = np.asarray(ids, dtype=np.int64)
        with self._lock:
            for key in [key for key, entry in self._entries.items()
                        if len(entry.ids) <= len(array) and np.array_equal(entry.ids, array[: len(entry.ids)])]:
                self.nbytes -= self._entries.pop(key).nbytes
            for key in [key for key, entry in self._entries.items() if entry.call != self._call]:
                if self.nbytes + nbytes <= self.max_bytes:
                    break
                self.nbytes -= self._entries.pop(key).nbytes  # least recently used first
            if self.nbytes + nbytes > self.max_bytes:
                return  # everything left is in use by this call
            self._entries[self._next_key] = CacheEntry(array, layers, nbytes, self._call)
            self._next_key += 1
            self.nbytes += nbytes
