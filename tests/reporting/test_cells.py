"""The shared Markdown cells of the reports."""

import math

import pandas as pd

from prorag.reporting.cells import missing, percent, with_interval


def test_with_interval_formats_value_and_interval_or_a_dash():
    row = pd.Series({"cem": 0.2, "cem_low": 0.1, "cem_high": 0.3, "osr": 0.125, "osr_low": math.nan})
    assert with_interval(row, "cem") == "0.200 [0.100, 0.300]"
    assert with_interval(row, "cem", percent=True) == "20.0 [10.0, 30.0]"
    assert with_interval(row, "osr") == "0.125"
    assert with_interval({"usr": None}, "usr") == "–"


def test_percent_and_missing():
    assert percent(0.9) == "90%" and percent(0.125, digits=1) == "12.5%"
    assert percent(math.nan) == "–" and missing(None) and missing(math.nan) and not missing(0.0)
