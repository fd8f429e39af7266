"""Derived capacity figures for one vLLM target, from a window of recent snapshots.

Everything here is a pure function of plain data: the samples (monotonic time + parsed
snapshot), the settings of the windows, and the predicted capacity from the sizing model. The
poller owns the clock and the window; the collector turns the result into metric families.

Definitions (documented for users in ``docs/metrics.md``):

- **Capacity** is vLLM's own figure: ``kv_cache_size_tokens`` from ``cache_config_info`` when
  exposed (0.24+), else ``num_gpu_blocks x block_size`` per engine (``num_gpu_blocks`` is the
  sum over data-parallel engines). One block of it is vLLM's reserved null block, so running
  requests can hold at most ``capacity x (blocks - 1) / blocks`` tokens: the *usable* tokens.
- **Offload tier** (``SimpleCPUOffloadConnector``: ``capacity_blocks`` of
  ``vllm:simple_kv_offload_info``, else 0.33's ``simple_cpu_offload_num_blocks``) in tokens is
  its blocks x the GPU pool's tokens per block (capacity / blocks): vLLM builds that pool with
  the GPU pool's layout. The *effective* capacity adds it to the GPU pool's; it is kept apart
  from the capacity, because an offloaded block must be loaded back into a GPU block before its
  request runs: it holds cached prefixes (a preempted request's among them), not running ones.
- **Tokens in use** = ``kv_cache_usage_perc x usable tokens``, rounded to whole blocks
  (block-granular; evictable prefix-cache blocks count as free, as in vLLM).
- **Context length** of a finished request = prompt + generated tokens. Its quantiles come from
  the per-request histograms ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens``: each poll interval's bucket deltas and exact sums, placed
  by :mod:`exporter.core.context` (exact for one request per interval and for constant shapes,
  leaning high only where the data cannot say more). The mean is exact (the histograms' sums).
  When no request finished within the window, the figures fall back to everything vLLM has
  finished since it started; with nothing finished at all they are absent.
- **Sequences at context T** need ``ceil(T / block_size)`` blocks each where the pool is one
  full-attention group; on other layouts what the model's KV-cache groups take
  (:mod:`exporter.core.pool`) where they agree with vLLM's figures, else only a max-length
  one's blocks are known (:func:`max_len_blocks_per_request`), and the figures below that
  length are absent. The *ceiling* is the
  smallest of every limit of vLLM's scheduler (:mod:`exporter.core.ceiling`): how many fit in
  the usable tokens, ``max_num_seqs``, 0 while the engine sleeps; the *available* figure (the
  headroom) how many more vLLM would start now under the same limits, both in whole sequences.
  The *effective* figures count prefix-cache blocks shared between sequences once.
- **Preemption rate** is the reset-aware increase of ``vllm:num_preemptions_total`` over the
  rate window divided by the time it spans; per finished request it is divided by the increase
  of ``vllm:request_success_total`` instead (absent when nothing finished). After a restart,
  a counter counts only what the new process could have counted in the interval
  (:func:`restart_counts`).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from exporter.core.ceiling import (
    Ceiling,
    RunningLimit,
    ceiling,
    headroom,
    queue_room,
    shared_ceiling,
)
from exporter.core.context import IntervalCounts, estimate_context_quantiles
from exporter.core.exact import MAX_EXACT_WHOLE
from exporter.core.pool import PoolLayout, labelled_max_len_blocks
from exporter.core.reasons import Limit
from exporter.core.windows import (
    BucketCounts,
    histogram_increase,
    merge_buckets,
    went_down,
    window_increase,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from exporter.core.snapshot import EngineMetrics, Histogram, VllmSnapshot


#: The quantiles of context length we derive.
CONTEXT_QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
#: Context figures read from at least this many requests may stand for
#: ``context_refresh_seconds`` (below it they are cheap, and each request moves them).
KEEP_CONTEXT_MIN_REQUESTS = 400


@dataclass(frozen=True, slots=True)
class Sample:
    """One successful poll of a target: monotonic time in seconds and the parsed payload."""

    t: float
    snapshot: VllmSnapshot
    #: vLLM restarted between the previous sample and this one; set once, by
    #: :func:`next_sample`, and read by every window that spans the two.
    restarted: bool = False
    #: Wall-clock time of the poll (Unix seconds), against the target's start time: how long
    #: a new process has run. None where unknown.
    wall: float | None = None


@dataclass(frozen=True, slots=True)
class WindowSettings:
    """Lengths of the windows the derivations look back over, in seconds."""

    #: Requests finished within this window make up the context-length distribution.
    context_seconds: float = 600.0
    #: Fewest finished requests the context figures are read from: with fewer within
    #: ``context_seconds``, the window reaches further back, one poll interval at a time, until
    #: it holds this many or spans ``context_max_seconds`` (0: it never reaches back). The
    #: p95 of a few dozen requests is their second or third longest: too noisy to size by.
    context_min_requests: int = 400
    #: The furthest back the context window reaches for ``context_min_requests`` requests
    #: (never less than ``context_seconds``).
    context_max_seconds: float = 3600.0
    #: Preemption and request rates are averaged over this window.
    rate_seconds: float = 60.0
    #: Context figures read from ``KEEP_CONTEXT_MIN_REQUESTS`` requests or more stand this long
    #: before they are computed again (0: every poll). They cost up to some 0.2 s of CPU a time
    #: on busy traffic (many requests a poll over many buckets), and the quantiles of 10 minutes
    #: of requests move little in 30 s.
    context_refresh_seconds: float = 30.0

    @property
    def context_reach_seconds(self) -> float:
        """How far back the context window may look: its reach, never less than itself."""
        if self.context_min_requests <= 0:
            return self.context_seconds
        return max(self.context_max_seconds, self.context_seconds)


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
    #: Seconds the window spans: up to the context window, more where it reached back for
    #: requests (0: the figures are since vLLM started).
    window_seconds: float = 0.0
    #: Time of the sample they were computed at (they may stand for a few polls), and the
    #: ``max_model_len`` they were capped at.
    computed_at: float = 0.0
    max_model_len: int | None = None


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
    #: The KV offload tier (:func:`offload_capacity_tokens`), and it plus the GPU pool.
    kv_offload_capacity_blocks: float | None = None
    kv_offload_capacity_tokens: float | None = None
    kv_effective_capacity_tokens: float | None = None
    kv_usable_tokens: float | None = None
    kv_used_tokens: float | None = None
    kv_free_tokens: float | None = None
    kv_usage_ratio: float | None = None
    context: ContextEstimate | None = None
    #: The ceiling under every limit (the smaller of the KV pool's and the scheduler's).
    p95_ceiling_sequences: float | None = None
    #: What the KV pool alone holds of p95 sequences, counting none of them shared.
    p95_kv_ceiling_sequences: float | None = None
    p95_ceiling_limit: Limit | None = None
    mean_ceiling_sequences: float | None = None
    #: More p95 sequences vLLM would start now under every limit (the headroom).
    p95_available_sequences: float | None = None
    p95_kv_available_sequences: float | None = None
    p95_available_limit: Limit | None = None
    p95_available_ratio: float | None = None
    #: The same two figures counting prefix-cache blocks shared between sequences once.
    p95_effective_ceiling_sequences: float | None = None
    p95_effective_available_sequences: float | None = None
    #: Prompt tokens found in the device prefix cache over those looked up, in the window.
    prefix_cache_hit_ratio: float | None = None
    #: Mean prompt tokens per request served from the prefix cache (hit ratio x mean prompt).
    shared_prefix_tokens: float | None = None
    #: KV tokens in use per running sequence (shared blocks counted once).
    kv_tokens_per_running_sequence: float | None = None
    #: Prompt tokens served from each cache tier over all prompt tokens, in the window (0.32+).
    prompt_tokens_cached_ratio_by_source: Mapping[str, float] = field(default_factory=dict)
    #: Prompt tokens by where their KV came from over all prompt tokens, in the window:
    #: ``external_kv_transfer`` is what a KV connector supplied (P/D's prefill, an offload
    #: tier), apart from the GPU pool's own hits (``local_cache_hit``).
    prompt_tokens_ratio_by_source: Mapping[str, float] = field(default_factory=dict)
    #: The scheduler's limit on running sequences, and where it was learnt.
    max_num_seqs: float | None = None
    max_num_seqs_source: str | None = None
    #: True while the engine sleeps (``vllm:engine_sleep_state``); None where not exposed.
    asleep: bool | None = None
    #: Mean ``n`` (sequences per request) of requests finished in the window (exact).
    sequences_per_request: float | None = None
    #: More p95 requests that fit now: the headroom in sequences over the mean ``n``.
    p95_available_requests: float | None = None
    preemptions_per_second: float | None = None
    preemptions_per_finished_request: float | None = None
    finished_requests_per_second: float | None = None
    #: Requests (parents) running: vLLM V1 counts each of a request's ``n`` sequences.
    requests_running: float | None = None
    #: Sequences running (what ``max_num_seqs`` and the KV pool limit).
    sequences_running: float | None = None
    requests_waiting: float | None = None
    requests_waiting_by_reason: Mapping[str, float] = field(default_factory=dict)
    #: Waiting requests by async KV load stage (a KV connector that loads KV: P/D, offload).
    requests_kv_fetch_by_stage: Mapping[str, float] = field(default_factory=dict)

    @property
    def p95_ceiling_limited_by(self) -> dict[str, float]:
        """One-hot over every limit: which one caps the p95 ceiling ({} when unknown)."""
        return _one_hot(self.p95_ceiling_limit)

    @property
    def p95_available_limited_by(self) -> dict[str, float]:
        """One-hot over every limit: which one stops the next p95 sequence now."""
        return _one_hot(self.p95_available_limit)

    @property
    def max_num_seqs_by_source(self) -> dict[str, float]:
        """``{source: max_num_seqs}`` for the gauge labelled by where it was learnt."""
        if self.max_num_seqs is None or self.max_num_seqs_source is None:
            return {}
        return {self.max_num_seqs_source: self.max_num_seqs}

    @property
    def engine_asleep(self) -> float | None:
        """1 while the engine sleeps, 0 while awake, None where vLLM does not say."""
        return None if self.asleep is None else float(self.asleep)

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

    @property
    def context_window_seconds(self) -> float | None:
        """Seconds the context figures look back over (0: since vLLM started)."""
        return self.context.window_seconds if self.context is not None else None


def _one_hot(limit: Limit | None) -> dict[str, float]:
    if limit is None:
        return {}
    return {str(each): 1.0 if each == limit else 0.0 for each in Limit}


@dataclass(frozen=True, slots=True)
class TargetDerived:
    """The derived figures of one target at its latest sample."""

    engines: tuple[EngineDerived, ...]
    #: A restart was detected between the last two samples.
    restarted: bool = False
    #: Requests the API server refused at a queue limit, per second over the rate window
    #: (``vllm:admission_rejections_total``, 0.32+; None where not exposed).
    admission_rejections_per_second: float | None = None
    #: The same by ``reason``, the cap that refused (one entry per reason the latest
    #: snapshot has; empty where the total is None).
    admission_rejections_by_reason_per_second: Mapping[str, float] = field(
        default_factory=lambda: _NO_LABELS
    )


#: How many counters :func:`restart_evidence` compares per engine (:func:`_engine_counters`).
_COUNTERS = 6


def _engine_counters(engine: EngineMetrics) -> tuple[float | None, ...]:
    return (
        engine.preemptions_total,
        engine.requests_finished_total,
        engine.prompt_tokens_total,
        engine.generation_tokens_total,
        engine.prompt_tokens.count if engine.prompt_tokens else None,
        engine.generation_tokens.count if engine.generation_tokens else None,
    )


@dataclass(frozen=True, slots=True)
class RestartBaseline:
    """What :func:`restart_evidence` reads of a snapshot: its start time and counters, packed.

    Kept between polls for every target (fleet mode: up to ``probe_max_targets``), so it holds
    no label value nor bucket, and no object per counter: one array of doubles, an absent
    counter as NaN (no comparison with NaN is true, as none is made with an absent one).
    """

    process_start_time_seconds: float | None
    #: The engines, in the order of ``counters``' rows.
    engines: tuple[str, ...]
    #: ``_COUNTERS`` values an engine, row after row.
    counters: array[float]

    def engine_counters(self) -> dict[str, tuple[float | None, ...]]:
        """Each engine's counters as :func:`_engine_counters` gives them (NaN for absent)."""
        rows = self.counters
        return {
            name: tuple(rows[i * _COUNTERS : (i + 1) * _COUNTERS])
            for i, name in enumerate(self.engines)
        }


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


def restart_evidence(
    previous: VllmSnapshot | RestartBaseline, current: VllmSnapshot
) -> RestartEvidence | None:
    """Why vLLM looks restarted between two consecutive snapshots, or None.

    Evidence: a later ``process_start_time_seconds``, or any cumulative counter of an engine
    present in both going down (impossible for the same process start time; float noise is
    no decrease: :func:`~exporter.core.windows.went_down`). ``previous`` may
    be the snapshot before or its :func:`restart_baseline`: the verdict is the same.
    """
    before, now = previous.process_start_time_seconds, current.process_start_time_seconds
    known = before is not None and now is not None
    if known and now > before:  # type: ignore[operator]
        return RestartEvidence.START_TIME
    if known and now < before:  # type: ignore[operator]
        return RestartEvidence.IMPOSSIBLE
    if isinstance(previous, RestartBaseline):
        counters = previous.engine_counters()
    else:
        counters = {name: _engine_counters(e) for name, e in previous.engines.items()}
    for name, engine in current.engines.items():
        old = counters.get(name)
        if old is None:
            continue
        for a, b in zip(old, _engine_counters(engine), strict=True):
            if a is not None and b is not None and went_down(a, b):
                return RestartEvidence.IMPOSSIBLE if known else RestartEvidence.COUNTERS
    return None


def restart_baseline(snapshot: VllmSnapshot) -> RestartBaseline:
    """Only what :func:`restart_evidence` reads: the start time and each engine's counters."""
    nan = math.nan
    counters = array(
        "d",
        (
            nan if value is None else value
            for engine in snapshot.engines.values()
            for value in _engine_counters(engine)
        ),
    )
    return RestartBaseline(snapshot.process_start_time_seconds, tuple(snapshot.engines), counters)


def detect_restart(previous: VllmSnapshot, current: VllmSnapshot) -> bool:
    """Whether vLLM restarted between two consecutive snapshots (any evidence)."""
    return restart_evidence(previous, current) is not None


def next_sample(
    previous: Sample | None,
    t: float,
    snapshot: VllmSnapshot,
    *,
    whole: bool = False,
    wall: float | None = None,
) -> Sample:
    """The sample that follows ``previous``, with a restart between the two detected once.

    The sample keeps only what the windows read (:func:`window_snapshot`), sharing with
    ``previous`` whatever did not change: a window holds hundreds of samples. ``whole`` keeps
    the snapshot as it is, latency histograms included (the probe's steps read them). ``wall``
    is the poll's wall-clock time (:attr:`Sample.wall`).
    """
    restarted = previous is not None and detect_restart(previous.snapshot, snapshot)
    if whole:
        return Sample(t, snapshot, restarted, wall)
    lean = window_snapshot(snapshot, previous.snapshot if previous is not None else None)
    return Sample(t, lean, restarted, wall)


class Counted(StrEnum):
    """What a rated counter counts: the key of its ceiling."""

    PREEMPTIONS = "preemptions"
    REQUESTS = "requests"
    ADMISSION_REJECTIONS = "admission_rejections"


#: Most one vLLM server could count in a second: far above the fastest engines (thousands of
#: requests and preemptions a second at the very most), so that only counts no process could
#: have made are left out (:func:`restart_counts`).
COUNTER_CEILINGS_PER_SECOND: Mapping[Counted, float] = MappingProxyType(
    {
        Counted.PREEMPTIONS: 100_000.0,
        Counted.REQUESTS: 100_000.0,
        Counted.ADMISSION_REJECTIONS: 1_000_000.0,
    }
)
#: How far the target's clock and ours may disagree about its start time (fleet mode reads
#: other machines' clocks; NTP keeps them within a second).
START_TIME_SKEW_SECONDS = 60.0


def restart_counts(previous: Sample, sample: Sample, value: float, counted: Counted) -> bool:
    """Whether ``value``, a counter of a process new at ``sample``, counts as its increase.

    A new process counted ``value`` since its start. That is the increase since ``previous``
    only if the process started between the two polls (its ``process_start_time_seconds``
    neither after ``sample``'s poll nor before ``previous``'s, within
    :data:`START_TIME_SKEW_SECONDS`: one started before ``previous`` ran beside the process that
    answered it, which is not one vLLM restarting) and if no more than
    :data:`COUNTER_CEILINGS_PER_SECOND` allow in the time between the polls. Otherwise the
    interval counts nothing, and the rate stands on the rest of its window: a restart never
    yields a rate above the ceiling (docs/derivations.md, "Counters and restarts").
    """
    start = sample.snapshot.process_start_time_seconds
    skew = START_TIME_SKEW_SECONDS
    if start is not None:
        if sample.wall is not None and start > sample.wall + skew:
            return False  # started in the future
        if previous.wall is not None and start < previous.wall - skew:
            return False  # already running when the other process answered
    elapsed = max(sample.t - previous.t, 0.0)
    return value <= COUNTER_CEILINGS_PER_SECOND[counted] * elapsed


def _counted(
    window: Sequence[Sample], values: Sequence[float | None], counted: Counted
) -> list[bool]:
    """``flags[i]``: whether ``values[i]`` counts as an increase if a restart lies before it."""
    flags = [True] * len(window)
    for i in range(1, len(window)):
        value = values[i]
        if window[i].restarted and value is not None:
            flags[i] = restart_counts(window[i - 1], window[i], value, counted)
    return flags


def window_snapshot(snapshot: VllmSnapshot, previous: VllmSnapshot | None) -> VllmSnapshot:
    """``snapshot`` without what no derivation reads, sharing unchanged parts with ``previous``.

    The latency histograms, the family names (any ``# HELP`` line adds one), the counts of
    dropped samples and the ``cache_config_info`` labels verbatim are left out: no derivation
    reads them, and a target that changes them every poll would grow every sample. The
    ``cache_config_info`` facts, model names, split-label keys (the admission reasons' too) and
    the histograms' bucket bounds are the previous sample's objects when equal, so that a window
    holds one copy of them (:mod:`exporter.core.footprint` counts on it).
    """
    engines: dict[str, EngineMetrics] = {}
    for name, engine in snapshot.engines.items():
        old = previous.engines.get(name) if previous is not None else None
        config = engine.cache_config
        if config is not None and config.labels:
            config = replace(config, labels=_NO_LABELS)
        if old is not None and config is not None and config == old.cache_config:
            config = old.cache_config
        model_name = engine.model_name
        if old is not None and model_name == old.model_name:
            model_name = old.model_name
        engines[name] = replace(
            engine,
            engine=old.engine if old is not None else name,
            model_name=model_name,
            requests_waiting_by_reason=_shared_keys(
                engine.requests_waiting_by_reason, old.requests_waiting_by_reason if old else None
            ),
            sleep_state=_shared_keys(engine.sleep_state, old.sleep_state if old else None),
            prompt_tokens_cached_by_source=_shared_keys(
                engine.prompt_tokens_cached_by_source,
                old.prompt_tokens_cached_by_source if old else None,
            ),
            prompt_tokens_by_source=_shared_keys(
                engine.prompt_tokens_by_source, old.prompt_tokens_by_source if old else None
            ),
            requests_kv_fetch_by_stage=_shared_keys(
                engine.requests_kv_fetch_by_stage,
                old.requests_kv_fetch_by_stage if old else None,
            ),
            prompt_tokens=_shared_bounds(engine.prompt_tokens, old.prompt_tokens if old else None),
            generation_tokens=_shared_bounds(
                engine.generation_tokens, old.generation_tokens if old else None
            ),
            request_params_n=_shared_bounds(
                engine.request_params_n, old.request_params_n if old else None
            ),
            time_to_first_token=None,
            inter_token_latency=None,
            e2e_request_latency=None,
            request_queue_time=None,
            cache_config=config,
        )
    return replace(
        snapshot,
        engines=engines,
        families=frozenset(),
        dropped=_NO_LABELS,
        admission_rejections_by_reason=_shared_keys(
            snapshot.admission_rejections_by_reason,
            previous.admission_rejections_by_reason if previous is not None else None,
        ),
    )


#: The one empty mapping lean samples share (never written: snapshots are read-only).
_NO_LABELS: Mapping[str, Any] = MappingProxyType({})


def _shared_keys(
    values: Mapping[str, float], old: Mapping[str, float] | None
) -> Mapping[str, float]:
    """``values``, or ``old`` when equal; keys equal to ``old``'s are its str objects."""
    if not values:
        return _NO_LABELS
    if old is None:
        return values
    if values == old:
        return old
    keys = {key: key for key in old}
    return {keys.get(key, key): value for key, value in values.items()}


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


def _covering_tail(samples: Sequence[Sample], seconds: float) -> int:
    """Index of the last sample at or before ``seconds`` before the last one (else the first).

    A rate's window reaches back to the read that covers its start: vLLM's ``/metrics`` goes
    unanswered under the very load that preempts, and a window starting at the first read
    after its start would leave out what a gap across that start counted (all of it when the
    gap outlasts the window). The rate is then the average since that read.
    """
    first = _tail(samples, seconds)
    if first > 0 and samples[first].t > samples[-1].t - seconds:
        return first - 1
    return first


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
    return _countable(merge_buckets(parts))


def _lifetime(histogram: Histogram | None) -> BucketCounts | None:
    return _countable(histogram_increase(None, histogram)) if histogram is not None else None


def _countable(counts: BucketCounts | None) -> BucketCounts | None:
    """``counts`` if its counts and sum are numbers within ``MAX_EXACT_WHOLE``, else None.

    A histogram saying 1e308 requests, or a sum of 1e155 tokens (whose square is infinite),
    is no vLLM's: its figures would be infinite or NaN, so it counts as no traffic at all.
    """
    if counts is None:
        return None
    if all(_known(n) is not None for n in counts.counts) and _known(counts.sum) is not None:
        return counts
    return None


def sequences_that_fit(tokens: float, context: float, block_size: int) -> float:
    """Whole sequences of ``context`` tokens that fit in ``tokens``, each rounded up to blocks."""
    per_sequence = max(1, math.ceil(context / block_size)) * block_size
    return float(math.floor(max(tokens, 0.0) / per_sequence))


def _known(value: float | None) -> float | None:
    """``value`` as a float when it is a number within ``MAX_EXACT_WHOLE``; else None (unknown).

    Most tokens, or blocks, a KV cache figure is believed at: 2**53, past which floats no longer
    hold every whole number (rounding to blocks means nothing there). No KV cache comes near; a
    ``cache_config_info`` saying more (``num_gpu_blocks="1e308"``) is unknown, not infinite.
    """
    if value is None:
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past the largest float
        return None
    return number if math.isfinite(number) and abs(number) <= MAX_EXACT_WHOLE else None


def _capacity(engine: EngineMetrics, engine_count: int) -> tuple[float | None, float | None]:
    """(capacity tokens, blocks) of one engine from ``cache_config_info``.

    Figures past ``MAX_EXACT_WHOLE`` (or their product) are unknown: never infinite.
    """
    config = engine.cache_config
    if config is None:
        return None, None
    count = _known(config.num_gpu_blocks)
    blocks = count / engine_count if count is not None and engine_count > 0 else None
    if config.kv_cache_size_tokens is not None:
        # vLLM's own figure, when it gives one; one past MAX_EXACT_WHOLE is unknown (the blocks
        # of an answer that impossible are no better).
        return _known(config.kv_cache_size_tokens), blocks
    block_size = _known(config.block_size)
    if blocks is not None and block_size is not None:
        return _known(blocks * block_size), blocks
    return None, blocks


def offload_capacity_tokens(
    offload_blocks: float | None, capacity: float | None, blocks: float | None
) -> float | None:
    """Tokens the KV offload pool holds, in the GPU pool's own terms (None where unknown).

    ``SimpleCPUOffloadConnector`` derives its pool from the GPU pool's ``KVCacheConfig``: the
    same groups and pages, ``num_blocks`` scaled by the bytes (vLLM 0.32/0.33
    ``vllm/v1/simple_kv_offload/manager.py`` ``_derive_cpu_config``); and vLLM's token capacity
    is linear in ``num_blocks`` (``get_max_concurrency_for_kv_cache_config``). So a block of
    either pool holds the same tokens: the GPU pool's capacity over its blocks (``block_size``
    on a model of one attention kind, more with sliding-window groups).
    """
    if offload_blocks is None or capacity is None or not blocks:
        return None
    return offload_blocks * capacity / blocks


def _offload_blocks(engine: EngineMetrics) -> int | None:
    """The offload pool in blocks: the scheduler's (the info gauge), else 0.33's config label."""
    if engine.kv_offload_capacity_blocks is not None:
        return engine.kv_offload_capacity_blocks
    config = engine.cache_config
    return config.simple_cpu_offload_num_blocks if config is not None else None


def max_len_blocks_per_request(
    blocks: float | None, concurrency: float | None, block_size: int | None, max_model_len: int
) -> float | None:
    """Blocks one ``max_model_len`` request takes where the pool is not one full-attention group.

    vLLM states ``kv_cache_max_concurrency = num_blocks / (blocks one max-length request takes,
    summed over KV-cache groups)``, so its labels give that sum exactly. When it is
    ``ceil(max_model_len / block_size)`` the pool is one group of full attention (or behaves as
    one) and a sequence of T tokens takes ``ceil(T / block_size)`` blocks: None, the token
    arithmetic holds. Otherwise (sliding windows, chunked-local layers, KV sharing, raised or
    padded blocks, state-space groups: tests/fixtures/vllm-cpu/architectures) the sum is
    returned: what a shorter request takes depends on groups no label describes.
    """
    if blocks is None or not concurrency or block_size is None:
        return None  # before 0.24 no label says more: the token arithmetic as before
    # Labels no vLLM gives (a concurrency over the blocks, or 5e-324): the token arithmetic.
    per_request = labelled_max_len_blocks(blocks, concurrency)
    if per_request is None or per_request == math.ceil(max_model_len / block_size):
        return None
    return float(per_request)


@dataclass(frozen=True, slots=True)
class _KvState:
    capacity: float | None = None
    blocks: float | None = None
    block_size: int | None = None
    usable: float | None = None
    used: float | None = None
    free: float | None = None
    #: Tokens of the capacity one block stands for (capacity / blocks; None: block_size).
    per_block: float | None = None
    #: Not one full-attention group: blocks per max-length request, and that length.
    max_len_blocks: float | None = None
    max_model_len: int | None = None
    #: The groups a sequence of any length takes blocks in, where they agree with vLLM's
    #: ``max_len_blocks`` (None: only a max-length sequence's blocks are known).
    layout: PoolLayout | None = None


def _kv_state(
    engine: EngineMetrics,
    engine_count: int,
    predicted_capacity_tokens: float | None,
    max_model_len: int | None = None,
    pool_layout: PoolLayout | None = None,
) -> _KvState:
    capacity, blocks = _capacity(engine, engine_count)
    config = engine.cache_config
    block_size = config.block_size if config else None
    if block_size is not None and (block_size <= 0 or _known(block_size) is None):
        block_size = None  # no block of 0, or 1e308, tokens: rounding to it means nothing
    usable = used = free = per_block = max_len_blocks = layout = None
    if capacity is not None:
        usable = capacity * ((blocks - 1) / blocks) if blocks and blocks > 1 else capacity
        if blocks and config is not None and config.kv_cache_size_tokens is not None:
            # vLLM's usage is blocks in use over usable blocks: a block is capacity / blocks
            # tokens of its capacity, block_size only where the pool is one full-attention group.
            per_block = capacity / blocks
            concurrency = config.kv_cache_max_concurrency
            length = max_model_len
            if length is None and concurrency:
                # int(concurrency x length) = capacity; past 2**53 (a concurrency of 5e-324) the
                # labels are no vLLM's and no length is read from them.
                ratio = _known(capacity / concurrency)
                length = math.ceil(ratio - 1e-9) if ratio is not None else None
            if length is not None:
                max_len_blocks = max_len_blocks_per_request(blocks, concurrency, block_size, length)
                max_model_len = length
                if (
                    max_len_blocks is not None
                    and pool_layout is not None
                    and pool_layout.agrees(max_model_len=length, max_len_blocks=max_len_blocks)
                ):
                    # The config's groups reserve for a max-length request exactly what vLLM
                    # says such a request takes: trusted for shorter requests too.
                    layout = pool_layout
    else:
        # No capacity from vLLM (e.g. V1 0.8.x labels num_gpu_blocks "None"): the prediction
        # stands in for the headroom arithmetic; the actual-capacity gauges stay absent.
        usable = _known(predicted_capacity_tokens)
    if usable is not None and engine.kv_cache_usage_ratio is not None:
        granule = per_block or float(block_size or 1)
        usage = min(max(engine.kv_cache_usage_ratio, 0.0), 1.0)
        used = min(round(usage * usable / granule) * granule, usable)
        free = usable - used
    return _KvState(
        capacity,
        blocks,
        block_size,
        usable,
        used,
        free,
        per_block,
        max_len_blocks,
        max_model_len,
        layout,
    )


def _pool_sequences(kv: _KvState, tokens: float, context: float) -> float | None:
    """Whole sequences of ``context`` tokens that ``tokens`` of the pool hold; None: unknown.

    One full-attention group: ``tokens`` over whole blocks of the context. Any other layout:
    the pool's whole blocks over the blocks the model's groups take at the context, where
    those groups agree with vLLM's figures (:attr:`_KvState.layout`); without them known only
    for a context that takes as many blocks as ``max_model_len`` (vLLM's figures say what such
    a request takes): a shorter one may take fewer blocks than that or fewer than its share of
    the capacity's tokens (a state group's blocks stay, a window's do not), and no label says
    which, so no figure is made up.
    """
    if kv.max_len_blocks is None:
        return sequences_that_fit(tokens, context, kv.block_size or 1)
    size = kv.block_size or 1
    if kv.max_model_len is None or kv.per_block is None:
        return None
    if kv.layout is not None:
        per_sequence = kv.layout.blocks_per_sequence(math.ceil(context))
        if per_sequence < 1 or kv.per_block <= 0:
            return None  # a layout of no blocks: no sizing model makes one
        held = round(max(tokens, 0.0) / kv.per_block)  # whole blocks, by construction
        return float(held // per_sequence)
    if math.ceil(context / size) < math.ceil(kv.max_model_len / size):
        return None
    held = round(max(tokens, 0.0) / kv.per_block)  # whole blocks, by construction
    return float(held // kv.max_len_blocks)


@dataclass(frozen=True, slots=True)
class _Traffic:
    """The requests finished over the context window (or since vLLM started), per interval."""

    #: Both token histograms' increases over each poll interval that finished requests.
    intervals: tuple[IntervalCounts, ...]
    params_n: BucketCounts | None
    #: Requests finished in the window (0 when the figures are since vLLM started).
    window_requests: float
    basis: str
    #: Seconds from the window's first sample to the latest (0: since vLLM started).
    window_seconds: float = 0.0
    #: Index of the window's first sample (None: since vLLM started).
    first: int | None = None

    @property
    def prompt_mean(self) -> float | None:
        """Exact mean prompt tokens per request: the sums over the counts."""
        count = math.fsum(i.prompt.total for i in self.intervals)
        return math.fsum(i.prompt.sum for i in self.intervals) / count if count > 0 else None


def _intervals(
    samples: Sequence[Sample], engine: str, start: int = 0, stop: int | None = None
) -> list[tuple[int, IntervalCounts]]:
    """Both token histograms' increases over each consecutive pair of ``samples[start:stop]``.

    Oldest first, each with the index (in ``samples``) of the sample it counts from. One poll
    interval's two increases belong together (vLLM observes a request's prompt and output
    when it finishes): the context estimator relies on that pairing. A restart between two
    samples counts the new lifetime's values as the increase (as for every counter).
    """
    out: list[tuple[int, IntervalCounts]] = []
    previous: tuple[Histogram, Histogram] | None = None
    since = start
    pending_reset = False  # a restart seen while a histogram was absent applies to its return
    for i in range(start, len(samples) if stop is None else stop):
        sample = samples[i]
        pending_reset |= sample.restarted and i > start
        metrics = sample.snapshot.engines.get(engine)
        if metrics is None or metrics.prompt_tokens is None or metrics.generation_tokens is None:
            continue
        current = (metrics.prompt_tokens, metrics.generation_tokens)
        if current == previous and not pending_reset:
            since = i  # nothing finished (samples share unchanged histograms: a cheap test)
            continue
        if previous is not None or pending_reset:
            before = previous or (None, None)
            prompt = _countable(histogram_increase(before[0], current[0], reset=pending_reset))
            output = _countable(histogram_increase(before[1], current[1], reset=pending_reset))
            if prompt is not None and output is not None and (prompt.total or output.total):
                base = since if previous is not None else i - 1
                out.append((base, IntervalCounts(prompt, output)))
        previous, pending_reset, since = current, False, i
    return out


def _traffic(name: str, samples: Sequence[Sample], windows: WindowSettings) -> _Traffic:
    """The context window's intervals, reaching back for requests where it holds too few.

    The window is the last ``context_seconds``; where fewer than ``context_min_requests``
    finished in it, older intervals join, newest first, until the window holds that many or
    spans ``context_max_seconds`` (as far as the kept samples go). Since vLLM started (one
    interval) when nothing finished in all that.
    """
    start = _tail(samples, windows.context_seconds)
    chosen = _intervals(samples, name, start)
    finished = math.fsum(counts.prompt.total for _, counts in chosen)
    first = start
    if finished < windows.context_min_requests and start > 0:
        # The p95 of a few dozen requests is their second or third longest: reach back.
        older = _intervals(samples, name, _tail(samples, windows.context_reach_seconds), start + 1)
        taken = 0
        while taken < len(older) and finished < windows.context_min_requests:
            taken += 1
            first, counts = older[-taken]
            finished += counts.prompt.total
        chosen = older[len(older) - taken :] + chosen
    if finished > 0:
        window = samples[first:]
        params_n = _histogram_window(window, name, lambda e: e.request_params_n)
        seconds = window[-1].t - window[0].t
        intervals = tuple(counts for _, counts in chosen)
        return _Traffic(intervals, params_n, finished, "window", seconds, first)
    latest = samples[-1].snapshot.engines[name]
    prompt, output = _lifetime(latest.prompt_tokens), _lifetime(latest.generation_tokens)
    lifetime = (IntervalCounts(prompt, output),) if prompt and output else ()
    return _Traffic(lifetime, _lifetime(latest.request_params_n), 0.0, "lifetime")


def _may_stand(context: ContextEstimate | None) -> bool:
    """Whether ``context`` could stand at a later poll.

    A window's of enough requests, or one since vLLM started (its histograms may be the same
    at the next poll).
    """
    return context is not None and (
        context.basis == "lifetime"
        or (context.basis == "window" and context.window_requests >= KEEP_CONTEXT_MIN_REQUESTS)
    )


def _same_lifetime(
    previous: ContextEstimate, traffic: _Traffic, samples: Sequence[Sample], name: str
) -> bool:
    """Whether ``previous``, since vLLM started, was read from the very histograms of now.

    Figures since vLLM started are a function of the latest sample's two token histograms
    alone: where those equal the ones of the sample before, and ``previous`` was computed (or
    found the same, ``computed_at``) at that sample or after it, they are exactly what a
    computation would give. After it: the window's spacing replaces its latest sample by the
    next poll's (``exporter.service.memory``), so the one ``previous`` was computed at may be
    gone; within one lifetime the histograms only grow, so the same histograms before and now
    were the same in between too (a restart, seen at the latest sample or carried to it by
    the replacement, computes them again). An idle target's every poll computed them again
    (a few per cent of a fleet probe's CPU); with the spacing, two probes in three still did.
    """
    if previous.basis != "lifetime" or traffic.basis != "lifetime" or len(samples) < 2:
        return False
    before, latest = samples[-2], samples[-1]
    if not before.t <= previous.computed_at <= latest.t or latest.restarted:
        return False
    old, new = before.snapshot.engines.get(name), latest.snapshot.engines.get(name)
    return (
        old is not None
        and new is not None
        and old.prompt_tokens == new.prompt_tokens
        and old.generation_tokens == new.generation_tokens
    )


def _kept_context(
    previous: ContextEstimate | None,
    traffic: _Traffic,
    samples: Sequence[Sample],
    name: str,
    *,
    windows: WindowSettings,
    max_model_len: int | None,
) -> ContextEstimate | None:
    """The last context figures, where they may stand at the latest sample.

    Those since vLLM started, where the histograms they were read from are still the latest
    (:func:`_same_lifetime`; the same figures, stamped with the latest sample). Those of a
    window of ``KEEP_CONTEXT_MIN_REQUESTS`` requests or more, computed less than
    ``context_refresh_seconds`` ago with the same ``max_model_len``, with no restart since, and
    a window of as many now: recomputing them every poll cost busy traffic's sidecar over 1 %
    of a core for figures that move little from poll to poll.
    """
    if previous is None or previous.max_model_len != max_model_len:
        return None
    if _same_lifetime(previous, traffic, samples, name):
        return replace(previous, computed_at=samples[-1].t)
    if (
        not _may_stand(previous)
        or previous.basis != "window"
        or traffic.basis != "window"
        or traffic.window_requests < KEEP_CONTEXT_MIN_REQUESTS
        or not 0.0 <= samples[-1].t - previous.computed_at < windows.context_refresh_seconds
    ):
        return None
    for sample in reversed(samples):
        if sample.t <= previous.computed_at:
            return previous
        if sample.restarted:
            return None
    return None  # the sample it was computed at is gone: so is its window


def _context(traffic: _Traffic, *, max_model_len: int | None, at: float) -> ContextEstimate | None:
    """Context quantiles and exact mean of the traffic (:mod:`exporter.core.context`)."""
    found = estimate_context_quantiles(
        traffic.intervals, CONTEXT_QUANTILES, max_model_len=max_model_len
    )
    if found is None:
        return None
    return ContextEstimate(
        quantiles=found.quantiles,
        mean=found.mean,
        window_requests=traffic.window_requests,
        basis=traffic.basis,
        window_seconds=traffic.window_seconds,
        computed_at=at,
        max_model_len=max_model_len,
    )


def _mean_n(traffic: _Traffic) -> float | None:
    """Exact mean ``n`` of the finished requests: sum over count of ``request_params_n``."""
    n = traffic.params_n
    if n is None or n.total <= 0 or n.mean is None:
        return None
    return max(1.0, n.mean)


@dataclass(frozen=True, slots=True)
class _Caching:
    hit_ratio: float | None = None
    cached_ratio_by_source: Mapping[str, float] = field(default_factory=dict)
    prompt_ratio_by_source: Mapping[str, float] = field(default_factory=dict)


def _caching(name: str, window: Sequence[Sample]) -> _Caching:
    """Prefix-cache hit ratio and cached prompt share by source over ``window``'s samples."""
    resets = _restarts(window)
    engines = [s.snapshot.engines.get(name) for s in window]
    latest = engines[-1]
    if latest is None:
        return _Caching()

    def increase(pick: Callable[[EngineMetrics], float | None]) -> float:
        return window_increase([pick(e) if e is not None else None for e in engines], resets)

    def ratio(
        part: Callable[[EngineMetrics], float | None],
        whole: Callable[[EngineMetrics], float | None],
    ) -> float | None:
        # Over the window; since vLLM started when nothing was looked up in it.
        part_now, whole_now = part(latest), whole(latest)
        if part_now is None or whole_now is None:
            return None
        denominator = increase(whole) if len(window) > 1 else 0.0
        numerator = increase(part) if denominator > 0 else part_now
        if denominator <= 0:
            denominator = whole_now
        return min(1.0, numerator / denominator) if denominator > 0 else None

    hit_ratio = ratio(lambda e: e.prefix_cache_hits_total, lambda e: e.prefix_cache_queries_total)

    def shares(split: Callable[[EngineMetrics], Mapping[str, float]]) -> dict[str, float]:
        """Each value of a prompt-token split over the prompt tokens, where both increased."""
        found: dict[str, float] = {}
        for source in split(latest):
            share = ratio(
                lambda e, s=source: split(e).get(s),  # type: ignore[misc]
                lambda e: e.prompt_tokens_total,
            )
            if share is not None:
                found[source] = share
        return found

    return _Caching(
        hit_ratio,
        shares(lambda e: e.prompt_tokens_cached_by_source),
        shares(lambda e: e.prompt_tokens_by_source),
    )


@dataclass(frozen=True, slots=True)
class _Rates:
    preemptions_per_second: float | None = None
    preemptions_per_finished_request: float | None = None
    finished_requests_per_second: float | None = None


def _joined(name: str, window: Sequence[Sample]) -> int:
    """Index in ``window`` of the first read that counts for engine ``name``'s rates.

    An engine that joined within the window (data parallelism grown under one process) was
    counted only from its first read: its rates start there, not at the window's start (its
    first minute's rates read up to 12 times too low). After a restart a new process counted
    since it started, within the interval before the read: that interval counts too.
    """
    first = next((i for i, s in enumerate(window) if name in s.snapshot.engines), 0)
    return first - 1 if first > 0 and window[first].restarted else first


def _rates(name: str, samples: Sequence[Sample], seconds: float) -> _Rates:
    window = samples[_covering_tail(samples, seconds) :]
    window = window[_joined(name, window) :]
    window_resets = _restarts(window)
    span = window[-1].t - window[0].t
    if len(window) < 2 or span <= 0:
        return _Rates()

    def series(attr: str) -> list[float | None]:
        engines = (s.snapshot.engines.get(name) for s in window)
        return [getattr(e, attr) if e is not None else None for e in engines]

    def increase(values: list[float | None], counted: Counted) -> float:
        return window_increase(values, window_resets, _counted(window, values, counted))

    latest = window[-1].snapshot.engines[name]
    preempted = increase(series("preemptions_total"), Counted.PREEMPTIONS)
    finished = increase(series("requests_finished_total"), Counted.REQUESTS)
    per_second = per_request = None
    if latest.preemptions_total is not None:
        per_second = preempted / span
        if finished > 0:  # none finished: absent, 0 / 0 included (no traffic says nothing)
            per_request = preempted / finished
    finished_per_second = finished / span if latest.requests_finished_total is not None else None
    if latest.request_params_n is not None:
        # V1 counts each of a request's n sequences in request_success; request_params_n is
        # observed once per request.
        engines = (s.snapshot.engines.get(name) for s in window)
        counts = [e.request_params_n.count if e and e.request_params_n else None for e in engines]
        finished_per_second = increase(counts, Counted.REQUESTS) / span
    return _Rates(per_second, per_request, finished_per_second)


def _asleep(engine: EngineMetrics) -> bool | None:
    """Whether ``vllm:engine_sleep_state`` says the engine sleeps (any level, or paused)."""
    state = engine.sleep_state
    if not state:
        return None
    return state.get("awake", 0.0) < 1.0


def _running(engine: EngineMetrics, mean_n: float | None) -> tuple[float | None, float | None]:
    """(requests, sequences) running.

    V1 runs a request's ``n`` samples as ``n`` requests of its own and counts each; V0 (which
    exposes ``num_requests_swapped``) counts requests.
    """
    figure = engine.requests_running
    if figure is None:
        return None, None
    n = mean_n or 1.0
    if engine.requests_swapped is not None:
        return figure, figure * n
    return figure / n, figure


@dataclass(frozen=True, slots=True)
class _Headroom:
    p95_ceiling: Ceiling | None = None
    mean_ceiling: float | None = None
    p95_available: Ceiling | None = None
    effective_ceiling: float | None = None
    effective_available: float | None = None
    shared_tokens: float | None = None


def _headroom(
    kv: _KvState,
    context: ContextEstimate | None,
    *,
    limit: RunningLimit | None,
    sequences_running: float | None,
    asleep: bool,
    shared_tokens: float | None,
    admission_room: float | None = None,
) -> _Headroom:
    """Ceilings and headroom at p95 under every limit, unshared and with shared prefixes.

    ``admission_room``: what the API server's admission caps still let in (the server's).
    """
    running_limit = limit.sequences if limit is not None else None
    caps = limit.queue_caps if limit is not None else None
    cap = float(caps.requests) if caps is not None and caps.requests is not None else None
    kv_ceiling = kv_available = mean_ceiling = None
    effective = effective_free = None
    granularity = kv.block_size or 1
    if context is not None and kv.usable is not None and not asleep:
        p95 = context.quantiles[0.95]
        kv_ceiling = _pool_sequences(kv, kv.usable, p95)
        if kv_ceiling is None:
            # The pool binds somewhere no label says: no ceiling under the other limits
            # alone, which would name max_num_seqs while the pool may bind first.
            return _Headroom(shared_tokens=shared_tokens)
        mean_ceiling = _pool_sequences(kv, kv.usable, context.mean)
        if kv.free is not None:
            kv_available = _pool_sequences(kv, kv.free, p95)
        if shared_tokens is not None and kv.max_len_blocks is None:
            effective = shared_ceiling(
                kv.usable, context_tokens=p95, shared_tokens=shared_tokens, block_size=granularity
            )
            if kv.free is not None:
                # The shared prefix is already held while anything runs: new sequences add
                # only their own blocks. With nothing running it must be held once more.
                held = shared_tokens if (sequences_running or 0) > 0 else 0.0
                effective_free = shared_ceiling(
                    kv.free + held,
                    context_tokens=p95,
                    shared_tokens=shared_tokens,
                    block_size=granularity,
                )
    p95_ceiling = ceiling(kv_ceiling, running_limit=running_limit, asleep=asleep, queue_cap=cap)
    p95_available = headroom(
        kv_available,
        running_limit=running_limit,
        running=sequences_running,
        asleep=asleep,
        queue_room=admission_room,
    )
    effective_ceiling = ceiling(
        effective, running_limit=running_limit, asleep=asleep, queue_cap=cap
    )
    effective_headroom = headroom(
        effective_free,
        running_limit=running_limit,
        running=sequences_running,
        asleep=asleep,
        queue_room=admission_room,
    )
    mean_bound = min((x for x in (running_limit, cap) if x is not None), default=None)
    return _Headroom(
        p95_ceiling=p95_ceiling,
        mean_ceiling=(
            min(mean_ceiling, mean_bound)
            if mean_ceiling is not None and mean_bound is not None
            else mean_ceiling
        ),
        p95_available=p95_available,
        effective_ceiling=effective_ceiling.sequences
        if effective_ceiling and effective is not None
        else None,
        effective_available=(
            effective_headroom.sequences
            if effective_headroom and effective_free is not None
            else None
        ),
        shared_tokens=shared_tokens,
    )


def derive_engine(
    name: str,
    samples: Sequence[Sample],
    *,
    windows: WindowSettings,
    predicted_capacity_tokens: float | None = None,
    pool_layout: PoolLayout | None = None,
    max_model_len: int | None = None,
    running_limit: RunningLimit | None = None,
    previous_context: ContextEstimate | None = None,
    admission_room: float | None = None,
) -> EngineDerived:
    """Derive one engine's figures from the target's samples (the last one is "now").

    ``running_limit`` is the scheduler's ``max_num_seqs`` as learnt by the caller; without it
    only the KV pool limits the ceiling. ``pool_layout``: the KV-cache groups the sizing model
    found in the model's config, if known (:func:`_kv_state` uses it only where it agrees with
    vLLM's own figures). ``previous_context`` is the engine's context figures of the poll
    before, which may stand (:func:`_kept_context`). ``admission_room``: the sequences the API
    server's admission caps still let in (:func:`_admission_room`).
    """
    latest = samples[-1].snapshot
    engine = latest.engines[name]
    engine_count = sum(1 for e in latest.engines.values() if e.cache_config is not None) or 1
    kv = _kv_state(engine, engine_count, predicted_capacity_tokens, max_model_len, pool_layout)
    traffic = _traffic(name, samples, windows)
    context = _kept_context(
        previous_context, traffic, samples, name, windows=windows, max_model_len=max_model_len
    ) or _context(traffic, max_model_len=max_model_len, at=samples[-1].t)
    mean_n = _mean_n(traffic)
    requests_running, sequences_running = _running(engine, mean_n)
    asleep = _asleep(engine)
    # Over the requests the mean prompt comes from: the context window, as far as it reached.
    since = traffic.first if traffic.first is not None else _tail(samples, windows.context_seconds)
    caching = _caching(name, samples[since:])
    shared = None
    prompt_mean = traffic.prompt_mean
    if caching.hit_ratio is not None and prompt_mean is not None:
        shared = caching.hit_ratio * prompt_mean
    room = _headroom(
        kv,
        context,
        limit=running_limit,
        sequences_running=sequences_running,
        asleep=bool(asleep),
        shared_tokens=shared,
        admission_room=admission_room,
    )
    ceiling_figure = room.p95_ceiling
    available = room.p95_available
    p95_ratio = None
    if (
        ceiling_figure is not None
        and available is not None
        and (ceiling_figure.kv_sequences is not None or ceiling_figure.limited_by != Limit.KV_CACHE)
    ):
        p95_ratio = (
            available.sequences / ceiling_figure.sequences if ceiling_figure.sequences > 0 else 0.0
        )
    per_running = None
    if kv.used is not None and sequences_running:
        per_running = kv.used / sequences_running

    rates = _rates(name, samples, windows.rate_seconds)
    error = None
    if predicted_capacity_tokens is not None and kv.capacity:
        error = (predicted_capacity_tokens - kv.capacity) / kv.capacity
    has_context = context is not None
    offload_blocks = _offload_blocks(engine)
    offload_tokens = offload_capacity_tokens(offload_blocks, kv.capacity, kv.blocks)
    return EngineDerived(
        engine=name,
        model_name=engine.model_name or "",
        kv_blocks=kv.blocks,
        kv_block_size_tokens=kv.block_size,
        kv_capacity_tokens=kv.capacity,
        kv_capacity_predicted_tokens=predicted_capacity_tokens,
        kv_capacity_error_ratio=error,
        kv_offload_capacity_blocks=float(offload_blocks) if offload_blocks is not None else None,
        kv_offload_capacity_tokens=offload_tokens,
        kv_effective_capacity_tokens=(
            kv.capacity + offload_tokens
            if kv.capacity is not None and offload_tokens is not None
            else None
        ),
        kv_usable_tokens=kv.usable,
        kv_used_tokens=kv.used,
        # Asleep, the cache is discarded (levels 1, 2) or takes nothing (0): none is free.
        kv_free_tokens=0.0 if asleep and kv.free is not None else kv.free,
        kv_usage_ratio=engine.kv_cache_usage_ratio,
        context=context,
        p95_ceiling_sequences=ceiling_figure.sequences if ceiling_figure and has_context else None,
        p95_kv_ceiling_sequences=ceiling_figure.kv_sequences if ceiling_figure else None,
        p95_ceiling_limit=ceiling_figure.limited_by if ceiling_figure and has_context else None,
        mean_ceiling_sequences=room.mean_ceiling,
        p95_available_sequences=available.sequences if available and has_context else None,
        p95_kv_available_sequences=available.kv_sequences if available else None,
        p95_available_limit=available.limited_by if available and has_context else None,
        p95_available_ratio=p95_ratio if has_context else None,
        p95_effective_ceiling_sequences=room.effective_ceiling,
        p95_effective_available_sequences=room.effective_available,
        prefix_cache_hit_ratio=caching.hit_ratio,
        shared_prefix_tokens=room.shared_tokens,
        kv_tokens_per_running_sequence=per_running,
        prompt_tokens_cached_ratio_by_source=caching.cached_ratio_by_source,
        prompt_tokens_ratio_by_source=caching.prompt_ratio_by_source,
        max_num_seqs=float(running_limit.sequences) if running_limit is not None else None,
        max_num_seqs_source=running_limit.source if running_limit is not None else None,
        asleep=asleep,
        sequences_per_request=mean_n,
        p95_available_requests=(
            float(math.floor(available.sequences / (mean_n or 1.0)))
            if available is not None and has_context
            else None
        ),
        preemptions_per_second=rates.preemptions_per_second,
        preemptions_per_finished_request=rates.preemptions_per_finished_request,
        finished_requests_per_second=rates.finished_requests_per_second,
        requests_running=requests_running,
        sequences_running=sequences_running,
        requests_waiting=engine.requests_waiting,
        requests_waiting_by_reason=dict(engine.requests_waiting_by_reason),
        requests_kv_fetch_by_stage=dict(engine.requests_kv_fetch_by_stage),
    )


@dataclass(frozen=True, slots=True)
class _Admission:
    per_second: float | None = None
    by_reason: Mapping[str, float] = field(default_factory=lambda: _NO_LABELS)


def _admission_rate(samples: Sequence[Sample], seconds: float) -> _Admission:
    """Refusals per second over the rate window: in all, and by each reason vLLM writes now.

    Each reason is its own counter, rated as the total is (a restart, a reset, a gap): the
    rates add up to the total's while every reason is kept.
    """
    window = samples[_covering_tail(samples, seconds) :]
    latest = window[-1].snapshot
    if latest.admission_rejections_total is None:
        return _Admission()
    span = window[-1].t - window[0].t
    if len(window) < 2 or span <= 0:
        return _Admission()
    resets = _restarts(window)

    def rate(values: Sequence[float | None]) -> float:
        counted = _counted(window, values, Counted.ADMISSION_REJECTIONS)
        return window_increase(values, resets, counted) / span

    total = rate([s.snapshot.admission_rejections_total for s in window])
    by_reason = {
        reason: rate([s.snapshot.admission_rejections_by_reason.get(reason) for s in window])
        for reason in latest.admission_rejections_by_reason
    }
    return _Admission(total, by_reason or _NO_LABELS)


def _admission_room(
    snapshot: VllmSnapshot, limit: RunningLimit | None, rejections_per_second: float | None
) -> float | None:
    """What the API server's admission caps still let in: the cap less every engine's requests.

    vLLM counts the server's unfinished requests over all its engines (waiting and running, a
    request of ``n`` samples as ``n``: as V1's gauges count them).
    """
    engines = snapshot.engines.values()
    counts = [e.requests_running for e in engines] + [e.requests_waiting for e in engines]
    in_flight = sum(c for c in counts if c is not None) if None not in counts else None
    return queue_room(
        limit.queue_caps if limit is not None else None,
        in_flight=in_flight,
        rejecting=(rejections_per_second or 0.0) > 0,
    )


def derive_target(
    samples: Sequence[Sample],
    *,
    windows: WindowSettings,
    predicted_capacity_tokens: float | None = None,
    pool_layout: PoolLayout | None = None,
    max_model_len: int | None = None,
    running_limit: RunningLimit | None = None,
    previous: TargetDerived | None = None,
) -> TargetDerived:
    """Derive every engine's figures at the latest of ``samples`` (oldest first).

    ``predicted_capacity_tokens`` is the sizing model's per-engine capacity in vLLM's own terms
    (``None`` when the prediction is unavailable), ``pool_layout`` its KV-cache groups (how
    many blocks a sequence of a given length takes); ``running_limit`` the scheduler's
    ``max_num_seqs`` of each engine, where known; ``previous`` the figures of the poll before,
    whose context figures may stand for ``windows.context_refresh_seconds``. A
    ``max_model_len`` that is not a positive number within ``MAX_EXACT_WHOLE`` is unknown.
    """
    if not samples:
        return TargetDerived(engines=())
    if max_model_len is not None and (max_model_len <= 0 or _known(max_model_len) is None):
        max_model_len = None
    contexts = {e.engine: e.context for e in previous.engines} if previous is not None else {}
    admission = _admission_rate(samples, windows.rate_seconds)
    room = _admission_room(samples[-1].snapshot, running_limit, admission.per_second)
    engines = tuple(
        derive_engine(
            name,
            samples,
            windows=windows,
            predicted_capacity_tokens=predicted_capacity_tokens,
            pool_layout=pool_layout,
            max_model_len=max_model_len,
            running_limit=running_limit,
            previous_context=contexts.get(name),
            admission_room=room,
        )
        for name in samples[-1].snapshot.engines  # in rank order, as the parser keeps them
    )
    return TargetDerived(
        engines=engines,
        restarted=len(samples) > 1 and samples[-1].restarted,
        admission_rejections_per_second=admission.per_second,
        admission_rejections_by_reason_per_second=admission.by_reason,
    )


def carried(derived: TargetDerived) -> TargetDerived:
    """What the next :func:`derive_target` reads of ``derived`` (its ``previous``), and no more.

    Only context figures that may stand are read from the poll before (:func:`_kept_context`):
    those of a window of ``KEEP_CONTEXT_MIN_REQUESTS`` requests or more. A poller keeps this
    between polls instead of the figures it published (64 engines' of them, with the split
    labels' values, for every fleet target); the next figures are the same either way.
    """
    return TargetDerived(
        engines=tuple(
            EngineDerived(engine=e.engine, model_name=e.model_name, context=e.context)
            for e in derived.engines
            if _may_stand(e.context)
        )
    )
