"""Specification of exporter/gpu/nvml.py: the real bindings, reads through a fake, sessions."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.core.reasons import GpuErrorReason, UnavailableReason
from exporter.gpu.model import (
    ALL_GPUS,
    GpuProcess,
    GpuReading,
    GpuSnapshot,
    IndexSelector,
    MemoryApi,
    MigIndexSelector,
    NvmlCall,
    UuidSelector,
)
from exporter.gpu.nvml import (
    NVML_NAMES_USED,
    NvmlGpuReader,
    NvmlReturn,
    gpu_error_reason,
    init_failure_reason,
)
from tests.gpu.fakes import (
    UUID_A,
    UUID_B,
    FakeClock,
    FakeDevice,
    FakeNvml,
    GiB,
    MiB,
    make_reader,
    two_gpus,
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
