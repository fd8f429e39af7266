"""Specification of the built-in GPU and model catalogues (exporter.sizing.catalog)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest

from exporter.errors import UsageError
from exporter.sizing.catalog import find_gpu, find_model, gpus, models, smallest_gpu
from exporter.sizing.model import Deployment, require_sized, size_deployment
from exporter.sizing.overhead import GIB
from tests import paths

REQUIRED_GPUS = [
    "H100 80GB",
    "H200",
    "A100 40GB",
    "A100 80GB",
    "L40S",
    "L4",
    "A10G",
    "T4",
    "RTX 4090",
    "RTX 3090",
    "B200",
    "MI300X",
]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpus_present_with_source(name: str) -> None:
    """Every GPU the issue lists is in the catalogue, with a source and a plausible size."""
    spec = find_gpu(name)
    assert spec.source
    assert 14 * GIB < spec.memory_bytes < 200 * GIB


def test_gpu_lookup_forgives_spelling() -> None:
    """Case, dashes and aliases do not matter: 'h100-80gb' is the H100 80GB."""
    assert find_gpu("h100-80gb").name == "H100 80GB"
    assert find_gpu("NVIDIA A100-SXM4-40GB").name == "A100 40GB"


def test_unknown_gpu_suggests_close_matches() -> None:
    """An unknown GPU name fails with close matches in the message."""
    with pytest.raises(UsageError, match="H100"):
        find_gpu("H10")


def test_every_model_entry_parses_and_cites() -> None:
    """Every catalogue model parses into an architecture and cites its source."""
    for entry in models():
        arch = entry.arch()
        assert entry.source
        assert arch.num_layers > 0
        assert arch.params


#: Catalogue entries whose published config.json is also copied under tests/fixtures/configs.
FIXTURE_OF = {
    "tiny-llama-2l": "tiny-llama",
    "llama-3.1-8b": "llama-3.1-8b-instruct",
    "qwen2.5-7b": "qwen2.5-7b-instruct",
    "mistral-7b-v0.1": "mistral-7b-v0.1",
    "gemma-2-9b": "gemma-2-9b-it",
    "gemma-3-12b": "gemma-3-12b-it",
    "deepseek-v3": "deepseek-v3",
}


@pytest.mark.parametrize(("name", "fixture"), sorted(FIXTURE_OF.items()))
def test_entries_name_the_model_class_their_config_declares(name: str, fixture: str) -> None:
    """An entry's ``architectures`` is its config.json's: the class vLLM loads (LoRA reads it)."""
    entry = find_model(name)
    assert entry is not None
    declared = json.loads((paths.CONFIGS / fixture / "config.json").read_text())["architectures"]
    assert entry.config["architectures"] == declared
    assert entry.arch().architecture == declared[0]


def test_model_lookup_by_hub_id_and_alias() -> None:
    """A model is found by name, hub id or alias."""
    llama, qwen = find_model("meta-llama/Llama-3.1-8B-Instruct"), find_model("Qwen/Qwen2.5-7B")
    assert llama is not None
    assert llama.name == "llama-3.1-8b"
    assert qwen is not None
    assert qwen.name == "qwen2.5-7b"
    assert find_model("no-such-model") is None


def test_smallest_gpu_is_the_first_that_fits() -> None:
    """The smallest catalogue GPU holding the target fits it; the one below it does not."""
    llama = find_model("llama-3.1-8b")
    assert llama is not None
    arch = llama.arch()
    deployment = Deployment(gpu_memory_bytes=0, max_model_len=8192)
    spec = smallest_gpu(arch, deployment=deployment, sequences=100, context_tokens=4000)
    assert spec is not None
    ordered = list(gpus())
    assert ordered.index(spec) > 0


def test_qwen3_next_is_a_hybrid_of_12_attention_and_36_gated_delta_net_layers() -> None:
    """Qwen3-Next (one full-attention layer in four) is sized as a hybrid, not declined."""
    entry = find_model("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert entry is not None
    arch = entry.arch()
    assert arch.declined is None
    assert arch.num_layers == 48
    assert arch.attention_layers == 12
    assert arch.state is not None
    assert arch.state.num_layers == 36
    assert (arch.state.num_heads, arch.state.num_k_heads) == (32, 16)


@pytest.mark.parametrize(
    ("name", "linear_bytes"), [("Qwen/Qwen3-235B-A22B", 2), ("Qwen/Qwen3-235B-A22B-FP8", 1)]
)
def test_qwen3_235b_a22b_is_sized_from_its_config_in_bf16_and_fp8(
    name: str, linear_bytes: int
) -> None:
    """94 layers of 4 KV heads of 128: 192,512 bytes a token, 48,128 at TP 4; weights by hand.

    Parameters: embedding and head 2 x 151,936 x 4,096; per layer the attention (q and o 4,096
    x 8,192, k and v 4,096 x 512), 128 experts of 3 x 4,096 x 1,536 and the router 4,096 x
    128. FP8 stores the decoder's linears in one byte, the embedding and head in two.
    """
    entry = find_model(name)
    assert entry is not None
    head = 2 * 151_936 * 4_096
    layer = 2 * 4_096 * 8_192 + 2 * 4_096 * 512 + 128 * 3 * 4_096 * 1_536 + 4_096 * 128
    weights = head * 2 + 94 * layer * linear_bytes
    deployment = Deployment(
        gpu_memory_bytes=int(79.19 * GIB), tensor_parallel=4, max_model_len=40_960
    )
    result = require_sized(size_deployment(entry.arch(), deployment=deployment))
    assert result.bytes_per_token == 94 * 1 * 128 * 2 * 2
    assert result.weights_bytes == pytest.approx(weights / 4, rel=0.001)


# --- plain-attention entries added from vendored config.json copies ------------------------------
#
# Each row is worked by hand from the fields the entry cites (exporter/data/models.json), vLLM's
# formula for full attention: 2 (K and V) x layers x KV heads x head_dim x 2 B (bf16, TP 1). The
# context length is max_position_embeddings: Llama 3.2's llama3 rope type leaves it unscaled.


@dataclass(frozen=True)
class AttentionRow:
    """One plain-attention entry: its shape and the bytes per token worked by hand."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_token: int
    max_model_len: int


ATTENTION_ROWS = [
    # Llama-3.2-1B: 16 layers, 8 KV heads of 64 (head_dim given), tied embedding.
    AttentionRow("llama-3.2-1b", 16, 8, 64, 2 * 16 * 8 * 64 * 2, 131_072),
]


@pytest.mark.parametrize("row", ATTENTION_ROWS, ids=lambda row: row.name)
def test_attention_entries_are_sized_from_their_cited_fields(row: AttentionRow) -> None:
    """32,768 B a token for Llama-3.2-1B, at its full length."""
    entry = find_model(row.name)
    assert entry is not None
    arch = entry.arch()
    assert arch.declined is None
    assert arch.mla is None
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (
        row.layers,
        row.kv_heads,
        row.head_dim,
    )
    deployment = Deployment(gpu_memory_bytes=int(79.19 * GIB), max_model_len=row.max_model_len)
    result = require_sized(size_deployment(arch, deployment=deployment))
    assert result.bytes_per_token == row.bytes_per_token
    assert arch.derived_max_len is None
    assert arch.max_position_embeddings == row.max_model_len


# --- hybrid entries: Nemotron-H, Falcon-H1, Granite-4.0-H, LFM2 and Jamba -------------------------
#
# Each row is worked by hand from the fields the entry cites (exporter/data/models.json), the way
# vLLM 0.32 sizes a Mamba2 layer (docs/sizing.md, "Hybrid state-space and linear-attention
# models"): one attention token costs 2 (K and V) x KV heads x head_dim x 2 B per attention layer;
# one Mamba2 state is conv (kernel 4 - 1) x (Mamba heads x head dim + 2 x groups x state) values
# plus SSM Mamba heads x head dim x state values. Nemotron-H keeps its SSM state in float32
# (vLLM's default for it), Falcon-H1 and Granite-4.0-H in the model's bfloat16; conv states are
# bfloat16. Granite-4.0-H's Mamba width is mamba_expand x hidden, which its heads span exactly
# (2 x 768 = 48 x 32; 2 x 1,536 = 48 x 64; 2 x 4,096 = 128 x 64). An LFM2 short-conv layer keeps
# only its conv state, (conv_L_cache 3 - 1) x conv_dim bfloat16 values; its attention head_dim is
# hidden / heads = 64 in every size. A Jamba Mamba1 layer keeps conv (mamba_d_conv 4 - 1) x
# (mamba_expand 2 x hidden) values and SSM (2 x hidden) x mamba_d_state values, both bfloat16.
# The attention block is 16 x cdiv(state, 16 x one layer's attention bytes per token).


@dataclass(frozen=True)
class HybridRow:
    """One hybrid entry: its layer split and the bytes worked by hand."""

    name: str
    layers: int
    attention_layers: int
    mamba_layers: int
    attention_bytes_per_token: int
    state_bytes: int
    block_size: int
    kind: str = "mamba2"


HYBRID_ROWS = [
    HybridRow(
        "nemotron-h-8b",
        52,
        4,
        24,
        4 * 2 * 8 * 128 * 2,
        3 * (128 * 64 + 2 * 8 * 128) * 2 + 128 * 64 * 128 * 4,
        16 * 65,  # cdiv(4,255,744, 16 x 4,096) = 65
    ),
    HybridRow(
        "nemotron-h-47b",
        98,
        5,
        45,
        5 * 2 * 8 * 128 * 2,
        3 * (256 * 64 + 2 * 8 * 256) * 2 + 256 * 64 * 256 * 4,
        16 * 258,  # cdiv(16,900,096, 65,536) = 258
    ),
    HybridRow(
        "nemotron-h-56b",
        118,
        10,
        54,
        10 * 2 * 8 * 128 * 2,
        3 * (256 * 64 + 2 * 8 * 256) * 2 + 256 * 64 * 256 * 4,
        16 * 258,
    ),
    HybridRow(
        "nemotron-nano-9b-v2",
        56,
        4,
        27,
        4 * 2 * 8 * 128 * 2,
        3 * (128 * 80 + 2 * 8 * 128) * 2 + 128 * 80 * 128 * 4,
        16 * 82,  # cdiv(5,316,608, 65,536) = 82
    ),
    HybridRow(
        # Falcon-H1: attention and Mamba2 side by side in every layer.
        "falcon-h1-7b",
        44,
        44,
        44,
        44 * 2 * 2 * 128 * 2,
        3 * (24 * 128 + 2 * 1 * 256) * 2 + 24 * 128 * 256 * 2,
        16 * 98,  # cdiv(1,594,368, 16 x 1,024) = 98
    ),
    HybridRow(
        "falcon-h1-34b",
        72,
        72,
        72,
        72 * 2 * 4 * 128 * 2,
        3 * (32 * 128 + 2 * 2 * 256) * 2 + 32 * 128 * 256 * 2,
        16 * 65,  # cdiv(2,127,872, 16 x 2,048) = 65
    ),
    HybridRow(
        # Granite-4.0-H: 4 attention layers; H-350M's Mamba heads are 32 wide (2 x 768 = 48 x 32).
        "granite-4.0-h-350m",
        32,
        4,
        28,
        4 * 2 * 4 * 64 * 2,
        3 * (48 * 32 + 2 * 1 * 128) * 2 + 48 * 32 * 128 * 2,
        16 * 25,  # cdiv(403,968, 16 x 1,024) = 25
    ),
    HybridRow(
        "granite-4.0-h-1b",
        40,
        4,
        36,
        4 * 2 * 4 * 128 * 2,
        3 * (48 * 64 + 2 * 1 * 128) * 2 + 48 * 64 * 128 * 2,
        16 * 25,  # cdiv(806,400, 16 x 2,048) = 25
    ),
    HybridRow(
        "granite-4.0-h-tiny",
        40,
        4,
        36,
        4 * 2 * 4 * 128 * 2,
        3 * (48 * 64 + 2 * 1 * 128) * 2 + 48 * 64 * 128 * 2,
        16 * 25,  # cdiv(806,400, 16 x 2,048) = 25
    ),
    HybridRow(
        "granite-4.0-h-small",
        40,
        4,
        36,
        4 * 2 * 8 * 128 * 2,
        3 * (128 * 64 + 2 * 1 * 128) * 2 + 128 * 64 * 128 * 2,
        16 * 33,  # cdiv(2,147,840, 16 x 4,096) = 33
    ),
    HybridRow(
        # LFM2: attention at layers 2, 5, 8, 10, 12, 14 of 16; 8 KV heads of 64.
        "lfm2-350m",
        16,
        6,
        10,
        6 * 2 * 8 * 64 * 2,
        2 * 1_024 * 2,
        16 * 1,  # cdiv(4,096, 16 x 2,048) = 1
        "short_conv",
    ),
    HybridRow(
        "lfm2-700m",
        16,
        6,
        10,
        6 * 2 * 8 * 64 * 2,
        2 * 1_536 * 2,
        16 * 1,  # cdiv(6,144, 16 x 2,048) = 1
        "short_conv",
    ),
    HybridRow(
        "lfm2-1.2b",
        16,
        6,
        10,
        6 * 2 * 8 * 64 * 2,
        2 * 2_048 * 2,
        16 * 1,  # cdiv(8,192, 16 x 2,048) = 1
        "short_conv",
    ),
    HybridRow(
        # LFM2-2.6B: attention at layers 2, 5, 9, 13, 17, 21, 24, 27 of 30.
        "lfm2-2.6b",
        30,
        8,
        22,
        8 * 2 * 8 * 64 * 2,
        2 * 2_048 * 2,
        16 * 1,  # cdiv(8,192, 16 x 2,048) = 1
        "short_conv",
    ),
    HybridRow(
        # Jamba-v0.1: attention where i % 8 == 4 (layers 4, 12, 20, 28); 8 KV heads of 4,096 / 32.
        "jamba-v0.1",
        32,
        4,
        28,
        4 * 2 * 8 * 128 * 2,
        3 * 8_192 * 2 + 8_192 * 16 * 2,
        16 * 5,  # cdiv(311,296, 16 x 4,096) = 5
        "mamba1",
    ),
]
HYBRID_KV = Deployment(
    gpu_memory_bytes=80 * GIB, kv_cache_memory_bytes=10 * GIB, max_model_len=8192
)


@pytest.mark.parametrize("row", HYBRID_ROWS, ids=lambda row: row.name)
def test_hybrid_entries_are_sized_from_their_cited_fields(row: HybridRow) -> None:
    """Every hybrid entry takes the hybrid path with its state kind and the bytes above."""
    entry = find_model(row.name)
    assert entry is not None
    arch = entry.arch()
    assert arch.declined is None
    assert arch.state is not None
    assert (arch.num_layers, arch.attention_layers, arch.state.num_layers) == (
        row.layers,
        row.attention_layers,
        row.mamba_layers,
    )
    assert arch.state.kind == row.kind
    result = require_sized(size_deployment(arch, deployment=HYBRID_KV))
    assert result.bytes_per_token == row.attention_bytes_per_token
    assert result.state_bytes == row.state_bytes
    assert (result.requested_block_size, result.block_size) == (16, row.block_size)


def test_nemotron_h_8b_groups_and_concurrency_by_hand() -> None:
    """Nemotron-H-8B, 10 GiB of KV cache, 8,192-token requests.

    4 attention and 24 Mamba2 layers: group size 4, so one attention group and six state groups,
    4 pages of 1,040 x 4,096 B per block: 10 GiB // 17,039,360 = 630 blocks. A request needs
    cdiv(8,192, 1,040) = 8 attention blocks + 6 x 3 state blocks (align mode; Mamba2 keeps one
    prefill checkpoint block) = 26.
    """
    entry = find_model("nvidia/Nemotron-H-8B-Base-8K")
    assert entry is not None
    result = require_sized(size_deployment(entry.arch(), deployment=HYBRID_KV))
    assert [group.kind for group in result.kv_groups] == ["full"] + ["state"] * 6
    assert result.block_bytes == 4 * 1_040 * 4_096
    assert result.kv_blocks == 630
    assert result.blocks_per_max_len_request == 26
    assert result.kv_cache_size_tokens == int(630 / 26 * 8_192)
    assert result.state_dtypes == ("bfloat16", "float32")


def test_granite_4_0_h_tiny_groups_and_concurrency_by_hand() -> None:
    """Granite-4.0-H-Tiny, 10 GiB of KV cache, 8,192-token requests.

    4 attention and 36 Mamba2 layers: group size 4, so one attention group and nine state groups,
    4 pages of 400 x 2,048 B per block: 10 GiB // 3,276,800 = 3,276 blocks. A request needs
    cdiv(8,192, 400) = 21 attention blocks + 9 x 3 state blocks (align mode) = 48. Both states
    are bfloat16: the config gives no mamba_ssm_cache_dtype, so vLLM keeps the model's dtype.
    """
    entry = find_model("ibm-granite/granite-4.0-h-tiny")
    assert entry is not None
    result = require_sized(size_deployment(entry.arch(), deployment=HYBRID_KV))
    assert [group.kind for group in result.kv_groups] == ["full"] + ["state"] * 9
    assert result.block_bytes == 4 * 400 * 2_048
    assert result.kv_blocks == 3_276
    assert result.blocks_per_max_len_request == 48
    assert result.kv_cache_size_tokens == int(3_276 / 48 * 8_192)
    assert result.state_dtypes == ("bfloat16", "bfloat16")


def test_falcon_h1_34b_replicates_its_two_groups_at_tp4() -> None:
    """Falcon-H1-34B at TP 4: its 2 Mamba groups are replicated to 4 so every shard has one.

    conv (4 - 1) x (4,096 + 2 x 4 x 256) / 4 x 2 B = 9,216; SSM 32 / 4 heads x 128 x 256 x 2 B =
    524,288; one KV head per GPU: 72 x 2 x 1 x 128 x 2 = 36,864 B per token.
    """
    entry = find_model("tiiuae/Falcon-H1-34B-Instruct")
    assert entry is not None
    result = require_sized(
        size_deployment(entry.arch(), deployment=replace(HYBRID_KV, tensor_parallel=4))
    )
    assert result.state_bytes == 9_216 + 524_288
    assert result.bytes_per_token == 36_864


def test_hybrid_entries_name_their_model_class_where_their_source_gives_it() -> None:
    """Nano 9B v2, Falcon-H1 and Granite-4.0-H carry ``architectures``; recipe-only ones do not."""
    classes = {}
    names = ("nemotron-nano-9b-v2", "falcon-h1-7b", "falcon-h1-34b", "granite-4.0-h-small")
    for name in (*names, "nemotron-h-8b"):
        entry = find_model(name)
        assert entry is not None
        classes[name] = entry.arch().architecture
    assert classes == {
        "nemotron-nano-9b-v2": "NemotronHForCausalLM",
        "falcon-h1-7b": "FalconH1ForCausalLM",
        "falcon-h1-34b": "FalconH1ForCausalLM",
        "granite-4.0-h-small": "GraniteMoeHybridForCausalLM",
        "nemotron-h-8b": None,
    }


def test_lfm2_1_2b_groups_and_concurrency_by_hand() -> None:
    """LFM2-1.2B, 10 GiB of KV cache, 8,192-token requests.

    6 attention and 10 short-conv layers: 10 is more than 1.5 x 6, so the group size is 6, one
    attention group and cdiv(10, 6) = 2 state groups, 6 pages of 16 x 2,048 B per block (each
    8,192 B conv state padded to the 32,768 B page): 10 GiB // 196,608 = 54,613 blocks. A request
    needs cdiv(8,192, 16) = 512 attention blocks + 2 x 2 state blocks (align mode; no prefill
    checkpoint block outside Mamba2) = 516.
    """
    entry = find_model("LiquidAI/LFM2-1.2B")
    assert entry is not None
    result = require_sized(size_deployment(entry.arch(), deployment=HYBRID_KV))
    assert [group.kind for group in result.kv_groups] == ["full", "state", "state"]
    assert result.block_bytes == 6 * 16 * 2_048
    assert result.kv_blocks == 54_613
    assert result.blocks_per_max_len_request == 516
    assert result.kv_cache_size_tokens == int(54_613 / 516 * 8_192)
    assert result.state_dtypes == ("bfloat16", "bfloat16")


def test_jamba_v0_1_groups_and_concurrency_by_hand() -> None:
    """Jamba-v0.1, 10 GiB of KV cache, 8,192-token requests.

    4 attention and 28 Mamba1 layers: group size 4, one attention group and seven state groups,
    4 pages of 80 x 4,096 B per block: 10 GiB // 1,310,720 = 8,192 blocks. A request needs
    cdiv(8,192, 80) = 103 attention blocks + 7 x 2 state blocks (align mode) = 117.
    """
    entry = find_model("ai21labs/Jamba-v0.1")
    assert entry is not None
    result = require_sized(size_deployment(entry.arch(), deployment=HYBRID_KV))
    assert [group.kind for group in result.kv_groups] == ["full"] + ["state"] * 7
    assert result.block_bytes == 4 * 80 * 4_096
    assert result.kv_blocks == 8_192
    assert result.blocks_per_max_len_request == 117
    assert result.kv_cache_size_tokens == int(8_192 / 117 * 8_192)
    assert result.state_dtypes == ("bfloat16", "bfloat16")
