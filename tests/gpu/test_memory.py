"""Specification of exporter/gpu/memory.py: vLLM's share of a GPU, known or honestly unknown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.gpu.memory import SplitUnknownReason, split_gpu_memory, split_snapshot
from exporter.gpu.model import ALL_GPUS, GpuProcess, GpuReading, MemoryApi
from tests.gpu.fakes import UUID_A, GiB, make_reader, processes_strategy, two_gpus


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
