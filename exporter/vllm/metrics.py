"""Turn one vLLM ``/metrics`` payload into a :class:`~exporter.core.snapshot.VllmSnapshot`.

Pure: text in, plain data out. The rules (DESIGN section 4, and the real captures in
``tests/fixtures/vllm-metrics/``):

- Only the families below are parsed (:data:`WANTED`); every other line is skipped unparsed.
- One :class:`~exporter.core.snapshot.EngineMetrics` per ``engine`` label value; ``"0"`` for series
  without one (V0, V1 <= 0.8.2). A payload that declares ``vllm:`` families but has no sample
  (metrics disabled) still yields one empty engine ``"0"``.
- Renamed families are merged, the newer name winning where both are exposed:
  ``kv_cache_usage_perc`` over ``gpu_cache_usage_perc``, ``inter_token_latency_seconds`` over
  ``time_per_output_token_seconds``.
- Counters are read from their ``_total`` samples; ``_created`` samples are ignored. Several series
  of one engine are summed (``request_success_total`` over ``finished_reason``; a gauge or a
  histogram split by an unexpected extra label the same way, bucket by bucket); a usage ratio
  takes the largest. ``admission_rejections_total`` has no ``engine`` label: it is summed per
  server.
- ``cache_config_info`` label values are Python ``str()``: ``"None"`` is None, ``"True"`` is
  True. ``num_gpu_blocks`` is kept as vLLM says it: it counts the reserved null block and, under
  data parallelism, is the SUM over engines, repeated on every engine's series; per engine
  capacity is ``kv_cache_size_tokens`` (about 0.24 on), when present.
- A histogram without a ``+Inf`` bucket gets one from its ``_count``; one with neither, without
  ``_sum``, with a bad ``le`` or with decreasing buckets is malformed: :class:`ParseError`.
- Cardinality is capped (:class:`CardinalityLimits`): past a cap, samples are dropped and counted
  in :attr:`~exporter.core.snapshot.VllmSnapshot.dropped_samples`, never kept without bound.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Final

from exporter.core.snapshot import CacheConfig, EngineMetrics, Histogram, VllmSnapshot
from exporter.errors import ParseError
from exporter.vllm.promtext import parse_exposition, wanted_families

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from exporter.vllm.promtext import TextSample

__all__ = [
    "DEFAULT_LIMITS",
    "WANTED",
    "CardinalityLimits",
    "parse_vllm_metrics",
]

# Gauges summed per engine, by family -> EngineMetrics field.
_GAUGES: Final = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:num_requests_swapped": "requests_swapped",  # V0 only
}
# Counters (their `_total` samples) summed per engine.
_COUNTERS: Final = {
    "vllm:num_preemptions": "preemptions_total",
    "vllm:request_success": "requests_finished_total",
    "vllm:prompt_tokens": "prompt_tokens_total",
    "vllm:generation_tokens": "generation_tokens_total",
}
# Histograms by family -> field; for a renamed family the first name listed wins.
_HISTOGRAMS: Final = {
    "vllm:request_prompt_tokens": "prompt_tokens",
    "vllm:request_generation_tokens": "generation_tokens",
    "vllm:time_to_first_token_seconds": "time_to_first_token",
    "vllm:inter_token_latency_seconds": "inter_token_latency",  # 0.11+
    "vllm:time_per_output_token_seconds": "inter_token_latency",  # before 0.11
    "vllm:e2e_request_latency_seconds": "e2e_request_latency",
    "vllm:request_queue_time_seconds": "request_queue_time",
}
# KV-cache usage, newest name first (gpu_cache_usage_perc renamed in 0.9.2, removed in 0.12).
_USAGE: Final = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"  # 0.20+
_CACHE_CONFIG: Final = "vllm:cache_config_info"
_ADMISSION_REJECTIONS: Final = "vllm:admission_rejections"  # per server, no engine label
_PROCESS_START: Final = "process_start_time_seconds"

#: The compiled set of families the sidecar reads; every other line is skipped unparsed.
WANTED: Final = wanted_families(
    [
        *_GAUGES,
        *_COUNTERS,
        *_HISTOGRAMS,
        *_USAGE,
        _WAITING_BY_REASON,
        _CACHE_CONFIG,
        _ADMISSION_REJECTIONS,
        _PROCESS_START,
    ],
    # `_created` samples are timestamps of series creation, not values: never even tokenised.
    suffixes=("_bucket", "_count", "_sum", "_total"),
)

_HISTOGRAM_SUFFIXES: Final = frozenset({"_bucket", "_count", "_sum"})


@dataclass(frozen=True, slots=True)
class CardinalityLimits:
    """Caps on what one payload may make us keep; past them samples are dropped and counted.

    vLLM itself stays far below them (one engine per data-parallel rank, two waiting reasons,
    at most 23 buckets, about 40 ``cache_config_info`` labels in 0.32); they bound the memory and
    the exported series a broken or hostile target can cause.
    """

    max_engines: int = 256
    max_waiting_reasons: int = 32
    max_histogram_buckets: int = 256
    max_cache_config_labels: int = 256


#: The limits :func:`parse_vllm_metrics` uses unless told otherwise.
DEFAULT_LIMITS: Final = CardinalityLimits()


@dataclass(slots=True)
class _HistogramParts:
    """The samples of one histogram of one engine, as they arrive."""

    first_line: int
    buckets: dict[float, float] = field(default_factory=dict)
    count: float | None = None
    sum: float | None = None
    #: Buckets beyond the cap: the whole histogram is then dropped.
    overflow: int = 0


@dataclass(slots=True)
class _EngineParts:
    """Everything read for one engine before it is frozen into an EngineMetrics."""

    model_name: str | None = None
    sums: dict[str, float] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, _HistogramParts] = field(default_factory=dict)
    cache_config: TextSample | None = None


def parse_vllm_metrics(
    payload: str | bytes, *, limits: CardinalityLimits = DEFAULT_LIMITS
) -> VllmSnapshot:
    """Parse a vLLM ``/metrics`` payload (text format 0.0.4) into a normalised snapshot.

    Raises :class:`~exporter.errors.ParseError`, naming the line, when a series the sidecar
    reads is malformed; lines of other families are never looked at.
    """
    exposition = parse_exposition(payload, WANTED)
    fold = _Fold(limits)
    fold.add_all(exposition.samples)
    engines, server, dropped = fold.engines, fold.server, fold.dropped

    snapshot_engines: dict[str, EngineMetrics] = {}
    for engine in sorted(engines, key=_engine_order):
        metrics, engine_dropped = _freeze(engine, engines[engine], limits)
        snapshot_engines[engine] = metrics
        dropped += engine_dropped

    families = _vllm_families(exposition.declared, fold.seen)
    if not snapshot_engines and families:
        snapshot_engines["0"] = EngineMetrics(engine="0")  # families declared, no samples
    return VllmSnapshot(
        engines=snapshot_engines,
        families=families,
        process_start_time_seconds=server.process_start,
        admission_rejections_total=server.admission_rejections,
        engine_labelled=fold.engine_labelled,
        dropped_samples=dropped,
    )


class _Fold:
    """Folds the samples of one payload into per-engine and per-server parts."""

    def __init__(self, limits: CardinalityLimits) -> None:
        self.limits = limits
        self.engines: dict[str, _EngineParts] = {}
        self.server = _ServerParts()
        self.dropped = 0
        self.engine_labelled = False
        #: Wanted families with at least one sample.
        self.seen: set[str] = set()
        # `le` text -> bound: the same few dozen bounds come back in every histogram.
        self.bounds: dict[str, float] = {}

    def add_all(self, samples: Iterable[TextSample]) -> None:
        """Fold every sample in; raise ParseError on a malformed one."""
        family = ""
        run: list[TextSample] = []
        # vLLM writes each family's samples together: handle them run by run.
        for sample in samples:
            if sample[0] == family:
                run.append(sample)
                continue
            if run:
                self._add_run(family, run)
            family, run = sample[0], [sample]
        if run:
            self._add_run(family, run)

    def _add_run(self, family: str, run: list[TextSample]) -> None:
        self.seen.add(family)
        if family in _HISTOGRAMS:
            self._add_histogram_run(family, run)
        elif family in _SERVER_FAMILIES:
            for sample in run:
                self.server.add(sample)
        else:
            adder = _ADDERS[family]
            for sample in run:
                parts = self._engine_parts(sample)
                self.dropped += 1 if parts is None else adder(parts, sample, self.limits)

    def _engine_parts(self, sample: TextSample) -> _EngineParts | None:
        """The parts of the sample's engine; None (the caller counts a drop) past the cap."""
        labels = sample.labels
        engine = labels.get("engine")
        if engine is None:
            engine = "0"
        else:
            self.engine_labelled = True
        parts = self.engines.get(engine)
        if parts is None:
            if len(self.engines) >= self.limits.max_engines:
                return None
            parts = self.engines[engine] = _EngineParts()
        if parts.model_name is None:  # cache_config_info has none: take it from the others
            parts.model_name = labels.get("model_name")
        return parts

    # The hot loop: histogram buckets are most of the samples, so it only looks up the engine
    # and the histogram when the engine changes from one sample to the next.
    def _add_histogram_run(self, family: str, run: Iterable[TextSample]) -> None:
        bounds, max_buckets = self.bounds, self.limits.max_histogram_buckets
        engine: str | None = None
        histogram: _HistogramParts | None = None
        for sample in run:
            _, suffix, labels, value, _, lineno = sample
            sample_engine = labels.get("engine", "0")
            if histogram is None or sample_engine != engine:
                engine = sample_engine
                parts = self._engine_parts(sample)
                if parts is None:
                    histogram = None
                    self.dropped += 1
                    continue
                histogram = parts.histograms.get(family)
                if histogram is None:
                    histogram = parts.histograms[family] = _HistogramParts(first_line=lineno)
            if suffix == "_bucket":
                le = labels.get("le", "")
                bound = bounds.get(le)
                if bound is None:
                    bound = bounds[le] = _bucket_bound(sample)
                buckets = histogram.buckets
                below = buckets.get(bound)
                if below is not None:
                    buckets[bound] = below + value
                elif len(buckets) < max_buckets:
                    buckets[bound] = value
                else:
                    histogram.overflow += 1  # dropped whole, and counted, when frozen
            elif suffix == "_count":
                histogram.count = value if histogram.count is None else histogram.count + value
            elif suffix == "_sum":
                histogram.sum = value if histogram.sum is None else histogram.sum + value


@dataclass(slots=True)
class _ServerParts:
    """The per-server (not per-engine) values."""

    process_start: float | None = None
    admission_rejections: float | None = None

    def add(self, sample: TextSample) -> None:
        if sample.family == _PROCESS_START:
            if sample.suffix == "" and self.process_start is None:
                self.process_start = sample.value
        elif sample.suffix == "_total":
            self.admission_rejections = (self.admission_rejections or 0.0) + sample.value


_SERVER_FAMILIES: Final = frozenset({_PROCESS_START, _ADMISSION_REJECTIONS})

# Each adder folds one per-engine sample into the engine's parts and returns how many samples
# it dropped. A sample of another shape than the family's (a gauge's stray `_count`, a counter
# without `_total`) is not what vLLM writes for it: it is ignored.


def _add_gauge(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> int:
    if sample.suffix == "":
        target = _GAUGES[sample.family]
        parts.sums[target] = parts.sums.get(target, 0.0) + sample.value
    return 0


def _add_counter(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> int:
    if sample.suffix == "_total":
        target = _COUNTERS[sample.family]
        parts.sums[target] = parts.sums.get(target, 0.0) + sample.value
    return 0


def _add_usage(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> int:
    if sample.suffix == "":
        previous = parts.usage.get(sample.family)
        parts.usage[sample.family] = (
            sample.value if previous is None else max(previous, sample.value)
        )
    return 0


def _add_waiting_reason(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> int:
    if sample.suffix != "":
        return 0
    reason = sample.labels.get("reason", "")
    reasons = parts.waiting_by_reason
    if reason not in reasons and len(reasons) >= limits.max_waiting_reasons:
        return 1
    reasons[reason] = reasons.get(reason, 0.0) + sample.value
    return 0


def _add_cache_config(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> int:
    if sample.suffix != "":
        return 0
    if parts.cache_config is not None:
        return 1  # vLLM writes one series per engine; a second one is not believed
    parts.cache_config = sample
    return 0


_ADDERS: Final[Mapping[str, Callable[[_EngineParts, TextSample, CardinalityLimits], int]]] = {
    **dict.fromkeys(_GAUGES, _add_gauge),
    **dict.fromkeys(_COUNTERS, _add_counter),
    **dict.fromkeys(_USAGE, _add_usage),
    _WAITING_BY_REASON: _add_waiting_reason,
    _CACHE_CONFIG: _add_cache_config,
}


def _bucket_bound(sample: TextSample) -> float:
    le = sample.labels.get("le")
    if le is None:
        raise _error(sample, "bucket without an 'le' label")
    bound = _parse_float(le)
    if bound is None or math.isnan(bound):
        raise _error(sample, f"bucket bound le={le[:40]!r} is not a number")
    return bound


def _freeze(
    engine: str, parts: _EngineParts, limits: CardinalityLimits
) -> tuple[EngineMetrics, int]:
    """Build the immutable EngineMetrics of one engine; also return the samples dropped."""
    dropped = 0
    histograms: dict[str, Histogram] = {}
    for family, target in _HISTOGRAMS.items():
        pieces = parts.histograms.get(family)
        if pieces is None or target in histograms:
            continue
        if pieces.overflow:
            dropped += _sample_count(pieces)
            continue
        histograms[target] = _histogram(family, engine, pieces)
    cache_config = None
    if parts.cache_config is not None:
        cache_config, dropped_labels = _cache_config(parts.cache_config, limits)
        dropped += dropped_labels
    usage = next((parts.usage[name] for name in _USAGE if name in parts.usage), None)
    sums = parts.sums
    metrics = EngineMetrics(
        engine=engine,
        model_name=parts.model_name,
        requests_running=sums.get("requests_running"),
        requests_waiting=sums.get("requests_waiting"),
        requests_waiting_by_reason=dict(sorted(parts.waiting_by_reason.items())),
        requests_swapped=sums.get("requests_swapped"),
        kv_cache_usage_ratio=usage,
        preemptions_total=sums.get("preemptions_total"),
        requests_finished_total=sums.get("requests_finished_total"),
        prompt_tokens_total=sums.get("prompt_tokens_total"),
        generation_tokens_total=sums.get("generation_tokens_total"),
        prompt_tokens=histograms.get("prompt_tokens"),
        generation_tokens=histograms.get("generation_tokens"),
        time_to_first_token=histograms.get("time_to_first_token"),
        inter_token_latency=histograms.get("inter_token_latency"),
        e2e_request_latency=histograms.get("e2e_request_latency"),
        request_queue_time=histograms.get("request_queue_time"),
        cache_config=cache_config,
    )
    return metrics, dropped


def _sample_count(pieces: _HistogramParts) -> int:
    return (
        len(pieces.buckets)
        + pieces.overflow
        + (pieces.count is not None)
        + (pieces.sum is not None)
    )


def _histogram(family: str, engine: str, pieces: _HistogramParts) -> Histogram:
    """Freeze one engine's histogram, checking that it is whole and cumulative."""
    bounds = sorted(pieces.buckets)  # already in order from vLLM: a linear pass
    cumulative = list(map(pieces.buckets.__getitem__, bounds))
    if not bounds or bounds[-1] != math.inf:
        if pieces.count is None:
            raise _histogram_error(family, engine, pieces, "no +Inf bucket and no _count")
        # The +Inf bucket is the count, by definition; vLLM's docs elide it in examples.
        bounds.append(math.inf)
        cumulative.append(pieces.count)
    if pieces.sum is None:
        raise _histogram_error(family, engine, pieces, "no _sum")
    if not all(map(operator.le, cumulative, cumulative[1:])):
        pairs = zip(bounds[1:], pairwise(cumulative), strict=True)
        bound = next(bound for bound, (below, above) in pairs if not below <= above)
        problem = f"bucket le={bound:g} counts fewer observations than the one below, or NaN"
        raise _histogram_error(family, engine, pieces, problem)
    count = pieces.count if pieces.count is not None else cumulative[-1]
    return Histogram(
        bounds=tuple(bounds), cumulative=tuple(cumulative), count=count, sum=pieces.sum
    )


def _histogram_error(family: str, engine: str, pieces: _HistogramParts, problem: str) -> ParseError:
    return ParseError(
        f"line {pieces.first_line}: malformed histogram {family} of engine {engine!r} (first "
        f"sample on that line): {problem} (is the payload complete?)"
    )


def _cache_config(sample: TextSample, limits: CardinalityLimits) -> tuple[CacheConfig, int]:
    """Read the capacity facts of one ``cache_config_info`` series (label values are str())."""
    labels = sample.labels
    kept = sorted(name for name in labels if name != "engine")
    dropped = max(0, len(kept) - limits.max_cache_config_labels)
    kept = kept[: limits.max_cache_config_labels]
    config = CacheConfig(
        num_gpu_blocks=_int_label(sample, "num_gpu_blocks"),
        block_size=_int_label(sample, "block_size"),
        kv_cache_size_tokens=_int_label(sample, "kv_cache_size_tokens"),
        kv_cache_max_concurrency=_float_label(sample, "kv_cache_max_concurrency"),
        gpu_memory_utilization=_float_label(sample, "gpu_memory_utilization"),
        kv_cache_memory_bytes=_int_label(sample, "kv_cache_memory_bytes"),
        cache_dtype=_str_label(sample, "cache_dtype"),
        enable_prefix_caching=_bool_label(sample, "enable_prefix_caching"),
        sliding_window=_int_label(sample, "sliding_window"),
        labels={name: labels[name] for name in kept},
    )
    return config, dropped


def _str_label(sample: TextSample, name: str) -> str | None:
    text = sample.labels.get(name)
    return None if text is None or text == "None" else text


def _float_label(sample: TextSample, name: str) -> float | None:
    text = _str_label(sample, name)
    if text is None:
        return None
    number = _parse_float(text)
    if number is None or not math.isfinite(number):
        raise _error(sample, f"label {name}={text[:40]!r} is not a number")
    return number


def _int_label(sample: TextSample, name: str) -> int | None:
    number = _float_label(sample, name)
    if number is None:
        return None
    if not number.is_integer():
        raise _error(sample, f"label {name}={sample.labels[name][:40]!r} is not an integer")
    return int(number)


def _bool_label(sample: TextSample, name: str) -> bool | None:
    text = _str_label(sample, name)
    if text is None:
        return None
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise _error(sample, f"label {name}={text[:40]!r} is not True, False or None")
    return lowered == "true"


def _parse_float(text: str) -> float | None:
    # Same rule as the text format's values: no "1_000", no non-ASCII digits.
    if "_" in text or not text.isascii():
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _error(sample: TextSample, problem: str) -> ParseError:
    return ParseError(
        f"line {sample.lineno}: malformed sample of {sample.family}: {problem} "
        "(is the target a vLLM /metrics endpoint, and the payload complete?)"
    )


def _engine_order(engine: str) -> tuple[int, int, str]:
    # Data-parallel ranks are numbers: "10" after "9".
    return (0, int(engine), "") if engine.isdigit() else (1, 0, engine)


def _vllm_families(declared: frozenset[str], seen: set[str]) -> frozenset[str]:
    """``vllm:`` family names as a 0.0.4 ``# TYPE`` line writes them (counters with ``_total``).

    ``<name>_created`` companions are left out; wanted families seen only through samples (a
    capture without comments) are added under the same spelling.
    """
    names = {name for name in declared if name.startswith("vllm:")}
    for family in seen:
        if family.startswith("vllm:"):
            counter = family in _COUNTERS or family == _ADMISSION_REJECTIONS
            names.add(family + "_total" if counter else family)
    return frozenset(name for name in names if not name.endswith("_created"))
