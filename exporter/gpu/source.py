"""vLLM's GPUs for the poller: visibility, an NVML (or recorded) reader, the memory split.

This adapts a reader (``exporter.gpu.nvml``, ``exporter.gpu.recording``) and
``exporter.gpu.visibility`` to the poller's :class:`~exporter.service.poller.GpuSource` seam, and
turns readings into the plain :class:`~exporter.core.views.GpuMemoryView` the collectors expose
(:func:`~exporter.gpu.memory.gpu_views`). Which GPUs are vLLM's is decided again on every read (a
``/proc`` scan costs a few milliseconds): after a vLLM restart its PIDs change, and they must not be
mistaken for foreign processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

from exporter.errors import SourceError
from exporter.gpu.memory import gpu_views
from exporter.gpu.model import ALL_GPUS
from exporter.gpu.visibility import discover_gpu_visibility, parse_gpu_selectors

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.core.views import GpuMemoryView
    from exporter.gpu.model import GpuReader, GpuSelector
    from exporter.gpu.visibility import GpuVisibility


class NvmlGpuSource:
    """The poller's GPU source: which GPUs are vLLM's, read through a :class:`GpuReader`."""

    #: The ``source`` label of its health gauges.
    source: Final = "nvml"

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
        """Build from the gpus, gpu_discovery and proc_root settings (Settings checked them)."""
        explicit = parse_gpu_selectors(gpus) if gpus and discovery in ("auto", "settings") else ()
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
