"""Specification of config.json reading (exporter.sizing.modelconfig)."""

from __future__ import annotations

import json
import os
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


_MOE = {
    "model_type": "x",
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "hidden_size": 1024,
    "num_local_experts": 16,
}


@pytest.mark.parametrize(
    ("spelling", "moe_layers"),
    [
        ({}, 8),  # Mixtral: every layer
        ({"moe_layers": [1, 3, 5, 7]}, 4),  # Llama 4's config lists them
        ({"moe_layers": [1, 1, 99, -1]}, 1),  # duplicates and layers that do not exist
        ({"interleave_moe_layer_step": 2}, 4),  # Llama 4 Maverick: layers 1, 3, 5, 7
        ({"expert_layer_period": 2, "expert_layer_offset": 1}, 4),  # Jamba: layers 1, 3, 5, 7
        ({"expert_layer_period": 4}, 2),  # offset 0: layers 0 and 4
        ({"decoder_sparse_step": 1, "mlp_only_layers": [0, 7]}, 6),  # Qwen-MoE
        ({"decoder_sparse_step": 2, "mlp_only_layers": [[1], "x"]}, 4),  # junk entries ignored
        ({"first_k_dense_replace": 3}, 5),  # DeepSeek: the first three dense
        ({"first_k_dense_replace": 1, "moe_layer_freq": 2}, 3),  # DeepSeek-V2 spelling: 2, 4, 6
    ],
)
def test_only_the_layers_that_hold_experts_are_counted(
    spelling: dict[str, object], moe_layers: int
) -> None:
    """Interleaved MoE (Jamba, Llama 4 Maverick, Qwen-MoE) is counted as the model's code does."""
    arch = parse_model_config({**_MOE, **spelling}, name="moe")
    assert arch.moe is not None
    assert arch.moe.moe_layers == moe_layers


def test_state_space_hybrid_is_declined() -> None:
    """A MiniMax-style hybrid is declined with a reason instead of mis-sized."""
    arch = parse_model_config(
        {
            "model_type": "minimax",
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "hidden_size": 4096,
        },
        name="minimax",
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


# --- hybrid state-space / linear-attention models -----------------------------------------------

_ATTENTION = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


def test_qwen3_next_reads_gated_delta_net_layers_from_the_interval() -> None:
    """No layer_types: every full_attention_interval-th layer is full attention, others GDN."""
    arch = parse_model_config(
        {
            **_ATTENTION,
            "model_type": "qwen3_next",
            "num_hidden_layers": 8,
            "full_attention_interval": 4,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 32,
            "linear_conv_kernel_dim": 4,
        },
        name="q",
    )
    assert arch.declined is None
    assert arch.state is not None
    assert (arch.num_layers, arch.attention_layers, arch.state.num_layers) == (8, 2, 6)
    assert arch.state.kind == "gated_delta_net"
    # conv (64 x 2 x 2 + 32 x 4) x 3 taps; SSM 4 value heads x 32 x 64.
    assert arch.state.element_counts(1) == (384 * 3, 4 * 32 * 64)


def test_granite_hybrid_takes_either_layer_type_spelling() -> None:
    """Granite-4.0-H's published mamba/attention names and transformers 5's linear/full ones."""
    mamba = {
        "mamba_n_heads": 8,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    }
    for names in (["mamba", "mamba", "attention"], ["linear_attention"] * 2 + ["full_attention"]):
        config = {**_ATTENTION, **mamba, "model_type": "granitemoehybrid", "layer_types": names}
        arch = parse_model_config({**config, "num_hidden_layers": 3}, name="g")
        assert arch.state is not None
        assert (arch.attention_layers, arch.state.num_layers, arch.state.kind) == (1, 2, "mamba2")
        # conv (2 x 256 + 2 x 1 group x 64) x 3 taps; SSM 8 heads x 64 x 64.
        assert arch.state.element_counts(1) == (640 * 3, 8 * 64 * 64)


def test_mamba2_groups_are_replicated_for_tp_that_does_not_divide_them() -> None:
    """One group at TP 2: vLLM adds tp - n_groups groups so every head shard has its group."""
    arch = parse_model_config(
        {
            **_ATTENTION,
            "model_type": "falcon_h1",
            "num_hidden_layers": 2,
            "mamba_d_ssm": 512,
            "mamba_n_heads": 8,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 64,
            "mamba_d_conv": 4,
        },
        name="f",
    )
    assert arch.state is not None
    assert (arch.attention_layers, arch.state.num_layers) == (2, 2)  # both in every layer
    assert arch.state.element_counts(2) == ((512 + 2 * 2 * 64) // 2 * 3, 4 * 64 * 64)


def test_nemotron_h_reads_its_pattern_and_float32_ssm_default() -> None:
    """hybrid_override_pattern: M = Mamba2, * = attention, - and E = no cache."""
    arch = parse_model_config(
        {
            **_ATTENTION,
            "model_type": "nemotron_h",
            "hybrid_override_pattern": "M-M*-E",
            "mamba_num_heads": 8,
            "mamba_head_dim": 64,
            "n_groups": 1,
            "ssm_state_size": 64,
            "conv_kernel": 4,
        },
        name="n",
    )
    assert arch.state is not None
    assert (arch.num_layers, arch.attention_layers, arch.state.num_layers) == (6, 1, 2)
    assert arch.state.ssm_dtype_default == "float32"


def test_lfm2_short_conv_from_full_attn_idxs() -> None:
    """LFM2: conv layers keep (L_cache - 1) x conv_dim values; attention at full_attn_idxs."""
    arch = parse_model_config(
        {
            **_ATTENTION,
            "model_type": "lfm2",
            "num_hidden_layers": 4,
            "full_attn_idxs": [1, 3],
            "conv_L_cache": 3,
        },
        name="l",
    )
    assert arch.state is not None
    assert (arch.attention_layers, arch.state.kind) == (2, "short_conv")
    assert arch.state.element_counts(1) == (2 * 256, 0)  # conv_dim defaults to hidden_size


@pytest.mark.parametrize(
    ("model_type", "why"),
    [("zamba", "Mamba1"), ("bamba", "no Bamba model"), ("kimi_linear", "KDA")],
)
def test_unmodelled_state_families_are_declined_in_one_line(model_type: str, why: str) -> None:
    """Families vLLM 0.32 sizes differently (or does not serve) say so instead of a guess."""
    arch = parse_model_config(
        {**_ATTENTION, "model_type": model_type, "num_hidden_layers": 4}, name="x"
    )
    assert arch.declined is not None
    assert why in arch.declined
    assert "\n" not in arch.declined


def test_hybrid_pattern_without_attention_is_an_error() -> None:
    """A hybrid config whose pattern lists no attention layer is reported, not sized."""
    with pytest.raises(ModelConfigError, match="0 attention"):
        parse_model_config(
            {
                **_ATTENTION,
                "model_type": "lfm2",
                "num_hidden_layers": 2,
                "layer_types": ["conv", "conv"],
                "conv_L_cache": 3,
            },
            name="l",
        )


# --- hostile values: one reader of integer fields -------------------------------------------------

_LLAMA = json.loads((CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text())

#: Every integer field, with the neighbours that make the sizing read it.
_FIELDS: list[tuple[str, dict[str, object]]] = [
    ("num_hidden_layers", {}),
    ("num_attention_heads", {}),
    ("num_key_value_heads", {}),
    ("head_dim", {}),
    ("hidden_size", {}),
    ("vocab_size", {}),
    ("intermediate_size", {}),
    ("max_position_embeddings", {}),
    ("kv_lora_rank", {"qk_rope_head_dim": 64}),
    ("qk_rope_head_dim", {"kv_lora_rank": 512}),
    ("num_local_experts", {"num_experts_per_tok": 2}),
    ("first_k_dense_replace", {"n_routed_experts": 8, "moe_intermediate_size": 64}),
    ("sliding_window", {"layer_types": ["sliding_attention", "full_attention"] * 16}),
    ("sliding_window_pattern", {"model_type": "gemma3_text", "sliding_window": 512}),
    (
        "max_window_layers",
        {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 1024},
    ),
    ("num_nextn_predict_layers", {}),
]
#: What JSON can hold that is no count: Python's json reads NaN, Infinity and 1e400 (= inf).
_NOT_COUNTS: list[object] = [
    float("nan"),
    float("inf"),
    float("-inf"),
    0.5,
    32.5,
    "8",
    True,
    [8],
    -3,
    1e308,
    10**30,
]


#: Every field with every value, but a list where a size may be given per layer (a list of
#: counts there is read: test_a_per_layer_intermediate_size_is_read_as_its_mean).
_NOT_COUNT_CASES = [
    (field, context, value)
    for field, context in _FIELDS
    for value in _NOT_COUNTS
    if not (field == "intermediate_size" and isinstance(value, list))
]


@pytest.mark.parametrize(
    ("field", "context", "value"),
    _NOT_COUNT_CASES,
    ids=[f"{field}-{value!r}" for field, _, value in _NOT_COUNT_CASES],
)
def test_an_integer_field_that_holds_no_count_is_one_clear_error(
    field: str, context: dict[str, object], value: object
) -> None:
    """NaN, infinities, fractions, strings, booleans, negatives and absurd sizes name the field.

    Never a traceback, a truncation (0.5 -> 0) or a silent default (a bad KV-head count read as
    absent would size the model as MHA, four times the KV per token).
    """
    config = {**_LLAMA, **context, field: value}
    with pytest.raises(ModelConfigError, match=rf"^hostile: config\.json field '{field}' is "):
        parse_model_config(config, name="hostile")


@pytest.mark.parametrize("value", ["false", "true", 0, 1, 0.0, [], {}], ids=repr)
def test_tie_word_embeddings_is_true_or_false_or_an_error(value: object) -> None:
    """bool("false") is True: a string there would tie the LM head and drop it from the weights."""
    config = {**_LLAMA, "tie_word_embeddings": value}
    with pytest.raises(ModelConfigError, match=r"'tie_word_embeddings' is .*not true or false"):
        parse_model_config(config, name="hostile")


def test_a_gemma_config_without_the_key_is_tied_as_its_class() -> None:
    """Gemma's configs leave tie_word_embeddings out: the Gemma classes default to tied."""
    for model_type, tied in (("gemma3_text", True), ("gemma2", True), ("llama", False)):
        config = {k: v for k, v in _LLAMA.items() if k != "tie_word_embeddings"}
        config["model_type"] = model_type
        assert parse_model_config(config, name="m").tie_word_embeddings is tied, model_type


@pytest.mark.parametrize(("value", "tied"), [(True, True), (False, False), (None, False)])
def test_tie_word_embeddings_as_written(value: bool | None, tied: bool) -> None:
    """true, false, or absent (null): untied, as transformers' default."""
    arch = parse_model_config({**_LLAMA, "tie_word_embeddings": value}, name="llama")
    assert arch.tie_word_embeddings is tied


@pytest.mark.parametrize("field", ["num_key_value_heads", "head_dim", "max_position_embeddings"])
def test_a_zero_count_is_an_error_not_absent(field: str) -> None:
    """0 KV heads is not "no num_key_value_heads" (MHA), nor a 0 head size or context length."""
    with pytest.raises(ModelConfigError, match=f"'{field}' is 0"):
        parse_model_config({**_LLAMA, field: 0}, name="zero")


def test_integer_fields_inside_text_config_are_checked_too() -> None:
    """A vision-language model's text_config goes through the same reader."""
    config = {"vision_config": {}, "text_config": {**_LLAMA, "num_key_value_heads": float("nan")}}
    with pytest.raises(ModelConfigError, match="'num_key_value_heads' is nan"):
        parse_model_config(config, name="vlm")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 16, "head_dim": None}, "rounds to 0; give head_dim"),
        ({"num_key_value_heads": 5}, "num_key_value_heads 5 does not divide"),
        ({"num_key_value_heads": 64}, "num_key_value_heads 64 does not divide"),
    ],
)
def test_attention_shapes_vllm_cannot_build_are_refused(
    change: dict[str, object], message: str
) -> None:
    """A derived head size of 0, or KV heads that do not divide the heads, are errors."""
    with pytest.raises(ModelConfigError, match=message):
        parse_model_config({**_LLAMA, **change}, name="shape")


@pytest.mark.parametrize(
    "raw",
    [
        '"num_hidden_layers": NaN',
        '"num_hidden_layers": Infinity',
        '"num_hidden_layers": 1e400',
        '"num_hidden_layers": ' + "9" * 5000,
    ],
    ids=["NaN", "Infinity", "1e400", "5000-digits"],
)
def test_hostile_numbers_in_a_config_file_are_one_line(tmp_path: Path, raw: str) -> None:
    """What json.loads lets through from a file ends as a ModelConfigError naming the file."""
    text = json.dumps(_LLAMA).replace('"num_hidden_layers": 32', raw)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelConfigError, match=str(tmp_path)) as caught:
        load_model_arch(tmp_path)
    assert "\n" not in str(caught.value)
    assert "set_int_max_str_digits" not in str(caught.value)


def test_integral_floats_are_counts() -> None:
    """Some writers emit 32.0: an integral float is read as the integer."""
    arch = parse_model_config({**_LLAMA, "num_hidden_layers": 32.0, "head_dim": 128.0}, name="f")
    assert (arch.num_layers, arch.head_dim) == (32, 128)


@pytest.mark.parametrize("kind", ["fifo", "loop", "dangling", "directory"])
def test_a_config_json_that_is_not_a_file_is_named_truly(tmp_path: Path, kind: str) -> None:
    """A FIFO, a symlink loop, a dangling link or a directory is never "has no config.json"."""
    config = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "loop":
        config.symlink_to(config)
    elif kind == "dangling":
        config.symlink_to(tmp_path / "absent.json")
    else:
        config.mkdir()
    with pytest.raises(ModelConfigError) as caught:
        load_model_arch(tmp_path)
    assert "has no config.json" not in str(caught.value)
    assert str(config) in str(caught.value)


# --- the safetensors index and the checkpoint files ----------------------------------------------


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ('{"metadata": [1]}', "is not a safetensors index"),
        ('{"metadata": "x"}', "is not a safetensors index"),
        ("[1, 2]", "is not a safetensors index"),
        ('{"metadata": {"total_size": Infinity}}', "'metadata.total_size' is inf"),
        ('{"metadata": {"total_size": 1e400}}', "'metadata.total_size' is inf"),
        ('{"metadata": {"total_size": NaN}}', "'metadata.total_size' is nan"),
        ('{"metadata": {"total_size": -5}}', "'metadata.total_size' is -5"),
        ('{"metadata": {"total_size": "16060522496"}}', "'metadata.total_size' is '16060"),
        ('{"metadata": {"total_size": ' + "9" * 5000 + "}}", "thousands of digits"),
        ("{corrupt", "is not valid JSON"),
    ],
)
def test_a_bad_index_is_one_line_naming_the_file(tmp_path: Path, index: str, message: str) -> None:
    """Whatever the index holds, the error names it and never asks whether it is a config.json."""
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ModelConfigError, match=message) as caught:
        model_weights_bytes(tmp_path)
    text = str(caught.value)
    assert "model.safetensors.index.json" in text
    assert "config.json" not in text.replace("model.safetensors.index.json", "")
    assert "\n" not in text


def test_git_lfs_pointer_files_are_not_weights(tmp_path: Path) -> None:
    """A clone without git-lfs leaves ~130-byte pointers: refused, saying `git lfs pull`."""
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 4976698672\n"
    for i in (1, 2):
        (tmp_path / f"model-0000{i}-of-00002.safetensors").write_text(pointer)
    with pytest.raises(ModelConfigError, match=r"git-lfs pointer files.*git lfs pull"):
        model_weights_bytes(tmp_path)


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ({"quant_method": "gptq", "bits": 4}, "gptq"),
        ({"quant_method": "gptq", "bits": 8}, "gptq_8bit"),
        ({"quant_method": "gptq", "bits": 8, "sym": True}, "gptq_8bit"),
        ({"quant_method": "gptq"}, "gptq"),
        ({"quant_method": "awq", "bits": 4}, "awq"),
    ],
)
def test_gptq_width_comes_from_its_bits(quant: dict[str, object], expected: str) -> None:
    """An 8-bit GPTQ checkpoint is not sized as 4-bit."""
    arch = parse_model_config({**_LLAMA, "quantization_config": quant}, name="q")
    assert arch.quantization == expected


@pytest.mark.parametrize(
    "quant",
    [
        {"quant_method": "gptq", "bits": 5},
        # vLLM 0.32 serves GPTQ through AutoGPTQConfig only, whose TYPE_MAP holds (4, sym) and
        # (8, sym): 2- and 3-bit and asymmetric checkpoints raise "Unsupported quantization
        # config" (vllm/model_executor/layers/quantization/auto_gptq.py).
        {"quant_method": "gptq", "bits": 2},
        {"quant_method": "gptq", "bits": 3},
        {"quant_method": "gptq", "bits": 4, "sym": False},
        {"quant_method": "gptq", "bits": "x"},
        {"quant_method": "gptq", "bits": float("nan")},
        {"quant_method": "awq", "bits": 8},
        {"quant_method": "awq", "w_bit": 3},
    ],
)
def test_a_width_vllm_cannot_serve_is_refused(quant: dict[str, object]) -> None:
    """A bits value vLLM's kernels do not take is one error naming quantization_config."""
    with pytest.raises(ModelConfigError, match="quantization_config"):
        parse_model_config({**_LLAMA, "quantization_config": quant}, name="q")


@pytest.mark.parametrize(
    ("extra", "limit"),
    [
        # vLLM 0.32 scales the context by a linear or dynamic factor...
        ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 131072),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 65536),
        # ...not by YaRN's (its max_position_embeddings is the scaled length already), nor llama3's
        (
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                }
            },
            32768,
        ),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 32768),
        # and takes the config's model_max_length as a longer limit (Command-R: 8,192 -> 131,072)
        ({"model_max_length": 131072}, 131072),
        # the smallest of the length fields vLLM reads is the model's length (Qwen: seq_length)
        ({"seq_length": 8192}, 8192),
        ({"n_positions": 2048, "max_seq_len": 4096}, 2048),
        ({"seq_length": 65536}, 32768),
        ({}, 32768),
    ],
)
def test_the_context_limit_is_what_vllm_derives(extra: dict[str, object], limit: int) -> None:
    """As vLLM 0.32's _get_and_verify_max_len: what --max-model-len may be without an override."""
    config = {**_LLAMA, "max_position_embeddings": 32768, **extra}
    assert parse_model_config(config, name="m").context_limit == limit


def test_a_per_layer_intermediate_size_is_read_as_its_mean() -> None:
    """Gemma 3n writes intermediate_size per layer: a list of counts, each checked."""
    arch = parse_model_config({**_LLAMA, "intermediate_size": [8192, 16384]}, name="g")
    assert arch.intermediate_size == 12288
    with pytest.raises(ModelConfigError, match=r"'intermediate_size\[1\]' is 'x'"):
        parse_model_config({**_LLAMA, "intermediate_size": [8192, "x"]}, name="g")


@pytest.mark.parametrize(
    ("extra", "default"),
    [
        # vLLM 0.32 (_get_and_verify_max_len) serves int(derived x factor) when no --max-model-len
        # is given: linear and dynamic factors multiply the 32,768 positions...
        ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 131072),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 65536),
        # ...a per-layer-type rope_parameters too (iter_rope_parameters yields each set)...
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 2.0},
                    "sliding_attention": {"rope_type": "default"},
                }
            },
            65536,
        ),
        # ...YaRN's and llama3's do not (the positions are the scaled length already)...
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 32768),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 32768),
        # ...LongRoPE starts at original_max_position_embeddings (Phi-3)...
        (
            {
                "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]},
                "original_max_position_embeddings": 4096,
            },
            4096,
        ),
        # ...model_max_length replaces the positions (derive_max_model_len_and_key), even where
        # another length field is smaller...
        ({"model_max_length": 131072}, 131072),
        ({"model_max_length": 131072, "seq_length": 8192}, 131072),
        # ...otherwise the smallest length field wins, the rope factor applied to it...
        ({"max_sequence_length": 4096}, 4096),
        ({"seq_len": 16384, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 32768),
        # ...and a null factor counts 1.
        ({"rope_scaling": {"rope_type": "linear", "factor": None}}, 32768),
        ({}, 32768),
    ],
)
def test_the_default_context_is_the_one_vllm_serves(extra: dict[str, object], default: int) -> None:
    """Without --max-model-len vLLM 0.32 serves the scaled length, not max_position_embeddings."""
    config = {**_LLAMA, "max_position_embeddings": 32768, **extra}
    assert parse_model_config(config, name="m").default_max_model_len == default


@pytest.mark.parametrize(
    "key",
    [
        "n_positions",
        "max_seq_len",
        "seq_length",
        "max_target_positions",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    ],
)
def test_a_config_without_max_position_embeddings_has_the_length_vllm_reads(key: str) -> None:
    """vLLM 0.32 reads nine length fields (derive_max_model_len_and_key): any one is the length."""
    config = {k: v for k, v in _LLAMA.items() if k != "max_position_embeddings"} | {key: 6144}
    arch = parse_model_config(config, name="m")
    assert (arch.default_max_model_len, arch.context_limit) == (6144, 6144)
    with pytest.raises(ModelConfigError, match=key):
        parse_model_config({**config, key: "6k"}, name="m")


def test_gemma3_context_is_never_scaled_again() -> None:
    """Gemma 3's 131,072 positions already include its linear factor 8 (vLLM skips gemma3)."""
    arch = load_model_arch(CONFIGS / "gemma-3-12b-it")
    assert arch.default_max_model_len == arch.max_position_embeddings == 131072


@pytest.mark.parametrize("factor", ["4", 0, -2.0, True])
def test_a_rope_factor_that_is_no_factor_is_refused(factor: object) -> None:
    """vLLM multiplies the length by it: a word, 0 or a negative cannot be served."""
    config = {**_LLAMA, "rope_scaling": {"rope_type": "linear", "factor": factor}}
    with pytest.raises(ModelConfigError, match=r"rope_scaling\.factor"):
        parse_model_config(config, name="m")


def _compressed(weights: object) -> dict[str, object]:
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({"num_bits": 4, "type": "int"}, "w4a16"),
        ({"num_bits": 8, "type": "float"}, "fp8"),
        ({"num_bits": 8, "type": "int"}, "w8a8"),
        # compressed-tensors' QuantizationArgs (pydantic) reads "4" as 4 and defaults to 8 bits.
        ({"num_bits": "4", "type": "int"}, "w4a16"),
        ({"type": "float"}, "fp8"),
        # NVFP4 (llm-compressor's scheme): 4-bit floats with an FP8 scale per 16 weights, not
        # w4a16's integers with a 16-bit scale per 128 (which read 8 % fewer weight bytes).
        ({"num_bits": 4, "type": "float", "group_size": 16}, "nvfp4"),
    ],
)
def test_compressed_tensors_width_as_its_quantization_args_read_it(
    weights: dict[str, object], expected: str
) -> None:
    """The first group that quantizes weights gives the format."""
    arch = parse_model_config({**_LLAMA, "quantization_config": _compressed(weights)}, name="q")
    assert arch.quantization == expected


@pytest.mark.parametrize("bits", ["four", 4.5, True, 0, None])
def test_a_malformed_compressed_tensors_width_is_refused_not_read_as_w8a8(bits: object) -> None:
    """QuantizationArgs refuses a word, a fraction or null; true (1) and 0 have no vLLM scheme."""
    config = {**_LLAMA, "quantization_config": _compressed({"num_bits": bits, "type": "int"})}
    with pytest.raises(ModelConfigError, match=r"config_groups\.group_0\.weights\.num_bits"):
        parse_model_config(config, name="q")


def test_layer_types_longer_than_the_layers_are_refused_not_cut() -> None:
    """transformers' validate_layer_type refuses any other length, so vLLM never loads it."""
    config = {**_LLAMA, "layer_types": ["full_attention"] * 33}
    with pytest.raises(ModelConfigError, match="layer_types lists 33 layers but num_hidden_layers"):
        parse_model_config(config, name="m")


@pytest.mark.parametrize("nested", ["llama", ["a"], 3])
def test_a_text_config_that_is_not_an_object_is_refused(nested: object) -> None:
    """Reading the wrapper's own fields instead would size another model."""
    with pytest.raises(ModelConfigError, match=r"field 'text_config' is .*not an object"):
        parse_model_config({**_LLAMA, "text_config": nested}, name="m")


@pytest.mark.parametrize(
    ("extra", "kv_heads"),
    [
        # Falcon-7B: multi_query without the new decoder architecture: one KV head, whatever
        # num_kv_heads says (FalconModelArchConfigConvertor).
        ({"model_type": "falcon", "multi_query": True, "num_kv_heads": 32}, 1),
        # Falcon-40B: the new decoder architecture reads num_kv_heads.
        ({"model_type": "falcon", "new_decoder_architecture": True, "num_kv_heads": 8}, 8),
        # ChatGLM's and Step-3.5's spellings, and the first found wins (get_total_num_kv_heads).
        ({"multi_query_group_num": 2}, 2),
        ({"num_attention_groups": 4}, 4),
        ({"n_head_kv": 2, "num_key_value_heads": 8}, 2),
    ],
)
def test_kv_heads_are_read_under_every_name_vllm_reads(
    extra: dict[str, object], kv_heads: int
) -> None:
    """KV heads under every name vLLM 0.32 reads, the first found first; none means MHA.

    The order: n_head_kv, num_kv_heads, num_key_value_heads, multi_query_group_num,
    num_attention_groups.
    """
    config = {key: value for key, value in _LLAMA.items() if key != "num_key_value_heads"}
    assert parse_model_config({**config, **extra}, name="m").num_kv_heads == kv_heads
