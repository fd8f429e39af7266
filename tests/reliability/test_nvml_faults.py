"""NVML failing under the sidecar: injected through the fake ``nvml`` seam of NvmlGpuReader.

The exporter runs in-process (``serve()`` with a GPU source over a fake NVML library) against
the fake vLLM. For each fault: ``/metrics`` keeps answering, the vLLM side stays up, the
``nvml`` source is down with the fault's reason, the GPUs that still answer are still exposed,
and once the fault ends the GPUs come back without a restart; this process holds no more
threads or file descriptors than before.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from exporter.core.views import TargetView
from exporter.gpu.model import IndexSelector
from exporter.gpu.nvml import NvmlGpuReader
from exporter.gpu.source import NvmlGpuSource
from exporter.service.app import Components
from exporter.testing.processes import ExporterThread, Scrape

from .harness import mock_vllm_poller

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from exporter.core.views import GpuMemoryView
    from exporter.errors import SourceError
    from exporter.service.poller import GpuSource
    from exporter.service.settings import Settings
    from exporter.testing.fakevllm import FakeVllm

    from .conftest import Figures

GIB = 1024**3
UUIDS = ("GPU-00000000-0000-4000-8000-000000000000", "GPU-11111111-1111-4111-8111-111111111111")
#: NVML re-initialises after this backoff (production: 5 s doubling to 300 s).
RETRY_SECONDS = 0.1


@dataclass
class FakeNvml:
    """Two 80 GiB GPUs behind the pynvml names NvmlGpuReader uses, with switchable faults."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    #: nvmlInit raises NVMLError(code) while set.
    init_error: int | None = None
    #: Indices of GPUs that fell off the bus: every call on them says GPU_IS_LOST.
    lost: set[int] = field(default_factory=set)
    #: Every device call fails with NVMLError(code) while set (the driver went away).
    gone: int | None = None
    #: Index -> exception the process-list call raises for that GPU only.
    broken: dict[int, Exception] = field(default_factory=dict)
    #: While cleared, memory reads block (a hung driver); set by default.
    answering: threading.Event = field(default_factory=threading.Event)
    inits: int = 0

    def __post_init__(self) -> None:
        self.answering.set()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        """Nothing to release."""

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(UUIDS):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return UUIDS.index(uuid)

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        self._check(handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._check(handle)
        return UUIDS[handle]

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check(handle)
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        self._check(handle)
        self.answering.wait(30)
        memory = pynvml.c_nvmlMemory_v2_t()
        memory.version = version or 0
        memory.total, memory.reserved, memory.used = 80 * GIB, GIB // 2, 70 * GIB
        memory.free = memory.total - memory.reserved - memory.used
        return memory

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: int) -> list[Any]:
        self._check(handle)
        if handle in self.broken:
            raise self.broken[handle]
        return []

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: int) -> list[Any]:
        self._check(handle)
        return []

    def _check(self, handle: int) -> None:
        if self.gone is not None:
            raise pynvml.NVMLError(self.gone)
        if handle in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


def resources() -> tuple[int, int]:
    """File descriptors and threads of this process."""
    return len(os.listdir("/proc/self/fd")), threading.active_count()


def settled(baseline: tuple[int, int], timeout: float = 3.0) -> tuple[int, int]:
    """Fds and threads of this process once back at ``baseline`` (or the last reading)."""
    deadline = time.monotonic() + timeout
    now = resources()
    while time.monotonic() < deadline and (now[0] > baseline[0] or now[1] > baseline[1]):
        time.sleep(0.05)
        now = resources()
    return now


def gpu_indices(scrape: Scrape) -> set[str]:
    """GPU indices with a total-memory sample."""
    return {dict(k)["gpu"] for k in scrape.series("headroom_gpu_memory_total_bytes")}


def nvml_up(scrape: Scrape) -> bool:
    """NVML read both GPUs."""
    return scrape.value("headroom_source_up", source="nvml") == 1.0 and gpu_indices(scrape) == {
        "0",
        "1",
    }


@dataclass
class Sidecar:
    """The in-process exporter and the fake NVML it reads."""

    exporter: ExporterThread
    nvml: FakeNvml


def start_sidecar(vllm: FakeVllm, nvml: object, tmp_path: Path) -> ExporterThread:
    """The exporter in-process, reading GPUs 0 and 1 through ``nvml`` (a fake or None)."""

    def gpu_source(_: Settings) -> GpuSource:
        reader = NvmlGpuReader(
            nvml=nvml, retry_initial_seconds=RETRY_SECONDS, retry_max_seconds=RETRY_SECONDS
        )
        return NvmlGpuSource(
            reader, explicit=(IndexSelector(0), IndexSelector(1)), proc_root=tmp_path
        )

    return ExporterThread(
        {
            "target": vllm.url,
            "poll_interval_seconds": 0.3,
            "poll_timeout_seconds": 0.3,
            "context_window_seconds": 5,
            "rate_window_seconds": 2,
        },
        components=Components(gpu_source=gpu_source),
    )


@pytest.fixture
def sidecar(fake_vllm: FakeVllm, tmp_path: Path) -> Iterator[Sidecar]:
    """A healthy sidecar over a fake NVML with two GPUs."""
    nvml = FakeNvml()
    exporter = start_sidecar(fake_vllm, nvml, tmp_path)
    try:
        exporter.wait_for(lambda s: nvml_up(s) and s.value("headroom_target_up") == 1.0)
        yield Sidecar(exporter, nvml)
    finally:
        nvml.answering.set()
        assert exporter.stop() < 2.0


def check_fault(
    sidecar: Sidecar,
    *,
    name: str,
    reason: str,
    inject: Any,
    clear: Any,
    still_read: set[str],
    figures: Figures,
) -> None:
    """Inject, see it reported (target up, GPUs in ``still_read`` kept), clear, see recovery."""
    exporter = sidecar.exporter
    baseline = resources()
    before = exporter.scrape().errors("nvml", reason)
    inject()
    down, detected = exporter.wait_for(lambda s: s.errors("nvml", reason) > before)
    assert down.value("headroom_source_up", source="nvml") == 0.0
    assert down.value("headroom_target_up") == 1.0, "an NVML fault must not take vLLM's side down"
    assert gpu_indices(down) == still_read
    assert down.seconds < 2.0
    clear()
    _, recovered = exporter.wait_for(nvml_up)
    fds, threads = settled(baseline)
    assert fds <= baseline[0], f"fds leaked: {fds} > {baseline[0]}"
    assert threads <= baseline[1], f"threads leaked: {threads} > {baseline[1]}"
    figures.record(
        "nvml_faults",
        name,
        {
            "reason": reason,
            "detected_seconds": round(detected, 3),
            "recovered_seconds": round(recovered, 3),
        },
    )


def test_nvml_initialisation_failing_at_start_is_reported_and_retried(
    fake_vllm: FakeVllm, tmp_path: Path, figures: Figures
) -> None:
    """nvmlInit failing (driver not loaded): nvml down, vLLM's side up; NVML is retried."""
    nvml = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    baseline = resources()
    exporter = start_sidecar(fake_vllm, nvml, tmp_path)
    try:
        down, _ = exporter.wait_for(lambda s: s.errors("nvml", "driver_not_loaded") >= 2)
        assert down.value("headroom_target_up") == 1.0
        assert down.value("headroom_source_up", source="nvml") == 0.0
        assert not gpu_indices(down)
        loaded = time.monotonic()
        nvml.init_error = None
        exporter.wait_for(nvml_up)
        figures.record(
            "nvml_faults",
            "init_failing",
            {
                "reason": "driver_not_loaded",
                "recovered_seconds": round(time.monotonic() - loaded, 3),
            },
        )
    finally:
        assert exporter.stop() < 2.0
    fds, threads = settled(baseline)
    assert fds <= baseline[0]
    assert threads <= baseline[1]


def test_the_driver_going_away_mid_run_is_reported_and_recovered(
    sidecar: Sidecar, figures: Figures
) -> None:
    """Calls failing with DRIVER_NOT_LOADED mid-run: NVML is shut down, retried, back after."""
    nvml = sidecar.nvml
    inits = nvml.inits

    def inject() -> None:
        nvml.init_error = nvml.gone = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    def clear() -> None:
        nvml.init_error = nvml.gone = None

    check_fault(
        sidecar,
        name="driver_gone_mid_run",
        reason="driver_not_loaded",
        inject=inject,
        clear=clear,
        still_read=set(),
        figures=figures,
    )
    assert nvml.inits > inits, "NVML was not initialised again"


def test_a_gpu_lost_mid_run_leaves_the_other_one_reported(
    sidecar: Sidecar, figures: Figures
) -> None:
    """GPU 1 falling off the bus: reason gpu_lost, GPU 0 still exposed, GPU 1 back after."""
    nvml = sidecar.nvml
    check_fault(
        sidecar,
        name="gpu_lost",
        reason="gpu_lost",
        inject=lambda: nvml.lost.add(1),
        clear=lambda: nvml.lost.discard(1),
        still_read={"0"},
        figures=figures,
    )


def test_a_call_raising_for_one_gpu_only_costs_that_reading_only(
    sidecar: Sidecar, figures: Figures
) -> None:
    """A non-NVML exception from one GPU's process list: call_failed, memory of both kept."""
    nvml = sidecar.nvml
    check_fault(
        sidecar,
        name="one_gpu_call_raises",
        reason="call_failed",
        inject=lambda: nvml.broken.__setitem__(1, RuntimeError("bindings bug")),
        clear=nvml.broken.clear,
        still_read={"0", "1"},
        figures=figures,
    )


def test_a_hung_nvml_call_does_not_stop_the_polls_of_vllm(
    sidecar: Sidecar, figures: Figures
) -> None:
    """An NVML read that never returns: nvml times out, vLLM is still polled every interval."""
    exporter, nvml = sidecar.exporter, sidecar.nvml
    nvml.answering.clear()
    try:
        hung, _ = exporter.wait_for(lambda s: s.errors("nvml", "timeout") > 0)
        first = hung.value("headroom_source_last_success_timestamp_seconds", source="vllm_metrics")
        later, _ = exporter.wait_for(
            lambda s: (
                (
                    s.value("headroom_source_last_success_timestamp_seconds", source="vllm_metrics")
                    or 0
                )
                > (first or 0)
                and s.errors("nvml", "timeout") >= 3
            )
        )
        assert later.value("headroom_target_up") == 1.0
        # Skipped, not queued: one blocked thread, however many polls passed.
        blocked = [t for t in threading.enumerate() if t.name.startswith("asyncio_")]
        assert len(blocked) <= 2
    finally:
        nvml.answering.set()
    _, recovered = exporter.wait_for(nvml_up)
    figures.record(
        "nvml_faults", "call_hangs", {"reason": "timeout", "recovered_seconds": round(recovered, 3)}
    )


def test_the_nvml_library_missing_is_reported_and_picked_up_once_installed(
    fake_vllm: FakeVllm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    figures: Figures,
) -> None:
    """No pynvml module: nvml down with module_missing; once importable, GPUs come back."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    baseline = resources()
    exporter = start_sidecar(fake_vllm, None, tmp_path)
    try:
        down, _ = exporter.wait_for(lambda s: s.errors("nvml", "module_missing") > 0)
        assert down.value("headroom_target_up") == 1.0
        assert down.value("headroom_source_up", source="nvml") == 0.0
        assert not gpu_indices(down)
        installed = time.monotonic()
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())  # what `import pynvml` now gives
        exporter.wait_for(nvml_up)
        figures.record(
            "nvml_faults",
            "library_missing",
            {
                "reason": "module_missing",
                "recovered_seconds": round(time.monotonic() - installed, 3),
            },
        )
    finally:
        assert exporter.stop() < 2.0
    fds, threads = settled(baseline)
    assert fds <= baseline[0]
    assert threads <= baseline[1]


class RaisingGpuSource:
    """A GPU source breaking its promise never to raise (a bug in a reader)."""

    source = "nvml"

    def read(
        self, gpu_memory_utilization: float | None
    ) -> tuple[tuple[GpuMemoryView, ...], SourceError | None]:
        raise RuntimeError("reader bug")

    def close(self) -> None:
        """Nothing to release."""


def test_a_gpu_source_that_raises_is_call_failed_not_a_crash() -> None:
    """A GPU read raising: nvml down with call_failed, vLLM's figures still derived."""
    _, poll = mock_vllm_poller(gpus=RaisingGpuSource())
    view = poll()
    assert isinstance(view, TargetView)
    assert view.sources["nvml"].errors == {"call_failed": 1}
    assert not view.sources["nvml"].up
    assert view.sources["vllm_metrics"].up
    assert view.derived is not None
