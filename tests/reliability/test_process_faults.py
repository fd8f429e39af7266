"""The exporter process under signals and load: clean exits, concurrent scrapes while polling."""

from __future__ import annotations

import signal
import statistics
import threading
import time
from typing import TYPE_CHECKING

import pytest
from structlog.testing import capture_logs

from exporter.core.views import TargetView
from exporter.service.poller import TargetPoller
from exporter.testing.fakevllm import Fault
from exporter.testing.processes import ExporterProcess, quiet_stats, wait_until

from .harness import mock_vllm_poller

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.core.snapshot import VllmSnapshot
    from exporter.core.views import GpuMemoryView, PredictionView, TargetInfo
    from exporter.errors import SourceError
    from exporter.testing.fakevllm import FakeVllm
    from exporter.vllm.launch import LaunchFlags

    from .conftest import Figures


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_poll_ends_the_process_cleanly_within_a_second(
    fake_vllm: FakeVllm, sig: signal.Signals, figures: Figures
) -> None:
    """A signal while a poll hangs on vLLM: exit 0 within a second, logged, no traceback."""
    fake_vllm.set_fault(Fault.HANG)
    with ExporterProcess(
        {
            "HEADROOM_TARGET": fake_vllm.url,
            "HEADROOM_POLL_INTERVAL_SECONDS": "10",
            "HEADROOM_POLL_TIMEOUT_SECONDS": "10",
        }
    ) as exporter:
        # The first poll is in flight: the fake vLLM holds its request without answering.
        wait_until(lambda: fake_vllm.counts.requests.get("/metrics", 0) >= 1)
        time.sleep(0.2)
        started = time.monotonic()
        exporter.proc.send_signal(sig)
        code = exporter.proc.wait(10)
        took = time.monotonic() - started
        assert code == 0
        assert took < 1.0, f"exit took {took:.2f}s"
        assert exporter.non_json_lines() == []
        assert [e["event"] for e in exporter.events()][-1] == "stopped"
    figures.record("process", f"{sig.name}_during_poll_exit_seconds", round(took, 3))


def test_many_concurrent_scrapes_while_polling_all_get_whole_expositions(
    fake_vllm: FakeVllm, figures: Figures
) -> None:
    """16 scrapers x 25 scrapes during 0.1 s polls: every answer 200, complete, consistent."""
    with ExporterProcess(
        {
            "HEADROOM_TARGET": fake_vllm.url,
            "HEADROOM_POLL_INTERVAL_SECONDS": "0.1",
            "HEADROOM_POLL_TIMEOUT_SECONDS": "0.1",
        }
    ) as exporter:
        exporter.wait_for(lambda s: bool(s.series("headroom_kv_capacity_tokens")))
        baseline = quiet_stats(exporter.pid)
        latencies: list[float] = []
        problems: list[str] = []
        lock = threading.Lock()

        def scraper() -> None:
            for _ in range(25):
                try:
                    scrape = exporter.scrape()
                except Exception as exc:  # noqa: BLE001 - every failure is a finding to report
                    with lock:
                        problems.append(repr(exc))
                    continue
                complete = (
                    scrape.value("headroom_collector_success", collector="target") == 1.0
                    and scrape.value("headroom_collector_success", collector="exporter") == 1.0
                    and scrape.value("headroom_target_up") in (0.0, 1.0)
                    and "process_resident_memory_bytes" in scrape.samples
                )
                with lock:
                    latencies.append(scrape.seconds)
                    if not complete:
                        problems.append(scrape.text[-500:])

        polls_before = fake_vllm.counts.requests.get("/metrics", 0)
        threads = [threading.Thread(target=scraper) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        polls = fake_vllm.counts.requests.get("/metrics", 0) - polls_before
        assert problems == []
        assert len(latencies) == 16 * 25
        assert polls > 0, "polling stopped while scraped"
        stats = exporter.settled_stats(baseline)
        assert stats.threads <= baseline.threads
        assert stats.fds <= baseline.fds
        quantiles = statistics.quantiles(latencies, n=100)
        figures.record(
            "process",
            "concurrent_scrapes",
            {
                "scrapes": len(latencies),
                "polls_meanwhile": polls,
                "p50_seconds": round(quantiles[49], 4),
                "p99_seconds": round(quantiles[98], 4),
                "max_seconds": round(max(latencies), 4),
            },
        )


class BuggyPredictor:
    """A predictor whose pure part has a bug: ``predict`` raises on every poll."""

    def load(self, info: TargetInfo) -> SourceError | None:
        return None

    def predict(
        self,
        snapshot: VllmSnapshot,
        info: TargetInfo,
        gpus: Sequence[GpuMemoryView],
        flags: LaunchFlags | None = None,
    ) -> PredictionView:
        raise ZeroDivisionError("a derivation bug")


def test_a_bug_in_a_derivation_does_not_end_the_polls() -> None:
    """predict() raising: polls go on without figures; logged once, counted every time."""
    poller, poll = mock_vllm_poller(predictor=BuggyPredictor())
    with capture_logs() as logs:
        views = [poll() for _ in range(3)]
    assert all(isinstance(v, TargetView) and v.derived is None for v in views)
    # One traceback for the bug, not one per poll; every crashed poll counts a reason.
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["poll_crashed"]
    assert isinstance(poller, TargetPoller)
    health = poller.view.sources["vllm_metrics"]
    assert not health.up
    assert health.errors == {"internal_error": 3}
