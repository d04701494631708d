"""The TeaRAG nodes on real vendored questions with the tiny random model (plumbing), and the registered pipeline.

The ``questions`` and ``index`` fixtures are in tests/pipelines/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.kg.extraction import ExtractedTriplet
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.kg_extraction.nodes import build_kg
from prorag.pipelines.kg_extraction.params import KgExtractionParams
from prorag.pipelines.tearag.nodes import build_sft_data, run_ip_dpo_rounds, run_tearag_rollouts, train_tearag_sft
from prorag.pipelines.tearag.params import TeaRAGParams
from prorag.protocol.tearag import check_format
from prorag.rewards.base import RewardSettings
from prorag.specs import PolicySpec

POLICY = PolicySpec(model="bundled:tiny-random-llama", batch_size=8)


def _kg(tmp_path: Path) -> KgExtractionParams:
    return KgExtractionParams.model_validate({
        "extractor": {"model": "bundled:tiny-random-llama", "batch_size": 8},
        "extraction": {"max_new_tokens": 6, "chunks_per_batch": 8, "cache_path": str(tmp_path / "cache.jsonl")},
        "kag": {"chunk_top_k": 3, "triplet_top_k": 3}})


REWARD = RewardSettings.model_validate({"kind": "knowledge_matching", "similarity": "embedder:hashing:64"})
"""The method's reward IP-DPO scores with (``params:reward``: ``methods.tearag.reward`` in ``train_tearag``)."""


def _params(**overrides: object) -> TeaRAGParams:
    return TeaRAGParams.model_validate({
        "agent": {"step_budget": 1, "max_new_tokens_per_turn": 8, "max_total_new_tokens": 16},
        "retriever": {"kind": "kag", "top_k": 2},
        "sft_data": {"max_questions": 3},
        "sft": {"max_steps": 1, "per_device_train_batch_size": 1, "learning_rate": 1e-3},
        "questions": {"nq": 0, "hotpotqa_bridge": 1, "hotpotqa_comparison": 1, "musique": 1},
        "ip_dpo": {"rounds": 1, "samples_per_question": 2, "trainer": {"max_steps": 1}},
        **overrides})


def test_sft_data_excludes_the_evaluation_questions(questions, tmp_path, one_torch_thread):
    evaluated = [q for q in questions if q["source"] == "musique_train"][:1]
    records, metrics = build_sft_data(questions, evaluated, _kg(tmp_path), _params())
    keys = {record["question_key"] for record in records}
    assert f"{evaluated[0]['dataset']}/{evaluated[0]['id']}" not in keys
    assert metrics["records"] == 3 and metrics["paths"] + metrics["skipped"] == 3 and metrics["paths"] > 0
    assert metrics["golden_paragraphs"] > 0 and all(check_format(r["completion"])[0] == 1 for r in records)
    with pytest.raises(ValueError, match="select no indexed training question"):
        build_sft_data(questions, [], _kg(tmp_path), _params(sft_data={"sources": ["nq"]}))


@pytest.mark.integration
@pytest.mark.slow
def test_sft_ip_dpo_and_rollouts_chain(questions, index, tmp_path, one_torch_thread):
    kg, params = _kg(tmp_path), _params()
    evaluated = [q for q in questions if q["source"] == "hotpotqa"][:1]
    records, _ = build_sft_data(questions, evaluated, kg, params)
    adapter, curve = train_tearag_sft(records, POLICY, params)
    assert Path(adapter, "adapter_config.json").exists() and curve and "loss" in curve[0]
    chunk = index.store[0]
    graph = build_kg([ExtractedTriplet(chunk.title or "A", "is about", "B", chunk.id, True, True).to_dict()], index,
                     {"chunks": 1, "model": "m", "backend": "transformers", "prompt_id": "p",
                      "filter_ungrounded": True})
    final, metrics, pairs, samples = run_ip_dpo_rounds(questions, evaluated, index, graph, adapter, kg, POLICY,
                                                       params, REWARD)
    assert [m["step"] for m in metrics] == [1] and metrics[0]["samples"] == len(samples) == 2 * 3
    assert {"pairs_format", "pairs_easy", "pairs_hard", "reward_process", "mean_output_tokens"} <= set(metrics[0])
    assert len(pairs) == metrics[0]["pairs_total"]
    assert final == adapter or Path(final, "adapter_config.json").exists()
    trajectories = run_tearag_rollouts(evaluated, index, graph, adapter, final, kg, POLICY, params)
    assert [t["method"] for t in trajectories] == ["tearag_agent_base", "tearag_agent_sft", "tearag_agent_ip_dpo"]
    assert all(t["protocol"] == "tearag" for t in trajectories)


def test_registered_pipeline() -> None:
    pipelines = register_pipelines()
    names = {node.name for node in pipelines["train_tearag"].nodes}
    assert {"corpus_indexing.build_index", "kg_extraction.extract_kg_triplets", "tearag.build_tearag_sft_data",
            "tearag.train_tearag_sft", "tearag.run_ip_dpo_rounds", "tearag.run_tearag_rollouts",
            "evaluation.evaluate_trajectories", "reward_judging.judge_trajectories"} <= names
    assert {"tearag_evaluation_table", "tearag_ip_dpo_metrics"} <= pipelines["train_tearag"].all_outputs()
