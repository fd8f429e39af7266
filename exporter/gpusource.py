"""vLLM's GPUs for the poller: visibility, an NVML (or recorded) reader, the memory split.

This adapts ``exporter.gpu`` and ``exporter.gpu_visibility`` to the poller's
:class:`~exporter.poller.GpuSource` seam and turns readings into the plain
:class:`~exporter.views.GpuMemoryView` the collectors expose. Which GPUs are vLLM's is decided
again on every read (a ``/proc`` scan costs a few milliseconds): after a vLLM restart its PIDs
change, and they must not be mistaken for foreign processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from exporter.errors import SourceError, UsageError
from exporter.gpu import ALL_GPUS, GpuErrorReason, UnavailableReason, split_snapshot
from exporter.gpu_visibility import (
    VisibilityState,
    discover_gpu_visibility,
    parse_gpu_selectors,
)
from exporter.views import GpuMemoryView

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.gpu import GpuReader, GpuSelector, GpuSnapshot
    from exporter.gpu_visibility import GpuVisibility

#: Reasons of the ``nvml`` source (label values of ``headroom_source_errors_total``).
NVML_REASONS: tuple[str, ...] = (
    *(r.value for r in UnavailableReason),
    *(r.value for r in GpuErrorReason),
    *(
        s.value
        for s in VisibilityState
        if s not in (VisibilityState.EXPLICIT, VisibilityState.FROM_PROCESS)
    ),
)


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


class NvmlGpuSource:
    """The poller's GPU source: which GPUs are vLLM's, read through a :class:`GpuReader`."""

    def __init__(
        self,
        reader: GpuReader,
        *,
        explicit: Sequence[GpuSelector] = (),
        allow_all: bool = False,
        proc_root: Path = Path("/proc"),
        discover: Callable[..., GpuVisibility] = discover_gpu_visibility,
    ) -> None:
        self._reader = reader
        self._explicit = tuple(explicit)
        self._allow_all = allow_all
        self._proc_root = proc_root
        self._discover = discover

    @classmethod
    def from_settings(
        cls, reader: GpuReader, *, gpus: Sequence[str], discovery: str, proc_root: Path
    ) -> NvmlGpuSource:
        """Build from the ``gpus``/``gpu_discovery``/``proc_root`` settings (UsageError if bad)."""
        explicit = parse_gpu_selectors(gpus) if gpus and discovery in ("auto", "settings") else ()
        if discovery == "settings" and not explicit:
            msg = "gpu_discovery=settings needs the gpus setting (GPU UUIDs or indices)"
            raise UsageError(msg)
        return cls(reader, explicit=explicit, allow_all=discovery == "all", proc_root=proc_root)

    def read(
        self, gpu_memory_utilization: float | None
    ) -> tuple[tuple[GpuMemoryView, ...], SourceError | None]:
        """Read vLLM's GPUs: the views, and the failure if any (partial reads keep their views)."""
        visibility = self._discover(explicit=self._explicit, proc_root=self._proc_root)
        selection = visibility.selection(allow_all=self._allow_all)
        if selection is None:
            return (), SourceError(visibility.state.value, visibility.detail)
        snapshot = self._reader.read(selection)
        if snapshot.unavailable is not None:
            return (), SourceError(snapshot.unavailable.reason.value, snapshot.unavailable.detail)
        pids = visibility.vllm_pids or None
        views = gpu_views(snapshot, pids, gpu_memory_utilization)
        if snapshot.errors:
            first = snapshot.errors[0]
            return views, SourceError(
                first.reason.value, f"GPU {first.selector}: {first.call.value}: {first.detail}"
            )
        if selection is ALL_GPUS and not views:
            return views, SourceError("no_gpus", "NVML sees no GPU")
        return views, None

    def close(self) -> None:
        """Release NVML."""
        self._reader.close()
