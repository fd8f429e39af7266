"""Prometheus collectors: fresh metric families from the current views on every scrape.

``target_families`` and ``exporter_families`` are pure functions from plain views to metric
families (the kube-state-metrics pattern), filled from the metric table
(:mod:`exporter.service.metricdefs`): each definition names the row object and the field its
value comes from, and labels are read by name, so no family is listed twice. ``target_rows``
gives the same as :class:`Families`, plain values that ``/probe`` writes as OpenMetrics text
without building client_python's objects first (the same bytes).

:class:`GuardedCollector` runs named family builders for a registry and never raises: a builder
that fails is logged and reported as
``headroom_collector_success{collector} 0`` instead of failing the whole exposition (one
raising collector makes ``generate_latest`` fail for everything).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import structlog
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from exporter.core.reasons import SOURCE_REASONS
from exporter.service import openmetrics
from exporter.service.metricdefs import ROWS, Kind, MetricDef, Row, metric

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from exporter.core.derive import EngineDerived
    from exporter.core.views import GpuMemoryView, SourceHealth, TargetView

log = structlog.get_logger(__name__)


def _new_family(d: MetricDef) -> Metric:
    if d.kind is Kind.COUNTER:
        return CounterMetricFamily(d.name, d.help, labels=d.labels)
    if d.kind is Kind.INFO:
        return InfoMetricFamily(d.name.removesuffix("_info"), d.help, labels=())
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


def _family_of(
    d: MetricDef, samples: Iterable[tuple[Sequence[str], float]], info: Mapping[str, str] | None
) -> Metric:
    """client_python's family of ``d`` with these samples (an info metric: its label set)."""
    family = _new_family(d)
    if isinstance(family, InfoMetricFamily):
        if info is not None:
            family.add_metric([], dict(info))
        return family
    if not isinstance(family, GaugeMetricFamily | CounterMetricFamily):
        msg = f"{d.name} is not a gauge, counter or info metric"
        raise TypeError(msg)
    for labels, value in samples:
        family.add_metric(labels, value)
    return family


def _is_number(value: object) -> bool:
    # Absent figures are left out, never exported as NaN.
    return isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True, slots=True)
class _Shape:
    """How one definition's samples are written: what client_python's families make of it."""

    #: The ``# HELP``/``# TYPE`` lines, as client_python's OpenMetrics encoder writes them.
    header: str
    #: The samples' name (``_total`` for a counter, ``_info`` for an info metric), escaped.
    sample_name: str
    #: The labels' positions in name order, each with its escaped name.
    labels: tuple[tuple[int, str], ...]


@functools.cache
def _shape(d: MetricDef) -> _Shape:
    """Read off a family client_python builds for ``d`` (the table is fixed: one each)."""
    family = _family_of(d, [([""] * len(d.labels), 0.0)], {})
    (header,) = openmetrics.headers([family])
    order = sorted(range(len(d.labels)), key=lambda i: d.labels[i])
    return _Shape(
        header=header,
        sample_name=openmetrics.sample_name(family.samples[0].name),
        labels=tuple((i, openmetrics.label_name(d.labels[i])) for i in order),
    )


class Families:
    """The families of one scrape, filled from the metric table row by row.

    Kept as plain values (label values and a float per sample): :meth:`metrics` makes
    client_python's families of them, :meth:`openmetrics` writes their OpenMetrics text
    directly, the same bytes as client_python's encoder over :meth:`metrics` (half of a probe's
    exposition CPU went to building and walking those objects; benchmarks/README.md).
    """

    def __init__(self, always: Iterable[MetricDef] = ()) -> None:
        """``always``: families listed first, and even with no sample."""
        #: By name, in the order first filled: the definition and its samples.
        self._families: dict[str, tuple[MetricDef, list[tuple[Sequence[str], float]]]] = {}
        #: Info metrics' label sets, by name (one sample each).
        self._infos: dict[str, dict[str, str]] = {}
        self._always = frozenset(d.name for d in always)
        for d in always:
            self._family(d)

    def fill(self, row: Row, source: object, labels: Mapping[str, str] | None = None) -> None:
        """Add the samples of every metric read from ``row`` for one row object.

        ``labels`` gives the row's label values by label name. A field holding a mapping adds
        one sample per key (sorted), the key being the value of the metric's last label; an
        info metric's mapping is its labels.
        """
        given = labels or {}
        for d in ROWS[row]:
            value = getattr(source, d.field or "")
            if d.kind is Kind.INFO:
                if value:
                    self._family(d)
                    self._infos[d.name] = {k: value.get(k, "") for k in d.labels}
                continue
            if isinstance(value, Mapping):
                for key in sorted(value):
                    self.add(d, [*(given[n] for n in d.labels[:-1]), str(key)], value[key])
            else:
                self.add(d, [given[n] for n in d.labels], value)

    def add(self, d: MetricDef, labels: Sequence[str], value: object) -> None:
        """One gauge or counter sample, its label values in ``d.labels``' order; NaN left out."""
        if d.kind is Kind.INFO:
            msg = f"{d.name} is not a gauge or counter"
            raise TypeError(msg)
        if _is_number(value):
            self._family(d).append((labels, float(value)))  # type: ignore[arg-type]

    def _family(self, d: MetricDef) -> list[tuple[Sequence[str], float]]:
        found = self._families.get(d.name)
        if found is None:
            found = self._families[d.name] = (d, [])
        return found[1]

    def _filled(self) -> Iterator[tuple[MetricDef, list[tuple[Sequence[str], float]]]]:
        for d, samples in self._families.values():
            if samples or d.name in self._infos or d.name in self._always:
                yield d, samples

    def metrics(self) -> list[Metric]:
        """client_python's families of the samples (families with none left out)."""
        return [_family_of(d, samples, self._infos.get(d.name)) for d, samples in self._filled()]

    def openmetrics(self, append: Callable[[str], object]) -> None:
        """Write the families' OpenMetrics lines (no ``# EOF``) with ``append``."""
        text = openmetrics.text
        number: Callable[[float], str] = floatToGoString
        for d, samples in self._filled():
            shape = _shape(d)
            append(shape.header)
            if d.kind is Kind.INFO:
                labelled = openmetrics.label_set(self._infos[d.name])
                append(f"{shape.sample_name}{labelled} 1.0\n")
                continue
            if not shape.labels:
                for _, value in samples:
                    append(f"{shape.sample_name} {number(value)}\n")
                continue
            for labels, value in samples:
                pairs = ",".join(f'{name}="{text(labels[i])}"' for i, name in shape.labels)
                append(f"{shape.sample_name}{{{pairs}}} {number(value)}\n")


def _engine_labels(engine: EngineDerived) -> dict[str, str]:
    return {"engine": engine.engine, "model_name": engine.model_name}


def _gpu_labels(gpu: GpuMemoryView) -> dict[str, str]:
    return {"gpu": gpu.index, "uuid": gpu.uuid}


def _with_every_reason(source: str, health: SourceHealth) -> SourceHealth:
    """Error counts with every reason of the source from 0 (``rate()`` sees the first one)."""
    errors = {**dict.fromkeys(SOURCE_REASONS.get(source, ()), 0), **health.errors}
    return replace(health, errors=errors)


def target_rows(view: TargetView) -> Families:
    """The per-target families of one target's view (pure)."""
    out = Families()
    if view.derived is not None:
        for engine in view.derived.engines:
            out.fill(Row.ENGINE, engine, _engine_labels(engine))
    out.fill(Row.PREDICTION, view.prediction)
    for gpu in view.gpus:
        out.fill(Row.GPU, gpu, _gpu_labels(gpu))
    for source, health in sorted(view.sources.items()):
        out.fill(Row.SOURCE, _with_every_reason(source, health), {"source": source})
    out.fill(Row.TARGET, view)
    return out


def target_families(view: TargetView) -> list[Metric]:
    """The per-target metric families of one target's view (pure)."""
    return target_rows(view).metrics()


@dataclass(frozen=True, slots=True)
class ExporterView:
    """The exporter's own state, for the exporter-scope families."""

    version: str
    mode: str
    poll_interval_seconds: float | None = None
    #: ``/probe`` outcomes since start (fleet mode).
    probe_requests: Mapping[str, int] = field(default_factory=dict)
    probe_targets: int | None = None
    probe_evictions: int | None = None
    #: /metrics answers the shared budget stopped, by reason (fleet mode).
    probe_response_refusals: Mapping[str, int] = field(default_factory=dict)

    @property
    def build_info(self) -> dict[str, str]:
        """The labels of ``headroom_build_info``."""
        return {"version": self.version, "mode": self.mode}


def exporter_families(view: ExporterView) -> list[Metric]:
    """The exporter's own metric families (pure)."""
    out = Families()
    out.fill(Row.EXPORTER, view)
    return out.metrics()


class GuardedCollector:
    """A registry collector running named family builders; it never raises on scrape.

    Each builder's success and duration are exported as ``headroom_collector_success`` and
    ``headroom_collector_duration_seconds``. A failing builder's families are left out of that
    scrape, and the failure is logged with the builder's name. A builder returns
    client_python's families or :class:`Families`; where all return the latter,
    :meth:`openmetrics` writes the exposition without client_python's objects.
    """

    def __init__(
        self,
        builders: Mapping[str, Callable[[], Iterable[Metric] | Families]],
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._builders = dict(builders)
        self._clock = clock

    def _build(self) -> tuple[list[Iterable[Metric] | Families], Families]:
        """Every builder's families, and the guard's own (its success and duration)."""
        success = metric("headroom_collector_success")
        duration = metric("headroom_collector_duration_seconds")
        guard = Families(always=(success, duration))  # in this order, whatever the adds' order
        built: list[Iterable[Metric] | Families] = []
        for name, builder in self._builders.items():
            started = self._clock()
            try:
                families = builder()
                built.append(families if isinstance(families, Families) else list(families))
            except Exception:  # a scrape must never fail: log, report and go on
                log.exception("collector_failed", collector=name)
                guard.add(success, [name], 0.0)
            else:
                guard.add(success, [name], 1.0)
            guard.add(duration, [name], self._clock() - started)
        return built, guard

    def collect(self) -> Iterator[Metric]:
        """Build every family now; called by the registry on each scrape."""
        built, guard = self._build()
        for families in built:
            yield from families.metrics() if isinstance(families, Families) else families
        yield from guard.metrics()

    def openmetrics(self) -> bytes | None:
        """The OpenMetrics exposition (underscore escaping), or None if a builder gave objects.

        The bytes of client_python's encoder over :meth:`collect`
        (tests/service/test_collector.py compares them).
        """
        built, guard = self._build()
        if not all(isinstance(families, Families) for families in built):
            return None
        out: list[str] = []
        for families in (*built, guard):
            families.openmetrics(out.append)  # type: ignore[union-attr]
        out.append("# EOF\n")
        return "".join(out).encode("utf-8")

    def describe(self) -> list[Metric]:
        """Nothing: describing would run the builders at registration time."""
        return []
