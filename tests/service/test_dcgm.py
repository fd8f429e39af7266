"""Specification of reading the node's dcgm-exporter: bounded, every failure one line.

The answers are those of ``tests/fixtures/dcgm`` (README there); what they mean is specified in
``tests/gpu/test_dcgm.py``.
"""

from __future__ import annotations

import time

import httpx
import pytest

from exporter.core.reasons import DcgmReason
from exporter.errors import SourceError
from exporter.service.dcgm import DcgmFetcher, DcgmGpuSource
from exporter.testing.fakevllm import FakeVllm, Fault
from tests import paths
from tests.dcgm import DCGM, V4_MAPPED, VLLM_POD


def fetch_failure(fetcher: DcgmFetcher) -> str:
    """The reason a fetch fails with."""
    with pytest.raises(SourceError) as caught:
        fetcher()
    return caught.value.reason


def test_the_fetcher_reads_an_answer_over_a_real_socket() -> None:
    """A server answering a fixture: the bytes come back as served."""
    payload = (DCGM / V4_MAPPED).read_bytes()
    with FakeVllm(payload=payload) as fake:
        fetcher = DcgmFetcher(f"{fake.url}/metrics", timeout_s=2.0)
        try:
            assert fetcher() == payload
        finally:
            fetcher.close()


def test_an_unreachable_endpoint_is_connection_refused_in_one_line() -> None:
    """Nothing listens: connection_refused, the line naming the URL."""
    with FakeVllm() as fake:
        url = f"{fake.url}/metrics"
    source = DcgmGpuSource.from_settings(
        url, gpus=(), pod=VLLM_POD, proc_root=paths.PROC, timeout_s=1.0
    )
    try:
        views, failure = source.read(0.9)
    finally:
        source.close()
    assert views == ()
    assert failure is not None
    assert failure.reason == DcgmReason.CONNECTION_REFUSED
    assert url in str(failure)


@pytest.mark.parametrize("fault", [Fault.HANG, Fault.SLOW])
def test_a_slow_endpoint_is_a_timeout_within_the_deadline(fault: Fault) -> None:
    """One that never answers, or drips a byte at a time: timeout, soon after timeout_s."""
    with FakeVllm(payload=(DCGM / V4_MAPPED).read_bytes()) as fake:
        fake.set_fault(fault)
        fetcher = DcgmFetcher(f"{fake.url}/metrics", timeout_s=0.3)
        started = time.monotonic()
        try:
            assert fetch_failure(fetcher) == DcgmReason.TIMEOUT
        finally:
            fetcher.close()
            fake.set_fault(Fault.NONE)
    assert time.monotonic() - started < 2.0


def test_a_huge_answer_stops_being_read_at_the_limit() -> None:
    """The fake's 200 MB answer: too_large after max_bytes, not 200 MB later."""
    with FakeVllm() as fake:
        fake.set_fault(Fault.HUGE)
        fetcher = DcgmFetcher(f"{fake.url}/metrics", timeout_s=5.0, max_bytes=1 << 20)
        try:
            assert fetch_failure(fetcher) == DcgmReason.TOO_LARGE
        finally:
            fetcher.close()
            fake.set_fault(Fault.NONE)


@pytest.mark.parametrize(
    ("status", "reason"),
    [(302, "http_3xx"), (401, "http_401"), (404, "http_404"), (503, "http_5xx")],
)
def test_a_status_other_than_200_is_its_bounded_reason(status: int, reason: str) -> None:
    """Statuses map as for vLLM's endpoint; a redirect is not followed."""
    transport = httpx.MockTransport(
        lambda _r: httpx.Response(status, headers={"location": "http://elsewhere/"})
    )
    fetcher = DcgmFetcher("http://10.0.0.7:9400/metrics", timeout_s=1.0, transport=transport)
    assert fetch_failure(fetcher) == reason


def test_a_password_in_the_url_is_never_in_the_error_line() -> None:
    """An error names the URL without its credentials."""
    transport = httpx.MockTransport(lambda _r: httpx.Response(500))
    fetcher = DcgmFetcher(
        "http://user:s3cret@10.0.0.7:9400/metrics", timeout_s=1.0, transport=transport
    )
    with pytest.raises(SourceError) as caught:
        fetcher()
    assert "s3cret" not in str(caught.value)
