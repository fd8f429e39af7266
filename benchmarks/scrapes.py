"""Concurrent scrapers of the sidecar's ``/metrics``: rendered once per poll against every scrape.

Runs, on this machine and in one run:

- the fake vLLM of ``exporter.testing`` with 64 engines (a large ``/metrics``, issue 30's
  slow-reader case), in this process;
- the sidecar (``serve()`` in a child process, polling every 5 s, GPUs off) twice: as shipped,
  ``/metrics`` rendered once per poll (:class:`~exporter.service.httpserver.CachedExposition`),
  and **uncached**, prometheus_client's app rendering on every scrape (the exporter before
  this change; the child swaps the cache out, nothing else differs);
- ``--scrapers`` threads in this process scraping ``/metrics`` back to back for ``--seconds``,
  half asking for gzip (as Prometheus does) and half not, plus ``--slow`` slow readers that ask
  for ``/metrics`` and read it 4 KiB at a time.

It prints, for each mode, scrapes per second, the median and worst scrape time, the scrapes
that failed, and the exporter's CPU seconds per scrape; then the ratio of scrapes per second,
cached over uncached. The scrapers share this machine's cores with the exporter: the ratio is
what the run shows, the absolute rates are this machine's.

    .venv/bin/python benchmarks/scrapes.py                  # 50 scrapers, 15 s per mode
    .venv/bin/python benchmarks/scrapes.py --scrapers 20 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client import make_wsgi_app

from exporter.service import app
from exporter.service.settings import load_settings
from exporter.testing.fakevllm import FakeVllm, VllmState
from exporter.testing.processes import free_port, read_metrics_slowly, wait_http

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Engines of the fake vLLM: its /metrics and so the exporter's are large.
ENGINES = 64


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def child(target: str, port: int, *, cached: bool) -> None:
    """The sidecar, as shipped or with prometheus_client's app rendering every scrape."""
    if not cached:

        def uncached(registry: object, _generation: object, **_: object) -> object:
            return make_wsgi_app(registry)  # type: ignore[arg-type]

        app.CachedExposition = uncached  # type: ignore[assignment,attr-defined]
    settings = load_settings(
        {
            "target": target,
            "listen_address": "127.0.0.1",
            "port": port,
            "gpu_discovery": "none",
            "poll_interval_seconds": 5.0,
        }
    )
    asyncio.run(app.serve(settings))


def drive(url: str, scrapers: int, slow: int, seconds: float) -> dict[str, float]:
    """Scrape ``url`` from ``scrapers`` threads for ``seconds``; figures of the run."""
    times: list[float] = []
    failures = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def scrape(gzip: bool) -> None:
        headers = {"Accept-Encoding": "gzip" if gzip else "identity"}
        with httpx.Client(timeout=10.0, headers=headers) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    ok = client.get(url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    if ok:
                        times.append(time.monotonic() - started)
                    else:
                        failures[0] += 1

    base = url.removesuffix("/metrics")
    threads = [threading.Thread(target=scrape, args=(n % 2 == 0,)) for n in range(scrapers)]
    threads += [
        threading.Thread(target=read_metrics_slowly, args=(base, stop), kwargs={"pause_s": 0.01})
        for _ in range(slow)
    ]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(20)
    return {
        "scrapes_per_second": len(times) / seconds,
        "median_seconds": statistics.median(times) if times else float("nan"),
        "max_seconds": max(times, default=float("nan")),
        "failed": failures[0],
        "scrapes": len(times),
    }


def run(
    vllm: FakeVllm, *, cached: bool, scrapers: int, slow: int, seconds: float
) -> dict[str, float]:
    """One mode: start the sidecar, wait for its first poll, drive it, stop it."""
    port = free_port()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from benchmarks.scrapes import child; "
        "child(sys.argv[2], int(sys.argv[3]), cached=sys.argv[4] == 'cached')"
    )
    mode = "cached" if cached else "uncached"
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(ROOT), vllm.url, str(port), mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/-/ready", timeout=30, status=200)
        size = len(httpx.get(f"{url}/metrics", headers={"Accept-Encoding": "identity"}).content)
        before = cpu_seconds(process.pid)
        figures = drive(f"{url}/metrics", scrapers, slow, seconds)
        cpu = cpu_seconds(process.pid) - before
    finally:
        process.terminate()
        process.wait(10)
    figures["exporter_cpu_ms_per_scrape"] = 1000 * cpu / max(1, figures["scrapes"])
    figures["metrics_bytes"] = size
    return figures


def main() -> None:
    """Run both modes against one fake vLLM and print the figures and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--slow", type=int, default=4, help="slow readers beside them")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    with FakeVllm(state=VllmState(engines=ENGINES)) as vllm:
        results = {
            mode: run(
                vllm,
                cached=mode == "cached",
                scrapers=args.scrapers,
                slow=args.slow,
                seconds=args.seconds,
            )
            for mode in ("uncached", "cached")
        }
    print(
        f"{args.scrapers} scrapers and {args.slow} slow readers, {args.seconds:g} s per mode, "
        f"{ENGINES} engines ({results['cached']['metrics_bytes']:,} bytes of /metrics)"
    )
    for mode, figures in results.items():
        print(
            f"{mode:>9}: {figures['scrapes_per_second']:7.1f} scrapes/s, "
            f"median {1000 * figures['median_seconds']:6.1f} ms, "
            f"worst {1000 * figures['max_seconds']:7.1f} ms, "
            f"{figures['failed']} failed, "
            f"exporter CPU {figures['exporter_cpu_ms_per_scrape']:.2f} ms/scrape"
        )
    ratio = results["cached"]["scrapes_per_second"] / results["uncached"]["scrapes_per_second"]
    print(f"cached / uncached scrapes per second: {ratio:.1f}x")


if __name__ == "__main__":
    main()
