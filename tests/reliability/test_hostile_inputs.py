"""Hostile inputs: DNS that never answers, floods of probes, poisoned payloads, bad settings.

Each test feeds the exporter something a broken or malicious neighbour could send (a name
server that never answers, a hanging target probed without pause, a 15 MB label value, NaN,
negative or duplicated samples, counters that run backwards, a password in a URL, SIGHUP, a
burst of connections, values that can never work) and judges it from outside: ``/metrics``
keeps answering, the input is reported as data, and nothing is kept or leaked that should not
be. Measured numbers go to the ``hostile`` section of the figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.service.app import FLEET_ENGINE_SAMPLES, Components
from exporter.testing.fakevllm import (
    FakeVllm,
    Fault,
    TokenTraffic,
    VllmState,
    render_metrics,
)
from exporter.testing.processes import (
    BASE_ENV,
    ExporterProcess,
    ExporterThread,
    Scrape,
    read_metrics_slowly,
    reset_peak_rss,
    wait_http,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from exporter.service.allowlist import IPAddress

    from .conftest import Figures

MIB = 1024 * 1024
#: Longest a well-behaved scrape may take under abuse (Prometheus's default timeout is 10 s).
SCRAPE_LIMIT_SECONDS = 3.0
#: Sidecar polls in these tests: fast, so that a payload shows within a fraction of a second.
POLL = {"HEADROOM_POLL_INTERVAL_SECONDS": "0.2", "HEADROOM_POLL_TIMEOUT_SECONDS": "0.2"}
#: The labels of the fake vLLM's one engine.
ENGINE = 'engine="0",model_name="tiny"'


# ------------------------------------------------------------------------------ helpers


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process exporters read HEADROOM_* and a .env of the working directory: none here."""
    for name in list(os.environ):
        if name.startswith("HEADROOM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def healthy_text(state: VllmState | None = None) -> str:
    """The fake vLLM's healthy ``/metrics`` payload, as text to edit."""
    return render_metrics(state or VllmState()).decode()


def with_value(text: str, series: str, value: str) -> bytes:
    """``text`` with the value of the one sample line ``series`` (name and labels) replaced."""
    line = re.compile(rf"^{re.escape(series)} \S+$", re.MULTILINE)
    edited, count = line.subn(f"{series} {value}", text)
    assert count == 1, f"{series} is not one line of the payload"
    return edited.encode()


def dropped(scrape: Scrape, reason: str) -> float:
    """``headroom_dropped_samples{reason}`` (0 when absent)."""
    return scrape.value("headroom_dropped_samples", reason=reason) or 0.0


def up(scrape: Scrape) -> bool:
    """The target is up."""
    return scrape.value("headroom_target_up") == 1.0


def wait_polls(vllm: FakeVllm, polls: int, *, timeout: float = 20.0) -> None:
    """Wait until the fake vLLM has answered ``polls`` more ``/metrics`` requests."""
    start = vllm.counts.requests.get("/metrics", 0)
    deadline = time.monotonic() + timeout
    while vllm.counts.requests.get("/metrics", 0) < start + polls:
        assert time.monotonic() < deadline, f"fewer than {polls} polls within {timeout}s"
        time.sleep(0.02)


@contextlib.contextmanager
def sidecar(
    payload: bytes | Callable[[int], bytes] | None = None, **env: str
) -> Iterator[tuple[FakeVllm, ExporterProcess]]:
    """A fake vLLM (serving ``payload`` if given) and a sidecar polling it every 0.2 s."""
    with (
        FakeVllm(payload=payload) as vllm,
        ExporterProcess({"HEADROOM_TARGET": vllm.url, **POLL, **env}) as exporter,
    ):
        yield vllm, exporter


@dataclasses.dataclass
class ScrapeLog:
    """What a well-behaved scraper saw: status codes (or errors) and latencies."""

    outcomes: list[str] = dataclasses.field(default_factory=list)
    latencies: list[float] = dataclasses.field(default_factory=list)

    @property
    def worst(self) -> float:
        """The slowest scrape, in seconds."""
        return max(self.latencies)

    def assert_served(self) -> None:
        """Every scrape answered 200 with a whole exposition, each within the limit."""
        assert self.outcomes, "no scrape was made"
        assert set(self.outcomes) == {"200"}, f"scrapes failed: {self.outcomes}"
        assert self.worst < SCRAPE_LIMIT_SECONDS, f"worst scrape took {self.worst:.2f}s"


def scrape_until(url: str, stop: threading.Event, log: ScrapeLog) -> None:
    """GET ``url``/metrics on a fresh connection every 100 ms until ``stop``, into ``log``."""
    while not stop.is_set():
        started = time.perf_counter()
        try:
            with httpx.Client(timeout=10.0) as http:
                response = http.get(f"{url}/metrics")
            whole = response.status_code == 200 and "headroom_build_info" in response.text
            log.outcomes.append("200" if whole else str(response.status_code))
        except httpx.HTTPError as exc:
            log.outcomes.append(type(exc).__name__)
        log.latencies.append(time.perf_counter() - started)
        stop.wait(0.1)


@contextlib.contextmanager
def scraping(url: str) -> Iterator[ScrapeLog]:
    """Scrape ``url``/metrics in a thread for the duration of the ``with`` block."""
    log, stop = ScrapeLog(), threading.Event()
    scraper = threading.Thread(target=scrape_until, args=(url, stop, log), daemon=True)
    scraper.start()
    try:
        yield log
    finally:
        stop.set()
        scraper.join(30)


def probe_counts(scrape: Scrape) -> dict[str, float]:
    """``headroom_probe_requests_total`` by outcome."""
    return {
        dict(labels)["outcome"]: value
        for labels, value in scrape.series("headroom_probe_requests_total").items()
    }


def serve_command(*args: str, cwd: Path, **env: str) -> subprocess.Popen[str]:
    """``python -m exporter serve ARGS`` with the reliability base settings and ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_")}
    return subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", *args],
        env={**clean, **BASE_ENV, **env},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_refused_in_one_line(proc: subprocess.Popen[str], *, names: str) -> str:
    """The process exited 2 with one line on stderr naming ``names``, nothing on stdout."""
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"{proc.args!r} did not stop: it accepted the value") from None
    assert proc.returncode == 2, f"{proc.args!r}: exit {proc.returncode}, {err!r}"
    assert out == ""
    assert err.count("\n") == 1, f"not one line: {err!r}"
    assert "Traceback" not in err
    assert names in err, f"{names!r} not named in {err!r}"
    return err


# ------------------------------------------------------------------------------ fleet mode


#: Probing clients, one thread per target given, from a process of their own: in the test's
#: process their threads would contend for its interpreter lock with the exporter and the
#: scraper under test, which a real exporter never shares with its clients. Each thread probes
#: once, or again and again until ``seconds`` have passed; every answer is (status or error
#: name, seconds taken, target, body says the target is up).
PROBING_CLIENTS = """
import json, sys, threading, time
import httpx
url, seconds, targets = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
answers = []
deadline = time.monotonic() + seconds
def probe(target):
    with httpx.Client(timeout=30.0) as http:
        while True:
            started = time.perf_counter()
            try:
                response = http.get(url + "/probe", params={"target": target})
            except httpx.HTTPError as exc:
                answer = [type(exc).__name__, False]
            else:
                up = "headroom_target_up 0.0" not in response.text
                answer = [response.status_code, up]
            answers.append([answer[0], time.perf_counter() - started, target, answer[1]])
            if time.monotonic() >= deadline:
                return
threads = [threading.Thread(target=probe, args=(t,)) for t in targets]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(seconds + 30)
print(json.dumps(answers))
"""


@dataclasses.dataclass(frozen=True)
class ProbeAnswer:
    """One probe as its client saw it."""

    status: int | str
    seconds: float
    target: str
    target_up: bool


def probe_from_another_process(
    url: str, targets: list[str], *, seconds: float = 0.0
) -> list[ProbeAnswer]:
    """Probe ``targets`` at once (a thread each) from a child process, for ``seconds``."""
    done = subprocess.run(
        [sys.executable, "-c", PROBING_CLIENTS, url, str(seconds), *targets],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    return [ProbeAnswer(*answer) for answer in json.loads(done.stdout)]


def test_dns_that_never_answers_cannot_lock_out_prometheus(figures: Figures) -> None:
    """100 probes of names whose lookups block: /metrics always answers, probes fail fast."""
    release = threading.Event()
    lookups: list[str] = []

    def blackhole(host: str) -> list[IPAddress]:
        lookups.append(host)
        release.wait(30)
        return []

    exporter = ExporterThread(
        {"mode": "fleet", "probe_allowlist": "10.0.0.0/8"},
        components=Components(resolve=blackhole),
    )
    try:
        with scraping(exporter.url) as log:
            started = time.monotonic()
            time.sleep(0.3)
            answers = probe_from_another_process(
                exporter.url, [f"n{i}.blackhole.example:8000" for i in range(100)]
            )
            time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))  # ~5 s of scrapes in all
        log.assert_served()
        statuses = [answer.status for answer in answers]
        assert len(answers) == 100
        assert set(statuses) <= {403, 503}, statuses
        assert statuses.count(503) >= 90, "probes beyond the lookup budget must be throttled"
        worst_probe = max(answer.seconds for answer in answers)
        assert worst_probe < 8.0, f"a probe took {worst_probe:.1f}s"
        assert len(lookups) <= 4, "more lookups ran at once than the resolver allows"

        # A name whose lookup timed out is remembered: asked again, no new lookup, at once.
        timed_out = next(answer.target for answer in answers if answer.status == 403)
        before = probe_counts(exporter.scrape())
        started = time.perf_counter()
        again = exporter.get("/probe", params={"target": timed_out})
        remembered_seconds = time.perf_counter() - started
        after = probe_counts(exporter.scrape())
        assert again.status_code == 403
        assert remembered_seconds < 1.0, f"a remembered failure took {remembered_seconds:.2f}s"
        assert lookups.count(timed_out.removesuffix(":8000")) == 1
        denied = "denied_not_in_allowlist"
        assert after[denied] - before.get(denied, 0.0) == 1
    finally:
        release.set()
        exporter.stop()
    figures.record(
        "hostile",
        "dns_blackhole_100_probes",
        {
            "scrapes": len(log.latencies),
            "worst_metrics_latency_seconds": round(log.worst, 4),
            "probes_403": statuses.count(403),
            "probes_503": statuses.count(503),
            "worst_probe_seconds": round(worst_probe, 3),
            "lookups": len(lookups),
            "remembered_failure_seconds": round(remembered_seconds, 4),
        },
    )


def test_probes_of_a_hanging_target_do_not_starve_metrics(figures: Figures) -> None:
    """64 threads probing a target that never answers, for 5 s: every /metrics answers 200."""
    with (
        FakeVllm() as vllm,
        ExporterProcess(
            {
                "HEADROOM_MODE": "fleet",
                "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8",
                "HEADROOM_POLL_TIMEOUT_SECONDS": "1",
            }
        ) as exporter,
    ):
        vllm.set_fault(Fault.HANG)
        try:
            with scraping(exporter.url) as log:
                answers = probe_from_another_process(exporter.url, [vllm.url] * 64, seconds=5.0)
        finally:
            vllm.set_fault(Fault.NONE)
        # A 200 must say the target is down: its poll timed out within the probe.
        statuses = [
            "200 with the target up" if a.status == 200 and a.target_up else a.status
            for a in answers
        ]
        log.assert_served()
        assert exporter.proc.poll() is None
        assert set(statuses) <= {200, 503, 504}, sorted(set(map(str, statuses)))
        assert statuses.count(503) + statuses.count(504) > len(statuses) / 2
        assert exporter.non_json_lines() == []
    figures.record(
        "hostile",
        "hanging_target_64_probers",
        {
            "scrapes": len(log.latencies),
            "worst_metrics_latency_seconds": round(log.worst, 4),
            "probes": len(statuses),
            "probes_200_target_down": statuses.count(200),
            "probes_503": statuses.count(503),
            "probes_504": statuses.count(504),
        },
    )


def test_a_fast_client_cannot_grow_a_fleet_window_without_bound(figures: Figures) -> None:
    """600 probes of one target as fast as possible: its window stops at the per-target bound."""
    max_targets = 1000
    bound = max(16, FLEET_ENGINE_SAMPLES // max_targets)
    with (
        FakeVllm() as vllm,
        ExporterProcess(
            {
                "HEADROOM_MODE": "fleet",
                "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8",
                "HEADROOM_PROBE_MAX_TARGETS": str(max_targets),
                # Windows of 2 s, so that the probes outlast them and the window reaches its
                # bound within the test (with 600 s windows that takes 10 minutes).
                "HEADROOM_CONTEXT_WINDOW_SECONDS": "2",
                "HEADROOM_RATE_WINDOW_SECONDS": "2",
            }
        ) as exporter,
    ):
        assert exporter.get("/probe", params={"target": vllm.url}).status_code == 200
        reset_peak_rss(exporter.pid)
        rss_before = exporter.stats().rss_bytes
        sizes: list[float] = []
        started = time.monotonic()
        with httpx.Client(timeout=10.0) as http:
            for _ in range(600):
                response = http.get(f"{exporter.url}/probe", params={"target": vllm.url})
                assert response.status_code == 200
                samples = Scrape(response.text, 0.0).value("headroom_window_samples")
                assert samples is not None
                sizes.append(samples)
        seconds = time.monotonic() - started
        stats = exporter.stats()
    assert max(sizes) <= bound, f"the window grew to {max(sizes):g} samples (bound {bound})"
    assert max(sizes) == bound, f"the bound ({bound}) was never reached: {max(sizes):g}"
    growth = stats.peak_rss_bytes - rss_before
    assert growth < 32 * MIB, f"peak RSS grew by {growth / MIB:.1f} MiB"
    figures.record(
        "hostile",
        "fleet_window_bound",
        {
            "probes": 600,
            "probes_per_second": round(600 / seconds, 1),
            "bound": bound,
            "max_window_samples": int(max(sizes)),
            "peak_rss_growth_mib": round(growth / MIB, 1),
            "rss_growth_mib": round((stats.rss_bytes - rss_before) / MIB, 1),
        },
    )


# ------------------------------------------------------------------------------ payloads


def test_a_15_mb_label_value_is_neither_kept_nor_exported(figures: Figures) -> None:
    """A 15,000,000-character model_name: dropped and counted, /metrics small, memory bounded.

    glibc's mmap threshold is pinned in the exporter (``MALLOC_MMAP_THRESHOLD_``): by default it
    rises to the largest buffer freed, and up to twice that (about 30 MiB here) can then stay in
    the heap, freed but not returned, for the next poll to reuse; a loaded CI run read 33 MiB so.
    Pinned, every large buffer goes back to the system when freed, and what RSS keeps is what the
    exporter holds: a kept copy of the value alone would be 14.3 MiB.
    """
    huge = "x" * 15_000_000
    poisoned = (
        healthy_text() + f'vllm:num_requests_running{{engine="0",model_name="{huge}"}} 1\n'
    ).encode()
    healthy = render_metrics(VllmState())
    with sidecar(
        healthy,
        # Room for the 15 MB answer on a loaded machine: this test is about memory, not time.
        HEADROOM_POLL_INTERVAL_SECONDS="0.5",
        HEADROOM_POLL_TIMEOUT_SECONDS="0.5",
        MALLOC_MMAP_THRESHOLD_="131072",
    ) as (vllm, exporter):
        exporter.wait_for(up)
        reset_peak_rss(exporter.pid)
        rss_before = exporter.stats().rss_bytes
        vllm.payload = poisoned
        wait_polls(vllm, 10, timeout=30)
        scrape, _ = exporter.wait_for(lambda s: dropped(s, "label_too_long") > 0)
        assert up(scrape)
        assert scrape.value("headroom_requests_running", engine="0", model_name="tiny") == 2.0
        assert len(scrape.text) < 64 * 1024
        assert "x" * 513 not in scrape.text
        assert "x" * 513 not in exporter.get("/").text
        assert exporter.non_json_lines() == []
        # What stays is read once the poll of the last hostile payload has ended (two healthy
        # payloads served after it): a poll parsing it holds the payload a few times over.
        vllm.payload = healthy
        wait_polls(vllm, 2, timeout=30)
        after = exporter.stats()
    # Each poll holds the payload a few times over while it is parsed, then lets it go.
    growth = after.peak_rss_bytes - rss_before
    assert growth < 100 * MIB, f"peak RSS grew by {growth / MIB:.0f} MiB"
    kept = after.rss_bytes - rss_before
    assert kept < 8 * MIB, f"RSS stayed {kept / MIB:.0f} MiB higher: the value is kept"
    figures.record(
        "hostile",
        "label_value_15_mb",
        {
            "polls": 10,
            "metrics_bytes": len(scrape.text),
            "dropped_label_too_long": dropped(scrape, "label_too_long"),
            "peak_rss_growth_mib": round(growth / MIB, 1),
            "rss_growth_after_mib": round(kept / MIB, 1),
        },
    )


def test_nan_usage_and_an_infinite_count_do_not_crash_polls(figures: Figures) -> None:
    """NaN usage, then a +Inf histogram _count: target up, figure absent, drop counted."""
    nan_usage = with_value(healthy_text(), f"vllm:kv_cache_usage_perc{{{ENGINE}}}", "NaN")
    inf_count = with_value(healthy_text(), f"vllm:request_prompt_tokens_count{{{ENGINE}}}", "+Inf")
    with sidecar(nan_usage) as (vllm, exporter):
        scrape, _ = exporter.wait_for(lambda s: up(s) and dropped(s, "not_finite") >= 1)
        wait_polls(vllm, 3)
        scrape = exporter.scrape()
        assert up(scrape)
        assert dropped(scrape, "not_finite") >= 1
        assert scrape.value("headroom_kv_used_tokens", engine="0", model_name="tiny") is None
        assert scrape.value("headroom_kv_usage_ratio", engine="0", model_name="tiny") is None
        assert scrape.value("headroom_kv_capacity_tokens", engine="0", model_name="tiny") == 1024

        vllm.payload = inf_count
        scrape, _ = exporter.wait_for(
            lambda s: s.value("headroom_kv_used_tokens", engine="0", model_name="tiny") is not None
        )
        wait_polls(vllm, 3)
        scrape = exporter.scrape()
        assert up(scrape)
        assert dropped(scrape, "not_finite") >= 1
        events = {str(event.get("event")) for event in exporter.events()}
        assert "poll_crashed" not in events
        assert exporter.scrape().errors("vllm_metrics", "internal_error") == 0
        assert exporter.non_json_lines() == []
    figures.record("hostile", "not_finite_dropped_per_payload", dropped(scrape, "not_finite"))


def fine_histograms(requests_per_scrape: int, buckets: int) -> Callable[[int], bytes]:
    """The healthy payload with histograms of ``buckets`` buckets (no vLLM's: at most 23).

    Every scrape adds ``requests_per_scrape`` requests spread over all of them.
    """
    healthy = healthy_text()
    # 1, 2, ... 255 tokens: prompt and output within max_model_len 512 together.
    traffic = TokenTraffic(tuple(float(bound) for bound in range(1, buckets)))
    rng = random.Random(buckets)  # noqa: S311 - test data, not secrets

    def payload(_scrape: int) -> bytes:
        for _ in range(requests_per_scrape):
            traffic.add(rng.randint(1, buckets - 1), rng.randint(1, buckets - 1))
        return traffic.replacing(healthy)

    return payload


def test_histograms_of_256_buckets_cost_a_bounded_poll(figures: Figures) -> None:
    """256 buckets a histogram, 300 requests a poll over all of them: polls go on, bounded.

    Each poll's context estimate pairs every busy prompt bucket with every busy output bucket
    of every poll in its window: 65,536 pairs a poll here, unbounded, held minutes and
    gigabytes a poll. Merged above 24 buckets and about 8,192 pairs a window, the sidecar
    keeps polling and serving, and reads the context.
    """
    with sidecar(fine_histograms(300, 256)) as (vllm, exporter), scraping(exporter.url) as log:
        exporter.wait_for(up)
        reset_peak_rss(exporter.pid)
        rss_before = exporter.stats().rss_bytes
        started = time.monotonic()
        wait_polls(vllm, 12, timeout=60)
        seconds = (time.monotonic() - started) / 12
        scrape = exporter.scrape()
        peak = exporter.stats().peak_rss_bytes
        assert up(scrape)
        p95 = scrape.value("headroom_context_length_p95_tokens", engine="0", model_name="tiny")
        assert p95 is not None
        # Prompt and output independent and even over 1-255 tokens: the sum's p95 is 431. A few
        # polls cannot show how they pair, so it leans towards longest with longest (510).
        assert 0.95 * 431 <= p95 <= 510
        assert "poll_crashed" not in {str(event.get("event")) for event in exporter.events()}
        assert exporter.non_json_lines() == []
    log.assert_served()
    growth = peak - rss_before
    assert growth < 100 * MIB, f"peak RSS grew by {growth / MIB:.0f} MiB"
    figures.record(
        "hostile",
        "histograms_of_256_buckets",
        {
            "seconds_per_poll": round(seconds, 2),
            "p95_tokens": p95,
            "peak_rss_growth_mib": round(growth / MIB, 1),
            "worst_scrape_seconds": round(log.worst, 2),
        },
    )


def test_negative_gauges_are_not_exported(figures: Figures) -> None:
    """num_requests_waiting of -5: headroom_requests_waiting absent, out_of_range counted."""
    negative = with_value(healthy_text(), f"vllm:num_requests_waiting{{{ENGINE}}}", "-5")
    with sidecar(negative) as (vllm, exporter):
        exporter.wait_for(lambda s: up(s) and dropped(s, "out_of_range") >= 1)
        wait_polls(vllm, 2)
        scrape = exporter.scrape()
        assert up(scrape)
        assert dropped(scrape, "out_of_range") >= 1
        assert scrape.value("headroom_requests_waiting", engine="0", model_name="tiny") is None
        assert scrape.value("headroom_requests_running", engine="0", model_name="tiny") == 2.0
        assert exporter.non_json_lines() == []
    figures.record(
        "hostile", "negative_gauge_out_of_range_dropped", dropped(scrape, "out_of_range")
    )


def test_duplicate_series_are_refused_like_prometheus_does(figures: Figures) -> None:
    """The running line written twice: a parse_error, target down, no figures."""
    line = f"vllm:num_requests_running{{{ENGINE}}} 2.0\n"
    text = healthy_text()
    assert line in text
    twice = text.replace(line, line + line).encode()
    with sidecar(render_metrics(VllmState())) as (vllm, exporter):
        before = exporter.wait_for(up)[0].errors("vllm_metrics", "parse_error")
        vllm.payload = twice
        scrape, detected = exporter.wait_for(
            lambda s: (
                s.errors("vllm_metrics", "parse_error") > before
                and s.value("headroom_target_up") == 0.0
            )
        )
        wait_polls(vllm, 2)
        scrape = exporter.scrape()
        assert scrape.value("headroom_target_up") == 0.0
        assert scrape.errors("vllm_metrics", "parse_error") >= before + 2
        assert not scrape.series("headroom_requests_running")
        assert not scrape.series("headroom_kv_capacity_tokens")
        assert exporter.non_json_lines() == []
    figures.record("hostile", "duplicate_series_detected_seconds", round(detected, 3))


def test_counters_going_backwards_every_poll_are_a_bad_target_not_a_restart_storm(
    figures: Figures,
) -> None:
    """Counters alternating 1000 and 10 (same start time): refused, no rate spike, <= 1 restart."""
    high = render_metrics(VllmState(preemptions=1000, finished=1000))
    low = render_metrics(VllmState(preemptions=10, finished=10))
    rates: list[float] = []

    def seen(scrape: Scrape) -> bool:
        rates.extend(scrape.series("headroom_preemptions_per_second").values())
        return scrape.errors("vllm_metrics", "inconsistent_counters") > 0

    with sidecar(lambda served: high if served % 2 == 0 else low) as (vllm, exporter):
        _, detected = exporter.wait_for(seen, timeout=20, every=0.01)
        deadline = time.monotonic() + 1.5  # several more polls, all refused
        while time.monotonic() < deadline:
            scrape = exporter.scrape()
            seen(scrape)
            assert scrape.value("headroom_target_up") == 0.0
            assert not scrape.series("headroom_preemptions_per_second")
            time.sleep(0.05)
        restarts = scrape.value("headroom_target_restarts_total") or 0.0
        assert scrape.value("headroom_source_up", source="vllm_metrics") == 0.0
        assert exporter.non_json_lines() == []
        polls = vllm.counts.requests.get("/metrics", 0)
    worst_rate = max(rates, default=0.0)
    figures.record(
        "hostile",
        "counters_backwards_every_poll",
        {
            "detected_seconds": round(detected, 3),
            "polls": polls,
            "restarts_counted": restarts,
            "worst_preemptions_per_second_exposed": round(worst_rate, 1),
        },
    )
    assert restarts <= 1, f"{restarts:g} restarts counted: a restart storm"
    # The true rate is 0: 1000 preemptions in one payload and 10 in the next, alternating.
    assert worst_rate < 400, f"a preemption rate of {worst_rate:.0f}/s was exposed"


# ------------------------------------------------------------------------------ secrets


def test_the_bearer_token_reaches_only_targets_bound_to_it(tmp_path: Path) -> None:
    """Fleet mode: the token goes to 127.0.0.2 (bound), not 127.0.0.3; unbound, it is refused."""
    with (
        FakeVllm(host="127.0.0.2") as bound,
        FakeVllm(host="127.0.0.3") as other,
        ExporterProcess(
            {
                "HEADROOM_MODE": "fleet",
                "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8",
                "HEADROOM_BEARER_TOKEN": "s3cret",
                "HEADROOM_BEARER_TOKEN_TARGETS": "127.0.0.2",
            }
        ) as exporter,
    ):
        for vllm in (bound, other):
            assert exporter.get("/probe", params={"target": vllm.url}).status_code == 200
        assert bound.counts.requests.get("/metrics", 0) >= 1
        assert other.counts.requests.get("/metrics", 0) >= 1
        assert bound.counts.authorizations == {"Bearer s3cret"}
        assert other.counts.authorizations == set(), "the token went to an unbound target"
        assert "s3cret" not in exporter.log_text()
    unbound = serve_command(
        cwd=tmp_path,
        HEADROOM_MODE="fleet",
        HEADROOM_PROBE_ALLOWLIST="127.0.0.0/8",
        **{"HEADROOM_BEARER_TOKEN": "s3cret"},
    )
    err = assert_refused_in_one_line(unbound, names="bearer_token_targets")
    assert "s3cret" not in err


def test_a_password_in_the_target_url_is_never_shown(fake_vllm: FakeVllm) -> None:
    """HEADROOM_TARGET=http://admin:s3cret@...: neither logs nor pages show the password."""
    target = f"http://admin:s3cret@127.0.0.1:{fake_vllm.port}"
    with ExporterProcess(
        {"HEADROOM_TARGET": target, "HEADROOM_LOG_LEVEL": "debug", **POLL}
    ) as exporter:
        exporter.wait_for(up)
        wait_polls(fake_vllm, 3)
        # Failures write the target and the error into log lines: make some.
        for fault in (Fault.HTTP_500, Fault.REFUSE):
            fake_vllm.set_fault(fault)
            exporter.wait_for(lambda s: s.value("headroom_target_up") == 0.0)
            fake_vllm.set_fault(Fault.NONE)
            exporter.wait_for(up)
        landing = exporter.get("/").text
        metrics = exporter.scrape().text
        code, _ = exporter.terminate()
        logs = exporter.log_text()
    assert code == 0
    for text in (logs, landing, metrics):
        assert "s3cret" not in text
    assert "admin:***@" in landing
    assert "admin:***@" in logs


# ------------------------------------------------------------------------------ the process


def test_sighup_does_not_kill_the_exporter(fake_vllm: FakeVllm) -> None:
    """SIGHUP is logged and ignored: /metrics still answers, then SIGTERM exits 0."""
    with ExporterProcess({"HEADROOM_TARGET": fake_vllm.url, **POLL}) as exporter:
        exporter.wait_for(up)
        exporter.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not any(e.get("event") == "sighup_ignored" for e in exporter.events()):
            assert exporter.proc.poll() is None, f"SIGHUP killed it: {exporter.log_text()}"
            assert time.monotonic() < deadline, "no sighup_ignored event"
            time.sleep(0.02)
        assert exporter.proc.poll() is None
        exporter.wait_for(up)
        code, _ = exporter.terminate()
        assert code == 0
        assert exporter.non_json_lines() == []


def read_answers(url: str, connections: int, *, timeout: float = 30.0) -> list[bytes]:
    """Open ``connections`` sockets at once, each sending a whole GET /metrics; read to EOF."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(connections)]
    answers = dict.fromkeys(socks, b"")
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.sendall(request)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1.0):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    chunk = conn.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:  # a reset: whatever arrived before it is the answer
                    chunk = b""
                if chunk:
                    answers[conn] += chunk
                else:
                    selector.unregister(conn)
                    conn.close()
    for sock in socks:
        sock.close()
    return [answers[sock] for sock in socks]


def test_every_request_sent_whole_gets_an_answer_under_300_connections(
    fake_vllm: FakeVllm, figures: Figures
) -> None:
    """300 connections at once, each with a whole request: each gets 200 or 503, none nothing."""
    with ExporterProcess({"HEADROOM_TARGET": fake_vllm.url, **POLL}) as exporter:
        exporter.wait_for(up)
        answers = read_answers(exporter.url, 300)
        assert exporter.proc.poll() is None
        exporter.wait_for(up)
    status = re.compile(rb"^HTTP/1\.[01] (\d{3}) ")
    codes = [
        (match.group(1).decode() if (match := status.match(a)) else repr(a[:40])) for a in answers
    ]
    split = {code: codes.count(code) for code in sorted(set(codes))}
    assert set(codes) <= {"200", "503"}, f"answers by status line: {split}"
    figures.record("hostile", "connections_300_at_once", split)


def test_values_that_can_never_work_are_refused_at_start(tmp_path: Path) -> None:
    """Ports out of range or not numbers, octal hosts, a 1 ns poll: exit 2, one line each."""
    cases = [
        (("--target", "http://127.0.0.1:99999"), {}, "setting target"),
        (("--target", "http://127.0.0.1:abc"), {}, "setting target"),
        (("--target", "http://0177.0.0.1:8000"), {}, "setting target"),
        (("--target", "http://127.0.0.1:0"), {}, "setting target"),
        ((), {"HEADROOM_POLL_INTERVAL_SECONDS": "1e-9"}, "setting poll_interval_seconds"),
    ]
    procs = [(serve_command(*args, cwd=tmp_path, **env), name) for args, env, name in cases]
    for proc, name in procs:
        assert_refused_in_one_line(proc, names=name)


def test_a_foreign_key_in_dotenv_does_not_stop_start_up(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    """A shared .env with COMPOSE_PROJECT_NAME in the working directory: the exporter starts."""
    (tmp_path / ".env").write_text("COMPOSE_PROJECT_NAME=x\nPOSTGRES_PASSWORD=y\n")
    with ExporterProcess({"HEADROOM_TARGET": fake_vllm.url, **POLL}, cwd=tmp_path) as exporter:
        exporter.wait_for(up)
        assert exporter.non_json_lines() == []


def test_slow_readers_of_a_large_metrics_never_delay_other_scrapers(figures: Figures) -> None:
    """24 slow readers of a 64-engine sidecar's /metrics beside 8 scrapers for 6 s.

    Issue 30: 3 of 30 scrapes got 503 and one took 8.5 s. The exposition is rendered once per
    poll and served as the same bytes to everyone: every scrape answers 200 within the limit.
    """
    stop = threading.Event()
    with (
        FakeVllm(state=VllmState(engines=64)) as vllm,
        ExporterProcess({"HEADROOM_TARGET": vllm.url}) as exporter,
    ):
        wait_http(f"{exporter.url}/-/ready", timeout=20, status=200)
        readers = [
            threading.Thread(
                target=read_metrics_slowly,
                args=(exporter.url, stop),
                kwargs={"pause_s": 0.05},
                daemon=True,
            )
            for _ in range(24)
        ]
        for reader in readers:
            reader.start()
        try:
            with contextlib.ExitStack() as stack:
                logs = [stack.enter_context(scraping(exporter.url)) for _ in range(8)]
                time.sleep(6.0)
        finally:
            stop.set()
            for reader in readers:
                reader.join(20)
        for log in logs:
            log.assert_served()
        assert exporter.proc.poll() is None
    latencies = sorted(latency for log in logs for latency in log.latencies)
    figures.record(
        "hostile",
        "slow_readers_beside_scrapers",
        {
            "scrapes": len(latencies),
            "median_metrics_latency_seconds": round(latencies[len(latencies) // 2], 4),
            "worst_metrics_latency_seconds": round(latencies[-1], 4),
        },
    )
