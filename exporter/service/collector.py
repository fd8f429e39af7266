"""Prometheus collectors: fresh metric families from the current views on every scrape.

``target_families`` and ``exporter_families`` are pure functions from plain views to metric
families (the kube-state-metrics pattern), filled from the metric table
(:mod:`exporter.service.metricdefs`): each definition names the row object and the field its
value comes from, and labels are read by name, so no family is listed twice.

:class:`GuardedCollector` runs named family builders for a registry and never raises: a builder
that fails is logged and reported as
``headroom_collector_success{collector} 0`` instead of failing the whole exposition (one
raising collector makes ``generate_latest`` fail for everything).
"""

from __future__ import annotations

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

from exporter.core.reasons import SOURCE_REASONS
from exporter.service.metricdefs import ROWS, Kind, MetricDef, Row, metric

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from exporter.core.derive import EngineDerived
    from exporter.core.views import GpuMemoryView, SourceHealth, TargetView

log = structlog.get_logger(__name__)


def _new_family(d: MetricDef) -> Metric:
    if d.kind is Kind.COUNTER:
        return CounterMetricFamily(d.name, d.help, labels=d.labels)
    if d.kind is Kind.INFO:
        return InfoMetricFamily(d.name.removesuffix("_info"), d.help, labels=())
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


def _is_number(value: object) -> bool:
    # Absent figures are left out, never exported as NaN.
    return isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value))


class _Families:
    """The families of one scrape, filled from the metric table row by row."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

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
                    self._info(d, value)
                continue
            if isinstance(value, Mapping):
                for key in sorted(value):
                    self._add(d, value[key], [*(given[n] for n in d.labels[:-1]), str(key)])
            else:
                self._add(d, value, [given[n] for n in d.labels])

    def _family(self, d: MetricDef) -> Metric:
        found = self._families.get(d.name)
        if found is None:
            found = self._families[d.name] = _new_family(d)
        return found

    def _add(self, d: MetricDef, value: object, labels: list[str]) -> None:
        if not _is_number(value):
            return
        family = self._family(d)
        if not isinstance(family, GaugeMetricFamily | CounterMetricFamily):
            msg = f"{d.name} is not a gauge or counter"
            raise TypeError(msg)
        family.add_metric(labels, float(value))  # type: ignore[arg-type]

    def _info(self, d: MetricDef, values: Mapping[str, str]) -> None:
        family = self._family(d)
        if not isinstance(family, InfoMetricFamily):
            msg = f"{d.name} is not an info metric"
            raise TypeError(msg)
        family.add_metric([], {k: values.get(k, "") for k in d.labels})

    def families(self) -> list[Metric]:
        return [f for f in self._families.values() if f.samples]


def _engine_labels(engine: EngineDerived) -> dict[str, str]:
    return {"engine": engine.engine, "model_name": engine.model_name}


def _gpu_labels(gpu: GpuMemoryView) -> dict[str, str]:
    return {"gpu": gpu.index, "uuid": gpu.uuid}


def _with_every_reason(source: str, health: SourceHealth) -> SourceHealth:
    """Error counts with every reason of the source from 0 (``rate()`` sees the first one)."""
    errors = {**dict.fromkeys(SOURCE_REASONS.get(source, ()), 0), **health.errors}
    return replace(health, errors=errors)


def target_families(view: TargetView) -> list[Metric]:
    """The per-target metric families of one target's view (pure)."""
    out = _Families()
    if view.derived is not None:
        for engine in view.derived.engines:
            out.fill(Row.ENGINE, engine, _engine_labels(engine))
    out.fill(Row.PREDICTION, view.prediction)
    for gpu in view.gpus:
        out.fill(Row.GPU, gpu, _gpu_labels(gpu))
    for source, health in sorted(view.sources.items()):
        out.fill(Row.SOURCE, _with_every_reason(source, health), {"source": source})
    out.fill(Row.TARGET, view)
    return out.families()


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
    out = _Families()
    out.fill(Row.EXPORTER, view)
    return out.families()


class GuardedCollector:
    """A registry collector running named family builders; it never raises on scrape.

    Each builder's success and duration are exported as ``headroom_collector_success`` and
    ``headroom_collector_duration_seconds``. A failing builder's families are left out of that
    scrape, and the failure is logged with the builder's name.
    """

    def __init__(
        self,
        builders: Mapping[str, Callable[[], Iterable[Metric]]],
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._builders = dict(builders)
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        """Build every family now; called by the registry on each scrape."""
        success = GaugeMetricFamily(
            "headroom_collector_success",
            metric("headroom_collector_success").help,
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "headroom_collector_duration_seconds",
            metric("headroom_collector_duration_seconds").help,
            labels=["collector"],
        )
        built: list[Metric] = []
        for name, builder in self._builders.items():
            started = self._clock()
            try:
                families = list(builder())
            except Exception:  # a scrape must never fail: log, report and go on
                log.exception("collector_failed", collector=name)
                success.add_metric([name], 0.0)
            else:
                built.extend(families)
                success.add_metric([name], 1.0)
            duration.add_metric([name], self._clock() - started)
        yield from built
        yield success
        yield duration

    def describe(self) -> list[Metric]:
        """Nothing: describing would run the builders at registration time."""
        return []
