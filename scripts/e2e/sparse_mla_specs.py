"""Run vLLM's own KV-cache spec arithmetic on DeepSeek V3.2's caches (no GPU, no model).

Run it with the vLLM venv's python (the CPU build of vLLM 0.32 is enough)::

    "$VLLM_VENV/bin/python" scripts/e2e/sparse_mla_specs.py

vLLM's CPU build cannot serve DeepSeek V3.2 (it has no sparse-MLA attention backend), so the
sizing model's numbers for it (exporter/sizing/model.py, "sparse-attention MLA") cannot be
measured on this machine. This script checks the half that does not need a GPU: it builds the
per-layer specs the CUDA path builds (``MLAAttention.get_kv_cache_spec`` for the 576-value latent,
``DeepseekV32IndexerCache.get_kv_cache_spec`` for the 132-byte indexer key, each with the
backend's ``customize_spec`` alignment written out here) and hands them to vLLM's own grouping,
page and capacity functions (``get_kv_cache_groups``, ``_get_kv_cache_bytes_per_block`` with the
layout vLLM resolves for mixed page sizes, ``UniformTypeKVCacheSpecs.max_memory_usage_bytes``).
It prints, for 61 layers, 10 GiB of KV and max_model_len 32,768, the groups, the bytes of one
block, the blocks and vLLM's kv_cache_size_tokens; tests/sizing/test_sparse_mla.py expects the
same numbers, worked by hand. Which backend (and so which alignment and cache format) a GPU gets
is read from the source, not run here.
"""

from __future__ import annotations

import math
import types
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (
    MLAAttentionSpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
    get_kv_quant_mode,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

if TYPE_CHECKING:
    from collections.abc import Callable

LAYERS = 61
BUDGET = 10 * 2**30
MAX_MODEL_LEN = 32_768


def config() -> Any:
    """The few VllmConfig fields the grouping and capacity functions read."""
    return types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=types.SimpleNamespace(hisparse_config=None),
        model_config=types.SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=1),
        speculative_config=None,
    )


def check(
    label: str,
    dtype: torch.dtype,
    *,
    cache_dtype: str,
    content: int | None,
    alignment: Callable[[MLAAttentionSpec], Any],
    block: int = 64,
) -> None:
    """Group one layout's specs the way vLLM does and print what it would allocate."""
    specs: dict[str, Any] = {}
    for i in range(LAYERS):
        latent = MLAAttentionSpec(
            block_size=block,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=576,
            dtype=dtype,
            cache_dtype_str=cache_dtype,
            kv_quant_mode=get_kv_quant_mode(cache_dtype),
            state_content_bytes=content,
            is_index_group_leader=True,
        )
        indexer = MLAAttentionSpec(
            block_size=block,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=132,
            dtype=torch.uint8,
            cache_role=SparseCacheRole.INDEXER,
        )
        specs[f"model.layers.{i}.self_attn.attn"] = replace(
            latent, block_stride_alignment=alignment(latent)
        )
        # customize_attention_spec: the indexer declares the fixed kernel block [64].
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = replace(
            indexer, block_stride_alignment=MultipleOf(64)
        )
    groups = kv_cache_utils.get_kv_cache_groups(config(), specs)
    # Mixed page sizes narrow vLLM's default layout preference to block-compact LBNHC.
    per_block = kv_cache_utils._get_kv_cache_bytes_per_block(groups, KVCacheLayout.LBNHC)
    blocks = BUDGET // per_block
    spec = groups[0].kv_cache_spec
    if not isinstance(spec, UniformTypeKVCacheSpecs):
        raise SystemExit(f"{label}: vLLM made a {type(spec).__name__} group, not one UniformType")
    need = math.ceil(spec.max_memory_usage_bytes(config()) / spec.page_size_bytes)
    print(
        f"{label}: {len(groups)} group ({type(spec).__name__}), block {block}, "
        f"{per_block:,} B per block, {blocks:,} blocks, {need} per max-length request, "
        f"kv_cache_size_tokens {int(blocks / need * MAX_MODEL_LEN):,}"
    )


def main() -> None:
    """The three cache formats the sizing model uses, and a 128-token block."""
    register_all_kvcache_specs(None)

    def rows(spec: MLAAttentionSpec) -> int:  # sparse_utils.align_blocks_to_rows
        return spec.state_content_size_bytes

    bf16 = {"dtype": torch.bfloat16, "cache_dtype": "auto", "content": None, "alignment": rows}
    check("bf16 (FA/FlashMLA sparse)", **bf16)
    check(
        "fp8_ds_mla (FLASHMLA_SPARSE, SM90)",
        dtype=torch.uint8,
        cache_dtype="fp8_ds_mla",
        content=656,
        alignment=lambda _: MultipleOf(64),
    )
    check(
        "fp8 (FLASHINFER_MLA_SPARSE, SM100)",
        dtype=torch.uint8,
        cache_dtype="fp8",
        content=None,
        alignment=lambda spec: 32 * rows(spec),
    )
    check("bf16, --block-size 128", **bf16, block=128)


if __name__ == "__main__":
    main()
