"""The running vLLM's ``max_num_seqs``: from its command line, else a setting, else the default.

Nothing vLLM exposes carries the value, so the sidecar learns it in this order, best first, and
says which in ``headroom_max_num_seqs{origin}``:

1. ``command_line``: ``--max-num-seqs`` (and ``--max-num-active-seqs``, 0.31+) on the vLLM
   server's own command line, read from ``/proc`` (:mod:`exporter.vllm.launch`);
2. ``setting``: the exporter's ``max_num_seqs`` setting (for vLLMs whose process cannot be seen,
   or that set it in a ``--config`` file);
3. ``default``: vLLM's default for its version, GPU and world size
   (:mod:`exporter.sizing.scheduler`), with whatever else the command line says (throughput
   mode, batched tokens, TP x PP).

The API server's admission caps (``--max-num-queued-reqs``, ``--max-num-queued-tokens``) ride
along from the command line, or from ``check``'s flags; vLLM has no default for them (no cap),
so none is ever assumed.

Pure: plain data in, a :class:`~exporter.core.ceiling.RunningLimit` out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from exporter.core.ceiling import QueueCaps, RunningLimit
from exporter.core.reasons import MaxNumSeqsSource
from exporter.errors import UsageError
from exporter.sizing.scheduler import PERFORMANCE_MODES, SchedulerInputs, scheduler_limits
from exporter.vllm.version import LATEST_KNOWN, parse_vllm_version

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.core.snapshot import CacheConfig
    from exporter.core.views import GpuMemoryView
    from exporter.vllm.launch import LaunchFlags

#: The CPU backend's default ``--block-size``; on GPUs it is 16.
_CPU_DEFAULT_BLOCK = 128


@dataclass(frozen=True, slots=True)
class LimitInputs:
    """What is known about the target when its limit is resolved."""

    flags: LaunchFlags | None = None
    #: The ``max_num_seqs`` setting.
    setting: int | None = None
    #: ``/version``'s answer.
    vllm_version: str | None = None
    gpus: Sequence[GpuMemoryView] = ()
    #: The ``gpu_memory_bytes`` setting and a GPU name (when NVML cannot say).
    gpu_memory_bytes: int | None = None
    gpu_name: str | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    max_model_len: int | None = None
    cache_config: CacheConfig | None = None
    #: Admission caps given outside the command line (``check --max-num-queued-reqs``).
    queue_caps: QueueCaps | None = None


def _on_cpu(inputs: LimitInputs) -> bool:
    """The CPU backend: no GPU seen and vLLM's CPU default block size, not one the user chose."""
    cache = inputs.cache_config
    if inputs.gpus or inputs.gpu_memory_bytes or cache is None:
        return False
    chosen = cache.labels.get("user_specified_block_size", "False") == "True"
    return cache.block_size == _CPU_DEFAULT_BLOCK and not chosen


def _queue_caps(inputs: LimitInputs) -> QueueCaps | None:
    """The command line's admission caps, each over the one given otherwise; None when neither."""
    flags, given = inputs.flags, inputs.queue_caps or QueueCaps()
    caps = QueueCaps(
        requests=flags.max_num_queued_reqs if flags else None,
        tokens=flags.max_num_queued_tokens if flags else None,
    )
    caps = QueueCaps(
        requests=caps.requests if caps.requests is not None else given.requests,
        tokens=caps.tokens if caps.tokens is not None else given.tokens,
    )
    return None if caps == QueueCaps() else caps


def resolve_running_limit(inputs: LimitInputs) -> RunningLimit:
    """The most sequences the engine runs at once, where the figure came from, and the caps."""
    return replace(_running_limit(inputs), queue_caps=_queue_caps(inputs))


def _running_limit(inputs: LimitInputs) -> RunningLimit:
    flags = inputs.flags
    active = flags.max_num_active_seqs if flags else None
    if flags is not None and flags.max_num_seqs is not None:
        limit = flags.max_num_seqs if active is None else min(flags.max_num_seqs, active)
        return RunningLimit(limit, MaxNumSeqsSource.COMMAND_LINE)
    if inputs.setting is not None:
        return RunningLimit(inputs.setting, MaxNumSeqsSource.SETTING)
    try:
        version = parse_vllm_version(inputs.vllm_version) if inputs.vllm_version else LATEST_KNOWN
    except UsageError:
        version = LATEST_KNOWN
    gpu = inputs.gpus[0] if inputs.gpus else None
    tp = (flags.tensor_parallel if flags else None) or inputs.tensor_parallel or 1
    pp = (flags.pipeline_parallel if flags else None) or inputs.pipeline_parallel or 1
    mode = flags.performance_mode if flags else None
    found = scheduler_limits(
        SchedulerInputs(
            version=version,
            device="cpu" if _on_cpu(inputs) else "cuda",
            gpu_memory_bytes=int(gpu.total_bytes if gpu else inputs.gpu_memory_bytes or 0),
            gpu_name=gpu.name if gpu else inputs.gpu_name,
            world_size=tp * pp,
            performance_mode=mode if mode in PERFORMANCE_MODES else "balanced",
            max_model_len=inputs.max_model_len,
            max_num_batched_tokens=flags.max_num_batched_tokens if flags else None,
            max_num_active_seqs=active,
        )
    )
    return RunningLimit(found.running_limit, MaxNumSeqsSource.DEFAULT)
