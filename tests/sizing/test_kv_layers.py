"""Specification of layers without their own KV, and of the KV features that are declined.

Worked by hand from vLLM 0.32's source, never from the code under test:

- A layer with ``kv_sharing_target_layer_name`` gets no KV-cache spec: ``GPUModelRunner.
  get_kv_cache_spec`` (vllm/v1/worker/gpu_model_runner.py) skips it, "so that KV cache management
  logic will act as this layer does not exist". Gemma 3n gives one to its last
  ``num_kv_shared_layers`` layers (vllm/model_executor/models/gemma3n.py,
  ``first_kv_shared_layer_idx = num_hidden_layers - num_kv_shared_layers``).
- A Nemotron-NAS block whose ``attention.no_op`` is true builds no attention module, so no spec;
  every other block builds ``num_attention_heads // n_heads_in_group`` KV heads
  (vllm/model_executor/models/nemotron_nas.py, ``DeciLMDecoderLayer.__init__``).
- Layers whose pages are all one size are grouped by ``_get_kv_cache_groups_uniform_page_size``
  (vllm/v1/core/kv_cache_utils.py): one kind -> one group; sliding and full -> groups of
  ``min(count)`` layers (``max(count)`` when it is under 1.5 x the min), one block holding one
  layer of each group.

Gemma 3n, tests/fixtures/configs/gemma3n-transformers-default (transformers 5.19's
``Gemma3nConfig()``): 35 layers, the last 15 sharing KV, so layers 0-19 hold KV; ``layer_types``
puts a full-attention layer at every fifth (4, 9, 14, 19): 16 sliding (window 512) and 4 full;
2 KV heads x head_dim 256 in bfloat16: 2 x 2 x 256 x 2 = 2,048 B per token per layer;
20 x 2,048 = 40,960 B per token (35 x 2,048 = 71,680 when every layer was counted). Groups: 16
sliding and 4 full -> group size 4 (16 >= 1.5 x 4): 4 sliding groups + 1 full group; a 16-token
block holds 4 layers: 16 x 4 x 2,048 = 131,072 B.

Nemotron Super 49B v1.5, tests/fixtures/configs/nemotron-super-49b-v1.5: 80 blocks, 49 with
attention (``n_heads_in_group`` 8 of 64 heads: 8 KV heads), head_dim 8,192 / 64 = 128, bfloat16:
2 x 8 x 128 x 2 = 4,096 B per token per attention layer; 49 x 4,096 = 200,704 B per token (read
as MHA over all 80 layers before: 80 x 2 x 64 x 128 x 2 = 2,621,440 B, 13x too much). One group
(one kind, one page size); a 16-token block is 16 x 200,704 = 3,211,264 B.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.errors import ModelConfigError
from exporter.sizing.lora import LoraSettings
from exporter.sizing.model import Declined, Deployment, SizingResult, size_deployment
from exporter.sizing.modelconfig import load_model_arch, parse_model_config
from tests import paths
from tests.sizing.startups import sized_as_started

CONFIGS = paths.CONFIGS
GEMMA3N = CONFIGS / "gemma3n-transformers-default"
NEMOTRON_SUPER = CONFIGS / "nemotron-super-49b-v1.5"
GIB = 2**30


def _sized(arch: Any, **deployment: Any) -> SizingResult:
    result = size_deployment(
        arch,
        deployment=Deployment(gpu_memory_bytes=80 * GIB, kv_cache_memory_bytes=GIB, **deployment),
    )
    assert isinstance(result, SizingResult), result
    return result


def _nemotron() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((NEMOTRON_SUPER / "config.json").read_text())
    return config


# --- Gemma 3n: KV sharing ----------------------------------------------------------------------


def test_gemma3n_counts_only_the_layers_that_hold_kv() -> None:
    """20 of 35 layers hold KV: 40,960 B per token, not 71,680."""
    arch = load_model_arch(GEMMA3N)
    assert (arch.num_layers, arch.attention_layers, arch.kv_shared_layers) == (35, 20, 15)
    assert arch.layer_kinds.count("sliding") == 16
    assert arch.layer_kinds.count("full") == 4
    result = _sized(arch, max_num_batched_tokens=8192)
    assert result.bytes_per_token == 40_960
    assert result.layers_per_gpu == 20
    assert "15 KV-sharing layers" in result.attention_kind


def test_gemma3n_groups_four_sliding_and_one_full_group_of_four_layers() -> None:
    """Group size 4: a block holds 4 layers (131,072 B); 1 GiB holds 8,192 blocks.

    A 32,768-token request needs 32,768 / 16 = 2,048 blocks of the full group and, with 8,192
    batched tokens and two batches in flight (async scheduling, on by default on GPUs in vLLM
    0.32: max_in_flight_tokens), cdiv(511 + 16,384, 16) + 1 = 1,057 of each sliding group:
    2,048 + 4 x 1,057 = 6,276 blocks, so 8,192 / 6,276 requests of max_model_len at once.
    """
    result = _sized(load_model_arch(GEMMA3N), max_num_batched_tokens=8192)
    kinds = [(group.kind, group.num_layers) for group in result.kv_groups]
    assert kinds == [("sliding", 4)] * 4 + [("full", 4)]
    assert result.block_bytes == 131_072
    assert result.kv_blocks == GIB // 131_072 == 8_192
    assert result.max_model_len == 32_768
    assert result.max_concurrency == pytest.approx(8_192 / 6_276)


def test_kv_sharing_that_leaves_almost_no_kv_layers_is_refused() -> None:
    """gemma3n.py finds no target for a sharing layer below index 0: not a servable config."""
    config = json.loads((GEMMA3N / "config.json").read_text())
    config["text_config"]["num_kv_shared_layers"] = 34
    with pytest.raises(ModelConfigError, match="num_kv_shared_layers 34"):
        parse_model_config(config, name="g")


# --- Nemotron-NAS: per-layer blocks ------------------------------------------------------------


def test_nemotron_super_charges_its_49_attention_blocks_with_8_kv_heads() -> None:
    """200,704 B per token at TP 1; TP 4 keeps 2 of the 8 KV heads: 50,176 B."""
    arch = load_model_arch(NEMOTRON_SUPER)
    assert (arch.num_layers, arch.attention_layers, arch.attention_free_layers) == (80, 49, 31)
    assert (arch.num_kv_heads, arch.head_dim) == (8, 128)
    result = _sized(arch)
    assert result.bytes_per_token == 200_704
    assert result.block_bytes == 16 * 200_704
    assert [(g.kind, g.num_layers) for g in result.kv_groups] == [("full", 49)]
    assert result.attention_kind == "GQA + 31 layers without attention"
    assert _sized(arch, tensor_parallel=4).bytes_per_token == 49 * 2 * 2 * 128 * 2


def test_nemotron_parameters_come_from_its_blocks() -> None:
    """The parameters vLLM builds: embeddings, 49 attention blocks, 80 MLPs of ffn_mult 2.625.

    Embedding and untied LM head 2 x 128,256 x 8,192 = 2,101,346,304; an attention block
    2 x 8,192 x 64 x 128 + 2 x 8,192 x 8 x 128 = 150,994,944, x 49 = 7,398,752,256; an MLP
    find_multiple(int(2 x 2.625 x 8,192 / 3), 256) = 14,336 wide, 3 x 8,192 x 14,336 =
    352,321,536, x 80 = 28,185,722,880; 37,685,821,440 in all.
    """
    arch = load_model_arch(NEMOTRON_SUPER)
    assert arch.params == 37_685_821_440
    assert arch.intermediate_size == 14_336


def test_nemotron_with_different_kv_heads_per_block_is_declined() -> None:
    """Blocks of 8 and of 4 KV heads make pages of two sizes: declined, not averaged."""
    config = _nemotron()
    config["block_configs"][0]["attention"]["n_heads_in_group"] = 16
    arch = parse_model_config(config, name="nas")
    assert arch.declined is not None
    assert "KV heads [4, 8]" in arch.declined


def test_nemotron_attention_replaced_by_a_linear_layer_is_declined() -> None:
    """vLLM 0.32's DeciLM layer builds attention or nothing: a linear replacement is not sized."""
    config = _nemotron()
    config["block_configs"][3]["attention"]["replace_with_linear"] = True
    arch = parse_model_config(config, name="nas")
    assert arch.declined is not None
    assert "block_configs[3] replaces attention with a linear layer" in arch.declined


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["block_configs"].pop(), "one block per layer"),
        (
            lambda c: c["block_configs"][0]["attention"].update(n_heads_in_group=7),
            "does not divide num_attention_heads 64",
        ),
        (lambda c: c["block_configs"].__setitem__(0, "x"), r"block_configs\[0\] needs"),
    ],
)
def test_malformed_block_configs_are_one_error(change: Any, message: str) -> None:
    """vLLM indexes block_configs by layer and divides the heads: a bad entry cannot load."""
    config = _nemotron()
    change(config)
    with pytest.raises(ModelConfigError, match=message):
        parse_model_config(config, name="nas")


# --- what layers without KV cannot be sized with -----------------------------------------------


@pytest.mark.parametrize("source", [GEMMA3N, NEMOTRON_SUPER])
def test_pipeline_parallelism_over_layers_without_kv_is_declined(source: Any) -> None:
    """Which stage gets how many KV layers is not modelled: --pp 2 is declined, not guessed."""
    assert isinstance(_sized(load_model_arch(source)), SizingResult)
    declined = size_deployment(
        load_model_arch(source),
        deployment=Deployment(
            gpu_memory_bytes=80 * GIB, kv_cache_memory_bytes=GIB, pipeline_parallel=2
        ),
    )
    assert isinstance(declined, Declined)
    assert "pipeline parallelism" in declined.reason


def test_lora_over_layers_without_attention_is_declined() -> None:
    """LoRA buffers are sized per decoder layer of one shape: not Nemotron-NAS's blocks."""
    declined = size_deployment(
        load_model_arch(NEMOTRON_SUPER),
        deployment=Deployment(
            gpu_memory_bytes=80 * GIB, kv_cache_memory_bytes=GIB, lora=LoraSettings()
        ),
    )
    assert isinstance(declined, Declined)
    assert "--enable-lora" in declined.reason


# --- declined families and fields --------------------------------------------------------------


def test_gemma4_is_sized_not_declined() -> None:
    """Gemma 4 is sized now (tests/sizing/test_gemma4.py); a class built on it is declined.

    A class whose layout was not read from vLLM's source (gemma4_unified) keeps the decline.
    """
    assert load_model_arch(CONFIGS / "gemma4-transformers-default").declined is None
    config = json.loads((CONFIGS / "gemma4-transformers-default" / "config.json").read_text())
    config["text_config"]["model_type"] = "gemma4_unified_text"
    declined = parse_model_config(config, name="g").declined
    assert declined is not None
    assert "gemma4_unified_text" in declined
    assert "\n" not in declined


_LLAMA: dict[str, Any] = json.loads((CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text())


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        # Gemma 4's published config.json spells its full-attention shape at the top level.
        ({"global_head_dim": 512}, "global_head_dim"),
        ({"num_global_key_value_heads": 4}, "num_global_key_value_heads"),
        ({"per_layer_config": {"05": {"head_dim": 512}}}, "per_layer_config"),
        ({"num_key_value_heads_per_layer": [8, 4]}, "num_key_value_heads_per_layer"),
        ({"num_attention_heads_per_layer": [32, 16]}, "num_attention_heads_per_layer"),
        # MiMo-V2-Flash's sliding layers have their own heads (mimo_v2.py).
        ({"swa_num_key_value_heads": 8}, "swa_num_key_value_heads"),
        ({"swa_head_dim": 192}, "swa_head_dim"),
        # Step-3.5's other layer type has its own heads (step3p5.py, attention_other_setting).
        ({"attention_other_setting": {"num_attention_groups": 8}}, "attention_other_setting"),
        ({"num_kv_shared_layers": 8}, "num_kv_shared_layers 8"),
        ({"block_configs": []}, "block_configs"),
        ({"use_cla": True, "cla_share_factor": 2}, "cross-layer attention"),
        ({"is_encoder_decoder": True}, "encoder-decoder"),
        ({"cross_attention_layers": [3, 8]}, "cross_attention_layers"),
        # MiniMax-M3 (vllm/transformers_utils/configs/minimax_m3.py).
        ({"sparse_attention_config": {"top_k": 2048}}, "sparse_attention_config"),
        # Inkling's linear-attention layers (vllm/models/inkling), Kimi Linear's block.
        ({"linear_layer_ids": [0, 2]}, "linear_layer_ids"),
        ({"linear_attn_config": {"kda_layers": [1]}}, "linear_attn_config"),
        ({"v_head_dim": 64}, "v_head_dim 64"),
    ],
)
def test_a_kv_changing_field_is_declined_whatever_the_model_type(
    extra: dict[str, Any], why: str
) -> None:
    """Any KV-changing field the reader does not model declines the config, in one line.

    A Llama config carrying it is declined naming the field, so a new family with the same
    feature is not sized as plain GQA.
    """
    arch = parse_model_config({**_LLAMA, **extra}, name="m")
    assert arch.declined is not None
    assert why in arch.declined
    assert "\n" not in arch.declined


@pytest.mark.parametrize(
    "extra",
    [
        {"num_kv_shared_layers": 0},
        {"use_cla": False, "cla_share_factor": 1},
        # Hunyuan dense (MT 7B) configs: CLA switched off (vLLM reads the factor only with use_cla).
        {"use_cla": False, "cla_share_factor": 2},
        {"use_cla": True, "cla_share_factor": 1},
        {"is_encoder_decoder": False},
        {"per_layer_config": {}},
        {"v_head_dim": 128},
        {"global_head_dim": None},
    ],
)
def test_the_same_fields_saying_nothing_changes_are_read_as_before(extra: dict[str, Any]) -> None:
    """Zero, false, empty or equal values change no layer: Llama 3.1 8B stays 32 x 4,096 B."""
    arch = parse_model_config({**_LLAMA, **extra}, name="m")
    assert arch.declined is None
    result = _sized(arch)
    assert result.bytes_per_token == 32 * 2 * 8 * 128 * 2


def test_an_encoder_decoder_is_declined_though_it_lacks_decoder_only_fields() -> None:
    """Whisper's config has decoder_layers, not num_hidden_layers: the reason still comes out."""
    config = {
        "model_type": "whisper",
        "is_encoder_decoder": True,
        "decoder_layers": 4,
        "d_model": 384,
        "decoder_attention_heads": 6,
    }
    arch = parse_model_config(config, name="whisper")
    assert arch.declined is not None
    assert "encoder-decoder" in arch.declined
    assert isinstance(size_deployment(arch, deployment=Deployment(80 * GIB)), Declined)


# --- against real vLLM 0.32 (CPU build) start-ups ----------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "blocks", "tokens", "concurrency"),
    [
        # 5 KV layers of 10 (4 sliding + 1 full), 256 B per token each; groups of 1 layer; a
        # 128-token block is 32,768 B: 2**30 / 32,768 = 32,768 blocks; a 1,024-token request
        # needs 8 full blocks + 4 x (cdiv(min(63 + 1,024, 1,024), 128) + 1 = 9) = 44 blocks.
        ("gemma3n-tiny-kv-sharing", 32_768, 762_600, 32_768 / 44),
        # 5 attention blocks of 8 with 4 KV heads x 32: 5 x 512 = 2,560 B per token, one group;
        # a 128-token block is 327,680 B: 3,276 blocks, 8 per 1,024-token request.
        ("nemotron-nas-tiny", 3_276, 419_328, 3_276 / 8),
    ],
)
def test_the_model_reproduces_what_vllm_logged(
    fixture: str, blocks: int, tokens: int, concurrency: float
) -> None:
    """vLLM 0.32 (CPU) started on these configs with a 1 GiB KV budget (fixtures README)."""
    result = sized_as_started(fixture)
    assert (result.block_size, result.kv_blocks) == (128, blocks)
    assert result.reported_capacity_tokens == tokens
    assert result.max_concurrency == pytest.approx(concurrency)
