"""vLLM misbehaving over HTTP: the sidecar keeps serving, says why, recovers, leaks nothing.

One exporter process polls one fake vLLM for the whole module; each test switches the fake to a
fault, waits until the exporter reports it, ends it, and waits until the exporter is back. The
exporter's file descriptors and threads after each recovery may not exceed what it held before
the first fault: a leak of a single socket or thread per fault fails the test that caused it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import pytest

from exporter.testing.fakevllm import HUGE_BYTES, FakeVllm, Fault
from exporter.testing.processes import ExporterProcess, Scrape, Stats, quiet_stats, reset_peak_rss

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .conftest import Figures

POLL_SECONDS = 0.5
#: The exporter's default max_response_bytes (16 MiB): what a 200 MB answer may cost.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
MIB = 1024 * 1024


@dataclasses.dataclass
class Rig:
    """The fake vLLM, the exporter polling it, and the exporter's resources at the start."""

    vllm: FakeVllm
    exporter: ExporterProcess
    baseline: Stats


def healthy(scrape: Scrape) -> bool:
    """The target is up, its derived figures are there and /v1/models was read."""
    return (
        scrape.value("headroom_target_up") == 1.0
        and bool(scrape.series("headroom_kv_capacity_tokens"))
        and scrape.value("headroom_source_up", source="vllm_models") == 1.0
    )


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    """One exporter (0.5 s polls, short windows) watching one fake vLLM, healthy at the start."""
    vllm = FakeVllm()
    exporter = ExporterProcess(
        {
            "HEADROOM_TARGET": vllm.url,
            "HEADROOM_POLL_INTERVAL_SECONDS": str(POLL_SECONDS),
            "HEADROOM_POLL_TIMEOUT_SECONDS": str(POLL_SECONDS),
            "HEADROOM_CONTEXT_WINDOW_SECONDS": "5",
            "HEADROOM_RATE_WINDOW_SECONDS": "2",
        }
    )
    try:
        exporter.wait_for(healthy)
        # One fault cycle first, so that whatever is created once and kept (the thread pool of
        # blocking reads, the HTTP client's pool) is part of the baseline, not a "leak".
        vllm.set_fault(Fault.HTTP_500)
        exporter.wait_for(lambda s: s.value("headroom_target_up") == 0.0)
        vllm.set_fault(Fault.NONE)
        exporter.wait_for(healthy)
        yield Rig(vllm, exporter, quiet_stats(exporter.pid))
    finally:
        exporter.close()
        vllm.close()


def assert_serving_while_down(rig: Rig, down: Scrape) -> None:
    """/metrics answered quickly without stale figures, and /-/healthy answers."""
    assert down.value("headroom_target_up") == 0.0
    assert down.value("headroom_source_up", source="vllm_metrics") == 0.0
    assert not down.series("headroom_kv_capacity_tokens"), "stale figures while vLLM is down"
    assert down.seconds < 2.0
    assert rig.exporter.get("/-/healthy").status_code == 200


def assert_nothing_leaked(rig: Rig) -> Stats:
    """The exporter holds no more fds or threads than at the start; return its stats."""
    stats = rig.exporter.settled_stats(rig.baseline)
    assert stats.fds <= rig.baseline.fds, f"file descriptors leaked: {stats} vs {rig.baseline}"
    assert stats.threads <= rig.baseline.threads, f"threads leaked: {stats} vs {rig.baseline}"
    return stats


#: Each HTTP fault and the reason label it must be reported with.
HTTP_FAULTS = [
    (Fault.REFUSE, "connection_refused"),
    (Fault.HANG, "timeout"),
    (Fault.SLOW, "timeout"),
    (Fault.HTTP_500, "http_5xx"),
    (Fault.HTML, "not_metrics"),
    (Fault.JSON, "not_metrics"),
    (Fault.TRUNCATED, "connection_error"),
    (Fault.MALFORMED, "parse_error"),
    (Fault.GARBAGE, "not_metrics"),
    (Fault.HUGE, "too_large"),
    (Fault.GZIP_BOMB, "invalid_response"),
]


@pytest.mark.parametrize(("fault", "reason"), HTTP_FAULTS, ids=[f for f, _ in HTTP_FAULTS])
def test_a_failing_target_is_reported_with_its_reason_and_recovered_from(
    rig: Rig, fault: Fault, reason: str, figures: Figures
) -> None:
    """Each fault: served as data with its reason, no stale figures, recovered, nothing leaked."""
    exporter, vllm = rig.exporter, rig.vllm
    before = exporter.scrape().errors("vllm_metrics", reason)
    reset_peak_rss(exporter.pid)
    rss_before = exporter.stats().rss_bytes
    injected = time.monotonic()
    vllm.set_fault(fault)
    down, _ = exporter.wait_for(
        lambda s: s.errors("vllm_metrics", reason) > before and s.value("headroom_target_up") == 0
    )
    detected = time.monotonic() - injected
    assert_serving_while_down(rig, down)
    worst = max(exporter.scrape().seconds for _ in range(5))
    peak = exporter.stats().peak_rss_bytes

    vllm.set_fault(Fault.NONE)
    _, recovered = exporter.wait_for(healthy)
    assert recovered < 10 * POLL_SECONDS  # within a few polls (generous: shared CPUs)
    stats = assert_nothing_leaked(rig)
    figures.record(
        "vllm_faults",
        str(fault),
        {
            "reason": reason,
            "detected_seconds": round(detected, 3),
            "recovered_seconds": round(recovered, 3),
            "worst_metrics_latency_seconds": round(worst, 4),
            "peak_rss_growth_mib": round((peak - rss_before) / MIB, 1),
            "fds": stats.fds,
            "threads": stats.threads,
        },
    )


@pytest.mark.parametrize(
    ("fault", "reason"), [(Fault.HUGE, "too_large"), (Fault.GZIP_BOMB, "invalid_response")]
)
def test_a_200_mb_answer_costs_at_most_the_size_bound(
    rig: Rig, fault: Fault, reason: str, figures: Figures
) -> None:
    """200 MB plain is cut at max_response_bytes; gzip, never asked for, is not even decoded."""
    exporter, vllm = rig.exporter, rig.vllm
    before = exporter.scrape().errors("vllm_metrics", reason)
    reset_peak_rss(exporter.pid)
    rss_before = exporter.stats().rss_bytes
    sent_before = vllm.counts.metrics_body_bytes
    vllm.set_fault(fault)
    exporter.wait_for(lambda s: s.errors("vllm_metrics", reason) > before)
    # Against the start: memory a first large answer left with the allocator counts too.
    growth = exporter.stats().peak_rss_bytes - min(rss_before, rig.baseline.rss_bytes)
    sent = vllm.counts.metrics_body_bytes - sent_before
    vllm.set_fault(Fault.NONE)
    exporter.wait_for(healthy)
    # Plain: the server stops once the exporter hangs up, long before 200 MB.
    assert sent < HUGE_BYTES / 4
    # At most the bound and the HTTP client's buffers.
    assert growth < 2 * MAX_RESPONSE_BYTES, f"peak RSS grew by {growth / MIB:.0f} MiB"
    figures.record("memory", f"{fault}_peak_rss_growth_mib", round(growth / MIB, 1))
    assert_nothing_leaked(rig)


def test_counters_going_backwards_under_one_start_time_are_refused_not_a_restart() -> None:
    """Counters lower than before with the same start time: no process does that, no figures."""
    vllm = FakeVllm()
    with (
        vllm,
        ExporterProcess(
            {
                "HEADROOM_TARGET": vllm.url,
                "HEADROOM_POLL_INTERVAL_SECONDS": str(POLL_SECONDS),
                "HEADROOM_POLL_TIMEOUT_SECONDS": str(POLL_SECONDS),
                "HEADROOM_CONTEXT_WINDOW_SECONDS": "5",
                "HEADROOM_RATE_WINDOW_SECONDS": "2",
            }
        ) as exporter,
    ):
        exporter.wait_for(healthy)
        restarts = exporter.scrape().value("headroom_target_restarts_total") or 0.0
        state = vllm.state
        vllm.state = dataclasses.replace(
            state,
            finished=max(0, state.finished - 500),
            preemptions=max(0, state.preemptions - 100),
        )
        refused, _ = exporter.wait_for(
            lambda s: s.errors("vllm_metrics", "inconsistent_counters") > 0
        )
        deadline = time.monotonic() + 4 * POLL_SECONDS
        while time.monotonic() < deadline:
            scrape = exporter.scrape()
            assert scrape.value("headroom_target_up") == 0.0
            # No figure at all rather than a negative or spiking one.
            assert not scrape.series("headroom_preemptions_per_second")
            assert not scrape.series("headroom_finished_requests_per_second")
            time.sleep(0.1)
        assert (refused.value("headroom_target_restarts_total") or 0.0) == restarts


def test_a_label_explosion_is_capped_and_counted(rig: Rig, figures: Figures) -> None:
    """2,000 engines (68,000 series): capped at 64 engines, the drop counted, /metrics fast."""
    exporter, vllm = rig.exporter, rig.vllm
    reset_peak_rss(exporter.pid)
    rss_before = exporter.stats().rss_bytes
    vllm.set_fault(Fault.EXPLOSION)
    exploded, _ = exporter.wait_for(
        lambda s: (s.value("headroom_dropped_samples", reason="too_many_series") or 0) > 0,
        timeout=20,
    )
    assert exploded.value("headroom_target_up") == 1.0
    engines = {dict(labels)["engine"] for labels in exploded.series("headroom_kv_usage_ratio")}
    assert 0 < len(engines) <= 64
    worst = max(exporter.scrape().seconds for _ in range(5))
    assert worst < 2.0
    growth = exporter.stats().peak_rss_bytes - rss_before
    figures.record(
        "vllm_faults",
        "explosion",
        {
            "engines_kept": len(engines),
            "dropped_samples": exploded.value("headroom_dropped_samples", reason="too_many_series"),
            "exposition_bytes": len(exploded.text),
            "worst_metrics_latency_seconds": round(worst, 4),
            "peak_rss_growth_mib": round(growth / MIB, 1),
        },
    )
    vllm.set_fault(Fault.NONE)
    back, recovered = exporter.wait_for(
        lambda s: (
            s.value("headroom_dropped_samples", reason="too_many_series") == 0.0 and healthy(s)
        )
    )
    assert len(back.series("headroom_kv_usage_ratio")) == 1
    figures.record("recovery", "explosion_seconds", round(recovered, 3))
    assert_nothing_leaked(rig)


def test_a_restart_with_another_model_and_cache_is_followed(rig: Rig, figures: Figures) -> None:
    """vLLM back as another model with another cache: new facts, new capacity, old series gone."""
    exporter, vllm = rig.exporter, rig.vllm
    scrape = exporter.scrape()
    restarts = scrape.value("headroom_target_restarts_total") or 0.0
    models_reads = vllm.counts.requests.get("/v1/models", 0)
    old_model = vllm.state.model
    started = time.monotonic()
    vllm.restart(model="tiny-2", root="/models/tiny-2", max_model_len=1024, num_gpu_blocks=32)
    after, _ = exporter.wait_for(
        lambda s: (
            s.value("headroom_kv_capacity_tokens", engine="0", model_name="tiny-2") is not None
        )
    )
    took = time.monotonic() - started
    assert after.value("headroom_kv_capacity_tokens", engine="0", model_name="tiny-2") == 32 * 128
    assert (after.value("headroom_target_restarts_total") or 0) > restarts
    assert vllm.counts.requests.get("/v1/models", 0) > models_reads
    labels = {dict(k).get("model_name") for k in after.series("headroom_kv_capacity_tokens")}
    assert old_model not in labels
    for value in after.series("headroom_preemptions_per_second").values():
        assert value >= 0.0
    assert "tiny-2" in exporter.get("/").text
    figures.record("recovery", "restart_new_model_seconds", round(took, 3))
    assert_nothing_leaked(rig)


def test_models_endpoint_down_while_metrics_up(rig: Rig, figures: Figures) -> None:
    """/v1/models failing after a restart: vllm_models down (http_5xx), the target still up."""
    exporter, vllm = rig.exporter, rig.vllm
    before = exporter.scrape().errors("vllm_models", "http_5xx")
    vllm.set_fault(Fault.MODELS_DOWN)
    vllm.restart()  # discovery runs again after a restart
    down, _ = exporter.wait_for(lambda s: s.errors("vllm_models", "http_5xx") > before)
    assert down.value("headroom_source_up", source="vllm_models") == 0.0
    assert down.value("headroom_target_up") == 1.0
    assert down.series("headroom_kv_capacity_tokens")
    vllm.set_fault(Fault.NONE)
    _, recovered = exporter.wait_for(healthy)
    assert recovered < 10 * POLL_SECONDS  # within a few polls (generous: shared CPUs)
    figures.record("recovery", "models_down_seconds", round(recovered, 3))
    assert_nothing_leaked(rig)


def test_the_exporter_logged_only_json_events(rig: Rig) -> None:
    """Through every fault above, each line on stderr is one JSON event: no traceback."""
    assert rig.exporter.non_json_lines() == []
    events = {str(e.get("event")) for e in rig.exporter.events()}
    assert "source_failed" in events
    assert "source_recovered" in events
