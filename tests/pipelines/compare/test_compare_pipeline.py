"""The compare pipeline: every arm on the same questions (trained arms from their latest adapter version, untrained
ones skipped with the pipeline that makes them), OSR/USR judging, an LLM answer judge over loopback HTTP, the
table, paired tests, report and plots — with the tiny random policy (plumbing, fast)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kedro.io.core import Version
from matplotlib.figure import Figure

from prorag.agent import producing_policy
from prorag.agent.trajectory import Rollout
from prorag.config_loader import ProjectConfigLoader as OmegaConfigLoader
from prorag.data import load_questions
from prorag.datasets import DirectoryDataset, LatestVersionsDataset
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.compare.nodes import (
    judge_compare_answers,
    report_comparison,
    run_compare_rollouts,
    select_compare_questions,
)
from prorag.pipelines.compare.params import CompareParams
from prorag.pipelines.kg_extraction.params import KgExtractionParams
from prorag.pipelines.reward_judging.nodes import judge_trajectories
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.pipelines.tearag.params import TeaRAGParams
from prorag.rewards.hiprag import HiPRAGSettings
from prorag.serving import create_app, serve_in_thread
from prorag.specs import PolicySpec, TrainedAgentSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROJECT_ROOT = Path(__file__).resolve().parents[3]
RAW = PROJECT_ROOT / "data" / "01_raw"
TINY = PolicySpec(model=BUNDLED_TINY_LLAMA, batch_size=8)
AGENT = TrainedAgentSpec(step_budget=2, max_new_tokens_per_turn=16, max_total_new_tokens=32)
SOURCES = ("hotpotqa", "popqa", "nq")
METHODS = {  # resolved methods entries (prorag.methods.resolve_parameters), as the compare node reads them
    "hiprag": {"agent": AGENT.model_dump(), "retriever": {"kind": "bm25", "top_k": 3}},
    "search_r1": {"agent": AGENT.model_dump(), "retriever": {"kind": "bm25", "top_k": 3}},
    "tearag": {"agent": TeaRAGParams().agent.model_dump(), "retriever": {"kind": "kag", "top_k": 3}},
}


def _params(**overrides: Any) -> CompareParams:
    values: dict[str, Any] = {
        "questions": {"max_per_source": 2},
        "retriever": {"kind": "bm25"},
        "arms": [
            {"name": "direct", "method": {"kind": "direct", "max_new_tokens": 8}},
            {"name": "standard_rag", "method": {"kind": "standard_rag", "max_new_tokens": 8}},
            {"name": "hiprag_base", "method": {"kind": "agent", "step_budget": 2, "max_new_tokens_per_turn": 16,
                                               "max_total_new_tokens": 32}},
            {"name": "hiprag_sft", "method": "hiprag", "adapter": "sft_adapter"},
            {"name": "search_r1_rl", "method": "search_r1", "adapter": "search_r1_adapter"},
            {"name": "tearag_ip_dpo", "method": "tearag", "adapter": "sft_adapter"},
        ],
        "bootstrap_resamples": 200, "permutation_resamples": 999,
    }
    return CompareParams(**{**values, **overrides})


@pytest.fixture(scope="module")
def question_records() -> list[dict[str, Any]]:
    return [q.to_dict() for name in SOURCES for q in load_questions(RAW / "qa" / f"{name}.jsonl")[:3]]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, tiny_lora_adapter: str) -> dict[str, dict[str, Any]]:
    """sft_adapter saved as a versioned dataset; search_r1_adapter and the knowledge graph never trained."""
    root = tmp_path_factory.mktemp("models")
    DirectoryDataset(filepath=str(root / "sft_adapter"), version=Version(None, None)).save(tiny_lora_adapter)
    entries = {
        "sft_adapter": {"type": "prorag.datasets.DirectoryDataset", "filepath": str(root / "sft_adapter"),
                        "made_by": "train_sft"},
        "search_r1_adapter": {"type": "prorag.datasets.DirectoryDataset",
                              "filepath": str(root / "search_r1_adapter"), "made_by": "train_search_r1"},
        "knowledge_graph": {"type": "prorag.datasets.KnowledgeGraphDataset", "filepath": str(root / "kg"),
                            "made_by": "kg_extraction"},
    }
    return LatestVersionsDataset(datasets=entries).load()


@pytest.fixture(scope="module")
def compared(question_records, index, artifacts) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    params = _params()
    selected = select_compare_questions(question_records, params)
    return run_compare_rollouts(selected, index, artifacts, params, TINY, METHODS, KgExtractionParams())


@pytest.fixture(scope="module")
def judge_url(scripted_judge_model) -> Iterator[str]:
    url, stop = serve_in_thread(create_app(scripted_judge_model, "judge-model", max_batch_size=16, batch_wait_ms=2))
    yield url
    stop()


def test_latest_versions_dataset_loads_what_exists(artifacts):
    assert Path(artifacts["sft_adapter"]["data"], "adapter_config.json").is_file()
    assert artifacts["sft_adapter"]["version"]
    assert artifacts["search_r1_adapter"] == {"data": None, "version": None, "made_by": "train_search_r1"}
    assert artifacts["knowledge_graph"]["data"] is None


def test_every_arm_answers_the_same_questions_and_untrained_arms_say_what_makes_them(compared, artifacts):
    records, arms = compared
    status = dict(zip(arms["arm"], arms["status"], strict=True))
    assert status == {"direct": "ran", "standard_rag": "ran", "hiprag_base": "ran", "hiprag_sft": "ran",
                      "search_r1_rl": "skipped", "tearag_ip_dpo": "skipped"}
    reasons = dict(zip(arms["arm"], arms["reason"], strict=True))
    assert reasons["search_r1_rl"] == ("search_r1_adapter has no version yet: "
                                       "run `kedro run --pipelines=train_search_r1` first")
    assert reasons["tearag_ip_dpo"] == ("knowledge_graph has no version yet: "
                                        "run `kedro run --pipelines=kg_extraction` first")
    assert arms.set_index("arm").loc["hiprag_sft", "adapter_version"]
    keys = {method: {r["question_key"] for r in records if r["method"] == method} for method in status}
    assert len(keys["direct"]) == 2 * len(SOURCES)
    assert keys["direct"] == keys["standard_rag"] == keys["hiprag_base"] == keys["hiprag_sft"]
    sft = [Rollout.from_dict(r) for r in records if r["method"] == "hiprag_sft"]
    assert all(producing_policy(r).adapter == artifacts["sft_adapter"]["data"] for r in sft)
    assert all(producing_policy(Rollout.from_dict(r)).adapter is None for r in records if r["method"] == "direct")
    assert all(r.protocol == "hiprag" and r.generated_tokens <= 32 + 16 for r in sft)


def test_an_untrained_arm_is_an_error_when_skipping_is_off(question_records, index, artifacts):
    params = _params(skip_untrained=False)
    with pytest.raises(ValueError, match=r"search_r1_rl.*train_search_r1"):
        run_compare_rollouts(question_records[:1], index, artifacts, params, TINY, METHODS, KgExtractionParams())


def test_table_tests_report_and_plots(compared, index, tmp_path):
    records, arms = compared
    _, _, judge_metrics = judge_trajectories(records, index, RewardJudgingParams(), HiPRAGSettings(), TINY)
    params = _params()
    table, tests, report, *figures, metrics = report_comparison(records, arms, judge_metrics,
                                                                judge_compare_answers(records, params), params)
    ran = ["direct", "standard_rag", "hiprag_base", "hiprag_sft"]
    assert list(dict.fromkeys(table["method"])) == ran
    assert set(table["dataset"]) == {*SOURCES, "macro"}
    macro = table[table["dataset"] == "macro"].set_index("method")
    assert (macro["n"] == 2 * len(SOURCES)).all()
    for metric in ("cem", "em", "f1"):
        assert (macro[f"{metric}_low"] <= macro[metric] + 1e-9).all()
        assert (macro[metric] <= macro[f"{metric}_high"] + 1e-9).all()
    assert macro.loc[["direct", "standard_rag"], "osr"].isna().all()  # baselines have no steps to judge
    assert macro.loc["hiprag_base", "format_rate"] >= 0
    assert len(tests) == 3 * len(ran) * (len(ran) - 1) // 2
    assert tests["p_holm"].dropna().ge(tests["p_value"].dropna() - 1e-12).all()
    assert "## Against standard_rag (paired, CEM)" in report
    assert "search_r1_adapter has no version yet" in report
    assert set(metrics) == set(ran) and set(metrics["hiprag_sft"]) == {*SOURCES, "macro"}
    assert metrics["hiprag_sft"]["macro"]["cem"] == pytest.approx(macro.loc["hiprag_sft", "cem"])
    for number, figure in enumerate(figures):
        assert isinstance(figure, Figure)
        figure.savefig(tmp_path / f"{number}.png")
        assert (tmp_path / f"{number}.png").stat().st_size > 1000


def _rollout(key: str, answer: str) -> dict[str, Any]:
    return Rollout(question_key=f"popqa/{key}", question_id=key, dataset="popqa", question=f"Question {key}?",
                   golden_answers=("Paris",), method="standard_rag", protocol="standard_rag", prompt="",
                   prompt_token_ids=[], completion=answer, segments=[], steps=None, format_ok=True, n_steps=0,
                   answer=answer, stop_reason="answer", retrieval_count=1, queries=[], retrieved_ids=[],
                   generated_tokens=3, context_tokens=10, tag_tokens=0, turns=1).to_dict()


def test_llm_answer_judge_over_loopback_http_and_unknown_is_never_correct(judge_url, tmp_path):
    records = [_rollout("a", "Paris"), _rollout("b", "Lyon"), _rollout("c", "garble")]
    params = _params(answer_judge={"kind": "llm", "base_url": judge_url, "model": "judge-model", "api_key_env": None,
                                   "cache_path": str(tmp_path / "cache.sqlite"), "max_retries": 0, "timeout": 10})
    verdicts = judge_compare_answers(records, params)
    assert list(verdicts["correct"]) == [True, False, None]
    assert verdicts["error"].iloc[2]  # the unparsable reply says why it is unknown
    arms = pd.DataFrame([{"arm": name, "status": "ran", "reason": "", "adapter": "", "adapter_version": ""}
                         for name in ("direct", "standard_rag")])
    table, _, report, *_ = report_comparison(records, arms, {}, verdicts, params)
    row = table[(table["method"] == "standard_rag") & (table["dataset"] == "macro")].iloc[0]
    assert row["lasj"] == pytest.approx(0.5)  # 1 of the 2 known verdicts; the unknown one is left out
    assert row["lasj_unknown"] == pytest.approx(1 / 3)
    assert "judge-model" in report and "never as correct" in report


def test_the_compare_pipeline_and_its_catalog_agree():
    pipelines = register_pipelines()
    assert {"compare", "train_search_r1"} <= set(pipelines)
    assert "search_r1_adapter" in pipelines["train_search_r1"].all_outputs()
    assert "params:methods.search_r1.reward" in pipelines["train_search_r1"].all_inputs()
    catalog = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base", default_run_env="local")["catalog"]
    for name, entry in catalog["trained_artifacts"]["datasets"].items():
        assert (entry["type"], entry["filepath"]) == (catalog[name]["type"], catalog[name]["filepath"]), name
        assert entry["made_by"] in pipelines and name in pipelines[entry["made_by"]].all_outputs(), name
    for output in {name for name in pipelines["compare"].all_outputs() if not name.endswith("_metrics")}:
        assert output in catalog, output
    parameters = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base", default_run_env="local")["parameters"]
    CompareParams(**parameters["compare"])
