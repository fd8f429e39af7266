"""Per-target cost of the fleet exporter against Prometheus's own scrape (issue 29, item 1).

One run, one machine, the same targets and interval throughout:

1. **direct**: a Prometheus (Debian's 2.42, agent mode, remote-writing to VictoriaMetrics) with
   only the chart's direct job scrapes ``--targets`` vLLM pods (one fake vLLM in this process
   serving the real 0.32.0 capture on that many loopback addresses); measured: the Prometheus
   process's CPU;
2. **probe**: a fresh Prometheus with only the chart's probe job scrapes the same pods through
   the fleet exporter's ``/probe`` (the chart's relabelling, ``helm template``); measured: the
   exporter process's CPU (the Prometheus's is printed too).

Each phase warms up for two intervals, then reads CPU time from ``/proc/PID/stat`` over
``--seconds``. Prints each share of one core, the CPU milliseconds per target and scrape, and
the ratio exporter / direct (issue 29's goal: at most 2). With ``--baseline PYTHON`` (the
interpreter of an environment where an earlier commit is installed, its dependencies with it:
``python3 -m venv /tmp/base && /tmp/base/bin/pip install <checkout>``) the probe phase runs
twice, the exporter run first by ``PYTHON`` and then by this one, back to back: a before/after
in one run. With ``--profile FILE`` the (last) probe phase's exporter runs under
``py-spy record --format raw --gil`` (``pip install py-spy``), attached over the measured
time (its own CPU is not counted), writing folded stacks of the thread holding the GIL.

    .venv/bin/python -m benchmarks.fleet_cost                          # 200 targets, 60 s
    .venv/bin/python -m benchmarks.fleet_cost --baseline /tmp/base/bin/python --seconds 30

Needs Helm, Prometheus and VictoriaMetrics in the cache (``make deps``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.shard import CAPTURE, NAMESPACE, VLLM_PORT, chart_scrape_configs, cpu_seconds
from exporter.testing.fakevllm import FakeVllm, VllmState
from exporter.testing.processes import ExporterProcess, process_stats
from tests.e2e.harness import (
    fleet_scrape_configs,
    prometheus_agent,
    victoria_metrics,
)

if TYPE_CHECKING:
    from collections.abc import Callable

FLEET_ENV = {"HEADROOM_MODE": "fleet", "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8"}


def run_phase(
    name: str,
    job: dict[str, Any],
    *,
    workdir: Path,
    vm_url: str,
    interval: float,
    seconds: float,
    pids: dict[str, int],
    profile: list[str] | None = None,
    answered: Callable[[], float] | None = None,
) -> dict[str, float]:
    """Run one Prometheus with ``job`` alone; CPU seconds of each of ``pids`` and of it."""
    config = {
        "global": {"scrape_interval": f"{interval:g}s"},
        "scrape_configs": [job],
        "remote_write": [{"url": f"{vm_url}/api/v1/write"}],
    }
    path = workdir / f"{name}.yml"
    path.write_text(json.dumps(config))
    agent = prometheus_agent(path, workdir=workdir, name=name)
    agent.start()
    try:
        time.sleep(2 * interval)  # every target scraped: the steady state
        if agent.group.pid is None:
            raise SystemExit(f"the {name} Prometheus is not running")
        watched = {**pids, "prometheus": agent.group.pid}
        before = {key: cpu_seconds(pid) for key, pid in watched.items()}
        answered_before = answered() if answered is not None else 0.0
        began = time.monotonic()
        spy = subprocess.Popen(profile) if profile else None
        time.sleep(seconds)
        if spy is not None:
            spy.wait(timeout=60)
        elapsed = time.monotonic() - began
        used = {key: cpu_seconds(pid) - before[key] for key, pid in watched.items()}
        answers = answered() - answered_before if answered is not None else 0.0
        active = agent.get_json("/api/v1/targets")["data"]["activeTargets"]
        up = sum(1 for t in active if t["health"] == "up")
        errors = {t["lastError"] for t in active if t["health"] != "up"}
        result = {f"{key}_share": value / elapsed for key, value in used.items()}
        result["answers"] = answers
        result["up"] = up
        result["targets"] = len(active)
        result["elapsed"] = elapsed
        for error in sorted(errors)[:3]:
            print(f"  down ({name}): {error}")
        return result
    finally:
        agent.stop()


def measure_probe(
    label: str,
    python: str,
    jobs: Callable[[str], dict[str, dict[str, Any]]],
    common: dict[str, Any],
    *,
    py_spy: str | None,
    profile: Path | None,
) -> dict[str, float]:
    """Run the probe phase against a fresh exporter; print and return its figures."""
    with ExporterProcess(FLEET_ENV, python=python) as exporter:
        pid = exporter.pid
        spy = None
        if profile is not None:
            spy = [str(py_spy), "record", "--format", "raw", "--nonblocking", "--gil"]
            spy += ["--pid", str(pid), "--duration", f"{common['seconds']:.0f}"]
            spy += ["--output", str(profile.resolve())]

        def answered() -> float:
            """Probes the exporter answered with figures (not those it refused 503)."""
            text = exporter.get("/metrics").text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith('headroom_probe_requests_total{outcome="ok"}')
            )

        probe = run_phase(
            "probe",
            jobs(exporter.url)["probe"],
            pids={"exporter": pid},
            profile=spy,
            answered=answered,
            **common,
        )
        peak = process_stats(pid).peak_rss_bytes / 2**20
    print(
        f"probe ({label}): exporter CPU {probe['exporter_share'] * 100:6.2f}% of one core, "
        f"peak RSS {peak:.1f} MiB; its Prometheus {probe['prometheus_share'] * 100:.2f}%; "
        f"up {probe['up']:.0f} of {probe['targets']:.0f}; {probe['answers']:.0f} probes answered"
    )
    return probe


def per_target_ms(share: float, targets: int, interval: float) -> float:
    """CPU milliseconds per target and scrape, from a share of one core."""
    return share * interval * 1000 / targets


def main() -> None:
    """Measure the direct scrape, then the probe (twice with --baseline), and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=200, help="vLLM pods")
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval, seconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured time per phase")
    parser.add_argument("--baseline", type=Path, help="interpreter running an earlier exporter")
    parser.add_argument("--profile", type=Path, help="py-spy profile of the last probe phase")
    args = parser.parse_args()
    if not 1 <= args.targets <= 60_000:
        raise SystemExit("--targets must be between 1 and 60000 (loopback addresses)")
    if args.baseline is not None and not os.access(args.baseline, os.X_OK):
        raise SystemExit(f"--baseline {args.baseline}: not an interpreter; give a venv's python")
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if args.profile is not None and py_spy is None:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.targets} targets every "
        f"{args.interval:g} s, {args.seconds:g} s measured per phase"
    )
    with tempfile.TemporaryDirectory(prefix="headroom-fleet-cost-") as tmp:
        workdir = Path(tmp)
        state = VllmState(model="tiny", root="/nonexistent/tiny", max_model_len=512)
        crs = chart_scrape_configs(workdir)
        vm = victoria_metrics(workdir)
        with FakeVllm(state=state, payload=CAPTURE.read_bytes(), host="0.0.0.0") as vllm:  # noqa: S104
            addresses = [
                f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(1, args.targets + 1)
            ]
            targets = {
                f"vllm-{i}": (NAMESPACE, f"{address}:{vllm.port}")
                for i, address in enumerate(addresses)
            }
            vm.start()
            try:

                def jobs(exporter_url: str) -> dict[str, dict[str, Any]]:
                    configs = fleet_scrape_configs(
                        crs,
                        targets,
                        exporter_address=exporter_url.removeprefix("http://"),
                        port_number=VLLM_PORT,
                        interval_s=args.interval,
                    )
                    return {
                        "probe" if job["metrics_path"] == "/probe" else "direct": job
                        for job in configs
                    }

                common = {
                    "workdir": workdir,
                    "vm_url": vm.url,
                    "interval": args.interval,
                    "seconds": args.seconds,
                }
                direct = run_phase(
                    "direct", jobs("http://127.0.0.1:1")["direct"], pids={}, **common
                )
                direct_ms = per_target_ms(direct["prometheus_share"], args.targets, args.interval)
                print(
                    f"direct: Prometheus CPU {direct['prometheus_share'] * 100:6.2f}% of one core "
                    f"= {direct_ms:.2f} ms per target and scrape; "
                    f"up {direct['up']:.0f} of {direct['targets']:.0f}"
                )
                runs: list[tuple[str, str]] = []
                if args.baseline is not None:
                    runs.append(("baseline", str(args.baseline)))
                runs.append(("this checkout", sys.executable))
                for index, (label, python) in enumerate(runs):
                    profile = args.profile if index == len(runs) - 1 else None
                    probe = measure_probe(
                        label, python, jobs, common, py_spy=py_spy, profile=profile
                    )
                    # Per answered probe: under load the exporter refuses some (503), cheaply.
                    probe_ms = probe["exporter_share"] * probe["elapsed"] * 1000
                    probe_ms /= max(probe["answers"], 1)
                    print(
                        f"  exporter / direct Prometheus, per target and scrape: "
                        f"{probe_ms:.2f} / {direct_ms:.2f} ms = {probe_ms / direct_ms:.2f}x "
                        f"(goal <= 2x)"
                    )
            finally:
                vm.stop()


if __name__ == "__main__":
    main()
