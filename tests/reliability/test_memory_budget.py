"""Heavy payloads against the real exporter: windows bounded in bytes, one budget for all.

Issue 30's memory attacks at a small scale: payloads whose HELP names, long label values,
``cache_config_info`` labels or bucket bounds change every poll. The exporter runs with the
smallest ``memory_limit_bytes`` (32 MiB: 8 MiB for all the windows), polls fast, and must stay
up, within the budget plus the parse of one payload, and count every sample it gave up;
in fleet mode a healthy target beside heavy ones loses nothing.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.core.reasons import AnswerRefusal, EvictionReason
from exporter.testing import heavy
from exporter.testing.fakevllm import FakeVllm, VllmState, render_metrics
from exporter.testing.processes import ExporterProcess, Scrape, reset_peak_rss

if TYPE_CHECKING:
    from .conftest import Figures

MIB = 1024 * 1024
#: The smallest memory limit the exporter accepts: a quarter of it (8 MiB) for the windows.
LIMIT = {"HEADROOM_MEMORY_LIMIT_BYTES": str(32 * MIB)}
#: Fast polls and windows long enough that only memory bounds them within the test.
FAST = {
    "HEADROOM_POLL_INTERVAL_SECONDS": "0.2",
    "HEADROOM_POLL_TIMEOUT_SECONDS": "0.2",
    "HEADROOM_CONTEXT_WINDOW_SECONDS": "600",
    "HEADROOM_RATE_WINDOW_SECONDS": "60",
}
POLLS = 24
#: Peak RSS growth allowed over the run: the windows' 8 MiB, the parse of one payload of
#: half a megabyte, and the allocator's slack.
GROWTH_LIMIT = 24 * MIB

#: Whether 24 polls of each case overflow the windows' 8 MiB: of 500-character split values
#: an engine keeps 1,024 characters; 8 engines x 3 histograms x 256 moving buckets make
#: samples of some 400 KB (the other cases are tests/service/test_memory.py's, in-process).
CASES = [
    (heavy.long_split_labels(engines=8), False),
    (heavy.moving_buckets(engines=8), True),
]


def evictions(scrape: Scrape, **labels: str) -> float:
    """Window samples given up for memory, all reasons."""
    return sum(
        scrape.value("headroom_window_evictions_total", reason=reason, **labels) or 0.0
        for reason in EvictionReason
    )


def wait_polls(vllm: FakeVllm, polls: int, *, timeout: float = 60.0) -> None:
    """Wait until the fake vLLM has answered ``polls`` more ``/metrics`` requests."""
    start = vllm.counts.requests.get("/metrics", 0)
    deadline = time.monotonic() + timeout
    while vllm.counts.requests.get("/metrics", 0) < start + polls:
        assert time.monotonic() < deadline, f"fewer than {polls} polls within {timeout}s"
        time.sleep(0.05)


@pytest.mark.parametrize(("case", "overflows"), CASES, ids=[case.name for case, _ in CASES])
def test_a_sidecar_fed_heavy_payloads_stays_within_its_budget(
    case: heavy.Heavy, overflows: bool, figures: Figures
) -> None:
    """24 heavy polls: up, peak RSS within budget, samples given up only when over, counted."""
    with (
        FakeVllm(payload=case.payload) as vllm,
        ExporterProcess({"HEADROOM_TARGET": vllm.url, **FAST, **LIMIT}) as exporter,
    ):
        wait_polls(vllm, 2)
        reset_peak_rss(exporter.pid)
        before = exporter.stats().rss_bytes
        wait_polls(vllm, POLLS)
        scrape = exporter.scrape()
        growth = exporter.stats().peak_rss_bytes - before
    assert scrape.value("headroom_target_up") == 1.0
    given_up = evictions(scrape)
    assert (given_up > 0) is overflows, f"{given_up:g} samples given up"
    assert growth < GROWTH_LIMIT, f"peak RSS grew by {growth / MIB:.1f} MiB"
    figures.record(
        "memory",
        f"sidecar_{case.name}",
        {
            "payload_bytes": len(case.payload(0)),
            "window_samples": scrape.value("headroom_window_samples"),
            "evictions": given_up,
            "peak_rss_growth_mib": round(growth / MIB, 1),
        },
    )


def test_heavy_fleet_targets_never_evict_a_healthy_one(figures: Figures) -> None:
    """Three heavy targets and a healthy one probed in turn: only the heavy ones give up samples."""
    hostile = heavy.moving_buckets(engines=16)
    with (
        FakeVllm(payload=hostile.payload) as first,
        FakeVllm(payload=hostile.payload) as second,
        FakeVllm(payload=hostile.payload) as third,
        FakeVllm(payload=lambda n: render_metrics(VllmState(finished=12 + 2 * n))) as healthy,
        ExporterProcess(
            {
                "HEADROOM_MODE": "fleet",
                "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8",
                "HEADROOM_PROBE_MAX_TARGETS": "16",
                **LIMIT,
            }
        ) as exporter,
        httpx.Client(timeout=10.0) as http,
    ):
        rounds = 20
        reset_peak_rss(exporter.pid)
        before = exporter.stats().rss_bytes
        last: dict[str, Scrape] = {}
        for _ in range(rounds):
            for vllm in (first, second, third, healthy):
                response = http.get(f"{exporter.url}/probe", params={"target": vllm.url})
                assert response.status_code == 200
                last[vllm.url] = Scrape(response.text, 0.0)
        growth = exporter.stats().peak_rss_bytes - before
    kept = last[healthy.url]
    assert kept.value("headroom_target_up") == 1.0
    assert evictions(kept) == 0
    assert kept.value("headroom_window_samples") == rounds
    # The heavy ones gave up samples: to their own share of the windows' memory, or (the
    # biggest first) to the process's budget; which, and which target, depends on their sizes
    # at each probe, so they are counted together.
    heavy_scrapes = [last[vllm.url] for vllm in (first, second, third)]
    given_up = {
        reason.value: [
            scrape.value("headroom_window_evictions_total", reason=reason) or 0.0
            for scrape in heavy_scrapes
        ]
        for reason in EvictionReason
    }
    assert sum(evictions(scrape) for scrape in heavy_scrapes) > 0, given_up
    assert growth < GROWTH_LIMIT, f"peak RSS grew by {growth / MIB:.1f} MiB"
    figures.record(
        "memory",
        "fleet_heavy_beside_healthy",
        {
            "rounds": rounds,
            "healthy_window_samples": kept.value("headroom_window_samples"),
            "heavy_window_samples": heavy_scrapes[-1].value("headroom_window_samples"),
            "peak_rss_growth_mib": round(growth / MIB, 1),
        },
    )


class StallingTarget:
    """A target that answers ``/metrics`` with ``send`` bytes of a longer body, then stalls.

    Issue 30: five such targets answering 16 MiB starved a healthy one (up in 26 of 50
    probes). Each connection is served by a thread of its own until the target is closed.
    """

    def __init__(self, send: int, declared: int) -> None:
        self._body = b"vllm:pad_total 1\n" * (send // 17)
        self._declared = declared
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    + f"Content-Length: {self._declared}\r\n\r\n".encode()
                    + self._body
                )
                self._stop.wait(30)  # stalled: the rest never comes
            except OSError:
                return

    def close(self) -> None:
        """Stop answering and release every connection."""
        self._stop.set()
        self._sock.close()
        self._thread.join(2)


def test_big_stalled_answers_never_starve_a_healthy_fleet_target(figures: Figures) -> None:
    """Big stalled answers give way, counted; every probe of a healthy target says it is up.

    Five targets answer 3 of 12 MiB and stall, probed 4 at a time each: the answers read at
    once stay within 8 MiB (a quarter of 32 MiB) where unbounded they would hold 60 MiB.
    """
    stalled = [StallingTarget(send=3 * MIB, declared=12 * MIB) for _ in range(5)]
    stop = threading.Event()
    try:
        with (
            FakeVllm() as healthy,
            ExporterProcess(
                {
                    "HEADROOM_MODE": "fleet",
                    "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8",
                    "HEADROOM_POLL_TIMEOUT_SECONDS": "2",
                    **LIMIT,
                }
            ) as exporter,
            httpx.Client(timeout=15.0) as http,
        ):

            def keep_probing(url: str) -> None:
                with httpx.Client(timeout=15.0) as own:
                    while not stop.is_set():
                        own.get(f"{exporter.url}/probe", params={"target": url})

            probers = [
                threading.Thread(target=keep_probing, args=(target.url,), daemon=True)
                for target in stalled
                for _ in range(4)
            ]
            reset_peak_rss(exporter.pid)
            before = exporter.stats().rss_bytes
            for prober in probers:
                prober.start()
            time.sleep(1.0)  # the big answers under way
            up = []
            for _ in range(30):
                response = http.get(f"{exporter.url}/probe", params={"target": healthy.url})
                up.append(
                    response.status_code == 200
                    and Scrape(response.text, 0.0).value("headroom_target_up") == 1.0
                )
            own = exporter.scrape()
            growth = exporter.stats().peak_rss_bytes - before
            stop.set()
            for prober in probers:
                prober.join(20)
    finally:
        stop.set()
        for target in stalled:
            target.close()
    refusals = {
        reason: own.value("headroom_probe_response_budget_refusals_total", reason=reason) or 0.0
        for reason in AnswerRefusal
    }
    assert sum(up) == len(up), f"the healthy target was up in {sum(up)} of {len(up)} probes"
    assert sum(refusals.values()) > 0, refusals
    assert growth < GROWTH_LIMIT, f"peak RSS grew by {growth / MIB:.1f} MiB"
    figures.record(
        "memory",
        "fleet_stalled_big_answers_beside_healthy",
        {
            "healthy_up": f"{sum(up)} of {len(up)}",
            "refusals": refusals,
            "peak_rss_growth_mib": round(growth / MIB, 1),
        },
    )
