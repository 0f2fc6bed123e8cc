"""The statistics every benchmark reports its ratios with (bench/common.py)."""

from __future__ import annotations

import pytest

from bench.common import median, paired_ratio


def test_paired_ratio_keeps_pairs_measured_together():
    # a is 5% faster than b. The machine's speed drifts from rep to rep (x1, x2, x1.5), and in rep 2
    # it halved between a's sample and b's.
    a = [105.0, 210.0, 157.5]
    b = [100.0, 100.0, 150.0]
    assert paired_ratio(a, b) == pytest.approx(1.05)
    # The medians of the two lists come from different reps: their ratio is off by half.
    assert median(a) / median(b) == pytest.approx(1.575)


def test_paired_ratio_is_the_median_of_the_pairs():
    assert paired_ratio([1.0, 3.0, 10.0], [1.0, 1.0, 1.0]) == 3.0


@pytest.mark.parametrize("a, b", [([1.0, 2.0], [1.0]), ([], [])])
def test_paired_ratio_needs_pairs(a, b):
    with pytest.raises(ValueError, match="as many samples"):
        paired_ratio(a, b)
