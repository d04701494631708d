"""Baselines without an agentic loop: direct answer and standard RAG, batched, returning :class:`Rollout` s.

Both prompt the model with one user message — a short instruction, the retrieved documents for standard RAG,
and the question — and the engine writes the opening ``<answer>`` itself (a ``"tag"`` segment), so the model
only has to write the answer and close it; generation stops at ``</answer>``. ``format_ok`` means the answer
was closed (``</answer>`` present); ``n_steps`` is 0 and ``steps`` is ``[]``. ``answer`` is the text inside
``<answer>…</answer>``; when the model ended its sequence (EOS) inside the opened answer without closing it,
the text it wrote is taken as the answer (``format_ok`` stays False); an answer cut by ``max_new_tokens`` is
None. Stop reasons: ``"answer"``, ``"eos"`` or ``"no_boundary"``.

* :class:`DirectAnswer` (method ``"direct"``): no retrieval.
* :class:`StandardRAG` (method ``"standard_rag"``): one batched ``retriever.search`` over all questions
  (top-``k`` = 3 by default), documents escaped and numbered like the agentic protocols' contexts. Its
  ``retrieval_count`` is 1, ``queries`` is ``[question]`` and ``context_tokens`` counts the tokens of the
  documents block in the prompt (the retrieved text the model read), not of the completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from prorag.agent.engine import (
    QuestionItem,
    RetrievalFailedError,
    RolloutError,
    as_question_items,
    documents_text,
    encode,
    require_tokenizer,
)
from prorag.agent.trajectory import Rollout, Segment, StopReason
from prorag.data.records import Question
from prorag.llm.generation import Generator, SamplingParams
from prorag.protocol import hiprag
from prorag.retrieval.base import Hit, Retriever

DIRECT_INSTRUCTION: Final = "Answer the question with a short answer inside <answer></answer>."
RAG_INSTRUCTION: Final = (
    "Answer the question using the documents below. Give a short answer inside <answer></answer>."
)
ANSWER_PREFIX: Final = hiprag.ANSWER_OPEN
ANSWER_STOP: Final = hiprag.ANSWER_CLOSE
PROTOCOL: Final = "short_answer"


def direct_messages(question: str) -> list[dict[str, str]]:
    """The direct-answer prompt."""
    return [{"role": "user", "content": f"{DIRECT_INSTRUCTION}\nQuestion: {question.strip()}"}]


def rag_messages(question: str, docs_text: str) -> list[dict[str, str]]:
    """The standard-RAG prompt; ``docs_text`` must be escaped (:func:`~prorag.agent.engine.documents_text`)."""
    return [{"role": "user",
             "content": f"{RAG_INSTRUCTION}\n\nDocuments:\n{docs_text}\n\nQuestion: {question.strip()}"}]


class _AnswerOnce:
    """Shared machinery: one generate call for all prompts, the ``<answer>`` prefix, the record."""

    method: str

    def __init__(self, generator: Generator, *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, logprobs: bool = False,
                 method: str | None = None) -> None:
        self.method = method or type(self).method
        self.generator = generator
        self.tokenizer = require_tokenizer(generator)
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                     stop=(ANSWER_STOP,), seed=seed, logprobs=logprobs)

    def _answer(self, items: list[QuestionItem], conversations: list[list[dict[str, str]]],
                retrieved: list[list[Hit]] | None, context_tokens: list[int]) -> list[Rollout]:
        prompts = [self.generator.apply_chat_template(messages) for messages in conversations]
        prompt_ids = [encode(self.tokenizer, prompt) for prompt in prompts]
        prefix = Segment(text=ANSWER_PREFIX, token_ids=encode(self.tokenizer, ANSWER_PREFIX), kind="tag")
        results = self.generator.generate([[*ids, *prefix.token_ids] for ids in prompt_ids], self.params) \
            if items else []
        if len(results) != len(items) or any(not samples for samples in results):
            raise RolloutError(f"the generator returned {len(results)} results for {len(items)} prompts")
        rollouts = []
        for index, (item, prompt, ids, samples) in enumerate(zip(items, prompts, prompt_ids, results, strict=True)):
            completion = samples[0]
            generated = Segment(text=completion.text, token_ids=list(completion.token_ids), kind="generated",
                                logprobs=None if completion.logprobs is None else list(completion.logprobs))
            text = prefix.text + generated.text
            stop_reason: StopReason
            if completion.stop == ANSWER_STOP:
                stop_reason = "answer"
            elif completion.finish_reason == "stop":
                stop_reason = "eos"
            else:
                stop_reason = "no_boundary"
            answer = hiprag.extract_answer(text)
            if answer is None and stop_reason == "eos":
                answer = generated.text.strip() or None
            hits = retrieved[index] if retrieved is not None else []
            rollouts.append(Rollout(
                question_key=item.key, question_id=item.id, dataset=item.dataset, question=item.text,
                golden_answers=item.golden_answers, method=self.method, protocol=PROTOCOL, prompt=prompt,
                prompt_token_ids=ids, completion=text, segments=[prefix, generated], steps=[],
                format_ok=stop_reason == "answer", n_steps=0, answer=answer, stop_reason=stop_reason,
                retrieval_count=0 if retrieved is None else 1,
                queries=[] if retrieved is None else [item.text],
                retrieved_ids=[] if retrieved is None else [[hit.id for hit in hits]],
                generated_tokens=len(generated.token_ids), context_tokens=context_tokens[index],
                tag_tokens=len(prefix.token_ids), turns=1,
            ))
        return rollouts


class DirectAnswer(_AnswerOnce):
    """Answer from parametric knowledge only (method ``"direct"``)."""

    method = "direct"

    def run(self, questions: Sequence[Question] | Sequence[str]) -> list[Rollout]:
        """One rollout per question, in order."""
        items = as_question_items(questions)
        return self._answer(items, [direct_messages(item.text) for item in items], None, [0] * len(items))


class StandardRAG(_AnswerOnce):
    """Retrieve top-``k`` for the question once, then answer (method ``"standard_rag"``)."""

    method = "standard_rag"

    def __init__(self, generator: Generator, retriever: Retriever, *, top_k: int = 3, max_new_tokens: int = 64,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 logprobs: bool = False, method: str | None = None) -> None:
        super().__init__(generator, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                         seed=seed, logprobs=logprobs, method=method)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        self.retriever = retriever
        self.top_k = top_k

    def run(self, questions: Sequence[Question] | Sequence[str]) -> list[Rollout]:
        """One rollout per question, in order; one retriever call for the whole batch."""
        items = as_question_items(questions)
        queries = [item.text for item in items]
        hits: list[list[Hit]] = []
        if items:
            try:
                hits = self.retriever.search(queries, self.top_k)
                if len(hits) != len(queries):
                    raise RolloutError(f"the retriever returned {len(hits)} results for {len(queries)} queries")
            except Exception as error:
                raise RetrievalFailedError([item.key for item in items], queries, error) from error
        hits = [result[: self.top_k] for result in hits]
        docs = [documents_text(result) for result in hits]
        conversations = [rag_messages(item.text, text) for item, text in zip(items, docs, strict=True)]
        return self._answer(items, conversations, hits, [len(encode(self.tokenizer, text)) for text in docs])
