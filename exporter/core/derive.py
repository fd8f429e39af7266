"""Derived capacity figures for one vLLM target, from a window of recent snapshots.

Everything here is a pure function of plain data: the samples (monotonic time + parsed
snapshot), the settings of the windows, and the predicted capacity from the sizing model. The
poller owns the clock and the window; the collector turns the result into metric families.

Definitions (documented for users in ``docs/metrics.md``):

- **Capacity** is vLLM's own figure: ``kv_cache_size_tokens`` from ``cache_config_info`` when
  exposed (0.24+), else ``num_gpu_blocks x block_size`` per engine (``num_gpu_blocks`` is the
  sum over data-parallel engines). One block of it is vLLM's reserved null block, so running
  requests can hold at most ``capacity x (blocks - 1) / blocks`` tokens: the *usable* tokens.
- **Tokens in use** = ``kv_cache_usage_perc x usable tokens``, rounded to whole blocks
  (block-granular; evictable prefix-cache blocks count as free, as in vLLM).
- **Context length** of a finished request = prompt + generated tokens. Its quantiles come from
  the per-request histograms ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens``: the observations added within the context window (bucket
  deltas), interpolated inside a bucket as PromQL's ``histogram_quantile`` does, and the
  context quantile is the *sum* of the prompt and generation quantiles. That sum is exact when
  long prompts go with long outputs and an upper bound otherwise, so capacity at p95 errs on the
  safe side; bucket interpolation adds up to a bucket's width of error either way. The mean is
  exact (from the histograms' sums). When no request finished within the window, the figures
  fall back to everything vLLM has finished since it started; with nothing finished at all
  they are absent.
- **Sequences at context T** need ``ceil(T / block_size)`` blocks each: the *ceiling* is how
  many fit in the usable tokens, the *available* figure how many more fit in the free tokens
  now (the headroom), both counted in whole sequences.
- **Preemption rate** is the reset-aware increase of ``vllm:num_preemptions_total`` over the
  rate window divided by the time it spans; per finished request it is divided by the increase
  of ``vllm:request_success_total`` instead (absent when nothing finished).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from exporter.core.windows import (
    BucketCounts,
    bucket_quantile,
    histogram_increase,
    merge_buckets,
    window_increase,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from exporter.core.snapshot import EngineMetrics, Histogram, VllmSnapshot

#: The quantiles of context length we derive.
CONTEXT_QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class Sample:
    """One successful poll of a target: monotonic time in seconds and the parsed payload."""

    t: float
    snapshot: VllmSnapshot
    #: vLLM restarted between the previous sample and this one; set once, by
    #: :func:`next_sample`, and read by every window that spans the two.
    restarted: bool = False


@dataclass(frozen=True, slots=True)
class WindowSettings:
    """Lengths of the windows the derivations look back over, in seconds."""

    #: Requests finished within this window make up the context-length distribution.
    context_seconds: float = 600.0
    #: Preemption and request rates are averaged over this window.
    rate_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class ContextEstimate:
    """Context length (prompt + output tokens) of finished requests."""

    #: Quantile -> tokens, for :data:`CONTEXT_QUANTILES`.
    quantiles: Mapping[float, float]
    mean: float
    #: Requests finished within the context window (0: the figures are since vLLM started).
    window_requests: float
    #: ``"window"`` or ``"lifetime"`` (nothing finished within the window).
    basis: str


@dataclass(frozen=True, slots=True)
class EngineDerived:
    """Everything derived for one vLLM engine (one data-parallel rank)."""

    engine: str
    model_name: str
    kv_blocks: float | None = None
    kv_block_size_tokens: int | None = None
    kv_capacity_tokens: float | None = None
    kv_capacity_predicted_tokens: float | None = None
    kv_capacity_error_ratio: float | None = None
    kv_usable_tokens: float | None = None
    kv_used_tokens: float | None = None
    kv_free_tokens: float | None = None
    kv_usage_ratio: float | None = None
    context: ContextEstimate | None = None
    p95_ceiling_sequences: float | None = None
    mean_ceiling_sequences: float | None = None
    p95_available_sequences: float | None = None
    p95_available_ratio: float | None = None
    preemptions_per_second: float | None = None
    preemptions_per_finished_request: float | None = None
    finished_requests_per_second: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    requests_waiting_by_reason: Mapping[str, float] = field(default_factory=dict)

    def context_quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the context length, if estimated."""
        return self.context.quantiles.get(q) if self.context is not None else None

    @property
    def context_p50_tokens(self) -> float | None:
        """Median context length."""
        return self.context_quantile(0.5)

    @property
    def context_p95_tokens(self) -> float | None:
        """95th percentile context length."""
        return self.context_quantile(0.95)

    @property
    def context_p99_tokens(self) -> float | None:
        """99th percentile context length."""
        return self.context_quantile(0.99)

    @property
    def context_mean_tokens(self) -> float | None:
        """Mean context length (exact from the histograms' sums)."""
        return self.context.mean if self.context is not None else None

    @property
    def context_window_requests(self) -> float | None:
        """Requests the context figures are drawn from (0: since vLLM started)."""
        return self.context.window_requests if self.context is not None else None


@dataclass(frozen=True, slots=True)
class TargetDerived:
    """The derived figures of one target at its latest sample."""

    engines: tuple[EngineDerived, ...]
    #: A restart was detected between the last two samples.
    restarted: bool = False


def _engine_counters(engine: EngineMetrics) -> tuple[float | None, ...]:
    return (
        engine.preemptions_total,
        engine.requests_finished_total,
        engine.prompt_tokens_total,
        engine.generation_tokens_total,
        engine.prompt_tokens.count if engine.prompt_tokens else None,
        engine.generation_tokens.count if engine.generation_tokens else None,
    )


class RestartEvidence(StrEnum):
    """What says vLLM restarted between two snapshots, or that it cannot be one vLLM."""

    #: A later ``process_start_time_seconds``: a new process, certain.
    START_TIME = "start_time"
    #: A cumulative counter went down and no start time says otherwise (not exposed): a
    #: restart once in a while, a broken target when it keeps happening.
    COUNTERS = "counters"
    #: The start time went back, or counters went down under the same start time: no single
    #: process does that (several vLLMs behind one URL, or not vLLM).
    IMPOSSIBLE = "impossible"


def restart_evidence(previous: VllmSnapshot, current: VllmSnapshot) -> RestartEvidence | None:
    """Why vLLM looks restarted between two consecutive snapshots, or None.

    Evidence: a later ``process_start_time_seconds``, or any cumulative counter of an engine
    present in both going down (impossible for the same process start time).
    """
    before, now = previous.process_start_time_seconds, current.process_start_time_seconds
    known = before is not None and now is not None
    if known and now > before:  # type: ignore[operator]
        return RestartEvidence.START_TIME
    if known and now < before:  # type: ignore[operator]
        return RestartEvidence.IMPOSSIBLE
    for name, engine in current.engines.items():
        old = previous.engines.get(name)
        if old is None:
            continue
        for a, b in zip(_engine_counters(old), _engine_counters(engine), strict=True):
            if a is not None and b is not None and b < a:
                return RestartEvidence.IMPOSSIBLE if known else RestartEvidence.COUNTERS
    return None


def detect_restart(previous: VllmSnapshot, current: VllmSnapshot) -> bool:
    """Whether vLLM restarted between two consecutive snapshots (any evidence)."""
    return restart_evidence(previous, current) is not None


def next_sample(previous: Sample | None, t: float, snapshot: VllmSnapshot) -> Sample:
    """The sample that follows ``previous``, with a restart between the two detected once.

    The sample keeps only what the windows read (:func:`window_snapshot`), sharing with
    ``previous`` whatever did not change: a window holds hundreds of samples.
    """
    restarted = previous is not None and detect_restart(previous.snapshot, snapshot)
    lean = window_snapshot(snapshot, previous.snapshot if previous is not None else None)
    return Sample(t, lean, restarted)


def window_snapshot(snapshot: VllmSnapshot, previous: VllmSnapshot | None) -> VllmSnapshot:
    """``snapshot`` without what no derivation reads, sharing unchanged parts with ``previous``.

    The latency histograms are left out (no derivation reads them); the ``cache_config_info``
    facts, the family names and the histograms' bucket bounds are the previous sample's
    objects when equal, so that a window of samples holds one copy of them.
    """
    engines: dict[str, EngineMetrics] = {}
    for name, engine in snapshot.engines.items():
        old = previous.engines.get(name) if previous is not None else None
        config = engine.cache_config
        if old is not None and config is not None and config == old.cache_config:
            config = old.cache_config
        engines[name] = replace(
            engine,
            prompt_tokens=_shared_bounds(engine.prompt_tokens, old.prompt_tokens if old else None),
            generation_tokens=_shared_bounds(
                engine.generation_tokens, old.generation_tokens if old else None
            ),
            time_to_first_token=None,
            inter_token_latency=None,
            e2e_request_latency=None,
            request_queue_time=None,
            cache_config=config,
        )
    families = snapshot.families
    if previous is not None and families == previous.families:
        families = previous.families
    return replace(snapshot, engines=engines, families=families)


def _shared_bounds(histogram: Histogram | None, old: Histogram | None) -> Histogram | None:
    if histogram is None or old is None or histogram.bounds is old.bounds:
        return histogram
    if histogram.bounds == old.bounds:
        return replace(histogram, bounds=old.bounds)
    return histogram


def _restarts(samples: Sequence[Sample]) -> list[bool]:
    """``flags[i]``: a restart between sample ``i - 1`` and ``i``; none before the first one."""
    return [False] + [sample.restarted for sample in samples[1:]]


def _tail(samples: Sequence[Sample], seconds: float) -> int:
    """Index of the first sample within ``seconds`` of the last one."""
    if not samples:
        return 0
    start = samples[-1].t - seconds
    for i, sample in enumerate(samples):
        if sample.t >= start:
            return i
    return len(samples) - 1


def _histogram_window(
    samples: Sequence[Sample],
    engine: str,
    pick: Callable[[EngineMetrics], Histogram | None],
) -> BucketCounts | None:
    parts: list[BucketCounts] = []
    previous: Histogram | None = None
    pending_reset = False  # a restart seen while the histogram was absent applies to its return
    for i, sample in enumerate(samples):
        pending_reset |= sample.restarted and i > 0
        metrics = sample.snapshot.engines.get(engine)
        current = pick(metrics) if metrics else None
        if current is None:
            continue
        if previous is not None or pending_reset:
            part = histogram_increase(previous, current, reset=pending_reset)
            if part is not None:
                parts.append(part)
        previous, pending_reset = current, False
    return merge_buckets(parts)


def _lifetime(histogram: Histogram | None) -> BucketCounts | None:
    return histogram_increase(None, histogram) if histogram is not None else None


def estimate_context(
    prompt: BucketCounts | None,
    generation: BucketCounts | None,
    *,
    window_requests: float,
    basis: str,
    max_model_len: int | None = None,
) -> ContextEstimate | None:
    """Combine prompt and generation distributions into a context-length estimate.

    Quantiles add (see the module docstring for the bias); the mean is exact. Values are capped
    at ``max_model_len`` when known: no request can be longer.
    """
    if prompt is None or generation is None or prompt.total <= 0 or generation.total <= 0:
        return None
    cap = float(max_model_len) if max_model_len else math.inf
    quantiles: dict[float, float] = {}
    for q in CONTEXT_QUANTILES:
        p, g = bucket_quantile(q, prompt), bucket_quantile(q, generation)
        if p is None or g is None:
            return None
        quantiles[q] = min(p + g, cap)
    mean_p, mean_g = prompt.mean, generation.mean
    if mean_p is None or mean_g is None:
        return None
    return ContextEstimate(
        quantiles=quantiles,
        mean=min(mean_p + mean_g, cap),
        window_requests=window_requests,
        basis=basis,
    )


def sequences_that_fit(tokens: float, context: float, block_size: int) -> float:
    """Whole sequences of ``context`` tokens that fit in ``tokens``, each rounded up to blocks."""
    per_sequence = max(1, math.ceil(context / block_size)) * block_size
    return float(math.floor(max(tokens, 0.0) / per_sequence))


def _capacity(engine: EngineMetrics, engine_count: int) -> tuple[float | None, float | None]:
    """(capacity tokens, blocks) of one engine from ``cache_config_info``."""
    config = engine.cache_config
    if config is None:
        return None, None
    blocks = (
        config.num_gpu_blocks / engine_count
        if config.num_gpu_blocks is not None and engine_count > 0
        else None
    )
    if config.kv_cache_size_tokens is not None:
        return float(config.kv_cache_size_tokens), blocks
    if blocks is not None and config.block_size is not None:
        return blocks * config.block_size, blocks
    return None, blocks


@dataclass(frozen=True, slots=True)
class _KvState:
    capacity: float | None = None
    blocks: float | None = None
    block_size: int | None = None
    usable: float | None = None
    used: float | None = None
    free: float | None = None


def _kv_state(
    engine: EngineMetrics, engine_count: int, predicted_capacity_tokens: float | None
) -> _KvState:
    capacity, blocks = _capacity(engine, engine_count)
    block_size = engine.cache_config.block_size if engine.cache_config else None
    usable = used = free = None
    if capacity is not None:
        usable = capacity * (blocks - 1) / blocks if blocks and blocks > 1 else capacity
    elif predicted_capacity_tokens is not None:
        # No capacity from vLLM (e.g. V1 0.8.x labels num_gpu_blocks "None"): the prediction
        # stands in for the headroom arithmetic; the actual-capacity gauges stay absent.
        usable = predicted_capacity_tokens
    if usable is not None and engine.kv_cache_usage_ratio is not None:
        granule = float(block_size or 1)
        usage = min(max(engine.kv_cache_usage_ratio, 0.0), 1.0)
        used = min(round(usage * usable / granule) * granule, usable)
        free = usable - used
    return _KvState(capacity, blocks, block_size, usable, used, free)


def _context(
    name: str,
    samples: Sequence[Sample],
    *,
    seconds: float,
    max_model_len: int | None,
) -> ContextEstimate | None:
    """Context estimate over the window, else since vLLM started (see the module docstring)."""
    start = _tail(samples, seconds)
    window = samples[start:]
    prompt = _histogram_window(window, name, lambda e: e.prompt_tokens)
    generation = _histogram_window(window, name, lambda e: e.generation_tokens)
    context = estimate_context(
        prompt,
        generation,
        window_requests=prompt.total if prompt is not None else 0.0,
        basis="window",
        max_model_len=max_model_len,
    )
    if context is not None:
        return context
    latest = samples[-1].snapshot.engines[name]
    return estimate_context(
        _lifetime(latest.prompt_tokens),
        _lifetime(latest.generation_tokens),
        window_requests=0.0,
        basis="lifetime",
        max_model_len=max_model_len,
    )


@dataclass(frozen=True, slots=True)
class _Rates:
    preemptions_per_second: float | None = None
    preemptions_per_finished_request: float | None = None
    finished_requests_per_second: float | None = None


def _rates(name: str, samples: Sequence[Sample], seconds: float) -> _Rates:
    start = _tail(samples, seconds)
    window = samples[start:]
    window_resets = _restarts(window)
    span = window[-1].t - window[0].t
    if len(window) < 2 or span <= 0:
        return _Rates()

    def series(attr: str) -> list[float | None]:
        engines = (s.snapshot.engines.get(name) for s in window)
        return [getattr(e, attr) if e is not None else None for e in engines]

    latest = window[-1].snapshot.engines[name]
    preempted = window_increase(series("preemptions_total"), window_resets)
    finished = window_increase(series("requests_finished_total"), window_resets)
    per_second = per_request = None
    if latest.preemptions_total is not None:
        per_second = preempted / span
        if finished > 0:
            per_request = preempted / finished
        elif preempted == 0:
            per_request = 0.0
    finished_per_second = finished / span if latest.requests_finished_total is not None else None
    return _Rates(per_second, per_request, finished_per_second)


def derive_engine(
    name: str,
    samples: Sequence[Sample],
    *,
    windows: WindowSettings,
    predicted_capacity_tokens: float | None = None,
    max_model_len: int | None = None,
) -> EngineDerived:
    """Derive one engine's figures from the target's samples (the last one is "now")."""
    latest = samples[-1].snapshot
    engine = latest.engines[name]
    engine_count = sum(1 for e in latest.engines.values() if e.cache_config is not None) or 1
    kv = _kv_state(engine, engine_count, predicted_capacity_tokens)
    context = _context(name, samples, seconds=windows.context_seconds, max_model_len=max_model_len)

    p95_ceiling = mean_ceiling = p95_available = p95_ratio = None
    if context is not None and kv.usable is not None:
        granularity = kv.block_size or 1
        p95 = context.quantiles[0.95]
        p95_ceiling = sequences_that_fit(kv.usable, p95, granularity)
        mean_ceiling = sequences_that_fit(kv.usable, context.mean, granularity)
        if kv.free is not None:
            p95_available = sequences_that_fit(kv.free, p95, granularity)
            p95_ratio = p95_available / p95_ceiling if p95_ceiling > 0 else 0.0

    rates = _rates(name, samples, windows.rate_seconds)
    error = None
    if predicted_capacity_tokens is not None and kv.capacity:
        error = (predicted_capacity_tokens - kv.capacity) / kv.capacity

    return EngineDerived(
        engine=name,
        model_name=engine.model_name or "",
        kv_blocks=kv.blocks,
        kv_block_size_tokens=kv.block_size,
        kv_capacity_tokens=kv.capacity,
        kv_capacity_predicted_tokens=predicted_capacity_tokens,
        kv_capacity_error_ratio=error,
        kv_usable_tokens=kv.usable,
        kv_used_tokens=kv.used,
        kv_free_tokens=kv.free,
        kv_usage_ratio=engine.kv_cache_usage_ratio,
        context=context,
        p95_ceiling_sequences=p95_ceiling,
        mean_ceiling_sequences=mean_ceiling,
        p95_available_sequences=p95_available,
        p95_available_ratio=p95_ratio,
        preemptions_per_second=rates.preemptions_per_second,
        preemptions_per_finished_request=rates.preemptions_per_finished_request,
        finished_requests_per_second=rates.finished_requests_per_second,
        requests_running=engine.requests_running,
        requests_waiting=engine.requests_waiting,
        requests_waiting_by_reason=dict(engine.requests_waiting_by_reason),
    )


def derive_target(
    samples: Sequence[Sample],
    *,
    windows: WindowSettings,
    predicted_capacity_tokens: float | None = None,
    max_model_len: int | None = None,
) -> TargetDerived:
    """Derive every engine's figures at the latest of ``samples`` (oldest first).

    ``predicted_capacity_tokens`` is the sizing model's per-engine capacity in vLLM's own terms
    (``None`` when the prediction is unavailable).
    """
    if not samples:
        return TargetDerived(engines=())
    engines = tuple(
        derive_engine(
            name,
            samples,
            windows=windows,
            predicted_capacity_tokens=predicted_capacity_tokens,
            max_model_len=max_model_len,
        )
        for name in samples[-1].snapshot.engines  # in rank order, as the parser keeps them
    )
    return TargetDerived(engines=engines, restarted=len(samples) > 1 and samples[-1].restarted)
