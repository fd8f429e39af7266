"""The knee of a sweep, the limit that binds there, and the ceiling it is compared with.

- **The knee** is the highest load level that kept within every limit (no preemption beyond the
  limit, no queueing, the latency objectives met, no failed request) *before* the first step that
  broke one. Steps run in rising order, so this is the last good step before the first bad one; a
  good step after a bad one (noise) does not move the knee up.
- **The concurrency at the knee** is the mean of the requests in flight there, as the client timed
  them (by Little's law, the achieved rate times the latency); vLLM's running requests there, their
  mean and peak as its gauges were read, are reported beside it.
- **The ceiling** is what the memory arithmetic says for the lengths the sweep sent: the target's
  usable KV tokens (vLLM's own pool, ``cache_config_info``) over the blocks one p95-length request
  holds (:func:`~exporter.core.derive.sequences_that_fit`), capped by ``max_num_seqs``
  (:func:`~exporter.core.ceiling.ceiling`), summed over engines. Concurrency at the knee over
  this ceiling says how much of the memory ceiling is usable in practice (without the client's
  timings, vLLM's mean running requests stand in for it).
- **The binding limit** is read from the first step past the knee: ``max_num_seqs`` when the
  running requests sat at the scheduler's limit with requests waiting (seen by the waiting gauge,
  or vLLM's mean queue time over the step above ``QUEUED_MEAN_S``) and no preemption;
  ``kv_cache`` when vLLM preempted, or queued with the pool (nearly) full; ``compute`` when the
  step broke a latency objective (or queued) with seats and blocks to spare; ``errors`` when only
  failed requests broke it. ``not_reached`` when no step broke a limit.

Pure: plain values in, plain values out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from exporter.core.ceiling import ceiling as ceiling_under_limits
from exporter.core.derive import sequences_that_fit
from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.core.ceiling import RunningLimit
    from exporter.core.derive import EngineDerived
    from exporter.sweep.evaluate import StepResult
    from exporter.sweep.plan import Load
    from exporter.sweep.shape import TrafficShape

#: KV usage at or above which the pool counts as full (vLLM's usage is block-granular).
KV_FULL_RATIO = 0.9
#: vLLM's mean queue time over a step above which its requests waited for a seat or blocks:
#: well above one engine step (a request arriving mid-step waits for the next; tens of ms on a
#: GPU, up to ~0.1 s on a CPU backend), so that only real queueing counts.
QUEUED_MEAN_S = 0.25


class Binding(StrEnum):
    """What stopped the target from taking more load."""

    KV_CACHE = "kv_cache"
    MAX_NUM_SEQS = "max_num_seqs"
    COMPUTE = "compute"
    ERRORS = "errors"
    #: No step broke a limit: the knee is at or above the highest level sent.
    NOT_REACHED = "not_reached"


@dataclass(frozen=True, slots=True)
class TargetCeiling:
    """The memory arithmetic's ceiling for the lengths sent, summed over the target's engines."""

    p95_context_tokens: int
    mean_context_tokens: float
    usable_tokens: float | None = None
    block_size: int | None = None
    #: Sequences of p95 (and mean) length the KV pool alone holds.
    kv_p95_sequences: float | None = None
    kv_mean_sequences: float | None = None
    max_num_seqs: int | None = None
    max_num_seqs_source: str | None = None
    #: The p95 ceiling under every limit, and the limit that sets it.
    sequences: float | None = None
    limited_by: str | None = None


def shape_ceiling(
    engines: Sequence[EngineDerived], shape: TrafficShape, running_limit: RunningLimit | None
) -> TargetCeiling:
    """The ceiling for ``shape`` on the engines as the sidecar derived them before the sweep."""
    p95 = shape.context_quantile(0.95)
    mean = shape.mean_context_tokens
    kv_p95: list[float] = []
    kv_mean: list[float] = []
    under: list[float] = []
    limits: set[str] = set()
    usable_total: list[float] = []
    block = None
    for engine in engines:
        usable, block_size = engine.kv_usable_tokens, engine.kv_block_size_tokens
        kv = mean_kv = None
        if usable is not None:
            granule = block_size or 1
            kv = sequences_that_fit(usable, p95, granule)
            mean_kv = sequences_that_fit(usable, mean, granule)
            kv_p95.append(kv)
            kv_mean.append(mean_kv)
            usable_total.append(usable)
            block = block_size
        found = ceiling_under_limits(
            kv, running_limit=running_limit.sequences if running_limit else None
        )
        if found is not None:
            under.append(found.sequences)
            limits.add(str(found.limited_by))
    return TargetCeiling(
        p95_context_tokens=p95,
        mean_context_tokens=mean,
        usable_tokens=math.fsum(usable_total) if usable_total else None,
        block_size=block,
        kv_p95_sequences=math.fsum(kv_p95) if kv_p95 else None,
        kv_mean_sequences=math.fsum(kv_mean) if kv_mean else None,
        max_num_seqs=running_limit.sequences if running_limit else None,
        max_num_seqs_source=running_limit.source if running_limit else None,
        sequences=math.fsum(under) if under else None,
        limited_by=limits.pop() if len(limits) == 1 else None,
    )


def check_capacity(
    engines: Sequence[EngineDerived], shape: TrafficShape, ceiling: TargetCeiling
) -> None:
    """Raise :class:`UsageError` when the target cannot hold the shape's requests: none is sent.

    The longest request must fit in the KV pool of one engine (rounded up to its blocks), and the
    ceiling, when known, must hold at least one sequence of the p95 length. A NaN pool or
    ceiling refuses too (fail closed): a sweep with no room would only measure failures, and an
    unbounded prompt would be built for nothing.
    """
    longest = shape.max_context_tokens
    pools = [
        (e.kv_usable_tokens, e.kv_block_size_tokens or 1)
        for e in engines
        if e.kv_usable_tokens is not None
    ]
    if pools and not any(sequences_that_fit(pool, longest, block) >= 1 for pool, block in pools):
        largest = max(pool for pool, _ in pools)
        raise UsageError(
            f"the traffic shape has a {longest:,}-token request but the target's KV pool holds "
            f"{largest:,.0f} tokens an engine; send shorter requests"
        )
    if ceiling.sequences is not None and not ceiling.sequences >= 1:
        raise UsageError(
            f"the target's ceiling is {ceiling.sequences:g} sequences of the p95 length "
            f"({ceiling.p95_context_tokens:,} tokens): no request fits; send shorter requests"
        )


@dataclass(frozen=True, slots=True)
class Knee:
    """The sweep's answer: where the knee is, what binds, and how it compares to the ceiling."""

    ceiling: TargetCeiling
    binding: Binding
    #: Index of the knee step in the sweep's steps; None when the first step already failed.
    index: int | None = None
    load: Load | None = None
    #: Index of the first step that broke a limit, and why.
    first_failure: int | None = None
    failure_reasons: tuple[str, ...] = ()
    achieved_rps: float | None = None
    #: Requests in flight on average at the knee (client): the concurrency at the knee.
    in_flight_mean: float | None = None
    running_mean: float | None = None
    running_max: float | None = None
    #: The most requests vLLM ran at once in any step (what the target really holds).
    saturation_running: float | None = None
    #: Concurrency at the knee over the ceiling: the usable share of the memory ceiling.
    usable_ratio: float | None = None
    #: One line for a user when the answer needs a caveat.
    note: str | None = None


def binding_limit(step: StepResult, ceiling: TargetCeiling) -> Binding:
    """The limit that broke ``step`` (the first step past the knee); see the module docstring."""
    seats = ceiling.max_num_seqs
    preempted = (step.preemptions or 0.0) > 0
    # The waiting gauge is read once a poll and can miss short waits; the queue-time mean
    # counts every request the step finished, whenever it waited.
    queued = (step.waiting_max or 0.0) > 0 or (step.server_queue_mean_s or 0.0) > QUEUED_MEAN_S
    kv_full = (step.kv_usage_max or 0.0) >= KV_FULL_RATIO
    at_seats = seats is not None and (step.running_max or 0.0) >= seats
    if at_seats and queued and not preempted:
        return Binding.MAX_NUM_SEQS
    if preempted or (kv_full and queued):
        return Binding.KV_CACHE
    if at_seats and queued:
        return Binding.MAX_NUM_SEQS
    only_errors = step.failed and all("failed" in v for v in step.violations)
    if only_errors:
        return Binding.ERRORS
    return Binding.COMPUTE


def find_knee(steps: Sequence[StepResult], ceiling: TargetCeiling) -> Knee:
    """The knee of steps run in rising order (see the module docstring)."""
    running = [s.running_max for s in steps if s.running_max is not None]
    saturation = max(running) if running else None
    first_bad = next((i for i, s in enumerate(steps) if not s.ok), None)
    if not steps:
        return Knee(ceiling, Binding.NOT_REACHED, note="no step ran")
    if first_bad is None:
        index = len(steps) - 1
        binding = Binding.NOT_REACHED
        note = "no step broke a limit: the knee is at or above the highest level; add --levels"
        reasons: tuple[str, ...] = ()
    else:
        index = first_bad - 1 if first_bad > 0 else -1
        binding = binding_limit(steps[first_bad], ceiling)
        reasons = steps[first_bad].violations
        note = None
        if index < 0:
            note = "the first step already broke a limit: the knee is below it; give lower --levels"
    if index < 0:
        return Knee(
            ceiling,
            binding,
            first_failure=first_bad,
            failure_reasons=reasons,
            saturation_running=saturation,
            note=note,
        )
    knee = steps[index]
    ratio = None
    concurrency = knee.in_flight_mean if knee.in_flight_mean is not None else knee.running_mean
    if concurrency is not None and ceiling.sequences:
        ratio = concurrency / ceiling.sequences
    return Knee(
        ceiling,
        binding,
        index=index,
        load=knee.load,
        first_failure=first_bad,
        failure_reasons=reasons,
        achieved_rps=knee.achieved_rps,
        in_flight_mean=knee.in_flight_mean,
        running_mean=knee.running_mean,
        running_max=knee.running_max,
        saturation_running=saturation,
        usable_ratio=ratio,
        note=note,
    )
