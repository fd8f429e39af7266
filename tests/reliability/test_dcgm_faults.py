"""The real sidecar reading GPU memory from a fake dcgm-exporter beside a fake vLLM.

The fake dcgm-exporter serves ``tests/fixtures/dcgm``'s 4.x answer of a node of 8 GPUs, 2 of them
this pod's (GPUs 2 and 5); the exporter runs in-process with ``gpu_source=dcgm`` wired by its
own settings (no seam replaced), as the chart wires it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.core.reasons import DcgmReason
from exporter.testing.fakevllm import FakeVllm, Fault
from exporter.testing.processes import ExporterThread, Scrape
from tests.dcgm import DCGM, GPU2, GPU5, V4_MAPPED, VLLM_POD

if TYPE_CHECKING:
    from collections.abc import Iterator

ANSWER = (DCGM / V4_MAPPED).read_bytes()
MIB = 1024 * 1024


@pytest.fixture
def dcgm() -> Iterator[FakeVllm]:
    """A server answering dcgm-exporter's /metrics (the fake vLLM's server, another payload)."""
    with FakeVllm(payload=ANSWER) as server:
        yield server


@pytest.fixture
def sidecar(fake_vllm: FakeVllm, dcgm: FakeVllm) -> Iterator[ExporterThread]:
    """The exporter with gpu_source=dcgm, as the chart configures it, for pod llama-70b-…."""
    exporter = ExporterThread(
        {
            "target": fake_vllm.url,
            "poll_interval_seconds": 0.3,
            "poll_timeout_seconds": 0.3,
            "gpu_source": "dcgm",
            "dcgm_url": f"{dcgm.url}/metrics",
            "pod_name": VLLM_POD.name,
            "pod_namespace": VLLM_POD.namespace,
            "gpu_discovery": "none",
        }
    )
    try:
        yield exporter
    finally:
        dcgm.set_fault(Fault.NONE)
        assert exporter.stop() < 2.0


def dcgm_up(scrape: Scrape) -> bool:
    """The dcgm source up with its GPUs exposed."""
    return scrape.value("headroom_source_up", source="dcgm") == 1.0 and bool(
        scrape.series("headroom_gpu_memory_total_bytes")
    )


def test_the_sidecar_exposes_its_pods_two_gpus_of_eight_from_dcgm(
    sidecar: ExporterThread, fake_vllm: FakeVllm
) -> None:
    """Two GPUs, NVML's gauges and units, no per-process split, every dcgm reason from 0."""
    scrape, _ = sidecar.wait_for(dcgm_up)
    uuids = {labels["uuid"] for labels in _labels(scrape, "headroom_gpu_memory_total_bytes")}
    assert uuids == {GPU2, GPU5}
    assert scrape.value("headroom_gpu_memory_total_bytes", gpu="2", uuid=GPU2) == 81_559 * MIB
    assert scrape.value("headroom_gpu_memory_free_bytes", gpu="5", uuid=GPU5) == 5_037 * MIB
    assert not scrape.series("headroom_gpu_memory_foreign_bytes")
    assert not scrape.series("headroom_gpu_memory_vllm_bytes")
    utilization = fake_vllm.state.gpu_memory_utilization
    unexplained = scrape.value("headroom_gpu_memory_unexplained_bytes", gpu="5", uuid=GPU5)
    assert unexplained == pytest.approx(76_053 * MIB - utilization * 81_090 * MIB, abs=MIB)
    for reason in DcgmReason:
        errors = scrape.value("headroom_source_errors_total", source="dcgm", reason=reason)
        assert errors == 0, reason
    assert scrape.value("headroom_source_up", source="nvml") is None


def test_a_failing_dcgm_exporter_is_reported_and_recovered_vllm_untouched(
    sidecar: ExporterThread, dcgm: FakeVllm
) -> None:
    """dcgm-exporter answering 500: dcgm down with http_5xx, vLLM's side up; then back."""
    sidecar.wait_for(dcgm_up)
    dcgm.set_fault(Fault.HTTP_500)
    down, _ = sidecar.wait_for(lambda s: s.value("headroom_source_up", source="dcgm") == 0.0)
    assert down.errors("dcgm", DcgmReason.HTTP_5XX) >= 1
    assert down.value("headroom_target_up") == 1.0
    assert not down.series("headroom_gpu_memory_total_bytes")
    dcgm.set_fault(Fault.NONE)
    sidecar.wait_for(dcgm_up)


def _labels(scrape: Scrape, name: str) -> list[dict[str, str]]:
    return [dict(labels) for labels in scrape.series(name)]
