"""Specification of the sweep plan: levels, arrival schedules, the order of steps and bounds."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from exporter.errors import UsageError, quoted
from exporter.sweep.plan import (
    FALLBACK_CONCURRENCY,
    Load,
    Mode,
    SweepPlan,
    arrival_offsets,
    auto_levels,
    draw_requests,
    next_step,
    parse_levels,
)
from exporter.sweep.shape import RequestShape, TrafficShape


def test_levels_are_sorted_unique_positive_numbers() -> None:
    """--levels reads like people write it; repeats and order do not matter."""
    assert parse_levels("4, 1,2,2", Mode.RATE) == (1.0, 2.0, 4.0)
    assert parse_levels("0.5,1.5", Mode.RATE) == (0.5, 1.5)


@pytest.mark.parametrize(
    ("text", "mode"),
    [("1,x", Mode.RATE), ("0,1", Mode.RATE), ("1.5", Mode.CONCURRENCY), ("inf", Mode.RATE)],
)
def test_bad_levels_are_one_line_with_an_example(text: str, mode: Mode) -> None:
    """A level that is not a positive number (whole, for concurrency) names itself and the fix."""
    with pytest.raises(UsageError, match=r"e\.g\. 1,2,4") as caught:
        parse_levels(text, mode)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "text",
    ["\uff15", "1,\u0663", "\U0001d7d3", "\uff11e\uff13"],
)
def test_levels_are_ascii_numbers_as_every_other_number_flag(text: str) -> None:
    """Digits of other scripts, which float() reads, are refused as the number flags refuse them."""
    with pytest.raises(UsageError, match=r"e\.g\. 1,2,4"):
        parse_levels(text, Mode.RATE)


def test_a_bad_level_is_quoted_in_40_characters() -> None:
    """A long bad level is cut as the number flags cut theirs: the line stays one screen wide."""
    with pytest.raises(UsageError) as caught:
        parse_levels("1," + "x" * 5000, Mode.RATE)
    assert f"--levels has {quoted('x' * 5000)};" in str(caught.value)
    assert f"'{'x' * 40}' (the first 40 of 5,000 characters)" in str(caught.value)
    assert len(str(caught.value)) < 200


def test_concurrency_levels_span_a_quarter_to_twice_the_ceiling() -> None:
    """Automatic concurrency levels bracket the ceiling, whole and at least 1."""
    assert auto_levels(Mode.CONCURRENCY, ceiling=8, single_latency_s=None) == (
        2.0,
        4.0,
        6.0,
        8.0,
        10.0,
        12.0,
        16.0,
    )
    assert auto_levels(Mode.CONCURRENCY, ceiling=2, single_latency_s=None)[0] == 1.0
    assert auto_levels(Mode.CONCURRENCY, ceiling=None, single_latency_s=None) == (
        FALLBACK_CONCURRENCY
    )


def test_rate_levels_are_a_sqrt2_grid_under_the_rate_that_fills_the_ceiling() -> None:
    """ceiling / single-request latency bounds the knee's rate: the grid climbs to just past it."""
    levels = auto_levels(Mode.RATE, ceiling=8, single_latency_s=1.25)
    assert levels[0] == pytest.approx(6.4 / 16, rel=0.01)
    assert levels[-1] == pytest.approx(6.4 * math.sqrt(2), rel=0.01)
    ratios = [b / a for a, b in itertools.pairwise(levels)]
    assert all(r == pytest.approx(math.sqrt(2), rel=0.01) for r in ratios)


def test_rate_levels_need_a_ceiling_and_a_latency() -> None:
    """Without them the sweep cannot guess rates and asks for --levels."""
    with pytest.raises(UsageError, match="give --levels"):
        auto_levels(Mode.RATE, ceiling=None, single_latency_s=1.0)


def test_steps_run_in_order_and_stop_past_the_knee() -> None:
    """After the first failing step, past_knee more run (to show the growth), then none."""
    levels = (1.0, 2.0, 3.0, 4.0, 5.0)
    assert next_step(levels, [], past_knee=1) == 0
    assert next_step(levels, [True, True], past_knee=1) == 2
    assert next_step(levels, [True, False], past_knee=1) == 2
    assert next_step(levels, [True, False, False], past_knee=1) is None
    assert next_step(levels, [True, False], past_knee=0) is None
    assert next_step(levels, [True] * 5, past_knee=1) is None


def test_arrivals_are_a_seeded_poisson_process_of_the_asked_count() -> None:
    """Offsets are reproducible per seed and rate, inside the step, exactly rate x duration."""
    offsets = arrival_offsets(5.0, 200.0, seed=3)
    assert offsets == arrival_offsets(5.0, 200.0, seed=3)
    assert offsets != arrival_offsets(5.0, 200.0, seed=4)
    assert all(0 < t < 200 for t in offsets)
    assert list(offsets) == sorted(offsets)
    assert len(offsets) == 1000
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    # Exponential-like gaps: their standard deviation is about their mean (0.2 s).
    mean = sum(gaps) / len(gaps)
    spread = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert spread == pytest.approx(mean, rel=0.15)


def test_requests_are_drawn_as_whole_permutations_of_the_pool() -> None:
    """A step as long as the pool sends every shape once; longer ones cycle through it."""
    pool = tuple(RequestShape(p, 10) for p in range(1, 11))
    shape = TrafficShape(pool, "test")
    once = draw_requests(shape, 10, seed=1)
    assert sorted(once, key=lambda r: r.prompt_tokens) == list(pool)
    counts = Counter(draw_requests(shape, 30, seed=1))
    assert set(counts.values()) == {3}


def test_a_plan_refuses_impossible_bounds() -> None:
    """Bounds that make no sweep are one-line usage errors naming the flag."""
    with pytest.raises(UsageError, match="--step-seconds"):
        SweepPlan(mode=Mode.RATE, levels=(), step_seconds=0)
    with pytest.raises(UsageError, match="--settle-seconds"):
        SweepPlan(mode=Mode.RATE, levels=(), step_seconds=10, settle_seconds=10)
    with pytest.raises(UsageError, match="--max-requests"):
        SweepPlan(mode=Mode.RATE, levels=(), max_total_requests=0)


def test_loads_describe_themselves() -> None:
    """A rate reads as requests per second, a concurrency as clients."""
    assert Load(Mode.RATE, 2.5).describe() == "2.5 req/s"
    assert Load(Mode.CONCURRENCY, 8).describe() == "8 concurrent"
    assert Load(Mode.CONCURRENCY, 8).concurrency == 8
