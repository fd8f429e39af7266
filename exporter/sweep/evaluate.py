"""What one step of the sweep measured, and whether it kept within the limits.

A step has two sources, both plain data by the time they get here:

- the **target's own metrics**: :class:`~exporter.core.derive.Sample` snapshots read every second
  or so during the step. Running and waiting requests and KV usage are averaged over the
  measurement window (the step after its settle time); preemptions, finished requests and tokens
  are reset-aware counter increases over it; the server-side latencies are bucket quantiles of the
  histograms' increase, the mean queue time exact from its sum and count; the headroom is the
  sidecar's own figure (:func:`derive_target` over the step's samples, at each sample), its
  lowest value in the window;
- the **client's timings** of every request (:class:`RequestResult`): time to first token, time per
  output token after the first, the achieved rate (requests that finished in the window over its
  length) and the requests in flight on average over the window (each request's time inside the
  window, summed, over its length: Little's law, exact for the client whenever the metrics are
  read). vLLM's gauges are only as good as the moments they are read at: an API server short of
  CPU answers ``/metrics`` between bursts of engine work, when fewer requests run.

A step breaks the limits (:class:`Limits`) when a request failed, when preemptions per finished
request or the mean of waiting requests pass their limit, when a latency objective is missed, or
when it had to stop early. :func:`early_stop` is the check the runner makes at every sample to
stop a step that has clearly failed, so the target is not pushed further than needed.

Pure: plain values in, plain values out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from exporter.core.derive import WindowSettings, derive_target
from exporter.core.windows import (
    bucket_quantile,
    histogram_increase,
    merge_buckets,
    window_increase,
)
from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.core.ceiling import RunningLimit
    from exporter.core.derive import Sample
    from exporter.core.snapshot import EngineMetrics, Histogram, VllmSnapshot
    from exporter.core.windows import BucketCounts
    from exporter.sweep.plan import Load

#: The context window the per-step derivation uses: everything the step's samples saw.
_WHOLE_STEP = 1e9


#: The error of an arrival the client did not send (too many requests in flight).
NOT_SENT = "not_sent"
#: Request outcomes that are not the target's failures.
_NOT_FAILED = frozenset({"cancelled", NOT_SENT})


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request as the load driver saw it; times are on the runner's clock (seconds)."""

    prompt_tokens: int
    #: Output tokens asked for (``max_tokens`` with ``ignore_eos``).
    output_tokens: int
    start_s: float
    end_s: float
    first_token_s: float | None = None
    #: Output tokens received (``usage.completion_tokens``, else the asked count on success).
    generated_tokens: int = 0
    #: None when the request completed; else a short word: ``cancelled``, ``http_500``,
    #: ``not_sent`` (:data:`NOT_SENT`)...
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The request completed."""
        return self.error is None

    @property
    def latency_s(self) -> float:
        """From sending to the last byte."""
        return self.end_s - self.start_s

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, as the client saw it (queueing included)."""
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM bench's TPOT)."""
        if self.first_token_s is None or self.generated_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.generated_tokens - 1)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a step must keep within to count as below the knee, and when to stop it early."""

    #: Preemptions per finished request.
    max_preemptions_per_request: float = 0.01
    #: Mean requests waiting over the measurement window.
    max_waiting: float = 0.5
    #: Latency objectives (client side, p95), if any.
    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    #: Stop a step early at this many preemptions, or this many requests waiting at once.
    stop_preemptions: float = 20.0
    stop_waiting: float = 16.0

    def __post_init__(self) -> None:
        """Every limit finite: a NaN or infinite one would turn its check off (fail open)."""
        for flag, value, positive in (
            ("--max-preemptions-per-request", self.max_preemptions_per_request, False),
            ("--max-waiting", self.max_waiting, False),
            ("--ttft-p95", self.ttft_p95_s, True),
            ("--tpot-p95", self.tpot_p95_s, True),
            ("--stop-preemptions", self.stop_preemptions, True),
            ("--stop-waiting", self.stop_waiting, True),
        ):
            if value is None:
                continue
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                least = "above 0" if positive else "0 or more"
                raise UsageError(f"{flag} is {value}; give a finite number {least}")


@dataclass(frozen=True, slots=True)
class StepResult:
    """Everything one step measured (``None``: not measured), and its verdict."""

    load: Load
    #: Seconds from the sweep's start to the step's first request; how long it sent.
    started_s: float
    sending_s: float
    #: The measurement window's length in seconds.
    window_s: float
    sent: int
    completed: int
    failed: int
    #: Requests cancelled at the end (drain timeout, early stop, Ctrl-C).
    cancelled: int
    #: Arrivals the client did not send: it had the most requests in flight it keeps (the
    #: target is far past its knee; the step did not get its load).
    not_sent: int = 0
    #: What the failed requests failed with (``http_404``, ``timeout``...), each once, sorted.
    failure_kinds: tuple[str, ...] = ()
    #: Requests that finished in the window per second of it (client).
    achieved_rps: float | None = None
    #: Requests in flight on average over the window (client: their time in it over its length).
    in_flight_mean: float | None = None
    #: Generated and prompt tokens per second (the target's counters).
    output_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    #: vLLM's own inter-token latency and TTFT histograms over the window (p95).
    server_itl_p95_s: float | None = None
    server_ttft_p95_s: float | None = None
    #: vLLM's mean queue time (arrival to first scheduled) of the requests it finished in the
    #: window: exact, from its histogram's sum over its count. Unlike the waiting gauge it sees
    #: every request that waited, whenever ``/metrics`` is read (not the wait after a preemption).
    server_queue_mean_s: float | None = None
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    preemptions_per_s: float | None = None
    preemptions_per_request: float | None = None
    #: The sidecar's headroom (more p95 sequences that fit now): lowest and mean in the window.
    headroom_min: float | None = None
    headroom_mean: float | None = None
    #: The sidecar's p95 ceiling at the step's last sample.
    ceiling_sequences: float | None = None
    stopped_early: str | None = None
    #: Reads of the target's metrics the window's figures come from (few: less certain).
    reads: int = 0
    violations: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """The step kept within every limit."""
        return not self.violations


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile with linear interpolation between ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def in_flight(requests: Sequence[RequestResult], start_s: float, end_s: float) -> float:
    """Requests in flight on average over ``[start_s, end_s]``: their time in it over its length."""
    span = end_s - start_s
    if span <= 0:
        return 0.0
    inside = (max(0.0, min(r.end_s, end_s) - max(r.start_s, start_s)) for r in requests)
    return math.fsum(inside) / span


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _engines_sum(
    snapshot: VllmSnapshot, pick: Callable[[EngineMetrics], float | None]
) -> float | None:
    values = [v for e in snapshot.engines.values() if (v := pick(e)) is not None]
    return math.fsum(values) if values else None


def _engines_mean(
    snapshot: VllmSnapshot, pick: Callable[[EngineMetrics], float | None]
) -> float | None:
    values = [v for e in snapshot.engines.values() if (v := pick(e)) is not None]
    return _mean(values)


def _increase(
    samples: Sequence[Sample], pick: Callable[[EngineMetrics], float | None]
) -> float | None:
    values = [_engines_sum(s.snapshot, pick) for s in samples]
    if sum(v is not None for v in values) < 2:
        return None
    resets = [s.restarted for s in samples]
    return window_increase(values, resets)


def _histogram_delta(
    first: Sample, last: Sample, pick: Callable[[EngineMetrics], Histogram | None]
) -> BucketCounts | None:
    """A histogram's increase from ``first`` to ``last``, merged over engines."""
    parts: list[BucketCounts] = []
    for name, engine in last.snapshot.engines.items():
        current = pick(engine)
        if current is None:
            continue
        before = first.snapshot.engines.get(name)
        old = pick(before) if before is not None else None
        delta = histogram_increase(old, current, reset=last.restarted)
        if delta is not None:
            parts.append(delta)
    return merge_buckets(parts)


def _histogram_quantile(
    first: Sample, last: Sample, pick: Callable[[EngineMetrics], Histogram | None], q: float
) -> float | None:
    merged = _histogram_delta(first, last, pick)
    return bucket_quantile(q, merged) if merged is not None else None


def window_samples(samples: Sequence[Sample], start_s: float, end_s: float) -> list[Sample]:
    """The samples of ``[start_s, end_s]`` and the last one before it (counters start there).

    Falls back to every sample when fewer than two fall in the window.
    """
    inside = [i for i, s in enumerate(samples) if start_s <= s.t <= end_s]
    if len(inside) < 2:
        return list(samples)
    first = max(0, inside[0] - 1)
    return list(samples[first : inside[-1] + 1])


def _headroom(
    samples: Sequence[Sample], *, running_limit: RunningLimit | None, max_model_len: int | None
) -> tuple[list[float], float | None]:
    """The sidecar's p95 headroom at each sample, and its p95 ceiling at the last."""
    windows = WindowSettings(context_seconds=_WHOLE_STEP, rate_seconds=_WHOLE_STEP)
    values: list[float] = []
    ceiling = None
    for k in range(len(samples)):
        derived = derive_target(
            samples[: k + 1],
            windows=windows,
            max_model_len=max_model_len,
            running_limit=running_limit,
        )
        available = [
            e.p95_available_sequences
            for e in derived.engines
            if e.p95_available_sequences is not None
        ]
        if available:
            values.append(math.fsum(available))
        ceilings = [
            e.p95_ceiling_sequences for e in derived.engines if e.p95_ceiling_sequences is not None
        ]
        ceiling = math.fsum(ceilings) if ceilings else ceiling
    return values, ceiling


def evaluate_step(
    load: Load,
    *,
    samples: Sequence[Sample],
    requests: Sequence[RequestResult],
    started_s: float,
    sending_s: float,
    window: tuple[float, float],
    limits: Limits,
    running_limit: RunningLimit | None = None,
    max_model_len: int | None = None,
    stopped_early: str | None = None,
) -> StepResult:
    """The figures and the verdict of one step (see the module docstring).

    ``samples`` are the step's metric samples (times on the runner's clock, the first one taken
    just before the step started); ``window`` is the measurement window on the same clock.
    """
    start, end = window
    span = max(end - start, 1e-9)
    measured = window_samples(samples, start, end)
    inside = [s for s in measured if start <= s.t <= end] or measured
    completed = [r for r in requests if r.ok]
    failed = [r for r in requests if r.error is not None and r.error not in _NOT_FAILED]
    cancelled = [r for r in requests if r.error == "cancelled"]
    not_sent = sum(r.error == NOT_SENT for r in requests)
    finished_in_window = [r for r in completed if start <= r.end_s <= end]
    # Latencies of the requests that started in the window (the load had settled), else all.
    settled = [r for r in completed if r.start_s >= start] or completed

    def series(pick: Callable[[EngineMetrics], float | None]) -> list[float]:
        return [v for s in inside if (v := _engines_sum(s.snapshot, pick)) is not None]

    running = series(lambda e: e.requests_running)
    waiting = series(lambda e: e.requests_waiting)
    usage = [
        v
        for s in inside
        if (v := _engines_mean(s.snapshot, lambda e: e.kv_cache_usage_ratio)) is not None
    ]
    counter_span = measured[-1].t - measured[0].t if len(measured) > 1 else 0.0
    preemptions = _increase(measured, lambda e: e.preemptions_total)
    finished = _increase(measured, lambda e: e.requests_finished_total)
    generated = _increase(measured, lambda e: e.generation_tokens_total)
    prompted = _increase(measured, lambda e: e.prompt_tokens_total)
    per_request = None
    if preemptions is not None:
        done = finished if finished else float(len(finished_in_window))
        per_request = preemptions / done if done > 0 else None

    def rate(value: float | None) -> float | None:
        return value / counter_span if value is not None and counter_span > 0 else None

    headroom, ceiling = _headroom(
        [s for s in samples if s.t <= end],
        running_limit=running_limit,
        max_model_len=max_model_len,
    )
    window_headroom = headroom[-len(inside) :] if headroom else []
    ttfts = [t for r in settled if (t := r.ttft_s) is not None]
    queued = _histogram_delta(measured[0], measured[-1], lambda e: e.request_queue_time)
    tpots = [t for r in settled if (t := r.tpot_s) is not None]
    result = StepResult(
        load=load,
        started_s=started_s,
        sending_s=sending_s,
        window_s=span,
        sent=len(requests) - not_sent,
        completed=len(completed),
        failed=len(failed),
        cancelled=len(cancelled),
        not_sent=not_sent,
        failure_kinds=tuple(sorted({r.error for r in failed if r.error is not None})),
        achieved_rps=len(finished_in_window) / span,
        in_flight_mean=in_flight(requests, start, end) if end > start else None,
        output_tokens_per_s=rate(generated),
        prompt_tokens_per_s=rate(prompted),
        ttft_p50_s=percentile(ttfts, 0.5),
        ttft_p95_s=percentile(ttfts, 0.95),
        tpot_p50_s=percentile(tpots, 0.5),
        tpot_p95_s=percentile(tpots, 0.95),
        latency_p50_s=percentile([r.latency_s for r in settled], 0.5),
        latency_p95_s=percentile([r.latency_s for r in settled], 0.95),
        server_itl_p95_s=_histogram_quantile(
            measured[0], measured[-1], lambda e: e.inter_token_latency, 0.95
        ),
        server_ttft_p95_s=_histogram_quantile(
            measured[0], measured[-1], lambda e: e.time_to_first_token, 0.95
        ),
        server_queue_mean_s=queued.mean if queued is not None else None,
        running_mean=_mean(running),
        running_max=max(running) if running else None,
        waiting_mean=_mean(waiting),
        waiting_max=max(waiting) if waiting else None,
        kv_usage_mean=_mean(usage),
        kv_usage_max=max(usage) if usage else None,
        preemptions=preemptions,
        preemptions_per_s=rate(preemptions),
        preemptions_per_request=per_request,
        headroom_min=min(window_headroom) if window_headroom else None,
        headroom_mean=_mean(window_headroom),
        ceiling_sequences=ceiling,
        stopped_early=stopped_early,
        reads=len(inside),
    )
    return _with_verdict(result, limits)


def violations(step: StepResult, limits: Limits) -> tuple[str, ...]:
    """Why a step breaks the limits, one short phrase each (empty: within every limit)."""
    found: list[str] = []
    if step.stopped_early is not None:
        found.append(f"stopped early: {step.stopped_early}")
    if step.failed:
        kinds = f" ({', '.join(step.failure_kinds)})" if step.failure_kinds else ""
        found.append(f"{step.failed} requests failed{kinds}")
    if step.not_sent:
        found.append(
            f"{step.not_sent} arrivals not sent: the client already had the most requests in "
            "flight it keeps"
        )
    # Every comparison is written to hold only for numbers within the limit: a NaN measure or
    # limit is a violation (fail closed), never a pass.
    if step.preemptions:
        per_request = step.preemptions_per_request
        if per_request is None or not per_request <= limits.max_preemptions_per_request:
            shown = "no request finished" if per_request is None else f"{per_request:.2f}/request"
            found.append(f"{step.preemptions:.0f} preemptions ({shown})")
    if step.waiting_mean is not None and not step.waiting_mean <= limits.max_waiting:
        found.append(f"{step.waiting_mean:.1f} requests waiting on average")
    for name, objective, measured in (
        ("TTFT", limits.ttft_p95_s, step.ttft_p95_s),
        ("TPOT", limits.tpot_p95_s, step.tpot_p95_s),
    ):
        if objective is not None and measured is not None and not measured <= objective:
            found.append(f"{name} p95 {measured:.3g} s > {objective:g} s")
    if step.sent and not step.completed:
        found.append("no request completed")
    return tuple(found)


def _with_verdict(step: StepResult, limits: Limits) -> StepResult:
    return replace(step, violations=violations(step, limits))


def early_stop(samples: Sequence[Sample], limits: Limits) -> str | None:
    """Why a running step should stop now (it has clearly failed), or None to go on.

    ``samples`` are the step's samples so far, the first one taken just before it started. Fail
    closed: a NaN count or limit stops the step.
    """
    if not samples:
        return None
    preempted = _increase(samples, lambda e: e.preemptions_total)
    if preempted is not None and not preempted < limits.stop_preemptions:
        return f"{preempted:.0f} preemptions"
    waiting = _engines_sum(samples[-1].snapshot, lambda e: e.requests_waiting)
    if waiting is not None and not waiting < limits.stop_waiting:
        return f"{waiting:.0f} requests waiting"
    return None


def busy_unknown(snapshot: VllmSnapshot) -> str | None:
    """Why a snapshot cannot tell whether the target is busy; None when it can.

    Every engine must say how many requests run and wait: a gauge that is absent or was
    dropped as impossible (NaN, infinite, negative) reads as "unknown", never as 0 (idle).
    """
    if not snapshot.engines:
        return "it reports no engine"
    lacking = [
        e.engine
        for e in snapshot.engines.values()
        if e.requests_running is None or e.requests_waiting is None
    ]
    if not lacking:
        return None
    shown = ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
    return (
        f"engine {shown} reports no usable vllm:num_requests_running or "
        "vllm:num_requests_waiting (absent, NaN or negative)"
    )


def traffic_seen(before: VllmSnapshot, after: VllmSnapshot, *, seconds: float) -> str | None:
    """Why the target looks busy, as a phrase for the refusal; None when it is quiet.

    Busy: requests running or waiting now, or requests finished between the two snapshots. Fail
    closed: any value but 0 is busy, a NaN one included.
    """
    found: list[str] = []
    running = _engines_sum(after, lambda e: e.requests_running) or 0.0
    waiting = _engines_sum(after, lambda e: e.requests_waiting) or 0.0
    if running != 0:
        found.append(f"{running:.0f} requests running")
    if waiting != 0:
        found.append(f"{waiting:.0f} waiting")
    first = _engines_sum(before, lambda e: e.requests_finished_total)
    last = _engines_sum(after, lambda e: e.requests_finished_total)
    if first is not None and last is not None:
        finished = window_increase([first, last])
        if finished != 0:
            found.append(f"{finished:.0f} requests finished in {seconds:g} s")
    return ", ".join(found) or None
