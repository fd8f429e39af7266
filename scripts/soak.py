#!/usr/bin/env python3
"""Soak: hours of sidecar life, compressed, against a fake vLLM that restarts and misbehaves.

The real exporter process (``python -m exporter serve``) polls the reliability suite's fake
vLLM (``exporter/testing/fakevllm.py``) with every duration of production divided by
``--speedup``: a 5 s poll interval, 15 s Prometheus scrapes, 600 s and 60 s windows become
50 ms, 150 ms, 6 s and 0.6 s at the default 100x. The windows are scaled too, so the exporter
holds as many samples as in production and its memory is comparable. The fake vLLM goes
through a cycle of 91.5 simulated minutes, again and again: restarts (another model, another
cache size) and faults (down, hung, 5xx, slow, HTML, truncated, a 200 MB answer, a label
explosion, /v1/models down) between healthy stretches, while traffic advances its counters.
The exporter's resident memory, file descriptors and threads are sampled once a second (wall),
each sample tagged with its cycle and phase; the scrapes' latencies and outcomes are kept.

Run (not part of ``make test``; ten minutes by default: 16.7 simulated hours, 10 cycles)::

    .venv/bin/python scripts/soak.py --duration 600 --report soak.json

Steady means: after a warm-up cycle, the last third of the cycles holds no more memory than
the middle third (beyond ``--max-rss-drift-mib`` of allocator noise), and no more descriptors
or threads than any cycle before. Exit code 0 when the exporter was steady, survived, answered
every scrape and logged nothing but JSON events.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from exporter.testing.fakevllm import FakeVllm, Fault
from exporter.testing.processes import ExporterProcess, Stats, reset_peak_rss

MIB = 1024 * 1024

#: Production timings in seconds (the exporter's defaults, Prometheus's usual scrape interval).
POLL = 5.0
SCRAPE = 15.0
CONTEXT_WINDOW = 600.0
CONTEXT_MAX_WINDOW = 3600.0
RATE_WINDOW = 60.0
CONTEXT_REFRESH = 30.0

#: One cycle of the schedule, in simulated seconds: (how long, what the fake vLLM does).
#: ``restart:<model>:<blocks>`` restarts it as that model with that many KV blocks.
CYCLE: list[tuple[float, str]] = [
    (1200, "none"),
    (0, "restart:tiny:8"),
    (1200, "none"),
    (120, Fault.REFUSE.value),
    (0, "restart:tiny-2:32"),
    (600, "none"),
    (60, Fault.HANG.value),
    (60, Fault.HTTP_500.value),
    (60, Fault.SLOW.value),
    (600, "none"),
    (60, Fault.HTML.value),
    (60, Fault.TRUNCATED.value),
    (30, Fault.HUGE.value),
    (600, "none"),
    (120, Fault.EXPLOSION.value),
    (0, "restart:tiny:16"),
    (60, Fault.MODELS_DOWN.value),
    (720, "none"),
]
CYCLE_SECONDS = sum(seconds for seconds, _ in CYCLE)


@dataclass(frozen=True)
class Sample:
    """The exporter's resources at one moment of the run."""

    wall: float
    cycle: int
    phase: str
    stats: Stats


@dataclass
class Run:
    """What the soak observed."""

    samples: list[Sample] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    actions: int = 0
    restarts: int = 0


def apply(vllm: FakeVllm, action: str, run: Run) -> None:
    """Make the fake vLLM do ``action`` (a fault, ``none``, or a restart)."""
    run.actions += 1
    if action.startswith("restart:"):
        _, model, blocks = action.split(":")
        vllm.set_fault(Fault.NONE)
        vllm.restart(model=model, root=f"/models/{model}", num_gpu_blocks=int(blocks))
        run.restarts += 1
        return
    vllm.set_fault(Fault(action))


def scrape_loop(exporter: ExporterProcess, every: float, stop: threading.Event, run: Run) -> None:
    """Scrape /metrics every ``every`` seconds, as Prometheus would, until ``stop``."""
    while not stop.wait(every):
        started = time.perf_counter()
        try:
            response = exporter.get("/metrics")
            ok = response.status_code == 200 and "headroom_build_info" in response.text
            outcome = "200" if ok else str(response.status_code)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding to report
            outcome = type(exc).__name__
        run.latencies.append(time.perf_counter() - started)
        if outcome != "200":
            run.failures.append(outcome)


def drive(vllm: FakeVllm, exporter: ExporterProcess, run: Run, *, args: argparse.Namespace) -> None:
    """Play the schedule for ``args.duration`` wall seconds, sampling the exporter each second."""
    speedup = args.speedup
    started = time.monotonic()
    schedule = iter(CYCLE * 1000)
    step = -1
    phase = "none"
    next_action = next_sample = started
    while (now := time.monotonic()) - started < args.duration:
        if exporter.proc.poll() is not None:
            run.failures.append(f"exporter exited with {exporter.proc.returncode}")
            return
        if now >= next_action:
            seconds, phase = next(schedule)
            step += 1
            if step % len(CYCLE) == 0:
                reset_peak_rss(exporter.pid)  # per-cycle peaks, not the peak since start
            apply(vllm, phase, run)
            next_action = now + seconds / speedup
        if now >= next_sample:
            cycle = step // len(CYCLE)
            run.samples.append(Sample(now - started, cycle, phase, exporter.stats()))
            next_sample = now + 1.0
        time.sleep(0.01)


@dataclass(frozen=True)
class CycleFigures:
    """One complete cycle: peak and healthy-median RSS in MiB, fds and threads (min, max)."""

    cycle: int
    rss_peak_mib: float
    rss_max_sampled_mib: float
    rss_healthy_median_mib: float
    fds: tuple[int, int]
    threads: tuple[int, int]


def cycles_summary(run: Run) -> list[CycleFigures]:
    """The figures of every complete cycle (the last, cut short, is left out)."""
    last = max((s.cycle for s in run.samples), default=0)
    out = []
    for cycle in range(last):
        samples = [s for s in run.samples if s.cycle == cycle]
        healthy = [s.stats.rss_bytes / MIB for s in samples if s.phase == "none"]
        if not samples or not healthy:
            continue
        out.append(
            CycleFigures(
                cycle=cycle,
                rss_peak_mib=round(max(s.stats.peak_rss_bytes for s in samples) / MIB, 1),
                rss_max_sampled_mib=round(max(s.stats.rss_bytes for s in samples) / MIB, 1),
                rss_healthy_median_mib=round(statistics.median(healthy), 1),
                fds=(min(s.stats.fds for s in samples), max(s.stats.fds for s in samples)),
                threads=(
                    min(s.stats.threads for s in samples),
                    max(s.stats.threads for s in samples),
                ),
            )
        )
    return out


def summarise(
    run: Run, cycles: list[CycleFigures], *, wall: float, speedup: float, polls: int
) -> dict[str, object]:
    """The figures of the run, as JSON-ready data."""
    quantiles = statistics.quantiles(run.latencies, n=100) if len(run.latencies) > 1 else [0] * 99
    return {
        "wall_seconds": round(wall, 1),
        "speedup": speedup,
        "simulated_hours": round(wall * speedup / 3600, 2),
        "cycle_simulated_minutes": CYCLE_SECONDS / 60,
        "polls": polls,
        "scrapes": len(run.latencies),
        "scrape_failures": len(run.failures),
        "schedule_actions": run.actions,
        "restarts": run.restarts,
        "cycles": [dataclasses.asdict(c) for c in cycles],
        "scrape_latency_seconds": {
            "p50": round(quantiles[49], 4),
            "p99": round(quantiles[98], 4),
            "max": round(max(run.latencies, default=0.0), 4),
        },
        "samples": [
            [
                round(s.wall, 1),
                s.cycle,
                s.phase,
                round(s.stats.rss_bytes / MIB, 2),
                s.stats.fds,
                s.stats.threads,
            ]
            for s in run.samples
        ],
    }


def steadiness(cycles: list[CycleFigures], max_drift_mib: float) -> list[str]:
    """Why the run was not steady (empty: it was).

    The first cycle is the warm-up (every fault happens once in it; what the allocator keeps
    after the largest answers is reached during it and the next). The rest is cut in thirds:
    the last third may not hold more than the middle one, beyond allocator noise of
    ``max_drift_mib`` (median RSS of the healthy stretches, largest RSS sampled), nor more
    descriptors or threads than any earlier cycle.
    """
    later = cycles[1:]
    if len(later) < 3:
        return ["fewer than four complete cycles: run longer (--duration)"]
    third = len(later) // 3
    middle, last = later[third : 2 * third], later[2 * third :]
    earlier = cycles[: len(cycles) - len(last)]
    problems = []
    drift = statistics.fmean(c.rss_healthy_median_mib for c in last) - statistics.fmean(
        c.rss_healthy_median_mib for c in middle
    )
    if drift > max_drift_mib:
        problems.append(f"healthy RSS grew by {drift:.1f} MiB from the middle third to the last")
    top, before = (
        max(c.rss_max_sampled_mib for c in last),
        max(c.rss_max_sampled_mib for c in earlier),
    )
    if top > before + max_drift_mib:
        problems.append(f"largest RSS grew: {top} MiB in the last third, {before} before")
    if max(c.fds[1] for c in last) > max(c.fds[1] for c in earlier):
        problems.append(f"descriptors grew: {[c.fds for c in cycles]}")
    if max(c.threads[1] for c in last) > max(c.threads[1] for c in earlier):
        problems.append(f"threads grew: {[c.threads for c in cycles]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print the summary; return 0 if the exporter stayed steady and healthy."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--duration", type=float, default=600.0, help="wall seconds (600)")
    parser.add_argument("--speedup", type=float, default=100.0, help="time compression (100)")
    parser.add_argument("--report", type=Path, help="write the figures here as JSON")
    parser.add_argument(
        "--max-rss-drift-mib", type=float, default=6.0, help="allocator noise allowed (6 MiB)"
    )
    args = parser.parse_args(argv)
    poll = POLL / args.speedup
    run = Run()
    with FakeVllm() as vllm:
        exporter = ExporterProcess(
            {
                "HEADROOM_TARGET": vllm.url,
                "HEADROOM_POLL_INTERVAL_SECONDS": f"{poll:g}",
                "HEADROOM_POLL_TIMEOUT_SECONDS": f"{poll:g}",
                "HEADROOM_CONTEXT_WINDOW_SECONDS": f"{CONTEXT_WINDOW / args.speedup:g}",
                "HEADROOM_CONTEXT_MAX_WINDOW_SECONDS": f"{CONTEXT_MAX_WINDOW / args.speedup:g}",
                "HEADROOM_RATE_WINDOW_SECONDS": f"{RATE_WINDOW / args.speedup:g}",
                "HEADROOM_CONTEXT_REFRESH_SECONDS": f"{CONTEXT_REFRESH / args.speedup:g}",
            }
        )
        stop = threading.Event()
        every = SCRAPE / args.speedup
        scraper = threading.Thread(target=scrape_loop, args=(exporter, every, stop, run))
        started = time.monotonic()
        scraper.start()
        try:
            drive(vllm, exporter, run, args=args)
        finally:
            stop.set()
            scraper.join(10)
            wall = time.monotonic() - started
            polls = vllm.counts.requests.get("/metrics", 0)
            non_json = exporter.non_json_lines()
            exporter.close()
    cycles = cycles_summary(run)
    summary = summarise(run, cycles, wall=wall, speedup=args.speedup, polls=polls)
    summary["non_json_log_lines"] = len(non_json)
    problems = steadiness(cycles, args.max_rss_drift_mib)
    if run.failures or non_json:
        problems.append(f"failures: {run.failures[:10]}; non-JSON log lines: {non_json[:5]}")
    summary["problems"] = problems
    if args.report:
        args.report.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=2))
    for problem in problems:
        print(f"NOT STEADY: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
