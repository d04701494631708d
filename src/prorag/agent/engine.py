"""Batched multi-turn rollout engine: HiPRAG Algorithm 1 (or Search-R1, or the multi-stage-reward paper's
protocol) over a generator and a retriever.

Every turn, all active trajectories of the batch advance together:

1. one ``generator.generate`` call over all of them, with token-id prompts: the engine keeps each trajectory's
   exact ids — prompt ids, then generated ids as returned, then the ids of each inserted text tokenized on
   its own (``add_special_tokens=False``) — so the recorded ids are exactly those the policy saw;
2. the boundary of each completion decides what happens next (Algorithm 1): ``</answer>`` ends the
   trajectory; ``</search>`` queues a search; HiPRAG's ``</conclusion>`` closes the step (``</step>``) and
   counts it; a completion that ended by length without a boundary simply continues in the next turn (the
   per-turn limit only chunks "GENERATE until boundary"; a stop string split across two calls is found at
   the junction); an end-of-sequence token ends the trajectory;
3. every queued search of the batch goes to ONE ``retriever.search(queries, top_k)`` call, and the escaped
   top-k documents are inserted with the protocol's helper (HiPRAG: ``<context>…</context><conclusion>``;
   Search-R1 and multistage: ``<information>…</information>``).

Budgets: the step budget ``B`` counts HiPRAG steps (conclusions), or searches for Search-R1 and multistage.
When it is used up the engine appends the forced answer of Algorithm 1 lines 20–22 (HiPRAG: ``</think>`` only
if the completion has none, then ``<answer>``; the search protocols: ``<answer>`` in place of the search beyond
the budget) and generation continues until ``</answer>`` (other boundaries are then plain text).
``max_total_new_tokens`` bounds the *generated* tokens of a trajectory (inserted tokens are not counted);
``max_new_tokens_per_turn`` bounds one generate call. The stop reasons are listed in
:mod:`prorag.agent.trajectory`.

Algorithm 1 opens a new ``<step><reasoning>`` after every conclusion while budget remains (lines 15–16), so
with the literal algorithm every valid completion has exactly ``B`` steps: a model that answers earlier writes
its answer inside an opened step and fails the format check. The engine's default is therefore
``open_next_step=False``: after ``</step>`` the model chooses between another ``<step>`` and
``</think><answer>``. ``open_next_step=True`` gives the literal algorithm.

Searches: an empty query (``<search></search>``) is still a search step — nothing is retrieved and the
context holds :data:`EMPTY_QUERY_NOTE`; a query with no hits gets :data:`NO_RESULTS_NOTE`. Both count in
``retrieval_count`` (which counts search actions). A retriever exception is not swallowed: it is re-raised as
:class:`RetrievalFailedError` naming the questions and queries of the failed call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from tqdm.auto import tqdm

from prorag.agent.trajectory import Rollout, Segment, SegmentKind, StopReason, stop_reason_counts
from prorag.data.records import Question
from prorag.llm.generation import Completion, Generator, SamplingParams, policy_label
from prorag.memory import reusing_freed_memory
from prorag.protocol.base import ProtocolAdapter, format_documents
from prorag.protocol.escaping import escape_retrieved
from prorag.protocol.registry import build_adapter
from prorag.retrieval.base import Hit, Retriever

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

EMPTY_QUERY_NOTE: Final = "(empty search query: nothing was retrieved)"
TURN_CLOCK_METADATA_KEY: Final = "turn_clock_ns"
"""``Rollout.metadata`` key of the rollout's measured turns: ``[kind, start, end]`` (``generate`` or ``search``,
``time.time_ns``) per generate call and per retrieval, in the order of its segments. The generator and the
retriever serve a turn's rollouts in one batched call: a span is that call, shared by the rollouts batched with
it; an empty query's search retrieves nothing and lasts no time."""
NO_RESULTS_NOTE: Final = "(no results)"


class RolloutError(RuntimeError):
    """The engine could not continue a batch."""


class RetrievalFailedError(RolloutError):
    """The retriever failed on a turn's batched call; names the questions and queries (cause chained)."""

    def __init__(self, question_keys: Sequence[str], queries: Sequence[str], cause: BaseException) -> None:
        self.question_keys = list(question_keys)
        self.queries = list(queries)
        super().__init__(f"retrieval failed for question(s) {self.question_keys} with queries {self.queries}: "
                         f"{type(cause).__name__}: {cause}")


# ----------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class QuestionItem:
    """A question normalized for a rollout (a plain string gets ``id`` = its position, no dataset)."""

    key: str
    id: str
    dataset: str
    text: str
    golden_answers: tuple[str, ...] = ()


def as_question_items(questions: Sequence[Question] | Sequence[str]) -> list[QuestionItem]:
    """Normalize :class:`Question` records or plain strings."""
    if isinstance(questions, str):
        raise TypeError("questions must be a list, not a single string")
    items = []
    for index, question in enumerate(questions):
        if isinstance(question, Question):
            items.append(QuestionItem(question.key, question.id, question.dataset, question.question,
                                      tuple(question.golden_answers)))
        elif isinstance(question, str):
            items.append(QuestionItem(str(index), str(index), "", question))
        else:
            raise TypeError(f"questions[{index}] must be a Question or a str, got {type(question).__name__}")
    return items


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` on its own, without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def require_tokenizer(generator: Generator) -> PreTrainedTokenizerBase:
    """The generator's tokenizer; the engine works on token ids and cannot run without one."""
    tokenizer = generator.tokenizer
    if tokenizer is None:
        raise ValueError("the generator has no tokenizer; the rollout engine needs token ids "
                         "(give the OpenAI-compatible backend a tokenizer)")
    return tokenizer


def documents_text(hits: Sequence[Hit]) -> str:
    """Escaped, numbered documents (``Doc i(Title: …) …``), or :data:`NO_RESULTS_NOTE`."""
    return format_documents([(hit.title, hit.text) for hit in hits]) if hits \
        else escape_retrieved(NO_RESULTS_NOTE)


@dataclass
class _State:
    """Mutable state of one trajectory while it runs."""

    item: QuestionItem
    sample_index: int
    prompt: str
    prompt_ids: list[int]
    segments: list[Segment] = field(default_factory=list)
    completion: str = ""
    ids: list[int] = field(default_factory=list)
    generated: int = 0
    steps: int = 0
    forced: bool = False
    turns: int = 0
    pending_query: str | None = None
    queries: list[str] = field(default_factory=list)
    retrieved_ids: list[list[str]] = field(default_factory=list)
    stop_reason: StopReason | None = None
    clock: list[list[str | int]] = field(default_factory=list)
    """:data:`TURN_CLOCK_METADATA_KEY`."""

    def add(self, segment: Segment) -> None:
        self.segments.append(segment)
        self.completion += segment.text
        self.ids.extend(segment.token_ids)
        if segment.generated:
            self.generated += len(segment.token_ids)

    def tokens_of(self, kind: SegmentKind) -> int:
        return sum(len(segment.token_ids) for segment in self.segments if segment.kind == kind)


# ------------------------------------------------------------------------------------------ engine


class RolloutEngine:
    """Run a protocol's multi-turn loop for a batch of questions (see the module docstring).

    ``step_budget`` is ``B``, ``top_k`` the documents per search. ``seed`` (sampling only) is offset by the
    turn number for each generate call. ``logprobs=True`` records the sampler's log-probabilities in the
    generated segments. ``method`` names the rollouts (default: the protocol name).
    """

    def __init__(self, generator: Generator, retriever: Retriever,
                 protocol: str | ProtocolAdapter, *,
                 step_budget: int = 4, top_k: int = 3, max_new_tokens_per_turn: int = 256,
                 max_total_new_tokens: int = 1024, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, open_next_step: bool = False, logprobs: bool = False,
                 method: str | None = None, progress: bool = True) -> None:
        for name, value in (("step_budget", step_budget), ("top_k", top_k),
                            ("max_new_tokens_per_turn", max_new_tokens_per_turn),
                            ("max_total_new_tokens", max_total_new_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p, seed=seed)  # validate early
        self.generator = generator
        self.retriever = retriever
        self.adapter = build_adapter(protocol, open_next_step=open_next_step)
        self.tokenizer = require_tokenizer(generator)
        self.step_budget = step_budget
        self.top_k = top_k
        self.max_new_tokens_per_turn = max_new_tokens_per_turn
        self.max_total_new_tokens = max_total_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.logprobs = logprobs
        self.method = method or self.adapter.name
        self.progress = progress

    @property
    def protocol(self) -> str:
        return self.adapter.name

    # -------------------------------------------------------------------------------------------- run

    def run(self, questions: Sequence[Question] | Sequence[str], *, samples: int = 1) -> list[Rollout]:
        """Roll out every question ``samples`` times; results are question-major, in input order."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be a positive int, got {samples!r}")
        items = as_question_items(questions)
        states = [self._start(item, sample) for item in items for sample in range(samples)]
        turn = 0
        # Finished rollouts out of all (rate and ETA), named by method and policy; the postfix is the turn.
        with tqdm(total=len(states), desc=f"rollout {self.method} [{policy_label(self.generator)}]",
                  unit="rollout", disable=not self.progress or not states) as bar, reusing_freed_memory():
            while active := [state for state in states if state.stop_reason is None]:
                self._generate(active, turn)
                self._retrieve([state for state in active if state.pending_query is not None])
                turn += 1
                still_active = sum(state.stop_reason is None for state in states)
                bar.update(len(active) - still_active)
                bar.set_postfix(turn=turn, active=still_active)
        rollouts = [self._finish(state) for state in states]
        if rollouts:
            logger.info("%d rollouts (%s) in %d turns; stop reasons %s", len(rollouts), self.method, turn,
                        stop_reason_counts(rollouts))
        return rollouts

    def _start(self, item: QuestionItem, sample_index: int) -> _State:
        prompt = self.generator.apply_chat_template(self.adapter.messages(item.text))
        state = _State(item=item, sample_index=sample_index, prompt=prompt, prompt_ids=encode(self.tokenizer, prompt))
        if not state.prompt_ids:
            raise ValueError(f"question {item.key!r}: the prompt has no tokens")
        self._insert(state, self.adapter.initial_prefix(), "tag")
        return state

    def _insert(self, state: _State, text: str, kind: SegmentKind) -> None:
        if text:
            state.add(Segment(text=text, token_ids=encode(self.tokenizer, text), kind=kind))

    def _remaining(self, state: _State) -> int:
        return self.max_total_new_tokens - state.generated

    # --------------------------------------------------------------------------------------- generate

    def _generate(self, active: list[_State], turn: int) -> None:
        allowed = [min(self.max_new_tokens_per_turn, self._remaining(state)) for state in active]
        params = SamplingParams(max_new_tokens=max(allowed), temperature=self.temperature, top_p=self.top_p,
                                stop=self.adapter.stop_strings,
                                seed=None if self.seed is None else self.seed + turn, logprobs=self.logprobs)
        started = time.time_ns()
        results = self.generator.generate([[*state.prompt_ids, *state.ids] for state in active], params)
        ended = time.time_ns()
        if len(results) != len(active) or any(not samples for samples in results):
            raise RolloutError(f"the generator returned {len(results)} results for {len(active)} prompts")
        for state, limit, samples in zip(active, allowed, results, strict=True):
            state.clock.append(["generate", started, ended])
            self._advance(state, self._truncate(samples[0], limit))

    def _truncate(self, completion: Completion, limit: int) -> Completion:
        """Cut a completion to ``limit`` tokens: what generating with ``max_new_tokens=limit`` gives."""
        if len(completion.token_ids) <= limit:
            return completion
        ids = list(completion.token_ids[:limit])
        return Completion(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                          logprobs=None if completion.logprobs is None else list(completion.logprobs[:limit]),
                          finish_reason="length", stop=None, prompt_tokens=completion.prompt_tokens)

    def _advance(self, state: _State, completion: Completion) -> None:
        """Record one generation and apply Algorithm 1's rule for its boundary."""
        if not completion.token_ids:
            raise RolloutError(f"question {state.item.key!r}: the generator returned no token ids "
                               "(the engine needs them; a remote backend needs a tokenizer or vLLM token ids)")
        state.turns += 1
        completion = self._join_split_boundary(state, completion)
        state.add(Segment(text=completion.text, token_ids=list(completion.token_ids), kind="generated",
                          logprobs=None if completion.logprobs is None else list(completion.logprobs)))
        boundary = (self.adapter.boundary(completion.stop, state.completion) if completion.stop is not None
                    else None)
        if completion.finish_reason == "stop" and completion.stop is None:
            state.stop_reason = "eos"
        elif state.forced:
            if boundary == "answer":
                state.stop_reason = "forced_answer"
            elif self._remaining(state) <= 0:
                state.stop_reason = "no_boundary" if boundary is None else "token_budget"
            # otherwise the forced answer goes on: other boundaries are plain text here
        elif boundary == "answer":
            state.stop_reason = "answer"
        elif boundary == "malformed":
            state.stop_reason = "malformed"
        elif self._remaining(state) <= 0:
            state.stop_reason = "no_boundary" if boundary is None else "token_budget"
        elif boundary == "search":
            if self.adapter.step_on_search and state.steps >= self.step_budget:
                self._force(state)
            else:
                state.pending_query = self.adapter.query(state.completion)
        elif boundary == "step":
            state.steps += 1
            self._insert(state, self.adapter.after_step(state.steps, self.step_budget), "tag")
            if state.steps >= self.step_budget:
                self._force(state)
        # boundary None, finish "length": keep generating in the next turn

    def _join_split_boundary(self, state: _State, completion: Completion) -> Completion:
        """Detect a boundary split across two generate calls (``…</sea`` | ``rch>…``).

        A backend only looks for stop strings in the text of its own call, so after a length cut the engine
        checks the junction with the previous generated segment. If a stop string straddles it, the new
        completion is cut after the token that completes it — what one longer generation would have returned.
        """
        if not state.segments or not state.segments[-1].generated:
            return completion
        previous = state.segments[-1].text
        joint = previous + completion.text
        ends = []
        for stop in self.adapter.stop_strings:
            start = joint.find(stop, max(0, len(previous) - len(stop) + 1))
            if 0 <= start < len(previous):
                ends.append((start + len(stop), stop))
        if not ends:
            return completion
        end, stop = min(ends)
        needed = end - len(previous)
        for count in range(1, len(completion.token_ids) + 1):
            text = self.tokenizer.decode(completion.token_ids[:count], skip_special_tokens=True)
            if len(text) >= needed and text[:needed] == completion.text[:needed]:
                return Completion(text=text[:needed], token_ids=list(completion.token_ids[:count]),
                                  logprobs=None if completion.logprobs is None else list(completion.logprobs[:count]),
                                  finish_reason="stop", stop=stop, prompt_tokens=completion.prompt_tokens)
        return completion  # the decoded pieces do not line up (never seen with byte-level BPE): leave it

    def _force(self, state: _State) -> None:
        """Algorithm 1 lines 20–22: close the think block if needed, open the answer."""
        self._insert(state, self.adapter.forced_answer(state.completion), "tag")
        state.forced = True

    # --------------------------------------------------------------------------------------- retrieve

    def _retrieve(self, pending: list[_State]) -> None:
        """One batched search for every pending query of the turn; insert the contexts."""
        if not pending:
            return
        searching = [state for state in pending if state.pending_query]
        queries = [state.pending_query or "" for state in searching]
        hits: list[list[Hit]] = []
        started = time.time_ns()
        if searching:
            try:
                hits = self.retriever.search(queries, self.top_k)
                if len(hits) != len(queries):
                    raise RolloutError(f"the retriever returned {len(hits)} results for {len(queries)} queries")
            except Exception as error:
                raise RetrievalFailedError([state.item.key for state in searching], queries, error) from error
        ended = time.time_ns()
        found = {id(state): result[: self.top_k] for state, result in zip(searching, hits, strict=True)}
        for state in pending:
            query = state.pending_query or ""
            state.clock.append(["search", started, ended] if query else ["search", ended, ended])
            result = found.get(id(state), [])
            docs = documents_text(result) if query else escape_retrieved(EMPTY_QUERY_NOTE)
            self._insert(state, self.adapter.insertion(docs), "context")
            state.queries.append(query)
            state.retrieved_ids.append([hit.id for hit in result])
            state.pending_query = None
            if self.adapter.step_on_search:
                state.steps += 1

    # ----------------------------------------------------------------------------------------- finish

    def _finish(self, state: _State) -> Rollout:
        assert state.stop_reason is not None
        format_ok, n_steps = self.adapter.check_format(state.completion)
        return Rollout(
            question_key=state.item.key,
            question_id=state.item.id,
            dataset=state.item.dataset,
            question=state.item.text,
            golden_answers=state.item.golden_answers,
            method=self.method,
            protocol=self.adapter.name,
            prompt=state.prompt,
            prompt_token_ids=list(state.prompt_ids),
            completion=state.completion,
            segments=list(state.segments),
            steps=self.adapter.steps(state.completion) if format_ok else None,
            format_ok=bool(format_ok),
            n_steps=n_steps,
            answer=self.adapter.extract_answer(state.completion),
            stop_reason=state.stop_reason,
            retrieval_count=len(state.queries),
            queries=list(state.queries),
            retrieved_ids=[list(ids) for ids in state.retrieved_ids],
            generated_tokens=state.generated,
            context_tokens=state.tokens_of("context"),
            tag_tokens=state.tokens_of("tag"),
            turns=state.turns,
            sample_index=state.sample_index,
            metadata={"step_budget": self.step_budget, "top_k": self.top_k, "steps_taken": state.steps,
                      TURN_CLOCK_METADATA_KEY: [list(entry) for entry in state.clock]},
        )
