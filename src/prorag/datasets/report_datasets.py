"""kedro-datasets' CSV and text datasets with the kedro-viz previews a run's reports need: a CSV table whose preview
shows every method, a Markdown report previewed as its table."""

from __future__ import annotations

import re
from typing import Any

from kedro.io.core import DatasetError
from kedro_datasets._typing import TablePreview
from kedro_datasets.pandas import CSVDataset
from kedro_datasets.text import TextDataset

from prorag.datasets.fsspec_base import spread_rows, table_preview

_SEPARATOR = re.compile(r"^\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*$")
"""The line under a Markdown table's header: ``|---|---:|``."""


class CSVTableDataset(CSVDataset):
    """``pandas.CSVDataset`` whose preview can take its rows in turn from each value of a column
    (``preview_args: {nrows: 12, spread_by: method}``), so that methods listed after the baselines show too."""

    def preview(self, nrows: int = 5, spread_by: str | None = None) -> TablePreview:
        """The first ``nrows`` rows (``orient="split"``, as ``pandas.CSVDataset``), or with ``spread_by`` rows taken
        in turn from each of that column's values, in order of first appearance (the whole file is read)."""
        if spread_by is None:
            return super().preview(nrows)
        frame = self.load()
        if spread_by not in frame.columns:
            raise DatasetError(f"{self._filepath}: no column {spread_by!r} to spread the preview by "
                               f"(columns: {', '.join(map(str, frame.columns))})")
        picked = spread_rows(enumerate(frame.to_dict("records")), spread_by, nrows)
        return TablePreview(frame.iloc[[index for index, _ in picked]].to_dict(orient="split"))


class MarkdownDataset(TextDataset):
    """``text.TextDataset`` of a Markdown report, which kedro-viz previews as the report's table."""

    def preview(self, table: int = 0) -> TablePreview:
        """The report's ``table``-th Markdown table (0: the first) as a kedro-viz table: its header as the
        columns, a row per table row; a report without that table previews as its non-empty lines."""
        text = self.load()
        tables = markdown_tables(text)
        if table < len(tables):
            columns, rows = tables[table]
            return table_preview(columns, rows)
        if tables:
            raise DatasetError(f"{self._filepath}: preview table {table} asked for, the report has {len(tables)}")
        return table_preview(["text"], [[line] for line in text.splitlines() if line.strip()])


def markdown_tables(text: str) -> list[tuple[list[str], list[list[Any]]]]:
    """Every pipe table of a Markdown text as ``(header cells, rows of cells)``, rows padded or cut to the
    header's width."""
    lines = text.splitlines()
    tables = []
    start = 0
    while start < len(lines) - 1:
        if lines[start].lstrip().startswith("|") and _SEPARATOR.match(lines[start + 1].strip()):
            columns = _cells(lines[start])
            end = start + 2
            rows = []
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                cells = _cells(lines[end])
                rows.append((cells + [""] * len(columns))[:len(columns)])
                end += 1
            tables.append((columns, rows))
            start = end
        else:
            start += 1
    return tables


def _cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|")
    inner = inner[:-1] if inner.endswith("|") else inner
    return [cell.strip() for cell in inner.split("|")]
