"""SFT synthesis and LoRA SFT nodes on real questions, with the tiny random policy (plumbing).

The ``questions`` and ``index`` fixtures are in tests/pipelines/conftest.py."""


import pytest
from kedro.io import Version
from peft import PeftModel

from prorag.datasets import DirectoryDataset
from prorag.llm import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.compare.nodes import select_compare_questions
from prorag.pipelines.compare.params import CompareParams
from prorag.pipelines.rollout.nodes import concat_trajectories, run_trained_rollouts, select_evaluated_questions
from prorag.pipelines.rollout.params import RolloutParams
from prorag.pipelines.sft.nodes import train_sft
from prorag.pipelines.sft.params import SftParams
from prorag.pipelines.sft_synthesis.nodes import synthesize_sft_data
from prorag.pipelines.sft_synthesis.params import SftSynthesisParams
from prorag.protocol.hiprag import check_format
from prorag.specs import PolicySpec, TrainedAgentSpec

AGENT = TrainedAgentSpec()
COMPARE = CompareParams(arms=[{"name": "standard_rag", "method": {"kind": "standard_rag"}},
                              {"name": "sft", "method": "hiprag", "adapter": "sft_adapter"}])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_synthesis_excludes_evaluated_questions(questions, index):
    evaluated = [q for q in questions if q["source"] == "hotpotqa"][:2]
    records, summary = synthesize_sft_data(questions, evaluated, index, SftSynthesisParams(), AGENT)
    keys = {record["question_key"] for record in records}
    assert not keys & {f"{q['dataset']}/{q['id']}" for q in evaluated}
    assert summary["total"]["trajectories"] == len(records) > 0
    assert all(check_format(record["completion"])[0] == 1 for record in records)


def test_synthesis_excludes_the_compare_questions(questions, index):
    """The compare pipeline answers the first dev questions of every source; SFT never trains on them."""
    compare = COMPARE.model_copy(update={"questions": COMPARE.questions.model_copy(update={"max_per_source": 2})})
    evaluated = select_evaluated_questions([], select_compare_questions(questions, compare))
    relabelled = [{**q, "split": "train (relabelled: SFT synthesis refuses dev questions)"} for q in questions]
    records, _ = synthesize_sft_data(relabelled, evaluated, index,
                                     SftSynthesisParams(sources=["musique_train", "hotpotqa"]), AGENT)
    hotpotqa = [f"hotpotqa/{q['id']}" for q in questions if q["source"] == "hotpotqa"]
    synthesized = {record["question_key"] for record in records}
    assert not set(hotpotqa[:2]) & synthesized
    assert set(hotpotqa[2:]) <= synthesized


def test_synthesis_refuses_dev_and_test_questions(questions, index):
    with pytest.raises(ValueError, match="not of a train split"):
        synthesize_sft_data(questions, [], index, SftSynthesisParams(sources=["musique_train", "hotpotqa"]), AGENT)


def test_synthesis_rejects_unknown_sources(questions, index):
    with pytest.raises(ValueError, match=r"names \['bamboogle'\]"):
        synthesize_sft_data(questions, [], index, SftSynthesisParams(sources=["bamboogle"]), AGENT)


@pytest.mark.integration
@pytest.mark.slow
def test_sft_adapter_is_saved_versioned_and_rolls_out(questions, index, tmp_path):
    records, _ = synthesize_sft_data(questions, [], index, SftSynthesisParams(), AGENT)
    params = SftParams(max_steps=2, per_device_train_batch_size=2)
    policy = PolicySpec(model=BUNDLED_TINY_LLAMA)
    adapter_dir, curve = train_sft(records[:4], params, policy, AGENT)
    assert [point["step"] for point in curve if "loss" in point] == [1, 2]

    target = str(tmp_path / "sft_adapter")
    DirectoryDataset(filepath=target, version=Version(None, "2026-01-01T00.00.00.000Z")).save(adapter_dir)
    saved = DirectoryDataset(filepath=target, version=Version(None, None)).load()
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    assert isinstance(PeftModel.from_pretrained(model, saved), PeftModel)

    rollout = RolloutParams(questions={"max_per_source": 1},
                            methods=[{"name": "direct", "kind": "direct", "max_new_tokens": 4}],
                            retriever={"kind": "bm25"})
    agent = TrainedAgentSpec(name="agent", step_budget=1, max_new_tokens_per_turn=8, max_total_new_tokens=8)
    trajectories = run_trained_rollouts(questions[:2], index, saved, rollout, policy, agent, "sft")
    assert {t["method"] for t in trajectories} == {"agent_sft"}
    assert len(concat_trajectories([{"method": "direct"}], trajectories)) == 1 + len(trajectories)


def test_method_names_are_unique_across_base_and_trained_policies():
    with pytest.raises(ValueError, match="more than one trajectory set"):
        concat_trajectories([{"method": "x_sft"}], [{"method": "x_sft"}, {"method": "x_sft"}])
    assert len(concat_trajectories([{"method": "x"}], [{"method": "x_sft"}])) == 2
    with pytest.raises(ValueError, match="unique"):
        RolloutParams(methods=[{"name": "x", "kind": "direct"}, {"name": "x", "kind": "agent"}])


def test_train_sft_pipeline_evaluates_base_and_sft_together():
    train_sft_pipeline = register_pipelines()["train_sft"]
    names = {node.name for node in train_sft_pipeline.nodes}
    assert {"sft_synthesis.synthesize_sft_data", "sft.train_sft", "sft.run_policy_rollouts",
            "evaluation.evaluate_trajectories"} <= names
    evaluate = next(node for node in train_sft_pipeline.nodes if node.name == "evaluation.evaluate_trajectories")
    assert evaluate.inputs == ["all_trajectories"]
