"""On-the-fly detection of over-search and under-search steps (HiPRAG §3.2).

* **Over-search**: for each search step ``(r, q, c, o)``, the policy is asked the query ``q`` giving ``o′``; the
  over-search judge decides whether ``o`` and ``o′`` are equivalent (Figure 5). Equivalent ⇒ over-search.
  ``reask="paper"`` (default): "we take its search query q_i and directly prompt the policy model with it as a
  standalone question" — the user message is the query alone, sampled as the policy samples in training
  (temperature 1, top-p 1, §4; seeded). ``reask="instructed"`` (prorag's earlier behaviour, the embedded CPU
  default): :data:`REASK_INSTRUCTION` before the query, greedy decoding. All search steps of *all* rollouts of
  the batch are re-asked in one batched generation (identical queries once), then judged in one batched call.
* **Under-search**: the verifier judges each non-search step ``(r, o)`` (Figure 6: "a single, isolated reasoning
  step ... based only on the information within this single step"); incorrect ⇒ under-search. One batched call.
  ``under_search_input="step"`` (default, the paper) sends the step alone; ``"step_and_question"`` (prorag's
  earlier behaviour) also sends the question the agent was answering (:func:`prorag.judges.prompts.step_messages`).
  Each non-search step also carries the contexts retrieved by the earlier search steps of its trajectory
  (``contexts=``): the paper's verifier ignores them, a grounding judge
  (:class:`~prorag.judges.reference.ReferenceJudge`) uses them.

The two phases run concurrently (two threads), as the paper suggests. A rollout that failed the format check
has no parsable steps: it is skipped (no step verdicts; it gets no process bonus anyway) and counted. A judge
failure, an unparsable judge reply, a failed re-ask generation or a step without a conclusion (Search-R1
steps have none) is an *unknown* verdict (``None``), never an optimal one; unknowns are counted and logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from tqdm.auto import tqdm

from prorag.judges.base import Judge, Verdict, judge_kind
from prorag.llm.generation import GenerationError, Generator, SamplingParams, generate_chat, policy_label

logger = logging.getLogger(__name__)

DetectionMode = Literal["both", "over_only", "under_only"]
DETECTION_MODES: Final[tuple[str, ...]] = get_args(DetectionMode)
StepKind = Literal["search", "non_search"]

ReaskStyle = Literal["paper", "instructed"]
UnderSearchInput = Literal["step", "step_and_question"]

MIN_CHUNK: Final = 16
"""The smallest chunk of items a judge is called with while a progress bar is shown."""
REASK_INSTRUCTION: Final = "Answer the following question concisely, in one short sentence."
"""The instruction put before a re-asked query by ``reask="instructed"`` (the paper gives none)."""
PAPER_REASK_SAMPLING: Final = {"temperature": 1.0, "top_p": 1.0, "seed": 0}
"""``reask="paper"``: the policy's own training sampling (HiPRAG §4: temperature and top-p 1), seeded."""

_DOC_START = re.compile(r"\n(?=Doc \d+\s*\(Title:)")


def reask_messages(query: str, style: ReaskStyle = "paper") -> list[dict[str, str]]:
    """The chat for re-asking a search query as a standalone question: the query alone (``paper``) or after
    :data:`REASK_INSTRUCTION` (``instructed``)."""
    if style == "paper":
        return [{"role": "user", "content": query.strip()}]
    if style == "instructed":
        return [{"role": "user", "content": f"{REASK_INSTRUCTION}\n\nQuestion: {query.strip()}"}]
    raise ValueError(f"unknown re-ask style {style!r} (use 'paper' or 'instructed')")


def reask_sampling(style: ReaskStyle, max_new_tokens: int) -> SamplingParams:
    """How a re-ask is decoded: the policy's training sampling (``paper``) or greedy (``instructed``)."""
    if style == "paper":
        return SamplingParams(max_new_tokens=max_new_tokens, **PAPER_REASK_SAMPLING)  # type: ignore[arg-type]
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)


@dataclass(frozen=True)
class StepVerdict:
    """The detection outcome of one step.

    ``checked`` is False when the mode skipped the step's kind (non-search steps under ``"over_only"``, search
    steps under ``"under_only"``). For a checked search step ``over`` is True (over-search), False, or None
    (unknown); for a checked non-search step ``under`` likewise. The other field is always None.
    ``reask_answer`` is ``o′`` (search steps), ``judge_raw`` the judge's raw reply, ``judge_error`` why the
    verdict is unknown.
    """

    rollout_index: int
    step_index: int
    kind: StepKind
    checked: bool
    over: bool | None = None
    under: bool | None = None
    reask_answer: str | None = None
    judge_raw: str = ""
    judge_error: str | None = None

    @property
    def flagged(self) -> bool | None:
        """Over-search (search step) or under-search (non-search step); None if unknown or not checked."""
        return self.over if self.kind == "search" else self.under

    @property
    def unknown(self) -> bool:
        """A checked step whose verdict is unknown."""
        return self.checked and self.flagged is None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class StepVerdicts:
    """The step verdicts of one rollout, in step order; ``skipped`` when it had no parsable steps."""

    rollout_index: int
    steps: tuple[StepVerdict, ...]
    skipped: bool = False

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {"rollout_index": self.rollout_index, "skipped": self.skipped,
                "steps": [step.to_dict() for step in self.steps]}


@dataclass
class _SearchJob:
    rollout_index: int
    step_index: int
    query: str | None
    conclusion: str | None


@dataclass
class _NonSearchJob:
    rollout_index: int
    step_index: int
    question: str
    reasoning: str
    conclusion: str | None
    contexts: list[str]


def split_context(context: str) -> list[str]:
    """The passages of a step's context (``Doc i(Title: …) …`` lines of
    :func:`~prorag.protocol.hiprag.format_documents`); the whole text if it has no such layout."""
    parts = [part.strip() for part in _DOC_START.split(context)]
    return [part for part in parts if part]


def detect(rollouts: Sequence[Any], policy: Generator, over_judge: Judge, under_judge: Judge, *,
           reask_max_new_tokens: int = 64, mode: DetectionMode = "both", reask: ReaskStyle = "paper",
           under_search_input: UnderSearchInput = "step", progress: bool = False) -> list[StepVerdicts]:
    """Detect over-/under-search in every step of ``rollouts`` (see the module docstring).

    ``progress`` shows a bar of judged steps (rate and ETA) named by the rollouts' methods, the re-asked policy
    and the judges' kinds; the judges are then called in chunks (a verdict does not depend on its chunk).

    ``rollouts`` are :class:`~prorag.agent.trajectory.Rollout` records (or anything with ``question``,
    ``format_ok`` and ``steps`` — step dicts with ``kind``, ``reasoning``, ``query``, ``context``,
    ``conclusion``). Returns one :class:`StepVerdicts` per rollout, in order.
    """
    if mode not in DETECTION_MODES:
        raise ValueError(f"mode must be one of {DETECTION_MODES}, got {mode!r}")
    if reask_max_new_tokens < 1:
        raise ValueError(f"reask_max_new_tokens must be >= 1, got {reask_max_new_tokens}")
    if reask not in ("paper", "instructed"):
        raise ValueError(f"unknown re-ask style {reask!r} (use 'paper' or 'instructed')")
    if under_search_input not in ("step", "step_and_question"):
        raise ValueError(f"unknown under_search_input {under_search_input!r} (use 'step' or 'step_and_question')")
    search_jobs: list[_SearchJob] = []
    non_search_jobs: list[_NonSearchJob] = []
    layout: list[list[tuple[int, StepKind]] | None] = []
    for rollout_index, rollout in enumerate(rollouts):
        steps = getattr(rollout, "steps", None)
        if not getattr(rollout, "format_ok", False) or not steps:
            layout.append(None)
            continue
        kinds: list[tuple[int, StepKind]] = []
        earlier: list[str] = []
        for step_index, step in enumerate(steps):
            kind = step.get("kind")
            if kind == "search":
                if mode != "under_only":
                    search_jobs.append(_SearchJob(rollout_index, step_index, step.get("query"),
                                                  step.get("conclusion")))
                if step.get("context"):
                    earlier.extend(split_context(str(step["context"])))
            elif kind == "non_search":
                if mode != "over_only":
                    question = str(rollout.question) if under_search_input == "step_and_question" else ""
                    non_search_jobs.append(_NonSearchJob(rollout_index, step_index, question,
                                                         str(step.get("reasoning") or ""), step.get("conclusion"),
                                                         list(earlier)))
            else:
                raise ValueError(f"rollout {rollout_index} step {step_index}: unknown step kind {kind!r}")
            kinds.append((step_index, kind))
        layout.append(kinds)

    methods = sorted({str(getattr(rollout, "method", "")) for rollout in rollouts} - {""})
    judges = sorted({judge_kind(over_judge), judge_kind(under_judge)})
    bar = tqdm(total=len(search_jobs) + len(non_search_jobs), unit="step",
               disable=not progress or not (search_jobs or non_search_jobs),
               desc=f"judging {','.join(methods) or 'rollouts'} [{policy_label(policy)}; {'/'.join(judges)} judge]")
    phases: list[Callable[[], dict[tuple[int, int], StepVerdict]]] = []
    if search_jobs:
        phases.append(lambda: _over_phase(search_jobs, policy, over_judge, reask_max_new_tokens, reask, bar))
    if non_search_jobs:
        phases.append(lambda: _under_phase(non_search_jobs, under_judge, bar))
    judged: dict[tuple[int, int], StepVerdict] = {}
    with bar:
        if len(phases) == 2:  # the two detections run concurrently (§3.2)
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="prorag-detect") as pool:
                for future in [pool.submit(phase) for phase in phases]:
                    judged.update(future.result())
        elif phases:
            judged.update(phases[0]())

    results = []
    for rollout_index, kinds in enumerate(layout):
        if kinds is None:
            results.append(StepVerdicts(rollout_index, (), skipped=True))
            continue
        steps_out = tuple(judged.get((rollout_index, step_index))
                          or StepVerdict(rollout_index, step_index, kind, checked=False)
                          for step_index, kind in kinds)
        results.append(StepVerdicts(rollout_index, steps_out))
    summary = detection_summary(results)
    logger.info("search detection (%s): %s", mode, summary)
    if summary["unknown"]:
        logger.warning("search detection: %d of %d checked steps have unknown verdicts", summary["unknown"],
                       summary["checked"])
    return results


def _over_phase(jobs: list[_SearchJob], policy: Generator, judge: Judge,
                max_new_tokens: int, style: ReaskStyle, bar: tqdm) -> dict[tuple[int, int], StepVerdict]:
    out: dict[tuple[int, int], StepVerdict] = {}
    queries = list(dict.fromkeys(job.query for job in jobs if job.query is not None and job.conclusion is not None))
    answers: dict[str, str] = {}
    generation_error: str | None = None
    if queries:
        try:
            completions = generate_chat(policy, [reask_messages(query, style) for query in queries],
                                        reask_sampling(style, max_new_tokens))
        except GenerationError as error:
            generation_error = f"re-ask generation failed: {error}"
            logger.warning("over-search detection: %s", generation_error)
        else:
            if len(completions) != len(queries):
                raise RuntimeError(f"policy returned {len(completions)} results for {len(queries)} prompts")
            answers = {query: samples[0].text.strip() for query, samples in zip(queries, completions, strict=True)}
    judged_jobs = [job for job in jobs if job.query in answers and job.conclusion is not None]
    bar.update(len(jobs) - len(judged_jobs))  # nothing to judge for these
    verdicts = _call(judge.equivalent, [(str(job.conclusion), answers[str(job.query)]) for job in judged_jobs], bar)
    for job, verdict in zip(judged_jobs, verdicts, strict=True):
        out[(job.rollout_index, job.step_index)] = StepVerdict(
            job.rollout_index, job.step_index, "search", checked=True, over=verdict.value,
            reask_answer=answers[str(job.query)], judge_raw=verdict.raw, judge_error=verdict.error)
    for job in jobs:
        if (job.rollout_index, job.step_index) not in out:
            error = ("the step has no conclusion or query to compare" if job.conclusion is None or job.query is None
                     else generation_error)
            out[(job.rollout_index, job.step_index)] = StepVerdict(job.rollout_index, job.step_index, "search",
                                                                  checked=True, judge_error=error)
    return out


def _under_phase(jobs: list[_NonSearchJob], judge: Judge, bar: tqdm) -> dict[tuple[int, int], StepVerdict]:
    out: dict[tuple[int, int], StepVerdict] = {}
    judged_jobs = [job for job in jobs if job.conclusion is not None]
    bar.update(len(jobs) - len(judged_jobs))
    contexts = [job.contexts for job in judged_jobs]
    verdicts = _call(lambda items, start: judge.verify_steps(items, contexts=contexts[start:start + len(items)]),
                     [(job.question, job.reasoning, str(job.conclusion)) for job in judged_jobs], bar,
                     with_start=True)
    for job, verdict in zip(judged_jobs, verdicts, strict=True):
        under = None if verdict.value is None else not verdict.value
        out[(job.rollout_index, job.step_index)] = StepVerdict(
            job.rollout_index, job.step_index, "non_search", checked=True, under=under, judge_raw=verdict.raw,
            judge_error=verdict.error)
    for job in jobs:
        if job.conclusion is None:
            out[(job.rollout_index, job.step_index)] = StepVerdict(
                job.rollout_index, job.step_index, "non_search", checked=True,
                judge_error="the step has no conclusion to verify")
    return out


def _call(method: Callable[..., list[Verdict]], items: list[Any], bar: tqdm, *,
          with_start: bool = False) -> list[Verdict]:
    """``method`` over ``items``: in one call without a visible bar, else in about 20 chunks (of at least
    ``MIN_CHUNK``) so the bar moves; ``with_start`` passes each chunk's offset too."""
    if not items:
        return []
    size = len(items) if bar.disable else max(MIN_CHUNK, -(-len(items) // 20))
    verdicts: list[Verdict] = []
    for start in range(0, len(items), size):
        chunk = items[start:start + size]
        got = method(chunk, start) if with_start else method(chunk)
        if len(got) != len(chunk):
            raise RuntimeError(f"judge returned {len(got)} verdicts for {len(chunk)} items")
        verdicts.extend(got)
        bar.update(len(chunk))
    return verdicts


def detection_summary(results: Sequence[StepVerdicts]) -> dict[str, int]:
    """Counts over a batch: rollouts, skipped rollouts, steps, checked steps, search / non-search steps,
    over-search, under-search and unknown verdicts."""
    steps = [step for result in results for step in result.steps]
    return {
        "rollouts": len(results),
        "skipped_rollouts": sum(result.skipped for result in results),
        "steps": len(steps),
        "checked": sum(step.checked for step in steps),
        "search_steps": sum(step.kind == "search" for step in steps),
        "non_search_steps": sum(step.kind == "non_search" for step in steps),
        "over_search": sum(step.over is True for step in steps),
        "under_search": sum(step.under is True for step in steps),
        "unknown": sum(step.unknown for step in steps),
        "unknown_over": sum(step.unknown and step.kind == "search" for step in steps),
        "unknown_under": sum(step.unknown and step.kind == "non_search" for step in steps),
    }
