"""The demo's GPU: one simulated H100 holding what the simulated vLLM would claim.

It stands behind the same :class:`~exporter.gpu.model.GpuReader` seam as the real NVML reader,
so the sidecar's GPU source, memory split and gauges run unchanged in ``vllm-headroom demo``;
every reading is labelled a simulation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from exporter.core.reasons import VisibilityState
from exporter.gpu.model import GpuProcess, GpuReading, GpuSnapshot, MemoryApi, UuidSelector
from exporter.gpu.source import NvmlGpuSource
from exporter.gpu.visibility import GpuVisibility

if TYPE_CHECKING:
    from exporter.gpu.model import GpuSelection
    from exporter.sim.scenario import Scenario

SIM_GPU_UUID = "GPU-00000000-5153-494d-0000-000000000000"  # "SIM" in the middle: not real
SIM_VLLM_PID = 4242
#: The driver reservation of an H100 that NVML reports beside CUDA's total.
SIM_RESERVED_BYTES = 470 * 1024 * 1024
#: CUDA context and allocator slack of the vLLM process beyond its utilization budget.
SIM_CONTEXT_BYTES = 512 * 1024 * 1024


class SimulatedGpuReader:
    """A GPU reader for the demo: one simulated H100 holding what vLLM would claim.

    Same seam as the real NVML reader; its readings follow the scenario (total, reservation,
    vLLM's ``total x utilization`` plus its CUDA context), never real hardware.
    """

    def __init__(self, scenario: Scenario) -> None:
        self._scenario = scenario

    def read(self, selection: GpuSelection) -> GpuSnapshot:
        """The simulated GPU, whatever is selected (the demo selects exactly it)."""
        del selection
        gpu = self._scenario.gpu
        total = gpu.memory_bytes + SIM_RESERVED_BYTES
        claimed = math.floor(gpu.memory_bytes * self._scenario.engine.gpu_memory_utilization)
        used_by_vllm = claimed + SIM_CONTEXT_BYTES
        free = total - SIM_RESERVED_BYTES - used_by_vllm
        reading = GpuReading(
            index=0,
            uuid=SIM_GPU_UUID,
            name=f"{gpu.name} (simulated)",
            total_bytes=total,
            used_bytes=used_by_vllm,
            free_bytes=free,
            reserved_bytes=SIM_RESERVED_BYTES,
            memory_api=MemoryApi.V2,
            processes=(GpuProcess(SIM_VLLM_PID, used_by_vllm),),
        )
        return GpuSnapshot(gpus=(reading,))

    def close(self) -> None:
        """Nothing to release."""


def simulated_gpu_source(scenario: Scenario) -> NvmlGpuSource:
    """The sidecar's GPU source over the simulated GPU, with the simulated vLLM's PID."""
    selector = UuidSelector(SIM_GPU_UUID)
    visibility = GpuVisibility(VisibilityState.EXPLICIT, (selector,), frozenset({SIM_VLLM_PID}))

    def discover(**_: object) -> GpuVisibility:
        return visibility

    return NvmlGpuSource(SimulatedGpuReader(scenario), explicit=(selector,), discover=discover)
