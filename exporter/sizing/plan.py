"""What a change would buy: alternative deployments sized side by side, and what a goal needs.

Pure functions over the sizing model (:mod:`exporter.sizing.model`) and the GPU catalogue; the
``plan`` command renders their plain rows as text or JSON.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from exporter.core.reasons import Limit
from exporter.errors import UsageError
from exporter.sizing.catalog import gpus, smallest_gpu
from exporter.sizing.model import require_sized, size_deployment, utilization_needed
from exporter.sizing.overhead import GIB

if TYPE_CHECKING:
    from exporter.core.ceiling import Ceiling
    from exporter.sizing.model import Deployment, ModelArch, SizingResult

#: How far the what-ifs move ``--gpu-memory-utilization`` up and down.
UTIL_STEP = 0.05


# --- what-ifs ----------------------------------------------------------------------------------


def what_ifs(
    arch: ModelArch, deployment: Deployment, result: SizingResult, contexts: list[int]
) -> list[dict[str, Any]]:
    """Alternative deployments and what each would give, as plain rows."""
    trials: list[tuple[str, Deployment]] = []
    if result.kv_bytes_per_element > 1:
        trials.append(("FP8 KV cache", replace(deployment, kv_cache_dtype="fp8")))
    util = result.gpu_memory_utilization
    if deployment.kv_cache_memory_bytes is None:
        if util + UTIL_STEP <= 1:
            up = round(util + UTIL_STEP, 3)
            trials.append((f"utilization {up:g}", replace(deployment, gpu_memory_utilization=up)))
        if util - UTIL_STEP > 0:
            down = round(util - UTIL_STEP, 3)
            trials.append(
                (f"utilization {down:g}", replace(deployment, gpu_memory_utilization=down))
            )
    trials.append(
        (
            f"TP {deployment.tensor_parallel * 2}",
            replace(deployment, tensor_parallel=deployment.tensor_parallel * 2),
        )
    )
    larger = [gpu for gpu in gpus() if gpu.memory_bytes > deployment.gpu_memory_bytes + GIB]
    if larger and deployment.kv_cache_memory_bytes is None:
        gpu = larger[0]
        trials.append(
            (
                f"GPU {gpu.name}",
                replace(deployment, gpu_memory_bytes=gpu.memory_bytes, gpu_name=gpu.name.lower()),
            )
        )
    # Never past the model's own context length: vLLM refuses a longer --max-model-len (unless
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, for models whose positions allow it).
    longest = arch.context_limit
    for factor, label in ((0.5, "half"), (2, "double")):
        length = int(result.max_model_len * factor)
        if length >= 1 and (longest is None or length <= longest):
            trials.append(
                (f"max-model-len {length:,} ({label})", replace(deployment, max_model_len=length))
            )
    trials.extend(_max_num_seqs_trials(deployment, result, contexts))
    rows: list[dict[str, Any]] = []
    for label, trial in trials:
        try:
            other = require_sized(size_deployment(arch, deployment=trial))
        except UsageError as exc:
            rows.append({"change": label, "error": str(exc)})
            continue
        ceilings = {t: other.ceiling_at(t) if other.fits else None for t in contexts}
        rows.append(
            {
                "change": label,
                "bytes_per_token": other.bytes_per_token,
                "kv_budget_bytes": other.kv_budget_bytes,
                "kv_capacity_tokens": other.kv_capacity_tokens if other.fits else 0,
                "kv_pool_tokens": other.kv_pool_tokens if other.fits else 0,
                "max_model_len_fits": other.max_model_len_fits,
                "max_num_seqs": other.max_num_seqs,
                "sequences": {str(t): _sequences(c) for t, c in ceilings.items()},
                "kv_sequences": {str(t): _kv_sequences(c) for t, c in ceilings.items()},
                "limited_by": {str(t): _limit(c) for t, c in ceilings.items()},
                "moves_limit": any(
                    _limit(c) != str(result.ceiling_at(t).limited_by) for t, c in ceilings.items()
                ),
            }
        )
    return rows


def _sequences(found: Ceiling | None) -> int:
    return int(found.sequences) if found is not None else 0


def _kv_sequences(found: Ceiling | None) -> int:
    return int(found.kv_sequences or 0) if found is not None else 0


def _limit(found: Ceiling | None) -> str:
    return str(found.limited_by) if found is not None else str(Limit.KV_CACHE)


def _max_num_seqs_trials(
    deployment: Deployment, result: SizingResult, contexts: list[int]
) -> list[tuple[str, Deployment]]:
    """Where the scheduler binds at some context: the ``--max-num-seqs`` that would lift it."""
    bound = [t for t in contexts if result.ceiling_at(t).limited_by == Limit.MAX_NUM_SEQS]
    if not bound:
        return []
    held = max(result.sequences_at(t) for t in bound)
    doubled = result.max_num_seqs * 2
    values = sorted({doubled, held} - {result.max_num_seqs})
    return [
        (f"max-num-seqs {value:,}", replace(deployment, max_num_seqs=value))
        for value in values
        if value > result.max_num_seqs
    ]


def ceiling_rows(result: SizingResult, contexts: list[int]) -> list[dict[str, Any]]:
    """Per context length: blocks per sequence, the ceiling, the KV pool's figure, the limit."""
    rows = []
    for t in contexts:
        found = result.ceiling_at(t)
        rows.append(
            {
                "context_tokens": t,
                "blocks_per_sequence": result.blocks_per_sequence(t),
                "sequences": int(found.sequences),
                "kv_sequences": result.sequences_at(t),
                "limited_by": str(found.limited_by),
            }
        )
    return rows


def what_it_needs(
    arch: ModelArch, deployment: Deployment, *, sequences: int, context_tokens: int
) -> dict[str, Any]:
    """The utilization and the smallest catalogue GPU that hold ``sequences`` at once."""
    gpu = None
    if deployment.kv_cache_memory_bytes is None:
        gpu = smallest_gpu(
            arch, deployment=deployment, sequences=sequences, context_tokens=context_tokens
        )
    running_limit = require_sized(size_deployment(arch, deployment=deployment)).scheduler
    return {
        "sequences": sequences,
        "context_tokens": context_tokens,
        "utilization": utilization_needed(
            arch, deployment=deployment, sequences=sequences, context_tokens=context_tokens
        ),
        "smallest_gpu": gpu.name if gpu else None,
        # The KV figures above size the pool; the scheduler must allow as many too.
        "max_num_seqs_too_low": sequences > running_limit.running_limit,
    }
