"""Starting, watching and stopping the exporter for tests, benchmarks and scripts.

Two ways to run it, one interface (``url``, :meth:`scrape`, :meth:`wait_for`, ``stop``):

- :class:`ExporterProcess` runs ``python -m exporter serve`` (the CLI a container runs) with
  ``HEADROOM_*`` variables, finds its URL in its ``listening`` log event, and gives what is
  needed to judge it from outside: its resource use (:meth:`ExporterProcess.stats`: file
  descriptors, threads, resident and peak memory) and every line it logged.
- :class:`ExporterThread` runs :func:`exporter.service.app.serve` in a thread of this process,
  with injected components (a recorded GPU, a fake NVML library), stopped like SIGTERM does it.

Plus the small helpers every harness needs: :func:`free_port` and :func:`wait_http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter.service.app import serve, server_url
from exporter.service.settings import load_settings

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from exporter.service.app import Components
    from exporter.service.httpserver import ExporterServer

T = TypeVar("T")

#: Settings every reliability run starts from: loopback, any free port, no GPU, JSON logs.
BASE_ENV: dict[str, str] = {
    "HEADROOM_LISTEN_ADDRESS": "127.0.0.1",
    "HEADROOM_PORT": "0",
    "HEADROOM_GPU_DISCOVERY": "none",
    "HEADROOM_LOG_FORMAT": "json",
}

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Stats:
    """Resources of a process at one moment (from ``/proc/<pid>``)."""

    fds: int
    threads: int
    rss_bytes: int
    peak_rss_bytes: int


def process_stats(pid: int) -> Stats:
    """File descriptors, threads, VmRSS and VmHWM of ``pid``."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    status: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    return Stats(
        fds=fds,
        threads=int(status["Threads"]),
        rss_bytes=int(status["VmRSS"].split()[0]) * 1024,
        peak_rss_bytes=int(status["VmHWM"].split()[0]) * 1024,
    )


class Scrape:
    """One parsed ``/metrics`` answer: samples by name and labels, and how long it took."""

    def __init__(self, text: str, seconds: float) -> None:
        self.text = text
        self.seconds = seconds
        self.samples: dict[str, dict[Labels, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                by_labels = self.samples.setdefault(sample.name, {})
                by_labels[frozenset(sample.labels.items())] = sample.value

    def value(self, name: str, **labels: str) -> float | None:
        """The sample ``name{labels}`` (exact label set), or ``None`` when absent."""
        return self.samples.get(name, {}).get(frozenset(labels.items()))

    def series(self, name: str) -> dict[Labels, float]:
        """Every series of ``name``."""
        return self.samples.get(name, {})

    def errors(self, source: str, reason: str) -> float:
        """``headroom_source_errors_total{source, reason}`` (0 when absent)."""
        return self.value("headroom_source_errors_total", source=source, reason=reason) or 0.0


class ExporterProcess:
    """``vllm-headroom serve`` in a subprocess, stopped (SIGTERM, then SIGKILL) on close.

    ``python`` is the interpreter (another environment's: a benchmark's earlier commit).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        prefix: Sequence[str] = (),
        cwd: Path | None = None,
        start_timeout: float = 20.0,
        wait_listening: bool = True,
        python: str = sys.executable,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="headroom-exporter-")
        workdir = cwd or Path(self._tmp.name)
        self.log_path = Path(self._tmp.name) / "stderr.log"
        self.out_path = Path(self._tmp.name) / "stdout.log"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_")}
        full_env = {**clean, **BASE_ENV, **env}
        self._stderr = self.log_path.open("wb")
        self._stdout = self.out_path.open("wb")
        self.proc = subprocess.Popen(  # noqa: S603 - our own CLI, by sys.executable or ``python``
            [*prefix, python, "-m", "exporter", "serve"],
            env=full_env,
            cwd=workdir,
            stdout=self._stdout,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
        )
        self.url = ""
        self.client = httpx.Client(timeout=10.0)
        if wait_listening:
            self._wait_listening(start_timeout)

    @property
    def pid(self) -> int:
        """The exporter's process id."""
        return self.proc.pid

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if event.get("event") == "listening":
                    self.url = str(event["url"])
                    return
            if self.proc.poll() is not None:
                msg = f"the exporter exited with {self.proc.returncode}: {self.log_text()}"
                raise RuntimeError(msg)
            time.sleep(0.02)
        msg = f"the exporter did not start listening within {timeout}s: {self.log_text()}"
        raise RuntimeError(msg)

    # -- logs -------------------------------------------------------------------------------

    def log_text(self) -> str:
        """Everything the exporter wrote to stderr and stdout so far."""
        return self.log_path.read_text(errors="replace") + self.out_path.read_text(errors="replace")

    def log_lines(self) -> list[str]:
        """Every complete stderr and stdout line so far."""
        return [line for line in self.log_text().splitlines() if line.strip()]

    def events(self) -> list[dict[str, object]]:
        """Every stderr line that is a JSON log event, parsed."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    found.append(event)
        return found

    def non_json_lines(self) -> list[str]:
        """Lines the exporter wrote that are not one JSON log event (tracebacks, noise)."""
        odd = []
        for line in self.log_lines():
            try:
                event = json.loads(line)
            except ValueError:
                odd.append(line)
                continue
            if not isinstance(event, dict) or "event" not in event:
                odd.append(line)
        return odd

    # -- HTTP -------------------------------------------------------------------------------

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """GET ``path`` on the exporter."""
        return self.client.get(f"{self.url}{path}", **kwargs)

    def scrape(self) -> Scrape:
        """GET /metrics (must answer 200) and parse it."""
        return _scrape(self.get)

    def wait_for(
        self, condition: Callable[[Scrape], bool], *, timeout: float = 20.0, every: float = 0.02
    ) -> tuple[Scrape, float]:
        """Scrape until ``condition`` holds; return the scrape and the seconds it took."""
        return _wait_for(self.scrape, condition, timeout=timeout, every=every)

    # -- resources --------------------------------------------------------------------------

    def stats(self) -> Stats:
        """The exporter's resources now."""
        return process_stats(self.pid)

    def settled_stats(self, baseline: Stats, *, timeout: float = 3.0) -> Stats:
        """Stats once fds and threads are back at ``baseline`` (or the last reading at timeout).

        Connection threads of the HTTP server end a moment after their answer is sent, and the
        HTTP client closes a failed connection when its poll finishes: give them that moment.
        """
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while time.monotonic() < deadline:
            if stats.fds <= baseline.fds and stats.threads <= baseline.threads:
                return stats
            time.sleep(0.05)
            stats = self.stats()
        return stats

    # -- stopping ---------------------------------------------------------------------------

    def terminate(self, *, timeout: float = 10.0) -> tuple[int, float]:
        """SIGTERM; return the exit code and the seconds until the process was gone."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        return code, time.monotonic() - started

    def close(self) -> None:
        """Stop the exporter if it runs; release files."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.client.close()
        self._stderr.close()
        self._stdout.close()
        self._tmp.cleanup()

    def stop(self) -> float:
        """Stop the exporter (as :meth:`close`); return how long it took."""
        begin = time.monotonic()
        self.close()
        return time.monotonic() - begin

    def __enter__(self) -> ExporterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reset_peak_rss(pid: int) -> None:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux ``clear_refs`` 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def quiet_stats(pid: int, *, samples: int = 5, every: float = 0.05) -> Stats:
    """The fewest fds and threads seen over a few readings: transient connection threads out."""
    readings = []
    for _ in range(samples):
        readings.append(process_stats(pid))
        time.sleep(every)
    return Stats(
        fds=min(r.fds for r in readings),
        threads=min(r.threads for r in readings),
        rss_bytes=min(r.rss_bytes for r in readings),
        peak_rss_bytes=max(r.peak_rss_bytes for r in readings),
    )


class ExporterThread:
    """The exporter's ``serve()`` in a thread of this process, with injected components.

    For faults that only a seam can inject (a fake NVML library, a recorded GPU). Stopped like
    SIGTERM does it: by setting the stop event on its loop.
    """

    def __init__(
        self, overrides: Mapping[str, object], *, components: Components | None = None
    ) -> None:
        self.settings = load_settings({"listen_address": "127.0.0.1", "port": 0, **overrides})
        self.components = components
        started = threading.Event()
        self.url = ""
        self.exit_code: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

        def run() -> None:
            async def main() -> int:
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()

                def on_start(server: ExporterServer) -> None:
                    self.url = server_url(server)
                    started.set()

                return await serve(
                    self.settings, components=components, started=on_start, stop=self._stop
                )

            self.exit_code = asyncio.run(main())

        self._thread = threading.Thread(target=run, name="exporter", daemon=True)
        self._thread.start()
        if not started.wait(20):
            msg = "the in-process exporter did not start"
            raise RuntimeError(msg)
        self.client = httpx.Client(timeout=10.0)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """GET ``path`` on the exporter."""
        return self.client.get(f"{self.url}{path}", **kwargs)

    def scrape(self) -> Scrape:
        """GET /metrics (must answer 200) and parse it."""
        return _scrape(self.get)

    def wait_for(
        self, condition: Callable[[Scrape], bool], *, timeout: float = 20.0, every: float = 0.02
    ) -> tuple[Scrape, float]:
        """Scrape until ``condition`` holds; return the scrape and the seconds it took."""
        return _wait_for(self.scrape, condition, timeout=timeout, every=every)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until ``/-/ready`` answers 200 (the first poll of vLLM succeeded)."""
        wait_http(f"{self.url}/-/ready", timeout=timeout, status=200)

    def stop(self) -> float:
        """Stop the exporter (once; later calls do nothing); return how long it took."""
        begin = time.monotonic()
        if self._thread.is_alive() and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.client.close()
        return time.monotonic() - begin

    def __enter__(self) -> ExporterThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until(
    probe: Callable[[], T],
    *,
    timeout_s: float = 20.0,
    what: str = "the condition",
    interval_s: float = 0.25,
) -> T:
    """Call ``probe`` until it returns a truthy value (a non-empty list, True...); return that.

    For tests that must wait on a state rather than sleep for it: a busy machine takes longer
    than any sleep chosen on a quiet one. Raises TimeoutError naming ``what`` after
    ``timeout_s``; exceptions from ``probe`` propagate.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout_s:g}s waiting for {what}"
            raise TimeoutError(msg)
        time.sleep(interval_s)


def wait_http(url: str, *, timeout: float = 20.0, status: int | None = None) -> httpx.Response:
    """Wait until ``url`` answers (with ``status``, if given); raise RuntimeError at timeout."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=1.0)
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        else:
            if status is None or response.status_code == status:
                return response
            last = f"HTTP {response.status_code}"
        time.sleep(0.05)
    msg = f"{url} did not answer within {timeout:g}s ({last})"
    raise RuntimeError(msg)


def _scrape(get: Callable[[str], httpx.Response]) -> Scrape:
    started = time.perf_counter()
    response = get("/metrics")
    took = time.perf_counter() - started
    if response.status_code != 200:
        msg = f"/metrics answered {response.status_code}: {response.text[:200]}"
        raise AssertionError(msg)
    return Scrape(response.text, took)


def _wait_for(
    scrape: Callable[[], Scrape],
    condition: Callable[[Scrape], bool],
    *,
    timeout: float,
    every: float,
) -> tuple[Scrape, float]:
    started = time.monotonic()
    deadline = started + timeout
    last: Scrape | None = None
    while time.monotonic() < deadline:
        last = scrape()
        if condition(last):
            return last, time.monotonic() - started
        time.sleep(every)
    shown = last.text[-3000:] if last else "no scrape"
    msg = f"condition not met within {timeout}s; last /metrics tail:\n{shown}"
    raise AssertionError(msg)


def read_metrics_slowly(url: str, stop: threading.Event, *, pause_s: float) -> None:
    """Ask ``url``'s /metrics again and again, reading each answer 4 KiB every ``pause_s``.

    A scraper on a slow link, until ``stop`` is set (shared by the slow-reader reliability test
    and benchmarks/scrapes.py).
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    while not stop.is_set():
        try:
            with socket.create_connection((host, int(port)), timeout=15) as conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                while not stop.is_set() and conn.recv(4096):
                    time.sleep(pause_s)
        except OSError:
            stop.wait(0.1)
