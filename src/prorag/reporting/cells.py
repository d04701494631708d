"""Markdown table cells shared by the reports: a missing value is "–", a value with its interval "v [low, high]"."""

from __future__ import annotations

import math
from typing import Any


def missing(value: Any) -> bool:
    """None or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def with_interval(row: Any, metric: str, *, percent: bool = False) -> str:
    """``row[metric]`` with ``row[metric_low]``/``row[metric_high]`` (3 decimals, or a percentage with 1)."""
    value, low, high = (row.get(name, math.nan) for name in (metric, f"{metric}_low", f"{metric}_high"))
    scale, digits = (100.0, 1) if percent else (1.0, 3)
    if missing(value):
        return "–"
    if missing(low):
        return f"{scale * value:.{digits}f}"
    return f"{scale * value:.{digits}f} [{scale * low:.{digits}f}, {scale * high:.{digits}f}]"


def percent(value: Any, digits: int = 0) -> str:
    """``value`` (a share) as a percentage, "–" when missing."""
    return "–" if missing(value) else f"{100 * value:.{digits}f}%"
