"""The result of one ``kedro run``, gathered from the outputs it saves: its result tables (``*evaluation_summary``,
the macro rows of ``comparison_table``) and a few key numbers per method (CEM, retrievals, OSR and USR when
judging ran). The MLflow hook puts it on the parent run, the result screen prints it. Kedro-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

import pandas as pd

from prorag.reporting.cells import percent
from prorag.reporting.comparison import macro_table_lines
from prorag.tracking.mlflow_utils import metric_series, sanitize_metric_key
from prorag.tracking.runs import split_method_metrics

KEY_METRICS: Final = {
    "cem": ("evaluation.macro.cem",),
    "retrievals": ("evaluation.macro.avg_retrieval_count",),
    "osr": ("judge.osr", "evaluation.macro.osr"),
    "usr": ("judge.usr", "evaluation.macro.usr"),
}
"""Per method, the numbers a run's result shows (``result.<method>.<name>`` on the parent run) and the method-run
keys they are read from, first found first: the reward-judging pipeline's ``judge.*``, ``compare``'s macro row."""
RESULT_PREFIX: Final = "result"
SUMMARY_SUFFIX: Final = "evaluation_summary"
COMPARISON_TABLE: Final = "comparison_table"


@dataclass
class RunResult:
    """What a run found, in the order its outputs were saved."""

    tables: dict[str, str] = field(default_factory=dict)
    """Output name → its result table as Markdown."""
    methods: dict[str, dict[str, float]] = field(default_factory=dict)
    """Method → :data:`KEY_METRICS` name → value (only those its outputs had)."""

    def observe(self, name: str, data: Any) -> None:
        """Take what a saved output holds of the result (nothing, for most outputs)."""
        if name.endswith(SUMMARY_SUFFIX) and isinstance(data, str):
            self.tables[name] = data.strip()
        elif name == COMPARISON_TABLE and isinstance(data, pd.DataFrame) and {"dataset", "method"} <= set(data):
            self.tables[name] = "\n".join(macro_table_lines(data))
        split = split_method_metrics(name, data)
        if split is None:
            return
        prefix, methods, _ = split
        for method, values in methods.items():
            flat = {key: value for key, value, _ in metric_series(f"{prefix}_metrics", values)}
            found = self.methods.setdefault(method, {})
            for short, keys in KEY_METRICS.items():
                value = next((flat[key] for key in keys if key in flat), None)
                if value is not None:
                    found[short] = value

    def key_metrics(self) -> dict[str, float]:
        """``result.<method>.<name>`` → value, for the parent MLflow run."""
        return {sanitize_metric_key(f"{RESULT_PREFIX}.{method}.{short}"): value
                for method, values in self.methods.items() for short, value in values.items()}

    def search_rates(self) -> list[str]:
        """OSR and USR per judged method as Markdown table lines; empty when no judging ran."""
        judged = {method: values for method, values in self.methods.items() if "osr" in values or "usr" in values}
        if not judged:
            return []
        return ["| method | OSR (over-search) | USR (under-search) |", "|---|---:|---:|",
                *(f"| {method} | {percent(values.get('osr', math.nan))} | {percent(values.get('usr', math.nan))} |"
                  for method, values in judged.items())]

    def markdown(self) -> str:
        """The result tables, each under its output's name, and the search rates as one Markdown text (empty when
        the run saved none)."""
        parts = [f"### {name}\n\n{text}" for name, text in self.tables.items()]
        rates = self.search_rates()
        if rates:
            parts.append("### Search behaviour (judged)\n\n" + "\n".join(rates))
        return "\n\n".join(parts) + "\n" if parts else ""
