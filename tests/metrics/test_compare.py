"""Paired tests, Holm's adjustment, macro intervals and the question budget of a comparison."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from prorag.metrics.compare import holm, macro_interval, macro_mean, paired_test, questions_needed


def _exact_sign_flip_p(a: list[float], b: list[float]) -> float:
    differences = np.asarray(a) - np.asarray(b)
    observed = abs(differences.mean())
    flips = [abs((differences * np.array(signs)).mean()) for signs in itertools.product((1, -1), repeat=len(a))]
    return float(np.mean([value >= observed - 1e-12 for value in flips]))


def test_the_permutation_p_value_is_the_exact_sign_flip_test_on_few_questions():
    a = [1, 1, 1, 0, 1, 0, 1, 1]
    b = [0, 0, 1, 0, 0, 1, 0, 0]
    result = paired_test(a, b, permutation_resamples=9999)
    assert result["p_value"] == pytest.approx(_exact_sign_flip_p(a, b))
    assert result["difference"] == pytest.approx(0.5)
    assert (result["wins"], result["losses"], result["ties"]) == (5, 1, 2)
    assert result["low"] <= result["difference"] <= result["high"]


def test_identical_and_uniformly_better_arms():
    same = paired_test([1, 0, 1, 0], [1, 0, 1, 0])
    assert same["difference"] == 0 and same["p_value"] == 1.0 and same["low"] == same["high"] == 0
    better = paired_test([1] * 6, [0] * 6)
    assert better["p_value"] == pytest.approx(2 / 2**6)  # the most extreme of the 64 sign flips, both tails


def test_paired_scores_must_pair_up():
    with pytest.raises(ValueError, match="differ in length"):
        paired_test([1, 0], [1])


def test_holm_adjustment():
    assert holm([0.01, 0.04, 0.03, math.nan]) == pytest.approx([0.03, 0.06, 0.06, math.nan], nan_ok=True)
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_macro_mean_weighs_datasets_equally_and_its_interval_covers_it():
    values = pd.Series([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    datasets = pd.Series(["a", "a", "a", "a", "b", "b"])
    assert macro_mean(values, datasets) == pytest.approx((1.0 + 0.5) / 2)
    low, high = macro_interval(values, datasets, resamples=500)
    assert 0.5 <= low <= 0.75 <= high <= 1.0  # dataset a is always 1; b's mean moves in [0, 1]


def test_questions_needed_grows_as_the_difference_shrinks():
    assert questions_needed(0.1, 0.5) > questions_needed(0.2, 0.5) > 0
    assert questions_needed(0.1, 0.5) == math.ceil(((1.959964 + 0.841621) * 0.5 / 0.1) ** 2)
    assert questions_needed(0.0, 0.5) == -1
