"""The compare pipeline: every arm on the same questions (trained arms from their adapter's pinned version,
untrained ones skipped with the pipeline that makes them; each adapter of the methods map an input of compare),
OSR/USR judging, an LLM answer judge over loopback HTTP, the table, paired tests, report and plots — with the tiny
random policy (plumbing, fast)."""

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
from prorag.datasets import DirectoryDataset, OptionalVersionDataset
from prorag.hooks.run_versions import optional_inputs
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.methods import compare_artifacts
from prorag.pipeline_registry import configured_methods, register_pipelines
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
from prorag.tracking.missing_inputs import Available, Missing, missing_input_line

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
def artifacts(tmp_path_factory, tiny_lora_adapter: str) -> dict[str, Any]:
    """What compare's optional inputs load as (the run-version hook wraps them in OptionalVersionDataset):
    sft_adapter saved as a versioned dataset; search_r1_adapter and the knowledge graph never trained."""
    root = tmp_path_factory.mktemp("models")
    DirectoryDataset(filepath=str(root / "sft_adapter"), version=Version(None, None)).save(tiny_lora_adapter)
    sft = OptionalVersionDataset(dataset={"type": "prorag.datasets.DirectoryDataset",
                                          "filepath": str(root / "sft_adapter")})
    never = OptionalVersionDataset(dataset=DirectoryDataset(filepath=str(root / "search_r1_adapter"),
                                                            version=Version(None, None)),
                                   reason=missing_input_line("search_r1_adapter", ["train_search_r1"]))
    return {"sft_adapter": sft.load(), "search_r1_adapter": never.load(),
            "knowledge_graph": Missing(missing_input_line("knowledge_graph", ["kg_extraction"]))}


@pytest.fixture(scope="module")
def compared(question_records, index, artifacts) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    params = _params()
    selected = select_compare_questions(question_records, params)
    return run_compare_rollouts(selected, index, params, TINY, METHODS, KgExtractionParams(), **artifacts)


@pytest.fixture(scope="module")
def judge_url(scripted_judge_model) -> Iterator[str]:
    url, stop = serve_in_thread(create_app(scripted_judge_model, "judge-model", max_batch_size=16, batch_wait_ms=2))
    yield url
    stop()


def test_optional_inputs_load_what_exists(artifacts):
    assert isinstance(artifacts["sft_adapter"], Available) and artifacts["sft_adapter"].version
    assert Path(artifacts["sft_adapter"].data, "adapter_config.json").is_file()
    assert artifacts["search_r1_adapter"] == Missing("search_r1_adapter has no version yet: "
                                                     "run `kedro run --pipelines=train_search_r1` first")


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
    assert arms.set_index("arm").loc["hiprag_sft", "adapter_version"] == artifacts["sft_adapter"].version
    keys = {method: {r["question_key"] for r in records if r["method"] == method} for method in status}
    assert len(keys["direct"]) == 2 * len(SOURCES)
    assert keys["direct"] == keys["standard_rag"] == keys["hiprag_base"] == keys["hiprag_sft"]
    sft = [Rollout.from_dict(r) for r in records if r["method"] == "hiprag_sft"]
    assert all(producing_policy(r).adapter == artifacts["sft_adapter"].data for r in sft)
    assert all(producing_policy(Rollout.from_dict(r)).adapter is None for r in records if r["method"] == "direct")
    assert all(r.protocol == "hiprag" and r.generated_tokens <= 32 + 16 for r in sft)


def test_an_untrained_arm_is_an_error_when_skipping_is_off(question_records, index, artifacts):
    params = _params(skip_untrained=False)
    with pytest.raises(ValueError, match=r"search_r1_rl.*train_search_r1"):
        run_compare_rollouts(question_records[:1], index, params, TINY, METHODS, KgExtractionParams(), **artifacts)


def test_an_adapter_this_run_trained_is_used_as_it_is(question_records, index, artifacts):
    """``kedro run --pipelines=train_sft,compare``: compare gets the adapter the run saved (plain data)."""
    params = _params(arms=_params().arms[1:2] + _params().arms[3:4])
    _, arms = run_compare_rollouts(question_records[:1], index, params, TINY, METHODS, KgExtractionParams(),
                                   sft_adapter=artifacts["sft_adapter"].data)
    assert list(arms["status"]) == ["ran", "ran"] and list(arms["adapter_version"]) == ["", ""]


def test_an_arm_naming_an_adapter_compare_does_not_take_is_an_error(question_records, index, artifacts):
    params = _params(arms=[*_params().arms[:2], {"name": "x", "method": "hiprag", "adapter": "nowhere_adapter"}])
    with pytest.raises(ValueError, match=r"'nowhere_adapter', not an input of compare"):
        run_compare_rollouts(question_records[:1], index, params, TINY, METHODS, KgExtractionParams(), **artifacts)


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
    # each adapter of the methods map is its own input of compare (kedro-viz draws adapter → compare), optional
    # there, and written by its method's training pipeline
    methods = configured_methods(PROJECT_ROOT)
    artifacts = compare_artifacts(methods)
    assert {method["adapter"] for method in methods.values()} | {"sft_adapter", "knowledge_graph"} == set(artifacts)
    (rollouts,) = [node for node in pipelines["compare"].nodes if node.name == "compare.run_compare_rollouts"]
    assert set(artifacts) <= set(rollouts.inputs)
    assert optional_inputs(pipelines["compare"]) == set(artifacts)
    assert "trained_artifacts" not in catalog and "trained_artifacts" not in pipelines["compare"].inputs()
    for name in artifacts:
        assert catalog[name]["versioned"] is True, name
        assert any(name in pipe.all_outputs() for pipe in pipelines.values()), name
    for name, method in methods.items():
        assert method["adapter"] in pipelines[f"train_{name}"].all_outputs(), name
    # a run that trains an adapter and compares: compare reads the trained one, which is then required
    assert "sft_adapter" not in optional_inputs(pipelines["train_rl"] + pipelines["compare"])
    for output in {name for name in pipelines["compare"].all_outputs() if not name.endswith("_metrics")}:
        assert output in catalog, output
    parameters = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base", default_run_env="local")["parameters"]
    CompareParams(**parameters["compare"])
