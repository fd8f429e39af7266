"""Specification of the collectors: metric families as pure functions of views, and the guard."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from structlog.testing import capture_logs

from exporter.core.derive import ContextEstimate, EngineDerived, TargetDerived
from exporter.core.reasons import SOURCE_REASONS, HttpReason, PredictionState, Source
from exporter.core.views import GpuMemoryView, PredictionView, SourceHealth, TargetView
from exporter.service.collector import (
    ExporterView,
    Families,
    GuardedCollector,
    exporter_families,
    target_families,
    target_rows,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from prometheus_client.core import Metric

Labels = frozenset[tuple[str, str]]


def samples(families: Iterable[Metric]) -> dict[tuple[str, Labels], float]:
    """Every sample of ``families``, keyed by sample name and label set."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in families
        for s in family.samples
    }


def value(families: Iterable[Metric], name: str, **labels: str) -> float | None:
    """The value of one sample, or None when it is absent."""
    return samples(families).get((name, frozenset(labels.items())))


def names(families: Iterable[Metric]) -> set[str]:
    """The family names built."""
    return {family.name for family in families}


def exposition(*builders: Callable[[], Iterable[Metric]]) -> str:
    """The text format of a private registry guarding ``builders`` (named b0, b1...)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GuardedCollector({f"b{i}": b for i, b in enumerate(builders)}))
    return generate_latest(registry).decode()


ENGINE = EngineDerived(
    engine="0",
    model_name="tiny",
    kv_capacity_tokens=1024.0,
    kv_usage_ratio=0.25,
    context=ContextEstimate(
        quantiles={0.5: 300.0, 0.95: 480.0, 0.99: 500.0},
        mean=320.0,
        window_requests=8.0,
        basis="window",
    ),
)
UP = SourceHealth(up=True, last_success_time=1_800_000_000.0, duration_seconds=0.05)


def test_engine_figures_carry_the_engine_and_model_name_labels() -> None:
    """Each engine's figures are samples labelled engine and model_name, one set per engine."""
    second = EngineDerived(engine="1", model_name="tiny", kv_capacity_tokens=2048.0)
    view = TargetView(target="t", derived=TargetDerived(engines=(ENGINE, second)))
    families = target_families(view)
    name = "headroom_kv_capacity_tokens"
    assert value(families, name, engine="0", model_name="tiny") == 1024.0
    assert value(families, name, engine="1", model_name="tiny") == 2048.0
    assert value(families, "headroom_context_length_p95_tokens", engine="0", model_name="tiny") == (
        480.0
    )


def test_unknown_figures_are_left_out_never_exported_as_nan() -> None:
    """None and NaN values give no sample; a family with no sample at all is not built."""
    engine = EngineDerived(
        engine="0", model_name="tiny", kv_capacity_tokens=1024.0, kv_usage_ratio=math.nan
    )
    view = TargetView(target="t", derived=TargetDerived(engines=(engine,)))
    families = target_families(view)
    built = names(families)
    assert "headroom_kv_capacity_tokens" in built
    assert "headroom_kv_usage_ratio" not in built  # NaN
    assert "headroom_kv_free_tokens" not in built  # None
    assert "headroom_context_length_p50_tokens" not in built  # no context estimate
    assert "NaN" not in exposition(lambda: families)


def test_a_view_without_derived_figures_has_no_engine_families() -> None:
    """Before the first successful poll there are no engine samples, only health and state."""
    families = target_families(TargetView(target="t"))
    assert not any(s.labels.get("engine") for f in families for s in f.samples)
    assert value(families, "headroom_target_up") == 0.0
    assert value(families, "headroom_prediction_state", state="waiting_for_target") == 1.0


def test_a_mapping_field_gives_one_sample_per_key_in_its_last_label() -> None:
    """requests_waiting_by_reason gives one sample per reason, with the engine labels first."""
    engine = EngineDerived(
        engine="0",
        model_name="tiny",
        requests_waiting_by_reason={"preempted": 2.0, "capacity": 5.0},
    )
    families = target_families(TargetView(target="t", derived=TargetDerived(engines=(engine,))))
    name = "headroom_requests_waiting_by_reason"
    by_reason = {s.labels["reason"]: s.value for f in families if f.name == name for s in f.samples}
    assert by_reason == {"capacity": 5.0, "preempted": 2.0}
    assert value(families, name, engine="0", model_name="tiny", reason="capacity") == 5.0


def test_admission_rejections_by_reason_are_a_sample_per_cap_beside_the_total() -> None:
    """The cap that refused is the reason label; the total stays one unlabelled sample."""
    derived = TargetDerived(
        engines=(ENGINE,),
        admission_rejections_per_second=0.75,
        admission_rejections_by_reason_per_second={
            "max_num_queued_reqs": 0.5,
            "max_num_queued_tokens": 0.25,
        },
    )
    families = target_families(TargetView(target="t", derived=derived))
    name = "headroom_admission_rejections_by_reason_per_second"
    assert value(families, name, reason="max_num_queued_reqs") == 0.5
    assert value(families, name, reason="max_num_queued_tokens") == 0.25
    assert value(families, "headroom_admission_rejections_per_second") == 0.75


def test_no_admission_rejections_by_reason_where_vllm_names_none() -> None:
    """Before vLLM 0.32 (or before two polls) neither the total nor a reason is exported."""
    families = target_families(TargetView(target="t", derived=TargetDerived(engines=(ENGINE,))))
    built = names(families)
    assert "headroom_admission_rejections_by_reason_per_second" not in built
    assert "headroom_admission_rejections_per_second" not in built
    assert "headroom_admission_rejections_by_reason_per_second" not in names(
        target_families(TargetView(target="t"))
    )


def test_source_error_counters_start_at_zero_for_every_reason_of_the_source() -> None:
    """Every reason of SOURCE_REASONS is exported from 0, and counted reasons add their count."""
    health = SourceHealth(up=False, errors={HttpReason.TIMEOUT: 3})
    view = TargetView(target="t", sources={Source.VLLM_METRICS: health})
    families = target_families(view)
    errors = {
        s.labels["reason"]: s.value
        for f in families
        for s in f.samples
        if s.name == "headroom_source_errors_total" and s.labels["source"] == "vllm_metrics"
    }
    assert set(errors) == set(SOURCE_REASONS[Source.VLLM_METRICS])
    assert errors["timeout"] == 3.0
    assert sum(errors.values()) == 3.0


def test_a_source_outside_the_reason_table_exports_only_its_counted_reasons() -> None:
    """A source name with no known reasons gets error samples for what was counted, nothing more."""
    health = SourceHealth(up=False, errors={"broken": 1})
    families = target_families(TargetView(target="t", sources={"other": health}))
    errors = samples(f for f in families if f.name == "headroom_source_errors")
    assert list(errors.values()) == [1.0]
    assert value(families, "headroom_source_errors_total", source="other", reason="broken") == 1.0


def test_source_health_is_labelled_by_source_and_a_missing_success_time_is_absent() -> None:
    """source_up and duration are per source; a source that never succeeded has no timestamp."""
    down = SourceHealth(up=False, duration_seconds=2.0)
    view = TargetView(target="t", sources={Source.VLLM_METRICS: UP, Source.NVML: down})
    families = target_families(view)
    assert value(families, "headroom_source_up", source="vllm_metrics") == 1.0
    assert value(families, "headroom_source_up", source="nvml") == 0.0
    assert value(families, "headroom_source_duration_seconds", source="nvml") == 2.0
    timestamp = "headroom_source_last_success_timestamp_seconds"
    assert value(families, timestamp, source="vllm_metrics") == 1_800_000_000.0
    assert value(families, timestamp, source="nvml") is None


@pytest.mark.parametrize(
    ("sources", "up"),
    [
        ({}, 0.0),
        ({Source.VLLM_METRICS: UP}, 1.0),
        ({Source.VLLM_METRICS: SourceHealth(up=False)}, 0.0),
        ({Source.NVML: UP}, 0.0),
    ],
    ids=["no-source", "metrics-up", "metrics-down", "only-nvml-up"],
)
def test_target_up_follows_the_vllm_metrics_source(
    sources: dict[str, SourceHealth], up: float
) -> None:
    """headroom_target_up is 1 exactly when the last read of vLLM's /metrics succeeded."""
    families = target_families(TargetView(target="t", sources=sources))
    assert value(families, "headroom_target_up") == up


@pytest.mark.parametrize("state", list(PredictionState))
def test_prediction_state_is_one_hot_over_every_state(state: PredictionState) -> None:
    """headroom_prediction_state has one sample per state: 1 for the current one, 0 for others."""
    families = target_families(TargetView(target="t", prediction=PredictionView(state=state)))
    flags = {
        s.labels["state"]: s.value
        for f in families
        if f.name == "headroom_prediction_state"
        for s in f.samples
    }
    assert flags == {s.value: 1.0 if s is state else 0.0 for s in PredictionState}


def test_sizing_info_appears_only_when_the_prediction_has_info_labels() -> None:
    """headroom_sizing_info is 1 with the info labels (missing ones empty), absent without info."""
    without = target_families(TargetView(target="t", prediction=PredictionView(state="ok")))
    assert "headroom_sizing" not in names(without)
    prediction = PredictionView(state="ok", info={"model": "tiny", "layers": "2", "extra": "x"})
    families = target_families(TargetView(target="t", prediction=prediction))
    (sample,) = (s for f in families if f.name == "headroom_sizing" for s in f.samples)
    assert sample.name == "headroom_sizing_info"
    assert sample.value == 1.0
    assert sample.labels["model"] == "tiny"
    assert sample.labels["layers"] == "2"
    assert sample.labels["kv_dtype"] == ""
    assert "extra" not in sample.labels


def test_gpu_figures_carry_the_gpu_index_and_uuid() -> None:
    """Each GPU's memory is labelled gpu and uuid; figures NVML cannot tell are absent."""
    gpu = GpuMemoryView(
        index="0",
        uuid="GPU-abc",
        name="H200",
        total_bytes=100.0,
        used_bytes=60.0,
        free_bytes=40.0,
        cuda_total_bytes=99.0,
        vllm_bytes=55.0,
    )
    families = target_families(TargetView(target="t", gpus=(gpu,)))
    assert value(families, "headroom_gpu_memory_used_bytes", gpu="0", uuid="GPU-abc") == 60.0
    assert value(families, "headroom_gpu_memory_vllm_bytes", gpu="0", uuid="GPU-abc") == 55.0
    assert "headroom_gpu_memory_foreign_bytes" not in names(families)


def test_exporter_families_report_build_info_and_only_the_known_figures() -> None:
    """A sidecar's view gives build info and the poll interval, and no probe figures."""
    families = exporter_families(
        ExporterView(version="1.2.3", mode="sidecar", poll_interval_seconds=5.0)
    )
    assert value(families, "headroom_build_info", version="1.2.3", mode="sidecar") == 1.0
    assert value(families, "headroom_poll_interval_seconds") == 5.0
    assert names(families) == {"headroom_build", "headroom_poll_interval_seconds"}


def test_exporter_families_count_probe_outcomes_targets_and_evictions() -> None:
    """A fleet's view gives one counter sample per outcome, the target count and the evictions."""
    view = ExporterView(
        version="1.2.3",
        mode="fleet",
        probe_requests={"ok": 4, "timeout": 0},
        probe_targets=2,
        probe_evictions=1,
        probe_response_refusals={"over_share": 3, "cut": 0},
    )
    families = exporter_families(view)
    assert value(families, "headroom_probe_requests_total", outcome="ok") == 4.0
    assert value(families, "headroom_probe_requests_total", outcome="timeout") == 0.0
    assert value(families, "headroom_probe_targets") == 2.0
    assert value(families, "headroom_probe_evictions_total") == 1.0
    refusals = "headroom_probe_response_budget_refusals_total"
    assert value(families, refusals, reason="over_share") == 3.0
    assert value(families, refusals, reason="cut") == 0.0
    assert value(families, "headroom_poll_interval_seconds") is None


def test_a_failing_builder_is_reported_not_raised() -> None:
    """A raising builder gives success 0 and is logged; the other builders' families come out."""

    def broken() -> list[Metric]:
        raise RuntimeError("boom")

    def healthy() -> list[Metric]:
        return exporter_families(ExporterView(version="1.2.3", mode="sidecar"))

    with capture_logs() as logs:
        text = exposition(broken, healthy)
    assert 'headroom_collector_success{collector="b0"} 0.0' in text
    assert 'headroom_collector_success{collector="b1"} 1.0' in text
    assert 'headroom_build_info{mode="sidecar",version="1.2.3"} 1.0' in text
    (event,) = logs
    assert event["event"] == "collector_failed"
    assert event["collector"] == "b0"
    assert event["log_level"] == "error"
    assert event["exc_info"] is True


def test_a_builder_failing_midway_contributes_none_of_its_families() -> None:
    """Families a builder yielded before it raised are dropped with it, not half exported."""

    def halfway() -> Iterable[Metric]:
        yield from exporter_families(ExporterView(version="1.2.3", mode="sidecar"))
        raise RuntimeError("boom")

    with capture_logs():
        text = exposition(halfway)
    assert "headroom_build_info" not in text
    assert 'headroom_collector_success{collector="b0"} 0.0' in text


def test_each_builder_s_duration_is_measured_on_the_injected_clock() -> None:
    """headroom_collector_duration_seconds is the clock's advance around each builder."""
    now = [10.0]

    def taking(seconds: float) -> Callable[[], list[Metric]]:
        def builder() -> list[Metric]:
            now[0] += seconds
            return []

        return builder

    collector = GuardedCollector({"fast": taking(0.25), "slow": taking(1.5)}, clock=lambda: now[0])
    families = list(collector.collect())
    duration = "headroom_collector_duration_seconds"
    assert value(families, duration, collector="fast") == 0.25
    assert value(families, duration, collector="slow") == 1.5


def test_describe_returns_nothing_so_registration_runs_no_builder() -> None:
    """describe() is empty: even a describing registry does not call the builders at register()."""
    calls: list[str] = []

    def builder() -> list[Metric]:
        calls.append("built")
        return []

    collector = GuardedCollector({"target": builder})
    assert collector.describe() == []
    CollectorRegistry(auto_describe=True).register(collector)
    assert calls == []


# --- The probe's OpenMetrics, written without client_python's objects -----------------------


def written_and_encoded(
    builders: Mapping[str, Callable[[], Iterable[Metric] | Families]],
) -> tuple[bytes | None, bytes]:
    """What the guard writes itself, and client_python's OpenMetrics encoder over it."""
    guarded = GuardedCollector(builders, clock=lambda: 0.25)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(guarded)
    return guarded.openmetrics(), openmetrics_latest(registry)  # type: ignore[no-untyped-call]


#: Label values and figures of every class the text needs care with: quotes, backslashes and
#: newlines, other scripts, values Go writes with an exponent, infinities, negatives, NaN.
ODD_ENGINE = replace(
    ENGINE,
    engine='1"\\\n²',
    model_name="/models/Ünïcode model\u2028name",
    kv_capacity_tokens=12_345_678.0,
    kv_capacity_predicted_tokens=math.inf,
    kv_capacity_error_ratio=-0.125,
    kv_usage_ratio=math.nan,
    kv_blocks=1e22,
    prompt_tokens_cached_ratio_by_source={"local_cache_hit": 0.5, 'odd"key': 1e-9},
)
FULL_VIEW = TargetView(
    target="t",
    derived=TargetDerived(engines=(ENGINE, ODD_ENGINE)),
    prediction=PredictionView(
        state="ok",
        bytes_per_token=131_072.0,
        weights_bytes=1.2e10,
        info={"model": 'a"b\\c\nd', "layers": "2"},
    ),
    gpus=(
        GpuMemoryView(
            index="0",
            uuid="GPU-abc",
            name="H200",
            total_bytes=1.5e11,
            used_bytes=6e10,
            free_bytes=9e10,
            cuda_total_bytes=1.49e11,
        ),
    ),
    sources={
        Source.VLLM_METRICS: UP,
        Source.NVML: SourceHealth(up=False, errors={HttpReason.TIMEOUT: 3}),
    },
)


@pytest.mark.parametrize(
    "view",
    [FULL_VIEW, TargetView(target="t"), TargetView(target="t", derived=TargetDerived(()))],
    ids=["every-row", "empty", "no-engines"],
)
def test_the_probe_s_openmetrics_are_client_python_s_bytes(view: TargetView) -> None:
    """Every row, info and mapping field, odd label value and figure: the encoder's bytes."""
    written, encoded = written_and_encoded({"target": lambda: target_rows(view)})
    assert written is not None
    assert written == encoded
    assert target_rows(view).metrics() == target_families(view)


def test_a_failing_builder_is_written_as_client_python_reports_it() -> None:
    """Its families are left out and its success is 0, in the same bytes as the encoder's."""

    def failing() -> Families:
        raise RuntimeError("boom")

    with capture_logs():
        written, encoded = written_and_encoded(
            {"target": lambda: target_rows(FULL_VIEW), "broken": failing}
        )
    assert written == encoded
    assert b'headroom_collector_success{collector="broken"} 0.0\n' in encoded


def test_the_guard_writes_nothing_itself_where_a_builder_gives_client_python_objects() -> None:
    """Objects are rendered by the registry's encoder: openmetrics() says so with None."""
    written, _ = written_and_encoded(
        {"target": lambda: target_rows(FULL_VIEW), "objects": lambda: target_families(FULL_VIEW)}
    )
    assert written is None


def test_with_no_builder_the_guard_writes_its_own_families_empty() -> None:
    """Even then, the bytes client_python writes for two empty families."""
    written, encoded = written_and_encoded({})
    assert written == encoded
    assert written is not None
    assert written.count(b"# TYPE") == 2
