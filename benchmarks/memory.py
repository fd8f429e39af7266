"""Peak memory of the exporter at its documented worst cases, against the chart's 256Mi limit.

Runs, on this machine and in one run, the real exporter (``python -m exporter serve``) against
the fake vLLM of ``exporter.testing``, and reports each case's peak RSS (``VmHWM``) beside an
idle exporter's (the peer: the same process with nothing to hold):

- **sidecar, 64 engines**: a payload of 64 data-parallel engines (the parser's cap), polled
  as fast as allowed for two minutes: the window fills up to its bound of 64 x 256
  engine-samples;
- **fleet, full windows**: ``probe_max_targets`` targets (1,000 by default) on every loopback
  address, probed round-robin for seven minutes, so that every window holds its share of the
  fleet's budget (48 Ki engine-samples in all);
- **a hostile payload**: 16 MiB (the default cap) of distinct series, each poll;
- **heavy samples** (issue 30, ``exporter/testing/heavy.py``), each changing every poll: new
  ``# HELP vllm:*`` names, 64 engines x 96 split series of 500-character values,
  ``cache_config_info`` with 110 extra labels x 64 engines, 41 engines x 3 histograms x 256
  moving buckets; in a sidecar, and in fleet mode over ``--heavy-targets`` targets (and one
  healthy target, whose window must lose nothing) sharing the windows' budget.

The documented worst case must stay under 256 MiB with margin (docs/reliability.md).

    .venv/bin/python benchmarks/memory.py            # several minutes
    .venv/bin/python benchmarks/memory.py --quick    # 200 targets, a rough look
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import TYPE_CHECKING

import httpx

from exporter.core.reasons import EvictionReason
from exporter.testing import heavy
from exporter.testing.fakevllm import FakeVllm, VllmState, render_metrics
from exporter.testing.processes import ExporterProcess, Scrape

if TYPE_CHECKING:
    from collections.abc import Callable

MIB = 2**20
LIMIT_MIB = 256


def peak_mib(exporter: ExporterProcess) -> float:
    """The exporter's peak resident memory so far."""
    return exporter.stats().peak_rss_bytes / MIB


def idle_peer() -> float:
    """Peak RSS of a sidecar polling a healthy one-engine vLLM for a few seconds."""
    with FakeVllm() as vllm, ExporterProcess({"HEADROOM_TARGET": vllm.url}) as exporter:
        time.sleep(3)
        return peak_mib(exporter)


def sidecar_64_engines(seconds: float) -> tuple[float, float]:
    """Peak RSS of a sidecar whose window is full of 64-engine samples; and the samples."""
    payload = render_metrics(VllmState(engines=64))
    env = {
        "HEADROOM_POLL_INTERVAL_SECONDS": "0.05",
        "HEADROOM_POLL_TIMEOUT_SECONDS": "0.05",
        # 256 samples of 64 engines at about 3 polls a second need 90 s of window.
        "HEADROOM_CONTEXT_WINDOW_SECONDS": "120",
        "HEADROOM_RATE_WINDOW_SECONDS": "10",
    }
    with (
        FakeVllm(payload=payload) as vllm,
        ExporterProcess({"HEADROOM_TARGET": vllm.url, **env}) as exporter,
    ):
        time.sleep(seconds)
        samples = exporter.scrape().value("headroom_window_samples") or 0.0
        return peak_mib(exporter), samples


def fleet_full(targets: int, seconds: float) -> tuple[float, int]:
    """Peak RSS of fleet mode with ``targets`` targets probed for ``seconds``; and the probes."""
    env = {
        "HEADROOM_MODE": "fleet",
        "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8",
        "HEADROOM_PROBE_MAX_TARGETS": str(targets),
        # The default windows: each target's share of samples is reached when it has been
        # probed that many times over the 600 s window.
    }
    with FakeVllm(host="0.0.0.0") as vllm, ExporterProcess(env) as exporter:  # noqa: S104
        urls = [vllm.url_for(f"127.0.{1 + i // 250}.{1 + i % 250}") for i in range(targets)]
        probes = drive(exporter.url, urls, seconds)
        return peak_mib(exporter), probes


def drive(url: str, targets: list[str], seconds: float, threads: int = 8) -> int:
    """Probe every target round-robin from ``threads`` threads for ``seconds``."""
    done = [0] * threads
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        with httpx.Client(timeout=10) as client:
            i = k
            while time.monotonic() < stop:
                client.get(f"{url}/probe", params={"target": targets[i % len(targets)]})
                done[k] += 1
                i += threads

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(done)


def hostile_payload(seconds: float) -> float:
    """Peak RSS of a sidecar fed 16 MiB of distinct series on every poll."""
    line = 'vllm:num_requests_running{{engine="{}",model_name="m"}} 1\n'
    body = "".join(line.format(i) for i in range(330_000)).encode()[: 16 * MIB - 1]
    body = body[: body.rfind(b"\n") + 1]
    env = {"HEADROOM_POLL_INTERVAL_SECONDS": "0.5", "HEADROOM_POLL_TIMEOUT_SECONDS": "0.5"}
    with (
        FakeVllm(payload=body) as vllm,
        ExporterProcess({"HEADROOM_TARGET": vllm.url, **env}) as exporter,
    ):
        time.sleep(seconds)
        return peak_mib(exporter)


def _evictions(scrape: Scrape) -> float:
    return sum(
        scrape.value("headroom_window_evictions_total", reason=reason) or 0.0
        for reason in EvictionReason
    )


def sidecar_heavy(case: heavy.Heavy, polls: int) -> tuple[float, str]:
    """Peak RSS of a sidecar polling ``case`` ``polls`` times; its window and evictions."""
    env = {"HEADROOM_POLL_INTERVAL_SECONDS": "0.5", "HEADROOM_POLL_TIMEOUT_SECONDS": "0.5"}
    with (
        FakeVllm(payload=case.payload) as vllm,
        ExporterProcess({"HEADROOM_TARGET": vllm.url, **env}) as exporter,
    ):
        deadline = time.monotonic() + polls * 5
        while vllm.counts.requests.get("/metrics", 0) < polls and time.monotonic() < deadline:
            time.sleep(0.2)
        scrape = exporter.scrape()
        samples = scrape.value("headroom_window_samples") or 0.0
        note = (
            f"{vllm.counts.requests.get('/metrics', 0)} polls, {samples:.0f} samples kept, "
            f"{_evictions(scrape):.0f} evicted, up {scrape.value('headroom_target_up'):.0f}"
        )
        return peak_mib(exporter), note


def fleet_heavy(case: heavy.Heavy, targets: int, rounds: int) -> tuple[float, str]:
    """Peak RSS of fleet mode probing ``targets`` targets serving ``case``, and a healthy one."""
    env = {
        "HEADROOM_MODE": "fleet",
        "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8",
        "HEADROOM_PROBE_MAX_TARGETS": str(targets + 1),
    }
    with (
        FakeVllm(host="0.0.0.0", payload=case.payload) as vllm,  # noqa: S104
        FakeVllm() as healthy,
        ExporterProcess(env) as exporter,
        httpx.Client(timeout=30) as http,
    ):
        urls = [vllm.url_for(f"127.0.{1 + i // 250}.{1 + i % 250}") for i in range(targets)]
        for _ in range(rounds):
            drive_once(exporter.url, urls)
            kept = Scrape(
                http.get(f"{exporter.url}/probe", params={"target": healthy.url}).text, 0.0
            )
        note = (
            f"{targets} targets x {rounds} probes; the healthy target: "
            f"{kept.value('headroom_window_samples'):.0f} of {rounds} samples kept, "
            f"{_evictions(kept):.0f} evicted"
        )
        return peak_mib(exporter), note


def drive_once(url: str, targets: list[str], threads: int = 8) -> None:
    """Probe every target once, from ``threads`` threads."""

    def worker(k: int) -> None:
        with httpx.Client(timeout=30) as client:
            for target in targets[k::threads]:
                client.get(f"{url}/probe", params={"target": target})

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def report(name: str, peak: float, peer: float, note: str = "") -> None:
    """One result line."""
    margin = (LIMIT_MIB - peak) / LIMIT_MIB
    print(
        f"{name:<36} peak RSS {peak:6.1f} MiB  ({peak / peer:.2f}x the peer's, "
        f"{margin:.0%} under the {LIMIT_MIB} MiB limit) {note}"
    )


def main() -> None:
    """Run the cases and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 targets, shorter runs")
    parser.add_argument(
        "--heavy-only", action="store_true", help="only the heavy-sample cases (issue 30)"
    )
    parser.add_argument(
        "--heavy-targets", type=int, default=300, help="fleet targets serving heavy samples"
    )
    parser.add_argument("--heavy-polls", type=int, default=40, help="polls of each heavy case")
    args = parser.parse_args()
    targets = 200 if args.quick else 1000
    print(f"Python {sys.version.split()[0]}; fleet of {targets} targets")
    peer = idle_peer()
    report("peer: sidecar, one healthy engine", peer, peer)
    cases: list[tuple[str, Callable[[], tuple[float, str]]]] = [
        (
            "sidecar, 64 engines, full window",
            lambda: _with_note(sidecar_64_engines(30 if args.quick else 120), "{:.0f} samples"),
        ),
        (
            f"fleet, {targets} targets, full windows",
            lambda: _with_note(fleet_full(targets, 60 if args.quick else 420), "{} probes"),
        ),
        ("sidecar, 16 MiB of distinct series", lambda: (hostile_payload(15), "")),
    ]
    if args.heavy_only:
        cases = []
    for case in heavy.cases():
        cases.append(
            (f"sidecar, {case.name}", lambda c=case: sidecar_heavy(c, args.heavy_polls))  # type: ignore[misc]
        )
    for case in heavy.cases():
        cases.append(
            (
                f"fleet, {case.name}",
                lambda c=case: fleet_heavy(c, args.heavy_targets, 2),  # type: ignore[misc]
            )
        )
    for name, run in cases:
        peak, note = run()
        report(name, peak, peer, note)


def _with_note(result: tuple[float, float | int], fmt: str) -> tuple[float, str]:
    return result[0], fmt.format(result[1])


if __name__ == "__main__":
    main()
