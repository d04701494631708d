"""Give a finished stage's memory back before the next one starts (``make train`` runs every stage in one process).

Two things keep a finished trainer's or generator's memory in the process after the function that made it returns:

* **Reference cycles.** TRL patches ``model.forward`` with a method bound to the model (its fused LM head), and the
  trainer, its accelerator and callbacks point at each other, so the model, its gradients and the optimizer state
  are freed only by Python's cyclic collector, whose oldest generation runs rarely.
* **The C heap.** glibc's ``malloc`` serves the many 1–32 MB activation tensors of a forward/backward pass from its
  heap and keeps what they free for reuse: the resident set of a process that trained stays near the training
  peak (measured: 6.2 GiB resident after a GRPO forward pass whose live tensors were 1.4 GiB) until
  ``malloc_trim`` hands the free pages back.

:func:`release_memory` does both; the training and rollout functions call it when they finish
(benchmarks/stage_memory.py measures the stages).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Final

logger = logging.getLogger(__name__)


@cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``malloc_trim``; musl has none), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    libc = _glibc()
    return None if libc is None else libc.malloc_trim


M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
HEAP_REUSE_BYTES: Final = 1 << 30
"""Inside :func:`reusing_freed_memory`, blocks up to this size come from (and go back to) glibc's heap."""
GLIBC_MMAP_CEILING: Final = 32 << 20
"""glibc's own largest mmap threshold on 64-bit, which its dynamic threshold reaches after the first large frees;
restored afterwards, with the trim threshold at twice it (glibc's dynamic rule)."""
_reuse_lock = threading.Lock()
_reuse_depth = 0


@contextmanager
def reusing_freed_memory() -> Iterator[bool]:
    """While inside, glibc's ``malloc`` serves and keeps blocks up to :data:`HEAP_REUSE_BYTES` in its heap
    (``mallopt``), so that the 0.1-1 GB tensors a batched prefill allocates and frees again (attention weights,
    logits) reuse pages instead of mapping fresh zeroed ones each time. By default glibc maps every block above 32
    MB on its own and unmaps it on ``free``. On 30 SFT-policy rollouts of ``make train``'s questions: 14.0 M page
    faults -> 1.4 M, 3% less node time, identical trajectories, no more peak memory (benchmarks/malloc_reuse.py; 8%
    with the same setting process-wide through ``GLIBC_TUNABLES``). Not used around training: process-wide, it made
    4 SFT steps 11% faster but raised their peak by 0.6 GB (fragmentation), past the laptop budget. On leaving,
    glibc's thresholds are restored and the free pages handed back (``malloc_trim``). Nests and is thread-safe (the
    outermost exit restores). Opt-in since issue 46: with the prefix cache and batches of several hundred MB
    (334e7c3), the heap fragments: the SFT-agent rollouts of make train alone peaked at 6.16 GiB with it, 5.47 GiB
    without (230.9 vs 236.5 s), and make train peaked at 8.5 GiB in them. Yields whether it applied: only on glibc
    with ``PRORAG_MALLOC_REUSE=1``."""
    global _reuse_depth
    mallopt = _mallopt() if os.environ.get("PRORAG_MALLOC_REUSE", "0") == "1" else None
    if mallopt is None:
        yield False
        return
    with _reuse_lock:
        _reuse_depth += 1
        if _reuse_depth == 1:
            mallopt(M_MMAP_THRESHOLD, HEAP_REUSE_BYTES)
            mallopt(M_TRIM_THRESHOLD, HEAP_REUSE_BYTES)
    try:
        yield True
    finally:
        with _reuse_lock:
            _reuse_depth -= 1
            if _reuse_depth == 0:
                mallopt(M_MMAP_THRESHOLD, GLIBC_MMAP_CEILING)
                mallopt(M_TRIM_THRESHOLD, 2 * GLIBC_MMAP_CEILING)
                trim = _malloc_trim()
                if trim is not None:
                    trim(0)


def _mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    libc = _glibc()
    return None if libc is None else libc.mallopt


def resident_bytes() -> int:
    """This process's resident set size now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def return_free_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``; nothing off glibc). KV tensors of a few MB
    (a layer of one row's past) come from the heap, which keeps the pages they free: without this after each
    generate call, the rollouts of make train held 7.8 GiB resident between batches."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_memory(what: str = "") -> int:
    """Collect reference cycles and return the C heap's free pages to the OS (glibc's ``malloc_trim``);
    returns the bytes the resident set shrank by (logged at debug level with ``what``)."""
    before = resident_bytes()
    gc.collect()
    return_free_heap()
    released = max(0, before - resident_bytes())
    logger.debug("released %.2f GiB after %s", released / 2**30, what or "a stage")
    return released
