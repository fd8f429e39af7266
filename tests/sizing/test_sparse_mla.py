"""Specification of sparse-attention MLA sizing (DeepSeek V3.2), worked by hand from vLLM 0.32.

The model is DeepSeek-V3's config (tests/fixtures/configs/deepseek-v3: 61 layers, kv_lora_rank
512, qk_rope_head_dim 64, qk_nope_head_dim 128) with DeepSeek V3.2's indexer fields, the values
vLLM's own Indexer names beside the fields (vllm/model_executor/models/deepseek_v2.py:
``index_n_heads  # 64``, ``index_head_dim  # 128``) and index_topk 2048. Every expected number
below is worked from vLLM 0.32's formulas, not by calling the code under test:

- latent per token per layer (MLAAttention.get_kv_cache_spec, mla_attention.py): one head of
  512 + 64 = 576 values: bf16 576 x 2 = 1,152 B; fp8_ds_mla (FLASHMLA_SPARSE on Hopper, which
  turns ``fp8`` into it) 656 B; plain fp8 (FLASHINFER_MLA_SPARSE on Blackwell SM100) 576 B.
- indexer key per token per layer (DeepseekV32IndexerCache, head_dim = 128 + 128 // 128 x 4):
  132 B of uint8, whatever the KV dtype.
- block size: no sparse backend takes vLLM's default 16, the indexer takes exactly 64, so 64.
- one KV-cache group (UniformTypeKVCacheSpecs: both specs are MLAAttentionSpec), page = 64 x
  61 x (latent + indexer); num_blocks = budget // page; a max_model_len request needs
  cdiv(max_model_len, 64) blocks; kv_cache_size_tokens = int(blocks / that x max_model_len).

CPU vLLM cannot serve this model (no sparse-MLA backend), so this is source arithmetic only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from exporter.errors import UsageError
from exporter.sizing.model import (
    Declined,
    Deployment,
    ModelArch,
    SizingResult,
    require_sized,
    size_deployment,
    sparse_gpu_family,
)
from exporter.sizing.modelconfig import parse_model_config
from exporter.vllm.version import VllmVersion
from tests import paths

GIB = 2**30


def v32_config(**changes: Any) -> dict[str, Any]:
    """DeepSeek-V3's config.json turned into a V3.2 one: the class and the indexer fields."""
    config: dict[str, Any] = json.loads((paths.CONFIGS / "deepseek-v3" / "config.json").read_text())
    config.update(
        architectures=["DeepseekV32ForCausalLM"],
        model_type="deepseek_v32",
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
    )
    config.update(changes)
    return config


def v32(**changes: Any) -> ModelArch:
    """The parsed DeepSeek V3.2 architecture, with any config fields changed."""
    return parse_model_config(v32_config(**changes), name="deepseek-v3.2")


#: 10 GiB of KV cache exactly, one max-length request of 32,768 tokens, on an H200 (SM90).
TEN_GIB = Deployment(
    gpu_memory_bytes=0,
    kv_cache_memory_bytes=10 * GIB,
    max_model_len=32_768,
    gpu_name="h200",
    tensor_parallel=8,
)


def sized(deployment: Deployment, arch: ModelArch | None = None) -> SizingResult:
    """Size DeepSeek V3.2 (or ``arch``) and insist it was not declined."""
    return require_sized(size_deployment(arch or v32(), deployment=deployment))


def test_the_config_is_read_as_sparse_mla_with_a_128_wide_indexer_key() -> None:
    """index_topk marks the sparse model; index_head_dim sizes its indexer key."""
    model = v32()
    assert model.declined is None
    assert model.indexer is not None
    assert model.indexer.head_dim == 128
    # 128 fp8 values + 128 // 128 = 1 float32 scale of 4 bytes.
    assert model.indexer.bytes_per_token == 132
    assert model.attention_kind == "sparse MLA + indexer"


def test_bf16_bytes_block_and_blocks_of_10_gib() -> None:
    """bf16: (1,152 + 132) x 61 = 78,324 B per token; a 64-token block is 5,012,736 B."""
    result = sized(TEN_GIB)
    assert (result.sparse_latent_bytes, result.sparse_indexer_bytes) == (1_152, 132)
    assert result.sparse_cache_format == "bfloat16"
    assert result.bytes_per_token == 78_324  # 61 x 1,284
    assert result.block_size == 64
    assert result.block_bytes == 5_012_736  # 64 x 78,324
    # 10,737,418,240 // 5,012,736 = 2,142 (2,142 x 5,012,736 = 10,737,280,512; 137,728 left).
    assert result.kv_blocks == 2_142
    assert len(result.kv_groups) == 1  # latent and indexer pages in one UniformType group


def test_bf16_tokens_and_concurrency_at_32k() -> None:
    """cdiv(32,768, 64) = 512 blocks a request; 2,142 / 512 = 4.18359375; x 32,768 = 137,088."""
    result = sized(TEN_GIB)
    assert result.blocks_per_max_len_request == 512
    assert result.max_concurrency == pytest.approx(4.18359375)
    assert result.kv_cache_size_tokens == 137_088
    assert result.kv_capacity_tokens == 137_088


def test_fp8_on_hopper_is_fp8_ds_mla() -> None:
    """FLASHMLA_SPARSE serves fp8 as fp8_ds_mla: (656 + 132) x 61 = 48,068 B per token.

    Block 64 x 48,068 = 3,076,352 B; 10 GiB // that = 3,490 (3,490 x 3,076,352 =
    10,736,468,480); 3,490 / 512 = 6.81640625 concurrent; x 32,768 = 223,360 tokens.
    """
    result = sized(replace(TEN_GIB, kv_cache_dtype="fp8"))
    assert (result.sparse_latent_bytes, result.sparse_cache_format) == (656, "fp8_ds_mla")
    assert result.bytes_per_token == 48_068
    assert result.block_bytes == 3_076_352
    assert result.kv_blocks == 3_490
    assert result.max_concurrency == pytest.approx(6.81640625)
    assert result.kv_cache_size_tokens == 223_360


def test_fp8_on_blackwell_is_plain_fp8() -> None:
    """FLASHINFER_MLA_SPARSE (SM100) keeps plain fp8: (576 + 132) x 61 = 43,188 B per token.

    Block 64 x 43,188 = 2,764,032 B; 10 GiB // that = 3,884 (3,884 x 2,764,032 = 10,735,500,288);
    3,884 / 512 = 7.5859375 concurrent; x 32,768 = 248,576 tokens.
    """
    result = sized(replace(TEN_GIB, kv_cache_dtype="fp8", gpu_name="b200"))
    assert (result.sparse_latent_bytes, result.sparse_cache_format) == (576, "fp8")
    assert result.bytes_per_token == 43_188
    assert result.kv_blocks == 3_884
    assert result.kv_cache_size_tokens == 248_576
    # fp8_ds_mla asked for by name: FlashInfer refuses it, FLASHMLA_SPARSE stores 656 bytes.
    named = sized(replace(TEN_GIB, kv_cache_dtype="fp8_ds_mla", gpu_name="b200"))
    assert named.sparse_latent_bytes == 656


def test_tp_does_not_split_either_cache() -> None:
    """Both specs have one head and max_tp_shards=1: every rank holds the whole token."""
    assert sized(replace(TEN_GIB, tensor_parallel=1)).bytes_per_token == 78_324


def test_a_larger_block_that_is_a_multiple_of_64_is_kept() -> None:
    """--block-size 128: every backend takes a multiple of its 64 (kernel blocks of 64 inside)."""
    result = sized(replace(TEN_GIB, block_size=128))
    assert result.block_size == 128
    assert result.block_bytes == 128 * 78_324
    assert result.blocks_per_max_len_request == 256  # cdiv(32,768, 128)


def test_a_block_size_vllm_refuses_is_a_usage_error() -> None:
    """--block-size 16: no sparse-MLA backend or indexer takes it, so vLLM finds no backend."""
    with pytest.raises(UsageError, match="multiple of 64"):
        size_deployment(v32(), deployment=replace(TEN_GIB, block_size=16))


def test_gpu_families_from_product_names() -> None:
    """Hopper and data-centre Blackwell get the backends read; other names are declined."""
    assert sparse_gpu_family("nvidia h100 80gb hbm3") == "sm90"
    assert sparse_gpu_family("h200") == "sm90"
    assert sparse_gpu_family("nvidia gb200") == "sm100"
    assert sparse_gpu_family("a100 80gb") == "other"
    assert sparse_gpu_family(None) == "unknown"


def test_unnamed_gpu_bf16_is_sized_with_the_assumption_said() -> None:
    """A 16-bit latent is 1,152 B on SM90 and SM100 alike; the SM120 exception is a note."""
    result = sized(replace(TEN_GIB, gpu_name=None))
    assert result.kv_blocks == 2_142
    assert any("SM90/SM100" in note for note in result.assumptions)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"kv_cache_dtype": "fp8", "gpu_name": None}, "give --gpu"),
        ({"gpu_name": "a100 80gb"}, "no sparse-MLA backend"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "not pinned down"),
        ({"kv_cache_dtype": "fp8", "dtype": "float16"}, "--dtype bfloat16"),
        ({"pipeline_parallel": 2}, "pipeline parallelism"),
        ({"vllm_version": VllmVersion(0, 31, 0)}, "--vllm-version 0.32.0"),
        ({"device": "cpu"}, "CPU"),
    ],
)
def test_what_was_not_read_is_declined_in_one_line(change: dict[str, Any], reason: str) -> None:
    """Deployments whose layout was not pinned down from the source are declined, not guessed."""
    outcome = size_deployment(v32(), deployment=replace(TEN_GIB, **change))
    assert isinstance(outcome, Declined)
    assert reason in outcome.reason
    assert "\n" not in outcome.reason


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"compress_ratios": [0, 0, 4, 128]}, "DeepSeek V4 style compress_ratios"),
        ({"index_topk_freq": 4}, "index_topk_freq"),
        ({"index_kpool": 4}, "index_kpool"),
        ({"architectures": ["GlmMoeDsaForCausalLM"]}, "GlmMoeDsaForCausalLM"),
    ],
)
def test_other_sparse_attention_variants_are_declined(changes: dict[str, Any], reason: str) -> None:
    """Only DeepSeek V3.2's layout (an indexer on every layer) is modelled."""
    model = v32(**changes)
    assert model.declined is not None
    assert reason in model.declined
    assert model.indexer is None
    assert isinstance(size_deployment(model, deployment=TEN_GIB), Declined)


def test_v4_config_with_compress_ratios_stays_declined() -> None:
    """A DeepSeek V4 style config (compress_ratios) is declined in one line, as before."""
    config = v32_config(architectures=["DeepseekV4ForCausalLM"], compress_ratios=[0, 4, 128])
    model = parse_model_config(config, name="deepseek-v4")
    assert model.declined is not None
    assert "compress_ratios" in model.declined
    assert "\n" not in model.declined
