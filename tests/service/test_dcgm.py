"""Specification of reading the node's dcgm-exporter: bounded, every failure one line.

Fleet mode shares each node's answer between the targets of that node, and picks each
target's GPUs from it as the sidecar picks its own.

The answers are those of ``tests/fixtures/dcgm`` (README there); what they mean is specified in
``tests/gpu/test_dcgm.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.core.reasons import DcgmReason
from exporter.errors import SourceError
from exporter.gpu.dcgm import PodIdentity
from exporter.service.allowlist import parse_endpoint
from exporter.service.dcgm import (
    DcgmFetcher,
    DcgmGpuSource,
    DcgmRequest,
    FleetDcgmSource,
    SharedDcgmAnswers,
    answer_bytes,
    parse_dcgm_metrics,
)
from exporter.testing.fakevllm import FakeVllm, Fault
from tests import paths
from tests.dcgm import DCGM, EMBED_POD, GPU0, GPU2, GPU5, V3_UNMAPPED, V4_MAPPED, VLLM_POD

if TYPE_CHECKING:
    from collections.abc import Callable


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


# --- fleet mode: one answer per node, shared by its targets -------------------------------------

NODE_URL = "http://10.0.3.7:9400/metrics"


class Fetch:
    """The injected read of a dcgm-exporter: a fixture's bytes (or a failure), every URL noted.

    With ``gate`` set, each read waits for it (to hold a read in flight).
    """

    def __init__(self, payload: bytes | SourceError, gate: asyncio.Event | None = None) -> None:
        self.payload = payload
        self.gate = gate
        self.urls: list[str] = []

    async def __call__(self, url: str) -> bytes:
        self.urls.append(url)
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.payload, SourceError):
            raise self.payload
        return self.payload


def shared(
    fetch: Fetch, clock: Callable[[], float] = time.monotonic, max_entries: int = 10
) -> SharedDcgmAnswers:
    """Shared answers over ``fetch``, held 5 s, for 10 URLs unless said otherwise."""
    return SharedDcgmAnswers(fetch, max_age_seconds=5.0, max_entries=max_entries, clock=clock)


def request(pod: PodIdentity = VLLM_POD, url: str = NODE_URL) -> DcgmRequest:
    """A probe's GPU parameters: the node's dcgm-exporter and a pod."""
    return DcgmRequest(parse_endpoint(url), pod)


def test_targets_of_one_node_share_one_read_per_poll_interval() -> None:
    """Two pods' refreshes within max_age read once; past it, once more; each sees its GPUs."""
    now = [100.0]
    fetch = Fetch((DCGM / V4_MAPPED).read_bytes())
    answers = shared(fetch, clock=lambda: now[0])
    vllm, embed = FleetDcgmSource(answers, request()), FleetDcgmSource(answers, request(EMBED_POD))

    async def go() -> None:
        await answers.refresh(NODE_URL)
        now[0] += 4.9
        await answers.refresh(NODE_URL)
        assert fetch.urls == [NODE_URL]
        now[0] += 0.1
        await answers.refresh(NODE_URL)
        assert fetch.urls == [NODE_URL, NODE_URL]

    asyncio.run(go())
    vllm_views, vllm_failure = vllm.read(0.9)
    embed_views, embed_failure = embed.read(0.9)
    assert (vllm_failure, embed_failure) == (None, None)
    assert sorted(v.uuid for v in vllm_views) == sorted([GPU2, GPU5])
    assert [v.uuid for v in embed_views] == [GPU0]


def test_probes_asking_while_a_read_runs_share_it() -> None:
    """Ten refreshes at once, the read held in flight: one read, all of them answered."""

    async def go() -> Fetch:
        fetch = Fetch((DCGM / V4_MAPPED).read_bytes(), gate=asyncio.Event())
        answers = shared(fetch)
        waiting = [asyncio.create_task(answers.refresh(NODE_URL)) for _ in range(10)]
        await asyncio.sleep(0)
        assert fetch.gate is not None
        fetch.gate.set()
        await asyncio.gather(*waiting)
        assert answers.latest(NODE_URL) is not None
        return fetch

    assert asyncio.run(go()).urls == [NODE_URL]


def test_a_failed_read_is_held_like_an_answer_and_names_the_exporter() -> None:
    """A refused connection is read once per interval; every target reads its reason and URL."""
    fetch = Fetch(SourceError(DcgmReason.CONNECTION_REFUSED, "GET /metrics: connection failed"))
    answers = shared(fetch)

    async def go() -> None:
        for _ in range(3):
            await answers.refresh(NODE_URL)

    asyncio.run(go())
    assert len(fetch.urls) == 1
    views, failure = FleetDcgmSource(answers, request()).read(0.9)
    assert views == ()
    assert failure is not None
    assert failure.reason == DcgmReason.CONNECTION_REFUSED
    assert NODE_URL in str(failure)


def test_an_answer_that_is_not_dcgm_exporter_is_its_reason_for_every_target() -> None:
    """vLLM's own /metrics at the dcgm URL: not_dcgm, as in the sidecar."""
    answers = shared(Fetch(b"vllm:num_requests_running 1\n"))
    asyncio.run(answers.refresh(NODE_URL))
    _, failure = FleetDcgmSource(answers, request()).read(0.9)
    assert failure is not None
    assert failure.reason == DcgmReason.NOT_DCGM


def test_a_target_named_without_gpu_parameters_reads_as_not_given_in_one_line() -> None:
    """No dcgm=/pod=/namespace=: no GPU figures, the reason not_given, the fix in the line."""
    views, failure = FleetDcgmSource(shared(Fetch(b"")), None).read(0.9)
    assert views == ()
    assert failure is not None
    assert failure.reason == DcgmReason.NOT_GIVEN
    assert "dcgm=" in str(failure)
    assert "\n" not in str(failure)


def test_before_the_first_answer_a_target_reads_as_a_timeout() -> None:
    """A read that has not ended yet (the probe's time ran out): timeout, not figures of 0."""
    _, failure = FleetDcgmSource(shared(Fetch(b"")), request()).read(0.9)
    assert failure is not None
    assert failure.reason == DcgmReason.TIMEOUT


def test_a_pod_the_exporter_does_not_map_is_pod_not_found() -> None:
    """Another node's dcgm-exporter named for the pod: pod_not_found, no GPU of other pods.

    The line tells to fix the probe's dcgm=, not the sidecar's settings.
    """
    answers = shared(Fetch((DCGM / V4_MAPPED).read_bytes()))
    asyncio.run(answers.refresh(NODE_URL))
    stranger = PodIdentity("llama-70b-5c8d-zzzzz", "inference")
    views, failure = FleetDcgmSource(answers, request(stranger)).read(0.9)
    assert views == ()
    assert failure is not None
    assert failure.reason == DcgmReason.POD_NOT_FOUND
    assert "pod inference/llama-70b-5c8d-zzzzz" in str(failure)
    assert "the probe's dcgm= must be the dcgm-exporter of the pod's node" in str(failure)
    assert "gpus setting" not in str(failure)
    assert "dcgm_url" not in str(failure)


def test_an_exporter_without_pod_mapping_tells_the_fleet_to_enable_it() -> None:
    """no_pod_mapping, as in the sidecar, without the sidecar's gpus setting as a way out."""
    answers = shared(Fetch((DCGM / V3_UNMAPPED).read_bytes()))
    asyncio.run(answers.refresh(NODE_URL))
    _, failure = FleetDcgmSource(answers, request()).read(0.9)
    assert failure is not None
    assert failure.reason == DcgmReason.NO_POD_MAPPING
    assert "enable its Kubernetes pod mapping" in str(failure)
    assert "gpus setting" not in str(failure)


def test_answers_are_bounded_and_forgotten_with_their_targets() -> None:
    """At most max_entries URLs (the oldest read goes first); retain keeps only those named."""
    answers = shared(Fetch((DCGM / V4_MAPPED).read_bytes()), max_entries=2)
    urls = [f"http://10.0.3.{n}:9400/metrics" for n in (1, 2, 3)]

    async def go() -> None:
        for url in urls:
            await answers.refresh(url)

    asyncio.run(go())
    assert [answers.latest(u) is not None for u in urls] == [False, True, True]
    answers.retain({urls[2]})
    assert len(answers) == 1
    assert answers.latest(urls[1]) is None


def test_the_answers_held_are_bounded_in_bytes_the_oldest_forgotten_first() -> None:
    """Room for two answers of the fixture's size: a third read forgets the oldest."""
    payload = (DCGM / V4_MAPPED).read_bytes()
    one = answer_bytes(parse_dcgm_metrics(payload))
    answers = SharedDcgmAnswers(
        Fetch(payload), max_age_seconds=5.0, max_entries=10, max_bytes=2 * one + one // 2
    )
    urls = [f"http://10.0.3.{n}:9400/metrics" for n in (1, 2, 3)]

    async def go() -> None:
        for url in urls:
            await answers.refresh(url)

    asyncio.run(go())
    assert [answers.latest(u) is not None for u in urls] == [False, True, True]
    assert answers.held_bytes == 2 * one


def test_an_answer_too_big_to_hold_is_too_large_and_holds_nothing_of_it() -> None:
    """64 GPUs with 4 KB model names: counted past the bound, it is too_large, not held."""
    lines = [
        f'{field}{{gpu="{n}",UUID="GPU-{n}",modelName="{"f" * 4096}{n}",pod="p",namespace="n"}} 1'
        for n in range(64)
        for field in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
    ]
    answers = SharedDcgmAnswers(
        Fetch("\n".join(lines).encode() + b"\n"),
        max_age_seconds=5.0,
        max_entries=10,
        max_bytes=64 * 1024,
    )
    asyncio.run(answers.refresh(NODE_URL))
    _, failure = FleetDcgmSource(answers, request()).read(0.9)
    assert failure is not None
    assert failure.reason == DcgmReason.TOO_LARGE
    assert answers.held_bytes < 2048
