"""GPU readings as plain data, and the reader seam: what NVML (or a recording of it) answers.

A :class:`GpuSnapshot` holds one :class:`GpuReading` per GPU that could be read, one
:class:`GpuError` per GPU (or per call) that could not, and, when NVML itself cannot be used
(no ``nvidia-ml-py``, no ``libnvidia-ml.so.1``, driver not loaded), a single
:class:`NvmlUnavailable` instead. Failures are data with bounded reasons
(:mod:`exporter.core.reasons`), never exceptions. A :class:`GpuReader` has ``read(selection)``
and ``close()``: :class:`~exporter.gpu.nvml.NvmlGpuReader` talks to NVML,
:class:`~exporter.gpu.recording.RecordedGpuReader` replays a recording.

Readers do not log: a caller logs once per change of :attr:`GpuSnapshot.fault_key`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from exporter.core.reasons import GpuErrorReason, UnavailableReason

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
