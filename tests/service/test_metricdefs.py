"""Specification of our metric names: naming rules, docs, and the real exposition.

The exporter is run for real (sidecar mode against a vLLM-like server serving the real 0.32
capture, with a recorded GPU and the tiny model's config; and fleet mode with probes), and
its exposition must contain exactly the families of ``exporter.service.metricdefs`` with their
labels.
The expositions are kept in ``tests/golden/exposition/`` (regenerate with
``HEADROOM_UPDATE_GOLDEN=1``): alert, dashboard and chart tests prove their metric names
against these files, which this test proves equal to what the exporter really serves.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.reasons import VisibilityState
from exporter.gpu.recording import RecordedGpuReader
from exporter.gpu.source import NvmlGpuSource
from exporter.gpu.visibility import GpuVisibility
from exporter.service.app import Components
from exporter.service.metricdefs import METRICS, Kind, Scope, render_markdown
from exporter.testing.processes import ExporterThread
from tests import paths

if TYPE_CHECKING:
    from exporter.testing.fakevllm import FakeVllm

ROOT = paths.REPO
GOLDEN = paths.GOLDEN / "exposition"
NVML = paths.NVML
TINY = paths.CONFIGS / "tiny-llama"
NAME = re.compile(r"^headroom_[a-z0-9_]+$")
UNITS = ("_bytes", "_seconds", "_ratio", "_tokens", "_sequences", "_total", "_info")
#: Names without a base unit, each for a reason: counts of things and states.
UNITLESS = {
    "headroom_kv_blocks",
    "headroom_context_window_requests",
    "headroom_preemptions_per_finished_request",
    "headroom_requests_running",
    "headroom_requests_waiting",
    "headroom_requests_waiting_by_reason",
    "headroom_requests_kv_fetch_by_stage",
    "headroom_kv_offload_blocks",
    "headroom_prediction_state",
    "headroom_target_up",
    "headroom_source_up",
    "headroom_collector_success",
    "headroom_probe_targets",
    "headroom_window_samples",
    "headroom_dropped_samples",
    # Counts of sequences and requests, named as vLLM names them.
    "headroom_max_num_seqs",
    "headroom_sequences_running",
    "headroom_p95_available_requests",
    # Ratios of counts: sequences per request, tokens per sequence.
    "headroom_sequences_per_request",
    "headroom_kv_tokens_per_running_sequence",
    # One-hot states.
    "headroom_p95_ceiling_limited_by",
    "headroom_p95_available_limited_by",
    "headroom_engine_asleep",
}


def test_names_follow_the_prometheus_rules() -> None:
    """One prefix, no colons, base-unit suffixes, _total only on counters, _info on info."""
    for name, d in METRICS.items():
        assert NAME.match(name), name
        assert name.endswith("_total") == (d.kind is Kind.COUNTER), name
        assert name.endswith("_info") == (d.kind is Kind.INFO), name
        rate = name.endswith(("_per_second", "_per_token"))  # a unit per a unit
        assert name.endswith(UNITS) or name in UNITLESS or rate, name
        assert d.help.endswith("."), name
        assert "percent" not in name


def test_docs_metrics_md_is_generated_from_the_definitions() -> None:
    """docs/metrics.md equals what `make docs` generates (run it after changing a metric)."""
    assert (ROOT / "docs" / "metrics.md").read_text() == render_markdown()


def _families(text: str) -> dict[str, set[str]]:
    """Exposed family -> label names (the text parser calls info families by their full name)."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = out.setdefault(name, set())
        for sample in family.samples:
            labels.update(sample.labels)
    return out


def _check_against_definitions(text: str, scopes: set[Scope], mode: str) -> None:
    exposed = {n: labels for n, labels in _families(text).items() if n.startswith("headroom_")}
    expected = {n for n, d in METRICS.items() if d.scope in scopes}
    if mode == "sidecar":
        expected -= {n for n in expected if n.startswith("headroom_probe_")}
    else:
        expected -= {"headroom_poll_interval_seconds"}
    assert set(exposed) == expected
    for name, labels in exposed.items():
        assert labels == set(METRICS[name].labels), name


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("HEADROOM_UPDATE_GOLDEN") == "1" or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert _families(path.read_text()) == _families(text), (
        f"{path} is stale: regenerate with HEADROOM_UPDATE_GOLDEN=1"
    )


def _recorded_gpus(_settings: object) -> NvmlGpuSource:
    """The recorded H100 with vLLM's EngineCore (PID 45) holding 72 GiB."""
    visibility = GpuVisibility(VisibilityState.ALL_GPUS, (), frozenset({45}))
    reader = RecordedGpuReader.from_file(NVML / "h100-vllm-72gib.json", loop=True)
    return NvmlGpuSource(reader, allow_all=True, discover=lambda **_: visibility)


def test_the_sidecar_exposes_exactly_the_defined_metrics(busy_vllm: FakeVllm) -> None:
    """Sidecar mode with every source up exposes every target and exporter metric, no other."""
    running = ExporterThread(
        {
            "target": busy_vllm.url,
            "poll_interval_seconds": 0.2,
            "poll_timeout_seconds": 0.2,
            "model": str(TINY),
            "gpu_discovery": "all",
        },
        components=Components(gpu_source=_recorded_gpus),
    )
    try:
        running.wait_ready()
        # Rates need two polls: waited for, since a busy machine may take longer than any sleep.
        running.wait_for(lambda s: bool(s.series("headroom_preemptions_per_second")))
        text = httpx.get(f"{running.url}/metrics").text
    finally:
        running.stop()
    _check_against_definitions(text, {Scope.TARGET, Scope.EXPORTER}, "sidecar")
    _golden("sidecar.prom", text)


def test_fleet_mode_exposes_probe_metrics_and_target_metrics_on_probe(
    busy_vllm: FakeVllm,
) -> None:
    """In fleet mode /metrics has the exporter's own metrics and /probe the target's."""
    running = ExporterThread(
        {"mode": "fleet", "probe_allowlist": "127.0.0.0/8", "model": str(TINY)}
    )
    try:
        for _ in range(2):
            probe = httpx.get(f"{running.url}/probe", params={"target": busy_vllm.url})
        own = httpx.get(f"{running.url}/metrics").text
    finally:
        running.stop()
    assert probe.status_code == 200
    # httpx asks for gzip: the golden below is the compressed answer, decoded.
    assert probe.headers["content-encoding"] == "gzip"
    _check_against_definitions(own, {Scope.EXPORTER}, "fleet")
    target = {n for n in _families(probe.text) if n.startswith("headroom_")}
    expected = {n for n, d in METRICS.items() if d.scope is Scope.TARGET}
    # No NVML in fleet mode: only the GPU metrics are absent from a probe.
    assert expected - target == {n for n in expected if n.startswith("headroom_gpu_")}
    _golden("fleet-metrics.prom", own)
    _golden("fleet-probe.prom", probe.text)


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_metric_is_documented_with_a_source(name: str) -> None:
    """HELP says what the number is, and the docs say where it comes from."""
    assert METRICS[name].source, name


def test_every_field_in_the_table_exists_on_its_row_type() -> None:
    """A value is read from its row by the attribute the table names: a typo fails here."""
    from exporter.core.derive import EngineDerived
    from exporter.core.views import GpuMemoryView, PredictionView, SourceHealth, TargetView
    from exporter.service.collector import ExporterView
    from exporter.service.metricdefs import ROWS, Row

    types: dict[Row, type] = {
        Row.ENGINE: EngineDerived,
        Row.PREDICTION: PredictionView,
        Row.GPU: GpuMemoryView,
        Row.SOURCE: SourceHealth,
        Row.TARGET: TargetView,
        Row.EXPORTER: ExporterView,
    }
    for row, defs in ROWS.items():
        for d in defs:
            assert d.field is not None
            assert hasattr(types[row], d.field), f"{d.name}: {types[row].__name__}.{d.field}"
    collected = {d.name for defs in ROWS.values() for d in defs}
    written_by_the_guard = {"headroom_collector_success", "headroom_collector_duration_seconds"}
    assert collected | written_by_the_guard == set(METRICS)
