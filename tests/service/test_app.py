"""Specification of the running exporter over real HTTP: endpoints, readiness, shutdown."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.reasons import AnswerRefusal
from exporter.errors import SourceError
from exporter.service.app import fleet_dcgm_answers, response_memory_bytes, window_memory_bytes
from exporter.service.settings import Settings
from exporter.testing.fakevllm import FakeVllm
from exporter.testing.processes import ExporterThread, wait_until
from exporter.vllm.client import ResponseBudget, Route, routed
from tests.dcgm import DCGM, GPU0, GPU2, GPU5, V4_MAPPED, VLLM_POD

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def sidecar(static_vllm: FakeVllm) -> Iterator[ExporterThread]:
    """The exporter in sidecar mode watching the static vLLM, polling every 0.2 s."""
    running = ExporterThread(
        {"target": static_vllm.url, "poll_interval_seconds": 0.2, "poll_timeout_seconds": 0.2}
    )
    try:
        yield running
    finally:
        running.stop()


def families(text: str) -> dict[str, str]:
    """Exposed family name -> type."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_metrics_carry_derived_gauges_of_the_target(sidecar: ExporterThread) -> None:
    """/metrics serves capacity, usage and health of the watched vLLM."""
    sidecar.wait_ready()
    response = httpx.get(f"{sidecar.url}/metrics")
    assert response.status_code == 200
    text = response.text
    assert 'headroom_kv_capacity_tokens{engine="0",model_name="tiny"} 1024.0' in text
    assert "headroom_target_up 1.0" in text
    assert 'headroom_collector_success{collector="target"} 1.0' in text
    found = families(text)
    assert found["headroom_source_errors"] == "counter"
    assert found["headroom_build_info"] == "gauge"  # info metrics are gauges in text 0.0.4
    assert "process_resident_memory_bytes" in found


def test_readiness_waits_for_the_first_successful_poll(static_vllm: FakeVllm) -> None:
    """/-/ready is 503 while the target never answered, /-/healthy is 200 all along."""
    running = ExporterThread(
        {"target": "http://127.0.0.1:9", "poll_interval_seconds": 0.2, "poll_timeout_seconds": 0.2}
    )
    try:
        running.wait_for(lambda s: bool(s.series("headroom_target_up")))  # the first poll is in
        ready = httpx.get(f"{running.url}/-/ready")
        assert ready.status_code == 503
        assert "has not succeeded" in ready.text
        assert httpx.get(f"{running.url}/-/healthy").status_code == 200
        metrics = httpx.get(f"{running.url}/metrics").text
        assert "headroom_target_up 0.0" in metrics
        assert 'reason="connection_refused"' in metrics
    finally:
        running.stop()


def test_the_landing_page_links_the_endpoints(sidecar: ExporterThread) -> None:
    """/ is an HTML page linking /metrics and the health endpoints."""
    page = httpx.get(f"{sidecar.url}/").text
    for link in ("/metrics", "/-/healthy", "/-/ready"):
        assert f'href="{link}"' in page


def test_unknown_paths_and_methods_are_refused_cleanly(sidecar: ExporterThread) -> None:
    """A wrong path is 404 and a POST is 405, never a traceback."""
    assert httpx.get(f"{sidecar.url}/nope").status_code == 404
    assert httpx.post(f"{sidecar.url}/metrics").status_code == 405
    assert httpx.get(f"{sidecar.url}/probe?target=x").status_code == 404


def test_stop_is_clean_and_quick(static_vllm: FakeVllm) -> None:
    """Stopping the exporter (what SIGTERM does) ends it within a second with exit code 0."""
    running = ExporterThread({"target": static_vllm.url, "poll_interval_seconds": 5})
    running.wait_ready()
    took = running.stop()
    assert took < 1.0
    assert running.exit_code == 0


def test_fleet_mode_probes_allowed_targets_and_refuses_others(static_vllm: FakeVllm) -> None:
    """/probe serves an allowed target's gauges and answers 403 for one outside the list."""
    running = ExporterThread({"mode": "fleet", "probe_allowlist": "127.0.0.0/8"})
    try:
        allowed = httpx.get(f"{running.url}/probe", params={"target": static_vllm.url})
        assert allowed.status_code == 200
        assert 'headroom_kv_capacity_tokens{engine="0",model_name="tiny"} 1024.0' in allowed.text
        denied = httpx.get(f"{running.url}/probe", params={"target": "http://10.1.1.1:8000"})
        assert denied.status_code == 403
        metadata = httpx.get(f"{running.url}/probe", params={"target": "169.254.169.254"})
        assert metadata.status_code == 403
        own = httpx.get(f"{running.url}/metrics").text
        assert 'headroom_probe_requests_total{outcome="ok"} 1.0' in own
        assert 'headroom_probe_requests_total{outcome="denied_not_in_allowlist"} 1.0' in own
        assert 'headroom_probe_requests_total{outcome="denied_forbidden_address"} 1.0' in own
        assert "headroom_kv_capacity_tokens" not in own
        for reason in AnswerRefusal:  # exposed from 0
            assert f'headroom_probe_response_budget_refusals_total{{reason="{reason}"}} 0.0' in own
    finally:
        running.stop()


def test_fleet_mode_keeps_no_connection_to_a_target_after_its_probe(
    static_vllm: FakeVllm,
) -> None:
    """A blackbox prober's pool: each probe connects, reads and closes; nothing idles in it."""
    running = ExporterThread({"mode": "fleet", "probe_allowlist": "127.0.0.0/8"})
    try:
        for _ in range(3):
            answer = httpx.get(f"{running.url}/probe", params={"target": static_vllm.url})
            assert answer.status_code == 200
            wait_until(lambda: static_vllm.open_connections == 0, timeout_s=5.0)
        assert static_vllm.counts.requests["/metrics"] == 3
        # One connection a request (the first probe also reads /v1/models and /version).
        assert static_vllm.counts.connections == sum(static_vllm.counts.requests.values())
    finally:
        running.stop()


def test_the_sidecar_keeps_its_connection_to_vllm_alive_between_polls(
    sidecar: ExporterThread, static_vllm: FakeVllm
) -> None:
    """One target, polled every interval: one connection carries the polls."""
    sidecar.wait_ready()
    wait_until(lambda: static_vllm.counts.requests.get("/metrics", 0) >= 4, timeout_s=10.0)
    assert static_vllm.counts.connections == 1
    assert static_vllm.open_connections == 1


@pytest.mark.parametrize("limit_mib", [32, 256, 4096])
def test_the_answers_and_the_windows_each_get_a_quarter_of_the_memory_limit(
    limit_mib: int,
) -> None:
    """Whatever the limit, the answers read at once and all the windows hold half of it."""
    settings = Settings(memory_limit_bytes=limit_mib * 2**20)
    assert response_memory_bytes(settings) == limit_mib * 2**20 // 4
    assert window_memory_bytes(settings) == limit_mib * 2**20 // 4


def test_the_sidecar_renders_metrics_once_per_poll(static_vllm: FakeVllm) -> None:
    """Scrapes between two polls get the same bytes (the collector's timings included)."""
    running = ExporterThread({"target": static_vllm.url, "poll_interval_seconds": 60.0})
    try:
        deadline = time.monotonic() + 10
        while httpx.get(f"{running.url}/-/ready").status_code != 200:  # the first poll is in
            assert time.monotonic() < deadline
            time.sleep(0.05)
        identity = {"Accept-Encoding": "identity"}
        first = httpx.get(f"{running.url}/metrics", headers=identity).content
        assert b"headroom_collector_duration_seconds" in first
        assert all(
            httpx.get(f"{running.url}/metrics", headers=identity).content == first for _ in range(5)
        )
    finally:
        running.stop()


def test_fleet_mode_reads_each_targets_gpus_from_the_dcgm_exporter_its_probe_names(
    static_vllm: FakeVllm,
) -> None:
    """gpu_source=dcgm in fleet mode, over real sockets: the pod's GPUs, one read, no token.

    The token is bound to 127.0.0.0/8, which holds the dcgm-exporter too: vLLM gets it, the
    dcgm-exporter never. A probe without the parameters reads as not_given; a dcgm URL outside
    the allowlist is refused.
    """
    settings = {
        "mode": "fleet",
        "probe_allowlist": "127.0.0.0/8",
        "gpu_source": "dcgm",
        "bearer_token": "s3cret",
        "bearer_token_targets": "127.0.0.0/8",
        "poll_interval_seconds": 60.0,
    }
    with FakeVllm(payload=(DCGM / V4_MAPPED).read_bytes()) as dcgm:
        running = ExporterThread(settings)
        try:
            params = {
                "target": static_vllm.url,
                "dcgm": f"{dcgm.url}/metrics",
                "pod": VLLM_POD.name,
                "namespace": VLLM_POD.namespace,
            }
            first = httpx.get(f"{running.url}/probe", params=params)
            again = httpx.get(f"{running.url}/probe", params=params)
            bare = httpx.get(f"{running.url}/probe", params={"target": static_vllm.url})
            outside = httpx.get(
                f"{running.url}/probe", params={**params, "dcgm": "http://10.9.9.9:9400/metrics"}
            )
        finally:
            running.stop()
    for answer in (first, again):
        assert answer.status_code == 200
        assert 'headroom_source_up{source="dcgm"} 1.0' in answer.text
        assert f'uuid="{GPU2}"' in answer.text
        assert f'uuid="{GPU5}"' in answer.text
        assert f'uuid="{GPU0}"' not in answer.text  # another pod's GPU on that node
    assert dcgm.counts.requests == {"/metrics": 1}
    assert dcgm.counts.authorizations == set()
    assert static_vllm.counts.authorizations == {"Bearer s3cret"}
    assert bare.status_code == 200
    assert 'headroom_source_errors_total{reason="not_given",source="dcgm"} 1.0' in bare.text
    assert "headroom_gpu_memory_total_bytes{" not in bare.text
    assert outside.status_code == 403
    assert outside.text == "The dcgm URL not allowed (not in allowlist).\n"


def test_a_dcgm_answer_is_read_pinned_and_within_the_fleets_answer_budget() -> None:
    """The fleet's read of a dcgm-exporter holds its bytes in the shared answer budget.

    With a budget smaller than the answer, the read is refused over its share and counted,
    as a vLLM answer would be; with room, it is read at the checked address only.
    """
    settings = Settings(mode="fleet", gpu_source="dcgm")
    payload = (DCGM / V4_MAPPED).read_bytes()

    async def read(budget: ResponseBudget, url: str) -> object:
        async with httpx.AsyncClient(trust_env=False) as http:
            answers = fleet_dcgm_answers(settings, http, budget)
            assert answers is not None
            with routed(Route(addresses=(ipaddress.ip_address("127.0.0.1"),), send_token=False)):
                await answers.refresh(url)
            return answers.latest(url)

    with FakeVllm(payload=payload) as dcgm:
        # A name: the route, not a lookup of it, says where to connect.
        url = f"http://dcgm.invalid:{dcgm.port}/metrics"
        small = ResponseBudget(len(payload) // 2)
        refused = asyncio.run(read(small, url))
        assert isinstance(refused, SourceError)
        assert refused.reason == "too_large"
        assert small.refusals[AnswerRefusal.OVER_SHARE] == 1
        roomy = ResponseBudget(len(payload) * 2)
        assert not isinstance(asyncio.run(read(roomy, url)), SourceError)
        assert roomy.in_use == 0  # given back once parsed
