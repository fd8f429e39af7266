"""The real sidecar beside the real vLLM, its GPU memory from a fake dcgm-exporter (issue 26).

The machines that run this have no GPU: dcgm-exporter is the fake vLLM's HTTP server serving the
4.x answer of ``tests/fixtures/dcgm`` (a node of 8 GPUs, GPUs 2 and 5 mapped to this pod), and
the sidecar is started as the chart starts it with ``gpu.source: dcgm`` (``HEADROOM_GPU_SOURCE``,
``HEADROOM_DCGM_URL``, the pod's name and namespace from the downward API). What is real: vLLM
(its ``/metrics`` and ``gpu_memory_utilization``), the sidecar process and its settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.core.reasons import DcgmReason
from exporter.testing.fakevllm import FakeVllm
from exporter.testing.processes import Scrape, wait_until
from tests.dcgm import DCGM, GPU2, GPU5, V4_MAPPED, VLLM_POD
from tests.e2e.harness import VllmServer, loopback_client, start_sidecar

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.e2e

ANSWER = (DCGM / V4_MAPPED).read_bytes()
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def dcgm_exporter() -> Iterator[FakeVllm]:
    """dcgm-exporter's /metrics, as the node's exporter of 8 GPUs answers it."""
    with FakeVllm(payload=ANSWER) as server:
        yield server


@pytest.fixture(scope="module")
def scrape(vllm_server: VllmServer, dcgm_exporter: FakeVllm, e2e_logs: Path) -> Scrape:
    """The real sidecar's /metrics once it has read both vLLM and dcgm-exporter."""
    settings = {
        "HEADROOM_GPU_SOURCE": "dcgm",
        "HEADROOM_DCGM_URL": f"{dcgm_exporter.url}/metrics",
        "HEADROOM_POD_NAME": VLLM_POD.name,
        "HEADROOM_POD_NAMESPACE": VLLM_POD.namespace,
    }
    sidecar, url = start_sidecar(
        vllm_server.base_url,
        log_path=e2e_logs / "sidecar-dcgm.log",
        poll_interval_s=2,
        model=vllm_server.model_dir,
        settings=settings,
    )
    try:
        with loopback_client(url) as client:
            last: list[Scrape] = []

            def both_read() -> bool:
                try:
                    answer = client.get("/metrics", timeout=5.0)
                except httpx.TransportError:
                    return False
                last[:] = [Scrape(answer.text, 0.0)]
                return (
                    last[0].value("headroom_source_up", source="dcgm") == 1.0
                    and last[0].value("headroom_target_up") == 1.0
                )

            wait_until(both_read, timeout_s=60.0, what="the sidecar reading vLLM and dcgm")
            return last[0]
    finally:
        sidecar.stop()


def test_the_sidecar_reads_its_pods_two_gpus_of_eight_beside_the_real_vllm(
    scrape: Scrape,
) -> None:
    """GPUs 2 and 5 of the node, in bytes as from NVML; no per-process split from DCGM."""
    uuids = {dict(labels)["uuid"] for labels in scrape.series("headroom_gpu_memory_total_bytes")}
    assert uuids == {GPU2, GPU5}
    assert scrape.value("headroom_gpu_memory_total_bytes", gpu="2", uuid=GPU2) == 81_559 * MIB
    assert scrape.value("headroom_gpu_memory_free_bytes", gpu="5", uuid=GPU5) == 5_037 * MIB
    assert not scrape.series("headroom_gpu_memory_foreign_bytes")
    assert not scrape.series("headroom_gpu_memory_vllm_bytes")
    assert scrape.value("headroom_source_up", source="nvml") is None
    for reason in DcgmReason:
        assert scrape.value("headroom_source_errors_total", source="dcgm", reason=reason) == 0


def test_unexplained_memory_uses_the_real_vllms_memory_utilization(
    scrape: Scrape, vllm_server: VllmServer
) -> None:
    """Used beyond total x vLLM's own gpu_memory_utilization, read from its cache_config_info."""
    [info] = [
        dict(labels)
        for labels in Scrape(vllm_server.metrics_text(), 0.0).series("vllm:cache_config_info")
    ]
    utilization = float(info["gpu_memory_utilization"])
    unexplained = scrape.value("headroom_gpu_memory_unexplained_bytes", gpu="5", uuid=GPU5)
    assert unexplained == pytest.approx(76_053 * MIB - utilization * 81_090 * MIB, abs=MIB)
    # vLLM's own figures are read as without a GPU source: the target is up, the pool known.
    assert scrape.value("headroom_target_up") == 1.0
    assert scrape.series("headroom_kv_capacity_tokens")
