"""Finished rollouts as MLflow traces, and reward-judging verdicts as feedback on them. Kedro-free.

A trace is one rollout record (``Rollout.to_dict``): a root ``AGENT`` span with the question and the answer, and
in the order of the completion one ``LLM`` span per generated segment (a turn) and one ``RETRIEVER`` span per
search (its query and the passage ids it returned). Single-shot baselines retrieve before the prompt: their
searches come first. A rollout of the engine records its turns' clock (``turn_clock_ns``): each span is then the
measured batched generate or search call it took part in. Otherwise (baselines, older records) the spans share
out the window given (its runner's or node's wall time) in proportion to their token counts; rollouts loaded from
an earlier run without a clock get the logging time, with no duration. Attribute ``prorag.timing`` says which.

Verdicts of ``reward_judging`` (``step_verdicts`` records) become MLflow *feedback* assessments on the trace:
``over_search`` on the search step's retrieval span, ``under_search`` on the trace for a non-search step (value
True/False, an error when the judge could not decide), and the trajectory's ``reward``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import mlflow
from mlflow.entities import AssessmentError, AssessmentSource, SpanType
from mlflow.tracing.constant import TraceMetadataKey

from prorag.redaction import redact_text, redact_value

JUDGE_SOURCE: Final = "prorag.reward_judging"
TIMING_NOTE: Final = "apportioned by token counts within its runner's or node's wall time; turns are not clocked"
MEASURED_TIMING_NOTE: Final = ("measured: each span is the batched generate or search call of its turn, shared by "
                               "the rollouts batched with it")
TURN_CLOCK_METADATA_KEY: Final = "turn_clock_ns"
"""Where a rollout record keeps its measured turns (``prorag.agent.engine.TURN_CLOCK_METADATA_KEY``)."""
_RECORDED_TIMING_NOTE: Final = "not known: rollouts loaded from an earlier run"


@dataclass
class TraceRef:
    """A logged rollout trace: its id and the span ids of its searches in order."""

    trace_id: str
    search_span_ids: list[str] = field(default_factory=list)


def rollout_key(record: Mapping[str, Any]) -> tuple[str, str, int]:
    """``(method, question_key, sample_index)``: a rollout's identity in a run."""
    return str(record["method"]), str(record["question_key"]), int(record.get("sample_index") or 0)


def sample_rollouts(records: Iterable[Mapping[str, Any]], per_method: int) -> list[Mapping[str, Any]]:
    """Up to ``per_method`` rollouts of each method: first samples before second ones, and among them the
    questions ordered by a hash of their key, so that every method (base, SFT, RL) shows the same questions."""
    by_method: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        by_method[str(record["method"])].append(record)
    chosen: list[Mapping[str, Any]] = []
    for method in sorted(by_method):
        ordered = sorted(by_method[method], key=lambda record: (
            int(record.get("sample_index") or 0), hashlib.sha1(str(record["question_key"]).encode()).hexdigest()))
        chosen.extend(ordered[:per_method])
    return chosen


def _span_plan(record: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The spans of a rollout in order: ``("generate", segment)`` or ``("search", {query, ids, context})``."""
    segments: list[Mapping[str, Any]] = list(record.get("segments") or [])
    queries: list[str] = list(record.get("queries") or [])
    retrieved: list[list[str]] = list(record.get("retrieved_ids") or [])
    contexts = sum(1 for segment in segments if segment.get("kind") == "context")
    searches = iter(range(len(queries)))
    plan: list[tuple[str, dict[str, Any]]] = []

    def search(context: str, tokens: int) -> None:
        index = next(searches, None)
        if index is not None:
            plan.append(("search", {"query": queries[index], "ids": list(retrieved[index]) if index < len(retrieved)
                                    else [], "context": context, "tokens": tokens}))

    for _ in range(max(0, len(queries) - contexts)):  # retrieval before the prompt (standard RAG)
        search("", 0)
    inserted = ""
    for segment in segments:
        kind, text = segment.get("kind"), str(segment.get("text", ""))
        if kind == "generated":
            plan.append(("generate", {"text": text, "inserted": inserted, "tokens": len(segment.get("token_ids")
                                                                                      or [])}))
            inserted = ""
        elif kind == "context":
            search(text, len(segment.get("token_ids") or []))
        else:
            inserted += text
    return plan


def _measured(record: Mapping[str, Any], plan: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, int]] | None:
    """Each planned span's measured ``(start, end)`` from the record's turn clock, or None when it has none that
    matches the plan span for span."""
    clock = (record.get("metadata") or {}).get(TURN_CLOCK_METADATA_KEY)
    if not isinstance(clock, list) or not plan or len(clock) != len(plan):
        return None
    times = []
    for entry, (kind, _) in zip(clock, plan, strict=True):
        if not (isinstance(entry, list | tuple) and len(entry) == 3 and entry[0] == kind):
            return None
        times.append((int(entry[1]), int(entry[2])))
    return times


def log_rollout_trace(record: Mapping[str, Any], *, experiment_id: str, run_id: str, start_ns: int, end_ns: int,
                      tags: Mapping[str, str] | None = None, measured: bool = True) -> TraceRef:
    """Log one finished rollout as a trace of run ``run_id`` (see the module docstring): at its measured turns'
    times when it has them, else between ``start_ns`` and ``end_ns`` (``measured`` False: the window is not the
    rollout's, no note of apportioned timing)."""
    record = redact_value(dict(record))  # what a trace shows passes the one redaction
    method, question_key, sample_index = rollout_key(record)
    plan = _span_plan(record)
    times = _measured(record, plan)
    if times is not None:
        start_ns, end_ns = min(start for start, _ in times), max(end for _, end in times)
    timing = MEASURED_TIMING_NOTE if times is not None else TIMING_NOTE if measured else _RECORDED_TIMING_NOTE
    root = mlflow.start_span_no_context(
        method, span_type=SpanType.AGENT, experiment_id=experiment_id, start_time_ns=start_ns,
        inputs={"question": record.get("question"), "question_key": question_key,
                "dataset": record.get("dataset"), "prompt": record.get("prompt")},
        attributes={
            "prorag.method": method, "prorag.protocol": record.get("protocol"), "prorag.sample_index": sample_index,
            "prorag.format_ok": record.get("format_ok"), "prorag.n_steps": record.get("n_steps"),
            "prorag.stop_reason": record.get("stop_reason"), "prorag.turns": record.get("turns"),
            "prorag.retrieval_count": record.get("retrieval_count"),
            "prorag.generated_tokens": record.get("generated_tokens"),
            "prorag.context_tokens": record.get("context_tokens"),
            "prorag.timing": timing},
        tags={"prorag.method": method, "prorag.question_key": question_key,
              "prorag.dataset": str(record.get("dataset")), **(tags or {})},
        metadata={TraceMetadataKey.SOURCE_RUN: run_id})
    ref = TraceRef(root.trace_id)
    weights = [max(1, int(item["tokens"])) for _, item in plan]
    total = sum(weights) or 1
    clock, elapsed = start_ns, 0
    turn = 0
    for position, ((kind, item), weight) in enumerate(zip(plan, weights, strict=True)):
        elapsed += weight
        stop = start_ns + (end_ns - start_ns) * elapsed // total
        if times is not None:
            clock, stop = times[position]
        if kind == "generate":
            turn += 1
            span = mlflow.start_span_no_context(
                f"generate {turn}", span_type=SpanType.LLM, parent_span=root, start_time_ns=clock,
                inputs={"inserted_before": item["inserted"]} if item["inserted"] else None,
                attributes={"prorag.turn": turn, "prorag.generated_tokens": item["tokens"]})
            span.end(outputs=item["text"], end_time_ns=stop)
        else:
            span = mlflow.start_span_no_context(
                f"search {len(ref.search_span_ids) + 1}", span_type=SpanType.RETRIEVER, parent_span=root,
                start_time_ns=clock, inputs={"query": item["query"]},
                attributes={"prorag.passage_ids": item["ids"], "prorag.context_tokens": item["tokens"]})
            span.end(outputs={"passage_ids": item["ids"], "context": item["context"]}, end_time_ns=stop)
            ref.search_span_ids.append(span.span_id)
        clock = stop
    root.end(outputs={"answer": record.get("answer"), "golden_answers": list(record.get("golden_answers") or []),
                      "stop_reason": record.get("stop_reason")}, end_time_ns=end_ns)
    return ref


def log_verdicts(ref: TraceRef, verdict: Mapping[str, Any], steps: Sequence[Mapping[str, Any]] | None,
                 reward: float | None = None, *, judge_kind: str | None = None, flush: bool = True) -> int:
    """Log a rollout's step verdicts (a ``step_verdicts`` record) and its ``reward`` as feedback on its trace;
    ``steps`` are the rollout's parsed steps (to find each search step's span). Returns how many were logged.

    Feedback needs the trace stored, and traces are exported in the background: ``flush`` waits for the export
    first. Each wait takes about a second (MLflow stops and restarts its export thread), so a caller logging many
    rollouts' verdicts flushes once itself and passes ``flush=False``."""
    if flush:
        mlflow.flush_trace_async_logging()
    # An LLM judge's verdict is LLM_JUDGE; the deterministic reference judge's is CODE (issue 34: it was mislabelled).
    kind = str(verdict.get("judge_kind") or judge_kind or "reference")
    source = AssessmentSource(source_type="LLM_JUDGE" if kind == "llm" else "CODE", source_id=f"{JUDGE_SOURCE}:{kind}")
    search_number = {index: sum(1 for step in (steps or [])[:index] if step.get("kind") == "search")
                     for index in range(len(steps or []))}
    logged = 0
    for step in verdict.get("steps") or []:
        if not step.get("checked"):
            continue
        index, kind = int(step["step_index"]), str(step.get("kind"))
        value = step.get("over") if kind == "search" else step.get("under")
        position = search_number.get(index, -1)
        span_id = ref.search_span_ids[position] if kind == "search" and 0 <= position < len(ref.search_span_ids) \
            else None
        rationale = redact_text(step["judge_raw"]) if step.get("judge_raw") else None
        if kind == "search" and step.get("reask_answer"):
            rationale = f"re-asked answer: {step['reask_answer']}" + (f"\njudge: {rationale}" if rationale else "")
        mlflow.log_feedback(
            trace_id=ref.trace_id, name="over_search" if kind == "search" else "under_search",
            value=None if value is None else bool(value), source=source, rationale=rationale, span_id=span_id,
            error=None if value is not None else AssessmentError(
                error_code="UNKNOWN_VERDICT", error_message=str(step.get("judge_error") or "the judge did not decide")),
            metadata={"step_index": str(index), "kind": kind})
        logged += 1
    if reward is not None:
        mlflow.log_feedback(trace_id=ref.trace_id, name="reward", value=float(reward), source=AssessmentSource(
            source_type="CODE", source_id=JUDGE_SOURCE))
        logged += 1
    return logged
