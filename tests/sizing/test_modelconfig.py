"""Specification of config.json reading (exporter.sizing.modelconfig)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.errors import ModelConfigError
from exporter.sizing.modelconfig import (
    hub_cache_dir,
    load_model_arch,
    model_weights_bytes,
    parse_model_config,
)
from tests import paths

CONFIGS = paths.CONFIGS


def test_llama_reads_head_dim_and_gqa() -> None:
    """Llama 3.1 8B: 32 layers, 8 KV heads, head_dim 128, bf16, untied embeddings."""
    arch = load_model_arch(CONFIGS / "llama-3.1-8b-instruct")
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (32, 8, 128)
    assert (arch.dtype, arch.vocab_size, arch.tie_word_embeddings) == ("bfloat16", 128256, False)
    assert arch.layer_kinds == ()


def test_head_dim_derived_when_absent() -> None:
    """Without head_dim the head size is hidden_size / num_attention_heads (Qwen2.5 7B: 128)."""
    arch = load_model_arch(CONFIGS / "qwen2.5-7b-instruct" / "config.json")
    assert arch.head_dim == 3584 // 28
    assert arch.layer_kinds == ()  # use_sliding_window: false


def test_missing_kv_heads_means_mha() -> None:
    """A config without num_key_value_heads is multi-head attention."""
    arch = parse_model_config(
        {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}, name="mha"
    )
    assert arch.num_kv_heads == 8
    assert arch.attention_kind == "MHA"


def test_mistral_windows_every_layer() -> None:
    """Mistral 7B v0.1's sliding_window applies to all 32 layers."""
    arch = load_model_arch(CONFIGS / "mistral-7b-v0.1")
    assert arch.layer_kinds == ("sliding",) * 32
    assert arch.sliding_window == 4096


def test_gemma2_alternates_starting_with_sliding() -> None:
    """Gemma 2 alternates sliding-window and global layers, the first one sliding."""
    arch = load_model_arch(CONFIGS / "gemma-2-9b-it")
    assert arch.layer_kinds[:4] == ("sliding", "full", "sliding", "full")
    assert arch.layer_kinds.count("full") == 21


def test_vlm_text_config_and_layer_types() -> None:
    """Gemma 3 12B nests its decoder in text_config; layer_types give 40 local and 8 global."""
    arch = load_model_arch(CONFIGS / "gemma-3-12b-it")
    assert (arch.num_layers, arch.head_dim, arch.vocab_size) == (48, 256, 262208)
    assert arch.layer_kinds.count("full") == 8
    assert arch.sliding_window == 1024


def test_gemma3_pattern_without_layer_types() -> None:
    """Without layer_types, Gemma 3's sliding_window_pattern 6 makes every 6th layer global."""
    config = json.loads((CONFIGS / "gemma-3-12b-it" / "config.json").read_text())
    del config["text_config"]["layer_types"]
    arch = parse_model_config(config, name="gemma3")
    assert arch.layer_kinds == load_model_arch(CONFIGS / "gemma-3-12b-it").layer_kinds


def test_deepseek_v3_mla_moe_and_fp8() -> None:
    """DeepSeek-V3: MLA 512 + 64, 256 routed experts on 58 layers, fp8 weights."""
    arch = load_model_arch(CONFIGS / "deepseek-v3")
    assert arch.mla is not None
    assert arch.mla.values_per_token == 576
    assert arch.moe is not None
    assert (arch.moe.num_experts, arch.moe.moe_layers) == (256, 58)
    assert arch.quantization == "fp8"


def test_state_space_hybrid_is_declined() -> None:
    """A Jamba-style hybrid is declined with a reason instead of mis-sized."""
    arch = parse_model_config(
        {
            "model_type": "jamba",
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "hidden_size": 4096,
        },
        name="jamba",
    )
    assert arch.declined is not None
    assert "state" in arch.declined


def test_missing_field_is_a_clear_error() -> None:
    """A config without num_hidden_layers fails naming the field."""
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        parse_model_config({"num_attention_heads": 8, "hidden_size": 512}, name="broken")


def test_hub_cache_lookup_honours_hf_home(tmp_path: Path) -> None:
    """A model id resolves to the snapshot that refs/main names under $HF_HOME/hub."""
    repo = tmp_path / "hub" / "models--acme--tiny"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snapshot / "config.json").write_text((CONFIGS / "tiny-llama" / "config.json").read_text())
    arch = load_model_arch("acme/tiny", hf_home=tmp_path)
    assert arch.num_layers == 2
    assert hub_cache_dir(environ={"HF_HUB_CACHE": "/x"}) == Path("/x")
    assert hub_cache_dir(environ={"HF_HOME": "/h"}) == Path("/h/hub")


def test_uncached_model_id_is_not_downloaded(tmp_path: Path) -> None:
    """An id missing from the cache is an error that says nothing is downloaded."""
    with pytest.raises(ModelConfigError, match="nothing is downloaded"):
        load_model_arch("acme/absent", hf_home=tmp_path)


def test_invalid_json_is_a_clear_error(tmp_path: Path) -> None:
    """A config.json that is not JSON fails with the path, not a traceback."""
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_model_arch(tmp_path)


def test_weights_from_index_then_file_sizes(tmp_path: Path) -> None:
    """Weights come from the index's metadata.total_size, else the safetensors file sizes."""
    assert model_weights_bytes(tmp_path) is None
    (tmp_path / "a.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 23)
    assert model_weights_bytes(tmp_path) == 123
    index = {"metadata": {"total_size": 16_060_522_496}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert model_weights_bytes(tmp_path) == 16_060_522_496
