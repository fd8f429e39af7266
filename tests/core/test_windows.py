"""Specification of counter increases, histogram deltas and bucket quantiles over windows."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.snapshot import Histogram
from exporter.core.windows import (
    BucketCounts,
    bucket_quantile,
    counter_increase,
    histogram_increase,
    merge_buckets,
    window_increase,
)

INF = math.inf
BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, INF)


def hist(counts: list[float], total: float | None = None) -> Histogram:
    """Build a cumulative histogram over BOUNDS from per-bucket counts."""
    cumulative: list[float] = []
    running = 0.0
    for count in counts:
        running += count
        cumulative.append(running)
    return Histogram(BOUNDS, tuple(cumulative), running, total if total is not None else 0.0)


def test_counter_increase_is_the_difference_when_the_counter_grows() -> None:
    """A growing counter increases by the difference of its samples."""
    assert counter_increase(10.0, 15.0) == 5.0


def test_counter_increase_after_a_reset_counts_from_zero() -> None:
    """A counter that went down restarted: its new value is the increase (no negative spike)."""
    assert counter_increase(1000.0, 5.0) == 5.0


def test_counter_increase_with_a_detected_restart_counts_from_zero_even_if_higher() -> None:
    """A restart detected elsewhere makes the whole new value the increase."""
    assert counter_increase(3.0, 7.0, reset=True) == 7.0


def test_window_increase_sums_pairs_across_a_reset() -> None:
    """Increases before and after a restart add up; the reset never subtracts."""
    assert window_increase([0.0, 4.0, 10.0, 2.0, 5.0]) == 10.0 + 5.0


def test_window_increase_ignores_gaps_without_inventing_values() -> None:
    """A missing sample (target down) breaks no pair that still has both sides."""
    assert window_increase([1.0, None, 4.0, 6.0]) == 3.0 + 2.0


def test_window_increase_counts_from_zero_after_a_gap_with_a_restart() -> None:
    """After a restart seen across a gap, the first value counts from zero."""
    values = [5.0, None, 3.0, 4.0]
    resets = [False, True, False, False]
    assert window_increase(values, resets) == 3.0 + 1.0


@given(st.lists(st.one_of(st.none(), st.floats(0, 1e9)), max_size=30))
def test_window_increase_is_never_negative(values: list[float | None]) -> None:
    """Whatever the counter does, its window increase is never negative."""
    assert window_increase(values) >= 0.0


def test_histogram_increase_is_the_bucketwise_difference() -> None:
    """Observations added between two samples land in the buckets they were added to."""
    before = hist([0, 0, 0, 0, 0, 0, 0, 2, 1, 0], total=600.0)
    after = hist([0, 0, 0, 0, 0, 0, 0, 5, 4, 0], total=2100.0)
    delta = histogram_increase(before, after)
    assert delta is not None
    assert delta.counts == (0, 0, 0, 0, 0, 0, 0, 3, 3, 0)
    assert delta.sum == 1500.0


def test_histogram_increase_after_a_reset_is_the_new_histogram() -> None:
    """A histogram whose count went down restarted: everything in it is new."""
    before = hist([0, 0, 0, 0, 0, 0, 0, 9, 9, 0], total=5000.0)
    after = hist([0, 0, 0, 0, 0, 0, 0, 1, 0, 0], total=150.0)
    delta = histogram_increase(before, after)
    assert delta is not None
    assert delta.total == 1.0
    assert delta.sum == 150.0


def test_histogram_increase_with_other_bounds_and_no_reset_is_unknown() -> None:
    """Histograms with different buckets cannot be subtracted without a restart between them."""
    before = hist([1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    after = Histogram((10.0, INF), (2.0, 2.0), 2.0, 3.0)
    assert histogram_increase(before, after) is None


def test_merge_buckets_adds_parts_with_the_same_bounds() -> None:
    """Per-interval bucket counts add up over a window."""
    a = BucketCounts((1.0, INF), (1.0, 0.0), 1.0)
    b = BucketCounts((1.0, INF), (2.0, 1.0), 9.0)
    merged = merge_buckets([a, b])
    assert merged == BucketCounts((1.0, INF), (3.0, 1.0), 10.0)


def test_merge_buckets_of_nothing_is_none() -> None:
    """An empty window has no distribution at all, not an empty one."""
    assert merge_buckets([]) is None


def test_bucket_quantile_interpolates_inside_the_bucket_like_promql() -> None:
    """The quantile interpolates linearly within its bucket, as histogram_quantile does."""
    buckets = BucketCounts((100.0, 200.0, INF), (0.0, 10.0, 0.0), 1500.0)
    assert bucket_quantile(0.5, buckets) == pytest.approx(150.0)
    assert bucket_quantile(0.95, buckets) == pytest.approx(195.0)


def test_bucket_quantile_in_the_inf_bucket_is_the_largest_finite_bound() -> None:
    """A quantile beyond the last finite bound can only be bounded from below."""
    buckets = BucketCounts((100.0, INF), (0.0, 4.0), 4000.0)
    assert bucket_quantile(0.95, buckets) == 100.0


def test_bucket_quantile_of_no_observations_is_none() -> None:
    """No observations, no quantile (never NaN)."""
    assert bucket_quantile(0.95, BucketCounts((1.0, INF), (0.0, 0.0), 0.0)) is None


def test_bucket_quantile_rejects_a_quantile_outside_0_1() -> None:
    """A quantile of 95 (instead of 0.95) is a programming error, caught loudly."""
    with pytest.raises(ValueError, match="within"):
        bucket_quantile(95, BucketCounts((1.0, INF), (1.0, 0.0), 1.0))


@given(
    st.lists(st.integers(0, 50), min_size=len(BOUNDS), max_size=len(BOUNDS)),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_bucket_quantile_is_monotonic_in_q(counts: list[int], q1: float, q2: float) -> None:
    """A higher quantile is never smaller than a lower one."""
    buckets = BucketCounts(BOUNDS, tuple(float(c) for c in counts), 0.0)
    low, high = sorted((q1, q2))
    a, b = bucket_quantile(low, buckets), bucket_quantile(high, buckets)
    if sum(counts) == 0:
        assert a is None
        assert b is None
    else:
        assert a is not None
        assert b is not None
        assert a <= b + 1e-9


def test_window_increase_leaves_out_a_value_after_a_reset_that_is_not_counted() -> None:
    """A reset whose new value no process could have counted adds nothing; the rest stands."""
    values = [5.0, 1e12, 1e12 + 3]
    resets = [False, True, False]
    assert window_increase(values, resets, [True, False, True]) == 3.0
    assert window_increase(values, resets, [True, True, True]) == 1e12 + 3


def test_the_counted_flags_apply_only_after_a_reset() -> None:
    """Without a reset, a False flag changes nothing: plain increases are always counted."""
    assert window_increase([1.0, 4.0, 9.0], [False, False, False], [False, False, False]) == 8.0


def test_a_counter_a_few_ulps_lower_is_unchanged_not_reset() -> None:
    """A counter read lower by float noise is unchanged, not reset.

    prometheus_client's multiprocess mode sums one file per process: a counter may read a hair
    lower at the next scrape with no restart. That is no increase, and no reset (which would
    count the whole lifetime again); what comes after counts from the lower reading.
    """
    assert counter_increase(1e6, 1e6 * (1 - 1e-12)) == 0.0
    assert window_increase([105.0, 105.0 - 1e-9, 108.0]) == pytest.approx(3.0)
    assert counter_increase(105.0, 104.0) == 104.0  # a real decrease still is a reset


def test_a_histogram_count_a_few_ulps_lower_is_no_reset() -> None:
    """The same noise in a histogram's count adds nothing instead of its whole lifetime."""
    before = hist([0, 0, 0, 0, 0, 0, 0, 10, 0, 0], total=1010.0)
    after = replace(before, count=before.count * (1 - 1e-12))
    increase = histogram_increase(before, after)
    assert increase is not None
    assert increase.total == 0.0
