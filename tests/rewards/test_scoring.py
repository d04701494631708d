"""RL reward scoring: eq. 1 with detection by the current policy, the baseline and ablations, multi-stage stages,
batch statistics, and a judge outage that yields unknown verdicts instead of rewards."""

from __future__ import annotations

import socket

import pytest

from prorag.agent.trajectory import Rollout
from prorag.data.records import Passage
from prorag.judges import LLMJudge, ReferenceJudge, Verdict
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.embedder import load_embedder
from prorag.retrieval.store import PassageStore
from prorag.rewards import count_optimal
from prorag.rewards.diagnostics import process_shaped_groups
from prorag.rewards.multistage import answers_correct
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import RolloutScorer, batch_stats
from prorag.testing import ScriptedModel

PASSAGES = [
    Passage("p1", "Steven Spielberg", "Steven Allan Spielberg is an American filmmaker born in Cincinnati, Ohio."),
    Passage("p2", "Jaws (film)", "Jaws is a 1975 American thriller film directed by Steven Spielberg."),
]
JAWS = "Doc 1(Title: Jaws (film)) Jaws is a 1975 American thriller film directed by Steven Spielberg."
SPIELBERG = "Doc 1(Title: Steven Spielberg) Steven Allan Spielberg is an American filmmaker born in Cincinnati, Ohio."


def _step(kind: str, conclusion: str, query: str | None = None, context: str | None = None) -> dict:
    return {"kind": kind, "reasoning": "Reasoning.", "query": query, "context": context, "conclusion": conclusion}


def _rollout(key: str, steps: list[dict] | None, answer: str | None, gold: str = "Cincinnati",
             retrievals: int = 0) -> Rollout:
    return Rollout(question_key=key, question_id=key, dataset="test", question="Where was the director of Jaws born?",
                   golden_answers=(gold,), method="agent", protocol="hiprag", prompt="", prompt_token_ids=[],
                   completion="", segments=[], steps=steps, format_ok=steps is not None,
                   n_steps=len(steps) if steps is not None else -1, answer=answer, stop_reason="answer",
                   retrieval_count=retrievals, queries=["Jaws director"] * retrievals, retrieved_ids=[],
                   generated_tokens=40, context_tokens=30 * retrievals, tag_tokens=5, turns=2)


ROLLOUTS = [
    _rollout("good", [_step("search", "Jaws was directed by Steven Spielberg.", "Jaws director", JAWS),
                      _step("search", "Spielberg was born in Cincinnati.", "Spielberg birthplace", SPIELBERG),
                      _step("non_search", "So the director of Jaws was born in Cincinnati.")],
             "Cincinnati", retrievals=2),
    _rollout("broken", None, None),
    _rollout("wrong", [_step("non_search", "Spielberg was born in Denver, Colorado.")], "Denver"),
]


def _scorer(entry: dict, judge=None, **options) -> RolloutScorer:
    """The scorer of a reward entry, with ``judge`` for both detectors."""
    return RolloutScorer(build_reward(entry), over_judge=judge, under_judge=judge, **options)


@pytest.fixture(scope="module")
def policy(one_torch_thread) -> TransformersGenerator:
    return TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=4)


@pytest.fixture(scope="module")
def judge() -> ReferenceJudge:
    return ReferenceJudge(BM25Retriever.build(PassageStore(PASSAGES)), top_k=2)


def test_search_r1_needs_no_judge_and_has_no_process_term(policy):
    scored = RolloutScorer(build_reward({"kind": "search_r1"})).score(ROLLOUTS, policy)
    assert scored.verdicts is None
    assert scored.components["process"] == [0.0, 0.0, 0.0]
    assert scored.totals == pytest.approx([0.8 + 0.2, 0.0, 0.2])
    assert "osr" not in scored.stats


def test_hiprag_adds_the_process_bonus_of_the_optimal_steps(policy, judge):
    scored = _scorer({"kind": "hiprag"}, judge).score(ROLLOUTS, policy)
    assert scored.verdicts is not None
    optimal = count_optimal(scored.verdicts[0], "both")
    assert optimal.n_steps == 3
    assert scored.components["process"][0] == pytest.approx(0.4 * optimal.n_optimal / 3)
    assert scored.components["process"][1:] == [0.0, 0.0]  # broken format; wrong answer (A = 0)
    assert scored.totals == pytest.approx([sum(values) for values in zip(*scored.components.values(), strict=True)])
    assert set(scored.stats) >= {"osr", "usr", "unknown_rate", "format_rate", "cem", "search_ratio"}


def test_ablations_check_one_step_kind(policy, judge):
    over = _scorer({"kind": "hiprag", "check": "over_only"}, judge).score(ROLLOUTS, policy)
    under = _scorer({"kind": "hiprag", "check": "under_only"}, judge).score(ROLLOUTS, policy)
    assert over.stats["usr"][1] == 0 and over.stats["osr"][1] == 2  # only the search steps were judged
    assert under.stats["osr"][1] == 0 and under.stats["usr"][1] == 2


def test_a_judge_outage_gives_unknown_verdicts_and_no_bonus(policy):
    with socket.socket() as probe:  # a port nothing listens on: every judge call fails fast
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = LLMJudge(f"http://127.0.0.1:{port}/v1", "judge", None, timeout=2.0, max_retries=0)
    try:
        scored = _scorer({"kind": "hiprag"}, dead).score(ROLLOUTS, policy)
    finally:
        dead.close()
    baseline = RolloutScorer(build_reward({"kind": "search_r1"})).score(ROLLOUTS, policy)
    assert scored.components["process"] == [0.0, 0.0, 0.0]
    assert scored.totals == pytest.approx(baseline.totals)
    unknown, checked = scored.stats["unknown_rate"]
    assert checked == 4 and unknown == 4
    assert scored.stats["osr"] == (0.0, 0.0) and scored.stats["usr"] == (0.0, 0.0)


def test_hierarchical_methods_refuse_to_run_without_judges():
    with pytest.raises(ValueError, match="needs an over-search and an under-search judge"):
        RolloutScorer(build_reward({"kind": "hiprag"}))
    with pytest.raises(ValueError, match="unknown reward kind 'best'"):
        build_reward({"kind": "best"})


def test_multistage_switches_stage_at_the_configured_step(policy):
    with pytest.raises(ValueError, match="needs embed"):
        RolloutScorer(build_reward({"kind": "multistage"}))
    scorer = RolloutScorer(build_reward({"kind": "multistage", "stage_switch_step": 3, "beta": 0.3}),
                           embed=load_embedder("hashing:64").encode_queries)
    stage1 = scorer.score(ROLLOUTS[:1], policy, step=2)
    stage2 = scorer.score(ROLLOUTS[:1], policy, step=3)
    assert set(stage1.components) == {"answer", "search", "format"}
    assert stage2.components["answer"][0] < stage1.components["answer"][0]  # stage 2 charges the 2 retrievals


def test_batch_stats_are_ratios_of_sums():
    stats = batch_stats(ROLLOUTS, None)
    assert stats["format_rate"] == (2.0, 3.0)
    assert stats["cem"] == (1.0, 3.0)
    assert stats["retrieval_count"] == (2.0, 3.0)
    assert stats["steps"] == (4.0, 2.0)  # well-formed rollouts only
    assert stats["search_ratio"] == (2.0, 4.0)


class FixedJudge:
    """Every search step judged ``over`` (its re-asked answer equivalent or not), every non-search step ``correct``."""

    def __init__(self, *, over: bool, correct: bool) -> None:
        self.over, self.correct = over, correct

    def equivalent(self, pairs):
        return [Verdict(self.over) for _ in pairs]

    def verify_steps(self, steps, *, contexts=None):
        return [Verdict(self.correct) for _ in steps]

    def answer_correct(self, items):
        raise AssertionError("not used by eq. 1")


LUCKY = _rollout("lucky", [_step("non_search", "The director of Jaws was born in Cincinnati.")], "Cincinnati")


@pytest.mark.parametrize(("judge_kwargs", "fired"), [({"over": False, "correct": True}, [True, False, False, True]),
                                                      ({"over": True, "correct": False}, [False] * 4)])
def test_bonus_fired_is_the_eq1_gate_in_both_arms_whatever_lambda_p(policy, judge_kwargs, fired):
    judge = FixedJudge(**judge_kwargs)
    batch = [*ROLLOUTS, LUCKY]  # correct + well-formed, broken format, wrong answer, correct with one step
    hiprag = RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge, under_judge=judge).score(batch, policy)
    search_r1 = RolloutScorer(build_reward({"kind": "search_r1"}), over_judge=judge, under_judge=judge,
                              judge_for_metrics=True).score(batch, policy)
    for scored in (hiprag, search_r1):
        assert scored.bonus_fired == fired
        assert scored.stats["bonus_fired"] == (float(sum(fired)), 4.0)
    assert [process > 0 for process in hiprag.components["process"]] == fired  # λp = 0.4 pays where it fires
    assert search_r1.components["process"] == [0.0] * 4  # λp = 0: it would have fired, nothing paid
    shaped = process_shaped_groups(hiprag, build_reward({"kind": "hiprag"}), 4, "group")
    assert shaped == (float(any(fired)), 1.0)  # correct, malformed, wrong but well-formed: three reward levels
    # λp = 0 scores no N_corr; the statistic counts it from the verdicts and reports what λp = 0.4 would change
    assert process_shaped_groups(search_r1, build_reward({"kind": "search_r1"}), 4, "group") == shaped
    plain = RolloutScorer(build_reward({"kind": "search_r1"})).score(batch, policy)
    assert plain.bonus_fired is None and "bonus_fired" not in plain.stats  # no detection, no gate to measure


def test_batch_stats_take_per_rollout_bonus_and_answer_flags():
    stats = batch_stats(ROLLOUTS, None, bonus_fired=[True, False, None], answer_correct=[True, None, False],
                        stage=2)
    assert stats["bonus_fired"] == (1.0, 3.0)
    assert stats["answer_correct"] == (1.0, 3.0) and stats["answer_unknown_rate"] == (1.0, 3.0)
    assert stats["stage"] == (6.0, 3.0)
    assert "bonus_fired" not in batch_stats(ROLLOUTS, None)
    with pytest.raises(ValueError, match="2 bonus_fired values for 3 rollouts"):
        batch_stats(ROLLOUTS, None, bonus_fired=[True, False])


class AnswerJudgeModel(ScriptedModel):
    """Plays the multi-stage paper's LLM judge over the project's server: YES for a prediction naming Cincinnati,
    NO for Denver, a reply without a verdict for anything else."""

    def reply(self, prompt: str) -> str:
        prediction = prompt.split("Prediction:")[-1].split("\n")[0].lower()
        return "YES" if "cincinnati" in prediction else "NO" if "denver" in prediction else "It depends."


def test_multistage_answers_are_judged_by_the_llm_judge_and_unknown_is_never_correct(policy):
    from prorag.serving import create_app, serve_in_thread

    url, stop = serve_in_thread(create_app(AnswerJudgeModel(), "judge", max_batch_size=8, batch_wait_ms=2))
    try:
        with LLMJudge(url, "judge", "EMPTY", max_retries=0) as judge:
            scorer = RolloutScorer(build_reward({"kind": "multistage", "stage_switch_step": 1}),
                                   embed=load_embedder("hashing:64").encode_queries, answer_judge=judge)
            unsure = _rollout("unsure", ROLLOUTS[0].steps, "a city in Ohio")  # CEM would also say wrong
            batch = [ROLLOUTS[0], ROLLOUTS[2], unsure, ROLLOUTS[1]]  # correct, wrong, unparsable verdict, no answer
            assert answers_correct(batch, judge) == [True, False, None, False]
            stage1, stage2 = scorer.score(batch, policy, step=0), scorer.score(batch, policy, step=1)
    finally:
        stop()
    assert stage1.stats["stage"] == (4.0, 4.0) and stage2.stats["stage"] == (8.0, 4.0)  # stage 1, then stage 2
    assert stage1.stats["answer_correct"] == (1.0, 4.0)
    assert stage1.stats["answer_unknown_rate"] == (1.0, 4.0)
    # the unknown verdict is rewarded as a wrong answer: stage 2 gives -1 (eq. 11), never 1 - β·RC
    assert stage2.components["answer"][2] == -1.0
    assert stage2.components["answer"][0] == pytest.approx(1.0 - 0.3 * 2)


def test_stage_switch_zero_is_the_stage_two_only_ablation_and_says_so(caplog):
    with caplog.at_level("WARNING"):
        reward = build_reward({"kind": "multistage", "stage_switch_step": 0})
    assert reward.stage(0) == 2 and reward.stage(None) == 2  # evaluation: stage 2
    assert build_reward({"kind": "multistage"}).stage(0) == 1  # the default switches after a stage-1 step
    assert "w/o stage one" in caplog.text
