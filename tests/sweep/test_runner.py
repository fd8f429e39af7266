"""Specification of the sweep against the simulated vLLM, in simulated time.

The simulated engine (the demo's: paged KV blocks, ``max_num_seqs``, recompute preemption) gets
the sweep's requests directly and pausing advances its clock, so each sweep of several simulated
minutes takes about a second. Two configured capacities:

- **KV-bound**: 129 blocks of 16 tokens (128 usable) and requests of 100 + 156 tokens (16 blocks):
  the pool holds 8; ``max_num_seqs`` 1024.
- **max_num_seqs-bound**: the same pool with ``max_num_seqs`` 4.

Tolerances, stated once: in concurrency steps the knee is the configured capacity exactly (every
request in flight holds its full length at once). In rate steps (Poisson arrivals) the knee's
mean concurrency lies between 30 % and 100 % of the capacity: requests arrive in bursts, so the
peak reaches the capacity long before the mean does (queueing theory's Erlang C: with few seats
and no queueing allowed, the usable share is low), and the knee is one sqrt(2) step of the grid
below the first failure at worst. Measured: 48 % KV-bound, 44 % max_num_seqs-bound. The first
step past the knee is saturated: running at the scheduler's limit, or the pool full and
preempting.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from exporter.core.ceiling import RunningLimit
from exporter.core.derive import Sample, WindowSettings, derive_target
from exporter.errors import SourceError
from exporter.sim import Scenario, SimEngineConfig
from exporter.sweep import plan as sweep_plan
from exporter.sweep import runner
from exporter.sweep.evaluate import Limits
from exporter.sweep.knee import Binding, shape_ceiling
from exporter.sweep.plan import Mode, SweepPlan
from exporter.sweep.runner import SweepResult, SweepSetup, run_sweep
from exporter.sweep.shape import fixed_shape
from exporter.testing.simload import VirtualSimTarget

if TYPE_CHECKING:
    from exporter.core.snapshot import VllmSnapshot
    from exporter.sweep.evaluate import StepResult

#: KV bytes per token of the simulated model (Llama-3.1-8B-like).
BYTES_PER_TOKEN = 131_072
SHAPE = fixed_shape(100, 156)


def scenario(max_num_seqs: int) -> Scenario:
    """129 blocks of 16 tokens (one is vLLM's null block): 2,048 usable tokens."""
    return Scenario(
        engine=SimEngineConfig(
            block_size=16,
            max_model_len=1024,
            max_num_seqs=max_num_seqs,
            kv_cache_memory_bytes=129 * 16 * BYTES_PER_TOKEN,
        )
    )


def sweep(
    max_num_seqs: int,
    mode: Mode,
    *,
    target: VirtualSimTarget | None = None,
    source: object = None,
    interrupt_after: int | None = None,
    **plan: float,
) -> SweepResult:
    """Run a whole sweep against the simulated engine in simulated time."""
    target = target or VirtualSimTarget(scenario(max_num_seqs), resolution_s=0.02)
    limit = RunningLimit(max_num_seqs, "setting")
    interrupt = asyncio.Event()

    def on_step(index: int | None, _step: StepResult) -> None:
        if interrupt_after is not None and index == interrupt_after:
            interrupt.set()

    async def go() -> SweepResult:
        snapshot = await target.read()
        engines = derive_target(
            [Sample(0.0, snapshot)], windows=WindowSettings(), running_limit=limit
        ).engines
        setup = SweepSetup(
            plan=SweepPlan(
                mode=mode,
                levels=(),
                step_seconds=plan.pop("step_seconds", 30.0),
                settle_seconds=plan.pop("settle_seconds", 10.0),
                **plan,  # type: ignore[arg-type]
            ),
            limits=Limits(),
            shape=SHAPE,
            ceiling=shape_ceiling(engines, SHAPE, limit),
            running_limit=limit,
            max_model_len=1024,
        )
        return await run_sweep(
            setup,
            driver=target.driver,
            source=source or target,  # type: ignore[arg-type]
            clock=target.clock,
            pause=target.pause,
            interrupt=interrupt,
            on_step=on_step,
        )

    return asyncio.run(go())


@pytest.fixture(scope="module")
def kv_concurrency() -> SweepResult:
    """The KV-bound engine under concurrency steps."""
    return sweep(1024, Mode.CONCURRENCY)


@pytest.fixture(scope="module")
def seats_concurrency() -> SweepResult:
    """The max_num_seqs-bound engine under concurrency steps."""
    return sweep(4, Mode.CONCURRENCY)


@pytest.fixture(scope="module")
def kv_rate() -> SweepResult:
    """The KV-bound engine under rate steps."""
    return sweep(1024, Mode.RATE)


@pytest.fixture(scope="module")
def seats_rate() -> SweepResult:
    """The max_num_seqs-bound engine under rate steps."""
    return sweep(4, Mode.RATE)


def test_concurrency_knee_is_the_kv_capacity_exactly(kv_concurrency: SweepResult) -> None:
    """8 concurrent fit the pool with no preemption; 10 preempt: the knee is 8, bound by KV."""
    knee = kv_concurrency.knee
    assert knee.ceiling.sequences == 8
    assert knee.load is not None
    assert knee.load.level == 8
    assert knee.running_max == 8
    assert knee.in_flight_mean == pytest.approx(8, rel=0.02)
    assert knee.usable_ratio == pytest.approx(1.0, rel=0.02)
    assert knee.binding == Binding.KV_CACHE
    past = kv_concurrency.steps[knee.first_failure or 0]
    assert past.preemptions
    assert past.preemptions > 0
    assert all(not s.preemptions for s in kv_concurrency.steps[: knee.first_failure])
    assert kv_concurrency.ended == "knee found"
    assert kv_concurrency.idle_after is True


def test_concurrency_knee_is_max_num_seqs_exactly_when_it_binds(
    seats_concurrency: SweepResult,
) -> None:
    """With max_num_seqs 4 the fifth client waits, KV half free: the knee is 4, bound by it."""
    knee = seats_concurrency.knee
    assert knee.ceiling.sequences == 4
    assert knee.ceiling.limited_by == "max_num_seqs"
    assert knee.load is not None
    assert knee.load.level == 4
    assert knee.usable_ratio == pytest.approx(1.0, rel=0.02)
    assert knee.binding == Binding.MAX_NUM_SEQS
    past = seats_concurrency.steps[knee.first_failure or 0]
    assert past.running_max == 4
    assert past.waiting_mean
    assert past.waiting_mean > 0.5
    assert not past.preemptions
    assert past.kv_usage_max is not None
    assert past.kv_usage_max <= 0.55


def test_every_step_reads_vllms_latency_and_queue_histograms(
    kv_concurrency: SweepResult, seats_concurrency: SweepResult
) -> None:
    """The server-side figures come from vLLM's own histograms over each step's window.

    The runner keeps whole snapshots: the sidecar's lean window samples leave those histograms
    out. Requests queue only where a limit binds: behind max_num_seqs they wait for a seat.
    """
    for result in (kv_concurrency, seats_concurrency):
        for step in result.steps:
            assert step.server_ttft_p95_s is not None
            assert step.server_itl_p95_s is not None
            assert step.server_queue_mean_s is not None
    knee = seats_concurrency.knee
    assert knee.index is not None
    below = seats_concurrency.steps[: knee.index + 1]
    past = seats_concurrency.steps[knee.first_failure or 0]
    assert past.server_queue_mean_s is not None
    assert all((s.server_queue_mean_s or 0.0) < 0.01 for s in below)
    assert past.server_queue_mean_s > 0.1


def test_rate_knee_holds_a_stated_share_of_the_kv_capacity(kv_rate: SweepResult) -> None:
    """Under Poisson arrivals the knee runs 30 to 100 % of the 8 the pool holds.

    Past it, the pool fills and vLLM preempts.
    """
    knee = kv_rate.knee
    assert knee.binding == Binding.KV_CACHE
    assert knee.usable_ratio is not None
    assert 0.3 <= knee.usable_ratio <= 1.0
    past = kv_rate.steps[knee.first_failure or 0]
    assert past.preemptions
    assert past.kv_usage_max is not None
    assert past.kv_usage_max >= 0.9
    # The knee's rate cannot pass the rate that would fill the ceiling at single-request latency.
    assert kv_rate.single_latency_s is not None
    assert knee.load is not None
    assert knee.load.level <= 8 / kv_rate.single_latency_s


def test_rate_knee_holds_a_stated_share_of_max_num_seqs(seats_rate: SweepResult) -> None:
    """With max_num_seqs 4 the first step past the knee runs exactly 4 with requests queued."""
    knee = seats_rate.knee
    assert knee.binding == Binding.MAX_NUM_SEQS
    assert knee.usable_ratio is not None
    assert 0.3 <= knee.usable_ratio <= 1.0
    past = seats_rate.steps[knee.first_failure or 0]
    assert past.running_max == 4
    assert not past.preemptions


def test_rate_steps_rise_on_a_grid_and_stop_one_step_past_the_knee(kv_rate: SweepResult) -> None:
    """Levels are chosen from the ceiling and the baseline; one step runs past the knee."""
    levels = [s.load.level for s in kv_rate.steps]
    assert levels == list(kv_rate.levels[: len(levels)])
    assert kv_rate.knee.first_failure == len(levels) - 2
    assert kv_rate.baseline is not None
    assert kv_rate.baseline.completed == 3


def test_the_sweep_stops_at_its_time_budget() -> None:
    """A step that would end past --max-duration is not started."""
    result = sweep(1024, Mode.CONCURRENCY, max_total_seconds=100.0)
    assert result.ended == "time budget reached"
    assert result.elapsed_s <= 100.0


def test_the_sweep_stops_at_its_request_budget() -> None:
    """A step that would send past --max-requests is not started."""
    result = sweep(1024, Mode.RATE, max_total_requests=100)
    assert result.ended == "request budget reached"
    assert result.requests_sent <= 100


def test_an_interrupted_sweep_returns_what_it_measured_and_leaves_the_target_idle() -> None:
    """Ctrl-C during a step: it is not counted, the rest is reported, the engine drains."""
    target = VirtualSimTarget(scenario(1024), resolution_s=0.02)
    result = sweep(1024, Mode.CONCURRENCY, target=target, interrupt_after=1)
    assert result.interrupted
    assert result.ended == "interrupted"
    assert len(result.steps) == 2
    assert result.idle_after is True
    assert not target.tracker.busy


class FailingSource:
    """A target whose metrics stop answering after the first reads."""

    def __init__(self, target: VirtualSimTarget, good_reads: int) -> None:
        self.target = target
        self.left = good_reads

    async def read(self) -> VllmSnapshot:
        self.left -= 1
        if self.left < 0:
            raise SourceError("connection_refused", "GET /metrics: connection failed")
        return await self.target.read()


def test_a_target_that_stops_answering_ends_the_sweep_with_what_was_measured() -> None:
    """Five failed reads in a row end the sweep; the steps done so far are kept."""
    target = VirtualSimTarget(scenario(1024), resolution_s=0.02)
    result = sweep(1024, Mode.CONCURRENCY, target=target, source=FailingSource(target, 80))
    assert result.ended.startswith("the target's metrics failed 5 times")
    assert result.idle_after is None


def test_a_step_past_the_request_budget_is_refused_before_its_requests_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The budget is checked on the step's count: a rate of 10^12 req/s builds nothing first."""
    built: list[int] = []
    original = sweep_plan.arrival_offsets

    def recording(rate: float, duration_s: float, *, seed: int) -> tuple[float, ...]:
        offsets = original(rate, duration_s, seed=seed)
        built.append(len(offsets))
        return offsets

    monkeypatch.setattr(runner, "arrival_offsets", recording)
    result = sweep(1024, Mode.RATE, max_total_requests=100)
    assert result.ended == "request budget reached"
    assert result.baseline is not None
    assert sum(built) <= 100 - result.baseline.sent
