"""Specification of the knee, the binding limit and the ceiling for the lengths sent."""

from __future__ import annotations

import pytest

from exporter.core.ceiling import RunningLimit
from exporter.core.derive import EngineDerived
from exporter.errors import UsageError
from exporter.sweep.evaluate import StepResult
from exporter.sweep.knee import (
    Binding,
    TargetCeiling,
    binding_limit,
    check_capacity,
    find_knee,
    shape_ceiling,
)
from exporter.sweep.plan import Load, Mode
from exporter.sweep.shape import RequestShape, TrafficShape

CEILING = TargetCeiling(
    p95_context_tokens=256,
    mean_context_tokens=256,
    sequences=8,
    kv_p95_sequences=8,
    max_num_seqs=1024,
)


def step(level: float, *, bad: str | None = None, **figures: float) -> StepResult:
    """A synthetic step at ``level`` req/s; ``bad`` makes it break a limit."""
    return StepResult(
        load=Load(Mode.RATE, level),
        started_s=0,
        sending_s=30,
        window_s=20,
        sent=10,
        completed=10,
        failed=int(figures.pop("failed", 0)),
        cancelled=0,
        violations=(bad,) if bad else (),
        **figures,  # type: ignore[arg-type]
    )


def test_the_knee_is_the_last_good_step_before_the_first_bad_one() -> None:
    """A good step after a bad one (noise) does not move the knee up."""
    steps = [
        step(1, running_mean=1.5, running_max=3, achieved_rps=1.0),
        step(2, running_mean=3.0, running_max=6, achieved_rps=2.0),
        step(4, bad="5 preemptions", preemptions=5, running_max=10),
        step(8),
    ]
    knee = find_knee(steps, CEILING)
    assert knee.index == 1
    assert knee.load == Load(Mode.RATE, 2)
    assert knee.first_failure == 2
    assert knee.failure_reasons == ("5 preemptions",)
    assert knee.running_mean == 3.0
    assert knee.usable_ratio == pytest.approx(3 / 8)
    assert knee.saturation_running == 10
    assert knee.binding == Binding.KV_CACHE


def test_the_concurrency_at_the_knee_is_the_requests_in_flight_when_the_client_timed_them() -> None:
    """The client's in-flight mean sets the usable share; vLLM's running mean is kept beside it.

    (vLLM's gauges, read between bursts of engine work on a busy API server, can show fewer.)
    """
    steps = [
        step(3, in_flight_mean=2.9, running_mean=0.5, running_max=3),
        step(4, bad="2 preemptions", preemptions=2, running_max=3),
    ]
    knee = find_knee(steps, CEILING)
    assert knee.in_flight_mean == 2.9
    assert knee.running_mean == 0.5
    assert knee.usable_ratio == pytest.approx(2.9 / 8)


def test_a_sweep_whose_first_step_fails_has_no_knee_and_says_to_go_lower() -> None:
    """The knee is below the lowest level tried."""
    knee = find_knee([step(1, bad="waiting", waiting_max=3)], CEILING)
    assert knee.index is None
    assert knee.load is None
    assert knee.note is not None
    assert "lower --levels" in knee.note


def test_a_sweep_that_never_fails_has_not_reached_the_knee() -> None:
    """The highest level is a lower bound of the knee, said as such."""
    knee = find_knee([step(1), step(2)], CEILING)
    assert knee.index == 1
    assert knee.binding == Binding.NOT_REACHED
    assert knee.note is not None
    assert "at or above" in knee.note


@pytest.mark.parametrize(
    ("figures", "seats", "binding"),
    [
        ({"preemptions": 3.0, "kv_usage_max": 1.0, "running_max": 9.0}, 1024, Binding.KV_CACHE),
        ({"waiting_max": 2.0, "kv_usage_max": 0.95, "running_max": 8.0}, 1024, Binding.KV_CACHE),
        ({"waiting_max": 2.0, "kv_usage_max": 0.5, "running_max": 4.0}, 4, Binding.MAX_NUM_SEQS),
        ({"waiting_max": 2.0, "kv_usage_max": 1.0, "running_max": 4.0}, 4, Binding.MAX_NUM_SEQS),
        (
            {"server_queue_mean_s": 0.6, "kv_usage_max": 0.5, "running_max": 4.0},
            4,
            Binding.MAX_NUM_SEQS,
        ),
        (
            {"server_queue_mean_s": 0.6, "kv_usage_max": 0.95, "running_max": 8.0},
            1024,
            Binding.KV_CACHE,
        ),
        (
            {"server_queue_mean_s": 0.05, "kv_usage_max": 0.5, "running_max": 4.0},
            4,
            Binding.COMPUTE,
        ),
        ({"kv_usage_max": 0.3, "running_max": 3.0}, 1024, Binding.COMPUTE),
        ({"failed": 2.0, "running_max": 3.0}, 1024, Binding.ERRORS),
    ],
)
def test_the_binding_limit_is_read_from_the_first_step_past_the_knee(
    figures: dict[str, float], seats: int, binding: Binding
) -> None:
    """Each binding limit is told by its signature in the first step past the knee.

    Seats full and queueing without preemption: max_num_seqs; preemption, or a full pool with
    queueing: the KV cache; only failures: errors; anything else: compute. Queueing is requests
    seen waiting, or vLLM's mean queue time over the step (which sees waits between two reads of
    the gauge) above a quarter of a second; a mean of one engine step's wait is no queueing.
    """
    ceiling = TargetCeiling(256, 256, max_num_seqs=seats)
    bad = "2 requests failed" if "failed" in figures else "limit"
    assert binding_limit(step(4, bad=bad, **figures), ceiling) == binding


def engine(usable: float, block: int) -> EngineDerived:
    """An engine as the sidecar derives it: usable KV tokens and block size."""
    return EngineDerived(
        engine="0", model_name="m", kv_usable_tokens=usable, kv_block_size_tokens=block
    )


def test_the_ceiling_counts_whole_blocks_of_the_p95_length_under_max_num_seqs() -> None:
    """896 usable tokens in 128-token blocks hold 3 requests of 250 tokens (2 blocks each)."""
    shape = TrafficShape((RequestShape(100, 150),), "t")
    found = shape_ceiling([engine(896, 128)], shape, RunningLimit(256, "default"))
    assert (found.sequences, found.limited_by, found.kv_p95_sequences) == (3, "kv_cache", 3)
    capped = shape_ceiling([engine(896, 128)], shape, RunningLimit(2, "setting"))
    assert (capped.sequences, capped.limited_by) == (2, "max_num_seqs")


def test_the_ceiling_adds_up_over_data_parallel_engines() -> None:
    """Each engine has its own pool: their ceilings add."""
    shape = TrafficShape((RequestShape(100, 150),), "t")
    found = shape_ceiling([engine(896, 128), engine(896, 128)], shape, None)
    assert found.sequences == 6
    assert found.usable_tokens == 1792


def test_a_request_longer_than_every_kv_pool_is_refused_before_any_load() -> None:
    """No max_model_len from the target: the pool still bounds the lengths (ceiling 0: refused)."""
    shape = TrafficShape((RequestShape(20_000_000, 5),), "f.csv")
    engines = [engine(896.0, 128)]
    ceiling = shape_ceiling(engines, shape, None)
    assert ceiling.sequences == 0
    with pytest.raises(UsageError, match="20,000,005-token request but the target's KV pool"):
        check_capacity(engines, shape, ceiling)


def test_a_request_that_fits_one_engines_pool_is_accepted() -> None:
    """896 tokens in 128-token blocks hold one request of 896 tokens, not one of 897."""
    engines = [engine(896.0, 128)]
    fits = TrafficShape((RequestShape(890, 6),), "x")
    check_capacity(engines, fits, shape_ceiling(engines, fits, None))
    longer = TrafficShape((RequestShape(890, 7),), "x")
    with pytest.raises(UsageError, match="KV pool holds 896 tokens"):
        check_capacity(engines, longer, shape_ceiling(engines, longer, None))


@pytest.mark.parametrize("sequences", [0.0, 0.5, float("nan")])
def test_a_ceiling_below_one_sequence_is_refused(sequences: float) -> None:
    """A ceiling of no whole sequence (or NaN) sends nothing (fail closed)."""
    shape = TrafficShape((RequestShape(10, 5),), "x")
    ceiling = TargetCeiling(p95_context_tokens=15, mean_context_tokens=15.0, sequences=sequences)
    with pytest.raises(UsageError, match="no request fits"):
        check_capacity([], shape, ceiling)
