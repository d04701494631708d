"""In-process generation with a transformers causal LM: batched, left-padded, stop strings per sequence.

- Prompts are sorted by token length into batches of ``batch_size`` rows (less padding) and the results are
  put back in prompt order. ``n`` samples repeat each prompt ``n`` times in the batch (greedy decoding runs
  once and copies the result).
- Stop strings are checked after every token, for each row separately, on the decoded tail of the
  *generated* tokens (never the prompt): a row that completed a stop string is finished (transformers then
  feeds it padding) while the other rows go on; ``generate`` returns when every row is finished. Each row is
  then cut: ``token_ids`` is the shortest prefix whose decoding contains the stop string, ``text`` ends
  exactly with it. Only rows whose last token may end a stop string and whose tail holds a token that may
  start one are decoded (per-token id sets, see :meth:`TransformersGenerator._stop_filters`).
- Log-probabilities are ``log_softmax(logits / T)`` of the chosen token, where the logits are the model's
  raw next-token logits and ``T`` the sampling temperature (``T = 1`` for greedy decoding), taken *before*
  top-p truncation: the quantity a policy-gradient trainer recomputes from the same logits.
- Seeds: with ``params.seed`` the torch RNG is re-seeded for the call inside ``torch.random.fork_rng`` (the
  global RNG state is left as it was). Results are reproducible for the same prompts, parameters and
  ``batch_size``; they depend on which rows share a batch.
- Generation settings come only from :class:`~prorag.llm.generation.SamplingParams`: the model's own
  ``generation_config`` sampling defaults (top-k, repetition penalty, …) are neutralized.
- KV reuse (``prefix_cache_mb > 0``, the default): the KV states of every sequence the generator ran (prompt +
  kept completion) are kept in a :class:`~prorag.llm.prefix_cache.PrefixKVCache`; a prompt that extends a
  cached sequence (the next turn of a multi-turn rollout) prefills only its new suffix. A ragged batch (rows
  with different cached lengths and different new suffixes) is laid out as ``[pad | cached | pad | suffix]``
  with a 2-D attention mask that has holes, so positions (``cumsum(mask) - 1``) and attention are exactly
  those of the left-padded re-prefill; greedy output is token-identical to ``prefix_cache_mb=0`` (tested).
  Rows of one call that share a prompt (the ``n`` samples of a GRPO group, sibling expansions of a tree
  node) or a long beginning (the system prompt and few-shot block of a rollout's first turn) get it prefilled
  once, as one row, before decoding. Then each row's own new suffix (all but its last token) is prefilled into the
  cache in batches of rows with similar suffix lengths (at most :data:`_PREFILL_PADDING` padding), so the decoding
  batch prefills one token per row: padded to the batch's longest suffix instead, one row that inserted 1,400
  retrieved tokens made eleven others prefill (and attend over) 1,400 positions too (a rollout of ``make train``:
  twice the real prefill tokens). The cache is dropped when the model's weights change (parameter version
  counters). Counters: :attr:`TransformersGenerator.stats`. transformers' continuous batching
  (``generate_batch``, paged attention with block sharing) was not used: it takes no stopping criteria or
  custom logits processors, which the per-row stop strings and chosen-token log-probabilities need, and it
  keeps no KV between calls; ``generate`` with a ``DynamicCache`` or ``StaticCache`` past does (a batch of
  several rows decodes into a ``StaticCache``, see :meth:`TransformersGenerator._layout`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import (
    AttentionInterface,
    DynamicCache,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StaticCache,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from prorag.llm.generation import (
    ChatMessage,
    Completion,
    GenerationCancelled,
    Prompt,
    SamplingParams,
    render_chat,
)
from prorag.llm.precision import compute_precision
from prorag.llm.prefix_cache import PROCESS_GENERATION_STATS, GenerationStats, LayerKV, PrefixKVCache
from prorag.llm.registry import load_causal_lm
from prorag.memory import return_free_heap

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from prorag.config import MixedPrecision


class _OneDtypeStaticCache(StaticCache):
    """A ``StaticCache`` that stores a layer's keys and values in one dtype.

    Under autocast over fp32 weights (full-parameter training: fp32 masters, bf16 compute) Llama's rotary embedding
    multiplies the bf16 keys by fp32 cos/sin, so keys arrive in fp32 and values in bf16; the stock layer allocates
    both in the keys' dtype and its ``index_copy_`` then refuses the values (found by the GPU smoke test on an H200,
    reproduced on the CPU under bf16 autocast).
    """

    row_slots: torch.Tensor | None = None
    """``(batch, new tokens)``: the cache slot each row writes each new token to (speculative greedy decoding, where
    rows accept different numbers of tokens per step); ``None``: the stock update (every row at the same slots)."""
    storage_dtype: torch.dtype | None = None
    """The dtype keys and values are stored in (None: the keys'); see :class:`_StoredDynamicCache`."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        dtype = (layer.dtype if layer is not None and layer.is_initialized
                 else self.storage_dtype or key_states.dtype)
        if self.row_slots is None or layer is None or not layer.is_initialized:
            return super().update(key_states.to(dtype), value_states.to(dtype), layer_idx, *args, **kwargs)
        index = self.row_slots[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[3])
        layer.keys.scatter_(2, index, key_states.to(dtype))
        layer.values.scatter_(2, index, value_states.to(dtype))
        return layer.keys, layer.values


class _StoredDynamicCache(DynamicCache):
    """A ``DynamicCache`` that stores keys and values in ``storage_dtype`` (None: as they come).

    Under bf16 autocast (``mixed_precision="bf16"``) the rotary embedding hands fp32 keys and the values come in
    bf16, and attention casts both to bf16 at every step: stored in bf16 they hold the values attention reads,
    in half the memory, and a decoding step no longer casts each row's whole past."""

    def __init__(self, *args: Any, storage_dtype: torch.dtype | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storage_dtype = storage_dtype

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.storage_dtype is not None:
            key_states, value_states = key_states.to(self.storage_dtype), value_states.to(self.storage_dtype)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


_STOP_WINDOW_MARGIN = 8  # extra tokens decoded beyond the longest stop string's length in characters
_MIN_SHARED_SAVING = 16  # prefill tokens a shared prefix must save to be worth its own forward pass
_PREFILL_PADDING = 0.25  # a prefill batch's padded tokens, at most this fraction of its real ones (beyond 1 row)
# a prefill batch's padded tokens at most (beyond 1 row): its attention weights are (rows, heads, suffix, past) floats
# per layer (32 rows of ~600 inserted tokens over ~1,200 of past: ~0.8 GB a layer in float32)
_PREFILL_TOKENS = 2048
# tokenizer -> {characters: token ids whose decoding holds one} (see TransformersGenerator._tokens_with)
_STOP_FILTERS: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], frozenset[int]]] = weakref.WeakKeyDictionary()


class _StopStrings(StoppingCriteria):
    """Marks each row finished once the decoded tail of its generated tokens contains a stop string.

    Only a row that may have completed a stop string at this step is decoded: its last token must be one that
    may end a stop string (``may_end``) and its tail must hold one that may start one (``may_start``; token-id
    sets from :meth:`TransformersGenerator._stop_filters`, ``None``: no filter on that side).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str], prompt_width: int,
                 batch: int, skip_ids: set[int], may_end: frozenset[int] | None = None,
                 may_start: frozenset[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.prompt_width = prompt_width
        self.window = max(len(stop) for stop in self.stops) + _STOP_WINDOW_MARGIN
        self.skip_ids = skip_ids
        self.may_end = may_end
        self.may_start = may_start
        self.done = [False] * batch
        self.stopped_at: dict[int, int] = {}  # row -> number of generated tokens when it stopped

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_width
        start = max(self.prompt_width, input_ids.shape[1] - self.window)
        for row, tail in enumerate(input_ids[:, start:].tolist()):
            self.check(row, tail, generated)
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)

    def check(self, row: int, tail: list[int], generated: int) -> bool:
        """Whether ``row`` is finished, its generated ``tail`` (the last ``window`` ids or fewer, of ``generated``
        in all) checked for a stop string it has just completed."""
        if self.done[row] or not tail or tail[-1] in self.skip_ids:
            return self.done[row]  # finished, nothing generated yet, or ended by EOS (generate pads it from then on)
        if (self.may_end is not None and tail[-1] not in self.may_end) \
                or (self.may_start is not None and self.may_start.isdisjoint(tail)):
            return False  # cannot have completed a stop string at this token
        text = self.tokenizer.decode(tail, skip_special_tokens=True)
        if any(stop in text for stop in self.stops):
            self.done[row] = True
            self.stopped_at[row] = generated
        return self.done[row]


class _ChosenLogprobs(LogitsProcessor):
    """Records ``log_softmax(raw_logits / T)`` of each chosen token (sees the logits before any warper)."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:  # the token chosen at the previous step is now the last input id
            self.steps.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor, generated: int) -> torch.Tensor:
        """Per-row log-probabilities of the ``generated`` tokens, shape ``(batch, generated)``."""
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, sequences[:, -1:]).squeeze(1))
            self._pending = None
        if not self.steps:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.steps, dim=1)[:, :generated].cpu()


class _Cancelled(StoppingCriteria):
    """Finishes every row as soon as ``cancelled()`` is true (checked once per decoded token)."""

    def __init__(self, cancelled: Callable[[], bool]) -> None:
        self.cancelled = cancelled
        self.fired = False

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        self.fired = self.fired or self.cancelled()
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)


class TransformersGenerator:
    """Generate with an in-process transformers causal LM (see the module docstring for the semantics).

    ``model`` is a registry spec (``bundled:…``, a local folder, a hub name) or a ``(model, tokenizer)``
    pair; ``dtype`` and ``device`` apply to specs only. String prompts are tokenized without adding special
    tokens (chat templates already carry them); set ``add_special_tokens=True`` for raw text prompts of
    models that expect a BOS token. Calls are serialized with a lock, so one instance may be shared by
    threads. ``prefix_cache_mb`` bounds the KV states kept for reuse across calls (0 turns reuse and prefix
    sharing off: every call re-prefills its prompts); ``prefix_cache_idle_calls`` drops what that many calls in a
    row did not use (:class:`PrefixKVCache`); :attr:`stats` counts prefill, reused and decoded tokens.
    A decoding or prefill batch holds at most ``batch_size`` rows and at most the rows whose past fits ``batch_kv_mb``
    (:meth:`_decoding_batches`, :meth:`_prefill_into_cache`).
    ``draft_tokens``: prompt-lookup ids each greedy decoding step verifies per row beyond its next token
    (:meth:`_decode_greedy`; 0: one token a step; the output is the greedy one either way).
    ``synced_gpus`` is transformers' ``generate`` flag (None: its default, on for a sharded model in a process
    group — an all-reduce per decoding step); False where the parameters are whole on every rank and the ranks
    generate independently (the GRPO rollouts under FSDP2 / ZeRO-3, ``prorag.training.trl_grpo.policy_generator``).
    ``mixed_precision="bf16"`` generates under bf16 autocast (:mod:`prorag.llm.precision`; store the weights with
    :func:`~prorag.llm.precision.inference_weights_in_bf16` first, or autocast casts them at every forward).
    """

    def __init__(self, model: str | tuple[PreTrainedModel, PreTrainedTokenizerBase], *, dtype: str = "float32",
                 device: str = "cpu", batch_size: int = 8, add_special_tokens: bool = False,
                 prefix_cache_mb: float = 2048.0, batch_kv_mb: float = 1024.0,
                 prefix_cache_idle_calls: int | None = None, synced_gpus: bool | None = None,
                 draft_tokens: int = 3, mixed_precision: MixedPrecision = "no") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0, got {draft_tokens}")
        compute_precision(mixed_precision, torch.device("cpu"))  # an unknown value: an error before the model loads
        if not prefix_cache_mb >= 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        if not batch_kv_mb > 0:
            raise ValueError(f"batch_kv_mb must be > 0, got {batch_kv_mb}")
        if isinstance(model, str):
            self.model, self._tokenizer = load_causal_lm(model, dtype=dtype, device=device)
            self.name = model
        else:
            self.model, self._tokenizer = model
            self.name = getattr(self.model.config, "name_or_path", type(self.model).__name__)
        self.model.eval()
        self.batch_size = batch_size
        self.add_special_tokens = add_special_tokens
        self._lock = threading.Lock()
        tokenizer = self._tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_token_id: int = int(tokenizer.pad_token_id)
        self.eos_token_ids: set[int] = _eos_ids(self.model, tokenizer)
        self.vocab_size = int(getattr(self.model.config, "vocab_size", len(tokenizer)))
        self.prefix_cache = (PrefixKVCache(int(prefix_cache_mb * 2**20), idle_calls=prefix_cache_idle_calls)
                             if prefix_cache_mb > 0 else None)
        self.batch_kv_bytes = batch_kv_mb * 2**20
        self._kv_position_bytes = _kv_bytes_per_position(self.model)  # 0: unknown, batches capped by rows only
        self.synced_gpus = synced_gpus
        self.draft_tokens = draft_tokens
        self.mixed_precision = mixed_precision
        # attention's dtype under autocast. Batches stay those of the weights' dtype (``_kv_position_bytes`` counts
        # positions at its size): counted at bf16's, twice the rows per batch made make train's SFT-agent rollouts
        # 1.5x slower (85.2 vs 56.3 s, 16.2 M vs 1.7 M page faults)
        self._kv_dtype = torch.bfloat16 if mixed_precision == "bf16" else None
        self.stats = GenerationStats()

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer."""
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[ChatMessage]) -> str:
        """The chat-templated prompt for ``messages``, ending with the assistant turn's header."""
        return render_chat(self._tokenizer, messages)

    def generate_chat(self, conversations: Sequence[Sequence[ChatMessage]],
                      params: SamplingParams) -> list[list[Completion]]:
        """Generate for chat conversations (templated with the model's chat template)."""
        return self.generate([self.apply_chat_template(messages) for messages in conversations], params)

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt (ids are validated and passed through)."""
        if isinstance(prompt, str):
            ids = self._tokenizer(prompt, add_special_tokens=self.add_special_tokens)["input_ids"]
        else:
            ids = list(prompt)
            bad = [token for token in ids if isinstance(token, bool) or not isinstance(token, int)
                   or not 0 <= token < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be ints in [0, {self.vocab_size}), got {bad[:5]}")
        if not ids:
            raise ValueError("empty prompt: it has no tokens")
        return ids

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams, *,
                 cancelled: Callable[[], bool] | None = None) -> list[list[Completion]]:
        """Generate ``params.n`` completions per prompt, batched by length; results in prompt order.

        ``cancelled`` (a server's "has every client of this call left?") is checked before each batch of rows and
        after every decoded token: once it is true, decoding stops and :class:`GenerationCancelled` is raised.
        """
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of prompts, not a single string")
        encoded = [self.encode(prompt) for prompt in prompts]
        if not encoded:
            return []
        copies = 1 if params.greedy else params.n
        rows = [(index, sample) for index in range(len(encoded)) for sample in range(copies)]
        rows.sort(key=lambda row: -len(encoded[row[0]]))  # stable: ties keep prompt order
        results: list[list[Completion | None]] = [[None] * copies for _ in encoded]
        with (self._lock, torch.inference_mode(), _seeded(params.seed, self.model.device),
              compute_precision(self.mixed_precision, self.model.device)):
            self._count(calls=1)
            try:
                if self.prefix_cache is not None:
                    self.prefix_cache.validate(_weights_fingerprint(self.model))
                    self.prefix_cache.begin_call()
                    self._prefill_shared([encoded[index] for index, _ in rows])
                reused = (self._prefill_rows([encoded[index] for index, _ in rows])
                          if self.prefix_cache is not None and len(rows) > 1 else {})
                for start, stop in self._decoding_batches([len(encoded[index]) for index, _ in rows],
                                                          params.max_new_tokens + self._draft_room(params)):
                    chunk = rows[start:stop]
                    if cancelled is not None and cancelled():
                        raise GenerationCancelled(f"cancelled after {start} of {len(rows)} rows")
                    outputs = self._generate_batch([encoded[index] for index, _ in chunk], params, cancelled, reused)
                    for (index, sample), completion in zip(chunk, outputs, strict=True):
                        results[index][sample] = completion
            finally:  # also when a batch raises (a cancelled server request): its past is freed either way
                return_free_heap()  # the batches' pasts and the replaced cache entries
        final: list[list[Completion]] = []
        for samples in results:
            done = [completion for completion in samples if completion is not None]
            if copies == 1 and params.n > 1:  # greedy: every sample is the same
                done = [dataclasses.replace(done[0], token_ids=list(done[0].token_ids),
                                            logprobs=None if done[0].logprobs is None else list(done[0].logprobs))
                        for _ in range(params.n)]
            final.append(done)
        return final

    # ------------------------------------------------------------------------------- KV reuse and batching

    def _prefill_shared(self, prompts: list[list[int]]) -> None:
        """Prefill once (into the cache) every prefix that several rows of this call share beyond the cache.

        Rows that share a whole prompt (GRPO groups, the ``n`` samples of a prompt, sibling expansions of a
        tree node) or a long beginning (one system prompt and few-shot block before different questions, the
        first turn of a rollout) would each prefill it in their own row of the padded batch; here it is
        prefilled once, as one row, and the rows then reuse it and prefill only what follows. Nested shared
        prefixes go outermost first, so a longer one extends the shorter one already cached; a prefix is
        prefilled only if it saves at least :data:`_MIN_SHARED_SAVING` prefill tokens.
        """
        assert self.prefix_cache is not None
        candidates = _shared_prefixes(prompts)  # shortest first
        while candidates:
            outermost = [prefix for index, prefix in enumerate(candidates)
                         if not any(prefix[: len(other)] == other for other in candidates[:index])]
            done = set(outermost)
            candidates = [prefix for prefix in candidates if prefix not in done]
            shared = []
            for prefix in outermost:
                rows = sum(len(ids) > len(prefix) and tuple(ids[: len(prefix)]) == prefix for ids in prompts)
                # the -1 is never compared: lookup leaves a prompt's last id to be run
                new = len(prefix) - self.prefix_cache.lookup([*prefix, -1])[1]
                if new > 1 and (rows - 1) * new >= _MIN_SHARED_SAVING:
                    shared.append(list(prefix))
            self._prefill_into_cache(shared)

    def _prefill_rows(self, prompts: list[list[int]]) -> dict[tuple[int, ...], int]:
        """Prefill into the cache what each prompt adds to its cached prefix, all but its last token.

        Returns the length of each prompt that came from the cache when its own prefill batch ran (earlier calls,
        shared prefixes, rows of an earlier batch), so that the decoding batch counts the rest as prefilled.
        """
        assert self.prefix_cache is not None
        reused: dict[tuple[int, ...], int] = {}
        for ids in prompts:
            key = tuple(ids)
            if key not in reused:
                reused[key] = self.prefix_cache.lookup(ids)[1]
        pending = [key for key, cached in reused.items() if cached < len(key) - 1]
        # what a row reuses is known at its own batch: it may extend what an earlier batch of rows stored
        at_prefill = self._prefill_into_cache([list(key[:-1]) for key in pending], shared=False)
        reused.update({key: at_prefill[key[:-1]] for key in pending})
        return reused

    def _prefill_into_cache(self, sequences: list[list[int]], *, shared: bool = True) -> dict[tuple[int, ...], int]:
        """Run ``sequences`` (token ids) through the model and store their KV states, in batches of rows whose
        uncached suffixes have similar lengths and whose padded past fits ``batch_kv_mb``
        (:func:`_padding_bounded_chunks`); returns each sequence's cached length when its batch ran. ``shared``: they
        are prefixes shared by several rows (counted as ``shared_prefill_tokens`` too). Without the KV bound, 24 rows
        of make train's RL-agent rollouts, ~1,920 cached positions each, prefilled into one 2.1 GB past: 7.3 GiB
        peak for the node alone, 5.8 GiB with it, the same 30 trajectories."""
        assert self.prefix_cache is not None
        reused: dict[tuple[int, ...], int] = {}
        cached = [self.prefix_cache.lookup([*ids, -1])[1] for ids in sequences]
        suffixes = [len(ids) - length for ids, length in zip(sequences, cached, strict=True)]
        per_position = self._kv_position_bytes
        for indices in _padding_bounded_chunks(suffixes, self.batch_size, _PREFILL_PADDING, _PREFILL_TOKENS,
                                               past=cached, max_positions=(self.batch_kv_bytes / per_position
                                                                           if per_position else None)):
            chunk = [sequences[index] for index in indices]
            batch = self._layout(chunk)
            position_ids = (batch.attention.cumsum(-1) - 1).clamp(min=0)[:, batch.cached_width :]
            past = batch.cache if batch.cache is not None else self._dynamic_cache()
            outputs = self.model(input_ids=batch.input_ids[:, batch.cached_width :].to(self.model.device),
                                 attention_mask=batch.attention.to(self.model.device),
                                 position_ids=position_ids.to(self.model.device),
                                 past_key_values=past,
                                 use_cache=True, logits_to_keep=1)
            prefilled = sum(len(ids) - cached for ids, cached in zip(chunk, batch.cached, strict=True))
            self._count(prefill_tokens=prefilled, shared_prefill_tokens=prefilled if shared else 0)
            for row, ids in enumerate(chunk):
                self.prefix_cache.store(ids, _row_kv(outputs.past_key_values, row, batch.columns(row, 0)))
                reused[tuple(ids)] = batch.cached[row]
        return reused

    def _dynamic_cache(self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> DynamicCache:
        """A ``DynamicCache`` (over ``layers``' keys and values, when given) storing KV in :attr:`_kv_dtype`."""
        return _StoredDynamicCache(ddp_cache_data=layers, config=self.model.config, storage_dtype=self._kv_dtype)

    def _stop_filters(self, stops: tuple[str, ...]) -> tuple[frozenset[int] | None, frozenset[int] | None]:
        """The token ids that may end one of ``stops``, and those that may hold the start of one.

        A stop string's last and first characters each come from a single token when they are ASCII (a byte
        that no multi-byte character contains), whose own decoding then contains it; tokens whose decoding is
        partial (U+FFFD) are always included. ``None`` where that does not hold (no filter on that side); a
        whitespace first character is not filtered on (decoders may drop a token's leading space).
        """
        finals = {stop[-1] for stop in stops}
        firsts = {stop[0] for stop in stops}
        may_end = self._tokens_with(finals) if all(char.isascii() for char in finals) else None
        may_start = (self._tokens_with(firsts)
                     if all(char.isascii() and not char.isspace() for char in firsts) else None)
        return may_end, may_start

    def _tokens_with(self, chars: set[str]) -> frozenset[int]:
        """Token ids whose own decoding contains one of ``chars`` or a partial character (cached per tokenizer)."""
        key = tuple(sorted(chars))
        found = _STOP_FILTERS.setdefault(self._tokenizer, {})
        if key not in found:
            known = len(self._tokenizer)
            texts = self._tokenizer.batch_decode([[token] for token in range(known)], skip_special_tokens=False)
            found[key] = frozenset([token for token, text in enumerate(texts)
                                    if "\ufffd" in text or any(char in text for char in chars)]
                                   + list(range(known, self.vocab_size)))  # ids the tokenizer does not know
        return found[key]

    def _decoding_batches(self, lengths: list[int], new_tokens: int) -> list[tuple[int, int]]:
        """``(start, stop)`` of consecutive rows (``lengths`` longest first) per decoding batch: at most
        ``batch_size`` rows, and no more than fit ``batch_kv_mb`` with room for ``new_tokens`` each (a batch's past is
        as wide as its longest row; at least one row). Without the cap, 30 rows of make train's SFT-agent rollouts
        decoded into one 2.7 GB past and the run's peak RSS rose by 1.7 GiB, over the laptop budget."""
        per_position = self._kv_position_bytes
        batches: list[tuple[int, int]] = []
        start = 0
        while start < len(lengths):
            size = self.batch_size
            if per_position:
                size = min(size, max(1, int(self.batch_kv_bytes // ((lengths[start] + new_tokens) * per_position))))
            stop = min(len(lengths), start + size)
            batches.append((start, stop))
            start = stop
        return batches

    def _draft_room(self, params: SamplingParams) -> int:
        """Cache slots a decoding batch needs beyond ``max_new_tokens``: a step writes a row's draft past its end."""
        return self.draft_tokens if params.greedy and not self.synced_gpus else 0

    def _count(self, **counts: int) -> None:
        self.stats.add(**counts)
        PROCESS_GENERATION_STATS.add(**counts)

    def _layout(self, prompts: list[list[int]], new_tokens: int = 0, drafted: bool = False) -> _Batch:
        """Lay a ragged batch out as ``[pad | cached prefix | pad | new suffix]`` rows (see the module docstring).

        transformers batches a past only as one rectangular cache (layers of shape ``(batch, heads, length,
        dim)``) and has no call that merges per-sequence caches of different lengths, so the cached prefixes are
        left-padded into one here; the padded slots are masked out. ``new_tokens``: the tokens the batch will
        decode. Several rows attend through a padding mask anyway, so when the free slots are at most the prompt
        width the past is transformers' ``StaticCache`` with room for them: a ``DynamicCache`` concatenates, so
        copies, every layer's whole past at each decoded token (~8% of a batched rollout), a static one writes
        one slot in place and attends over the free (masked) slots too. One row keeps the mask-free
        ``DynamicCache`` unless it decodes with prompt-lookup drafts (``drafted``), which only the static layout
        feeds: ``prorag ask`` (one question at a time) ran 1.9x faster with it (``benchmarks/rollout.py`` (a')).
        """
        hits = [self.prefix_cache.lookup(ids) if self.prefix_cache is not None else (None, 0) for ids in prompts]
        cached = [length for _, length in hits]
        cached_width = max(cached)
        suffix_width = max(len(ids) - length for ids, length in zip(prompts, cached, strict=True))
        width = cached_width + suffix_width
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (ids, length) in enumerate(zip(prompts, cached, strict=True)):
            suffix = len(ids) - length
            if length:
                input_ids[row, cached_width - length : cached_width] = torch.tensor(ids[:length], dtype=torch.long)
                attention[row, cached_width - length : cached_width] = 1
            input_ids[row, width - suffix :] = torch.tensor(ids[length:], dtype=torch.long)
            attention[row, width - suffix :] = 1
        static = (len(prompts) > 1 or drafted) and 0 < new_tokens <= width
        cache: DynamicCache | StaticCache | None = None
        if static:
            cache = _OneDtypeStaticCache(config=self.model.config, max_cache_len=width + new_tokens)
            cache.storage_dtype = self._kv_dtype
        if cached_width:
            device = self.model.device
            layers: list[tuple[torch.Tensor, torch.Tensor]] = []
            template = next(entry for entry, _ in hits if entry is not None).layers
            for layer, (keys, values) in enumerate(template):
                heads = keys.shape[0]
                key_dtype, value_dtype = self._kv_dtype or keys.dtype, self._kv_dtype or values.dtype
                if cache is not None:  # zero-filled (batch, heads, width + new_tokens, dim), cached_width written
                    slots, empty = cache.layers[layer], (len(prompts), heads, 0)
                    slots.lazy_initialization(keys.new_empty((*empty, keys.shape[2]), device=device, dtype=key_dtype),
                                              values.new_empty((*empty, values.shape[2]), device=device,
                                                               dtype=value_dtype))
                    slots.cumulative_length.fill_(cached_width)
                    batch_keys, batch_values = slots.keys, slots.values
                else:
                    batch_keys = keys.new_zeros((len(prompts), heads, cached_width, keys.shape[2]), device=device,
                                                dtype=key_dtype)
                    batch_values = values.new_zeros((len(prompts), heads, cached_width, values.shape[2]),
                                                     device=device, dtype=value_dtype)
                    layers.append((batch_keys, batch_values))
                for row, (entry, length) in enumerate(hits):
                    if entry is not None and length:
                        batch_keys[row, :, cached_width - length : cached_width] = entry.layers[layer][0][:, :length]
                        batch_values[row, :, cached_width - length : cached_width] = entry.layers[layer][1][:, :length]
            if cache is None:
                cache = self._dynamic_cache(layers)
        return _Batch(input_ids, attention, cache, cached, cached_width, [len(ids) for ids in prompts])

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams,
                        cancelled: Callable[[], bool] | None = None,
                        reused: dict[tuple[int, ...], int] | None = None) -> list[Completion]:
        """Decode one batch of rows. ``reused``: each prompt's cached length before this call's row prefill
        (:meth:`_prefill_rows`); the KV that prefill added is counted as prefilled, not as reused."""
        draft_room = self._draft_room(params)
        batch = self._layout(prompts, params.max_new_tokens + draft_room, drafted=draft_room > 0)
        stopper = (_StopStrings(self._tokenizer, params.stop, batch.input_ids.shape[1], len(prompts),
                                self.eos_token_ids | {self.pad_token_id}, *self._stop_filters(params.stop))
                   if params.stop else None)
        if params.greedy and isinstance(batch.cache, StaticCache) and not self.synced_gpus:
            completions = self._decode_greedy(prompts, batch, params, stopper, cancelled)
        else:
            completions = self._decode_with_generate(prompts, batch, params, stopper, cancelled)
        earlier = [min(cached, (reused or {}).get(tuple(ids), cached))
                   for ids, cached in zip(prompts, batch.cached, strict=True)]
        self._count(prompts=len(prompts), prompt_tokens=sum(batch.lengths), cached_tokens=sum(earlier),
                    cache_hits=sum(length > 0 for length in earlier),
                    prefill_tokens=sum(batch.lengths) - sum(batch.cached),
                    decode_tokens=sum(len(completion.token_ids) for completion in completions))
        return completions

    def _decode_with_generate(self, prompts: list[list[int]], batch: _Batch, params: SamplingParams,
                              stopper: _StopStrings | None, cancelled: Callable[[], bool] | None) -> list[Completion]:
        """Decode a batch with transformers' ``generate`` (sampling, one row without drafts, synced GPUs); store the
        rows' KV."""
        width = batch.input_ids.shape[1]
        device = self.model.device
        canceller = _Cancelled(cancelled) if cancelled is not None else None
        recorder = _ChosenLogprobs(params.temperature) if params.logprobs else None
        past = batch.cache
        if past is None and self._kv_dtype is not None:  # else generate makes its own
            past = self._dynamic_cache()
        output = self.model.generate(
            input_ids=batch.input_ids.to(device),
            attention_mask=batch.attention.to(device),
            past_key_values=past,
            generation_config=self._generation_config(params),
            logits_processor=LogitsProcessorList([recorder] if recorder else []),
            stopping_criteria=StoppingCriteriaList([item for item in (stopper, canceller) if item is not None]),
            synced_gpus=self.synced_gpus,
        )
        if canceller is not None and canceller.fired:
            raise GenerationCancelled(f"cancelled after {output.sequences.shape[1] - width} decoded tokens")
        sequences = output.sequences
        generated = sequences[:, width:].cpu()
        logprobs = recorder.finish(sequences, generated.shape[1]) if recorder else None
        completions = []
        for row, ids in enumerate(prompts):
            limit = stopper.stopped_at.get(row) if stopper else None
            completions.append(self._finish_row(generated[row].tolist(), None if logprobs is None
                                                else logprobs[row].tolist(), len(ids), params, limit))
        if self.prefix_cache is not None and output.past_key_values is not None:
            cache_length = int(output.past_key_values.get_seq_length())
            for row, (ids, completion) in enumerate(zip(prompts, completions, strict=True)):
                # the last token of a sequence is never fed back, so its KV exists only if decoding went on
                self._store_row(ids, completion, output.past_key_values, row, batch, row, cache_length - width)
        return completions

    def _store_row(self, prompt: list[int], completion: Completion, cache: DynamicCache | StaticCache,
                   index: int, batch: _Batch, row: int, fed: int) -> None:
        """Keep a finished row's KV (cache row ``index``, batch row ``row``): its prompt and the first ``fed``
        decoded tokens that it kept (those whose KV was computed)."""
        if self.prefix_cache is None:
            return
        kept = min(len(completion.token_ids), fed)
        self.prefix_cache.store([*prompt, *completion.token_ids[:kept]],
                                _row_kv(cache, index, batch.columns(row, kept)))

    def _decode_greedy(self, prompts: list[list[int]], batch: _Batch, params: SamplingParams,
                       stopper: _StopStrings | None, cancelled: Callable[[], bool] | None) -> list[Completion]:
        """Greedy decoding of a batch laid out over a ``StaticCache``: finished rows leave it, and each step verifies
        every row's prompt-lookup draft.

        ``generate`` decodes every row until the batch's last one stops: in make train's rollouts 32-43% of the
        decoded row-steps were rows already finished, each reading its whole past. Here, once a quarter of the rows
        in the cache are finished, they are stored and removed from it (``Cache.reorder_cache``, one copy of the
        remaining rows). A removed row's last token has not been fed back, so the prefix cache keeps one token less
        of it than ``generate``'s path.

        Drafts (``draft_tokens``; prompt lookup, :class:`_PromptLookup`): a decoding step costs about the same for 1
        or a few tokens per row (it reads the weights and every row's past once), and a rollout copies much of what
        it writes from its prompt (queries from the question, quotes from the retrieved passages). After the first
        step each row is fed its last token and up to ``draft_tokens`` ids that followed the latest earlier
        occurrence of its last ids; it keeps the drafted ids that the model's argmax agrees with and the argmax after
        them, so the output is the greedy one (tested against ``draft_tokens=0`` and ``generate``). Rows keep
        different numbers of tokens, so each writes to its own cache slots (a rejected draft's slots are written
        over next step) and attends through a 4-D mask of its committed slots.
        """
        device = self.model.device
        width = batch.input_ids.shape[1]
        cache = batch.cache
        assert isinstance(cache, _OneDtypeStaticCache)
        capacity = cache.layers[0].max_cache_len
        attention = batch.attention.to(device)
        positions = (attention.cumsum(-1) - 1).masked_fill(attention == 0, 1)
        valid = torch.zeros((len(prompts), capacity), dtype=torch.bool, device=device)
        valid[:, :width] = attention.bool()  # each cache row's committed slots
        first_position = positions[:, -1] + 1  # the position of each row's first decoded token
        fed = torch.zeros(len(prompts), dtype=torch.long, device=device)  # decoded tokens in each cache row's slots
        in_cache = list(range(len(prompts)))  # the prompt row of each cache row
        lookups = [_PromptLookup(ids) for ids in prompts] if self.draft_tokens else None
        drafts: list[list[int]] = [[] for _ in prompts]  # by cache row: what this step feeds after the last token
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finished = [False] * len(prompts)
        completions: list[Completion | None] = [None] * len(prompts)
        window = stopper.window if stopper is not None else 0

        def release(rows: list[int]) -> None:  # cache rows -> completions, stored in the prefix cache
            for index in rows:
                row = in_cache[index]
                completion = self._finish_row(tokens[row], logprobs[row] if params.logprobs else None,
                                              len(prompts[row]), params,
                                              stopper.stopped_at.get(row) if stopper else None)
                completions[row] = completion
                self._store_row(prompts[row], completion, cache, index, batch, row, int(fed[index]))

        def ends(row: int) -> bool:
            generated = tokens[row]
            stopped = stopper.check(row, generated[-window:], len(generated)) if stopper is not None else False
            return generated[-1] in self.eos_token_ids or stopped or len(generated) >= params.max_new_tokens

        for step in itertools.count():
            if cancelled is not None and cancelled():
                raise GenerationCancelled(f"cancelled after {step} decoding steps")
            if step == 0:  # every row's suffix (one token after the row prefill) at the same slots
                logits = self.model(input_ids=batch.input_ids[:, batch.cached_width :].to(device),
                                    attention_mask=attention, position_ids=positions[:, batch.cached_width :],
                                    past_key_values=cache, use_cache=True, logits_to_keep=1,
                                    cache_position=torch.arange(batch.cached_width, width, device=device)).logits
            else:
                logits = self._verify_step(cache, tokens, drafts, in_cache, finished, valid, width + fed,
                                           first_position + fed)
            chosen = logits.float().argmax(-1)  # (rows, fed tokens): the argmax after each fed token
            chosen_logprobs = (torch.log_softmax(logits.float(), dim=-1).gather(-1, chosen[..., None])[..., 0].tolist()
                               if params.logprobs else None)
            picks = chosen.tolist()
            for index, row in enumerate(in_cache):
                if finished[row]:
                    continue
                draft, picked = drafts[index], picks[index]
                agreed = next((at for at, token in enumerate(draft) if token != picked[at]), len(draft))
                if step:
                    valid[index, int(width + fed[index]) : int(width + fed[index]) + agreed + 1] = True
                    fed[index] += agreed + 1
                    self._count(draft_tokens=len(draft), accepted_draft_tokens=agreed)
                kept = 0
                for at in range(agreed + 1):
                    tokens[row].append(picked[at])
                    kept += 1
                    if chosen_logprobs is not None:
                        logprobs[row].append(chosen_logprobs[index][at])
                    if ends(row):
                        finished[row] = True
                        break
                if lookups is not None and not finished[row]:
                    lookups[row].extend(tokens[row][-kept:])
            stale = [index for index, row in enumerate(in_cache) if finished[row]]
            if len(stale) == len(in_cache):
                break
            if len(stale) >= max(1, len(in_cache) // 4):
                release(stale)
                keep = [index for index, row in enumerate(in_cache) if not finished[row]]
                selection = torch.tensor(keep, device=device)
                cache.reorder_cache(selection)
                valid, fed, first_position = valid[selection], fed[selection], first_position[selection]
                in_cache = [in_cache[index] for index in keep]
            drafts = [lookups[row].draft(min(self.draft_tokens, params.max_new_tokens - len(tokens[row]) - 1))
                      if lookups is not None and not finished[row] else [] for row in in_cache]
        release(list(range(len(in_cache))))
        return [completion for completion in completions if completion is not None]

    def _verify_step(self, cache: _OneDtypeStaticCache, tokens: list[list[int]], drafts: list[list[int]],
                     in_cache: list[int], finished: list[bool], valid: torch.Tensor, slot: torch.Tensor,
                     position: torch.Tensor) -> torch.Tensor:
        """One forward pass that feeds each cache row its last token and its draft (a finished row: padding), the
        row's ``i``-th fed token at cache slot ``slot + i`` and position ``position + i``, attending over the row's
        ``valid`` slots and the fed tokens before it; the logits after every fed token, ``(rows, fed, vocab)``."""
        device = self.model.device
        fed = 1 + max(len(draft) for draft in drafts)
        step_ids = torch.full((len(in_cache), fed), self.pad_token_id, dtype=torch.long)
        for index, row in enumerate(in_cache):
            if not finished[row]:
                step_ids[index, : 1 + len(drafts[index])] = torch.tensor([tokens[row][-1], *drafts[index]])
        offsets = torch.arange(fed, device=device)
        slots = slot[:, None] + offsets  # (rows, fed)
        columns = torch.arange(valid.shape[1], device=device)
        block = (columns >= slots[:, :1, None]) & (columns <= slots[:, :, None])  # each fed token: itself and before
        mask = (valid[:, None, :] | block)[:, None]  # (rows, 1, fed, slots)
        cache.row_slots = slots
        try:
            with _grouped_query_attention(self.model):
                return self.model(input_ids=step_ids.to(device), attention_mask=mask,
                                  position_ids=position[:, None] + offsets, past_key_values=cache,
                                  cache_position=slots[0], use_cache=True, logits_to_keep=fed).logits
        finally:
            cache.row_slots = None

    def _finish_row(self, tokens: list[int], logprobs: list[float] | None, prompt_tokens: int,
                    params: SamplingParams, stopped_at: int | None) -> Completion:
        eos_at = next((i for i, token in enumerate(tokens) if token in self.eos_token_ids), None)
        body = tokens[:eos_at] if eos_at is not None else tokens
        if stopped_at is not None:
            body = body[:stopped_at]
        cut = self._cut_at_stop(body, params.stop) if params.stop else None
        if cut is not None:
            length, text, stop = cut
            kept, finish = body[:length], "stop"
        elif eos_at is not None and (stopped_at is None or eos_at < stopped_at):
            kept, text, stop, finish = tokens[: eos_at + 1], self._decode(body), None, "stop"
        elif stopped_at is not None:  # the criterion saw a stop the full decoding does not show (rare)
            kept, finish = body, "stop"
            text = self._decode(body)
            stop = next((item for item in params.stop if item in text), None)
        else:
            kept, text, stop, finish = tokens, self._decode(tokens), None, "length"
        return Completion(text=text, token_ids=kept, logprobs=None if logprobs is None else logprobs[: len(kept)],
                          finish_reason=finish, stop=stop, prompt_tokens=prompt_tokens)

    def _cut_at_stop(self, tokens: list[int], stops: tuple[str, ...]) -> tuple[int, str, str] | None:
        """Shortest token prefix whose decoding contains a stop string: (length, cut text, stop)."""
        if not tokens or not any(stop in self._decode(tokens) for stop in stops):
            return None
        low, high = 1, len(tokens)  # decoding grows with the prefix, so binary search the first hit
        while low < high:
            middle = (low + high) // 2
            if any(stop in self._decode(tokens[:middle]) for stop in stops):
                high = middle
            else:
                low = middle + 1
        text = self._decode(tokens[:low])
        index, stop = min((text.find(stop), stop) for stop in stops if stop in text)
        return low, text[: index + len(stop)], stop

    def _decode(self, tokens: list[int]) -> str:
        return self._tokenizer.decode(tokens, skip_special_tokens=True)

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        sample = not params.greedy
        options: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "do_sample": sample,
            "repetition_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "eos_token_id": sorted(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
            "return_dict_in_generate": True,
            # transformers compiles the forward on CUDA when the past is a StaticCache; every batch here has its own
            # cache length and width, so it recompiled on nearly every call (H200: 2.5 tokens/s in the smoke test)
            "disable_compile": True,
        }
        if sample:  # warpers exist only when sampling; set them all so model defaults cannot leak in
            options.update(temperature=params.temperature, top_p=params.top_p, top_k=0, typical_p=1.0)
            if getattr(self.model.generation_config, "min_p", None) is not None:
                options["min_p"] = 0.0
        return GenerationConfig(**options)


class _PromptLookup:
    """Draft ids for one row by prompt lookup (Saxena, "Prompt Lookup Decoding", 2023): the ids that followed the
    latest earlier occurrence of the row's last ``longest`` ids in its prompt and output, else of fewer, down to
    ``shortest``. Indexed as the row grows (a dict per n-gram size), so a lookup does not scan the prompt; written
    here because transformers' ``PromptLookupCandidateGenerator`` drafts for a batch of one row only."""

    def __init__(self, ids: Sequence[int], longest: int = 3, shortest: int = 2) -> None:
        self.ids = list(ids)
        self.latest: dict[int, dict[tuple[int, ...], int]] = {size: {} for size in range(longest, shortest - 1, -1)}
        for end in range(len(self.ids) - 1):  # the row's own last n-grams are indexed once an id follows them
            self._index(end)

    def _index(self, end: int) -> None:
        for size, table in self.latest.items():
            if end + 1 >= size:
                table[tuple(self.ids[end + 1 - size : end + 1])] = end

    def extend(self, ids: Sequence[int]) -> None:
        """Append the row's newly decoded ids."""
        for token in ids:
            self.ids.append(token)
            self._index(len(self.ids) - 2)

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` ids that may come next (empty: no earlier occurrence of the row's last ids)."""
        if limit <= 0:
            return []
        for size, table in self.latest.items():
            end = table.get(tuple(self.ids[-size:])) if len(self.ids) >= size else None
            if end is not None:
                return self.ids[end + 1 : end + 1 + limit]
        return []


def _packed_gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except for several query tokens over a masked past with grouped KV heads:
    there it repeats the KV heads (``repeat_kv``, a copy of the whole past in every layer: 70% of a decoding step
    of SmolLM2 that feeds 4 tokens per row over ~2k positions here), and it packs only a single query token
    (``pack_gqa``). Here the query heads that share a KV head become more query rows of it, each with its token's
    mask row."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or query.shape[2] == 1 or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or dropout):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    rows, heads, length, dim = query.shape
    packed = query.reshape(rows, heads // groups, groups * length, dim)  # query head h reads KV head h // groups
    output = torch.nn.functional.scaled_dot_product_attention(
        packed, key, value, attn_mask=attention_mask.repeat(1, 1, groups, 1), scale=scaling)
    return output.reshape(rows, heads, length, dim).transpose(1, 2).contiguous(), None


_PACKED_GQA_SDPA = "prorag_packed_gqa_sdpa"
AttentionInterface.register(_PACKED_GQA_SDPA, _packed_gqa_sdpa)


@contextlib.contextmanager
def _grouped_query_attention(model: PreTrainedModel) -> Iterator[None]:
    """Run ``model``'s SDPA attention as :func:`_packed_gqa_sdpa` inside the block (other implementations as they
    are)."""
    config = model.config
    if config._attn_implementation != "sdpa":
        yield
        return
    config._attn_implementation = _PACKED_GQA_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


@dataclasses.dataclass
class _Batch:
    """A laid-out ragged batch: ids and mask of width ``cached_width + suffix width``, the padded past."""

    input_ids: torch.Tensor
    attention: torch.Tensor
    cache: DynamicCache | StaticCache | None
    cached: list[int]
    cached_width: int
    lengths: list[int]

    def columns(self, row: int, generated: int) -> torch.Tensor:
        """Cache columns of a row's real tokens: cached prefix, new suffix, then ``generated`` decoded tokens."""
        width = self.input_ids.shape[1]
        suffix = self.lengths[row] - self.cached[row]
        return torch.cat([torch.arange(self.cached_width - self.cached[row], self.cached_width),
                          torch.arange(width - suffix, width + generated)])


def _padding_bounded_chunks(lengths: Sequence[int], size: int, padding: float, max_tokens: int | None = None, *,
                            past: Sequence[int] | None = None, max_positions: float | None = None) -> list[list[int]]:
    """Indices of ``lengths`` in batches of at most ``size``, longest first, each padded to its longest by at most
    ``padding`` times its real total, and at most ``max_tokens`` padded tokens unless it is one row (a batch of one
    row is never padded). ``past``: each row's cached length; a batch's past is then at most ``max_positions``
    positions (rows x (longest past + longest length), the rectangle :meth:`TransformersGenerator._layout` lays out)
    unless it is one row."""
    chunks: list[list[int]] = []
    total = widest_past = 0
    for index in sorted(range(len(lengths)), key=lambda item: -lengths[item]):
        chunk = chunks[-1] if chunks else None
        row_past = past[index] if past is not None else 0
        if (chunk is None or len(chunk) == size
                or (len(chunk) + 1) * lengths[chunk[0]] > (1 + padding) * (total + lengths[index])
                or (max_tokens is not None and (len(chunk) + 1) * lengths[chunk[0]] > max_tokens)
                or (max_positions is not None
                    and (len(chunk) + 1) * (max(widest_past, row_past) + lengths[chunk[0]]) > max_positions)):
            chunks.append([index])
            total, widest_past = lengths[index], row_past
        else:
            chunk.append(index)
            total += lengths[index]
            widest_past = max(widest_past, row_past)
    return chunks


def _shared_prefixes(prompts: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The maximal prefixes that two or more prompts share, each leaving every prompt at least its last token.

    Sorted, prompts with a common beginning are neighbours, so every maximal shared prefix is the longest
    common prefix of some adjacent pair (two identical prompts share all but their last token).
    """
    ordered = sorted(tuple(ids) for ids in prompts)
    found: set[tuple[int, ...]] = set()
    for first, second in itertools.pairwise(ordered):
        limit = min(len(first), len(second)) - 1
        if limit < 1 or first[0] != second[0]:
            continue
        differ = np.flatnonzero(np.asarray(first[:limit]) != np.asarray(second[:limit]))
        found.add(first[: int(differ[0]) if differ.size else limit])
    return sorted(found, key=len)


def _row_kv(cache: DynamicCache | StaticCache, row: int, columns: torch.Tensor) -> list[LayerKV]:
    """One row's KV states at ``columns`` of every layer (contiguous copies, on the cache's device)."""
    result: list[LayerKV] = []
    for layer in cache.layers:
        index = columns.to(layer.keys.device)
        result.append((layer.keys[row].index_select(1, index).contiguous(),
                       layer.values[row].index_select(1, index).contiguous()))
    return result


def _kv_bytes_per_position(model: PreTrainedModel) -> int:
    """Bytes of keys and values one sequence position takes over every layer (0 when the config does not say)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if not (layers and kv_heads and head_dim):
        return 0
    return 2 * layers * kv_heads * head_dim * next(model.parameters()).element_size()


def _weights_fingerprint(model: PreTrainedModel) -> int:
    """Changes whenever a parameter is modified in place (optimizer step, loaded weights) or replaced."""
    return hash(tuple((parameter.data_ptr(), parameter._version) for parameter in model.parameters()))


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(item) for item in source)
    return ids


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Fork the torch RNG and seed it when a seed is given (the caller's RNG state is restored after)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
