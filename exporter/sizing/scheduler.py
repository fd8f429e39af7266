"""vLLM's scheduler limits: ``max_num_seqs`` and ``max_num_batched_tokens``, given or defaulted.

vLLM never runs more than ``max_num_seqs`` sequences at once, whatever the KV pool holds, so the
concurrency ceiling is the smaller of the two. Nothing vLLM exposes says the value (no metric,
no ``/v1/models`` field, no INFO log line), so when the flag was not given we reproduce vLLM's
own default. It depends on the release, the usage context, the device and the world size; this
module is the one table of those rules, each row with the source it was read from (the release
wheels' ``vllm/engine/arg_utils.py``; docs/sizing.md has the table for users):

========================  ===================================================================
vLLM                      default ``max_num_seqs`` (API server) on CUDA GPUs
========================  ===================================================================
< 0.8                     256 (V0 engine: ``EngineArgs.max_num_seqs = 256``)
0.8.0 - 0.8.3             1024 on every GPU (V1 ``_set_default_args_v1``)
0.8.4                     1024 on GPUs named H100/H200, else 256
0.8.5                     1024 on GPUs with >= 70 GiB, else 256
0.9.0 - 0.27              1024 on GPUs with >= 70 GiB that are not A100s, else 256
0.28 - 0.32               as 0.9, plus a >= 160 GiB tier (same 1024 sequences, more tokens)
0.33                      as 0.28, but GB10 (DGX Spark) stays on the small tier
========================  ===================================================================

On the CPU backend (0.9.2+): 32 (0.9.2), then ``128 x world size`` (0.10+) for the API server,
twice that offline. Offline ``LLM(...)`` uses the same GPU tiers as the API server; other usage
contexts (``run-batch``, programmatic engines) fall back to ``SchedulerConfig``'s 128. Then, in
order: ``--performance-mode throughput`` doubles every defaulted value (0.17+); defaulted tokens
are capped at ``max_num_seqs x max_model_len`` (0.12+); a defaulted ``max_num_seqs`` is capped at
``max_num_batched_tokens`` (0.10.1+). ``--max-num-active-seqs`` (0.31+) caps the running
sequences below ``max_num_seqs``. Not modelled: the batched data-parallel MoE token default (256,
0.20+, DeepEP low-latency or NIXL EP backends) and TPU chips' token defaults.

Pure functions over plain data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from exporter.sizing.overhead import GIB

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.vllm.version import VllmVersion

#: Who started the engine: ``vllm serve`` / the OpenAI API server, offline ``LLM(...)``, or
#: anything else (``run-batch``, ``AsyncLLM.from_engine_args``), which gets the fallback.
UsageContext = Literal["api_server", "offline", "other"]
Device = Literal["cuda", "cpu"]
PerformanceMode = Literal["balanced", "interactivity", "throughput"]
#: Where a running vLLM's ``max_num_seqs`` came from, best first (the ``source`` label).
LimitSource = Literal["command_line", "setting", "default"]

USAGE_CONTEXTS: tuple[UsageContext, ...] = ("api_server", "offline", "other")
PERFORMANCE_MODES: tuple[PerformanceMode, ...] = ("balanced", "interactivity", "throughput")

#: ``SchedulerConfig.DEFAULT_MAX_NUM_SEQS`` / ``DEFAULT_MAX_NUM_BATCHED_TOKENS``: usage contexts
#: without an entry in vLLM's per-context tables.
FALLBACK_SEQS = 128
FALLBACK_TOKENS = 2048
#: The V0 engine's ``EngineArgs.max_num_seqs``.
V0_SEQS = 256

_LARGE = 70 * GIB
_HUGE = 160 * GIB


@dataclass(frozen=True, slots=True)
class SchedulerInputs:
    """What vLLM's defaults depend on, and the flags a user gave (``None``: not given)."""

    version: VllmVersion
    device: Device = "cuda"
    #: Total memory of the (first) GPU as vLLM's platform reports it (NVML total on CUDA).
    gpu_memory_bytes: int = 0
    #: GPU product name, any case (A100s and, in 0.8.4, H100/H200 are singled out by name).
    gpu_name: str | None = None
    #: ``tensor_parallel x pipeline_parallel`` (the CPU defaults scale with it).
    world_size: int = 1
    usage: UsageContext = "api_server"
    performance_mode: PerformanceMode = "balanced"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_active_seqs: int | None = None
    #: ``--max-num-queued-reqs`` (0.29+): the API server's admission cap; no default.
    max_num_queued_reqs: int | None = None


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The limits a vLLM runs (or would run) with, and why."""

    max_num_seqs: int
    max_num_batched_tokens: int
    #: ``--max-num-active-seqs`` when given (0.31+): a lower cap on running sequences.
    max_num_active_seqs: int | None
    #: True when ``max_num_seqs`` was given, False when it is vLLM's default.
    max_num_seqs_given: bool
    #: One line saying which rule gave ``max_num_seqs``, for a user.
    rule: str
    #: ``--max-num-queued-reqs`` when given: unfinished requests (waiting and running) past
    #: which the API server refuses new ones with 503; None: no cap (vLLM's default).
    max_num_queued_reqs: int | None = None

    @property
    def running_limit(self) -> int:
        """The most sequences the scheduler keeps running at once."""
        if self.max_num_active_seqs is not None:
            return min(self.max_num_seqs, self.max_num_active_seqs)
        return self.max_num_seqs


@dataclass(frozen=True, slots=True)
class _Tier:
    """One row of vLLM's CUDA table: when it applies, and what it gives."""

    applies: Callable[[VllmVersion, int, str], bool]
    seqs_offline: int
    seqs_api: int
    tokens_offline: int
    tokens_api: int
    condition: str


def _named_h100(name: str) -> bool:
    return "h100" in name or "h200" in name


#: vLLM's CUDA defaults, newest rule first; the first row that applies wins.
_CUDA_TIERS: tuple[_Tier, ...] = (
    _Tier(lambda v, m, n: not v.at_least(0, 8), V0_SEQS, V0_SEQS, 2048, 2048, "of the V0 engine"),
    # 0.8.0-0.8.3: 1024 sequences everywhere; the token default by name.
    _Tier(
        lambda v, m, n: not v.at_least(0, 8, 4) and _named_h100(n),
        1024, 1024, 16384, 8192, "on H100/H200",
    ),
    _Tier(lambda v, m, n: not v.at_least(0, 8, 4), 1024, 1024, 8192, 2048, "on every GPU"),
    # 0.8.4: by name.
    _Tier(
        lambda v, m, n: not v.at_least(0, 8, 5) and _named_h100(n),
        1024, 1024, 16384, 8192, "on H100/H200",
    ),
    _Tier(lambda v, m, n: not v.at_least(0, 8, 5), 256, 256, 8192, 2048, "on GPUs but H100/H200"),
    # 0.8.5: by memory alone.
    _Tier(
        lambda v, m, n: not v.at_least(0, 9) and m >= _LARGE,
        1024, 1024, 16384, 8192, "on GPUs with >= 70 GiB",
    ),
    _Tier(lambda v, m, n: not v.at_least(0, 9), 256, 256, 8192, 2048, "on GPUs under 70 GiB"),
    # 0.9+: memory, but A100s held on the small tier (vLLM PR 17885); 0.33 holds GB10 too.
    _Tier(lambda v, m, n: v.at_least(0, 33) and "gb10" in n, 256, 256, 8192, 2048, "on GB10"),
    _Tier(
        lambda v, m, n: v.at_least(0, 28) and m >= _HUGE,
        1024, 1024, 16384, 16384, "on GPUs with >= 160 GiB",
    ),
    _Tier(
        lambda v, m, n: m >= _LARGE and "a100" not in n,
        1024, 1024, 16384, 8192, "on GPUs with >= 70 GiB (not A100)",
    ),
    _Tier(lambda v, m, n: True, 256, 256, 8192, 2048, "on A100s and GPUs under 70 GiB"),
)  # fmt: skip


def _gpu_tier(inputs: SchedulerInputs) -> tuple[int, int, int, int, str]:
    """(seqs offline, seqs API, tokens offline, tokens API, rule) of vLLM's CUDA tables."""
    v, memory, name = inputs.version, inputs.gpu_memory_bytes, (inputs.gpu_name or "").lower()
    tier = next(t for t in _CUDA_TIERS if t.applies(v, memory, name))
    return (
        tier.seqs_offline,
        tier.seqs_api,
        tier.tokens_offline,
        tier.tokens_api,
        f"vLLM {v} default {tier.condition}",
    )


def _cpu_tier(inputs: SchedulerInputs) -> tuple[int, int, int, int, str]:
    v, ws = inputs.version, max(1, inputs.world_size)
    if v.at_least(0, 10):
        return 256 * ws, 128 * ws, 4096 * ws, 2048 * ws, f"vLLM {v} CPU default (world size {ws})"
    if v.at_least(0, 9, 2):
        return 128, 32, 4096, 2048, f"vLLM {v} CPU default"
    # Before 0.9.2 the CPU platform had no entry of its own and reported no device memory: the
    # GPU rules applied with 0 bytes (the small tier; 256 on V0).
    return _gpu_tier(SchedulerInputs(version=v, gpu_memory_bytes=0))


def scheduler_limits(inputs: SchedulerInputs) -> SchedulerLimits:
    """The ``max_num_seqs`` and ``max_num_batched_tokens`` vLLM runs with for ``inputs``."""
    v = inputs.version
    seqs_offline, seqs_api, tokens_offline, tokens_api, rule = (
        _cpu_tier(inputs) if inputs.device == "cpu" else _gpu_tier(inputs)
    )
    if inputs.usage == "api_server":
        seqs, tokens = seqs_api, tokens_api
    elif inputs.usage == "offline":
        seqs, tokens = seqs_offline, tokens_offline
    elif v.at_least(0, 8):
        seqs, tokens, rule = FALLBACK_SEQS, FALLBACK_TOKENS, f"vLLM {v} fallback (no usage context)"
    else:
        seqs, tokens = seqs_api, tokens_api
    if inputs.usage == "offline" and rule.startswith(f"vLLM {v} default"):
        rule = rule.replace("default", "offline default", 1)
    seqs_given = inputs.max_num_seqs is not None
    tokens_given = inputs.max_num_batched_tokens is not None
    if v.at_least(0, 17) and inputs.performance_mode == "throughput":
        seqs, tokens = seqs * 2, tokens * 2
        rule += ", doubled by --performance-mode throughput"
    if not v.at_least(0, 8) and inputs.max_model_len:
        tokens = max(tokens, inputs.max_model_len)  # V0 without chunked prefill
    if inputs.max_num_seqs is not None:
        seqs = inputs.max_num_seqs
        rule = "--max-num-seqs"
    if inputs.max_num_batched_tokens is not None:
        tokens = inputs.max_num_batched_tokens
    if not tokens_given and v.at_least(0, 12) and inputs.max_model_len:
        tokens = min(seqs * inputs.max_model_len, tokens)
    if not seqs_given and v.at_least(0, 10, 1) and tokens < seqs:
        seqs = tokens
        rule += f", capped at max_num_batched_tokens {tokens}"
    active = inputs.max_num_active_seqs if v.at_least(0, 31) else None
    return SchedulerLimits(
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        max_num_active_seqs=active,
        max_num_seqs_given=seqs_given,
        rule=rule,
        max_num_queued_reqs=inputs.max_num_queued_reqs,
    )
