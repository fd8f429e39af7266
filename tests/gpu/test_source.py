"""Specification of vLLM's GPUs as the poller sees them: views, visibility, failures."""

from __future__ import annotations

import pytest

from exporter.core.reasons import VisibilityState
from exporter.errors import UsageError
from exporter.gpu.memory import gpu_views
from exporter.gpu.model import ALL_GPUS, UuidSelector
from exporter.gpu.recording import RecordedGpuReader
from exporter.gpu.source import NvmlGpuSource
from exporter.gpu.visibility import GpuVisibility
from exporter.service.settings import load_settings
from tests import paths

FIXTURES = paths.FIXTURES
NVML = FIXTURES / "nvml"
GIB = 1024**3


def reader(name: str) -> RecordedGpuReader:
    """A recorded NVML reader over a fixture file."""
    return RecordedGpuReader.from_file(NVML / name)


def fixed(visibility: GpuVisibility):  # type: ignore[no-untyped-def]
    """A discovery function that always answers ``visibility``."""

    def discover(**_: object) -> GpuVisibility:
        return visibility

    return discover


def test_views_of_an_h100_split_vllm_and_the_rest_and_use_cudas_total() -> None:
    """One H100 with vLLM's EngineCore at 72 GiB: vLLM's share, the remainder, CUDA's total."""
    snapshot = reader("h100-vllm-72gib.json").read(ALL_GPUS)
    (view,) = gpu_views(snapshot, frozenset({45}), 0.9)
    reading = snapshot.gpus[0]
    assert reading.reserved_bytes is not None
    assert view.cuda_total_bytes == reading.total_bytes - reading.reserved_bytes
    assert view.vllm_bytes == 72 * GIB
    assert view.foreign_bytes is not None
    assert view.foreign_bytes < 64 * 1024**2
    assert view.vllm_predicted_bytes == pytest.approx(view.cuda_total_bytes * 0.9)
    assert view.unexplained_bytes == max(0.0, view.used_bytes - view.cuda_total_bytes * 0.9)


def test_foreign_memory_is_unknown_not_zero_without_vllms_pids() -> None:
    """Without vLLM's PIDs nothing can be attributed: foreign memory is absent, not 0."""
    snapshot = reader("h100-vllm-72gib.json").read(ALL_GPUS)
    (view,) = gpu_views(snapshot, None, 0.9)
    assert view.foreign_bytes is None
    assert view.vllm_bytes is None
    assert view.unexplained_bytes is not None


def test_unexplained_memory_needs_the_utilization() -> None:
    """Without vLLM's gpu_memory_utilization there is no claim to compare with."""
    snapshot = reader("h100-vllm-72gib.json").read(ALL_GPUS)
    (view,) = gpu_views(snapshot, frozenset({45}), None)
    assert view.vllm_predicted_bytes is None
    assert view.unexplained_bytes is None


def test_the_source_reads_the_gpus_discovery_names() -> None:
    """GPUs found in vLLM's environment are read; others on the node are not."""
    snapshot = reader("tp2-vllm.json").read(ALL_GPUS)
    first = UuidSelector(snapshot.gpus[0].uuid)
    source = NvmlGpuSource(
        reader("tp2-vllm.json"),
        discover=fixed(GpuVisibility(VisibilityState.FROM_PROCESS, (first,), frozenset({80}))),
    )
    views, failure = source.read(0.92)
    assert failure is None
    assert [v.uuid for v in views] == [snapshot.gpus[0].uuid]


def test_no_vllm_process_is_a_failure_with_a_reason_not_every_gpu() -> None:
    """When vLLM cannot be found the source reads nothing and says why."""
    source = NvmlGpuSource(
        reader("tp2-vllm.json"),
        discover=fixed(GpuVisibility(VisibilityState.VLLM_NOT_FOUND, detail="share the PID ns")),
    )
    views, failure = source.read(0.92)
    assert views == ()
    assert failure is not None
    assert failure.reason == "vllm_not_found"


def test_all_gpus_only_when_the_settings_allow_it() -> None:
    """NVIDIA_VISIBLE_DEVICES=all is read as every GPU only with gpu_discovery=all."""
    visibility = GpuVisibility(VisibilityState.ALL_GPUS, (), frozenset({80, 81}))
    refused, failure = NvmlGpuSource(reader("tp2-vllm.json"), discover=fixed(visibility)).read(0.9)
    assert refused == ()
    assert failure is not None
    assert failure.reason == "all_gpus"
    allowed, failure = NvmlGpuSource(
        reader("tp2-vllm.json"), allow_all=True, discover=fixed(visibility)
    ).read(0.9)
    assert len(allowed) == 2
    assert failure is None


def test_nvml_unavailable_becomes_a_reason() -> None:
    """No driver: no views and the unavailable reason, never an exception."""
    source = NvmlGpuSource(
        reader("no-driver.json"),
        allow_all=True,
        discover=fixed(GpuVisibility(VisibilityState.ALL_GPUS, (), frozenset())),
    )
    views, failure = source.read(0.9)
    assert views == ()
    assert failure is not None
    assert failure.reason == "library_not_found"


def test_a_lost_gpu_keeps_the_other_gpus_readings() -> None:
    """One GPU lost mid-run costs only that GPU: the other still reads, the loss is reported."""
    source = NvmlGpuSource(
        reader("gpu-lost-mid-run.json"),
        allow_all=True,
        discover=fixed(GpuVisibility(VisibilityState.ALL_GPUS, (), frozenset())),
    )
    outcomes = [source.read(0.9) for _ in range(3)]
    reasons = [failure.reason if failure else None for _, failure in outcomes]
    assert "gpu_lost" in reasons
    assert all(len(views) >= 1 for views, _ in outcomes)


def test_settings_mode_without_gpus_is_a_configuration_error() -> None:
    """gpu_discovery=settings with no gpus listed is refused at start, naming the fix."""
    with pytest.raises(UsageError, match="needs the gpus setting"):
        load_settings({"gpu_discovery": "settings"})


def test_the_real_nvml_path_degrades_cleanly_without_a_driver() -> None:
    """On a machine without an NVIDIA driver the real reader reports unavailable, no raise."""
    from exporter.gpu.nvml import NvmlGpuReader

    source = NvmlGpuSource(
        NvmlGpuReader(),
        allow_all=True,
        discover=fixed(GpuVisibility(VisibilityState.ALL_GPUS, (), frozenset())),
    )
    try:
        views, failure = source.read(0.9)
    finally:
        source.close()
    if views:
        pytest.skip("an NVIDIA driver is present on this machine: the no-driver path is moot")
    assert failure is not None
    assert failure.reason in {"library_not_found", "driver_not_loaded", "module_missing"}


def test_gpus_injected_through_cdi_fail_the_nvml_source_with_one_reason() -> None:
    """CDI (vLLM holds /dev/nvidia<N> open, its environment names none): nvml cdi_devices."""
    source = NvmlGpuSource(reader("tp2-vllm.json"), proc_root=FIXTURES / "proc" / "k8s-cdi-void")
    views, failure = source.read(0.9)
    assert views == ()
    assert failure is not None
    assert failure.reason == VisibilityState.CDI_DEVICES
    assert "gpu_source=dcgm" in str(failure)
