"""Over-/under-search detection on hand-built rollouts: a scripted policy and the reference judge over BM25."""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from tqdm.auto import tqdm

from prorag.agent.trajectory import Rollout
from prorag.data.records import Passage
from prorag.judges import ReferenceJudge, Verdict, detect, detection_summary, reask_messages
from prorag.judges.detection import split_context
from prorag.judges.prompts import UNDER_SEARCH_PROMPT, step_messages
from prorag.llm.generation import Completion, GenerationError, SamplingParams
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.store import PassageStore
from prorag.rewards import count_optimal, hierarchical_reward

PASSAGES = [
    Passage("p1", "Steven Spielberg", "Steven Allan Spielberg is an American filmmaker born in Cincinnati, Ohio."),
    Passage("p2", "Jaws (film)", "Jaws is a 1975 American thriller film directed by Steven Spielberg."),
    Passage("p3", "Lacy J. Dalton", "Lacy J. Dalton (born Jill Lynne Byrem) is an American country singer from "
                                    "Bloomsburg, Pennsylvania."),
]
JAWS_CONTEXT = "Doc 1(Title: Jaws (film)) Jaws is a 1975 American thriller film directed by Steven Spielberg."
SPIELBERG_CONTEXT = ("Doc 1(Title: Steven Spielberg) Steven Allan Spielberg was born in Cincinnati, Ohio.\n"
                     "Doc 2(Title: Jaws (film)) Jaws is a 1975 film.")


class ReaskPolicy:
    """A ``Generator`` double answering re-asked queries from a table; records each ``generate`` call.

    With ``partner`` set, it waits (briefly) inside ``generate`` for that event, to observe that the
    under-search phase runs at the same time.
    """

    def __init__(self, answers: dict[str, str], *, fail: bool = False,
                 partner: threading.Event | None = None) -> None:
        self.answers = answers
        self.fail = fail
        self.calls: list[tuple[list[str], SamplingParams]] = []
        self.started = threading.Event()
        self.partner = partner
        self.overlapped: bool | None = None

    @property
    def tokenizer(self) -> None:
        return None

    def apply_chat_template(self, messages: Sequence[dict[str, Any]]) -> str:
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"

    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams) -> list[list[Completion]]:
        self.calls.append(([str(p) for p in prompts], params))
        self.started.set()
        if self.partner is not None:
            self.overlapped = self.partner.wait(5)
        if self.fail:
            raise GenerationError("policy server unreachable")
        results = []
        for prompt in prompts:
            query = str(prompt).removeprefix("user: ").split("Question: ", 1)[-1].removesuffix("\nassistant:")
            text = f" {self.answers.get(query, 'I am not sure.')} "
            results.append([Completion(text=text, token_ids=[1, 2], logprobs=None, finish_reason="stop", stop=None,
                                       prompt_tokens=3)])
        return results


class RecordingJudge:
    """Wraps a judge and records every batch it receives."""

    def __init__(self, inner: ReferenceJudge, *, on_verify: Any = None) -> None:
        self.inner = inner
        self.on_verify = on_verify
        self.equivalent_calls: list[list[tuple[str, str]]] = []
        self.verify_calls: list[tuple[list[tuple[str, str, str]], Any]] = []

    def equivalent(self, pairs: Sequence[tuple[str, str]]) -> list[Verdict]:
        self.equivalent_calls.append(list(pairs))
        return self.inner.equivalent(pairs)

    def verify_steps(self, steps: Sequence[tuple[str, str, str]], *,
                     contexts: Sequence[Sequence[str]] | None = None) -> list[Verdict]:
        self.verify_calls.append((list(steps), contexts))
        if self.on_verify is not None:
            self.on_verify()
        return self.inner.verify_steps(steps, contexts=contexts)

    def answer_correct(self, items: Sequence[Any]) -> list[Verdict]:
        return self.inner.answer_correct(items)


def search(query: str, context: str, conclusion: str | None) -> dict[str, str | None]:
    return {"kind": "search", "reasoning": "I should look it up.", "query": query, "context": context,
            "conclusion": conclusion}


def think(reasoning: str, conclusion: str) -> dict[str, str | None]:
    return {"kind": "non_search", "reasoning": reasoning, "query": None, "context": None, "conclusion": conclusion}


def make_rollout(question: str, steps: list[dict[str, str | None]] | None, answer: str = "x") -> Rollout:
    return Rollout(question_key=question, question_id="q", dataset="test", question=question, golden_answers=(answer,),
                   method="hiprag", protocol="hiprag", prompt="", prompt_token_ids=[], completion="", segments=[],
                   steps=steps, format_ok=steps is not None, n_steps=len(steps) if steps else -1, answer=answer,
                   stop_reason="answer", retrieval_count=0, queries=[], retrieved_ids=[], generated_tokens=0,
                   context_tokens=0, tag_tokens=0, turns=1)


ROLLOUTS = [
    make_rollout("Where was the director of Jaws born?", [
        search("Jaws director", JAWS_CONTEXT, "Jaws was directed by Steven Spielberg."),
        search("Steven Spielberg birthplace", SPIELBERG_CONTEXT, "Spielberg was born in Cincinnati, Ohio."),
        think("Combining the two steps.", "Spielberg, born in Cincinnati, directed Jaws."),
    ], answer="Cincinnati"),
    make_rollout("Broken trajectory?", None),
    make_rollout("Where was Lacy J. Dalton born?", [
        think("I remember this singer.", "Lacy J. Dalton was born in Denver, Colorado, in 1950."),
        search("Jaws director", JAWS_CONTEXT, "Spielberg directed Jaws."),
    ]),
    make_rollout("Search-R1 style?", [search("Jaws director", JAWS_CONTEXT, None)]),
]
ANSWERS = {"Jaws director": "Jaws was directed by Steven Spielberg."}


@pytest.fixture(scope="module")
def reference_judge() -> ReferenceJudge:
    return ReferenceJudge(BM25Retriever.build(PassageStore(PASSAGES)), top_k=2)


def test_detects_over_and_under_search_in_batched_calls(reference_judge):
    policy = ReaskPolicy(ANSWERS)
    over, under = RecordingJudge(reference_judge), RecordingJudge(reference_judge)
    results = detect(ROLLOUTS, policy, over, under, reask_max_new_tokens=16, reask="instructed",
                     under_search_input="step_and_question")

    (prompts, params), = policy.calls  # one batched generation for every query of the batch, each once
    assert len(prompts) == 2 and params.max_new_tokens == 16 and params.greedy
    assert prompts[0] == policy.apply_chat_template(reask_messages("Jaws director", "instructed"))
    assert len(over.equivalent_calls) == 1 and len(over.equivalent_calls[0]) == 3
    assert over.equivalent_calls[0][0] == ("Jaws was directed by Steven Spielberg.", ANSWERS["Jaws director"])
    assert not over.verify_calls and not under.equivalent_calls
    (steps, contexts), = under.verify_calls
    assert [step[2] for step in steps] == ["Spielberg, born in Cincinnati, directed Jaws.",
                                           "Lacy J. Dalton was born in Denver, Colorado, in 1950."]
    assert contexts == [[JAWS_CONTEXT, *split_context(SPIELBERG_CONTEXT)], []]

    first, broken, dalton, no_conclusion = results
    assert [(s.kind, s.over, s.under) for s in first.steps] == [
        ("search", True, None), ("search", False, None), ("non_search", None, False)]
    assert first.steps[0].reask_answer == ANSWERS["Jaws director"] and first.steps[1].reask_answer == "I am not sure."
    assert "f1=" in first.steps[0].judge_raw and "grounded" in first.steps[2].judge_raw
    assert broken.skipped and broken.steps == ()
    assert [(s.kind, s.flagged) for s in dalton.steps] == [("non_search", True), ("search", False)]
    assert no_conclusion.steps[0].unknown and "no conclusion" in no_conclusion.steps[0].judge_error
    assert detection_summary(results) == {
        "rollouts": 4, "skipped_rollouts": 1, "steps": 6, "checked": 6, "search_steps": 4, "non_search_steps": 2,
        "over_search": 1, "under_search": 1, "unknown": 1, "unknown_over": 1, "unknown_under": 0}

    count = count_optimal(first)
    assert (count.n_optimal, count.n_steps, count.n_over, count.n_unknown) == (2, 3, 1, 0)
    reward = hierarchical_reward(True, True, count.n_steps, count.n_optimal)
    assert reward.total == pytest.approx(1 + 0.4 * 2 / 3)
    assert count_optimal(no_conclusion).n_optimal == 0  # unknown is not optimal


def test_paper_reask_is_the_bare_query_sampled_and_the_verifier_sees_the_isolated_step(reference_judge):
    # §3.2: "directly prompt the policy model with [q_i] as a standalone question"; Fig. 6: "a single, isolated
    # reasoning step ... based only on the information within this single step"
    policy = ReaskPolicy(ANSWERS)
    over, under = RecordingJudge(reference_judge), RecordingJudge(reference_judge)
    detect(ROLLOUTS, policy, over, under, reask_max_new_tokens=16)  # the defaults are the paper's
    (prompts, params), = policy.calls
    assert prompts[0] == "user: Jaws director\nassistant:"  # the query alone, no instruction
    assert (params.temperature, params.top_p) == (1.0, 1.0) and not params.greedy  # sampled as in training
    (steps, _), = under.verify_calls
    assert [step[0] for step in steps] == ["", ""]  # no question travels with the step
    system, user = step_messages("", " r ", "o")
    assert system == {"role": "system", "content": UNDER_SEARCH_PROMPT}
    assert user == {"role": "user", "content": "<reasoning>r</reasoning>\n<conclusion>o</conclusion>"}
    with pytest.raises(ValueError, match="re-ask style"):
        detect(ROLLOUTS, policy, over, under, reask="chatty")  # type: ignore[arg-type]


def test_the_two_phases_run_concurrently(reference_judge):
    judging = threading.Event()
    policy = ReaskPolicy(ANSWERS, partner=judging)

    def under_started() -> None:
        judging.set()
        assert policy.started.wait(5)

    detect(ROLLOUTS, policy, RecordingJudge(reference_judge), RecordingJudge(reference_judge,
                                                                             on_verify=under_started))
    assert policy.overlapped is True


def test_ablation_modes_skip_the_other_phase(reference_judge):
    policy = ReaskPolicy(ANSWERS)
    over, under = RecordingJudge(reference_judge), RecordingJudge(reference_judge)
    over_only = detect(ROLLOUTS, policy, over, under, mode="over_only")
    assert len(policy.calls) == 1 and len(over.equivalent_calls) == 1 and not under.verify_calls
    assert [s.checked for s in over_only[0].steps] == [True, True, False]
    assert count_optimal(over_only[0], "over_only").n_optimal == 2
    with pytest.raises(ValueError, match="not checked"):
        count_optimal(over_only[0], "both")

    policy = ReaskPolicy(ANSWERS)
    over, under = RecordingJudge(reference_judge), RecordingJudge(reference_judge)
    under_only = detect(ROLLOUTS, policy, over, under, mode="under_only")
    assert not policy.calls and not over.equivalent_calls and len(under.verify_calls) == 1
    assert count_optimal(under_only[2], "under_only").n_optimal == 1  # the under-search step is not optimal
    with pytest.raises(ValueError):
        detect(ROLLOUTS, policy, over, under, mode="neither")  # type: ignore[arg-type]


def test_failed_reask_generation_gives_unknown_verdicts(reference_judge):
    over = RecordingJudge(reference_judge)
    results = detect(ROLLOUTS, ReaskPolicy(ANSWERS, fail=True), over, RecordingJudge(reference_judge))
    search_steps = [s for r in results for s in r.steps if s.kind == "search"]
    assert all(s.over is None and s.unknown for s in search_steps)
    assert "re-ask generation failed" in search_steps[0].judge_error
    assert not over.equivalent_calls
    assert results[0].steps[2].under is False  # the other phase is unaffected


def test_split_context():
    assert split_context(SPIELBERG_CONTEXT) == [
        "Doc 1(Title: Steven Spielberg) Steven Allan Spielberg was born in Cincinnati, Ohio.",
        "Doc 2(Title: Jaws (film)) Jaws is a 1975 film."]
    assert split_context("free text\nover lines") == ["free text\nover lines"]


def test_progress_bar_counts_judged_steps_and_names_methods_policy_and_judge(reference_judge, capsys, monkeypatch):
    """Issue 34: judging had no progress bar. The bar counts judged steps (rate, ETA), names what it judges, and
    chunking the judge calls for it leaves every verdict as one call gives."""
    policy = ReaskPolicy(ANSWERS)
    policy.label = "smollm2-135m-instruct+sft_adapter@v1"
    monkeypatch.setattr("prorag.judges.detection.tqdm", functools.partial(tqdm, mininterval=0))  # draw every update
    many = ROLLOUTS * 10  # 60 steps: the judges are called in chunks
    over, under = RecordingJudge(reference_judge), RecordingJudge(reference_judge)
    over.kind = under.kind = "reference"
    shown = detect(many, policy, over, under, reask_max_new_tokens=16, progress=True)
    bar = capsys.readouterr().err
    assert "judging hiprag [smollm2-135m-instruct+sft_adapter@v1; reference judge]" in bar
    assert "/60 [" in bar and "step/s" in bar and "<" in bar  # tqdm: [elapsed<remaining, rate]
    assert "60/60 [" in bar.split("\r")[-1]  # the finished bar stays (issue 46, item 5)
    assert len(under.verify_calls) > 1
    quiet = detect(many, policy, reference_judge, reference_judge, reask_max_new_tokens=16)
    assert capsys.readouterr().err == ""
    assert [result.to_dict() for result in shown] == [result.to_dict() for result in quiet]
