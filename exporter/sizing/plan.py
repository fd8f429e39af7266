"""What a change would buy: alternative deployments sized side by side, and what a goal needs.

Pure functions over the sizing model (:mod:`exporter.sizing.model`) and the GPU catalogue; the
``plan`` command renders their plain rows as text or JSON.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from exporter.errors import UsageError
from exporter.sizing.catalog import gpus, smallest_gpu
from exporter.sizing.model import require_sized, size_deployment, utilization_needed
from exporter.sizing.overhead import GIB

if TYPE_CHECKING:
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
    for factor, label in ((0.5, "half"), (2, "double")):
        length = int(result.max_model_len * factor)
        if length >= 1:
            trials.append(
                (f"max-model-len {length:,} ({label})", replace(deployment, max_model_len=length))
            )
    rows: list[dict[str, Any]] = []
    for label, trial in trials:
        try:
            other = require_sized(size_deployment(arch, deployment=trial))
        except UsageError as exc:
            rows.append({"change": label, "error": str(exc)})
            continue
        rows.append(
            {
                "change": label,
                "bytes_per_token": other.bytes_per_token,
                "kv_budget_bytes": other.kv_budget_bytes,
                "kv_capacity_tokens": other.kv_capacity_tokens if other.fits else 0,
                "kv_cache_size_tokens": other.kv_cache_size_tokens if other.fits else 0,
                "max_model_len_fits": other.max_model_len_fits,
                "sequences": {str(t): other.sequences_at(t) if other.fits else 0 for t in contexts},
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
    return {
        "sequences": sequences,
        "context_tokens": context_tokens,
        "utilization": utilization_needed(
            arch, deployment=deployment, sequences=sequences, context_tokens=context_tokens
        ),
        "smallest_gpu": gpu.name if gpu else None,
    }
