"""The sweep itself: the imperative shell around the plan, the evaluation and the knee.

:func:`run_sweep` runs the baseline, then the plan's steps in rising order. During a step it reads
the target's metrics every ``sample_interval_s`` (through a :class:`MetricsSource`) while a
:class:`LoadDriver` sends the requests, and stops the step early when :func:`early_stop` says it
has clearly failed. After each step it lets the requests in flight finish (up to the plan's drain
time, then cancels them) and waits for the target to be idle again, so every step starts from an
empty engine. It stops ``past_knee`` steps after the first failure, at the time or request budget,
or at once when ``interrupt`` is set (Ctrl-C): then requests in flight are cancelled, which makes
vLLM abort them, and it waits for the target to be idle before returning what it measured.

Every seam is a parameter: the driver, the metrics source, the clock and the pause, so tests run
the same code against the simulator, in real time over HTTP or in simulated time.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from exporter.core.derive import next_sample
from exporter.errors import HeadroomError
from exporter.sweep.evaluate import (
    NOT_SENT,
    Limits,
    StepResult,
    busy_unknown,
    early_stop,
    evaluate_step,
)
from exporter.sweep.knee import Knee, TargetCeiling, find_knee
from exporter.sweep.plan import (
    Load,
    Mode,
    SweepPlan,
    arrival_count,
    arrival_offsets,
    auto_levels,
    draw_requests,
    next_step,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from exporter.core.ceiling import RunningLimit
    from exporter.core.derive import Sample
    from exporter.core.snapshot import VllmSnapshot
    from exporter.sweep.evaluate import RequestResult
    from exporter.sweep.shape import RequestShape, TrafficShape

#: Consecutive failed metric reads after which the sweep gives up on the target.
MAX_READ_FAILURES = 5
#: How long to wait for the target to be idle again after a step or an interruption.
IDLE_TIMEOUT_S = 60.0


class MetricsSource(Protocol):
    """Where the target's metrics come from (its ``/metrics``, parsed)."""

    async def read(self) -> VllmSnapshot:
        """One parsed snapshot; raises :class:`~exporter.errors.HeadroomError` on failure."""
        ...


class LoadDriver(Protocol):
    """What sends a step's requests and times them (times on the runner's clock)."""

    #: What the report calls it.
    name: str

    async def start(
        self, load: Load, requests: Sequence[RequestShape], *, offsets: Sequence[float] | None
    ) -> None:
        """Begin sending: at ``offsets`` (seconds from now, rate mode), else closed loop.

        Returns once the first request is about to go (the step's clock starts then).
        """
        ...

    @property
    def sending_done(self) -> bool:
        """True once every request has been sent (the schedule or the request list is spent)."""
        ...

    def stop_sending(self) -> None:
        """Send no more requests; those in flight go on."""
        ...

    async def finish(self, *, drain_s: float, abort: asyncio.Event) -> list[RequestResult]:
        """Return every request of the step, once those in flight have finished.

        Waits up to ``drain_s`` and cancels the rest, or cancels them at once when ``abort``
        is set.
        """
        ...


@dataclass(frozen=True, slots=True)
class SweepSetup:
    """Everything a sweep needs besides its seams."""

    plan: SweepPlan
    limits: Limits
    shape: TrafficShape
    ceiling: TargetCeiling
    running_limit: RunningLimit | None = None
    max_model_len: int | None = None
    sample_interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What a sweep measured and concluded."""

    driver: str
    levels: tuple[float, ...]
    steps: tuple[StepResult, ...]
    knee: Knee
    baseline: StepResult | None = None
    #: Why the sweep ended, one phrase.
    ended: str = "levels done"
    interrupted: bool = False
    #: Whether the target was idle when the sweep returned (None: could not tell).
    idle_after: bool | None = None
    elapsed_s: float = 0.0
    requests_sent: int = 0
    #: The single-request latency of the baseline (its fastest request).
    single_latency_s: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


class _Abort(Exception):
    """The target stopped answering: end the sweep with what was measured."""


@dataclass(slots=True)
class _Sweep:
    """The state of one sweep run; its methods are the shell's steps."""

    setup: SweepSetup
    driver: LoadDriver
    source: MetricsSource
    clock: Callable[[], float]
    pause: Callable[[float], Awaitable[None]]
    interrupt: asyncio.Event
    on_line: Callable[[str], None]
    started: float = 0.0
    sent: int = 0
    previous: Sample | None = None
    failures: int = 0
    notes: list[str] = field(default_factory=list)

    async def sample(self) -> Sample | None:
        """Read the target once; None on failure (aborts after too many in a row)."""
        try:
            snapshot = await self.source.read()
        except HeadroomError as exc:
            self.failures += 1
            if self.failures >= MAX_READ_FAILURES:
                raise _Abort(f"the target's metrics failed {self.failures} times: {exc}") from None
            return None
        self.failures = 0
        # Whole: a step's server figures come from the latency and queue-time histograms the
        # sidecar's lean samples leave out; a step holds tens of samples, not hundreds.
        self.previous = next_sample(self.previous, self.clock(), snapshot, whole=True)
        return self.previous

    async def wait_idle(self, timeout_s: float) -> bool | None:
        """Wait until nothing runs or waits on the target; its answer, None if unreadable."""
        deadline = self.clock() + timeout_s
        while True:
            try:
                sample = await self.sample()
            except _Abort:
                return None
            if sample is not None and _idle(sample.snapshot):
                return True
            if self.clock() >= deadline:
                return False if sample is not None else None
            await self.pause(min(0.5, self.setup.sample_interval_s))

    async def run_baseline(
        self, on_step: Callable[[int | None, StepResult], None]
    ) -> StepResult | None:
        """A few requests one at a time, then a wait for idle; None when interrupted."""
        plan = self.setup.plan
        self.on_line(f"baseline: {plan.baseline_requests} requests one at a time")
        requests = draw_requests(self.setup.shape, plan.baseline_requests, seed=plan.seed - 1)
        baseline = await self.run_step(
            Load(Mode.CONCURRENCY, 1),
            requests,
            offsets=None,
            seconds=plan.max_total_seconds,
            settle_s=0.0,
        )
        if baseline is not None:
            on_step(None, baseline)
            if await self.wait_idle(IDLE_TIMEOUT_S) is False:
                self.notes.append("the target was still busy after the baseline")
        return baseline

    async def run_step(
        self,
        load: Load,
        requests: Sequence[RequestShape],
        *,
        offsets: Sequence[float] | None,
        seconds: float,
        settle_s: float,
    ) -> StepResult | None:
        """Run one step; None when it was interrupted (not evaluated)."""
        setup = self.setup
        first = await self.sample()
        samples: list[Sample] = [first] if first is not None else []
        await self.driver.start(load, requests, offsets=offsets)
        # The step's clock starts once sending has begun (vLLM's client imports vLLM first).
        t0 = self.clock()
        deadline = t0 + seconds
        stopped: str | None = None
        while not self.interrupt.is_set():
            now = self.clock()
            if now >= deadline or self.driver.sending_done:
                break
            await self.pause(min(setup.sample_interval_s, deadline - now))
            sample = await self.sample()
            if sample is not None:
                samples.append(sample)
                stopped = early_stop(samples, setup.limits)
                if stopped is not None:
                    break
        sending_end = self.clock()
        self.driver.stop_sending()
        abort = asyncio.Event()
        if stopped is not None or self.interrupt.is_set():
            abort.set()
        drain = asyncio.create_task(
            self.driver.finish(drain_s=setup.plan.drain_seconds, abort=abort)
        )
        while not drain.done():
            if self.interrupt.is_set():
                abort.set()
            await asyncio.wait({drain}, timeout=0.2)
        results = drain.result()
        self.sent += sum(r.error != NOT_SENT for r in results)
        if self.interrupt.is_set():
            return None
        # Measure after the settle time, unless the step ended too soon for that to leave a few
        # samples (an early stop): then the whole step.
        window_start = t0 + settle_s
        if sending_end - window_start < 2 * setup.sample_interval_s:
            window_start = t0
        return evaluate_step(
            load,
            samples=samples,
            requests=results,
            started_s=t0 - self.started,
            sending_s=sending_end - t0,
            window=(window_start, sending_end),
            limits=setup.limits,
            running_limit=setup.running_limit,
            max_model_len=setup.max_model_len,
            stopped_early=stopped,
        )


def _idle(snapshot: VllmSnapshot) -> bool:
    """Nothing runs or waits; a gauge that cannot be read counts as busy (fail closed)."""
    if busy_unknown(snapshot) is not None:
        return False
    busy = 0.0
    for engine in snapshot.engines.values():
        busy += (engine.requests_running or 0.0) + (engine.requests_waiting or 0.0)
    return busy == 0


def _step_count(plan: SweepPlan, load: Load, *, single_latency_s: float | None) -> int:
    """How many requests one step sends: known before any of them is built."""
    if load.mode == Mode.RATE:
        return arrival_count(load.level, plan.step_seconds)
    # Closed loop: enough for the step at the baseline's pace (latency only grows with load).
    per_client = plan.step_seconds / single_latency_s if single_latency_s else 1000.0
    count = load.concurrency * max(2, math.ceil(per_client) + 1)
    return min(count, plan.max_total_requests)


def _step_requests(
    plan: SweepPlan, load: Load, shape: TrafficShape, *, seed: int, single_latency_s: float | None
) -> tuple[tuple[RequestShape, ...], tuple[float, ...] | None]:
    """The requests (and, in rate mode, their arrival offsets) of one step."""
    if load.mode == Mode.RATE:
        offsets = arrival_offsets(load.level, plan.step_seconds, seed=seed)
        return draw_requests(shape, len(offsets), seed=seed), offsets
    count = _step_count(plan, load, single_latency_s=single_latency_s)
    return draw_requests(shape, count, seed=seed), None


async def run_sweep(
    setup: SweepSetup,
    *,
    driver: LoadDriver,
    source: MetricsSource,
    clock: Callable[[], float],
    pause: Callable[[float], Awaitable[None]],
    interrupt: asyncio.Event | None = None,
    on_line: Callable[[str], None] = lambda _line: None,
    on_step: Callable[[int | None, StepResult], None] = lambda _index, _step: None,
) -> SweepResult:
    """Run the baseline and the steps; return what they measured and the knee.

    ``on_line`` gets progress lines as the sweep goes, ``on_step`` every finished step (index
    None for the baseline).
    """
    sweep = _Sweep(
        setup, driver, source, clock, pause, interrupt or asyncio.Event(), on_line, clock()
    )
    plan = setup.plan
    steps: list[StepResult] = []
    baseline: StepResult | None = None
    levels: tuple[float, ...] = plan.levels
    single: float | None = None
    ended = "levels done"
    try:
        baseline = await sweep.run_baseline(on_step)
        going_on = baseline is not None and baseline.completed > 0
        if baseline is not None and not going_on:
            ended = f"no baseline request completed ({'; '.join(baseline.violations)})"
        if going_on and baseline is not None:
            # The median of a few requests: the first one may pay for a cold start.
            single = baseline.latency_p50_s
        if not levels and going_on:
            # Without the KV pool the ceiling is max_num_seqs alone: no guide to the load.
            known = setup.ceiling.kv_p95_sequences is not None
            levels = auto_levels(
                plan.mode,
                ceiling=setup.ceiling.sequences if known else None,
                single_latency_s=single,
            )
        while going_on and not sweep.interrupt.is_set():
            index = next_step(levels, [s.ok for s in steps], past_knee=plan.past_knee)
            if index is None:
                ended = "knee found" if any(not s.ok for s in steps) else "levels done"
                break
            load = Load(plan.mode, levels[index])
            elapsed = clock() - sweep.started
            if elapsed + plan.step_seconds + plan.drain_seconds > plan.max_total_seconds:
                ended = "time budget reached"
                break
            # The budget is checked before the step's requests are built: a rate of 10^12
            # requests/s must not build 10^13 arrival times first.
            count = _step_count(plan, load, single_latency_s=single)
            if sweep.sent + count > plan.max_total_requests:
                ended = "request budget reached"
                break
            requests, offsets = _step_requests(
                plan, load, setup.shape, seed=plan.seed + index, single_latency_s=single
            )
            on_line(
                f"step {index + 1}/{len(levels)}: {load.describe()} for {plan.step_seconds:g} s"
            )
            step = await sweep.run_step(
                load,
                requests,
                offsets=offsets,
                seconds=plan.step_seconds,
                settle_s=plan.settle_seconds,
            )
            if step is None:
                break
            steps.append(step)
            on_step(index, step)
            idle = await sweep.wait_idle(IDLE_TIMEOUT_S)
            if idle is False:
                sweep.notes.append(f"the target was still busy after step {index + 1}")
    except _Abort as exc:
        ended = str(exc)
    interrupted = sweep.interrupt.is_set()
    if interrupted:
        ended = "interrupted"
        on_line("interrupted: requests in flight cancelled, waiting for the target to be idle")
    idle_after = await sweep.wait_idle(IDLE_TIMEOUT_S)
    return SweepResult(
        driver=driver.name,
        levels=levels,
        steps=tuple(steps),
        knee=find_knee(steps, setup.ceiling),
        baseline=baseline,
        ended=ended,
        interrupted=interrupted,
        idle_after=idle_after,
        elapsed_s=clock() - sweep.started,
        requests_sent=sweep.sent,
        single_latency_s=single,
        notes=tuple(sweep.notes),
    )
