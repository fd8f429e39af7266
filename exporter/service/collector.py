"""Prometheus collectors: fresh metric families from the current views on every scrape.

``target_families`` and ``exporter_families`` are pure functions from plain views to metric
families (the kube-state-metrics pattern). :class:`GuardedCollector` runs named family builders
for a registry and never raises: a builder that fails is logged and reported as
``headroom_collector_success{collector} 0`` instead of failing the whole exposition (one
raising collector makes ``generate_latest`` fail for everything).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from exporter.core.derive import CONTEXT_QUANTILES
from exporter.core.reasons import SOURCE_REASONS, PredictionState
from exporter.service.metricdefs import Kind, MetricDef, metric

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from exporter.core.derive import EngineDerived
    from exporter.core.views import TargetView

log = structlog.get_logger(__name__)


class _Families:
    """Collects samples per metric definition, then builds the families in definition order."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def family(self, name: str) -> Metric:
        found = self._families.get(name)
        if found is not None:
            return found
        d = metric(name)
        built = _new_family(d)
        self._families[name] = built
        return built

    def add(self, name: str, value: float | None, labels: Sequence[str] = ()) -> None:
        """Add a sample; ``None`` and NaN values are left out (absent, never NaN)."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        family = self.family(name)
        if not isinstance(family, GaugeMetricFamily | CounterMetricFamily):
            msg = f"{name} is not a gauge or counter"
            raise TypeError(msg)
        family.add_metric(list(labels), float(value))

    def add_info(self, name: str, labels: Mapping[str, str]) -> None:
        family = self.family(name)
        if not isinstance(family, InfoMetricFamily):
            msg = f"{name} is not an info metric"
            raise TypeError(msg)
        d = metric(name)
        family.add_metric([], {k: labels.get(k, "") for k in d.labels})

    def families(self) -> list[Metric]:
        return [f for f in self._families.values() if f.samples]


def _new_family(d: MetricDef) -> Metric:
    if d.kind is Kind.COUNTER:
        return CounterMetricFamily(d.name, d.help, labels=d.labels)
    if d.kind is Kind.INFO:
        return InfoMetricFamily(d.name.removesuffix("_info"), d.help, labels=())
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


def _engine_samples(out: _Families, e: EngineDerived) -> None:
    labels = (e.engine, e.model_name)
    out.add("headroom_kv_capacity_tokens", e.kv_capacity_tokens, labels)
    out.add("headroom_kv_capacity_predicted_tokens", e.kv_capacity_predicted_tokens, labels)
    out.add("headroom_kv_capacity_prediction_error_ratio", e.kv_capacity_error_ratio, labels)
    out.add("headroom_kv_blocks", e.kv_blocks, labels)
    out.add("headroom_kv_block_size_tokens", e.kv_block_size_tokens, labels)
    out.add("headroom_kv_usable_tokens", e.kv_usable_tokens, labels)
    out.add("headroom_kv_used_tokens", e.kv_used_tokens, labels)
    out.add("headroom_kv_free_tokens", e.kv_free_tokens, labels)
    out.add("headroom_kv_usage_ratio", e.kv_usage_ratio, labels)
    if e.context is not None:
        names = {
            0.5: "headroom_context_length_p50_tokens",
            0.95: "headroom_context_length_p95_tokens",
            0.99: "headroom_context_length_p99_tokens",
        }
        for q in CONTEXT_QUANTILES:
            out.add(names[q], e.context.quantiles.get(q), labels)
        out.add("headroom_context_length_mean_tokens", e.context.mean, labels)
        out.add("headroom_context_window_requests", e.context.window_requests, labels)
    out.add("headroom_p95_ceiling_sequences", e.p95_ceiling_sequences, labels)
    out.add("headroom_mean_ceiling_sequences", e.mean_ceiling_sequences, labels)
    out.add("headroom_p95_available_sequences", e.p95_available_sequences, labels)
    out.add("headroom_p95_available_ratio", e.p95_available_ratio, labels)
    out.add("headroom_preemptions_per_second", e.preemptions_per_second, labels)
    out.add("headroom_preemptions_per_finished_request", e.preemptions_per_finished_request, labels)
    out.add("headroom_finished_requests_per_second", e.finished_requests_per_second, labels)
    out.add("headroom_requests_running", e.requests_running, labels)
    out.add("headroom_requests_waiting", e.requests_waiting, labels)
    for reason, count in sorted(e.requests_waiting_by_reason.items()):
        out.add("headroom_requests_waiting_by_reason", count, (*labels, reason))


def target_families(view: TargetView) -> list[Metric]:
    """The per-target metric families of one target's view (pure)."""
    out = _Families()
    if view.derived is not None:
        for engine in view.derived.engines:
            _engine_samples(out, engine)

    p = view.prediction
    out.add("headroom_kv_bytes_per_token", p.bytes_per_token)
    out.add("headroom_predicted_weights_bytes", p.weights_bytes)
    out.add("headroom_predicted_overhead_bytes", p.overhead_bytes)
    out.add("headroom_predicted_kv_budget_bytes", p.kv_budget_bytes)
    if p.info:
        out.add_info("headroom_sizing_info", p.info)
    for state in PredictionState:
        out.add("headroom_prediction_state", 1.0 if state == p.state else 0.0, (state,))

    for gpu in view.gpus:
        labels = (gpu.index, gpu.uuid)
        out.add("headroom_gpu_memory_total_bytes", gpu.total_bytes, labels)
        out.add("headroom_gpu_memory_used_bytes", gpu.used_bytes, labels)
        out.add("headroom_gpu_memory_free_bytes", gpu.free_bytes, labels)
        out.add("headroom_gpu_memory_vllm_bytes", gpu.vllm_bytes, labels)
        out.add("headroom_gpu_memory_foreign_bytes", gpu.foreign_bytes, labels)
        out.add("headroom_gpu_memory_vllm_predicted_bytes", gpu.vllm_predicted_bytes, labels)
        out.add("headroom_gpu_memory_unexplained_bytes", gpu.unexplained_bytes, labels)

    metrics_health = view.sources.get("vllm_metrics")
    out.add("headroom_target_up", 1.0 if metrics_health and metrics_health.up else 0.0)
    for source, health in sorted(view.sources.items()):
        out.add("headroom_source_up", 1.0 if health.up else 0.0, (source,))
        out.add(
            "headroom_source_last_success_timestamp_seconds", health.last_success_time, (source,)
        )
        out.add("headroom_source_duration_seconds", health.duration_seconds, (source,))
        reasons = set(SOURCE_REASONS.get(source, ())) | set(health.errors)
        for reason in sorted(reasons):
            count = health.errors.get(reason, 0)
            out.add("headroom_source_errors_total", count, (source, reason))
    out.add("headroom_target_restarts_total", view.restarts_total)
    out.add("headroom_window_samples", view.window_samples)
    out.add("headroom_dropped_samples", view.dropped_samples)
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


def exporter_families(view: ExporterView) -> list[Metric]:
    """The exporter's own metric families (pure)."""
    out = _Families()
    out.add_info("headroom_build_info", {"version": view.version, "mode": view.mode})
    out.add("headroom_poll_interval_seconds", view.poll_interval_seconds)
    for outcome, count in sorted(view.probe_requests.items()):
        out.add("headroom_probe_requests_total", count, (outcome,))
    out.add("headroom_probe_targets", view.probe_targets)
    out.add("headroom_probe_evictions_total", view.probe_evictions)
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
