"""SFT synthesis and LoRA SFT nodes on real questions, with the tiny random policy (plumbing).

The ``questions`` and ``index`` fixtures are in tests/pipelines/conftest.py."""


import pytest
from kedro.io import Version
from peft import PeftModel

from prorag.datasets import DirectoryDataset
from prorag.llm import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.rollout.nodes import RolloutParams, concat_trajectories, run_sft_policy_rollouts
from prorag.pipelines.sft.nodes import SftParams, train_sft
from prorag.pipelines.sft_synthesis.nodes import SftSynthesisParams, synthesize_sft_data
from prorag.protocol.hiprag import check_format

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_synthesis_excludes_evaluated_questions(questions, index):
    evaluated = [q for q in questions if q["source"] == "hotpotqa"][:2]
    records, summary = synthesize_sft_data(questions, evaluated, index, SftSynthesisParams())
    keys = {record["question_key"] for record in records}
    assert not keys & {f"{q['dataset']}/{q['id']}" for q in evaluated}
    assert summary["total"]["trajectories"] == len(records) > 0
    assert all(check_format(record["completion"])[0] == 1 for record in records)


def test_synthesis_rejects_unknown_sources(questions, index):
    with pytest.raises(ValueError, match=r"names \['bamboogle'\]"):
        synthesize_sft_data(questions, [], index, SftSynthesisParams(sources=["bamboogle"]))


@pytest.mark.slow
def test_sft_adapter_is_saved_versioned_and_rolls_out(questions, index, tmp_path):
    records, _ = synthesize_sft_data(questions, [], index, SftSynthesisParams())
    params = SftParams(model=BUNDLED_TINY_LLAMA, max_steps=2, per_device_train_batch_size=2)
    adapter_dir, curve = train_sft(records[:4], params)
    assert [point["step"] for point in curve if "loss" in point] == [1, 2]

    target = str(tmp_path / "sft_adapter")
    DirectoryDataset(filepath=target, version=Version(None, "2026-01-01T00.00.00.000Z")).save(adapter_dir)
    saved = DirectoryDataset(filepath=target, version=Version(None, None)).load()
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    assert isinstance(PeftModel.from_pretrained(model, saved), PeftModel)

    rollout = RolloutParams(
        questions={"max_per_source": 1}, policy={"model": BUNDLED_TINY_LLAMA},
        methods=[{"name": "direct", "kind": "direct", "max_new_tokens": 4}],
        trained_methods=[{"name": "agent", "kind": "agent", "step_budget": 1, "max_new_tokens_per_turn": 8,
                      "max_total_new_tokens": 8, "few_shot": False}],
        retriever="bm25")
    trajectories = run_sft_policy_rollouts(questions[:2], index, saved, rollout)
    assert {t["method"] for t in trajectories} == {"agent_sft"}
    assert len(concat_trajectories([{"a": 1}], trajectories)) == 1 + len(trajectories)


def test_method_names_are_unique_across_base_and_trained_policies():
    with pytest.raises(ValueError, match="repeated"):
        RolloutParams(methods=[{"name": "x_sft", "kind": "direct"}], trained_methods=[{"name": "x", "kind": "agent"}])
    RolloutParams(methods=[{"name": "x", "kind": "direct"}], trained_methods=[{"name": "x", "kind": "agent"}])


def test_train_sft_pipeline_evaluates_base_and_sft_together():
    train_sft_pipeline = register_pipelines()["train_sft"]
    names = {node.name for node in train_sft_pipeline.nodes}
    assert {"synthesize_sft_data", "train_sft", "run_sft_policy_rollouts", "evaluate_trajectories"} <= names
    evaluate = next(node for node in train_sft_pipeline.nodes if node.name == "evaluate_trajectories")
    assert evaluate.inputs == ["all_trajectories"]
