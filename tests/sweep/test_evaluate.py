"""Specification of a step's figures and verdict, the early stop and the busy-target check."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from exporter.core.derive import Sample
from exporter.core.snapshot import EngineMetrics, VllmSnapshot
from exporter.errors import UsageError
from exporter.sweep.evaluate import (
    NOT_SENT,
    Limits,
    RequestResult,
    early_stop,
    evaluate_step,
    in_flight,
    percentile,
    traffic_seen,
    violations,
)
from exporter.sweep.plan import Load, Mode

LOAD = Load(Mode.RATE, 2.0)


def snap(
    *,
    running: float = 0,
    waiting: float = 0,
    usage: float = 0.0,
    preemptions: float = 0,
    finished: float = 0,
    generated: float = 0,
) -> VllmSnapshot:
    """One engine's snapshot with the figures a step reads."""
    engine = EngineMetrics(
        engine="0",
        requests_running=running,
        requests_waiting=waiting,
        kv_cache_usage_ratio=usage,
        preemptions_total=preemptions,
        requests_finished_total=finished,
        generation_tokens_total=generated,
    )
    return VllmSnapshot(engines={"0": engine})


def request(start: float, end: float, *, error: str | None = None) -> RequestResult:
    """A request of 100 + 11 tokens whose first token came 0.1 s after it started."""
    return RequestResult(
        100, 11, start, end, first_token_s=start + 0.1, generated_tokens=11, error=error
    )


def steady_samples() -> list[Sample]:
    """A step from t=0 to t=10: the window (2 to 10) sees 2 then 4 running, 20 finished."""
    samples = [Sample(-0.1, snap())]
    for t in range(1, 11):
        running = 2 if t < 6 else 4
        samples.append(
            Sample(
                float(t),
                snap(running=running, usage=running / 10, finished=2 * t, generated=22 * t),
            )
        )
    return samples


def test_a_steady_step_is_summarised_from_the_window_and_passes() -> None:
    """Means and peaks over the window, counter rates over it, client latencies of the window."""
    requests = [request(t * 0.5, t * 0.5 + 1.0) for t in range(20)]
    step = evaluate_step(
        LOAD,
        samples=steady_samples(),
        requests=requests,
        started_s=0.0,
        sending_s=10.0,
        window=(2.0, 10.0),
        limits=Limits(),
    )
    assert step.ok
    assert step.running_mean == pytest.approx((2 * 4 + 4 * 5) / 9)
    assert step.running_max == 4
    assert step.kv_usage_max == pytest.approx(0.4)
    assert step.preemptions == 0
    assert step.output_tokens_per_s == pytest.approx(22.0)
    assert step.achieved_rps == pytest.approx(17 / 8)  # ends at 2.0, 2.5 ... 10.0
    assert step.ttft_p95_s == pytest.approx(0.1)
    assert step.tpot_p50_s == pytest.approx(0.09)
    assert (step.sent, step.completed, step.failed, step.cancelled) == (20, 20, 0, 0)


def test_arrivals_the_client_could_not_send_break_the_step_and_are_not_target_failures() -> None:
    """An open loop past the client's in-flight cap: those arrivals are counted, not sent.

    The step did not get its load, so it cannot pass; the target did not fail them either.
    """
    requests = [request(t * 0.5, t * 0.5 + 1.0) for t in range(20)]
    requests += [request(9.0, 9.0, error=NOT_SENT) for _ in range(3)]
    step = evaluate_step(
        LOAD,
        samples=steady_samples(),
        requests=requests,
        started_s=0.0,
        sending_s=10.0,
        window=(2.0, 10.0),
        limits=Limits(),
    )
    assert (step.sent, step.completed, step.failed, step.not_sent) == (20, 20, 0, 3)
    assert step.failure_kinds == ()
    assert not step.ok
    assert step.violations == (
        "3 arrivals not sent: the client already had the most requests in flight it keeps",
    )


def test_preemptions_per_finished_request_past_the_limit_break_the_step() -> None:
    """Preemptions count per request vLLM finished in the window."""
    samples = steady_samples()
    samples[-1] = Sample(10.0, snap(running=4, preemptions=3, finished=20))
    step = evaluate_step(
        LOAD,
        samples=samples,
        requests=[request(3, 4)],
        started_s=0,
        sending_s=10,
        window=(2.0, 10.0),
        limits=Limits(),
    )
    assert step.preemptions == 3
    # Counters run from the last sample before the window (t=1): 18 requests finished.
    assert step.preemptions_per_request == pytest.approx(3 / 18)
    assert not step.ok
    assert step.violations == ("3 preemptions (0.17/request)",)


def test_each_limit_names_itself_in_the_verdict() -> None:
    """Waiting, latency objectives, failures and early stops each add one phrase."""
    step = evaluate_step(
        LOAD,
        samples=[Sample(0, snap()), Sample(1, snap(waiting=2)), Sample(2, snap(waiting=1))],
        requests=[
            request(0, 2),
            request(0.5, 1.0, error="http_500"),
            request(0.6, 0.7, error="cancelled"),
        ],
        started_s=0,
        sending_s=2,
        window=(0.5, 2.0),
        limits=Limits(ttft_p95_s=0.05),
        stopped_early="20 preemptions",
    )
    assert step.violations == (
        "stopped early: 20 preemptions",
        "1 requests failed (http_500)",
        "1.5 requests waiting on average",
        "TTFT p95 0.1 s > 0.05 s",
    )
    assert (step.failed, step.cancelled) == (1, 1)


def test_a_step_where_nothing_completed_fails() -> None:
    """Requests sent and none back is not a good step, whatever the metrics say."""
    step = evaluate_step(
        LOAD,
        samples=[Sample(0, snap()), Sample(1, snap())],
        requests=[request(0, 1, error="cancelled")],
        started_s=0,
        sending_s=1,
        window=(0.0, 1.0),
        limits=Limits(),
    )
    assert "no request completed" in step.violations


def test_early_stop_fires_on_preemptions_or_waiting_past_the_stop_limits() -> None:
    """The runner stops a step that has clearly failed; below the limits it goes on."""
    limits = Limits(stop_preemptions=10, stop_waiting=5)
    quiet = [Sample(0, snap(preemptions=100)), Sample(1, snap(preemptions=105, waiting=4))]
    assert early_stop(quiet, limits) is None
    assert early_stop([*quiet, Sample(2, snap(preemptions=110))], limits) == "10 preemptions"
    assert early_stop([*quiet, Sample(2, snap(preemptions=105, waiting=5))], limits) == (
        "5 requests waiting"
    )
    assert early_stop([], limits) is None


def test_a_busy_target_says_why() -> None:
    """Running, waiting or finished requests between two reads make a target busy."""
    assert traffic_seen(snap(finished=10), snap(finished=10), seconds=2) is None
    assert traffic_seen(snap(finished=10), snap(running=3, waiting=1, finished=12), seconds=2) == (
        "3 requests running, 1 waiting, 2 requests finished in 2 s"
    )


def test_percentiles_interpolate_between_ranks() -> None:
    """The client-side quantiles interpolate linearly, as numpy does by default."""
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)


def test_violations_are_pure_over_a_step() -> None:
    """The verdict can be recomputed from a step's figures under other limits."""
    step = evaluate_step(
        LOAD,
        samples=steady_samples(),
        requests=[request(3, 4)],
        started_s=0,
        sending_s=10,
        window=(2.0, 10.0),
        limits=Limits(),
    )
    assert violations(step, Limits(tpot_p95_s=0.01)) == ("TPOT p95 0.09 s > 0.01 s",)


def test_requests_in_flight_are_their_time_in_the_window_over_its_length() -> None:
    """Little's law on the client's timings: partial overlaps count, cancelled requests too."""
    requests = [
        request(-2.0, 3.0),  # 3 s inside
        request(4.0, 6.0),  # 2 s
        request(9.0, 12.0),  # 1 s
        request(5.0, 15.0, error="cancelled"),  # 5 s
        request(11.0, 12.0),  # after the window
    ]
    assert in_flight(requests, 0.0, 10.0) == pytest.approx(1.1)
    assert in_flight(requests, 5.0, 5.0) == 0.0
    step = evaluate_step(
        LOAD,
        samples=[Sample(0, snap()), Sample(10, snap())],
        requests=requests,
        started_s=0,
        sending_s=10,
        window=(0.0, 10.0),
        limits=Limits(),
    )
    assert step.in_flight_mean == pytest.approx(1.1)


@pytest.mark.parametrize(
    "field",
    [
        "max_preemptions_per_request",
        "max_waiting",
        "ttft_p95_s",
        "tpot_p95_s",
        "stop_preemptions",
        "stop_waiting",
    ],
)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0])
def test_a_limit_that_is_not_a_finite_number_is_refused(field: str, value: float) -> None:
    """A NaN limit would turn its check off (x > nan is never true): refused, naming the flag."""
    with pytest.raises(UsageError, match="give a finite number"):
        Limits(**{field: value})


@pytest.mark.parametrize("field", ["ttft_p95_s", "tpot_p95_s", "stop_preemptions", "stop_waiting"])
def test_a_zero_objective_or_stop_is_refused(field: str) -> None:
    """An objective or a stop of 0 would fail or stop every step: refused."""
    with pytest.raises(UsageError, match="above 0"):
        Limits(**{field: 0.0})


def _forced(**values: float) -> Limits:
    """Limits holding values their check refuses (as if it were bypassed)."""
    limits = Limits()
    for name, value in values.items():
        object.__setattr__(limits, name, value)
    return limits


def test_the_verdict_fails_closed_on_a_nan_limit_or_measure() -> None:
    """Past the check: a NaN limit or a NaN measure is a violation, never a pass."""
    steady = evaluate_step(
        LOAD,
        samples=steady_samples(),
        requests=[request(2.0, 3.0)],
        started_s=0.0,
        sending_s=10.0,
        window=(2.0, 10.0),
        limits=Limits(),
    )
    nan = math.nan
    forced = _forced(max_waiting=nan, ttft_p95_s=nan)
    found = violations(steady, forced)
    assert any("waiting on average" in v for v in found)
    assert any("TTFT p95" in v for v in found)
    measured = violations(
        replace(steady, waiting_mean=nan, tpot_p95_s=nan), _forced(tpot_p95_s=1.0)
    )
    assert any("waiting on average" in v for v in measured)
    assert any("TPOT p95" in v for v in measured)


def test_the_early_stop_fails_closed_on_a_nan_stop() -> None:
    """A NaN stop (past the check) stops the step at the first sample."""
    samples = [Sample(0.0, snap()), Sample(1.0, snap(waiting=1))]
    assert early_stop(samples, Limits()) is None
    assert early_stop(samples, _forced(stop_preemptions=math.nan)) is not None
    assert early_stop(samples, _forced(stop_waiting=math.nan)) is not None


def test_a_nan_busy_gauge_or_count_reads_as_busy() -> None:
    """The busy check refuses on a NaN running, waiting or finished figure (fail closed)."""
    assert traffic_seen(snap(), snap(), seconds=2.0) is None
    assert traffic_seen(snap(), snap(running=math.nan), seconds=2.0) is not None
    assert traffic_seen(snap(), snap(waiting=math.nan), seconds=2.0) is not None
    assert traffic_seen(snap(), snap(finished=math.nan), seconds=2.0) is not None
