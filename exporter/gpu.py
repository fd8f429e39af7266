"""GPU memory from NVML: plain readings, the reader seam, and vLLM's share of each GPU.

Three layers, in the order data flows:

- **Plain data.** A :class:`GpuSnapshot` holds one :class:`GpuReading` per GPU that could be read,
  one :class:`GpuError` per GPU (or per call) that could not, and, when NVML itself cannot be used
  (no ``nvidia-ml-py``, no ``libnvidia-ml.so.1``, driver not loaded), a single
  :class:`NvmlUnavailable` instead. Failures are data with bounded reasons, never exceptions.
- **The seam.** A :class:`GpuReader` has ``read(selection)`` and ``close()``. :class:`NvmlGpuReader`
  talks to NVML through ``nvidia-ml-py`` (module ``pynvml``, injectable for tests);
  :class:`RecordedGpuReader` replays readings recorded by ``scripts/record-nvml.py`` (the JSON
  format is defined here, by :func:`recording_to_json` and :func:`parse_recording`).
- **Pure derivation.** :func:`split_gpu_memory` divides a GPU's allocated memory into vLLM's own
  processes and everything else ("foreign"), saying *unknown* (with a reason) rather than 0 when
  NVML does not attribute memory to processes, as is common inside containers.

Readers do not log: a caller logs once per change of :attr:`GpuSnapshot.fault_key`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import threading
import time
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol, TypeVar

from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
    from pathlib import Path

_E = TypeVar("_E", bound=StrEnum)

# --------------------------------------------------------------------------------------------
# Which GPUs to read
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UuidSelector:
    """A GPU (``GPU-…``) or MIG device (``MIG-…``) by its NVML UUID: the unambiguous choice."""

    uuid: str

    def __str__(self) -> str:
        return self.uuid


@dataclass(frozen=True, slots=True)
class IndexSelector:
    """A GPU by its NVML index (PCI bus order as the reading process sees it)."""

    index: int

    def __str__(self) -> str:
        return str(self.index)


@dataclass(frozen=True, slots=True)
class MigIndexSelector:
    """MIG device ``mig_index`` of GPU ``gpu_index`` (the ``0:1`` form of the container runtime)."""

    gpu_index: int
    mig_index: int

    def __str__(self) -> str:
        return f"{self.gpu_index}:{self.mig_index}"


#: One GPU to read.
GpuSelector = UuidSelector | IndexSelector | MigIndexSelector


@dataclass(frozen=True, slots=True)
class AllGpus:
    """Every GPU NVML can see. Never a default: only when settings ask for it explicitly.

    A sidecar that sees the whole node (``NVIDIA_VISIBLE_DEVICES=all`` on a container without a
    GPU request) would otherwise report every tenant's GPUs as if they were vLLM's.
    """

    def __str__(self) -> str:
        return "all"


#: The single :class:`AllGpus` value.
ALL_GPUS: Final = AllGpus()

#: What :meth:`GpuReader.read` reads: listed GPUs, or explicitly all of them.
GpuSelection = tuple[GpuSelector, ...] | AllGpus

# --------------------------------------------------------------------------------------------
# Readings and failures (plain data)
# --------------------------------------------------------------------------------------------


class MemoryApi(StrEnum):
    """Which NVML memory call produced a reading."""

    #: ``nvmlDeviceGetMemoryInfo_v2``: reports the driver/firmware ``reserved`` memory separately.
    V2 = "v2"
    #: ``nvmlDeviceGetMemoryInfo`` (v1): ``used`` includes the reserved memory, which cannot be
    #: told apart. Used only where the driver lacks v2 (R470's NVML has none; R525's has it)
    #: or a device refuses it.
    V1 = "v1"


class NvmlCall(StrEnum):
    """The NVML call that failed (bounded: safe as a label value)."""

    COUNT = "count"
    LOOKUP = "lookup"
    IDENTITY = "identity"
    MEMORY = "memory"
    PROCESSES = "processes"


class GpuErrorReason(StrEnum):
    """Why one GPU (or one call on it) failed (bounded: safe as a label value)."""

    #: No GPU matches the selector (wrong UUID, index out of range, GPU gone from the bus).
    NOT_FOUND = "not_found"
    #: NVML says the GPU is lost or needs a reset (fell off the bus, Xid 79...).
    GPU_LOST = "gpu_lost"
    NOT_SUPPORTED = "not_supported"
    NO_PERMISSION = "no_permission"
    TIMEOUT = "timeout"
    #: Anything else, including a non-NVML exception from the bindings.
    CALL_FAILED = "call_failed"


class UnavailableReason(StrEnum):
    """Why NVML as a whole cannot be used (bounded: safe as a label value)."""

    #: The ``pynvml`` module (package ``nvidia-ml-py``) is not importable.
    MODULE_MISSING = "module_missing"
    #: ``libnvidia-ml.so.1`` is not there: no driver on the host, or not mounted in the container.
    LIBRARY_NOT_FOUND = "library_not_found"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    #: The user-space library and the kernel driver differ (typically after a driver upgrade).
    DRIVER_MISMATCH = "driver_mismatch"
    NO_PERMISSION = "no_permission"
    #: NVML was shut down under us (another user of the library in this process).
    UNINITIALIZED = "uninitialized"
    INIT_FAILED = "init_failed"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU, as NVML lists it.

    ``pid`` is in the PID namespace NVML resolves it in, which inside containers may be the host's
    (or 0). ``used_bytes`` is ``None`` when NVML does not know (``NVML_VALUE_NOT_AVAILABLE``, common
    in containers and under some virtualisation), never 0 for "unknown".
    """

    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """Memory of one GPU (or MIG device) at one moment, with NVML's numbers kept verbatim.

    ``used_bytes`` is NVML's ``used`` as reported. With :attr:`MemoryApi.V2`, ``reserved_bytes`` is
    the driver/firmware reservation. Whether v2 ``used`` includes it is documented both ways (the
    R525 reference and cuda-python say it does; later references drop that note, and a reading
    with ``used + free + reserved == total`` says it does not), so derived figures use
    :attr:`allocated_bytes`, which is right under either.

    ``processes`` is ``None`` when the process list could not be read (then what vLLM uses is
    unknown, not zero); ``index`` is ``None`` when NVML gives no index (some MIG devices).
    """

    index: int | None
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None
    memory_api: MemoryApi
    processes: tuple[GpuProcess, ...] | None

    @property
    def allocated_bytes(self) -> int:
        """Memory held by processes and their contexts: ``total - free - reserved``.

        With v1 there is no ``reserved``; NVML's ``used`` (which then includes the reservation,
        a few hundred MiB) is the best available figure.
        """
        if self.reserved_bytes is None:
            return self.used_bytes
        return max(0, self.total_bytes - self.free_bytes - self.reserved_bytes)


@dataclass(frozen=True, slots=True)
class GpuError:
    """One GPU, or one call on it, that failed during a read.

    ``selector`` names the GPU as it was asked for (a UUID, an index, ``all``); ``reason`` and
    ``call`` are bounded; ``detail`` is NVML's message, for logs only (never a label).
    """

    selector: str
    call: NvmlCall
    reason: GpuErrorReason
    detail: str


@dataclass(frozen=True, slots=True)
class NvmlUnavailable:
    """NVML cannot be used at all right now; ``retry_in_seconds`` says when the reader tries again.

    ``retry_in_seconds`` is ``None`` where the reader never retries (a recording).
    """

    reason: UnavailableReason
    detail: str
    retry_in_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """The result of one :meth:`GpuReader.read`: readings, per-GPU errors, or NVML unavailable.

    When ``unavailable`` is set, ``gpus`` and ``errors`` are empty. A GPU can have both a reading
    and an error (its process list failed: the reading has ``processes=None``).
    """

    gpus: tuple[GpuReading, ...] = ()
    errors: tuple[GpuError, ...] = ()
    unavailable: NvmlUnavailable | None = None

    @property
    def available(self) -> bool:
        """Whether NVML could be used for this read (some GPUs may still have failed)."""
        return self.unavailable is None

    @property
    def fault_key(self) -> tuple[str, ...]:
        """A stable, hashable summary of what is wrong; empty when nothing is.

        Log when it changes from one read to the next, not on every read: that is how a missing
        driver costs one log line instead of one per poll.
        """
        if self.unavailable is not None:
            return (f"unavailable:{self.unavailable.reason}",)
        return tuple(sorted({f"{e.selector}:{e.call}:{e.reason}" for e in self.errors}))


class GpuReader(Protocol):
    """The narrow seam between the sidecar and NVML (or a recording of it)."""

    def read(self, selection: GpuSelection) -> GpuSnapshot:
        """Read the selected GPUs now. Never raises: every failure is in the snapshot."""
        ...

    def close(self) -> None:
        """Release NVML. Idempotent; a later ``read`` starts over."""
        ...


# --------------------------------------------------------------------------------------------
# vLLM's share of each GPU (pure)
# --------------------------------------------------------------------------------------------


class SplitUnknownReason(StrEnum):
    """Why vLLM's share of a GPU is unknown (bounded: safe as a label value)."""

    #: NVML could not list the GPU's processes.
    PROCESS_LIST_UNAVAILABLE = "process_list_unavailable"
    #: We do not know vLLM's PIDs (no shared process namespace, no vLLM process found).
    VLLM_PIDS_UNKNOWN = "vllm_pids_unknown"
    #: None of vLLM's PIDs is in NVML's list: NVML reports PIDs of another namespace (host PIDs
    #: in a container), or no process at all, or vLLM does not use this GPU.
    VLLM_NOT_IN_PROCESS_LIST = "vllm_not_in_process_list"
    #: NVML lists vLLM's process but not how much memory it uses.
    PROCESS_MEMORY_UNAVAILABLE = "process_memory_unavailable"


@dataclass(frozen=True, slots=True)
class GpuMemorySplit:
    """One GPU's allocated memory divided into vLLM's processes and everything else.

    ``foreign_bytes`` is ``allocated_bytes - vllm_bytes`` (clamped at 0, because memory and the
    process list are two NVML calls and can disagree by what was allocated in between): other
    processes, and memory NVML attributes to no listed process. ``foreign_process_count`` counts
    the listed processes that are not vLLM's. All three are ``None`` together with
    ``unknown_reason`` when the split cannot be made honestly.
    """

    index: int | None
    uuid: str
    allocated_bytes: int
    vllm_bytes: int | None
    foreign_bytes: int | None
    foreign_process_count: int | None
    unknown_reason: SplitUnknownReason | None


def split_gpu_memory(reading: GpuReading, vllm_pids: Collection[int] | None) -> GpuMemorySplit:
    """Divide ``reading``'s allocated memory into vLLM's processes (``vllm_pids``) and the rest.

    ``vllm_pids`` must be the PIDs as NVML reports them; ``None`` or empty means unknown. A PID
    listed twice (compute and graphics) counts once, with the larger figure.
    """

    def unknown(reason: SplitUnknownReason) -> GpuMemorySplit:
        return GpuMemorySplit(
            index=reading.index,
            uuid=reading.uuid,
            allocated_bytes=reading.allocated_bytes,
            vllm_bytes=None,
            foreign_bytes=None,
            foreign_process_count=None,
            unknown_reason=reason,
        )

    if reading.processes is None:
        return unknown(SplitUnknownReason.PROCESS_LIST_UNAVAILABLE)
    if not vllm_pids:
        return unknown(SplitUnknownReason.VLLM_PIDS_UNKNOWN)
    by_pid = _merge_processes(reading.processes)
    wanted = set(vllm_pids)
    ours = [used for pid, used in by_pid.items() if pid in wanted]
    if not ours:
        return unknown(SplitUnknownReason.VLLM_NOT_IN_PROCESS_LIST)
    if any(used is None for used in ours):
        return unknown(SplitUnknownReason.PROCESS_MEMORY_UNAVAILABLE)
    vllm_bytes = sum(used for used in ours if used is not None)
    allocated = reading.allocated_bytes
    return GpuMemorySplit(
        index=reading.index,
        uuid=reading.uuid,
        allocated_bytes=allocated,
        vllm_bytes=vllm_bytes,
        foreign_bytes=max(0, allocated - vllm_bytes),
        foreign_process_count=len(by_pid) - len(ours),
        unknown_reason=None,
    )


def split_snapshot(
    snapshot: GpuSnapshot, vllm_pids: Collection[int] | None
) -> tuple[GpuMemorySplit, ...]:
    """:func:`split_gpu_memory` for every reading of ``snapshot``, in order."""
    return tuple(split_gpu_memory(reading, vllm_pids) for reading in snapshot.gpus)


def _merge_processes(processes: Iterable[GpuProcess]) -> dict[int, int | None]:
    # A process using CUDA and graphics is listed twice with the same memory: count it once.
    merged: dict[int, int | None] = {}
    for process in processes:
        if process.pid not in merged:
            merged[process.pid] = process.used_bytes
            continue
        known = [v for v in (merged[process.pid], process.used_bytes) if v is not None]
        merged[process.pid] = max(known) if known else None
    return merged


# --------------------------------------------------------------------------------------------
# NVML return codes and how we classify them
# --------------------------------------------------------------------------------------------


class NvmlReturn(IntEnum):
    """The NVML return codes we act on (``NVML_ERROR_<name>`` in ``nvml.h`` and ``pynvml``).

    Stable ABI values; ``tests/test_gpu.py`` checks each against the installed ``pynvml``.
    """

    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    NOT_FOUND = 6
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    LIB_RM_VERSION_MISMATCH = 18
    ARGUMENT_VERSION_MISMATCH = 25
    GPU_NOT_FOUND = 28


_GPU_REASONS: Final[Mapping[int, GpuErrorReason]] = {
    NvmlReturn.NOT_FOUND: GpuErrorReason.NOT_FOUND,
    NvmlReturn.GPU_NOT_FOUND: GpuErrorReason.NOT_FOUND,
    NvmlReturn.GPU_IS_LOST: GpuErrorReason.GPU_LOST,
    NvmlReturn.RESET_REQUIRED: GpuErrorReason.GPU_LOST,
    NvmlReturn.NOT_SUPPORTED: GpuErrorReason.NOT_SUPPORTED,
    NvmlReturn.NO_PERMISSION: GpuErrorReason.NO_PERMISSION,
    NvmlReturn.TIMEOUT: GpuErrorReason.TIMEOUT,
}

# Codes that mean the NVML session itself is gone, whichever call returned them.
_SESSION_REASONS: Final[Mapping[int, UnavailableReason]] = {
    NvmlReturn.LIBRARY_NOT_FOUND: UnavailableReason.LIBRARY_NOT_FOUND,
    NvmlReturn.DRIVER_NOT_LOADED: UnavailableReason.DRIVER_NOT_LOADED,
    NvmlReturn.LIB_RM_VERSION_MISMATCH: UnavailableReason.DRIVER_MISMATCH,
    NvmlReturn.UNINITIALIZED: UnavailableReason.UNINITIALIZED,
}

# Codes with which nvmlDeviceGetMemoryInfo_v2 says "not here": fall back to v1.
_MEMORY_V2_REFUSALS: Final = frozenset(
    {
        NvmlReturn.FUNCTION_NOT_FOUND,
        NvmlReturn.NOT_SUPPORTED,
        NvmlReturn.ARGUMENT_VERSION_MISMATCH,
    }
)

# NVML_VALUE_NOT_AVAILABLE for unsigned long long; pynvml maps it to None, a fake might not.
_NOT_AVAILABLE_ULL: Final = 2**64 - 1


_REINIT_REASONS: Final = frozenset({GpuErrorReason.GPU_LOST, GpuErrorReason.NOT_FOUND})


def gpu_error_reason(code: int | None, call: NvmlCall | None = None) -> GpuErrorReason:
    """The bounded reason for an NVML return code from a per-GPU call (``None``: not NVML's).

    ``nvmlDeviceGetHandleByIndex`` answers an index out of range with ``INVALID_ARGUMENT``:
    on a lookup that means the GPU is not there.
    """
    if code is None:
        return GpuErrorReason.CALL_FAILED
    if call is NvmlCall.LOOKUP and code == NvmlReturn.INVALID_ARGUMENT:
        return GpuErrorReason.NOT_FOUND
    return _GPU_REASONS.get(code, GpuErrorReason.CALL_FAILED)


def init_failure_reason(code: int | None) -> UnavailableReason:
    """The bounded reason for a failed ``nvmlInit`` with return code ``code``."""
    if code is None:
        return UnavailableReason.INIT_FAILED
    if code == NvmlReturn.NO_PERMISSION:
        return UnavailableReason.NO_PERMISSION
    return _SESSION_REASONS.get(code, UnavailableReason.INIT_FAILED)


# --------------------------------------------------------------------------------------------
# The NVML reader
# --------------------------------------------------------------------------------------------


#: Every ``pynvml`` name :class:`NvmlGpuReader` uses (checked against the installed package by
#: the tests). A fake NVML for tests provides these; production imports ``pynvml`` lazily.
NVML_NAMES_USED: Final = (
    "NVMLError",
    "nvmlMemory_v2",
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
)


class _CallFailed(Exception):
    """An NVML call failed; carries what a :class:`GpuError` needs."""

    def __init__(self, call: NvmlCall, code: int | None, detail: str) -> None:
        super().__init__(detail)
        self.call = call
        self.code = code
        self.detail = detail


class _SessionLost(Exception):
    """A call returned a code meaning the whole NVML session is gone."""

    def __init__(self, reason: UnavailableReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _Backoff:
    """Exponential retry delay: ``initial``, doubling per failure, capped at ``maximum``."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._delay = initial
        #: When the next attempt is allowed; ``None``: now.
        self.due_at: float | None = None

    def failed(self, now: float) -> None:
        self.due_at = now + self._delay
        self._delay = min(self._delay * 2, self._maximum)

    def reset(self) -> None:
        self._delay = self._initial
        self.due_at = None

    def is_due(self, now: float) -> bool:
        return self.due_at is None or now >= self.due_at

    def remaining(self, now: float) -> float | None:
        return None if self.due_at is None else max(0.0, self.due_at - now)


@dataclass(frozen=True, slots=True)
class _Memory:
    api: MemoryApi
    total: int
    free: int
    used: int
    reserved: int | None


class NvmlGpuReader:
    """Reads GPU memory and processes through NVML; every failure comes back as data.

    - NVML is initialised lazily, on the first :meth:`read`. If that fails (no library, no
      driver...), reads return :class:`NvmlUnavailable` without calling NVML again until a backoff
      (``retry_initial_seconds``, doubling up to ``retry_max_seconds``) has passed.
    - A call that reports the session gone (driver unloaded, library mismatch) shuts NVML down and
      enters the same backoff. A lost or missing GPU is a per-GPU error; NVML is then
      re-initialised on a backoff of its own, because a GPU that comes back after a reset is only
      seen by a new session (the other GPUs are read as usual meanwhile).
    - GPUs are looked up on every read (by UUID, index, or MIG index), never cached: a handle
      does not survive a GPU reset, and a lookup costs microseconds.
    - Memory comes from ``nvmlDeviceGetMemoryInfo`` v2 where the driver has it, because v2
      reports the driver's reservation separately, which gives the memory processes actually
      hold (:attr:`GpuReading.allocated_bytes`); v1 folds the reservation into ``used``.
    - Processes are NVML's compute and graphics lists (``_v3`` calls, ``_v2`` on drivers without
      them), merged by PID. MPS clients are not listed (only the MPS server is).

    ``nvml`` is the ``pynvml`` module or a fake with the names in :data:`NVML_NAMES_USED`;
    ``None`` imports ``pynvml`` on first use. ``clock`` gives monotonic seconds. Reads and
    :meth:`close` are serialised by a lock. NVML calls block: call :meth:`read` off the event loop.
    """

    def __init__(
        self,
        *,
        nvml: object | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_initial_seconds: float = 5.0,
        retry_max_seconds: float = 300.0,
    ) -> None:
        self._api = nvml
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._init_backoff = _Backoff(retry_initial_seconds, retry_max_seconds)
        self._reinit_backoff = _Backoff(retry_initial_seconds, retry_max_seconds)
        self._last_unavailable: tuple[UnavailableReason, str] | None = None
        self._memory_v2 = True
        self._processes_v3 = True

    def read(self, selection: GpuSelection) -> GpuSnapshot:
        """Read the selected GPUs. Never raises."""
        with self._lock:
            now = self._clock()
            if (
                self._open
                and self._reinit_backoff.due_at is not None
                and self._reinit_backoff.is_due(now)
            ):
                self._shutdown()
            if not self._open:
                unavailable = self._start(now)
                if unavailable is not None:
                    return GpuSnapshot(unavailable=unavailable)
            try:
                gpus, errors = self._read_devices(selection)
            except _SessionLost as lost:
                self._shutdown()
                self._init_backoff.failed(now)
                self._last_unavailable = (lost.reason, lost.detail)
                return GpuSnapshot(unavailable=self._unavailable(now))
            # A GPU that is lost or gone may come back (reset, re-plugged MIG device), but only a
            # new session enumerates it again: re-initialise on a backoff while any is missing.
            if any(error.reason in _REINIT_REASONS for error in errors):
                if self._reinit_backoff.is_due(now):
                    self._reinit_backoff.failed(now)
            else:
                self._reinit_backoff.reset()
            return GpuSnapshot(gpus=tuple(gpus), errors=tuple(errors))

    def close(self) -> None:
        """Shut NVML down if this reader initialised it. Idempotent."""
        with self._lock:
            self._shutdown()
            self._reinit_backoff.reset()

    # -- session ----------------------------------------------------------------------------

    def _start(self, now: float) -> NvmlUnavailable | None:
        if not self._init_backoff.is_due(now) and self._last_unavailable is not None:
            return self._unavailable(now)
        if self._api is None:
            try:
                self._api = importlib.import_module("pynvml")
            except ImportError as exc:
                detail = f"cannot import pynvml (install nvidia-ml-py): {exc}"
                return self._init_failed(now, UnavailableReason.MODULE_MISSING, detail)
        try:
            self._api.nvmlInit()  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - the bindings may raise anything: it is data here
            reason = init_failure_reason(_code_of(self._api, exc))
            return self._init_failed(now, reason, _describe(exc))
        self._open = True
        self._init_backoff.reset()
        self._last_unavailable = None
        # Keep the re-init delay growing while a GPU stays lost, but do not re-init right away.
        self._reinit_backoff.due_at = None
        # A new session may be a new driver: try the newer calls again.
        self._memory_v2 = True
        self._processes_v3 = True
        return None

    def _init_failed(self, now: float, reason: UnavailableReason, detail: str) -> NvmlUnavailable:
        self._init_backoff.failed(now)
        self._last_unavailable = (reason, detail)
        return self._unavailable(now)

    def _unavailable(self, now: float) -> NvmlUnavailable:
        reason, detail = self._last_unavailable or (UnavailableReason.INIT_FAILED, "")
        return NvmlUnavailable(reason, detail, self._init_backoff.remaining(now))

    def _shutdown(self) -> None:
        if not self._open:
            return
        self._open = False
        # Best effort: the session is being dropped whatever nvmlShutdown says.
        with contextlib.suppress(Exception):
            self._api.nvmlShutdown()  # type: ignore[union-attr]

    # -- devices ----------------------------------------------------------------------------

    def _read_devices(self, selection: GpuSelection) -> tuple[list[GpuReading], list[GpuError]]:
        gpus: list[GpuReading] = []
        errors: list[GpuError] = []
        selectors: Sequence[GpuSelector]
        if isinstance(selection, AllGpus):
            try:
                count = self._call(NvmlCall.COUNT, "nvmlDeviceGetCount")
                selectors = [IndexSelector(i) for i in range(int(count))]
            except _CallFailed as failed:
                errors.append(_error(str(selection), failed))
                return gpus, errors
            except (TypeError, ValueError) as exc:
                errors.append(_unexpected(str(selection), NvmlCall.COUNT, exc))
                return gpus, errors
        else:
            selectors = selection
        for selector in selectors:
            try:
                reading, process_error = self._read_one(selector)
            except _CallFailed as failed:
                errors.append(_error(str(selector), failed))
                continue
            gpus.append(reading)
            if process_error is not None:
                errors.append(_error(str(selector), process_error))
        return gpus, errors

    def _read_one(self, selector: GpuSelector) -> tuple[GpuReading, _CallFailed | None]:
        handle = self._lookup(selector)
        uuid = _text(self._call(NvmlCall.IDENTITY, "nvmlDeviceGetUUID", handle))
        name = _text(self._call(NvmlCall.IDENTITY, "nvmlDeviceGetName", handle))
        index = self._index_of(handle, selector)
        memory = self._memory(handle)
        processes: tuple[GpuProcess, ...] | None
        process_error: _CallFailed | None = None
        try:
            processes = self._processes(handle)
        except _CallFailed as failed:
            processes, process_error = None, failed
        reading = GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            total_bytes=memory.total,
            used_bytes=memory.used,
            free_bytes=memory.free,
            reserved_bytes=memory.reserved,
            memory_api=memory.api,
            processes=processes,
        )
        return reading, process_error

    def _lookup(self, selector: GpuSelector) -> object:
        if isinstance(selector, UuidSelector):
            return self._call(NvmlCall.LOOKUP, "nvmlDeviceGetHandleByUUID", selector.uuid)
        if isinstance(selector, IndexSelector):
            return self._call(NvmlCall.LOOKUP, "nvmlDeviceGetHandleByIndex", selector.index)
        parent = self._call(NvmlCall.LOOKUP, "nvmlDeviceGetHandleByIndex", selector.gpu_index)
        return self._call(
            NvmlCall.LOOKUP, "nvmlDeviceGetMigDeviceHandleByIndex", parent, selector.mig_index
        )

    def _index_of(self, handle: object, selector: GpuSelector) -> int | None:
        # MIG device handles have no index of their own: report the parent GPU's.
        try:
            return _whole(self._call(NvmlCall.IDENTITY, "nvmlDeviceGetIndex", handle))
        except (_CallFailed, TypeError, ValueError):
            pass
        if isinstance(selector, MigIndexSelector):
            return selector.gpu_index
        try:
            parent = self._call(
                NvmlCall.IDENTITY, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle
            )
            return _whole(self._call(NvmlCall.IDENTITY, "nvmlDeviceGetIndex", parent))
        except (_CallFailed, TypeError, ValueError):
            return None

    def _memory(self, handle: object) -> _Memory:
        version = getattr(self._api, "nvmlMemory_v2", None)
        if self._memory_v2 and version is not None:
            try:
                raw = self._call(NvmlCall.MEMORY, "nvmlDeviceGetMemoryInfo", handle, version)
                return _memory(MemoryApi.V2, raw)
            except _CallFailed as failed:
                if failed.code not in _MEMORY_V2_REFUSALS:
                    raise
                # A library without the symbol will never have it; one device refusing it says
                # nothing of the others: only the former sticks for the rest of the session.
                if failed.code == NvmlReturn.FUNCTION_NOT_FOUND:
                    self._memory_v2 = False
        return _memory(MemoryApi.V1, self._call(NvmlCall.MEMORY, "nvmlDeviceGetMemoryInfo", handle))

    def _processes(self, handle: object) -> tuple[GpuProcess, ...]:
        found: list[GpuProcess] = []
        for kind in ("Compute", "Graphics"):
            raw: object = None
            if self._processes_v3:
                try:
                    raw = self._call(
                        NvmlCall.PROCESSES, f"nvmlDeviceGet{kind}RunningProcesses_v3", handle
                    )
                except _CallFailed as failed:
                    if failed.code != NvmlReturn.FUNCTION_NOT_FOUND:
                        raise
                    self._processes_v3 = False
            if raw is None:
                raw = self._call(
                    NvmlCall.PROCESSES, f"nvmlDeviceGet{kind}RunningProcesses_v2", handle
                )
            found.extend(_processes_from(raw))
        merged = _merge_processes(found)
        return tuple(GpuProcess(pid, used) for pid, used in sorted(merged.items()))

    def _call(self, call: NvmlCall, name: str, *args: object) -> Any:
        api = self._api
        try:
            function = getattr(api, name)
        except AttributeError as exc:
            # Older bindings: treat a missing wrapper like a missing library symbol.
            raise _CallFailed(call, NvmlReturn.FUNCTION_NOT_FOUND, f"pynvml has no {name}") from exc
        try:
            return function(*args)
        except Exception as exc:  # every failure becomes data
            code = _code_of(api, exc)
            if code is not None and code in _SESSION_REASONS:
                raise _SessionLost(_SESSION_REASONS[code], _describe(exc)) from exc
            raise _CallFailed(call, code, _describe(exc)) from exc


def _memory(api: MemoryApi, raw: object) -> _Memory:
    # NVML returns a ctypes struct; a misbehaving binding must cost this GPU, not the read.
    try:
        return _Memory(
            api=api,
            total=_whole(getattr(raw, "total")),  # noqa: B009 - raw is an untyped struct
            free=_whole(getattr(raw, "free")),  # noqa: B009
            used=_whole(getattr(raw, "used")),  # noqa: B009
            reserved=_whole(getattr(raw, "reserved")) if api is MemoryApi.V2 else None,  # noqa: B009
        )
    except (AttributeError, TypeError, ValueError) as exc:
        raise _CallFailed(NvmlCall.MEMORY, None, f"unexpected memory info: {exc}") from exc


def _processes_from(raw: object) -> list[GpuProcess]:
    try:
        items = list(raw)  # type: ignore[call-overload]
        return [_process(item) for item in items]
    except (AttributeError, TypeError, ValueError) as exc:
        raise _CallFailed(NvmlCall.PROCESSES, None, f"unexpected process list: {exc}") from exc


def _process(item: object) -> GpuProcess:
    used = getattr(item, "usedGpuMemory", None)
    if used is not None:
        used = _whole(used)
        if used >= _NOT_AVAILABLE_ULL:
            used = None
    return GpuProcess(pid=_whole(getattr(item, "pid")), used_bytes=used)  # noqa: B009


def _whole(value: object) -> int:
    """A non-negative integer from NVML, or ``ValueError``/``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"expected an integer, got {type(value).__name__}"
        raise TypeError(msg)
    if value < 0:
        msg = f"expected a non-negative integer, got {value}"
        raise ValueError(msg)
    return value


def _error(selector: str, failed: _CallFailed) -> GpuError:
    return GpuError(
        selector, failed.call, gpu_error_reason(failed.code, failed.call), failed.detail
    )


def _unexpected(selector: str, call: NvmlCall, exc: Exception) -> GpuError:
    return GpuError(selector, call, GpuErrorReason.CALL_FAILED, _describe(exc))


def _code_of(api: object, exc: BaseException) -> int | None:
    error_class = getattr(api, "NVMLError", None)
    if isinstance(error_class, type) and isinstance(exc, error_class):
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None
    return None


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - pynvml's __str__ may call into a half-loaded library
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


# --------------------------------------------------------------------------------------------
# Recordings: the JSON format, and a reader that replays them
# --------------------------------------------------------------------------------------------

#: The ``format`` field of every recording this module reads and writes.
RECORDING_FORMAT: Final = "vllm-headroom/nvml-recording/v1"


class NvmlRecordingError(UsageError):
    """A recorded-NVML JSON file cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """A failed call on one GPU in a recorded sample, identified by its index and/or UUID.

    With ``call=processes`` the GPU also has a reading (its ``processes`` is ``None``); with
    any other call it has none. Both identities ``None``: a failure for all GPUs (``count``).
    """

    index: int | None
    uuid: str | None
    call: NvmlCall
    reason: GpuErrorReason
    detail: str


@dataclass(frozen=True, slots=True)
class RecordedSample:
    """One recorded read of every GPU: readings and failures, or NVML unavailable."""

    t: float
    gpus: tuple[GpuReading, ...] = ()
    failures: tuple[RecordedFailure, ...] = ()
    unavailable: NvmlUnavailable | None = None


@dataclass(frozen=True, slots=True)
class Recording:
    """A sequence of samples, as :func:`parse_recording` reads it from one file.

    ``source`` says where the numbers come from: ``synthetic`` or ``captured`` (by
    ``scripts/record-nvml.py`` on real hardware, with the driver version in ``description``).
    """

    source: str
    description: str
    samples: tuple[RecordedSample, ...]


def replay_sample(sample: RecordedSample, selection: GpuSelection) -> GpuSnapshot:
    """What a reader would have returned for ``selection`` when ``sample`` was recorded.

    A selected GPU absent from the sample is ``not_found``, as NVML reports a GPU that has left
    the bus. MIG index selectors match nothing (recordings identify MIG devices by UUID).
    """
    if sample.unavailable is not None:
        return GpuSnapshot(unavailable=sample.unavailable)
    gpus: list[GpuReading] = []
    errors: list[GpuError] = []
    if isinstance(selection, AllGpus):
        gpus.extend(sample.gpus)
        errors.extend(
            GpuError(_recorded_name(f.index, f.uuid), f.call, f.reason, f.detail)
            for f in sample.failures
        )
        return GpuSnapshot(gpus=tuple(gpus), errors=tuple(errors))
    for selector in selection:
        name = str(selector)
        readings = [r for r in sample.gpus if _matches(selector, r.index, r.uuid)]
        failures = [f for f in sample.failures if _matches(selector, f.index, f.uuid)]
        gpus.extend(readings[:1])
        errors.extend(GpuError(name, f.call, f.reason, f.detail) for f in failures)
        if not readings and not failures:
            detail = "not in the recorded sample"
            errors.append(GpuError(name, NvmlCall.LOOKUP, GpuErrorReason.NOT_FOUND, detail))
    return GpuSnapshot(gpus=tuple(gpus), errors=tuple(errors))


def _matches(selector: GpuSelector, index: int | None, uuid: str | None) -> bool:
    if isinstance(selector, UuidSelector):
        return uuid is not None and uuid == selector.uuid
    if isinstance(selector, IndexSelector):
        return index is not None and index == selector.index
    return False


def _recorded_name(index: int | None, uuid: str | None) -> str:
    if index is not None:
        return str(index)
    return uuid if uuid is not None else str(ALL_GPUS)


class RecordedGpuReader:
    """Replays a recording: each :meth:`read` returns the next sample, filtered by ``selection``.

    After the last sample it keeps returning the last one, or starts over with ``loop=True``.
    """

    def __init__(self, recording: Recording, *, loop: bool = False) -> None:
        if not recording.samples:
            msg = "an NVML recording needs at least one sample"
            raise NvmlRecordingError(msg)
        self._samples = recording.samples
        self._loop = loop
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path, *, loop: bool = False) -> RecordedGpuReader:
        """A reader over the recording in ``path``; a bad file raises NvmlRecordingError."""
        return cls(load_recording(path), loop=loop)

    def read(self, selection: GpuSelection) -> GpuSnapshot:
        """The next recorded sample, as NVML would have answered for ``selection``."""
        with self._lock:
            sample = self._samples[self._next]
            if self._next + 1 < len(self._samples):
                self._next += 1
            elif self._loop:
                self._next = 0
        return replay_sample(sample, selection)

    def close(self) -> None:
        """Nothing to release."""


def sample_from_snapshot(snapshot: GpuSnapshot, t: float) -> RecordedSample:
    """The sample to record for ``snapshot`` (a read of every GPU), taken ``t`` seconds in."""
    if snapshot.unavailable is not None:
        return RecordedSample(t=t, unavailable=snapshot.unavailable)
    failures: list[RecordedFailure] = []
    for error in snapshot.errors:
        index: int | None = int(error.selector) if error.selector.isdigit() else None
        uuid: str | None = error.selector if error.selector.startswith(("GPU-", "MIG-")) else None
        if error.call is NvmlCall.PROCESSES:
            # Identify it by the reading it belongs to, whichever way it was selected.
            for reading in snapshot.gpus:
                if reading.uuid == uuid or (index is not None and reading.index == index):
                    index, uuid = reading.index, reading.uuid
                    break
        failures.append(RecordedFailure(index, uuid, error.call, error.reason, error.detail))
    return RecordedSample(t=t, gpus=snapshot.gpus, failures=tuple(failures))


def load_recording(path: Path) -> Recording:
    """Read and check a recording file; problems raise :class:`NvmlRecordingError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read NVML recording {path}: {exc}"
        raise NvmlRecordingError(msg) from exc
    return parse_recording(text, origin=str(path))


def recording_to_json(recording: Recording) -> str:
    """The JSON text of ``recording``: the inverse of :func:`parse_recording`."""
    document = {
        "format": RECORDING_FORMAT,
        "source": recording.source,
        "description": recording.description,
        "samples": [_sample_json(sample) for sample in recording.samples],
    }
    return json.dumps(document, indent=1) + "\n"


def _sample_json(sample: RecordedSample) -> dict[str, Any]:
    if sample.unavailable is not None:
        unavailable = {
            "reason": str(sample.unavailable.reason),
            "detail": sample.unavailable.detail,
        }
        return {"t": sample.t, "unavailable": unavailable}
    gpus: list[dict[str, Any]] = []
    for reading in sample.gpus:
        memory: dict[str, Any] = {
            "api": str(reading.memory_api),
            "total": reading.total_bytes,
            "free": reading.free_bytes,
            "used": reading.used_bytes,
        }
        if reading.reserved_bytes is not None:
            memory["reserved"] = reading.reserved_bytes
        processes = (
            None
            if reading.processes is None
            else [{"pid": p.pid, "used": p.used_bytes} for p in reading.processes]
        )
        gpus.append(
            {
                "index": reading.index,
                "uuid": reading.uuid,
                "name": reading.name,
                "memory": memory,
                "processes": processes,
            }
        )
    failures = [
        {
            "index": f.index,
            "uuid": f.uuid,
            "call": str(f.call),
            "reason": str(f.reason),
            "detail": f.detail,
        }
        for f in sample.failures
    ]
    return {"t": sample.t, "gpus": gpus, "failures": failures}


def parse_recording(text: str, *, origin: str = "recording") -> Recording:
    """Parse a recording's JSON; an error names ``origin`` and the offending field, on one line."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"{origin}: not JSON ({exc.msg} at line {exc.lineno}); expected an NVML recording"
        raise NvmlRecordingError(msg) from exc
    fields = _Fields(origin)
    root = fields.mapping(document, "")
    fmt = fields.string(root, "", "format")
    if fmt != RECORDING_FORMAT:
        fields.fail("format", f"{RECORDING_FORMAT!r} (got {fmt!r})")
    raw_samples = fields.array(root, "", "samples")
    if not raw_samples:
        fields.fail("samples", "a non-empty list (record at least one sample)")
    return Recording(
        source=fields.string(root, "", "source"),
        description=fields.string(root, "", "description", default=""),
        samples=tuple(
            _parse_sample(fields, raw, f"samples[{i}]") for i, raw in enumerate(raw_samples)
        ),
    )


def _parse_sample(fields: _Fields, raw: object, where: str) -> RecordedSample:
    sample = fields.mapping(raw, where)
    t = fields.number(sample.get("t"), f"{where}.t")
    if sample.get("unavailable") is not None:
        at = f"{where}.unavailable"
        body = fields.mapping(sample["unavailable"], at)
        unavailable = NvmlUnavailable(
            reason=fields.choice(body, at, "reason", UnavailableReason),
            detail=fields.string(body, at, "detail", default=""),
        )
        return RecordedSample(t=t, unavailable=unavailable)
    gpus = tuple(
        _parse_reading(fields, item, f"{where}.gpus[{i}]")
        for i, item in enumerate(fields.array(sample, where, "gpus"))
    )
    failures = tuple(
        _parse_failure(fields, item, f"{where}.failures[{i}]")
        for i, item in enumerate(fields.array(sample, where, "failures", default=[]))
    )
    return RecordedSample(t=t, gpus=gpus, failures=failures)


def _parse_reading(fields: _Fields, raw: object, where: str) -> GpuReading:
    gpu = fields.mapping(raw, where)
    at = f"{where}.memory"
    memory = fields.mapping(gpu.get("memory"), at)
    api = fields.choice(memory, at, "api", MemoryApi)
    raw_processes = gpu.get("processes")
    processes: tuple[GpuProcess, ...] | None = None
    if raw_processes is not None:
        if not isinstance(raw_processes, list):
            fields.fail(f"{where}.processes", "a list or null")
        processes = tuple(
            _parse_process(fields, p, f"{where}.processes[{i}]")
            for i, p in enumerate(raw_processes)
        )
    return GpuReading(
        index=fields.optional_whole(gpu.get("index"), f"{where}.index"),
        uuid=fields.string(gpu, where, "uuid"),
        name=fields.string(gpu, where, "name"),
        total_bytes=fields.whole(memory.get("total"), f"{at}.total"),
        used_bytes=fields.whole(memory.get("used"), f"{at}.used"),
        free_bytes=fields.whole(memory.get("free"), f"{at}.free"),
        reserved_bytes=(
            fields.whole(memory.get("reserved"), f"{at}.reserved") if api is MemoryApi.V2 else None
        ),
        memory_api=api,
        processes=processes,
    )


def _parse_failure(fields: _Fields, raw: object, where: str) -> RecordedFailure:
    body = fields.mapping(raw, where)
    uuid = body.get("uuid")
    if uuid is not None and not isinstance(uuid, str):
        fields.fail(f"{where}.uuid", "a string or null")
    return RecordedFailure(
        index=fields.optional_whole(body.get("index"), f"{where}.index"),
        uuid=uuid,
        call=fields.choice(body, where, "call", NvmlCall),
        reason=fields.choice(body, where, "reason", GpuErrorReason),
        detail=fields.string(body, where, "detail", default=""),
    )


def _parse_process(fields: _Fields, raw: object, where: str) -> GpuProcess:
    process = fields.mapping(raw, where)
    used = process.get("used")
    return GpuProcess(
        pid=fields.whole(process.get("pid"), f"{where}.pid"),
        used_bytes=None if used is None else fields.whole(used, f"{where}.used"),
    )


class _Fields:
    """Typed accessors over parsed JSON that fail with one line naming the file and the field."""

    def __init__(self, origin: str) -> None:
        self._origin = origin

    def fail(self, where: str, expected: str) -> NoReturn:
        msg = f"{self._origin}: {where or 'the document'} must be {expected}"
        raise NvmlRecordingError(msg)

    def mapping(self, value: object, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, "a JSON object")
        return value

    def string(
        self, body: Mapping[str, Any], where: str, key: str, default: str | None = None
    ) -> str:
        path = f"{where}.{key}" if where else key
        value = body.get(key, default)
        if not isinstance(value, str):
            self.fail(path, "a string")
        return value

    def array(
        self, body: Mapping[str, Any], where: str, key: str, default: list[Any] | None = None
    ) -> list[Any]:
        path = f"{where}.{key}" if where else key
        value = body.get(key, default)
        if not isinstance(value, list):
            self.fail(path, "a list")
        return value

    def choice(self, body: Mapping[str, Any], where: str, key: str, kind: type[_E]) -> _E:
        value = body.get(key)
        options = ", ".join(str(member) for member in kind)
        if not isinstance(value, str) or value not in {str(member) for member in kind}:
            self.fail(f"{where}.{key}", f"one of {options} (got {value!r})")
        return kind(value)

    def number(self, value: object, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(where, "a number")
        if not math.isfinite(value):
            self.fail(where, "a finite number")
        return float(value)

    def whole(self, value: object, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(where, "a non-negative integer")
        return value

    def optional_whole(self, value: object, where: str) -> int | None:
        return None if value is None else self.whole(value, where)
