"""vLLM's share of each GPU (pure): its processes' memory, everything else's, the views.

:func:`split_gpu_memory` says *unknown* (with a reason) rather than 0 when NVML does not
attribute memory to processes, as is common inside containers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from exporter.core.views import GpuMemoryView

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

    from exporter.gpu.model import GpuProcess, GpuReading, GpuSnapshot


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
    by_pid = merge_processes(reading.processes)
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


def merge_processes(processes: Iterable[GpuProcess]) -> dict[int, int | None]:
    """Memory by PID over NVML's process lists; a PID listed twice counts once."""
    # A process using CUDA and graphics is listed twice with the same memory: count it once.
    merged: dict[int, int | None] = {}
    for process in processes:
        if process.pid not in merged:
            merged[process.pid] = process.used_bytes
            continue
        known = [v for v in (merged[process.pid], process.used_bytes) if v is not None]
        merged[process.pid] = max(known) if known else None
    return merged


#: The driver's reservation where NVML's v1 memory call cannot report it: on an H100, NVML's
#: total is 81,559 MiB and CUDA's 79.19 GiB (docs/sizing.md, kv-calibration data).
DEFAULT_RESERVED_BYTES = 470 * 1024 * 1024


def gpu_views(
    snapshot: GpuSnapshot,
    vllm_pids: frozenset[int] | None,
    gpu_memory_utilization: float | None,
) -> tuple[GpuMemoryView, ...]:
    """Plain views of a GPU snapshot (pure).

    ``cuda_total_bytes`` is NVML's total less the driver's reservation (or, where NVML does not
    report it, less :data:`DEFAULT_RESERVED_BYTES`): the total vLLM multiplies by its utilization.
    ``vllm_predicted_bytes`` is what vLLM claims: ``cuda total x gpu_memory_utilization``.
    ``unexplained_bytes`` is the allocated memory beyond that claim: memory vLLM's budget does
    not account for, measurable even where processes cannot be attributed by PID.
    """
    splits = {(s.index, s.uuid): s for s in split_snapshot(snapshot, vllm_pids)}
    views = []
    for reading in snapshot.gpus:
        split = splits.get((reading.index, reading.uuid))
        reserved = (
            reading.reserved_bytes
            if reading.reserved_bytes is not None
            else min(DEFAULT_RESERVED_BYTES, reading.total_bytes // 10)
        )
        cuda_total = float(reading.total_bytes - reserved)
        predicted = (
            cuda_total * gpu_memory_utilization if gpu_memory_utilization is not None else None
        )
        allocated = reading.allocated_bytes
        views.append(
            GpuMemoryView(
                index=str(reading.index) if reading.index is not None else "",
                uuid=reading.uuid,
                name=reading.name,
                total_bytes=float(reading.total_bytes),
                used_bytes=float(allocated),
                free_bytes=float(reading.free_bytes),
                cuda_total_bytes=cuda_total,
                vllm_bytes=_float(split.vllm_bytes) if split else None,
                foreign_bytes=_float(split.foreign_bytes) if split else None,
                vllm_predicted_bytes=predicted,
                unexplained_bytes=max(0.0, allocated - predicted)
                if predicted is not None
                else None,
            )
        )
    return tuple(views)


def _float(value: int | None) -> float | None:
    return float(value) if value is not None else None
