"""Traffic profiles and their seeded arrival streams."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sim.traffic import (
    Arrival,
    ArrivalSource,
    LengthDistribution,
    ScriptedArrivals,
    TrafficPhase,
    TrafficProfile,
    default_profile,
)


def phase(rate: float, duration: float = 10.0, name: str = "p") -> TrafficPhase:
    """A phase with wide length ranges."""
    return TrafficPhase(
        name=name,
        duration_s=duration,
        arrivals_per_s=rate,
        prompt_tokens=LengthDistribution(median=500, sigma=1.0, minimum=1, maximum=4000),
        output_tokens=LengthDistribution(median=200, sigma=1.0, minimum=1, maximum=3000),
        max_tokens=1000,
    )


def drain(source: ArrivalSource, until: float) -> list[Arrival]:
    """Every arrival up to ``until``."""
    return source.pop_due(until)


def test_same_seed_gives_the_same_arrivals() -> None:
    """The stream depends only on profile, max_model_len and seed."""
    a = drain(ArrivalSource(default_profile(), max_model_len=16384, seed=1), 400.0)
    b = drain(ArrivalSource(default_profile(), max_model_len=16384, seed=1), 400.0)
    c = drain(ArrivalSource(default_profile(), max_model_len=16384, seed=2), 400.0)
    assert a == b
    assert a != c


def test_arrivals_are_ordered_and_follow_the_phase_rates() -> None:
    """Arrival counts per phase match the Poisson rate within five standard deviations."""
    profile = TrafficProfile(phases=(phase(5.0, 400.0), phase(0.0, 100.0), phase(20.0, 100.0)))
    arrivals = drain(ArrivalSource(profile, max_model_len=8192, seed=3), 600.0)
    times = [a.time for a in arrivals]
    assert times == sorted(times)
    for lo, hi, rate in ((0.0, 400.0, 5.0), (400.0, 500.0, 0.0), (500.0, 600.0, 20.0)):
        n = sum(lo <= t < hi for t in times)
        expected = rate * (hi - lo)
        assert abs(n - expected) <= 5 * math.sqrt(expected) + 1e-9, (lo, n, expected)


def test_profile_repeats_and_phase_at_names_the_phase() -> None:
    """A repeating profile plays its phases again every cycle."""
    profile = default_profile()
    assert profile.cycle_s == 300.0
    times = (0.0, 59.9, 60.0, 89.9, 90.0, 299.9, 300.0, 365.0)
    names = [None if (p := profile.phase_at(t)) is None else p.name for t in times]
    assert names == ["calm", "calm", "burst", "burst", "calm", "calm", "calm", "burst"]
    assert profile.phase_at(-1.0) is None


def test_one_shot_profile_ends() -> None:
    """A profile that does not repeat has no arrivals after its end, and the stream says so."""
    profile = TrafficProfile(phases=(phase(50.0, 2.0),), repeat=False)
    source = ArrivalSource(profile, max_model_len=8192, seed=0)
    arrivals = drain(source, 1e9)
    assert arrivals
    assert all(a.time < 2.0 for a in arrivals)
    assert math.isinf(source.next_time)
    assert profile.phase_at(2.0) is None


def test_silent_profile_yields_nothing_and_does_not_hang() -> None:
    """A repeating profile whose every phase has rate 0 produces no arrival at all."""
    source = ArrivalSource(TrafficProfile(phases=(phase(0.0),)), max_model_len=8192, seed=0)
    assert math.isinf(source.next_time)
    assert source.pop_due(1e12) == []


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), max_model_len=st.integers(2, 5000))
def test_requests_fit_the_model_and_say_why_they_end(seed: int, max_model_len: int) -> None:
    """Prompt + output never exceed max_model_len; 'length' marks outputs cut at their cap."""
    source = ArrivalSource(
        TrafficProfile(phases=(phase(50.0),)), max_model_len=max_model_len, seed=seed
    )
    for a in drain(source, 5.0):
        assert 1 <= a.prompt_tokens < max_model_len
        assert 1 <= a.output_tokens <= a.max_tokens
        assert a.prompt_tokens + a.output_tokens <= max_model_len
        cap = min(a.max_tokens, max_model_len - a.prompt_tokens)
        assert a.finished_reason in {"stop", "length"}
        if a.finished_reason == "length":
            assert a.output_tokens == cap


@given(
    seed=st.integers(0, 1000),
    median=st.floats(1.0, 1e5),
    sigma=st.floats(0.0, 3.0),
    bounds=st.tuples(st.integers(1, 10_000), st.integers(1, 10_000)).map(sorted),
)
def test_lengths_stay_within_their_bounds(
    seed: int, median: float, sigma: float, bounds: list[int]
) -> None:
    """Sampled lengths are integers clipped to [minimum, maximum]."""
    dist = LengthDistribution(median=median, sigma=sigma, minimum=bounds[0], maximum=bounds[1])
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    for _ in range(20):
        assert bounds[0] <= dist.sample(rng) <= bounds[1]


def test_default_burst_requests_are_longer_than_calm_ones() -> None:
    """The burst brings long-document requests: median prompts several times the calm ones."""
    calm, burst, _ = default_profile().phases
    assert burst.prompt_tokens.median >= 3 * calm.prompt_tokens.median
    assert burst.output_tokens.median > calm.output_tokens.median


def test_scripted_arrivals_come_out_in_time_order() -> None:
    """ScriptedArrivals sorts its script and releases each arrival once it is due."""
    late = Arrival(2.0, prompt_tokens=5, output_tokens=1, max_tokens=1, finished_reason="length")
    early = Arrival(1.0, prompt_tokens=7, output_tokens=2, max_tokens=9, finished_reason="stop")
    script = ScriptedArrivals([late, early])
    assert script.next_time == 1.0
    assert script.pop_due(0.5) == []
    assert script.pop_due(1.5) == [early]
    assert script.pop_due(10.0) == [late]
    assert math.isinf(script.next_time)
