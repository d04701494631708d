"""A run's result from the outputs it saves: the summary tables, compare's macro rows, key numbers per method."""

from __future__ import annotations

import pandas as pd

from prorag.tracking.result import RunResult


def _row(method: str, dataset: str, cem: float) -> dict[str, object]:
    return {"method": method, "dataset": dataset, "n": 4, "cem": cem, "cem_low": cem - 0.1, "cem_high": cem + 0.1,
            "em": cem, "f1": cem, "format_rate": 1.0, "avg_steps": 2.0, "avg_retrieval_count": 1.25,
            "avg_generated_tokens": 40.0, "context_tokens_per_retrieval": 90.0, "osr": 0.5, "usr": 0.25,
            "unknown_rate": 0.0}


def test_compare_gives_its_macro_table_and_its_arms_key_numbers():
    result = RunResult()
    table = pd.DataFrame([_row("standard_rag", "popqa", 0.3), _row("standard_rag", "macro", 0.3),
                          _row("hiprag_sft", "popqa", 0.6), _row("hiprag_sft", "macro", 0.6)])
    result.observe("comparison_table", table)
    result.observe("comparison_metrics", {"hiprag_sft": {"macro": {"cem": 0.6, "avg_retrieval_count": 1.25,
                                                                   "osr": 0.5, "usr": 0.25}}})
    result.observe("evaluation_table", table)  # not a result table
    text = result.markdown()
    assert text.startswith("### comparison_table\n\n| arm | CEM |") and "evaluation_table" not in text
    assert "| hiprag_sft | 0.600 [0.500, 0.700] |" in text and "popqa" not in text  # the macro rows only
    assert result.key_metrics() == {"result.hiprag_sft.cem": 0.6, "result.hiprag_sft.retrievals": 1.25,
                                    "result.hiprag_sft.osr": 0.5, "result.hiprag_sft.usr": 0.25}
    assert "| hiprag_sft | 50% | 25% |" in text  # the search rates, also when only compare judged


def test_a_run_without_results_has_none():
    result = RunResult()
    result.observe("sft_metrics", [{"step": 1, "loss": 1.0}])
    result.observe("data_report_metrics", {"questions_total": 3})
    assert (result.markdown(), result.key_metrics(), result.search_rates()) == ("", {}, [])
