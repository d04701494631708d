"""Reward judging re-asks over-search queries to the policy that produced each trajectory (HiPRAG §3.2), and
reports OSR/USR per dataset with the paper's average-over-datasets "all" figure."""

from __future__ import annotations

import math

import pytest

from prorag.agent import record_policy
from prorag.agent.trajectory import Rollout
from prorag.assembly import build_policy
from prorag.data.records import Passage
from prorag.judges.detection import reask_messages
from prorag.llm.generation import SamplingParams, generate_chat
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.pipelines.reward_judging.nodes import judge_trajectories
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.retrieval import build_retrieval_index
from prorag.rewards.hiprag import HiPRAGSettings
from prorag.specs import PolicySpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = PolicySpec(model=BUNDLED_TINY_LLAMA, batch_size=4)
QUERY = "Jaws director"


@pytest.fixture(scope="module")
def adapter_dir(tiny_lora_adapter: str) -> str:
    return tiny_lora_adapter


@pytest.fixture(scope="module")
def index():
    passages = [Passage("p1", "Jaws (film)", "Jaws is a 1975 American thriller film directed by Steven Spielberg."),
                Passage("p2", "Steven Spielberg", "Steven Spielberg is an American filmmaker born in Cincinnati.")]
    return build_retrieval_index(passages, "hashing:64", show_progress=False)


def _rollout(method: str, dataset: str, key: str) -> Rollout:
    steps = [{"kind": "search", "reasoning": "Who directed Jaws?", "query": QUERY,
              "context": "Jaws is a 1975 film directed by Steven Spielberg.",
              "conclusion": "Jaws was directed by Steven Spielberg."},
             {"kind": "non_search", "reasoning": "Spielberg's birthplace.", "query": None, "context": None,
              "conclusion": "Steven Spielberg was born in Cincinnati."}]
    return Rollout(question_key=f"{dataset}/{key}", question_id=key, dataset=dataset,
                   question="Where was the director of Jaws born?", golden_answers=("Cincinnati",), method=method,
                   protocol="hiprag", prompt="", prompt_token_ids=[], completion="", segments=[], steps=steps,
                   format_ok=True, n_steps=2, answer="Cincinnati", stop_reason="answer", retrieval_count=1,
                   queries=[QUERY], retrieved_ids=[["p1"]], generated_tokens=40, context_tokens=20, tag_tokens=5,
                   turns=2)


def _reask(policy: PolicySpec) -> str:
    generator = build_policy(policy.model_copy(update={"batch_size": 1}))
    params = SamplingParams(max_new_tokens=HiPRAGSettings().reask_max_new_tokens, temperature=0.0)
    return generate_chat(generator, [reask_messages(QUERY, "instructed")], params)[0][0].text.strip()


def test_trajectories_are_reasked_to_the_policy_that_produced_them(adapter_dir, index):
    sft_policy = BASE.model_copy(update={"adapter": adapter_dir})
    records = [rollout.to_dict() for rollout in
               record_policy([_rollout("hiprag_agent", "hotpotqa", "q1")], BASE)
               + record_policy([_rollout("hiprag_agent_sft", "hotpotqa", "q1")], sft_policy)]
    settings = HiPRAGSettings(reask="instructed")  # greedy re-asks, so _reask reproduces them
    verdicts, table, _ = judge_trajectories(records, index, RewardJudgingParams(), settings, BASE)

    by_method = {record["method"]: record for record in verdicts}
    base_answer, sft_answer = _reask(BASE), _reask(sft_policy)
    assert base_answer != sft_answer  # the adapter changes the re-asked answer o′
    assert by_method["hiprag_agent"]["steps"][0]["reask_answer"].strip() == base_answer
    assert by_method["hiprag_agent_sft"]["steps"][0]["reask_answer"].strip() == sft_answer
    assert adapter_dir in by_method["hiprag_agent_sft"]["reask_policy"]
    assert adapter_dir not in by_method["hiprag_agent"]["reask_policy"]
    assert set(table["reask_policy"]) == {by_method[m]["reask_policy"] for m in by_method}
    # verdicts and their steps point at the trajectory they judge, in the input order
    assert [record["rollout_index"] for record in verdicts] == [0, 1]
    assert [step["rollout_index"] for record in verdicts for step in record["steps"]] == [0, 0, 1, 1]


def test_an_explicit_reask_policy_replaces_the_recorded_one(adapter_dir, index):
    sft_policy = BASE.model_copy(update={"adapter": adapter_dir})
    records = [rollout.to_dict() for rollout in record_policy([_rollout("hiprag_agent_sft", "hotpotqa", "q1")],
                                                              sft_policy)]
    verdicts, _, _ = judge_trajectories(records, index, RewardJudgingParams(reask_policy=BASE),
                                        HiPRAGSettings(reask="instructed"), BASE)  # greedy, so _reask reproduces it
    assert verdicts[0]["steps"][0]["reask_answer"].strip() == _reask(BASE)


def test_search_rates_per_dataset_and_their_average(index):
    # hotpotqa: a search step judged over-search (the reference judge: o′ ≈ o) is impossible to force with a random
    # model, so compare the figures with each other instead: "all" is the mean of the per-dataset rates.
    records = [rollout.to_dict() for rollout in record_policy(
        [_rollout("agent", "hotpotqa", "q1"), _rollout("agent", "hotpotqa", "q2"), _rollout("agent", "popqa", "q3")],
        BASE)]
    _, _, metrics = judge_trajectories(records, index, RewardJudgingParams(), HiPRAGSettings(), BASE)
    figures = metrics["agent"]
    assert set(figures["by_dataset"]) == {"hotpotqa", "popqa"}
    for rate in ("osr", "usr", "search_ratio"):
        per_dataset = [figures["by_dataset"][name][rate] for name in ("hotpotqa", "popqa")]
        expected = sum(value for value in per_dataset if not math.isnan(value)) / 2
        assert figures[rate] == pytest.approx(expected)
        assert f"pooled_{rate}" in figures
    assert figures["by_dataset"]["hotpotqa"]["search_steps"] == 2
