"""One scrape shard's cost per target: the fleet exporter and its scraper, at a 15 s interval.

The unit of docs/kubernetes.md's "Past one machine": a shard is one fleet-mode exporter and one
scraper (here a Prometheus 2 in agent mode, Debian's) that probes its targets through it and
scrapes their vLLM ``/metrics`` directly, as the chart's two fleet ScrapeConfigs do, and
remote-writes everything to a store (Debian's VictoriaMetrics). Runs on this machine:

- ``--targets`` vLLM pods: one fake vLLM (``exporter.testing.fakevllm``) in this process serving
  the real vLLM 0.32.0 capture (50 kB, 606 lines) on that many loopback addresses;
- the exporter (``python -m exporter serve``, fleet mode) and the agent, whose jobs are the
  chart's ScrapeConfigs (``helm template``, shape fleet) turned into static jobs by
  ``tests.e2e.harness.fleet_scrape_configs``: 2 scrapes per target and interval;
- VictoriaMetrics, the store (shared by all shards: reported apart).

After two intervals of warm-up it reads each process's CPU time (``/proc/PID/stat``) over
``--seconds`` and prints each one's share of one core, peak RSS, the targets that were up, and
the shard's targets per core (exporter and agent together). The fake vLLM's own CPU is not
counted (real vLLM pods pay for their ``/metrics``).

    .venv/bin/python -m benchmarks.shard                            # 400 targets, 120 s
    .venv/bin/python -m benchmarks.shard --targets 100 --seconds 30 # a quick look

Needs Helm, Prometheus and VictoriaMetrics in the cache (``make deps``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from exporter.testing.fakevllm import FakeVllm, VllmState
from exporter.testing.processes import ExporterProcess, process_stats
from tests.e2e.harness import (
    ToolServer,
    fleet_scrape_configs,
    helm_binary,
    prometheus_agent,
    victoria_metrics,
)

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "vllm-headroom"
CAPTURE = ROOT / "tests" / "fixtures" / "vllm-metrics" / "vllm-0.32.0-cpu-after-load.prom"
CLK_TCK = os.sysconf("SC_CLK_TCK")
NAMESPACE = "inference"
#: vLLM's port as the chart's discovery keeps it (``fleet.discovery.portNumber``).
VLLM_PORT = 8000


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def chart_scrape_configs(workdir: Path) -> list[dict[str, Any]]:
    """The chart's fleet ScrapeConfigs (release bench in namespace monitoring)."""
    values = workdir / "values.yaml"
    fleet = {"allowlist": ["127.0.0.0/8"], "discovery": {"portNumber": VLLM_PORT}}
    values.write_text(yaml.safe_dump({"fleet": fleet}))
    argv = [str(helm_binary()), "template", "bench", str(CHART), "--namespace", "monitoring"]
    argv += ["--values", str(CHART / "ci" / "fleet-values.yaml"), "--values", str(values)]
    argv += ["--show-only", "templates/fleet-discovery.yaml"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def main() -> None:
    """Run one shard over ``--targets`` pods and print its cost."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=400, help="vLLM pods of the shard")
    parser.add_argument("--interval", type=float, default=15.0, help="scrape interval, seconds")
    parser.add_argument("--seconds", type=float, default=120.0, help="measured time")
    args = parser.parse_args()
    if not 1 <= args.targets <= 60_000:
        raise SystemExit("--targets must be between 1 and 60000 (loopback addresses)")
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.targets} targets every "
        f"{args.interval:g} s, measured over {args.seconds:g} s"
    )
    with tempfile.TemporaryDirectory(prefix="headroom-shard-") as tmp:
        workdir = Path(tmp)
        state = VllmState(model="tiny", root="/nonexistent/tiny", max_model_len=512)
        with (
            FakeVllm(state=state, payload=CAPTURE.read_bytes(), host="0.0.0.0") as vllm,  # noqa: S104
            ExporterProcess(
                {"HEADROOM_MODE": "fleet", "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8"}
            ) as exporter,
        ):
            addresses = [
                f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(1, args.targets + 1)
            ]
            targets = {
                f"vllm-{i}": (NAMESPACE, f"{address}:{vllm.port}")
                for i, address in enumerate(addresses)
            }
            servers: list[ToolServer] = []
            try:
                vm = victoria_metrics(workdir)
                servers.append(vm.start())
                config = {
                    "global": {"scrape_interval": f"{args.interval:g}s"},
                    "scrape_configs": fleet_scrape_configs(
                        chart_scrape_configs(workdir),
                        targets,
                        exporter_address=exporter.url.removeprefix("http://"),
                        port_number=VLLM_PORT,
                        interval_s=args.interval,
                    ),
                    "remote_write": [{"url": f"{vm.url}/api/v1/write"}],
                }
                (workdir / "agent.yml").write_text(json.dumps(config))
                agent = prometheus_agent(workdir / "agent.yml", workdir=workdir, name="agent")
                servers.append(agent.start())
                time.sleep(2 * args.interval)  # every target scraped: the steady state
                if agent.group.pid is None or vm.group.pid is None:
                    raise SystemExit("the agent or the store is not running")
                pids = {"exporter": exporter.pid, "agent": agent.group.pid, "store": vm.group.pid}
                before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                began = time.monotonic()
                time.sleep(args.seconds)
                elapsed = time.monotonic() - began
                used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
                active = agent.get_json("/api/v1/targets")["data"]["activeTargets"]
                up = sum(1 for t in active if t["health"] == "up")
                agent_metrics = agent.client.get("/metrics", timeout=10.0).text
                series = next(
                    line.split()[1]
                    for line in agent_metrics.splitlines()
                    if line.startswith("prometheus_agent_active_series ")
                )
                for name, pid in pids.items():
                    share = used[name] / elapsed
                    peak = process_stats(pid).peak_rss_bytes / 2**20
                    print(
                        f"{name:<9} CPU {share * 100:6.2f}% of one core   peak RSS {peak:7.1f} MiB"
                    )
                shard_share = (used["exporter"] + used["agent"]) / elapsed
                print(f"targets up: {up} of {len(active)} (2 jobs x {args.targets} pods)")
                errors = Counter(
                    (t["labels"]["job"].rsplit("-", 1)[-1], t["lastError"])
                    for t in active
                    if t["health"] != "up"
                )
                for (job, error), count in errors.most_common(5):
                    print(f"  down: {count} of job {job}: {error}")
                print(f"series the agent sends: {series}")
                print(
                    f"shard (exporter + agent): {shard_share * 100:.2f}% of one core for "
                    f"{args.targets} targets at {args.interval:g} s = "
                    f"{args.targets / shard_share:,.0f} targets per core"
                )
            finally:
                for server in reversed(servers):
                    server.stop()


if __name__ == "__main__":
    main()
