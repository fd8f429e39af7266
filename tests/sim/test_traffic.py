"""Traffic profiles and their seeded arrival streams."""

from __future__ import annotations

import dataclasses
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sim.traffic import (
    Arrival,
    ArrivalSource,
    LengthDistribution,
    ScriptedArrivals,
    SharedPrefix,
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
    assert profile.cycle_s == 330.0
    times = (0.0, 59.9, 60.0, 149.9, 150.0, 210.0, 240.0, 329.9, 330.0, 395.0)
    names = [None if (p := profile.phase_at(t)) is None else p.name for t in times]
    assert names == [
        "short",
        "short",
        "chat",
        "chat",
        "agents",
        "burst",
        "calm",
        "calm",
        "short",
        "chat",
    ]
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


def test_default_phases_differ_as_their_names_say() -> None:
    """Short requests are short, the burst's are long, only the agents share a system prompt."""
    phases = {p.name: p for p in default_profile().phases}
    short, chat, agents, burst = (phases[n] for n in ("short", "chat", "agents", "burst"))
    assert short.prompt_tokens.maximum + short.output_tokens.maximum < chat.prompt_tokens.median
    assert short.arrivals_per_s > 10 * chat.arrivals_per_s
    assert burst.prompt_tokens.median >= 3 * chat.prompt_tokens.median
    assert burst.output_tokens.median > chat.output_tokens.median
    assert agents.shared_prefix is not None
    assert agents.shared_prefix.tokens > 4 * agents.prompt_tokens.median
    assert [p.name for p in phases.values() if p.shared_prefix is not None] == ["agents"]


def test_a_shared_prefix_starts_the_given_fraction_of_prompts() -> None:
    """About `fraction` of the requests carry the prefix, before a prompt drawn as usual."""
    prefix = SharedPrefix("system", tokens=300, fraction=0.3)
    profile = TrafficProfile(phases=(dataclasses.replace(phase(100.0), shared_prefix=prefix),))
    arrivals = drain(ArrivalSource(profile, max_model_len=100_000, seed=4), 20.0)
    sharing = [a for a in arrivals if a.shared_prefix is not None]
    expected = 0.3 * len(arrivals)
    assert abs(len(sharing) - expected) <= 5 * math.sqrt(expected)
    assert all(a.shared_prefix == prefix and a.prefix_tokens == 300 for a in sharing)
    assert all(a.prompt_tokens >= 300 + 1 for a in sharing)
    assert all(a.prefix_tokens == 0 for a in arrivals if a.shared_prefix is None)


def test_a_prompt_with_its_prefix_still_fits_the_model() -> None:
    """Prefix plus prompt is capped at max_model_len - 1; the prefix then fills the prompt."""
    prefix = SharedPrefix("long", tokens=1000, fraction=1.0)
    profile = TrafficProfile(phases=(dataclasses.replace(phase(50.0), shared_prefix=prefix),))
    for a in drain(ArrivalSource(profile, max_model_len=512, seed=1), 2.0):
        assert a.prompt_tokens == 511
        assert a.prefix_tokens == 511
        assert a.output_tokens == 1


def test_arrivals_carry_the_phase_n() -> None:
    """Every request of a phase asks for the phase's n samples."""
    profile = TrafficProfile(phases=(dataclasses.replace(phase(50.0), n=3),))
    arrivals = drain(ArrivalSource(profile, max_model_len=8192, seed=0), 2.0)
    assert arrivals
    assert {a.n for a in arrivals} == {3}


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
