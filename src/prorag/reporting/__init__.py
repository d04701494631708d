"""Reports a researcher reads: the method comparison (tables, Markdown, plots)."""

from prorag.reporting.comparison import (
    ComparisonInputs,
    accuracy_figure,
    comparison_table,
    efficiency_figure,
    render_report,
    search_figure,
)

__all__ = ["ComparisonInputs", "accuracy_figure", "comparison_table", "efficiency_figure", "render_report",
           "search_figure"]
