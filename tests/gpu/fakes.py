"""Doubles shared by the GPU tests: a fake NVML from the real bindings' types, a clock, data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml
from hypothesis import strategies as st

from exporter.gpu.model import GpuProcess
from exporter.gpu.nvml import NvmlGpuReader

GiB, MiB = 2**30, 2**20
UUID_A = "GPU-3f8a2c1e-7b4d-4e9a-8c2f-5d6e7f809a1b"
UUID_B = "GPU-9c1d4e2f-3a5b-4c6d-8e7f-0a1b2c3d4e5f"


# --------------------------------------------------------------------------------------------
# A fake NVML built from the real bindings' types: pynvml's exception classes, memory structs
# and process objects, with the devices and failures a test scripts.
# --------------------------------------------------------------------------------------------


@dataclass
class FakeDevice:
    """A GPU as the fake NVML knows it (v2-style numbers; v1 is derived from them)."""

    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GiB
    reserved: int = 512 * MiB
    used: int = 72 * GiB
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    #: NVML function name -> return code it fails with (or an exception instance to raise).
    fail: dict[str, int | Exception] = field(default_factory=dict)
    v2_memory: bool = True
    mig: list[FakeDevice] = field(default_factory=list)


class FakeNvml:
    """Implements the names in NVML_NAMES_USED over a list of FakeDevice."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, devices: list[FakeDevice] | None = None) -> None:
        self.devices = devices if devices is not None else []
        self.init_fail: list[int | Exception] = []  # consumed one per nvmlInit
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: list[str] = []
        self.library_has_v2_memory = True
        self.library_has_v3_processes = True

    # -- session
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_fail:
            self._raise(self.init_fail.pop(0))

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    # -- lookup
    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("count")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        for device in self.devices:
            if device.index == index:
                return self._check(device, "nvmlDeviceGetHandleByIndex")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDevice:
        for device in self._all():
            if device.uuid == uuid:
                return self._check(device, "nvmlDeviceGetHandleByUUID")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeDevice, index: int) -> FakeDevice:
        if index >= len(device.mig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return device.mig[index]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig: FakeDevice) -> FakeDevice:
        for device in self.devices:
            if mig in device.mig:
                return device
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # -- identity
    def nvmlDeviceGetIndex(self, device: FakeDevice) -> int:
        if any(device in parent.mig for parent in self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._check(device, "nvmlDeviceGetIndex").index

    def nvmlDeviceGetUUID(self, device: FakeDevice) -> str:
        return self._check(device, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, device: FakeDevice) -> str:
        return self._check(device, "nvmlDeviceGetName").name

    # -- memory
    def nvmlDeviceGetMemoryInfo(self, device: FakeDevice, version: int | None = None) -> Any:
        if version:
            self.calls.append("memory_v2")
            if not self.library_has_v2_memory:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if not device.v2_memory:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self._check(device, "nvmlDeviceGetMemoryInfo_v2")
            memory = pynvml.c_nvmlMemory_v2_t()
            memory.version = version
            memory.total, memory.reserved, memory.used = device.total, device.reserved, device.used
            memory.free = device.total - device.reserved - device.used
            return memory
        self.calls.append("memory_v1")
        self._check(device, "nvmlDeviceGetMemoryInfo")
        memory_v1 = pynvml.c_nvmlMemory_t()
        memory_v1.total = device.total
        memory_v1.used = device.used + device.reserved  # v1 folds the reservation into used
        memory_v1.free = device.total - memory_v1.used
        return memory_v1

    # -- processes
    def nvmlDeviceGetComputeRunningProcesses_v3(self, device: FakeDevice) -> list[Any]:
        return self._processes(device, device.compute, "nvmlDeviceGetComputeRunningProcesses", 3)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, device: FakeDevice) -> list[Any]:
        return self._processes(device, device.compute, "nvmlDeviceGetComputeRunningProcesses", 2)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, device: FakeDevice) -> list[Any]:
        return self._processes(device, device.graphics, "nvmlDeviceGetGraphicsRunningProcesses", 3)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, device: FakeDevice) -> list[Any]:
        return self._processes(device, device.graphics, "nvmlDeviceGetGraphicsRunningProcesses", 2)

    # -- helpers
    def _processes(
        self, device: FakeDevice, entries: list[tuple[int, int | None]], name: str, version: int
    ) -> list[Any]:
        self.calls.append(f"{name}_v{version}")
        if version == 3 and not self.library_has_v3_processes:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._check(device, name)
        # As pynvml builds them: friendly objects, usedGpuMemory None when not available.
        return [
            pynvml.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": used}) for pid, used in entries
        ]

    def _check(self, device: FakeDevice, name: str) -> FakeDevice:
        if name in device.fail:
            self._raise(device.fail[name])
        return device

    def _all(self) -> list[FakeDevice]:
        return [d for device in self.devices for d in (device, *device.mig)]

    @staticmethod
    def _raise(failure: int | Exception) -> None:
        if isinstance(failure, Exception):
            raise failure
        raise pynvml.NVMLError(failure)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_reader(nvml: FakeNvml, clock: FakeClock | None = None) -> NvmlGpuReader:
    """A reader on the fake NVML with a 5 s initial and 60 s maximum backoff."""
    return NvmlGpuReader(
        nvml=nvml, clock=clock or FakeClock(), retry_initial_seconds=5, retry_max_seconds=60
    )


def two_gpus() -> FakeNvml:
    """Two H100s, each with one vLLM TP worker (pids 80 and 81)."""
    return FakeNvml(
        [
            FakeDevice(0, UUID_A, compute=[(80, 71 * GiB)]),
            FakeDevice(1, UUID_B, compute=[(81, 71 * GiB)]),
        ]
    )


processes_strategy = st.lists(
    st.builds(
        GpuProcess,
        pid=st.integers(min_value=0, max_value=20),
        used_bytes=st.one_of(st.none(), st.integers(min_value=0, max_value=90 * GiB)),
    ),
    max_size=8,
)
