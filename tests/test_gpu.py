"""Specification of exporter.gpu: NVML readings as data, the reader seam, and vLLM's share."""

from __future__ import annotations

import ctypes
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.reasons import GpuErrorReason, UnavailableReason
from exporter.errors import UsageError
from exporter.gpu.memory import SplitUnknownReason, split_gpu_memory, split_snapshot
from exporter.gpu.model import (
    ALL_GPUS,
    GpuError,
    GpuProcess,
    GpuReading,
    GpuSnapshot,
    IndexSelector,
    MemoryApi,
    MigIndexSelector,
    NvmlCall,
    NvmlUnavailable,
    UuidSelector,
)
from exporter.gpu.nvml import (
    NVML_NAMES_USED,
    NvmlGpuReader,
    NvmlReturn,
    gpu_error_reason,
    init_failure_reason,
)
from exporter.gpu.recording import (
    RECORDING_FORMAT,
    NvmlRecordingError,
    RecordedFailure,
    RecordedGpuReader,
    RecordedSample,
    Recording,
    load_recording,
    parse_recording,
    recording_to_json,
    replay_sample,
    sample_from_snapshot,
)
from tests import paths

FIXTURES = paths.NVML
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


# --------------------------------------------------------------------------------------------
# The real bindings
# --------------------------------------------------------------------------------------------


def test_return_codes_match_the_installed_pynvml() -> None:
    """Every NVML return code we classify has the value nvidia-ml-py gives it."""
    for code in NvmlReturn:
        assert getattr(pynvml, f"NVML_ERROR_{code.name}") == code.value


def test_every_pynvml_name_the_reader_calls_exists() -> None:
    """The installed nvidia-ml-py provides every function and constant the reader uses."""
    missing = [name for name in NVML_NAMES_USED if not hasattr(pynvml, name)]
    assert missing == []


def test_the_fake_provides_every_name_the_reader_calls() -> None:
    """The fake NVML in these tests covers the whole surface the reader uses."""
    fake = FakeNvml()
    assert [name for name in NVML_NAMES_USED if not hasattr(fake, name)] == []


def test_pynvml_is_nvidia_ml_py_not_the_redirect_package() -> None:
    """The pynvml module comes from nvidia-ml-py (a single module), not the pynvml package."""
    from importlib.metadata import distribution

    files = distribution("nvidia-ml-py").files or []
    owned = [Path(str(f.locate())).resolve() for f in files if f.name == "pynvml.py"]
    assert owned == [Path(pynvml.__file__).resolve()]


def _nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_real_nvml_without_a_driver_is_a_clean_unavailable_state() -> None:
    """With the real pynvml, a machine without libnvidia-ml reports unavailable, never raises."""
    reader = NvmlGpuReader()
    try:
        first = reader.read(ALL_GPUS)
        second = reader.read((UuidSelector(UUID_A),))
    finally:
        reader.close()
    if _nvml_library_loads():
        # A GPU machine: NVML must be usable (and read without raising).
        assert first.available
        assert first.unavailable is None
    else:
        assert first.unavailable is not None
        assert first.unavailable.reason is UnavailableReason.LIBRARY_NOT_FOUND
        assert first.gpus == ()
        assert first.errors == ()
        assert first.fault_key == second.fault_key == ("unavailable:library_not_found",)
        assert second.unavailable is not None
        assert second.unavailable.retry_in_seconds is not None
        assert 0 < second.unavailable.retry_in_seconds <= 5


def test_missing_pynvml_module_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without nvidia-ml-py installed the reader reports module_missing instead of raising."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    reader = NvmlGpuReader(clock=FakeClock())
    snapshot = reader.read(ALL_GPUS)
    assert snapshot.unavailable is not None
    assert snapshot.unavailable.reason is UnavailableReason.MODULE_MISSING
    assert "nvidia-ml-py" in snapshot.unavailable.detail
    reader.close()


# --------------------------------------------------------------------------------------------
# Reading through the fake
# --------------------------------------------------------------------------------------------


def test_reads_memory_v2_and_processes_of_a_gpu_by_uuid() -> None:
    """A UUID selector yields NVML's v2 numbers verbatim and the GPU's processes."""
    nvml = FakeNvml([FakeDevice(0, UUID_A, compute=[(45, 72 * GiB)], graphics=[(7, 1 * MiB)])])
    snapshot = make_reader(nvml).read((UuidSelector(UUID_A),))
    device = nvml.devices[0]
    assert snapshot.errors == ()
    [reading] = snapshot.gpus
    assert reading == GpuReading(
        index=0,
        uuid=UUID_A,
        name=device.name,
        total_bytes=device.total,
        used_bytes=device.used,
        free_bytes=device.total - device.reserved - device.used,
        reserved_bytes=device.reserved,
        memory_api=MemoryApi.V2,
        processes=(GpuProcess(7, 1 * MiB), GpuProcess(45, 72 * GiB)),
    )
    assert reading.allocated_bytes == device.used


def test_all_gpus_reads_every_device_in_index_order() -> None:
    """ALL_GPUS counts the devices and reads each by index."""
    snapshot = make_reader(two_gpus()).read(ALL_GPUS)
    assert [(r.index, r.uuid) for r in snapshot.gpus] == [(0, UUID_A), (1, UUID_B)]


def test_index_selector_reads_that_gpu_only() -> None:
    """An index selector reads the GPU NVML has at that index."""
    snapshot = make_reader(two_gpus()).read((IndexSelector(1),))
    assert [r.uuid for r in snapshot.gpus] == [UUID_B]


def test_unknown_uuid_and_index_are_not_found_errors() -> None:
    """A selector matching no GPU is a not_found lookup error naming it; others still read."""
    snapshot = make_reader(two_gpus()).read(
        (UuidSelector("GPU-00000000"), IndexSelector(7), UuidSelector(UUID_A))
    )
    assert [r.uuid for r in snapshot.gpus] == [UUID_A]
    assert [(e.selector, e.call, e.reason) for e in snapshot.errors] == [
        ("GPU-00000000", NvmlCall.LOOKUP, GpuErrorReason.NOT_FOUND),
        ("7", NvmlCall.LOOKUP, GpuErrorReason.NOT_FOUND),
    ]


def test_mig_index_selector_reads_the_mig_device_with_its_parent_index() -> None:
    """A 0:1 selector reads MIG device 1 of GPU 0, reported under the parent's index."""
    mig = FakeDevice(
        99,
        "MIG-1a2b3c4d-0000-5e6f-7a8b-9c0d1e2f3a4b",
        name="MIG 3g.40gb",
        total=40 * GiB,
        used=30 * GiB,
    )
    parent = FakeDevice(0, UUID_A, mig=[FakeDevice(98, "MIG-other"), mig])
    snapshot = make_reader(FakeNvml([parent])).read((MigIndexSelector(0, 1),))
    [reading] = snapshot.gpus
    assert (reading.uuid, reading.index, reading.total_bytes) == (mig.uuid, 0, 40 * GiB)


def test_mig_uuid_selector_finds_the_parent_index_through_nvml() -> None:
    """A MIG UUID selector reports the parent GPU's index, which MIG handles lack."""
    mig = FakeDevice(99, "MIG-1a2b3c4d-0000-5e6f-7a8b-9c0d1e2f3a4b")
    snapshot = make_reader(FakeNvml([FakeDevice(3, UUID_A, mig=[mig])])).read(
        (UuidSelector(mig.uuid),)
    )
    assert [r.index for r in snapshot.gpus] == [3]


def test_falls_back_to_memory_v1_when_the_library_lacks_v2_and_remembers() -> None:
    """Without nvmlDeviceGetMemoryInfo_v2 the reading is v1 (no reserved) and v2 is not retried."""
    nvml = two_gpus()
    nvml.library_has_v2_memory = False
    reader = make_reader(nvml)
    first = reader.read(ALL_GPUS)
    second = reader.read(ALL_GPUS)
    for reading in (*first.gpus, *second.gpus):
        assert reading.memory_api is MemoryApi.V1
        assert reading.reserved_bytes is None
        assert reading.allocated_bytes == reading.used_bytes
    assert nvml.calls.count("memory_v2") == 1
    assert first.errors == second.errors == ()


def test_a_device_refusing_memory_v2_falls_back_alone() -> None:
    """NOT_SUPPORTED on v2 for one GPU gives that GPU a v1 reading and keeps v2 for the others."""
    nvml = two_gpus()
    nvml.devices[0].v2_memory = False
    snapshot = make_reader(nvml).read(ALL_GPUS)
    assert [r.memory_api for r in snapshot.gpus] == [MemoryApi.V1, MemoryApi.V2]
    assert snapshot.errors == ()


def test_v1_and_v2_agree_on_allocated_memory_up_to_the_reservation() -> None:
    """For the same device, v1's allocated figure exceeds v2's by exactly the reservation."""
    v2 = make_reader(two_gpus()).read((IndexSelector(0),)).gpus[0]
    old = two_gpus()
    old.library_has_v2_memory = False
    v1 = make_reader(old).read((IndexSelector(0),)).gpus[0]
    assert v2.reserved_bytes is not None
    assert v1.allocated_bytes - v2.allocated_bytes == v2.reserved_bytes


def test_allocated_memory_does_not_depend_on_whether_v2_used_includes_reserved() -> None:
    """total - free - reserved is the same whichever way a driver documents v2 ``used``."""
    excluding = GpuReading(0, UUID_A, "x", 100, 60, 30, 10, MemoryApi.V2, ())
    including = replace(excluding, used_bytes=70)
    assert excluding.allocated_bytes == including.allocated_bytes == 60


def test_processes_fall_back_to_v2_calls_on_old_drivers() -> None:
    """Without the _v3 process calls the _v2 ones are used, and _v3 is not tried again."""
    nvml = two_gpus()
    nvml.library_has_v3_processes = False
    reader = make_reader(nvml)
    reader.read(ALL_GPUS)
    snapshot = reader.read(ALL_GPUS)
    assert [r.processes for r in snapshot.gpus] == [
        (GpuProcess(80, 71 * GiB),),
        (GpuProcess(81, 71 * GiB),),
    ]
    assert nvml.calls.count("nvmlDeviceGetComputeRunningProcesses_v3") == 1


def test_unavailable_process_memory_is_none_and_duplicates_merge() -> None:
    """usedGpuMemory None or NVML_VALUE_NOT_AVAILABLE is None; a PID in both lists counts once."""
    not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    device = FakeDevice(
        0,
        UUID_A,
        compute=[(45, 70 * GiB), (900, None), (901, not_available)],
        graphics=[(45, 70 * GiB)],
    )
    [reading] = make_reader(FakeNvml([device])).read(ALL_GPUS).gpus
    assert reading.processes == (
        GpuProcess(45, 70 * GiB),
        GpuProcess(900, None),
        GpuProcess(901, None),
    )


def test_a_refused_process_list_keeps_the_memory_reading() -> None:
    """NOT_SUPPORTED/NO_PERMISSION on processes gives processes=None plus a processes error."""
    nvml = two_gpus()
    nvml.devices[0].fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    nvml.devices[1].fail["nvmlDeviceGetGraphicsRunningProcesses"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    snapshot = make_reader(nvml).read(ALL_GPUS)
    assert [r.processes for r in snapshot.gpus] == [None, None]
    assert [(e.selector, e.call, e.reason) for e in snapshot.errors] == [
        ("0", NvmlCall.PROCESSES, GpuErrorReason.NO_PERMISSION),
        ("1", NvmlCall.PROCESSES, GpuErrorReason.NOT_SUPPORTED),
    ]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, GpuErrorReason.GPU_LOST),
        (pynvml.NVML_ERROR_RESET_REQUIRED, GpuErrorReason.GPU_LOST),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, GpuErrorReason.NOT_SUPPORTED),
        (pynvml.NVML_ERROR_NO_PERMISSION, GpuErrorReason.NO_PERMISSION),
        (pynvml.NVML_ERROR_TIMEOUT, GpuErrorReason.TIMEOUT),
        (pynvml.NVML_ERROR_UNKNOWN, GpuErrorReason.CALL_FAILED),
        (pynvml.NVML_ERROR_CORRUPTED_INFOROM, GpuErrorReason.CALL_FAILED),
    ],
)
def test_a_memory_call_failing_on_one_gpu_is_that_gpus_error(
    code: int, reason: GpuErrorReason
) -> None:
    """An NVMLError on one GPU's memory calls is a bounded per-GPU error; the other GPU reads."""
    nvml = two_gpus()
    nvml.devices[1].fail["nvmlDeviceGetMemoryInfo_v2"] = code
    nvml.devices[1].fail["nvmlDeviceGetMemoryInfo"] = code  # NOT_SUPPORTED on v2 falls back to v1
    snapshot = make_reader(nvml).read(ALL_GPUS)
    assert snapshot.available
    assert [r.uuid for r in snapshot.gpus] == [UUID_A]
    [error] = snapshot.errors
    assert (error.selector, error.call, error.reason) == ("1", NvmlCall.MEMORY, reason)
    assert error.detail.startswith("NVMLError")


def test_a_non_nvml_exception_from_the_bindings_is_call_failed() -> None:
    """Anything else a binding raises (a ctypes error, a bug) is call_failed, not a crash."""
    nvml = two_gpus()
    nvml.devices[0].fail["nvmlDeviceGetUUID"] = RuntimeError("segfault averted")
    snapshot = make_reader(nvml).read(ALL_GPUS)
    [error] = snapshot.errors
    assert (error.call, error.reason) == (NvmlCall.IDENTITY, GpuErrorReason.CALL_FAILED)
    assert "segfault averted" in error.detail


def test_garbage_memory_values_are_an_error_not_a_reading() -> None:
    """A memory struct without integers costs that GPU a call_failed error."""

    class Weird(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, device: FakeDevice, version: int | None = None) -> Any:
            return object()

    nvml = Weird([FakeDevice(0, UUID_A)])
    snapshot = make_reader(nvml).read(ALL_GPUS)
    assert snapshot.gpus == ()
    assert [(e.call, e.reason) for e in snapshot.errors] == [
        (NvmlCall.MEMORY, GpuErrorReason.CALL_FAILED)
    ]


def test_count_failure_for_all_gpus_is_one_error() -> None:
    """If NVML cannot count devices, ALL_GPUS yields a single count error."""

    class NoCount(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    snapshot = make_reader(NoCount()).read(ALL_GPUS)
    assert [(e.selector, e.call) for e in snapshot.errors] == [("all", NvmlCall.COUNT)]


def test_names_returned_as_bytes_are_decoded() -> None:
    """Bindings that return bytes for UUID and name still give text readings."""

    class Bytes(FakeNvml):
        def nvmlDeviceGetName(self, device: FakeDevice) -> Any:
            return device.name.encode()

    [reading] = make_reader(Bytes([FakeDevice(0, UUID_A)])).read(ALL_GPUS).gpus
    assert reading.name == "NVIDIA H100 80GB HBM3"


# --------------------------------------------------------------------------------------------
# Session life: init failures, backoff, lost sessions, lost GPUs, close
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, UnavailableReason.LIBRARY_NOT_FOUND),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, UnavailableReason.DRIVER_NOT_LOADED),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, UnavailableReason.DRIVER_MISMATCH),
        (pynvml.NVML_ERROR_NO_PERMISSION, UnavailableReason.NO_PERMISSION),
        (pynvml.NVML_ERROR_UNKNOWN, UnavailableReason.INIT_FAILED),
        (OSError("libnvidia-ml.so.1: cannot open"), UnavailableReason.INIT_FAILED),
    ],
)
def test_init_failure_is_unavailable_with_its_reason(
    failure: int | Exception, reason: UnavailableReason
) -> None:
    """A failing nvmlInit gives an unavailable snapshot with a bounded reason, no GPUs, no raise."""
    nvml = two_gpus()
    nvml.init_fail = [failure]
    snapshot = make_reader(nvml).read(ALL_GPUS)
    assert snapshot == GpuSnapshot(unavailable=snapshot.unavailable)
    assert snapshot.unavailable is not None
    assert snapshot.unavailable.reason is reason
    assert not snapshot.available


def test_init_is_not_retried_before_the_backoff_and_the_backoff_doubles() -> None:
    """After a failed init no nvmlInit happens until the delay passes; delays double, capped."""
    nvml = two_gpus()
    nvml.init_fail = [pynvml.NVML_ERROR_DRIVER_NOT_LOADED] * 10
    clock = FakeClock()
    reader = make_reader(nvml, clock)
    delays = []
    for _ in range(6):
        snapshot = reader.read(ALL_GPUS)
        assert snapshot.unavailable is not None
        assert snapshot.unavailable.retry_in_seconds is not None
        delays.append(snapshot.unavailable.retry_in_seconds)
        calls = nvml.init_calls
        clock.now += snapshot.unavailable.retry_in_seconds / 2
        reader.read(ALL_GPUS)  # within the backoff: no new nvmlInit
        assert nvml.init_calls == calls
        clock.now += snapshot.unavailable.retry_in_seconds / 2
    assert delays == [5, 10, 20, 40, 60, 60]
    assert nvml.init_calls == 6


def test_recovers_when_init_succeeds_after_failing() -> None:
    """Once nvmlInit succeeds after the backoff, reads return GPUs again and the fault clears."""
    nvml = two_gpus()
    nvml.init_fail = [pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
    clock = FakeClock()
    reader = make_reader(nvml, clock)
    assert reader.read(ALL_GPUS).fault_key == ("unavailable:driver_not_loaded",)
    clock.now += 5
    healthy = reader.read(ALL_GPUS)
    assert healthy.available
    assert len(healthy.gpus) == 2
    assert healthy.fault_key == ()


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, UnavailableReason.DRIVER_NOT_LOADED),
        (pynvml.NVML_ERROR_UNINITIALIZED, UnavailableReason.UNINITIALIZED),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, UnavailableReason.DRIVER_MISMATCH),
    ],
)
def test_a_session_lost_mid_run_shuts_down_and_reinitialises_later(
    code: int, reason: UnavailableReason
) -> None:
    """A call saying the driver or session is gone makes the read unavailable, then recovers."""
    nvml = two_gpus()
    clock = FakeClock()
    reader = make_reader(nvml, clock)
    assert reader.read(ALL_GPUS).available
    nvml.devices[1].fail["nvmlDeviceGetMemoryInfo_v2"] = code
    lost = reader.read(ALL_GPUS)
    assert lost.unavailable is not None
    assert lost.unavailable.reason is reason
    assert lost.gpus == ()
    assert nvml.shutdown_calls == 1
    del nvml.devices[1].fail["nvmlDeviceGetMemoryInfo_v2"]
    clock.now += 1
    assert not reader.read(ALL_GPUS).available  # still backing off
    clock.now += 5
    assert len(reader.read(ALL_GPUS).gpus) == 2
    assert nvml.init_calls == 2


def test_a_lost_gpu_triggers_a_backed_off_reinit_while_other_gpus_keep_reading() -> None:
    """GPU_IS_LOST is a per-GPU error; NVML is re-initialised after the backoff, not every poll."""
    nvml = two_gpus()
    nvml.devices[1].fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVML_ERROR_GPU_IS_LOST
    clock = FakeClock()
    reader = make_reader(nvml, clock)
    first = reader.read(ALL_GPUS)
    assert [r.uuid for r in first.gpus] == [UUID_A]
    assert [(e.selector, e.reason) for e in first.errors] == [("1", GpuErrorReason.GPU_LOST)]
    clock.now += 1
    reader.read(ALL_GPUS)
    assert nvml.init_calls == 1
    clock.now += 4
    reader.read(ALL_GPUS)  # backoff elapsed: a fresh session
    assert (nvml.init_calls, nvml.shutdown_calls) == (2, 1)
    clock.now += 5
    reader.read(ALL_GPUS)  # the delay doubled to 10 s
    assert nvml.init_calls == 2
    del nvml.devices[1].fail["nvmlDeviceGetHandleByIndex"]  # the GPU came back after a reset
    clock.now += 5
    back = reader.read(ALL_GPUS)
    assert nvml.init_calls == 3
    assert len(back.gpus) == 2
    assert back.errors == ()


def test_close_shuts_nvml_down_once_and_a_later_read_starts_over() -> None:
    """close() calls nvmlShutdown once per session, is idempotent, and read() re-inits after it."""
    nvml = two_gpus()
    reader = make_reader(nvml)
    reader.close()
    assert nvml.shutdown_calls == 0  # never initialised: nothing to shut down
    reader.read(ALL_GPUS)
    reader.close()
    reader.close()
    assert nvml.shutdown_calls == 1
    assert reader.read(ALL_GPUS).available
    assert nvml.init_calls == 2


def test_close_survives_a_failing_shutdown() -> None:
    """An nvmlShutdown that raises does not escape close()."""

    class BadShutdown(FakeNvml):
        def nvmlShutdown(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    reader = make_reader(BadShutdown([FakeDevice(0, UUID_A)]))
    reader.read(ALL_GPUS)
    reader.close()


def test_fault_key_is_stable_while_nothing_changes_and_moves_when_it_does() -> None:
    """Identical failing reads share a fault key (log once); a new fault changes it."""
    nvml = two_gpus()
    nvml.devices[1].fail["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_TIMEOUT
    clock = FakeClock()
    reader = make_reader(nvml, clock)
    keys = [reader.read(ALL_GPUS).fault_key for _ in range(3)]
    assert keys == [("1:memory:timeout",)] * 3
    nvml.devices[0].fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    assert reader.read(ALL_GPUS).fault_key == ("0:processes:no_permission", "1:memory:timeout")


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (None, GpuErrorReason.CALL_FAILED),
        (6, GpuErrorReason.NOT_FOUND),
        (28, GpuErrorReason.NOT_FOUND),
    ],
)
def test_gpu_error_reason_classifies_codes(code: int | None, reason: GpuErrorReason) -> None:
    """Per-GPU return codes map to bounded reasons; no code means call_failed."""
    assert gpu_error_reason(code) is reason


def test_init_failure_reason_without_a_code_is_init_failed() -> None:
    """An init failure that is not an NVMLError is init_failed."""
    assert init_failure_reason(None) is UnavailableReason.INIT_FAILED


# --------------------------------------------------------------------------------------------
# vLLM's share of a GPU
# --------------------------------------------------------------------------------------------


def reading_with(
    processes: tuple[GpuProcess, ...] | None, *, used: int = 72 * GiB, reserved: int | None = 0
) -> GpuReading:
    """An 80 GiB GPU with ``used`` allocated and the given process list."""
    total = 80 * GiB
    return GpuReading(
        index=0,
        uuid=UUID_A,
        name="H100",
        total_bytes=total,
        used_bytes=used,
        free_bytes=total - used - (reserved or 0),
        reserved_bytes=reserved,
        memory_api=MemoryApi.V2 if reserved is not None else MemoryApi.V1,
        processes=processes,
    )


def test_split_attributes_vllm_processes_and_the_rest_is_foreign() -> None:
    """vLLM's bytes are its processes' sum; foreign is allocated minus that; others are counted."""
    reading = reading_with((GpuProcess(45, 60 * GiB), GpuProcess(9120, 10 * GiB)))
    split = split_gpu_memory(reading, {7, 45, 80})
    assert split.vllm_bytes == 60 * GiB
    assert split.foreign_bytes == reading.allocated_bytes - 60 * GiB
    assert split.foreign_process_count == 1
    assert split.unknown_reason is None


def test_split_sums_every_vllm_process_on_the_gpu() -> None:
    """Several vLLM processes on one GPU (engine and worker) add up."""
    reading = reading_with((GpuProcess(45, 1 * GiB), GpuProcess(80, 70 * GiB)))
    assert split_gpu_memory(reading, frozenset({45, 80})).vllm_bytes == 71 * GiB


@pytest.mark.parametrize(
    ("processes", "pids", "reason"),
    [
        (None, {45}, SplitUnknownReason.PROCESS_LIST_UNAVAILABLE),
        ((GpuProcess(45, GiB),), None, SplitUnknownReason.VLLM_PIDS_UNKNOWN),
        ((GpuProcess(45, GiB),), set(), SplitUnknownReason.VLLM_PIDS_UNKNOWN),
        ((GpuProcess(1834221, GiB),), {45}, SplitUnknownReason.VLLM_NOT_IN_PROCESS_LIST),
        ((), {45}, SplitUnknownReason.VLLM_NOT_IN_PROCESS_LIST),
        ((GpuProcess(45, None),), {45}, SplitUnknownReason.PROCESS_MEMORY_UNAVAILABLE),
    ],
)
def test_split_is_unknown_rather_than_zero(
    processes: tuple[GpuProcess, ...] | None, pids: set[int] | None, reason: SplitUnknownReason
) -> None:
    """Without an honest attribution, vLLM and foreign bytes are None with the reason, never 0."""
    split = split_gpu_memory(reading_with(processes), pids)
    assert (split.vllm_bytes, split.foreign_bytes, split.foreign_process_count) == (
        None,
        None,
        None,
    )
    assert split.unknown_reason is reason
    assert split.allocated_bytes == 72 * GiB


def test_a_foreign_process_without_memory_figure_does_not_block_the_split() -> None:
    """Foreign bytes are allocated minus vLLM's, so a foreign process without a figure counts."""
    reading = reading_with((GpuProcess(45, 60 * GiB), GpuProcess(9300, None)))
    split = split_gpu_memory(reading, {45})
    assert (split.vllm_bytes, split.foreign_bytes, split.foreign_process_count) == (
        60 * GiB,
        12 * GiB,
        1,
    )


def test_split_clamps_foreign_at_zero_when_calls_disagree() -> None:
    """If vLLM grew between the memory and process calls, foreign is 0, not negative."""
    split = split_gpu_memory(reading_with((GpuProcess(45, 73 * GiB),)), {45})
    assert split.foreign_bytes == 0


def test_split_counts_a_pid_listed_twice_once() -> None:
    """A process in both compute and graphics lists is not double-counted."""
    reading = reading_with((GpuProcess(45, 60 * GiB), GpuProcess(45, 60 * GiB)))
    assert split_gpu_memory(reading, {45}).vllm_bytes == 60 * GiB


def test_split_on_a_v1_reading_counts_the_reservation_as_foreign() -> None:
    """With v1 memory the driver reservation cannot be separated and lands in foreign bytes."""
    reading = reading_with((GpuProcess(45, 70 * GiB),), reserved=None)
    assert split_gpu_memory(reading, {45}).foreign_bytes == reading.used_bytes - 70 * GiB


def test_split_snapshot_splits_every_reading_in_order() -> None:
    """split_snapshot applies the split to each reading of a snapshot."""
    snapshot = make_reader(two_gpus()).read(ALL_GPUS)
    splits = split_snapshot(snapshot, {80, 81})
    assert [(s.index, s.vllm_bytes) for s in splits] == [(0, 71 * GiB), (1, 71 * GiB)]


processes_strategy = st.lists(
    st.builds(
        GpuProcess,
        pid=st.integers(min_value=0, max_value=20),
        used_bytes=st.one_of(st.none(), st.integers(min_value=0, max_value=90 * GiB)),
    ),
    max_size=8,
)


@given(
    processes=st.one_of(st.none(), processes_strategy.map(tuple)),
    pids=st.one_of(st.none(), st.frozensets(st.integers(min_value=0, max_value=20), max_size=5)),
    used=st.integers(min_value=0, max_value=80 * GiB),
)
def test_split_property_known_parts_add_up_and_are_never_negative(
    processes: tuple[GpuProcess, ...] | None, pids: frozenset[int] | None, used: int
) -> None:
    """Either all parts are known and add up to allocated, or all are None with a reason."""
    split = split_gpu_memory(reading_with(processes, used=used), pids)
    if split.unknown_reason is None:
        assert split.vllm_bytes is not None
        assert split.foreign_bytes is not None
        assert split.foreign_process_count is not None
        assert min(split.vllm_bytes, split.foreign_bytes, split.foreign_process_count) >= 0
        assert split.foreign_bytes == max(0, split.allocated_bytes - split.vllm_bytes)
    else:
        assert (split.vllm_bytes, split.foreign_bytes, split.foreign_process_count) == (
            None,
            None,
            None,
        )


# --------------------------------------------------------------------------------------------
# Recordings
# --------------------------------------------------------------------------------------------


def fixture_paths() -> list[Path]:
    """Every recorded-NVML fixture file."""
    return sorted(FIXTURES.glob("*.json"))


def test_every_fixture_recording_loads_and_says_it_is_synthetic() -> None:
    """All recorded fixtures parse, and none pretends to be a hardware capture."""
    paths = fixture_paths()
    assert len(paths) >= 5
    for path in paths:
        recording = load_recording(path)
        assert recording.source == "synthetic"
        assert recording.samples


def test_fixture_files_are_exactly_what_the_writer_produces() -> None:
    """Each fixture is in canonical form: parsing then writing gives the same text back."""
    for path in fixture_paths():
        text = path.read_text()
        assert recording_to_json(parse_recording(text)) == text


def test_single_h100_recording_shows_vllm_using_72_gib() -> None:
    """The H100 recording attributes 72 GiB to vLLM's engine and the small rest to foreign."""
    reader = RecordedGpuReader.from_file(FIXTURES / "h100-vllm-72gib.json")
    snapshot = reader.read((UuidSelector(UUID_A),))
    [split] = split_snapshot(snapshot, {7, 45})
    assert split.vllm_bytes == 72 * GiB
    assert split.foreign_bytes == 40 * MiB
    assert snapshot.gpus[0].total_bytes - snapshot.gpus[0].free_bytes > 72 * GiB


def test_shared_gpu_recording_shows_a_growing_foreign_process() -> None:
    """Replaying the shared-GPU recording, foreign memory grows while vLLM's stays put."""
    reader = RecordedGpuReader.from_file(FIXTURES / "shared-gpu-foreign.json")
    first = split_snapshot(reader.read(ALL_GPUS), {45})[0]
    second = split_snapshot(reader.read(ALL_GPUS), {45})[0]
    assert first.vllm_bytes == second.vllm_bytes == 60 * GiB
    assert first.foreign_bytes is not None
    assert second.foreign_bytes is not None
    assert second.foreign_bytes > first.foreign_bytes
    assert (first.foreign_process_count, second.foreign_process_count) == (1, 2)


def test_lost_gpu_recording_goes_from_read_to_lost_to_not_found() -> None:
    """Selecting both GPUs by UUID: GPU B reads, then is gpu_lost, then is not found; A reads on."""
    reader = RecordedGpuReader.from_file(FIXTURES / "gpu-lost-mid-run.json")
    selection = (UuidSelector(UUID_A), UuidSelector(UUID_B))
    timeline = [reader.read(selection) for _ in range(4)]
    assert [len(s.gpus) for s in timeline] == [2, 1, 1, 1]
    assert [s.fault_key for s in timeline] == [
        (),
        (f"{UUID_B}:memory:gpu_lost",),
        (f"{UUID_B}:lookup:not_found",),
        (f"{UUID_B}:lookup:not_found",),  # the last sample holds
    ]


def test_per_gpu_failure_recording_replays_both_failures() -> None:
    """A refused process list keeps GPU 0's reading; GPU 1's memory timeout is an error only."""
    snapshot = RecordedGpuReader.from_file(FIXTURES / "per-gpu-call-failure.json").read(
        (IndexSelector(0), IndexSelector(1))
    )
    assert [(r.index, r.processes) for r in snapshot.gpus] == [(0, None)]
    assert [(e.selector, e.call, e.reason) for e in snapshot.errors] == [
        ("0", NvmlCall.PROCESSES, GpuErrorReason.NO_PERMISSION),
        ("1", NvmlCall.MEMORY, GpuErrorReason.TIMEOUT),
    ]
    [split] = split_snapshot(snapshot, {80})
    assert split.unknown_reason is SplitUnknownReason.PROCESS_LIST_UNAVAILABLE


def test_no_driver_recording_is_unavailable() -> None:
    """The no-driver recording replays as NVML unavailable, library_not_found."""
    snapshot = RecordedGpuReader.from_file(FIXTURES / "no-driver.json").read(ALL_GPUS)
    assert snapshot.unavailable is not None
    assert snapshot.unavailable.reason is UnavailableReason.LIBRARY_NOT_FOUND


def test_recorded_reader_loops_when_asked() -> None:
    """With loop=True the reader starts the sequence over after the last sample."""
    reader = RecordedGpuReader.from_file(FIXTURES / "gpu-lost-mid-run.json", loop=True)
    counts = [len(reader.read(ALL_GPUS).gpus) for _ in range(5)]
    assert counts == [2, 1, 1, 2, 1]


def test_replay_filters_by_selection_and_reports_missing_gpus() -> None:
    """A recorded sample answers only for the selected GPUs; unknown ones are not_found."""
    sample = load_recording(FIXTURES / "tp2-vllm.json").samples[0]
    snapshot = replay_sample(
        sample, (IndexSelector(1), UuidSelector("GPU-feed"), MigIndexSelector(0, 0))
    )
    assert [r.index for r in snapshot.gpus] == [1]
    assert [(e.selector, e.reason) for e in snapshot.errors] == [
        ("GPU-feed", GpuErrorReason.NOT_FOUND),
        ("0:0", GpuErrorReason.NOT_FOUND),
    ]


def test_a_recorded_reader_needs_at_least_one_sample() -> None:
    """An empty recording is refused with a usage error."""
    with pytest.raises(NvmlRecordingError, match="at least one sample"):
        RecordedGpuReader(Recording("synthetic", "", ()))


def test_sample_from_a_live_snapshot_replays_to_the_same_snapshot() -> None:
    """Recording a read of all GPUs and replaying it for all GPUs gives the same snapshot back."""
    nvml = two_gpus()
    nvml.devices[0].fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    nvml.devices.append(
        FakeDevice(
            2, "GPU-lost", fail={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_GPU_IS_LOST}
        )
    )
    live = make_reader(nvml).read(ALL_GPUS)
    sample = sample_from_snapshot(live, t=0.0)
    recording = Recording("captured", "fake", (sample,))
    replayed = replay_sample(parse_recording(recording_to_json(recording)).samples[0], ALL_GPUS)
    assert replayed.gpus == live.gpus
    assert sorted(replayed.errors, key=str) == sorted(live.errors, key=str)


def test_an_unavailable_snapshot_records_and_replays_as_unavailable() -> None:
    """An unavailable read is recorded as such (without the retry delay)."""
    live = GpuSnapshot(unavailable=NvmlUnavailable(UnavailableReason.DRIVER_NOT_LOADED, "x", 5.0))
    sample = sample_from_snapshot(live, t=1.5)
    text = recording_to_json(Recording("captured", "", (sample,)))
    replayed = replay_sample(parse_recording(text).samples[0], ALL_GPUS)
    assert replayed.unavailable == NvmlUnavailable(UnavailableReason.DRIVER_NOT_LOADED, "x")


GOOD_READING: dict[str, Any] = {
    "index": 0,
    "uuid": UUID_A,
    "name": "H100",
    "memory": {"api": "v2", "total": 100, "free": 30, "used": 60, "reserved": 10},
    "processes": [{"pid": 45, "used": 60}],
}


def document(**sample_changes: Any) -> dict[str, Any]:
    """A valid one-sample recording document, with the sample's fields changed as given."""
    sample: dict[str, Any] = {"t": 0, "gpus": [json.loads(json.dumps(GOOD_READING))]}
    sample.update(sample_changes)
    return {"format": RECORDING_FORMAT, "source": "synthetic", "samples": [sample]}


def with_reading(**changes: Any) -> dict[str, Any]:
    """A valid document whose reading has fields (``memory_<field>`` for memory) changed."""
    reading = json.loads(json.dumps(GOOD_READING))
    for key, value in changes.items():
        if key.startswith("memory_"):
            reading["memory"][key.removeprefix("memory_")] = value
        else:
            reading[key] = value
    return document(gpus=[reading])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "the document must be a JSON object"),
        (json.dumps({**document(), "format": "other/v9"}), "format must be"),
        (json.dumps({**document(), "samples": []}), "samples must be a non-empty list"),
        (
            json.dumps({k: v for k, v in document().items() if k != "source"}),
            "source must be a string",
        ),
        (json.dumps(document(t="soon")), r"samples\[0\]\.t must be a number"),
        (json.dumps(document(t=float("inf"))), r"samples\[0\]\.t must be a finite number"),
        (
            json.dumps(with_reading(memory_total=-1)),
            r"gpus\[0\]\.memory\.total must be a non-negative",
        ),
        (json.dumps(with_reading(memory_used=True)), r"memory\.used must be a non-negative"),
        (json.dumps(with_reading(memory_api="v3")), r"memory\.api must be one of v2, v1"),
        (json.dumps(with_reading(memory_reserved=None)), r"memory\.reserved must be"),
        (json.dumps(with_reading(processes={"pid": 1})), r"processes must be a list or null"),
        (json.dumps(with_reading(processes=[{"used": 1}])), r"processes\[0\]\.pid must be"),
        (json.dumps(with_reading(uuid=7)), r"gpus\[0\]\.uuid must be a string"),
        (
            json.dumps(document(failures=[{"call": "memory", "reason": "melted"}])),
            r"failures\[0\]\.reason must be one of",
        ),
        (
            json.dumps(document(unavailable={"reason": "bad"})),
            r"unavailable\.reason must be one of",
        ),
    ],
)
def test_malformed_recordings_fail_with_one_line_naming_the_field(text: str, message: str) -> None:
    """Every malformed recording raises a UsageError whose single line names file and field."""
    with pytest.raises(NvmlRecordingError, match=message) as caught:
        parse_recording(text, origin="rec.json")
    assert isinstance(caught.value, UsageError)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("rec.json: ")


def test_an_unreadable_recording_file_is_a_usage_error(tmp_path: Path) -> None:
    """A missing file raises NvmlRecordingError naming the path."""
    with pytest.raises(NvmlRecordingError, match="cannot read NVML recording"):
        load_recording(tmp_path / "absent.json")


reading_strategy = st.builds(
    GpuReading,
    index=st.one_of(st.none(), st.integers(min_value=0, max_value=15)),
    uuid=st.text(min_size=1, max_size=20),
    name=st.text(max_size=20),
    total_bytes=st.integers(min_value=0, max_value=2**50),
    used_bytes=st.integers(min_value=0, max_value=2**50),
    free_bytes=st.integers(min_value=0, max_value=2**50),
    reserved_bytes=st.integers(min_value=0, max_value=2**40),
    memory_api=st.just(MemoryApi.V2),
    processes=st.one_of(st.none(), processes_strategy.map(tuple)),
) | st.builds(
    GpuReading,
    index=st.one_of(st.none(), st.integers(min_value=0, max_value=15)),
    uuid=st.text(min_size=1, max_size=20),
    name=st.text(max_size=20),
    total_bytes=st.integers(min_value=0, max_value=2**50),
    used_bytes=st.integers(min_value=0, max_value=2**50),
    free_bytes=st.integers(min_value=0, max_value=2**50),
    reserved_bytes=st.none(),
    memory_api=st.just(MemoryApi.V1),
    processes=st.one_of(st.none(), processes_strategy.map(tuple)),
)
failure_strategy = st.builds(
    RecordedFailure,
    index=st.one_of(st.none(), st.integers(min_value=0, max_value=15)),
    uuid=st.one_of(st.none(), st.text(max_size=20)),
    call=st.sampled_from(NvmlCall),
    reason=st.sampled_from(GpuErrorReason),
    detail=st.text(max_size=30),
)
sample_strategy = st.builds(
    RecordedSample,
    t=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    gpus=st.lists(reading_strategy, max_size=3).map(tuple),
    failures=st.lists(failure_strategy, max_size=2).map(tuple),
) | st.builds(
    RecordedSample,
    t=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    unavailable=st.builds(
        NvmlUnavailable, reason=st.sampled_from(UnavailableReason), detail=st.text(max_size=30)
    ),
)


@given(
    recording=st.builds(
        Recording,
        source=st.sampled_from(["synthetic", "captured"]),
        description=st.text(max_size=40),
        samples=st.lists(sample_strategy, min_size=1, max_size=3).map(tuple),
    )
)
def test_recording_json_round_trips(recording: Recording) -> None:
    """Writing any recording and parsing it back gives the same recording."""
    assert parse_recording(recording_to_json(recording)) == recording


def test_gpu_error_detail_is_not_part_of_the_fault_key() -> None:
    """Fault keys use bounded fields only, so changing NVML messages do not re-trigger logs."""
    a = GpuSnapshot(errors=(GpuError("0", NvmlCall.MEMORY, GpuErrorReason.TIMEOUT, "took 1s"),))
    b = GpuSnapshot(errors=(GpuError("0", NvmlCall.MEMORY, GpuErrorReason.TIMEOUT, "took 2s"),))
    assert a.fault_key == b.fault_key


def test_the_recorder_script_writes_a_recording_the_replayer_reads(tmp_path: Path) -> None:
    """scripts/record-nvml.py writes a captured recording; exit 1 only if NVML was never usable."""
    import subprocess

    out = tmp_path / "capture.json"
    script = paths.REPO / "scripts" / "record-nvml.py"
    done = subprocess.run(
        [sys.executable, str(script), "--samples", "2", "--interval", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    recording = load_recording(out)
    assert recording.source == "captured"
    assert len(recording.samples) == 2
    never_available = all(s.unavailable is not None for s in recording.samples)
    assert done.returncode == (1 if never_available else 0), done.stderr
    assert f"wrote {out}" in done.stderr
