"""The rollout record: one question's prompt, completion, token segments, parse and accounting.

A completion is a list of :class:`Segment` s in order: text the policy generated (``kind="generated"``) and
text the engine inserted — retrieved context with its wrapping tags (``"context"``) and protocol tags such as
Algorithm 1's ``<think><step><reasoning>`` prefix, ``</step>`` or the forced ``<answer>`` (``"tag"``). Each
segment keeps the exact token ids the policy saw, so an RL trainer rebuilds the sequence and its environment
mask (generated → 1, inserted → 0) with :func:`completion_ids_and_mask`.

Stop reasons (:data:`STOP_REASONS`, a closed set):

* ``"answer"`` — the model wrote ``</answer>`` itself.
* ``"forced_answer"`` — the step budget ``B`` was used up and the forced answer (Algorithm 1 lines 20–22) was
  generated through ``</answer>``.
* ``"eos"`` — the model ended its sequence (end-of-sequence token) before ``</answer>``; nothing is generated
  after an EOS.
* ``"no_boundary"`` — the trajectory's generated-token budget ran out while the model was writing without
  reaching a boundary: its last generation ended by length (a model that never emits a tag, a step or a
  forced answer that never closes).
* ``"token_budget"`` — the token budget ran out exactly at a boundary (the last generation ended with
  ``</search>`` / ``</conclusion>``, or the forced answer could not start): nothing was left to generate
  the next part. Nothing is inserted after that boundary.
* ``"malformed"`` — the model closed an action where its protocol allows none (the adapter's boundary is
  ``"malformed"``: a ReasonRAG query inside the evidence span, a HiPRAG ``</search>`` with no ``<search>`` since
  the last context). Nothing is retrieved or inserted; the completion fails the format check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal, get_args

from prorag.protocol.base import StepDict

StopReason = Literal["answer", "forced_answer", "eos", "no_boundary", "token_budget", "malformed"]
STOP_REASONS: Final[tuple[str, ...]] = get_args(StopReason)

SegmentKind = Literal["generated", "context", "tag"]
SEGMENT_KINDS: Final[tuple[str, ...]] = get_args(SegmentKind)



@dataclass(frozen=True)
class Segment:
    """A piece of the completion with the token ids the policy saw.

    ``logprobs`` (generated segments, when the engine asked for them) are the sampler's log-probabilities of
    ``token_ids``. ``text`` of a generated segment is the backend's text: it ends with the stop string even
    when the last token carries characters after it (those are in ``token_ids`` only, as with vLLM).
    """

    text: str
    token_ids: list[int]
    kind: SegmentKind
    logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if self.kind not in SEGMENT_KINDS:
            raise ValueError(f"segment kind must be one of {SEGMENT_KINDS}, got {self.kind!r}")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.token_ids)} token ids")

    @property
    def generated(self) -> bool:
        """True for text the policy generated (mask 1)."""
        return self.kind == "generated"

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": list(self.token_ids), "kind": self.kind,
                "logprobs": None if self.logprobs is None else list(self.logprobs)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Segment:
        logprobs = raw.get("logprobs")
        return cls(text=str(raw["text"]), token_ids=[int(token) for token in raw["token_ids"]],
                   kind=raw["kind"], logprobs=None if logprobs is None else [float(x) for x in logprobs])


def completion_ids_and_mask(segments: Iterable[Segment]) -> tuple[list[int], list[int]]:
    """Completion token ids and the environment mask (1 for generated tokens, 0 for inserted ones)."""
    ids: list[int] = []
    mask: list[int] = []
    for segment in segments:
        ids.extend(segment.token_ids)
        mask.extend([1 if segment.generated else 0] * len(segment.token_ids))
    return ids, mask


@dataclass
class Rollout:
    """One trajectory of one method on one question (engine, or a baseline).

    ``completion`` is everything after ``prompt``: the concatenated segment texts. ``steps`` are the parsed
    steps (:data:`StepDict`), None when the format check fails; ``format_ok``/``n_steps`` are the protocol's
    ``(F, N)``. ``answer`` is the lenient extraction (last complete ``<answer>…</answer>``). Token counts:
    ``generated_tokens`` + ``context_tokens`` + ``tag_tokens`` = completion length, where ``context_tokens``
    counts every token of each inserted retrieval segment (``<context>…</context>`` with the newlines and
    opening tag the protocol inserts around it); for ``standard_rag`` it counts the documents placed in the
    prompt instead. ``turns`` counts the generate calls the trajectory took part in.
    """

    question_key: str
    question_id: str
    dataset: str
    question: str
    golden_answers: tuple[str, ...]
    method: str
    protocol: str
    prompt: str
    prompt_token_ids: list[int]
    completion: str
    segments: list[Segment]
    steps: list[StepDict] | None
    format_ok: bool
    n_steps: int
    answer: str | None
    stop_reason: StopReason
    retrieval_count: int
    queries: list[str]
    retrieved_ids: list[list[str]]
    generated_tokens: int
    context_tokens: int
    tag_tokens: int
    turns: int
    sample_index: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be one of {STOP_REASONS}, got {self.stop_reason!r}")

    @property
    def completion_token_ids(self) -> list[int]:
        """Token ids of the completion (all segments)."""
        return completion_ids_and_mask(self.segments)[0]

    @property
    def env_mask(self) -> list[int]:
        """1 for generated completion tokens, 0 for inserted ones."""
        return completion_ids_and_mask(self.segments)[1]

    @property
    def inserted_spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` character ranges of ``completion`` the engine inserted (context and tag segments):
        what a trainer that re-tokenizes the text must not train on."""
        spans: list[tuple[int, int]] = []
        start = 0
        for segment in self.segments:
            end = start + len(segment.text)
            if segment.kind != "generated" and end > start:
                if spans and spans[-1][1] == start:
                    spans[-1] = (spans[-1][0], end)
                else:
                    spans.append((start, end))
            start = end
        return spans

    @property
    def token_ids(self) -> list[int]:
        """Prompt and completion ids: the whole sequence the policy saw."""
        return [*self.prompt_token_ids, *self.completion_token_ids]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (lists and plain values only)."""
        record = {item.name: getattr(self, item.name) for item in fields(self)}
        record["golden_answers"] = list(self.golden_answers)
        record["prompt_token_ids"] = list(self.prompt_token_ids)
        record["segments"] = [segment.to_dict() for segment in self.segments]
        record["steps"] = None if self.steps is None else [dict(step) for step in self.steps]
        record["queries"] = list(self.queries)
        record["retrieved_ids"] = [list(ids) for ids in self.retrieved_ids]
        record["metadata"] = dict(self.metadata)
        return record

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Rollout:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming a missing field."""
        required = [item.name for item in fields(cls) if item.name not in ("sample_index", "metadata")]
        missing = [name for name in required if name not in raw]
        if missing:
            raise ValueError(f"rollout record lacks field(s) {missing}")
        values = {item.name: raw[item.name] for item in fields(cls) if item.name in raw}
        values["golden_answers"] = tuple(raw["golden_answers"])
        values["prompt_token_ids"] = [int(token) for token in raw["prompt_token_ids"]]
        values["segments"] = [Segment.from_dict(segment) for segment in raw["segments"]]
        values["steps"] = None if raw["steps"] is None else [dict(step) for step in raw["steps"]]
        values["queries"] = list(raw["queries"])
        values["retrieved_ids"] = [list(ids) for ids in raw["retrieved_ids"]]
        values["metadata"] = dict(raw.get("metadata") or {})
        return cls(**values)


def stop_reason_counts(rollouts: Sequence[Rollout]) -> dict[str, int]:
    """How many rollouts ended for each stop reason (every reason listed, zeros included)."""
    counts = dict.fromkeys(STOP_REASONS, 0)
    for rollout in rollouts:
        counts[rollout.stop_reason] += 1
    return counts
