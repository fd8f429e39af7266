"""Specification of exporter/gpu/model.py: readings and snapshots as data, fault keys."""

from __future__ import annotations

from dataclasses import replace

from exporter.core.reasons import GpuErrorReason
from exporter.gpu.model import GpuError, GpuReading, GpuSnapshot, MemoryApi, NvmlCall
from tests.gpu.fakes import UUID_A


def test_allocated_memory_does_not_depend_on_whether_v2_used_includes_reserved() -> None:
    """total - free - reserved is the same whichever way a driver documents v2 ``used``."""
    excluding = GpuReading(0, UUID_A, "x", 100, 60, 30, 10, MemoryApi.V2, ())
    including = replace(excluding, used_bytes=70)
    assert excluding.allocated_bytes == including.allocated_bytes == 60


def test_gpu_error_detail_is_not_part_of_the_fault_key() -> None:
    """Fault keys use bounded fields only, so changing NVML messages do not re-trigger logs."""
    a = GpuSnapshot(errors=(GpuError("0", NvmlCall.MEMORY, GpuErrorReason.TIMEOUT, "took 1s"),))
    b = GpuSnapshot(errors=(GpuError("0", NvmlCall.MEMORY, GpuErrorReason.TIMEOUT, "took 2s"),))
    assert a.fault_key == b.fault_key
