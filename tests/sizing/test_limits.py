"""Specification of where a running vLLM's max_num_seqs is learnt (exporter.sizing.limits)."""

from __future__ import annotations

from exporter.core.ceiling import QueueCaps
from exporter.core.reasons import MaxNumSeqsSource
from exporter.core.snapshot import CacheConfig
from exporter.core.views import GpuMemoryView
from exporter.sizing.limits import LimitInputs, resolve_running_limit
from exporter.sizing.overhead import GIB
from exporter.vllm.launch import parse_launch_flags

H100 = GpuMemoryView(
    index="0",
    uuid="GPU-1",
    name="NVIDIA H100 80GB HBM3",
    total_bytes=81_559_312_384,
    used_bytes=0,
    free_bytes=81_559_312_384,
    cuda_total_bytes=81_003_741_184,
)
CPU_CACHE = CacheConfig(
    num_gpu_blocks=8, block_size=128, labels={"user_specified_block_size": "False"}
)


def test_the_command_line_wins_over_the_setting() -> None:
    """--max-num-seqs on vLLM's command line is the truth; the setting is for when it is not."""
    flags = parse_launch_flags(["vllm", "serve", "m", "--max-num-seqs", "2"])
    limit = resolve_running_limit(LimitInputs(flags=flags, setting=64))
    assert (limit.sequences, limit.source) == (2, MaxNumSeqsSource.COMMAND_LINE)


def test_max_num_active_seqs_lowers_the_command_line_limit() -> None:
    """--max-num-active-seqs (0.31+) below --max-num-seqs caps the running sequences."""
    flags = parse_launch_flags(
        ["vllm", "serve", "m", "--max-num-seqs", "64", "--max-num-active-seqs", "8"]
    )
    assert resolve_running_limit(LimitInputs(flags=flags)).sequences == 8


def test_the_admission_caps_ride_along_from_the_command_line() -> None:
    """--max-num-queued-reqs 300 on the command line: the limit carries it, whatever its origin."""
    flags = parse_launch_flags(["vllm", "serve", "m", "--max-num-queued-reqs", "300"])
    limit = resolve_running_limit(LimitInputs(flags=flags, setting=48))
    assert limit.queue_caps == QueueCaps(requests=300)


def test_no_admission_cap_is_assumed_where_none_is_given() -> None:
    """vLLM's default is no cap: none in the limit."""
    flags = parse_launch_flags(["vllm", "serve", "m", "--max-num-seqs", "2"])
    assert resolve_running_limit(LimitInputs(flags=flags)).queue_caps is None


def test_caps_given_otherwise_fill_what_the_command_line_does_not_say() -> None:
    """check's --max-num-queued-tokens beside a command line that sets only the request cap."""
    flags = parse_launch_flags(["vllm", "serve", "m", "--max-num-queued-reqs", "300"])
    limit = resolve_running_limit(
        LimitInputs(flags=flags, queue_caps=QueueCaps(requests=5, tokens=4096))
    )
    assert limit.queue_caps == QueueCaps(requests=300, tokens=4096)


def test_the_setting_when_the_command_line_does_not_say() -> None:
    """A vLLM started without the flag (or with a --config file): the setting."""
    flags = parse_launch_flags(["vllm", "serve", "m"])
    limit = resolve_running_limit(LimitInputs(flags=flags, setting=48))
    assert (limit.sequences, limit.source) == (48, MaxNumSeqsSource.SETTING)


def test_the_default_follows_the_gpu_nvml_reports() -> None:
    """Nothing given: vLLM 0.32's default on an H100 is 1,024, on an unknown GPU 256."""
    limit = resolve_running_limit(LimitInputs(vllm_version="0.32.0", gpus=(H100,)))
    assert (limit.sequences, limit.source) == (1024, MaxNumSeqsSource.DEFAULT)
    assert resolve_running_limit(LimitInputs(vllm_version="0.32.0")).sequences == 256


def test_the_default_uses_the_gpu_memory_setting_without_nvml() -> None:
    """Fleet mode without NVML: the gpu_memory_bytes setting picks the tier."""
    limit = resolve_running_limit(LimitInputs(vllm_version="0.32.0", gpu_memory_bytes=80 * GIB))
    assert limit.sequences == 1024


def test_the_default_on_the_cpu_backend_scales_with_the_world_size() -> None:
    """No GPU and vLLM's CPU block size: 128 per TP x PP rank (0.10+)."""
    assert (
        resolve_running_limit(LimitInputs(vllm_version="0.32.0", cache_config=CPU_CACHE)).sequences
        == 128
    )
    flags = parse_launch_flags(["vllm", "serve", "m", "-tp", "2"])
    limit = resolve_running_limit(
        LimitInputs(flags=flags, vllm_version="0.32.0", cache_config=CPU_CACHE)
    )
    assert limit.sequences == 256


def test_a_chosen_block_size_of_128_on_a_gpu_is_not_the_cpu_backend() -> None:
    """--block-size 128 given by the user says nothing about the device."""
    chosen = CacheConfig(block_size=128, labels={"user_specified_block_size": "True"})
    assert (
        resolve_running_limit(LimitInputs(vllm_version="0.32.0", cache_config=chosen)).sequences
        == 256
    )


def test_throughput_mode_and_batched_tokens_from_the_command_line_shape_the_default() -> None:
    """--performance-mode throughput doubles the default; small batched tokens cap it."""
    throughput = parse_launch_flags(["vllm", "serve", "m", "--performance-mode", "throughput"])
    assert (
        resolve_running_limit(LimitInputs(flags=throughput, vllm_version="0.32.0")).sequences == 512
    )
    tokens = parse_launch_flags(["vllm", "serve", "m", "--max-num-batched-tokens", "100"])
    assert resolve_running_limit(LimitInputs(flags=tokens, vllm_version="0.32.0")).sequences == 100


def test_an_unreadable_version_falls_back_to_the_latest_known() -> None:
    """/version said something odd: the latest release's rules, not a crash."""
    assert resolve_running_limit(LimitInputs(vllm_version="dev", gpus=(H100,))).sequences == 1024
