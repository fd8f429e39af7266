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
  server, and kept by ``reason`` too (vLLM's reasons always, a few others besides).
- ``cache_config_info`` label values are Python ``str()``: ``"None"`` is None, ``"True"`` is
  True. ``num_gpu_blocks`` is kept as vLLM says it: it counts the reserved null block and, under
  data parallelism, is the SUM over engines, repeated on every engine's series; per engine
  capacity is ``kv_cache_size_tokens`` (about 0.24 on), when present. The offload pool of
  ``SimpleCPUOffloadConnector`` is the ``capacity_blocks`` label of ``simple_kv_offload_info``.
- A histogram without a ``+Inf`` bucket gets one from its ``_count``; one with neither, without
  ``_sum``, with a bad ``le`` or with decreasing buckets is malformed: :class:`ParseError`.
- Cardinality is capped (:class:`CardinalityLimits`): past a cap, samples are dropped and counted
  in :attr:`~exporter.core.snapshot.VllmSnapshot.dropped`, never kept without bound.
- Impossible values (NaN, infinities, negative counts, a usage outside 0 to 1, a histogram
  ``_sum`` its buckets contradict or a count past 2**53, a ``cache_config_info`` number vLLM
  cannot write: a block of 0 tokens, -1 blocks, a utilization of 2), label values
  longer than vLLM writes and a second series where vLLM writes one (another ``model_name``
  for the same engine) are dropped and counted by reason; a series written twice is a
  :class:`ParseError`, as Prometheus refuses such a scrape.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from itertools import groupby, pairwise
from typing import TYPE_CHECKING, Final

from exporter.core.exact import MAX_EXACT_WHOLE
from exporter.core.reasons import AdmissionReason, DropReason
from exporter.core.snapshot import CacheConfig, EngineMetrics, Histogram, VllmSnapshot
from exporter.errors import ParseError
from exporter.vllm import families as vllm_families
from exporter.vllm.families import Kind
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

# What the parser reads, derived once at import from the one table of vLLM's families
# (exporter.vllm.families): a family vLLM adds or renames is a row there, not a name here.
_USAGE_FIELD: Final = "kv_cache_usage_ratio"
# KV-cache usage, newest name first (gpu_cache_usage_perc renamed in 0.9.2, removed in 0.12).
_USAGE: Final = vllm_families.names(vllm_families.feeding(_USAGE_FIELD))
# Gauges summed per engine, by family -> EngineMetrics field.
_GAUGES: Final = {
    row.name: row.feeds
    for row in vllm_families.read(Kind.GAUGE)
    if row.feeds is not None and row.feeds != _USAGE_FIELD
}
# Counters (their `_total` samples) summed per engine, by family -> the key of the sum: the
# EngineMetrics field, or for a replaced family (the gpu_ prefix-cache names, in blocks until
# 0.9.0) its own name, read only when the newer families are absent (_OLD_COUNTERS).
_COUNTERS: Final = {
    row.name: row.name if row.replaced_by else row.feeds
    for row in (*vllm_families.read(Kind.COUNTER), *vllm_families.read(Kind.COUNTER, split=True))
    if row.feeds is not None
}
# EngineMetrics counter field -> the sum key of the older family that fills it.
_OLD_COUNTERS: Final = {
    row.feeds: row.name
    for row in vllm_families.read(Kind.COUNTER)
    if row.feeds is not None and row.replaced_by
}
# The label vLLM splits a counter by; each value is kept in EngineMetrics under the field.
_SPLITS: Final = {
    row.name: row.split
    for row in vllm_families.read(Kind.COUNTER, split=True)
    if row.split is not None
}
# Gauges split by a label, kept per value: family -> (label, EngineMetrics field).
_SPLIT_GAUGES: Final = {
    row.name: (row.split, row.feeds)
    for row in vllm_families.read(Kind.GAUGE, split=True)
    if row.split is not None and row.feeds is not None
}
# Histograms by family -> field; for a renamed family the first name listed wins.
_HISTOGRAMS: Final = {
    row.name: row.feeds for row in vllm_families.read(Kind.HISTOGRAM) if row.feeds is not None
}
(_CACHE_CONFIG,) = vllm_families.names(vllm_families.feeding("cache_config"))
# SimpleCPUOffloadConnector's info gauge: its capacity_blocks label is the offload pool.
(_OFFLOAD_INFO,) = vllm_families.names(vllm_families.feeding("kv_offload_capacity_blocks"))
# Per server, no engine label.
(_ADMISSION_REJECTIONS,) = vllm_families.names(vllm_families.feeding("admission_rejections_total"))
(_PROCESS_START,) = vllm_families.names(vllm_families.feeding("process_start_time_seconds"))

#: The compiled set of families the sidecar reads; every other line is skipped unparsed.
WANTED: Final = wanted_families(
    [
        *_GAUGES,
        *_COUNTERS,
        *_HISTOGRAMS,
        *_USAGE,
        *_SPLIT_GAUGES,
        _CACHE_CONFIG,
        _OFFLOAD_INFO,
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
    at most 23 buckets, about 40 ``cache_config_info`` labels in 0.32, model names of tens of
    characters); they bound the memory and the exported series a broken or hostile target can
    cause.
    """

    #: Data-parallel ranks of one server (the largest deployments run a few dozen).
    max_engines: int = 64
    #: Values of a label vLLM splits a family by (``reason``, ``finished_reason``).
    max_split_values: int = 32
    max_histogram_buckets: int = 256
    max_cache_config_labels: int = 256
    #: Longest label value kept (a served model name is at most a path of a hundred or so).
    max_label_value_chars: int = 512
    #: Characters of split-label values kept per engine, all families together (vLLM's own
    #: words are short: ``capacity``, ``device``...): every sample of a window keeps them. The
    #: server's admission reasons other than vLLM's have a budget of the same size.
    max_split_label_chars: int = 1024
    #: Admission-rejection reasons kept besides vLLM's own (:class:`~exporter.core.reasons.
    #: AdmissionReason`, always kept): room for a cap a later vLLM adds, not for a target that
    #: makes up a reason every scrape.
    max_other_admission_reasons: int = 4
    #: Samples of the families read, per payload (64 engines of vLLM 0.32 write about 11,000):
    #: past it the rest are counted, not parsed, so memory stays bounded whatever is sent.
    max_samples: int = 32_768


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
    #: Why the whole histogram is dropped when frozen (a DropReason), if it is.
    rejected: str | None = None
    #: Samples of other series of the histogram, not kept (counted when it is dropped).
    extra: int = 0
    #: The labels of its ``_count`` and ``_sum`` (one series: the same ones).
    series: dict[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class _EngineParts:
    """Everything read for one engine before it is frozen into an EngineMetrics."""

    model_name: str | None = None
    sums: dict[str, float] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)
    #: Split gauges and counters by field, then by the split label's value.
    split_values: dict[str, dict[str, float]] = field(default_factory=dict)
    histograms: dict[str, _HistogramParts] = field(default_factory=dict)
    cache_config: TextSample | None = None
    #: The ``capacity_blocks`` of ``vllm:simple_kv_offload_info``.
    offload_blocks: int | None = None
    #: The labels of the first series of each family: another series (other labels, but for
    #: the one vLLM splits the family by) for the same engine is not vLLM's: dropped, never
    #: summed in.
    series: dict[str, Mapping[str, str]] = field(default_factory=dict)
    #: Values of the split label seen, per counter (bounded by ``max_split_values``).
    splits: dict[str, set[str]] = field(default_factory=dict)
    #: Characters of the split values kept, all families (bounded by ``max_split_label_chars``).
    split_chars: int = 0
    #: What was read already (a field, or a field and split value): a second time is a
    #: series written twice.
    written: set[str | tuple[str, str]] = field(default_factory=set)
    #: Counters with an impossible value in one of their series: absent, not a partial sum.
    invalid: set[str] = field(default_factory=set)


def parse_vllm_metrics(
    payload: str | bytes, *, limits: CardinalityLimits = DEFAULT_LIMITS
) -> VllmSnapshot:
    """Parse a vLLM ``/metrics`` payload (text format 0.0.4) into a normalised snapshot.

    Raises :class:`~exporter.errors.ParseError`, naming the line, when a series the sidecar
    reads is malformed or written twice; lines of other families are never looked at. Values
    that cannot be true (NaN, infinite, negative counts, a usage outside 0 to 1) are dropped and
    counted by reason in :attr:`~exporter.core.snapshot.VllmSnapshot.dropped`, and the figure
    they would have made is absent.
    """
    exposition = parse_exposition(payload, WANTED, max_samples=limits.max_samples)
    fold = _Fold(limits)
    fold.add_all(exposition.samples)
    engines, server, dropped = fold.engines, fold.server, fold.dropped
    if exposition.overflow:
        dropped[DropReason.TOO_MANY_SERIES] += exposition.overflow
    if exposition.too_long:
        dropped[DropReason.LABEL_TOO_LONG] += exposition.too_long

    snapshot_engines: dict[str, EngineMetrics] = {}
    for engine in sorted(engines, key=_engine_order):
        snapshot_engines[engine] = _freeze(engine, engines[engine], limits, dropped)

    families = _vllm_families(exposition.declared, fold.seen)
    if not snapshot_engines and families:
        snapshot_engines["0"] = EngineMetrics(engine="0")  # families declared, no samples
    return VllmSnapshot(
        engines=snapshot_engines,
        families=families,
        process_start_time_seconds=server.process_start,
        admission_rejections_total=server.admission_rejections,
        admission_rejections_by_reason=dict(sorted(server.by_reason.items())),
        engine_labelled=fold.engine_labelled,
        dropped={reason: count for reason, count in sorted(dropped.items()) if count},
    )


def _valid(value: float) -> str | None:
    """Why a count, sum or ratio read from vLLM cannot be true, or None when it can."""
    if not math.isfinite(value):
        return DropReason.NOT_FINITE
    if value < 0:
        return DropReason.OUT_OF_RANGE
    return None


def _valid_count(value: float) -> str | None:
    """Why a counter's (or a count gauge's) value cannot be vLLM's, or None when it can.

    Past 2**53 no count is exact, and no vLLM's comes near (as for the histograms' counts):
    two readings of 1e308 a reset apart would add up to an infinite rate.
    """
    if (reason := _valid(value)) is not None:
        return reason
    return DropReason.OUT_OF_RANGE if value > MAX_EXACT_WHOLE else None


class _Fold:
    """Folds the samples of one payload into per-engine and per-server parts, as they come."""

    def __init__(self, limits: CardinalityLimits) -> None:
        self.limits = limits
        self.engines: dict[str, _EngineParts] = {}
        self.server = _ServerParts(limits)
        self.dropped: Counter[str] = Counter()
        self.engine_labelled = False
        #: Wanted families with at least one sample.
        self.seen: set[str] = set()
        # `le` text -> bound: the same few dozen bounds come back in every histogram.
        self.bounds: dict[str, float] = {}
        # The last label set _engine_parts accepted, and its engine's parts: the parser shares
        # one mapping per label text, and every gauge and counter of an engine has the same.
        self.last_labels: Mapping[str, str] | None = None
        self.last_parts: _EngineParts | None = None

    def add_all(self, samples: Iterable[TextSample]) -> None:
        """Fold every sample in; raise ParseError on a malformed one."""
        # vLLM writes each family's samples together: handle them run by run (grouped in C).
        for family, run in groupby(samples, _FAMILY):
            self._add_run(family, run)

    def _add_run(self, family: str, run: Iterable[TextSample]) -> None:
        self.seen.add(family)
        if family in _HISTOGRAMS:
            self._add_histogram_run(family, run)
        elif family in _SERVER_FAMILIES:
            for sample in run:
                self.server.add(sample, self.dropped)
        else:
            adder = _ADDERS[family]
            for sample in run:
                parts = self._engine_parts(sample)
                if parts is not None:
                    reason = adder(parts, sample, self.limits)
                    if reason is not None:
                        self.dropped[reason] += 1

    def _engine_parts(self, sample: TextSample) -> _EngineParts | None:
        """The parts of the sample's engine; None (and the drop counted) when it is refused."""
        labels = sample.labels
        if labels is self.last_labels:
            return self.last_parts  # the same labels, hence the same engine, accepted
        engine = labels.get("engine")
        if engine is None:
            engine = "0"
        else:
            self.engine_labelled = True
        longest = self.limits.max_label_value_chars
        model_name = labels.get("model_name")
        if len(engine) > longest or (model_name is not None and len(model_name) > longest):
            self.dropped[DropReason.LABEL_TOO_LONG] += 1
            return None
        parts = self.engines.get(engine)
        if parts is None:
            if len(self.engines) >= self.limits.max_engines:
                self.dropped[DropReason.TOO_MANY_SERIES] += 1
                return None
            parts = self.engines[engine] = _EngineParts()
        if parts.model_name is None:  # cache_config_info has none: take it from the others
            parts.model_name = model_name
        self.last_labels, self.last_parts = labels, parts
        return parts

    # The hot loop: histogram buckets are most of the samples, so it only looks up the engine
    # and the histogram when the engine changes from one sample to the next.
    def _add_histogram_run(self, family: str, run: Iterable[TextSample]) -> None:
        bounds, max_buckets, inf = self.bounds, self.limits.max_histogram_buckets, math.inf
        engine: str | None = None
        histogram: _HistogramParts | None = None
        buckets: dict[float, float] = {}
        for sample in run:
            _, suffix, labels, value, _, lineno = sample
            sample_engine = labels.get("engine", "0")
            if histogram is None or sample_engine != engine:
                engine = sample_engine
                parts = self._engine_parts(sample)
                if parts is None:
                    histogram = None
                    continue
                histogram = parts.histograms.get(family)
                if histogram is None:
                    histogram = parts.histograms[family] = _HistogramParts(first_line=lineno)
                buckets = histogram.buckets
            if not 0.0 <= value < inf and histogram.rejected is None:
                histogram.rejected = _valid(value) or DropReason.NOT_FINITE
            if suffix == "_bucket":
                le = labels.get("le", "")
                bound = bounds.get(le)
                if bound is None:
                    bound = bounds[le] = _bucket_bound(sample)
                if len(buckets) >= max_buckets:
                    histogram.overflow += 1  # dropped whole, and counted, when frozen
                elif bound in buckets:
                    # The engine already has this bucket: a second series of the histogram.
                    histogram.rejected = histogram.rejected or DropReason.UNEXPECTED_SERIES
                    histogram.extra += 1
                else:
                    buckets[bound] = value
                continue
            _add_histogram_total(histogram, sample)


def _add_histogram_total(histogram: _HistogramParts, sample: TextSample) -> None:
    """A histogram's ``_count`` or ``_sum``: a second one is another series, or the same twice."""
    suffix = sample.suffix
    if suffix not in ("_count", "_sum"):
        return
    labels = sample.labels
    first = histogram.series.setdefault(suffix, labels)
    if (histogram.count if suffix == "_count" else histogram.sum) is not None:
        # The parser shares one mapping per label text: identity first, equality otherwise.
        if first is labels or first == labels:
            raise _error(sample, _TWICE)
        histogram.rejected = histogram.rejected or DropReason.UNEXPECTED_SERIES
        histogram.extra += 1
    elif suffix == "_count":
        histogram.count = sample.value
    else:
        histogram.sum = sample.value


_TWICE: Final = "the same series is written twice (Prometheus rejects such a payload)"


_FAMILY: Final = operator.itemgetter(0)


#: The admission reasons vLLM writes: kept whatever else a payload sends.
_ADMISSION_REASONS: Final = frozenset(reason.value for reason in AdmissionReason)


@dataclass(slots=True)
class _ServerParts:
    """The per-server (not per-engine) values."""

    limits: CardinalityLimits
    process_start: float | None = None
    admission_rejections: float | None = None
    #: The rejections by reason kept: vLLM's reasons, and a few others
    #: (``max_other_admission_reasons``, ``max_split_label_chars`` characters in all).
    by_reason: dict[str, float] = field(default_factory=dict)
    #: Rejection reasons read (a second time is a series written twice).
    reasons: set[str] = field(default_factory=set)
    #: Other reasons kept, and their characters.
    others: int = 0
    other_chars: int = 0

    def add(self, sample: TextSample, dropped: Counter[str]) -> None:
        reason = _valid(sample.value)
        if sample.family == _PROCESS_START:
            if sample.suffix == "" and self.process_start is None:
                if reason is None:
                    self.process_start = sample.value
                else:
                    dropped[reason] += 1
        elif sample.suffix == "_total":
            reason = _valid_count(sample.value)
            split = sample.labels.get("reason", "")
            if split in self.reasons:
                raise _error(sample, _TWICE)
            self.reasons.add(split)
            if reason is None:
                self.admission_rejections = (self.admission_rejections or 0.0) + sample.value
                reason = self._refused(split)
                if reason is None:
                    self.by_reason[split] = sample.value
            if reason is not None:
                dropped[reason] += 1

    def _refused(self, split: str) -> str | None:
        """Why a reason is left out of ``by_reason`` (its count stays in the total), or None."""
        if not split:
            return DropReason.UNEXPECTED_SERIES  # vLLM labels every series with its reason
        if split in _ADMISSION_REASONS:
            return None
        limits = self.limits
        if len(split) > limits.max_label_value_chars:
            return DropReason.LABEL_TOO_LONG
        if (
            self.others >= limits.max_other_admission_reasons
            or self.other_chars + len(split) > limits.max_split_label_chars
        ):
            return DropReason.TOO_MANY_SERIES
        self.others += 1
        self.other_chars += len(split)
        return None


_SERVER_FAMILIES: Final = frozenset({_PROCESS_START, _ADMISSION_REJECTIONS})

# Each adder folds one per-engine sample into the engine's parts and returns why it dropped the
# sample (a DropReason), or None. A sample of another shape than the family's (a gauge's stray
# `_count`, a counter without `_total`, as llm-d's inference simulator writes its counters) is
# not what vLLM writes for it: dropped, and counted as an unexpected series.


def _first_series(
    parts: _EngineParts, family: str, labels: Mapping[str, str], split: str = ""
) -> bool:
    """Whether the sample belongs to the engine's one series of ``family`` (``split`` aside)."""
    first = parts.series.setdefault(family, labels)
    if first is labels:  # the parser shares one mapping per label text: the common case
        return True
    if not split:
        return first == labels
    return {k: v for k, v in first.items() if k != split} == {
        k: v for k, v in labels.items() if k != split
    }


def _once(parts: _EngineParts, what: str | tuple[str, str], sample: TextSample) -> None:
    """Note that ``what`` was read; a second time it is a series written twice."""
    if what in parts.written:
        raise _error(sample, _TWICE)
    parts.written.add(what)


def _add_gauge(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> str | None:
    if sample.suffix != "":
        return DropReason.UNEXPECTED_SERIES
    if not _first_series(parts, sample.family, sample.labels):
        return DropReason.UNEXPECTED_SERIES
    target = _GAUGES[sample.family]
    _once(parts, target, sample)
    reason = _valid_count(sample.value)  # requests running, waiting...: counts, as counters
    if reason is None:
        parts.sums[target] = sample.value
    return reason


def _add_counter(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> str | None:
    if sample.suffix != "_total":
        return DropReason.UNEXPECTED_SERIES
    split = _SPLITS.get(sample.family, "")
    if not _first_series(parts, sample.family, sample.labels, split):
        return DropReason.UNEXPECTED_SERIES
    target = _COUNTERS[sample.family]
    value = sample.labels.get(split, "") if split else ""
    if len(value) > limits.max_label_value_chars:
        return DropReason.LABEL_TOO_LONG
    _once(parts, (target, value), sample)
    if split:
        values = parts.splits.setdefault(target, set())
        if value not in values:
            if _split_full(parts, len(values), value, limits):
                return DropReason.TOO_MANY_SERIES
            values.add(value)
    reason = _valid_count(sample.value)
    if reason is not None:
        parts.invalid.add(target)
        return reason
    parts.sums[target] = parts.sums.get(target, 0.0) + sample.value
    if split:
        parts.split_values.setdefault(target, {})[value] = sample.value
    return None


def _add_usage(parts: _EngineParts, sample: TextSample, limits: CardinalityLimits) -> str | None:
    if sample.suffix != "":
        return DropReason.UNEXPECTED_SERIES
    if not _first_series(parts, sample.family, sample.labels):
        return DropReason.UNEXPECTED_SERIES
    _once(parts, sample.family, sample)
    reason = _valid(sample.value)
    if reason is None and sample.value > 1.0:
        reason = DropReason.OUT_OF_RANGE  # a share of the blocks: 0 to 1
    if reason is None:
        parts.usage[sample.family] = sample.value
    return reason


def _add_split_gauge(
    parts: _EngineParts, sample: TextSample, limits: CardinalityLimits
) -> str | None:
    if sample.suffix != "":
        return DropReason.UNEXPECTED_SERIES
    split, target = _SPLIT_GAUGES[sample.family]
    if not _first_series(parts, sample.family, sample.labels, split):
        return DropReason.UNEXPECTED_SERIES
    value = sample.labels.get(split, "")
    if len(value) > limits.max_label_value_chars:
        return DropReason.LABEL_TOO_LONG
    _once(parts, (sample.family, value), sample)
    values = parts.split_values.setdefault(target, {})
    if value not in values and _split_full(parts, len(values), value, limits):
        return DropReason.TOO_MANY_SERIES
    invalid = _valid(sample.value)
    if invalid is None:
        values[value] = sample.value
    return invalid


def _split_full(parts: _EngineParts, count: int, value: str, limits: CardinalityLimits) -> bool:
    """Whether a new split value is past a cap (else its characters are counted in)."""
    if count >= limits.max_split_values:
        return True
    if parts.split_chars + len(value) > limits.max_split_label_chars:
        return True
    parts.split_chars += len(value)
    return False


def _add_cache_config(
    parts: _EngineParts, sample: TextSample, limits: CardinalityLimits
) -> str | None:
    if sample.suffix != "":
        return DropReason.UNEXPECTED_SERIES
    if parts.cache_config is not None:
        return DropReason.UNEXPECTED_SERIES  # vLLM writes one series per engine
    parts.cache_config = sample
    return None


def _add_offload_info(
    parts: _EngineParts, sample: TextSample, limits: CardinalityLimits
) -> str | None:
    if sample.suffix != "":
        return DropReason.UNEXPECTED_SERIES
    if not _first_series(parts, sample.family, sample.labels):
        return DropReason.UNEXPECTED_SERIES  # vLLM writes one series per engine
    _once(parts, sample.family, sample)
    blocks = _int_label(sample, "capacity_blocks")
    if blocks is not None and blocks < 0:
        return DropReason.OUT_OF_RANGE
    parts.offload_blocks = blocks
    return None


_ADDERS: Final[
    Mapping[str, Callable[[_EngineParts, TextSample, CardinalityLimits], str | None]]
] = {
    **dict.fromkeys(_GAUGES, _add_gauge),
    **dict.fromkeys(_COUNTERS, _add_counter),
    **dict.fromkeys(_USAGE, _add_usage),
    **dict.fromkeys(_SPLIT_GAUGES, _add_split_gauge),
    _CACHE_CONFIG: _add_cache_config,
    _OFFLOAD_INFO: _add_offload_info,
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
    engine: str, parts: _EngineParts, limits: CardinalityLimits, dropped: Counter[str]
) -> EngineMetrics:
    """Build the immutable EngineMetrics of one engine, counting what it leaves out."""
    histograms: dict[str, Histogram] = {}
    for family, target in _HISTOGRAMS.items():
        pieces = parts.histograms.get(family)
        if pieces is None or target in histograms:
            continue
        if pieces.overflow or pieces.rejected:
            dropped[pieces.rejected or DropReason.TOO_MANY_SERIES] += _sample_count(pieces)
            continue
        histogram = _histogram(family, engine, pieces)
        reason = _impossible(histogram)
        if reason is not None:
            dropped[reason] += _sample_count(pieces)
            continue
        histograms[target] = histogram
    cache_config = None
    if parts.cache_config is not None:
        cache_config = _cache_config(parts.cache_config, limits, dropped)
    usage = next((parts.usage[name] for name in _USAGE if name in parts.usage), None)
    sums = {k: v for k, v in parts.sums.items() if k not in parts.invalid}
    splits = {
        k: dict(sorted(v.items())) for k, v in parts.split_values.items() if k not in parts.invalid
    }
    queries, hits = "prefix_cache_queries_total", "prefix_cache_hits_total"
    if queries not in sums and hits not in sums:  # before 0.9.2: the gpu_ names
        queries, hits = _OLD_COUNTERS[queries], _OLD_COUNTERS[hits]
    return EngineMetrics(
        engine=engine,
        model_name=parts.model_name,
        requests_running=sums.get("requests_running"),
        requests_waiting=sums.get("requests_waiting"),
        requests_waiting_by_reason=splits.get("requests_waiting_by_reason", {}),
        sleep_state=splits.get("sleep_state", {}),
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
        request_params_n=histograms.get("request_params_n"),
        prefix_cache_queries_total=sums.get(queries),
        prefix_cache_hits_total=sums.get(hits),
        prompt_tokens_cached_total=sums.get("prompt_tokens_cached_total"),
        prompt_tokens_cached_by_source=splits.get("prompt_tokens_cached_by_source", {}),
        prompt_tokens_by_source=splits.get("prompt_tokens_by_source", {}),
        requests_kv_fetch_by_stage=splits.get("requests_kv_fetch_by_stage", {}),
        kv_offload_capacity_blocks=parts.offload_blocks,
        cache_config=cache_config,
    )


def _sample_count(pieces: _HistogramParts) -> int:
    return (
        len(pieces.buckets)
        + pieces.overflow
        + pieces.extra
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
        problem = f"bucket le={bound:g} counts fewer observations than the one below"
        raise _histogram_error(family, engine, pieces, problem)
    count = pieces.count if pieces.count is not None else cumulative[-1]
    return Histogram(
        bounds=tuple(bounds), cumulative=tuple(cumulative), count=count, sum=pieces.sum
    )


#: Relative room for a float ``_sum``'s rounding (a sum of a billion observations is off by
#: far less) when it is compared with what the buckets allow.
_SUM_ROUNDING: Final = 1e-9


def _impossible(histogram: Histogram) -> str | None:
    """Why a whole, cumulative histogram cannot be true (a DropReason), or None when it can.

    Its count must be a whole number a float can still count (at most 2**53), and its ``_sum``
    within what its buckets allow: at least each bucket's lower bound times its observations
    (``le`` bounds are upper bounds, the counts cumulative), and at most the count times the
    largest finite bound when the ``+Inf`` bucket holds nothing beyond it. One pass over the
    buckets, once per histogram per payload.
    """
    bounds, cumulative, total = histogram.bounds, histogram.cumulative, histogram.sum
    if histogram.count > MAX_EXACT_WHOLE or cumulative[-1] > MAX_EXACT_WHOLE:
        return DropReason.OUT_OF_RANGE
    # Observations are counted by ones: 0.5 or 1e-320 of them is no vLLM's (and the context
    # estimate's arithmetic, built on whole counts, has no meaning for them).
    if not (histogram.count.is_integer() and all(map(float.is_integer, cumulative))):
        return DropReason.OUT_OF_RANGE
    lowest = 0.0
    below = lower = 0.0
    for bound, at_or_below in zip(bounds, cumulative, strict=True):
        if lower > 0.0:
            lowest += (at_or_below - below) * lower
        below, lower = at_or_below, bound
    if total < lowest * (1.0 - _SUM_ROUNDING):
        return DropReason.OUT_OF_RANGE
    if len(bounds) > 1 and cumulative[-1] <= cumulative[-2]:  # nothing beyond the last bound
        highest = max(histogram.count, cumulative[-1]) * bounds[-2]
        if total > highest * (1.0 + _SUM_ROUNDING) and bounds[-2] >= 0.0:
            return DropReason.OUT_OF_RANGE
    return None


def _histogram_error(family: str, engine: str, pieces: _HistogramParts, problem: str) -> ParseError:
    return ParseError(
        f"line {pieces.first_line}: malformed histogram {family} of engine {engine!r} (first "
        f"sample on that line): {problem} (is the payload complete?)"
    )


def _cache_config(
    sample: TextSample, limits: CardinalityLimits, dropped: Counter[str]
) -> CacheConfig:
    """Read the capacity facts of one ``cache_config_info`` series (label values are str()).

    Labels past the cap, and values longer than a label may be, are left out of
    :attr:`~exporter.core.snapshot.CacheConfig.labels` (and counted).
    """
    labels = sample.labels
    names = sorted(name for name in labels if name != "engine")
    longest = limits.max_label_value_chars
    kept = [name for name in names if len(labels[name]) <= longest]
    dropped[DropReason.LABEL_TOO_LONG] += len(names) - len(kept)
    dropped[DropReason.TOO_MANY_SERIES] += max(0, len(kept) - limits.max_cache_config_labels)
    kept = kept[: limits.max_cache_config_labels]
    ints = {name: _int_label(sample, name) for name in _CACHE_INTS}
    floats = {name: _float_label(sample, name) for name in _CACHE_FLOATS}
    for values in (ints, floats):
        for name, value in values.items():
            if value is not None and not _CACHE_RANGES[name](value):
                values[name] = None  # impossible: absent, and counted
                dropped[DropReason.OUT_OF_RANGE] += 1
    return CacheConfig(
        num_gpu_blocks=ints["num_gpu_blocks"],
        block_size=ints["block_size"],
        kv_cache_size_tokens=ints["kv_cache_size_tokens"],
        kv_cache_max_concurrency=floats["kv_cache_max_concurrency"],
        gpu_memory_utilization=floats["gpu_memory_utilization"],
        kv_cache_memory_bytes=ints["kv_cache_memory_bytes"],
        cache_dtype=_str_label(sample, "cache_dtype"),
        enable_prefix_caching=_bool_label(sample, "enable_prefix_caching"),
        sliding_window=ints["sliding_window"],
        simple_cpu_offload_num_blocks=ints["simple_cpu_offload_num_blocks"],
        labels={name: labels[name] for name in kept},
    )


#: What each numeric ``cache_config_info`` label can be in vLLM; another value is dropped
#: (absent, counted ``out_of_range``). A block holds at least one token; the counts vLLM
#: writes are never negative, nor past 2**53 (a block or byte count past the largest whole
#: number a float holds exactly is no GPU's); ``gpu_memory_utilization`` is a share of the GPU,
#: above 0 and at most 1 (vLLM refuses other values at start).
_CACHE_RANGES: Final[Mapping[str, Callable[[float], bool]]] = {
    "num_gpu_blocks": lambda v: 1 <= v <= MAX_EXACT_WHOLE,
    "block_size": lambda v: 1 <= v <= MAX_EXACT_WHOLE,
    "kv_cache_size_tokens": lambda v: 1 <= v <= MAX_EXACT_WHOLE,
    "kv_cache_memory_bytes": lambda v: 1 <= v <= MAX_EXACT_WHOLE,
    "sliding_window": lambda v: 1 <= v <= MAX_EXACT_WHOLE,
    "simple_cpu_offload_num_blocks": lambda v: 0 <= v <= MAX_EXACT_WHOLE,
    "kv_cache_max_concurrency": lambda v: 0 <= v <= MAX_EXACT_WHOLE,
    "gpu_memory_utilization": lambda v: 0 < v <= 1,
}
_CACHE_INTS: Final = (
    "num_gpu_blocks",
    "block_size",
    "kv_cache_size_tokens",
    "kv_cache_memory_bytes",
    "sliding_window",
    "simple_cpu_offload_num_blocks",
)
_CACHE_FLOATS: Final = ("kv_cache_max_concurrency", "gpu_memory_utilization")


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
    # Same rule as the text format's values: no "1_000", no non-ASCII digits, no control
    # characters around the number ("1\x0c", which float() would read as 1).
    if "_" in text or not text.isascii() or not text.isprintable():
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
    # isdigit() alone admits "²" and "٣", which int() refuses or reads as another rank.
    return (0, int(engine), "") if engine.isascii() and engine.isdigit() else (1, 0, engine)


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
