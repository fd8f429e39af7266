"""Specification of the exporter harnesses: free ports, waiting for servers, thread and process."""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

from exporter.testing.fakevllm import FakeVllm, Fault
from exporter.testing.processes import ExporterProcess, ExporterThread, free_port, wait_http

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    """A fake vLLM on a free loopback port, rendering its default state."""
    with FakeVllm() as server:
        yield server


def test_free_port_gives_a_port_that_can_be_bound() -> None:
    """The port free_port returns is an unprivileged one that a new socket can bind."""
    port = free_port()
    assert 1024 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_wait_http_returns_once_the_server_answers(fake: FakeVllm) -> None:
    """wait_http keeps trying a refusing server and returns its first answer once it listens."""
    fake.set_fault(Fault.REFUSE)
    timer = threading.Timer(0.3, fake.set_fault, args=(Fault.NONE,))
    timer.start()
    try:
        response = wait_http(f"{fake.url}/version", timeout=10)
    finally:
        timer.join()
    assert response.status_code == 200
    assert response.json() == {"version": "0.32.0"}


def test_wait_http_raises_naming_the_url_when_nothing_answers() -> None:
    """With nothing listening, wait_http gives up after its timeout with the URL in the error."""
    url = f"http://127.0.0.1:{free_port()}/-/ready"
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=re.escape(url)):
        wait_http(url, timeout=0.3)
    assert time.monotonic() - started < 5


def test_wait_http_waits_for_the_status_asked_for(fake: FakeVllm) -> None:
    """An answer with another status than the one asked for is not enough: the error names it."""
    fake.set_fault(Fault.MODELS_DOWN)
    with pytest.raises(RuntimeError, match="HTTP 503"):
        wait_http(f"{fake.url}/v1/models", timeout=0.3, status=200)


def test_the_exporter_thread_polls_the_fake_vllm_and_stops(fake: FakeVllm) -> None:
    """ExporterThread serves in this process: ready, target up on /metrics, stopped in seconds."""
    exporter = ExporterThread(
        {
            "target": fake.url,
            "poll_interval_seconds": 0.2,
            "poll_timeout_seconds": 0.2,
            "gpu_discovery": "none",
        }
    )
    try:
        exporter.wait_ready()
        scrape = exporter.scrape()
    finally:
        took = exporter.stop()
    assert scrape.value("headroom_target_up") == 1
    assert fake.counts.requests["/metrics"] >= 1
    assert took < 5
    assert exporter.exit_code == 0


def test_stopping_the_exporter_thread_twice_is_harmless(fake: FakeVllm) -> None:
    """stop() inside a with-block, then the block's own stop(), end the exporter once, quietly."""
    overrides = {"target": fake.url, "gpu_discovery": "none"}
    with ExporterThread(overrides) as exporter:
        exporter.stop()
    assert exporter.exit_code == 0


def test_the_exporter_process_answers_and_exits_0_on_sigterm(fake: FakeVllm) -> None:
    """ExporterProcess runs `python -m exporter serve`: /-/healthy answers, SIGTERM exits 0."""
    with ExporterProcess({"HEADROOM_TARGET": fake.url}) as exporter:
        assert exporter.get("/-/healthy").status_code == 200
        code, took = exporter.terminate()
    assert code == 0
    assert took < 10
