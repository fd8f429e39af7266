"""Specification of Gemma 4: layers whose KV pages differ in size, sized as vLLM 0.32 sizes them.

Worked by hand from vLLM 0.32's source (file names under the installed vllm package), never from
the code under test:

- Shapes: ``Gemma4DecoderLayer`` (model_executor/models/gemma4.py) builds each layer's attention
  with ``config.per_layer_config[i].head_dim`` and ``.num_key_value_heads``: transformers'
  per-layer overrides of the global fields. A config without ``per_layer_config`` (the published
  ones spell ``global_head_dim``, ``num_global_key_value_heads``, ``attention_k_eq_v``) gets one
  from ``Gemma4TextConfig.__post_init__`` (transformers 5.19): every full-attention layer takes
  ``global_head_dim`` (512 if absent) and, only with ``attention_k_eq_v`` true,
  ``num_global_key_value_heads`` KV heads. ``attention_k_eq_v`` loads K's weights into V's slot:
  the cache still stores K and V (``Gemma4Attention.forward`` passes both to ``Attention``).
- KV sharing: the last ``num_kv_shared_layers`` layers read the last KV-holding layer of their
  own type and get no cache spec, as Gemma 3n's.
- Pages (v1/core/kv_cache_utils.py ``get_kv_cache_groups``): the layout is layer-outermost (CPU
  takes LBHNC only; FlashAttention and Triton declare none, LBNHC first), so the block-outermost
  packing does not apply and ``unify_kv_cache_spec_page_size`` does: a page that divides the
  largest gets ``block_size x (largest / page)`` tokens per block, any other is padded to the
  largest. ``_get_kv_cache_groups_uniform_page_size`` then makes one bucket per distinct spec,
  group size = the smallest bucket (the largest when within 1.5x), ``cdiv(layers, group size)``
  groups per bucket; ``num_blocks = budget // (group size x largest page)``.
- Capacity (``get_max_concurrency_for_kv_cache_config``): each group's blocks per max-length
  request at its own block size (full: ``cdiv(len, block)``; sliding: ``cdiv(min(window - 1 +
  batched, len), block) + 1``), summed; concurrency = blocks / that sum; the "KV cache size: N
  tokens" line is ``int(concurrency x max_model_len)``.

transformers 5.19's default ``Gemma4Config()`` (tests/fixtures/configs/gemma4-transformers-default):
30 layers, a full-attention layer every sixth (5, 11, 17, 23, 29): 25 sliding (window 512) with
4 KV heads x 256, 5 full with 4 KV heads x 512 (``per_layer_config``), bfloat16. Per token:
sliding 2 x 4 x 256 x 2 = 4,096 B, full 8,192 B; 25 x 4,096 + 5 x 8,192 = 143,360 B. On a GPU
(16-token blocks) the pages are 65,536 and 131,072 B: 131,072 / 65,536 = 2, so the sliding layers
get 32-token blocks and every page is 131,072 B. Buckets: 25 sliding, 5 full -> group size 5
(25 >= 1.5 x 5): 5 sliding groups + 1 full group; one block is 5 x 131,072 = 655,360 B. With
10 GiB of KV: 10,737,418,240 // 655,360 = 16,384 blocks. A request of 8,192 tokens (8,192
batched) needs cdiv(8,192, 16) = 512 full blocks + 5 x (cdiv(min(511 + 8,192, 8,192), 32) + 1 =
257) = 1,797 blocks: concurrency 16,384 / 1,797 = 9.1174, int(9.1174... x 8,192) = 74,689 tokens.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.errors import ModelConfigError, UsageError
from exporter.sizing.lora import LoraSettings
from exporter.sizing.model import Declined, Deployment, SizingResult, size_deployment
from exporter.sizing.modelconfig import load_model_arch, parse_model_config
from exporter.vllm.version import VllmVersion
from tests import paths
from tests.sizing.startups import sized_as_started

CONFIGS = paths.CONFIGS
DEFAULT = CONFIGS / "gemma4-transformers-default"
GIB = 2**30
V032 = VllmVersion(0, 32, 0)


def _sized(arch: Any, **deployment: Any) -> SizingResult:
    settings: dict[str, Any] = {
        "gpu_memory_bytes": 80 * GIB,
        "kv_cache_memory_bytes": 10 * GIB,
        "max_model_len": 8192,
        "max_num_batched_tokens": 8192,
        "vllm_version": V032,
    }
    settings.update(deployment)
    result = size_deployment(arch, deployment=Deployment(**settings))
    assert isinstance(result, SizingResult), result
    return result


def _group_blocks(result: SizingResult) -> tuple[int, ...]:
    return tuple(group.block_size or result.block_size for group in result.kv_groups)


def test_the_transformers_default_config_is_sized_as_the_module_docstring_derives() -> None:
    """Gemma4Config(): 16,384 blocks of 655,360 B, 74,689 tokens at 8,192 (module docstring)."""
    arch = load_model_arch(DEFAULT)
    assert arch.declined is None
    result = _sized(arch)
    assert result.bytes_per_token == 143_360
    assert result.block_size == 16
    assert _group_blocks(result) == (32, 32, 32, 32, 32, 16)
    assert [g.kind for g in result.kv_groups] == ["sliding"] * 5 + ["full"]
    assert result.block_bytes == 655_360
    assert result.kv_blocks == 16_384
    assert result.blocks_per_max_len_request == 1_797
    assert result.max_concurrency == pytest.approx(16_384 / 1_797)
    assert result.kv_capacity_tokens == 74_689


# --- against real vLLM 0.32 (CPU build) start-ups ----------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "groups", "blocks", "tokens", "concurrency"),
    [
        # 10 layers (4 sliding + 1 full, twice), window 64, 2 KV heads x 32 on the sliding layers,
        # 2 x 64 on the full ones, the last 4 sharing KV: layers 0-5 hold KV (5 sliding, 1 full).
        # Per token: 256 B sliding, 512 B full; 128-token pages 32,768 and 65,536 B: the sliding
        # blocks go to 256 tokens. Group size 1 (5 >= 1.5): 6 groups; 2**30 / 65,536 = 16,384
        # blocks; a 1,024-token request needs 8 full + 5 x (cdiv(1,024, 256) + 1 = 5) = 33.
        ("gemma4-tiny-kv-sharing", (256,) * 5 + (128,), 16_384, 508_400, 16_384 / 33),
        # attention_k_eq_v with num_global_key_value_heads 1: the full layers have 1 KV head x 64
        # = 256 B per token, as the sliding ones: one page size, 128-token blocks everywhere;
        # 2**30 / 32,768 = 32,768 blocks; 8 + 5 x (cdiv(1,024, 128) + 1 = 9) = 53 per request.
        # K and V are both stored: one K only would have been 128 B and 256-token full blocks.
        ("gemma4-tiny-k-eq-v", (128,) * 6, 32_768, 633_102, 32_768 / 53),
        # Full layers 2 x 48 = 384 B per token: 49,152 B pages, which 32,768 does not divide: the
        # sliding pages are padded to 49,152 B, blocks stay 128; 2**30 // 49,152 = 21,845 blocks;
        # 8 + 5 x 9 = 53 per request.
        ("gemma4-tiny-padded-pages", (128,) * 6, 21_845, 422_061, 21_845 / 53),
        # attention_k_eq_v, full layers 1 KV head x 32 = 128 B per token: their pages are the
        # smaller ones and get 256-token blocks; pages 32,768 B: 32,768 blocks; a request needs
        # 5 x 9 sliding + cdiv(1,024, 256) = 4 full = 49 blocks.
        ("gemma4-tiny-small-full-pages", (128,) * 5 + (256,), 32_768, 684_784, 32_768 / 49),
    ],
)
def test_the_model_reproduces_what_vllm_logged(
    fixture: str, groups: tuple[int, ...], blocks: int, tokens: int, concurrency: float
) -> None:
    """vLLM 0.32 (CPU) started on these configs with a 1 GiB KV budget (fixtures README)."""
    result = sized_as_started(fixture)
    assert _group_blocks(result) == groups  # vLLM's "kv cache group sizes"
    assert result.kv_blocks == blocks  # cache_config.num_gpu_blocks
    assert result.reported_capacity_tokens == tokens
    assert result.max_concurrency == pytest.approx(concurrency)


# --- the published configs' spelling -----------------------------------------------------------

#: A Gemma 4 31B-shaped text config as the published ones spell it (fields quoted in public
#: repositories: 32 heads, 16 KV heads x 256, global_head_dim 512, num_global_key_value_heads 4,
#: attention_k_eq_v, window 1,024); 60 layers and no layer_types (the 5:1 default) are ours.
_PUBLISHED: dict[str, Any] = {
    "model_type": "gemma4_text",
    "architectures": ["Gemma4ForCausalLM"],
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": 60,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 4,
    "attention_k_eq_v": True,
    "sliding_window": 1024,
    "max_position_embeddings": 262144,
    "vocab_size": 262144,
    "dtype": "bfloat16",
}


def test_global_head_fields_give_the_full_layers_their_shape() -> None:
    """60 layers, full at 5, 11, ..., 59: 50 sliding of 16 x 256, 10 full of 4 x 512.

    Per token: sliding 2 x 16 x 256 x 2 = 16,384 B, full 2 x 4 x 512 x 2 = 8,192 B: the full
    pages are the smaller ones (131,072 B at 16 tokens) and get 32-token blocks; every page is
    262,144 B. Group size 10: 5 sliding groups + 1 full; a block is 10 x 262,144 = 2,621,440 B;
    20 GiB / that = 8,192 blocks. An 8,192-token request: cdiv(8,192, 32) = 256 full + 5 x
    (cdiv(min(1,023 + 8,192, 8,192), 16) + 1 = 513) = 2,821 blocks; 8,192 / 2,821 = 2.9039,
    int(2.9039... x 8,192) = 23,789 tokens.
    """
    arch = parse_model_config(_PUBLISHED, name="gemma4-31b-shaped")
    assert arch.declined is None
    result = _sized(arch, kv_cache_memory_bytes=20 * GIB)
    assert result.bytes_per_token == 50 * 16_384 + 10 * 8_192
    assert _group_blocks(result) == (16,) * 5 + (32,)
    assert result.block_bytes == 2_621_440
    assert result.kv_blocks == 8_192
    assert result.blocks_per_max_len_request == 2_821
    assert result.kv_capacity_tokens == 23_789


def test_tensor_parallelism_can_make_the_pages_equal() -> None:
    """TP 8 gives both kinds of layer 2,048 B per token: one page size.

    Sliding 16 / 8 = 2 heads, full 4 / 8 -> 1 (replicated): 2 x 2 x 256 x 2 = 2,048 B and
    2 x 1 x 512 x 2 = 2,048 B: one page size, 16-token blocks, a block of 10 x 16 x 2,048 =
    327,680 B: 65,536 blocks; 512 + 5 x 513 = 3,077 per request; int(65,536 / 3,077 x 8,192) =
    174,478 tokens.
    """
    arch = parse_model_config(_PUBLISHED, name="gemma4-31b-shaped")
    result = _sized(arch, kv_cache_memory_bytes=20 * GIB, tensor_parallel=8)
    assert _group_blocks(result) == (16,) * 6
    assert result.block_bytes == 327_680
    assert result.kv_blocks == 65_536
    assert result.kv_capacity_tokens == 174_478


def test_global_kv_heads_apply_only_with_k_eq_v() -> None:
    """Without attention_k_eq_v, transformers drops num_global_key_value_heads.

    The full layers keep 16 KV heads x 512 = 32,768 B per token; the sliding pages (16,384 B)
    get 32-token blocks; pages 524,288 B, a block 10 x 524,288: 20 GiB / 5,242,880 = 4,096
    blocks; 512 full + 5 x (cdiv(8,192, 32) + 1 = 257) = 1,797 per request;
    int(4,096 / 1,797 x 8,192) = 18,672.
    """
    arch = parse_model_config({**_PUBLISHED, "attention_k_eq_v": False}, name="m")
    result = _sized(arch, kv_cache_memory_bytes=20 * GIB)
    assert _group_blocks(result) == (32,) * 5 + (16,)
    assert result.kv_blocks == 4_096
    assert result.kv_capacity_tokens == 18_672


def test_the_multimodal_wrapper_reads_the_text_config() -> None:
    """Gemma4ForConditionalGeneration's config nests the decoder in text_config."""
    text = dict(_PUBLISHED)
    text.pop("architectures")
    wrapped = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text,
    }
    plain = _sized(parse_model_config(_PUBLISHED, name="a"), kv_cache_memory_bytes=20 * GIB)
    nested = _sized(parse_model_config(wrapped, name="b"), kv_cache_memory_bytes=20 * GIB)
    assert (nested.kv_blocks, nested.kv_capacity_tokens) == (plain.kv_blocks, 23_789)


def test_one_shape_on_every_kv_layer_is_plain_gqa() -> None:
    """per_layer_config giving every layer the base shape: no per-layer shapes, 16-token blocks."""
    config = {**_PUBLISHED, "per_layer_config": {"5": {"sliding_window": 1024}}}
    arch = parse_model_config(config, name="m")
    assert arch.layer_shapes == ()
    assert (arch.num_kv_heads, arch.head_dim) == (16, 256)


# --- what stays declined or refused ------------------------------------------------------------


def _arch() -> Any:
    return parse_model_config(_PUBLISHED, name="gemma4-31b-shaped")


@pytest.mark.parametrize(
    ("deployment", "why"),
    [
        ({"pipeline_parallel": 2}, "--pp 1"),
        ({"vllm_version": VllmVersion(0, 31, 0)}, "--vllm-version 0.32.0"),
        ({"lora": LoraSettings()}, "different head shapes"),
    ],
)
def test_what_is_not_modelled_is_declined(deployment: dict[str, Any], why: str) -> None:
    """Pipeline stages, releases before 0.32 and LoRA buffers are not modelled for these layers."""
    outcome = size_deployment(
        _arch(), deployment=Deployment(gpu_memory_bytes=80 * GIB, max_model_len=8192, **deployment)
    )
    assert isinstance(outcome, Declined), outcome
    assert why in outcome.reason
    assert "\n" not in outcome.reason


def test_a_tp_that_does_not_divide_every_layers_kv_heads_is_refused() -> None:
    """TP 8 divides the sliding layers' 16 KV heads, not the full ones' 12 (gemma4.py asserts)."""
    config = {**_PUBLISHED, "num_attention_heads": 48, "num_global_key_value_heads": 12}
    with pytest.raises(UsageError, match="every layer's KV heads"):
        size_deployment(
            parse_model_config(config, name="m"),
            deployment=Deployment(gpu_memory_bytes=80 * GIB, tensor_parallel=8),
        )


@pytest.mark.parametrize(
    ("model_type", "extra", "why"),
    [
        ("gemma4_unified_text", {}, "gemma4_unified_text"),
        ("diffusion_gemma_text", {}, "diffusion_gemma_text"),
        ("gemma4_text", {"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ],
)
def test_other_gemma4_classes_stay_declined(
    model_type: str, extra: dict[str, Any], why: str
) -> None:
    """Classes built on Gemma 4, and its non-causal variant, were not read: declined."""
    arch = parse_model_config({**_PUBLISHED, "model_type": model_type, **extra}, name="m")
    assert arch.declined is not None
    assert why in arch.declined


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        # The last 55 layers share: layers 0-4, all sliding, hold KV, and the full-attention
        # sharers have no layer to read (gemma4.py's list.index raises).
        ({"num_kv_shared_layers": 55}, "no KV-holding full layer"),
        ({"per_layer_config": {"60": {"head_dim": 512}}}, "layer index"),
        ({"per_layer_config": {"x": {"head_dim": 512}}}, "layer index"),
        ({"per_layer_config": [1]}, "per_layer_config"),
        ({"per_layer_config": {"5": {"num_key_value_heads": 3}}}, "do not divide"),
        ({"global_head_dim": None}, "global_head_dim"),
    ],
)
def test_a_config_vllm_cannot_build_is_refused(extra: dict[str, Any], why: str) -> None:
    """transformers or gemma4.py refuses these configs: so does the reader, in one line."""
    with pytest.raises(ModelConfigError, match=why):
        parse_model_config({**_PUBLISHED, **extra}, name="m")


def test_the_fixtures_are_the_configs_vllm_started() -> None:
    """The four tiny configs differ only in the full-attention layers' shape."""
    tiny = json.loads((CONFIGS / "gemma4-tiny-kv-sharing" / "config.json").read_text())
    assert tiny["per_layer_config"] == {"4": {"head_dim": 64}, "9": {"head_dim": 64}}
    assert tiny["num_kv_shared_layers"] == 4
