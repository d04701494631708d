from __future__ import annotations

import pytest

from prorag.rewards.spre import spre_value


def test_spre_matches_hand_computation() -> None:
    # (1.0·0.9² + 0.5·0.9³ + 0·0.9) / 3 = (0.81 + 0.3645) / 3
    assert spre_value([1.0, 0.5, 0.0], [2, 3, 1], 0.9) == pytest.approx(1.1745 / 3, abs=1e-12)  # = 0.3915
    assert spre_value([1.0], [5], 1.0) == 1.0
    assert spre_value([0.8, 0.4], [0, 0], 0.5) == pytest.approx(0.6)


@pytest.mark.parametrize(("values", "steps", "alpha"), [
    ([], [], 0.9), ([1.0], [1, 2], 0.9), ([1.5], [1], 0.9), ([1.0], [-1], 0.9), ([1.0], [1], 0.0),
    ([1.0], [1], 1.1), ([float("nan")], [1], 0.9),
])
def test_spre_rejects_bad_input(values: list[float], steps: list[int], alpha: float) -> None:
    with pytest.raises(ValueError):
        spre_value(values, steps, alpha)
