"""The NVML reader: GPU memory and processes through ``nvidia-ml-py``, every failure as data."""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final

from exporter.core.reasons import GpuErrorReason, UnavailableReason
from exporter.gpu.memory import merge_processes
from exporter.gpu.model import (
    AllGpus,
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

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from exporter.gpu.model import GpuSelection, GpuSelector


class NvmlReturn(IntEnum):
    """The NVML return codes we act on (``NVML_ERROR_<name>`` in ``nvml.h`` and ``pynvml``).

    Stable ABI values; ``tests/gpu/test_nvml.py`` checks each against the installed ``pynvml``.
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
        merged = merge_processes(found)
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
