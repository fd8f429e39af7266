"""Specification of the probe's OpenMetrics rendering: client_python's bytes, in one pass."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as client_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar, Sample

from exporter.service import openmetrics
from tests import paths

if TYPE_CHECKING:
    from collections.abc import Iterable

#: Prometheus 2.42's scrape Accept header.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def _registry(families: Iterable[Metric]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


def _client(registry: CollectorRegistry) -> bytes:
    return client_openmetrics.generate_latest(registry)  # type: ignore[no-any-return,no-untyped-call]


def test_the_golden_probe_exposition_renders_to_client_python_s_bytes() -> None:
    """Every family a probe answers (the golden file, read back) renders as client_python does."""
    text = (paths.GOLDEN / "exposition" / "fleet-probe.prom").read_text()
    registry = _registry(text_string_to_metric_families(text))
    rendered = openmetrics.render(registry)
    assert rendered is not None
    assert rendered.count(b"\n") > 100
    assert rendered == _client(registry)


def test_odd_names_labels_values_and_help_render_to_client_python_s_bytes() -> None:
    """Escaped names (colons, leading digits, non-ASCII), quoted values, units and timestamps."""
    gauge = GaugeMetricFamily(
        "a:b_ratio", 'Help with "quotes", a \\ and a\nnewline, é.', labels=["b", "a"]
    )
    gauge.add_metric(['va"l\\ue\n', "é"], 0.5, timestamp=12.5)
    gauge.add_metric(["x", "y"], float("nan"))
    gauge.add_metric(["x", "z"], float("-inf"))
    odd = Metric("9ödd.name", "", "gauge")
    odd.add_sample("9ödd.name", {"__reserved": "1", "ok_label": "2", "ünï": "3"}, 1e21)
    counter = CounterMetricFamily("requests", "Requests.", labels=["code"], unit="requests")
    counter.add_metric(["200"], 7)
    histogram = HistogramMetricFamily("latency_seconds", "Latency.", unit="seconds")
    histogram.add_metric([], [("0.1", 1.0), ("+Inf", 3.0)], sum_value=0.7)
    info = InfoMetricFamily("build", "Build.", value={"version": "1.2"})
    registry = _registry([gauge, odd, counter, histogram, info, GaugeMetricFamily("empty", "")])
    assert openmetrics.render(registry) == _client(registry)


def test_an_exemplar_is_left_to_client_python() -> None:
    """A sample with an exemplar is not rendered here (the caller uses client_python's)."""
    counter = CounterMetricFamily("hits", "Hits.")
    counter.samples.append(Sample("hits_total", {}, 1.0, None, Exemplar({"id": "a"}, 1.0)))
    assert openmetrics.render(_registry([counter])) is None


@pytest.mark.parametrize(
    ("accept", "fast"),
    [
        (PROMETHEUS_ACCEPT, True),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text;version=1.0.0;escaping=dots", False),
        ("text/plain;version=0.0.4", False),
        ("", False),
    ],
)
def test_only_openmetrics_with_underscore_escaping_is_rendered_here(
    accept: str, *, fast: bool
) -> None:
    """What Prometheus asks for is rendered here; other formats and escapings by client_python."""
    encoder, _ = choose_encoder(accept)
    assert openmetrics.is_fast(encoder) is fast
    assert not openmetrics.is_fast(partial(client_openmetrics.generate_latest, escaping="dots"))
