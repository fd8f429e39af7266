"""Specification of vLLM's scheduler limits (exporter.sizing.scheduler), release by release.

Every expectation is a row of the table in the module docstring, read from the release wheels'
``vllm/engine/arg_utils.py`` (and ``vllm/config/scheduler.py``).
"""

from __future__ import annotations

import pytest

from exporter.sizing.overhead import GIB
from exporter.sizing.scheduler import SchedulerInputs, scheduler_limits
from exporter.vllm.version import VllmVersion, parse_vllm_version

H100 = int(79.2 * GIB)
H200 = int(139.8 * GIB)
B200 = int(178.4 * GIB)
A100_80 = int(79.2 * GIB)
L40S = int(44.4 * GIB)


def limits(
    version: str, memory: int = H100, name: str | None = None, **kwargs: object
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) for the API server with these inputs."""
    found = scheduler_limits(
        SchedulerInputs(
            version=parse_vllm_version(version),
            gpu_memory_bytes=memory,
            gpu_name=name,
            **kwargs,  # type: ignore[arg-type]
        )
    )
    return found.max_num_seqs, found.max_num_batched_tokens


@pytest.mark.parametrize(
    ("version", "memory", "name", "expected"),
    [
        # 0.32 get_batch_defaults: three memory tiers, A100s held on the small one.
        ("0.32.0", H100, "NVIDIA H100 80GB HBM3", (1024, 8192)),
        ("0.32.0", H200, "NVIDIA H200", (1024, 8192)),
        ("0.32.0", B200, "NVIDIA B200", (1024, 16384)),
        ("0.32.0", A100_80, "NVIDIA A100-SXM4-80GB", (256, 2048)),
        ("0.32.0", L40S, "NVIDIA L40S", (256, 2048)),
        ("0.32.0", 0, None, (256, 2048)),  # device query failed: memory 0
        # The >= 160 GiB tier arrived in 0.28; before, a B200 had the 70 GiB tier's tokens.
        ("0.27.0", B200, "NVIDIA B200", (1024, 8192)),
        ("0.9.0", A100_80, "NVIDIA A100-SXM4-80GB", (256, 2048)),
        # 0.8.5 judged by memory alone: an A100-80GB got the large defaults.
        ("0.8.5", A100_80, "NVIDIA A100-SXM4-80GB", (1024, 8192)),
        ("0.8.5", L40S, "NVIDIA L40S", (256, 2048)),
        # 0.8.4 judged by name.
        ("0.8.4", H100, "NVIDIA H100 80GB HBM3", (1024, 8192)),
        ("0.8.4", B200, "NVIDIA B200", (256, 2048)),
        # 0.8.0-0.8.3: 1024 on every GPU.
        ("0.8.2", L40S, "NVIDIA L40S", (1024, 2048)),
        # V0: 256.
        ("0.7.3", H100, "NVIDIA H100 80GB HBM3", (256, 2048)),
        # 0.33 keeps GB10 (DGX Spark) on the small tier whatever its memory.
        ("0.33.0", int(119 * GIB), "NVIDIA GB10", (256, 2048)),
        ("0.32.0", int(119 * GIB), "NVIDIA GB10", (1024, 8192)),
    ],
)
def test_api_server_defaults_on_gpus(
    version: str, memory: int, name: str | None, expected: tuple[int, int]
) -> None:
    """``vllm serve`` without --max-num-seqs: the release's tier for the GPU."""
    assert limits(version, memory, name) == expected


@pytest.mark.parametrize(
    ("version", "world_size", "usage", "expected"),
    [
        ("0.32.0", 1, "api_server", (128, 2048)),
        ("0.32.0", 4, "api_server", (512, 8192)),
        ("0.32.0", 1, "offline", (256, 4096)),
        ("0.10.0", 2, "api_server", (256, 4096)),
        ("0.9.2", 1, "api_server", (32, 2048)),
        ("0.9.2", 1, "offline", (128, 4096)),
    ],
)
def test_cpu_backend_defaults(
    version: str, world_size: int, usage: str, expected: tuple[int, int]
) -> None:
    """The CPU backend has its own table, scaled by TP x PP from 0.10."""
    assert limits(version, 0, None, device="cpu", world_size=world_size, usage=usage) == expected


def test_offline_llm_class_gets_more_batched_tokens_on_large_gpus() -> None:
    """``LLM(...)`` shares the sequence default but batches 16,384 tokens on an H100."""
    assert limits("0.32.0", H100, "H100", usage="offline") == (1024, 16384)
    assert limits("0.32.0", L40S, "L40S", usage="offline") == (256, 8192)


def test_other_usage_contexts_fall_back_to_scheduler_config() -> None:
    """run-batch and programmatic engines have no entry: SchedulerConfig's 128 / 2048."""
    assert limits("0.32.0", H100, "H100", usage="other") == (128, 2048)


def test_throughput_mode_doubles_defaults_but_not_given_values() -> None:
    """--performance-mode throughput (0.17+) doubles what the user left to vLLM."""
    assert limits("0.32.0", L40S, "L40S", performance_mode="throughput") == (512, 4096)
    assert limits("0.32.0", L40S, "L40S", performance_mode="throughput", max_num_seqs=100) == (
        100,
        4096,
    )
    assert limits("0.16.0", L40S, "L40S", performance_mode="throughput") == (256, 2048)


def test_short_max_model_len_caps_defaulted_tokens_then_sequences() -> None:
    """Defaulted tokens <= seqs x max_model_len (0.12+); defaulted seqs <= tokens (0.10.1+)."""
    assert limits("0.32.0", H100, "H100", max_model_len=4) == (1024, 4096)
    assert limits("0.32.0", L40S, "L40S", max_num_batched_tokens=100) == (100, 100)
    assert limits("0.10.0", L40S, "L40S", max_num_batched_tokens=100) == (256, 100)
    assert limits("0.32.0", L40S, "L40S", max_num_seqs=1000, max_num_batched_tokens=100) == (
        1000,
        100,
    )


def test_the_flag_wins_and_says_so() -> None:
    """A given --max-num-seqs is used as is, and the rule names the flag."""
    """(max_num_seqs, max_num_batched_tokens) for the API server with these inputs."""
    found = scheduler_limits(SchedulerInputs(version=VllmVersion(0, 32), max_num_seqs=2))
    assert (found.max_num_seqs, found.max_num_seqs_given, found.rule) == (2, True, "--max-num-seqs")
    default = scheduler_limits(SchedulerInputs(version=VllmVersion(0, 32), gpu_memory_bytes=H100))
    assert not default.max_num_seqs_given
    assert "0.32.0" in default.rule
    assert "70 GiB" in default.rule


def test_max_num_active_seqs_caps_running_from_0_31() -> None:
    """--max-num-active-seqs (0.31+) lowers the running limit; older releases ignore it."""
    new = scheduler_limits(SchedulerInputs(version=VllmVersion(0, 31), max_num_active_seqs=8))
    assert (new.max_num_seqs, new.running_limit) == (256, 8)
    old = scheduler_limits(SchedulerInputs(version=VllmVersion(0, 30), max_num_active_seqs=8))
    assert old.running_limit == 256
