"""Read a Hugging Face ``config.json`` into a :class:`~exporter.sizing.model.ModelArch`.

Sources, in the order tried: a model directory, a ``config.json`` path, or a model id looked up in
the local Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``; ``models--org--name/snapshots/<rev>/config.json``). Nothing is
downloaded. The parsing itself (:func:`parse_model_config`) is pure and also reads the built-in
catalogue entries.

What is normalised: ``head_dim`` when given, else ``hidden_size / num_attention_heads``; the KV
heads under every name vLLM 0.32 reads (``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``,
``multi_query_group_num``, ``num_attention_groups``; Falcon's ``multi_query``), none meaning MHA;
``text_config`` nesting of vision-language models (a non-object one refused); MLA
(``kv_lora_rank``, ``qk_rope_head_dim``); sliding windows from ``layer_types`` (of exactly
``num_hidden_layers`` entries), Gemma 2's alternation, Gemma 3's ``sliding_window_pattern``,
Qwen2's ``use_sliding_window`` and Mistral's all-layer window; Llama 4's chunked local attention;
``quantization_config`` (GPTQ 4/8-bit symmetric only, a malformed compressed-tensors
``num_bits`` refused); ``torch_dtype`` or ``dtype``; the context length vLLM serves by default
and the longest it accepts (rope ``factor``, ``model_max_length``, LongRoPE); the state layers of
hybrid state-space models (Qwen3-Next, Granite-4.0-H, Falcon-H1, Nemotron-H, LFM2, Jamba), other
state-space families being declined with a reason; DeepSeek V3.2's sparse-attention indexer
(``index_topk``, ``index_head_dim``), other sparse-attention variants (DeepSeek V4's
``compress_ratios``, shared indexers) being declined; layers that hold no KV of their own, as
vLLM 0.32 lays them out: Gemma 3n's and Gemma 4's KV-sharing layers (``num_kv_shared_layers``)
and Nemotron-NAS's attention-free blocks (``block_configs``, with per-block
``n_heads_in_group``); Gemma 4's per-layer head shapes (``gemma4``, ``gemma4_text``): each
layer's KV heads and head size from ``per_layer_config``, or as transformers' ``Gemma4TextConfig``
derives them from ``global_head_dim`` (512 when absent) and, with ``attention_k_eq_v``,
``num_global_key_value_heads``, for the model's pages of different sizes
(:attr:`~exporter.sizing.model.ModelArch.layer_shapes`).

Declined, whatever the model_type, so that a new family with the same feature is not sized as
plain GQA: per-layer head shapes outside Gemma 4 (``per_layer_config``, ``global_head_dim``,
``num_global_key_value_heads``, ``*_per_layer`` head counts, MiMo-V2's ``swa_*``, Step-3.5's
``attention_other_setting``, a non-MLA ``v_head_dim`` other than the head size), classes built
on Gemma 4 whose layout was not read (``gemma4_unified``, ``diffusion_gemma``) and Gemma 4 with
``use_bidirectional_attention`` "all", KV sharing outside Gemma 3n and 4, ``block_configs``
outside Nemotron-NAS, cross-layer attention (``use_cla``, ``cla_share_factor``),
encoder-decoder models and ``cross_attention_layers``.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.boundedread import FileReadError, read_bounded
from exporter.errors import ModelConfigError, ModelNotFoundError
from exporter.sizing.model import (
    LayerKind,
    MlaDims,
    ModelArch,
    MoeSpec,
    SparseIndexer,
    StateLayers,
    all_full,
)
from exporter.sizing.modelroot import within
from exporter.sizing.weights import PerLayerInputs

# model_type values of models whose layers keep a fixed recurrent state per sequence.
_STATE_SPACE_TYPES = {
    "jamba",
    "mamba",
    "mamba2",
    "falcon_h1",
    "falcon_mamba",
    "zamba",
    "zamba2",
    "bamba",
    "nemotron_h",
    "granitemoehybrid",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "lfm2",
    "minimax",
    "minimax_text_01",
    "kimi_linear",
    "plamo2",
    "recurrent_gemma",
}
_STATE_LAYER_TYPES = {"linear_attention", "mamba", "mamba2", "conv", "recurrent", "ssm"}
_FULL_LAYER_TYPES = {"full_attention", "attention", "global", "global_attention"}
_SLIDING_LAYER_TYPES = {"sliding_attention", "sliding_window", "local", "local_attention"}
_CHUNKED_LAYER_TYPES = {"chunked_attention"}

_STATE_REASON = (
    "hybrid state-space model ({what}): its Mamba/linear-attention layers keep a fixed state per "
    "sequence in a separate pool that vLLM sizes differently; the token-capacity prediction does "
    "not apply (vLLM's own kv_cache_size_tokens can still be read from /metrics)"
)


#: Largest value a config.json size field may hold: beyond every real dimension (context lengths
#: reach about 10^7) and small enough that the products the sizing forms stay finite floats.
MAX_CONFIG_INT = 2**40
#: Most decoder layers a config may declare: real models have a few hundred at most, and the
#: per-layer lists are built from this number.
MAX_LAYERS = 100_000


class _BadField(ValueError):
    """A config field that holds no usable integer; :func:`parse_model_config` adds the model."""


def _shown(value: object) -> str:
    """A value as a message shows it: short, and never a 5,000-digit number."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _config_int(
    config: Mapping[str, Any],
    key: str,
    *,
    minimum: int = 1,
    maximum: int = MAX_CONFIG_INT,
    label: str | None = None,
) -> int | None:
    """The one reader of integer fields: None when absent or null, else a checked integer.

    Integral floats (``32.0``) count, as some writers emit them; booleans, strings, fractions,
    NaN, infinities and values outside ``minimum..maximum`` are errors, never truncated or
    taken as absent (a bad ``num_key_value_heads`` read as missing would size the model as MHA).
    """
    value = config.get(key)
    if value is None:
        return None
    whole = (
        isinstance(value, int)
        or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    ) and not isinstance(value, bool)
    if not whole or not minimum <= value <= maximum:
        raise _BadField(
            f"field {label or key!r} is {_shown(value)}, not a whole number from {minimum} "
            f"to {maximum:,}; fix it in config.json"
        )
    return int(value)


def _config_factor(
    config: Mapping[str, Any], key: str, *, maximum: float, label: str | None = None
) -> float | None:
    """The one reader of positive real fields (a scaling factor): None when absent or null.

    Booleans, strings, NaN, infinities, 0, negatives and values past ``maximum`` are errors:
    each would size garbage or raise later (``int(nan)``).
    """
    value = config.get(key)
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not 0 < value <= maximum:  # false for NaN too
        raise _BadField(
            f"field {label or key!r} is {_shown(value)}, not a number above 0 and at most "
            f"{maximum:,}; fix it in config.json"
        )
    return float(value)


def _config_bool(config: Mapping[str, Any], key: str, *, default: bool) -> bool:
    """A true/false field: anything else is an error, never a guess.

    ``bool()`` would read the string ``"false"`` as true (and the LM head as tied).
    """
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _BadField(
            f"field {key!r} is {_shown(value)}, not true or false; fix it in config.json"
        )
    return value


def _int(config: Mapping[str, Any], key: str, *, source: str, maximum: int = MAX_CONFIG_INT) -> int:
    """A required positive integer field."""
    value = _config_int(config, key, maximum=maximum)
    if value is None:
        raise ModelConfigError(f"{source}: config.json field {key!r} is missing")
    return value


def _opt_int(config: Mapping[str, Any], key: str, *, minimum: int = 1) -> int | None:
    """An optional integer field; with ``minimum=0`` a 0 means absent (a window of 0: none)."""
    return _config_int(config, key, minimum=minimum) or None


def _layers(config: Mapping[str, Any]) -> int | None:
    return _config_int(config, "num_hidden_layers", maximum=MAX_LAYERS)


#: Where vision-language (and other wrapper) configs nest their decoder's fields.
_NESTED_TEXT_KEYS = ("text_config", "llm_config", "language_config")


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Merge a VLM's ``text_config`` (or ``llm_config``) over the top-level fields.

    A nesting key that holds anything but an object (a string, a list) is an error: transformers
    cannot build the sub-config from it, and reading the wrapper's own fields instead would size
    the wrong model.
    """
    for key in _NESTED_TEXT_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise _BadField(
                f"field {key!r} is {_shown(value)}, not an object of the decoder's fields; "
                "fix it in config.json"
            )
    nested = config.get("text_config") or config.get("llm_config") or config.get("language_config")
    merged = {k: v for k, v in config.items() if k not in {"text_config", "vision_config"}}
    if isinstance(nested, Mapping):
        merged.update(nested)
        # The wrapper's dtype and quantization apply to the whole checkpoint.
        for key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if key in config and key not in nested:
                merged[key] = config[key]
    return merged


def _compressed_tensors_format(quant: Mapping[str, Any]) -> str:
    """The weight format of the first config group that quantizes weights.

    ``num_bits`` is read as compressed-tensors' ``QuantizationArgs`` (a pydantic model) reads it:
    absent means its default, 8; an integral string (``"4"``) counts. Anything else (null, a
    word, a fraction, true, 0) is an error: pydantic refuses it or vLLM finds no scheme for it,
    so the checkpoint cannot be served, and guessing w8a8 would size weights that may be 4-bit.
    """
    groups = quant.get("config_groups")
    for name, group in groups.items() if isinstance(groups, Mapping) else ():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        raw = weights.get("num_bits", 8)
        if isinstance(raw, str) and raw.strip().isdigit():
            raw = int(raw.strip())
        bits = _config_int(
            {"num_bits": raw},
            "num_bits",
            maximum=64,
            label=f"quantization_config.config_groups.{name}.weights.num_bits",
        )
        if bits is None:
            raise _BadField(
                f"field 'quantization_config.config_groups.{name}.weights.num_bits' is null, "
                "not a bit width; fix it in config.json"
            )
        floats = str(weights.get("type", "int")) == "float"
        if bits == 4:
            return "nvfp4" if floats else "w4a16"
        return "fp8" if floats else "w8a8"
    return "w8a8"


def _quantization(config: Mapping[str, Any]) -> str | None:
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method in {"compressed-tensors", "compressed_tensors"}:
        return _compressed_tensors_format(quant)
    if method == "modelopt":
        return "nvfp4" if "FP4" in str(quant.get("quant_algo", "")).upper() else "fp8"
    if method == "bitsandbytes":
        return "int8" if quant.get("load_in_8bit") else "int4"
    if method in {"gptq", "awq"}:
        return _gptq_awq_format(quant, method)
    return method or None


#: GPTQ's weight widths (``quantization_config.bits``) and their weight formats: vLLM 0.32 serves
#: every GPTQ checkpoint through ``AutoGPTQConfig`` (``gptq``, ``gptq_marlin`` and ``auto_gptq``
#: all map to it, vllm/model_executor/layers/quantization/__init__.py), whose ``TYPE_MAP`` holds
#: only ``(4, sym)`` and ``(8, sym)``; any other width or an asymmetric one raises "Unsupported
#: quantization config" (auto_gptq.py, ``AutoGPTQConfig.__init__``).
_GPTQ_BITS = {4: "gptq", 8: "gptq_8bit"}


def _gptq_awq_format(quant: Mapping[str, Any], method: str) -> str:
    """GPTQ's format by its ``bits``; AWQ's, whose vLLM kernels take 4-bit weights only."""
    key = "w_bit" if method == "awq" and "bits" not in quant else "bits"
    bits = _config_int(quant, key, maximum=64, label=f"quantization_config.{key}")
    if method == "gptq" and quant.get("sym") is False:
        raise _BadField(
            "quantization_config.sym is false: vLLM 0.32's GPTQ kernels take symmetric 4- and "
            "8-bit weights only, so this checkpoint cannot be served"
        )
    if bits is None:
        return method
    known = (4,) if method == "awq" else tuple(_GPTQ_BITS)
    if bits not in known:
        raise _BadField(
            f"quantization_config.{key} is {bits}: vLLM's {method.upper()} kernels take "
            f"{' and '.join(map(str, known))}-bit weights, so this checkpoint cannot be served"
        )
    return _GPTQ_BITS[bits] if method == "gptq" else method


def _listed_kinds(layer_types: list[Any], num_layers: int, *, source: str) -> list[LayerKind]:
    if len(layer_types) != num_layers:
        # transformers refuses this config (PreTrainedConfig.validate_layer_type), so vLLM,
        # which loads it through transformers, never serves it: neither end is cut off.
        raise ModelConfigError(
            f"{source}: layer_types lists {len(layer_types)} layers but num_hidden_layers is "
            f"{num_layers}; transformers refuses such a config: fix it in config.json"
        )
    kinds: list[LayerKind] = []
    for entry in layer_types:
        name = str(entry)
        if name in _SLIDING_LAYER_TYPES:
            kinds.append("sliding")
        elif name in _CHUNKED_LAYER_TYPES:
            kinds.append("chunked")
        elif name in _FULL_LAYER_TYPES:
            kinds.append("full")
        else:
            raise ModelConfigError(
                f"{source}: unknown layer type {name!r} in layer_types; known: "
                "full_attention, sliding_attention, chunked_attention"
            )
    return kinds


def _patterned_kinds(config: Mapping[str, Any], num_layers: int) -> list[LayerKind]:
    """Per-layer kinds of models that describe their pattern instead of listing it."""
    model_type = str(config.get("model_type", ""))
    window = _opt_int(config, "sliding_window", minimum=0)
    if model_type == "gemma2" and window:
        # Gemma 2 alternates, starting with a sliding-window layer.
        return ["sliding" if i % 2 == 0 else "full" for i in range(num_layers)]
    if model_type in {"gemma3", "gemma3_text", "cohere2"} and window:
        pattern = _opt_int(config, "sliding_window_pattern") or _opt_int(
            config, "_sliding_window_pattern"
        )
        pattern = pattern or (6 if model_type.startswith("gemma3") else 4)
        return ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers)]
    if model_type in {"llama4", "llama4_text"} and _opt_int(
        config, "attention_chunk_size", minimum=0
    ):
        no_rope = config.get("no_rope_layers")
        if isinstance(no_rope, list) and len(no_rope) >= num_layers:
            # 1 = this layer uses RoPE = chunked local attention; 0 = global NoPE layer.
            return ["chunked" if no_rope[i] else "full" for i in range(num_layers)]
        interval = _opt_int(config, "no_rope_layer_interval") or 4
        return ["full" if (i + 1) % interval == 0 else "chunked" for i in range(num_layers)]
    if window and config.get("use_sliding_window", True) is not False:
        # Mistral v0.1 style: every layer windowed. Qwen2 windows only the layers from
        # max_window_layers on (and only when use_sliding_window is true).
        first = _config_int(config, "max_window_layers", minimum=0, maximum=MAX_LAYERS)
        start = first if first is not None and "use_sliding_window" in config else 0
        return ["sliding" if i >= start else "full" for i in range(num_layers)]
    return ["full"] * num_layers


def _gemma4_kinds(num_layers: int) -> list[LayerKind]:
    """Gemma4TextConfig.__post_init__'s layer_types when absent: 5 sliding layers to 1 full."""
    return ["full" if (i + 1) % _GEMMA4_PATTERN == 0 else "sliding" for i in range(num_layers)]


def _layer_kinds(
    config: Mapping[str, Any], num_layers: int, *, source: str
) -> tuple[tuple[LayerKind, ...], int | None, int | None]:
    """Per-layer attention kinds (empty when all full), the sliding window and the chunk size."""
    layer_types = config.get("layer_types")
    model_type = str(config.get("model_type", ""))
    if isinstance(layer_types, list) and layer_types:
        kinds = _listed_kinds(layer_types, num_layers, source=source)
    elif model_type in _GEMMA4_SIZED:
        kinds = _gemma4_kinds(num_layers)
    else:
        kinds = _patterned_kinds(config, num_layers)
    if model_type in _GEMMA4_SIZED and kinds:
        # Gemma4TextConfig.__post_init__ forces the last layer to full attention.
        kinds[-1] = "full"
    window = _opt_int(config, "sliding_window", minimum=0) if "sliding" in kinds else None
    if window is None and "sliding" in kinds and model_type in _GEMMA4_SIZED:
        window = None if "sliding_window" in config else _GEMMA4_WINDOW
    chunk = _opt_int(config, "attention_chunk_size", minimum=0) if "chunked" in kinds else None
    if all(kind == "full" for kind in kinds):
        return (), None, None
    if "sliding" in kinds and window is None:
        raise ModelConfigError(f"{source}: sliding-window layers but no sliding_window size")
    return tuple(kinds), window, chunk


# --- hybrid state-space / linear-attention models -------------------------------------------
#
# The families sized the way vLLM 0.32 sizes them (exporter/sizing/model.py, "hybrid state
# layers"): model_type -> the state layers' kind. Each reader below mirrors the model's
# get_mamba_state_shape_from_config in vllm/model_executor/models/<model>.py.
_HYBRID_TYPES = {"qwen3_next", "granitemoehybrid", "falcon_h1", "nemotron_h", "lfm2", "jamba"}
_MAMBA_NAMES = {"mamba", "mamba2", "linear_attention", "m"}
_ATTENTION_NAMES = {"attention", "full_attention", "*"}
#: Nemotron-H layers without any cache: MLP ("-") and MoE ("E") blocks.
_NO_CACHE_NAMES = {"mlp", "moe", "-", "e"}
_WHY_NOT = {
    "bamba": "vLLM 0.32 has no Bamba model class",
    "mamba": "an attention-free Mamba1 model",
    "falcon_mamba": "an attention-free Mamba1 model",
    "mamba2": "an attention-free Mamba2 model",
    "zamba": "its shared-attention Mamba1 layers",
    "zamba2": "its shared-attention blocks",
    "minimax": "its lightning-attention layers",
    "minimax_text_01": "its lightning-attention layers",
    "kimi_linear": "its KDA linear-attention layers with MLA",
    "plamo2": "its Mamba layers",
    "recurrent_gemma": "its recurrent layers",
    "qwen3_5": "its mixed linear-attention layouts",
    "qwen3_5_moe": "its mixed linear-attention layouts",
}


def _nemotron_pattern(config: Mapping[str, Any]) -> list[str] | None:
    pattern = config.get("hybrid_override_pattern") or config.get("layers_block_type")
    if isinstance(pattern, str):
        return list(pattern)
    return [str(t) for t in pattern] if isinstance(pattern, list) else None


def _jamba_pattern(config: Mapping[str, Any]) -> list[str] | None:
    listed = config.get("layers_block_type")
    if isinstance(listed, list):
        return [str(t) for t in listed]
    # transformers' JambaConfig.layers_block_type: attention where i % period == offset.
    layers = _layers(config) or 0
    period = _opt_int(config, "attn_layer_period") or 8
    offset = config.get("attn_layer_offset", 4)
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ModelConfigError("jamba: config.json field 'attn_layer_offset' is not a number")
    return ["attention" if i % period == offset else "mamba" for i in range(layers)]


def _lfm2_pattern(config: Mapping[str, Any]) -> list[str]:
    layers = _layers(config) or 0
    attn = config.get("full_attn_idxs") or []
    return ["full_attention" if i in attn else "conv" for i in range(layers)]


def _qwen3_next_pattern(config: Mapping[str, Any]) -> list[str]:
    layers = _layers(config) or 0
    interval = _opt_int(config, "full_attention_interval") or 4
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
    ]


def _layer_pattern(config: Mapping[str, Any], model_type: str) -> list[str] | None:
    """Per-layer names (mamba / attention / none) of a hybrid, from whichever field it uses.

    None for Falcon-H1, whose every layer has attention and Mamba2 side by side.
    """
    if model_type == "nemotron_h":
        return _nemotron_pattern(config)
    if model_type == "jamba":
        return _jamba_pattern(config)
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and model_type != "falcon_h1":
        return [str(t) for t in layer_types]
    fallback = {"lfm2": _lfm2_pattern, "qwen3_next": _qwen3_next_pattern}.get(model_type)
    return fallback(config) if fallback is not None else None


def _state_layers(
    config: Mapping[str, Any], model_type: str, layers: int, *, source: str
) -> StateLayers:
    """One state layer's shape as vLLM's model class computes it, and how many there are."""
    hidden = _int(config, "hidden_size", source=source)

    def need(key: str) -> int:
        return _int(config, key, source=source)

    if model_type == "qwen3_next":
        return StateLayers(
            kind="gated_delta_net",
            num_layers=layers,
            conv_kernel=need("linear_conv_kernel_dim"),
            num_heads=need("linear_num_value_heads"),
            head_dim=need("linear_value_head_dim"),
            num_k_heads=need("linear_num_key_heads"),
            head_k_dim=need("linear_key_head_dim"),
            lists_linear_attention=True,
        )
    if model_type == "lfm2":
        return StateLayers(
            kind="short_conv",
            num_layers=layers,
            conv_kernel=need("conv_L_cache"),
            intermediate_size=_opt_int(config, "conv_dim") or hidden,
        )
    if model_type == "nemotron_h":
        ssm = config.get("mamba_ssm_cache_dtype")
        return StateLayers(
            kind="mamba2",
            num_layers=layers,
            conv_kernel=need("conv_kernel"),
            intermediate_size=need("mamba_num_heads") * need("mamba_head_dim"),
            n_groups=need("n_groups"),
            num_heads=need("mamba_num_heads"),
            head_dim=need("mamba_head_dim"),
            state_size=need("ssm_state_size"),
            ssm_dtype_default=str(ssm) if isinstance(ssm, str) and ssm != "auto" else "float32",
        )
    expand = config.get("mamba_expand", 2)
    if (
        not isinstance(expand, int | float)
        or isinstance(expand, bool)
        or not 0 < expand <= MAX_LAYERS
    ):
        raise ModelConfigError(f"{source}: config.json field 'mamba_expand' is not a number")
    intermediate = int(expand * hidden)
    if model_type == "jamba":
        return StateLayers(
            kind="mamba1",
            num_layers=layers,
            conv_kernel=need("mamba_d_conv"),
            intermediate_size=intermediate,
            state_size=need("mamba_d_state"),
        )
    if model_type == "falcon_h1":
        intermediate = _opt_int(config, "mamba_d_ssm") or intermediate
    return StateLayers(
        kind="mamba2",
        num_layers=layers,
        conv_kernel=need("mamba_d_conv"),
        intermediate_size=intermediate,
        n_groups=need("mamba_n_groups"),
        num_heads=need("mamba_n_heads"),
        head_dim=need("mamba_d_head"),
        state_size=need("mamba_d_state"),
        # transformers 5 names Granite-4.0-H's mamba layers linear_attention (CPU GDN path).
        lists_linear_attention=model_type == "granitemoehybrid",
    )


def _hybrid(config: Mapping[str, Any], *, source: str) -> tuple[int, int, StateLayers] | None:
    """(decoder layers, attention layers, state layers) of a modelled hybrid, else None."""
    model_type = str(config.get("model_type", ""))
    if model_type not in _HYBRID_TYPES:
        return None
    pattern = _layer_pattern(config, model_type)
    if pattern is None:  # Falcon-H1: attention and Mamba2 side by side in every layer
        layers = _int(config, "num_hidden_layers", source=source, maximum=MAX_LAYERS)
        return layers, layers, _state_layers(config, model_type, layers, source=source)
    names = [name.lower() for name in pattern]
    unknown = sorted(
        {n for n in names if n not in _MAMBA_NAMES | _ATTENTION_NAMES | _NO_CACHE_NAMES | {"conv"}}
    )
    if unknown or not names:
        raise ModelConfigError(
            f"{source}: {model_type} layer pattern has unknown layer types {unknown}; known: "
            "mamba/linear_attention/conv, attention/full_attention, mlp, moe"
        )
    attention = sum(name in _ATTENTION_NAMES for name in names)
    state = sum(name in _MAMBA_NAMES or name == "conv" for name in names)
    if attention == 0 or state == 0:
        raise ModelConfigError(
            f"{source}: {model_type} with {attention} attention and {state} state layers is not "
            "a hybrid vLLM's hybrid allocator serves"
        )
    return len(names), attention, _state_layers(config, model_type, state, source=source)


# --- per-layer KV features ---------------------------------------------------------------------
#
# Fields that change which layers hold KV, or how much one layer's token takes. The families whose
# layout vLLM 0.32's source was read for are read below (Gemma 3n's and Gemma 4's KV sharing,
# Gemma 4's per-layer head shapes, Nemotron-NAS's block_configs); any other config that carries
# one of these fields is declined, whatever its model_type, so a new family with the same feature
# is not sized as plain GQA.

#: Gemma 4's decoders (vllm/model_executor/models/gemma4.py, Gemma4ForCausalLM and the multimodal
#: Gemma4ForConditionalGeneration): per-layer head shapes (``per_layer_config``, or
#: ``global_head_dim`` / ``num_global_key_value_heads``) and KV sharing, sized.
_GEMMA4_SIZED = {"gemma4", "gemma4_text"}
#: Gemma 3n and Gemma 4: their last ``num_kv_shared_layers`` layers read earlier layers' KV and
#: hold none (gemma3n.py, gemma4.py: ``kv_sharing_target_layer_name``).
_KV_SHARING_TYPES = {"gemma3n", "gemma3n_text", *_GEMMA4_SIZED}
#: Nemotron-NAS / DeciLM: per-layer ``block_configs`` (vllm/model_executor/models/nemotron_nas.py).
_BLOCK_CONFIG_TYPES = {"nemotron-nas", "deci"}
#: Classes built on Gemma 4 whose own layouts were not read: declined.
_GEMMA4_TYPES = {
    "gemma4_unified_text",
    "diffusion_gemma",
    "diffusion_gemma_text",
}
_PAGE_SIZES_REASON = (
    "{what}: layers whose KV pages differ in size; vLLM 0.32 unifies them by raising block "
    "sizes or padding pages (v1/core/kv_cache_utils.py), which plan models only for Gemma 4 "
    "(gemma4, gemma4_text), whose per-layer shapes it reads"
)
#: Per-layer head counts or sizes (key -> what it is), each declined in one line.
_PER_LAYER_SHAPE_KEYS = {
    "per_layer_config": "per_layer_config (per-layer head_dim / KV heads)",
    "global_head_dim": "global_head_dim (full-attention layers' own head size)",
    "num_global_key_value_heads": "num_global_key_value_heads (full-attention layers' KV heads)",
    "num_key_value_heads_per_layer": "num_key_value_heads_per_layer (per-layer KV heads)",
    "num_attention_heads_per_layer": "num_attention_heads_per_layer (per-layer heads)",
    "swa_num_key_value_heads": "swa_num_key_value_heads (sliding layers' own KV heads)",
    "swa_head_dim": "swa_head_dim (sliding layers' own head size)",
    "swa_v_head_dim": "swa_v_head_dim (sliding layers' own value head size)",
    "attention_other_setting": "attention_other_setting (Step-3.5's per-layer-type heads)",
}


#: The per-layer shape fields Gemma 4 is read with (:func:`_gemma4_layer_shapes`).
_GEMMA4_SHAPE_KEYS = {"per_layer_config", "global_head_dim", "num_global_key_value_heads"}
#: transformers' ``Gemma4TextConfig`` defaults: full-attention head size without
#: ``global_head_dim``, sliding window, and one full layer in this many without ``layer_types``.
_GEMMA4_GLOBAL_HEAD_DIM = 512
_GEMMA4_WINDOW = 512
_GEMMA4_PATTERN = 6


def _layer_index(key: object, num_layers: int) -> int:
    """A ``per_layer_config`` key as transformers reads it (``int(key)``), checked."""
    text = key.strip() if isinstance(key, str) else None
    if text is None or not text.isdigit() or int(text) >= num_layers:
        raise _BadField(
            f"per_layer_config key {_shown(key)} is not a layer index from 0 to "
            f"{num_layers - 1}; transformers refuses it: fix it in config.json"
        )
    return int(text)


def _gemma4_layer_shapes(
    config: Mapping[str, Any],
    kinds: Sequence[LayerKind],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    source: str,
) -> list[tuple[int, int]]:
    """(KV heads, head_dim) of every Gemma 4 decoder layer, as vLLM 0.32 builds them.

    gemma4.py reads ``config.per_layer_config[i].head_dim`` and ``.num_key_value_heads``
    (Gemma4DecoderLayer), transformers' per-layer overrides over the global fields. A config
    without ``per_layer_config`` gets one from ``Gemma4TextConfig.__post_init__``: every full-
    attention layer takes ``global_head_dim`` (512 when absent) and, only when
    ``attention_k_eq_v`` is true, ``num_global_key_value_heads`` KV heads.
    """
    overrides: dict[int, tuple[int | None, int | None]] = {}
    if "per_layer_config" in config:
        listed = config.get("per_layer_config") or {}
        if not isinstance(listed, Mapping):
            raise _BadField(
                f"field 'per_layer_config' is {_shown(listed)}, not an object of layer "
                "overrides; fix it in config.json"
            )
        for key, layer in listed.items():
            index = _layer_index(key, len(kinds))
            if not isinstance(layer, Mapping):
                raise _BadField(
                    f"per_layer_config[{key!r}] is {_shown(layer)}, not an object of overrides; "
                    "fix it in config.json"
                )
            overrides[index] = (
                _config_int(layer, "head_dim", label=f"per_layer_config.{key}.head_dim"),
                _config_int(
                    layer,
                    "num_key_value_heads",
                    label=f"per_layer_config.{key}.num_key_value_heads",
                ),
            )
    else:
        if "global_head_dim" in config and config["global_head_dim"] is None:
            raise _BadField(
                "field 'global_head_dim' is null: transformers gives the full-attention layers "
                "no head size and vLLM cannot build them; fix it in config.json"
            )
        global_dim = _config_int(config, "global_head_dim") or _GEMMA4_GLOBAL_HEAD_DIM
        k_eq_v = _config_bool(config, "attention_k_eq_v", default=False)
        global_kv = _config_int(config, "num_global_key_value_heads") if k_eq_v else None
        overrides = {i: (global_dim, global_kv) for i, kind in enumerate(kinds) if kind == "full"}
    shapes = []
    for index in range(len(kinds)):
        dim, kv = overrides.get(index, (None, None))
        kv, dim = kv or kv_heads, dim or head_dim
        if kv > heads or heads % kv:
            raise ModelConfigError(
                f"{source}: layer {index}'s {kv} KV heads do not divide num_attention_heads "
                f"{heads}; fix it in config.json"
            )
        shapes.append((kv, dim))
    return shapes


def _kv_feature_declined(config: Mapping[str, Any]) -> str | None:
    """Why a config with a KV-changing field the reader does not model is declined, or None."""
    return _layer_shape_declined(config) or _attention_declined(config)


def _layer_shape_declined(config: Mapping[str, Any]) -> str | None:
    """Per-layer head shapes, KV sharing or block_configs this reader does not model."""
    model_type = str(config.get("model_type", ""))
    if model_type in _GEMMA4_TYPES:
        return _PAGE_SIZES_REASON.format(
            what=f"{model_type} (a class built on Gemma 4): its full-attention layers have their "
            "own head_dim and KV heads, and this class's layout was not read from vLLM's source"
        )
    gemma4 = model_type in _GEMMA4_SIZED
    if gemma4 and config.get("use_bidirectional_attention") == "all":
        return (
            "Gemma 4 with use_bidirectional_attention 'all' (non-causal attention, a halved "
            "sliding window): how vLLM caches it is not modelled"
        )
    for key, what in _PER_LAYER_SHAPE_KEYS.items():
        if gemma4 and key in _GEMMA4_SHAPE_KEYS:
            continue
        if config.get(key) not in (None, {}, []):
            return _PAGE_SIZES_REASON.format(what=what)
    shared = _count(config, "num_kv_shared_layers")
    if shared and model_type not in _KV_SHARING_TYPES:
        return (
            f"num_kv_shared_layers {shared} (KV sharing) in a {model_type or 'model'} config: "
            "which layers hold KV in this family is not modelled (only Gemma 3n's and 4's are)"
        )
    if config.get("block_configs") is not None and model_type not in _BLOCK_CONFIG_TYPES:
        return (
            f"block_configs (per-layer attention and MLP shapes) in a {model_type or 'model'} "
            "config: only Nemotron-NAS's are read"
        )
    return None


def _attention_declined(config: Mapping[str, Any]) -> str | None:
    """Cross-layer, cross- or encoder-decoder attention, or values of another head size."""
    # vLLM 0.32 shares KV across layers only with use_cla true (hy_v3_mtp.py _get_cla_factor:
    # the factor is 1 otherwise); Hunyuan dense configs ship use_cla false, cla_share_factor 2.
    cla = _count(config, "cla_share_factor") or 1
    if _config_bool(config, "use_cla", default=False) and cla > 1:
        return (
            f"cross-layer attention (use_cla, cla_share_factor {cla}): layers that reuse another "
            "layer's KV are not modelled"
        )
    if _config_bool(config, "is_encoder_decoder", default=False):
        return (
            "encoder-decoder model: its decoder's cross-attention KV (sized by the encoder's "
            "input) is not modelled"
        )
    if config.get("sparse_attention_config") not in (None, {}):
        return (
            "sparse_attention_config (MiniMax-M3 style sparse attention): its caches are not "
            "modelled"
        )
    if config.get("cross_attention_layers") not in (None, []):
        return (
            "cross_attention_layers (cross-attention to image features): their KV is not modelled"
        )
    v_head = _opt_int(config, "v_head_dim")
    if v_head is not None and "kv_lora_rank" not in config:
        head = _opt_int(config, "head_dim")
        if head is None or v_head != head:
            return (
                f"v_head_dim {v_head} next to head_dim {head}: attention whose values are not "
                "the keys' size is not modelled"
            )
    return None


#: The widest MLP a Nemotron-NAS block is believed at, as a multiple of the hidden size (the
#: published ones are 1 to 5.25): past it the parameter count is no model's.
MAX_FFN_MULT = 64.0


@dataclass(frozen=True, slots=True)
class _NasBlocks:
    """What Nemotron-NAS's ``block_configs`` say: the layers with attention, and their shape."""

    attention_layers: int
    kv_heads: int
    #: The parameters vLLM builds from the blocks (None when a block's MLP size is not given).
    params: int | None
    #: The MLP layers' mean intermediate size (no-op MLPs count 0), if every size is known.
    intermediate_size: int | None


def _find_multiple(value: int, step: int) -> int:
    """nemotron_nas.py's ``_find_multiple``: ``value`` rounded up to a multiple of ``step``."""
    return value if value % step == 0 else value + step - value % step


def _nas_blocks(config: Mapping[str, Any], *, source: str) -> _NasBlocks | str:
    """Nemotron-NAS's per-layer blocks as vLLM 0.32 builds them, or why they are declined.

    ``DeciLMDecoderLayer`` (vllm/model_executor/models/nemotron_nas.py) reads
    ``block_configs[layer_idx]`` for every layer: an attention block that is ``no_op`` builds no
    attention (no KV); any other builds ``num_attention_heads // n_heads_in_group`` KV heads of
    the model's head size, ``replace_with_linear`` not being looked at. The MLP is
    ``find_multiple(int(2 x ffn_mult x hidden / 3), 256)`` wide (or ``ffn.intermediate_size``),
    or absent when ``no_op``.
    """
    blocks = config.get("block_configs")
    layers = _int(config, "num_hidden_layers", source=source, maximum=MAX_LAYERS)
    if not isinstance(blocks, list) or len(blocks) != layers:
        count = len(blocks) if isinstance(blocks, list) else 0
        raise ModelConfigError(
            f"{source}: block_configs must list one block per layer ({layers}), found {count}; "
            "fix it in config.json"
        )
    heads = _int(config, "num_attention_heads", source=source)
    hidden = _int(config, "hidden_size", source=source)
    head_dim = _opt_int(config, "head_dim") or hidden // heads
    kv_counts: list[int] = []
    mlp_sizes: list[int | None] = []
    for index, block in enumerate(blocks):
        attention = block.get("attention") if isinstance(block, Mapping) else None
        ffn = block.get("ffn") if isinstance(block, Mapping) else None
        if not isinstance(attention, Mapping) or not isinstance(ffn, Mapping):
            raise ModelConfigError(
                f"{source}: block_configs[{index}] needs an 'attention' and an 'ffn' object; "
                "fix it in config.json"
            )
        if not _config_bool(attention, "no_op", default=False):
            if _config_bool(attention, "replace_with_linear", default=False):
                return (
                    f"block_configs[{index}] replaces attention with a linear layer, which "
                    "vLLM 0.32's Nemotron-NAS layer does not build; its KV is not modelled"
                )
            group = _config_int(
                attention,
                "n_heads_in_group",
                maximum=heads,
                label=f"block_configs[{index}].attention.n_heads_in_group",
            )
            if group is None or heads % group:
                raise ModelConfigError(
                    f"{source}: block_configs[{index}].attention.n_heads_in_group "
                    f"{_shown(group)} does not divide num_attention_heads {heads}; fix it in "
                    "config.json"
                )
            kv_counts.append(heads // group)
        if _config_bool(ffn, "no_op", default=False):
            mlp_sizes.append(0)
        elif (
            mult := _config_factor(
                ffn, "ffn_mult", maximum=MAX_FFN_MULT, label=f"block_configs[{index}].ffn.ffn_mult"
            )
        ) is not None:
            mlp_sizes.append(_find_multiple(int(2 * mult * hidden / 3), 256))
        else:
            mlp_sizes.append(_opt_int(ffn, "intermediate_size"))
    if not kv_counts:
        return "block_configs without any attention layer: an attention-free model"
    if len(set(kv_counts)) > 1:
        return _PAGE_SIZES_REASON.format(
            what=f"block_configs with KV heads {sorted(set(kv_counts))} on different layers"
        )
    kv_heads = kv_counts[0]
    params: int | None = None
    intermediate: int | None = None
    if all(size is not None for size in mlp_sizes):
        known = [size or 0 for size in mlp_sizes]
        vocab = _opt_int(config, "vocab_size") or 0
        tied = _config_bool(config, "tie_word_embeddings", default=False)
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        params = (
            vocab * hidden * (1 if tied else 2)
            + len(kv_counts) * attention
            + sum(3 * hidden * size for size in known)
        )
        intermediate = round(sum(known) / len(known)) or None
    return _NasBlocks(len(kv_counts), kv_heads, params, intermediate)


#: transformers' ``Gemma3nTextConfig`` and ``Gemma4TextConfig`` defaults for
#: ``vocab_size_per_layer_input`` and ``hidden_size_per_layer_input`` (transformers 5.19).
_PER_LAYER_INPUT_DEFAULTS = (262_144, 256)


def _per_layer_inputs(config: Mapping[str, Any]) -> PerLayerInputs | None:
    """Gemma 3n's and 4's per-layer embedding table, for the parameter count (None: none).

    vLLM's ``hf_config`` is transformers' config class, so a field config.json leaves out takes
    the class default. Gemma 4 builds the table only for a width above 0 and falls back to
    ``vocab_size`` for a null vocabulary (gemma4.py).
    """
    vocab_default, width_default = _PER_LAYER_INPUT_DEFAULTS
    width = (
        _config_int(config, "hidden_size_per_layer_input", minimum=0)
        if "hidden_size_per_layer_input" in config
        else width_default
    )
    vocab = (
        _config_int(config, "vocab_size_per_layer_input")
        if "vocab_size_per_layer_input" in config
        else vocab_default
    )
    if not width:
        return None
    return PerLayerInputs(vocab or _opt_int(config, "vocab_size") or 0, width)


def _kv_shared_layers(config: Mapping[str, Any], num_layers: int, *, source: str) -> int:
    """Gemma 3n's and 4's KV-sharing layers: the last ``num_kv_shared_layers``, holding no KV.

    vLLM 0.32 gives such a layer a ``kv_sharing_target_layer_name`` (gemma3n.py, gemma4.py), and
    ``GPUModelRunner.get_kv_cache_spec`` skips it: no cache spec, no pages, no group.
    """
    shared = _count(config, "num_kv_shared_layers") or 0
    if shared and num_layers - shared < 2:
        # gemma3n.py then finds no target for some sharing layers (index < 0).
        raise ModelConfigError(
            f"{source}: num_kv_shared_layers {shared} leaves fewer than 2 of "
            f"{num_layers} layers holding KV; fix it in config.json"
        )
    return shared


def _kv_sharing_targets_exist(
    kinds: Sequence[LayerKind], kept: int, *, shared: int, source: str
) -> None:
    """Gemma 4: a sharing layer reads the last KV-holding layer of its own type; there must be one.

    gemma4.py looks it up with ``list.index``, which raises (vLLM fails to build the model) when
    no KV-holding layer has that type.
    """
    missing = sorted(set(kinds[kept:]) - set(kinds[:kept]))
    if missing:
        raise ModelConfigError(
            f"{source}: num_kv_shared_layers {shared} leaves no KV-holding {missing[0]} layer "
            "for the sharing layers of that type to read; fix it in config.json"
        )


def _kv_sharing(
    config: Mapping[str, Any],
    model_type: str,
    kinds: Sequence[LayerKind],
    shape: tuple[int, int, int],
    source: str,
) -> tuple[int, tuple[tuple[int, int], ...], tuple[int, int]]:
    """Gemma 3n / 4: the KV-sharing layers, the KV layers' shapes where they differ, the shape.

    ``shape`` is (heads, KV heads, head_dim) from the global fields; what comes back is the
    number of sharing layers, (KV heads, head_dim) of every KV-holding layer when they differ
    (else empty), and the (KV heads, head_dim) of the layers when they are all one.
    """
    heads, kv_heads, head_dim = shape
    shared = _kv_shared_layers(config, len(kinds), source=source)
    kept = len(kinds) - shared
    if model_type not in _GEMMA4_SIZED:
        return shared, (), (kv_heads, head_dim)
    if shared:
        _kv_sharing_targets_exist(kinds, kept, shared=shared, source=source)
    shapes = _gemma4_layer_shapes(
        config, kinds, heads=heads, kv_heads=kv_heads, head_dim=head_dim, source=source
    )[:kept]
    if len(set(shapes)) == 1:
        # Every KV-holding layer has one shape: plain GQA of that shape.
        return shared, (), shapes[0]
    return shared, tuple(shapes), (kv_heads, head_dim)


def _declined(config: Mapping[str, Any]) -> str | None:
    feature = _kv_feature_declined(config)
    if feature is not None or str(config.get("model_type", "")) in _HYBRID_TYPES:
        return feature
    return _family_declined(config)


def _family_declined(config: Mapping[str, Any]) -> str | None:
    """State-space and sparse-attention families that are not modelled."""
    model_type = str(config.get("model_type", ""))
    if model_type in _STATE_SPACE_TYPES:
        what = _WHY_NOT.get(model_type, "its state layers")
        return _STATE_REASON.format(what=f"{model_type}: {what}")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and any(str(t) in _STATE_LAYER_TYPES for t in layer_types):
        return _STATE_REASON.format(what="layer_types with linear/Mamba layers")
    for key in (
        "layers_block_type",
        "hybrid_override_pattern",
        "attn_layer_period",
        "linear_layer_ids",
        "linear_attn_config",
    ):
        if key in config:
            return _STATE_REASON.format(what=key)
    if "index_topk" in config or "compress_ratios" in config:
        return _sparse_declined(config)
    return None


#: Sparse-attention (DSA) model classes whose cache layout is modelled: DeepSeek V3.2's.
_SPARSE_ARCHITECTURES = {"DeepseekV32ForCausalLM"}
#: Fields of other DSA variants (GLM-5 Next's key pool, HY v4's shared indexers, linear layers).
_SPARSE_VARIANT_FIELDS = ("index_kpool", "indexer_types", "linear_attn_config", "mla_use_nope")


def _sparse_declined(config: Mapping[str, Any]) -> str | None:
    """Why a sparse-attention MLA config is not sized, or None for DeepSeek V3.2's layout."""
    if "compress_ratios" in config:
        return (
            "sparse-attention MLA model with compressed layers (DeepSeek V4 style "
            "compress_ratios): its compressed, sliding-window and indexer caches are not modelled"
        )
    what = "sparse-attention MLA model (DeepSeek V3.2 style indexer)"
    architecture = _architecture(config)
    model_type = str(config.get("model_type", ""))
    if architecture not in _SPARSE_ARCHITECTURES and (
        architecture is not None or model_type != "deepseek_v32"
    ):
        return (
            f"{what} of class {architecture or model_type or 'unknown'}: only "
            "DeepseekV32ForCausalLM's indexer cache is modelled"
        )
    freq = config.get("index_topk_freq", 1)
    if freq != 1 or config.get("index_topk_pattern") is not None:
        return (
            f"{what} whose layers share indexers (index_topk_freq / index_topk_pattern): "
            "layers without an indexer cache are not modelled"
        )
    extra = [key for key in _SPARSE_VARIANT_FIELDS if key in config]
    if extra:
        return f"{what} with {', '.join(extra)}: that variant's caches are not modelled"
    if _opt_int(config, "kv_lora_rank") is None or _opt_int(config, "index_head_dim") is None:
        return f"{what} without kv_lora_rank or index_head_dim: its caches cannot be sized"
    return None


def parse_model_config(
    config: Mapping[str, Any], *, name: str, params: int | None = None
) -> ModelArch:
    """Normalise one parsed ``config.json`` mapping into a :class:`ModelArch`."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{name}: config.json must hold a JSON object")
    try:
        return _parse(config, name=name, params=params)
    except (_BadField, ModelConfigError) as bad:
        declined = _declined_anyway(config)
        if declined is None:
            if isinstance(bad, ModelConfigError):
                raise
            raise ModelConfigError(f"{name}: config.json {bad}") from None
    # A declined family need not have the fields a sized one needs (Whisper's decoder has
    # decoder_layers, not num_hidden_layers): its reason is what the reader reports.
    return ModelArch(
        name=name,
        num_layers=0,
        num_attention_heads=1,
        num_kv_heads=1,
        head_dim=1,
        hidden_size=1,
        declined=declined,
    )


def _declined_anyway(config: Mapping[str, Any]) -> str | None:
    """The decline reason of a config whose other fields cannot be read, if it has one."""
    try:
        return _declined(_text_config(config)) or _declined(config)
    except (_BadField, ModelConfigError):
        return None


def _parse(config: Mapping[str, Any], *, name: str, params: int | None) -> ModelArch:
    text = _text_config(config)
    declined = _declined(text) or _declined(config)
    model_type = str(text.get("model_type", ""))
    nas: _NasBlocks | None = None
    if declined is None and model_type in _BLOCK_CONFIG_TYPES and "block_configs" in text:
        found = _nas_blocks(text, source=name)
        if isinstance(found, str):
            declined = found
        else:
            nas = found
    num_layers = _layers(text) or 0
    if not num_layers and _hybrid(text, source=name) is None:
        num_layers = _int(text, "num_hidden_layers", source=name, maximum=MAX_LAYERS)
    heads, hidden, kv_heads, head_dim = _attention_shape(text, name=name)
    if nas is not None:
        kv_heads = nas.kv_heads
    mla = None
    rank = _opt_int(text, "kv_lora_rank")
    if rank is not None:
        rope = _opt_int(text, "qk_rope_head_dim")
        if rope is None:
            raise ModelConfigError(f"{name}: MLA model (kv_lora_rank) without qk_rope_head_dim")
        mla = MlaDims(kv_lora_rank=rank, qk_rope_head_dim=rope)
        head_dim = _opt_int(text, "qk_nope_head_dim") or head_dim
    kinds: tuple[LayerKind, ...] = ()
    window: int | None = None
    chunk: int | None = None
    hybrid = _hybrid(text, source=name) if declined is None else None
    state: StateLayers | None = None
    attention_layers: int | None = None
    if hybrid is not None:
        num_layers, attention_layers, state = hybrid
        kinds = all_full(attention_layers)
    elif declined is None:
        kinds, window, chunk = _layer_kinds(text, num_layers, source=name)
    kv_shared, shapes, (kv_heads, head_dim) = (
        _kv_sharing(
            text, model_type, kinds or all_full(num_layers), (heads, kv_heads, head_dim), name
        )
        if declined is None and model_type in _KV_SHARING_TYPES
        else (0, (), (kv_heads, head_dim))
    )
    attention_free = 0
    if kv_shared:
        attention_layers = num_layers - kv_shared
        kinds = (kinds or all_full(num_layers))[:attention_layers]
        window = window if "sliding" in kinds else None
    if nas is not None:
        attention_layers = nas.attention_layers
        attention_free = num_layers - attention_layers
        kinds = all_full(attention_layers)
        params = params if params is not None else nas.params
    dtype = str(text.get("torch_dtype") or text.get("dtype") or "bfloat16")
    default_len, limit = _context_lengths(text)
    return ModelArch(
        name=name,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=_opt_int(text, "vocab_size"),
        intermediate_size=(
            nas.intermediate_size
            if nas is not None and nas.intermediate_size is not None
            else _per_layer_size(text, "intermediate_size")
        ),
        params=params,
        per_layer_inputs=_per_layer_inputs(text) if model_type in _KV_SHARING_TYPES else None,
        dtype=dtype.removeprefix("torch."),
        mla=mla,
        layer_kinds=kinds,
        sliding_window=window,
        attention_chunk_size=chunk,
        # transformers' own default: tied for the Gemma classes, whose configs leave it out.
        tie_word_embeddings=_config_bool(
            text,
            "tie_word_embeddings",
            default=str(text.get("model_type", "")).startswith("gemma"),
        ),
        moe=_moe(text, num_layers),
        quantization=_quantization(text),
        max_position_embeddings=_config_length(text),
        derived_max_len=limit,
        default_max_len=default_len,
        declined=declined,
        state=state,
        attention_layers=attention_layers,
        kv_shared_layers=kv_shared,
        attention_free_layers=attention_free,
        multimodal=any(config.get(key) is not None for key in ("vision_config", "audio_config")),
        architecture=_architecture(config),
        mtp_layers=_count(text, "num_nextn_predict_layers"),
        indexer=(
            SparseIndexer(head_dim=_int(text, "index_head_dim", source=name))
            if declined is None and "index_topk" in text
            else None
        ),
        layer_shapes=shapes,
    )


#: The KV-head counts vLLM 0.32 reads, first found first (``get_total_num_kv_heads``,
#: vllm/transformers_utils/model_arch_config_convertor.py): Falcon's, Llama's, ChatGLM's,
#: Step-3.5's. Reading only ``num_key_value_heads`` sized Falcon-40B (``num_kv_heads`` 8 of 128)
#: as MHA.
_KV_HEAD_KEYS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)
#: model_type values of Falcon (``FalconModelArchConfigConvertor``).
_FALCON_TYPES = {"falcon", "RefinedWeb", "RefinedWebModel"}


def _kv_heads(config: Mapping[str, Any]) -> int | None:
    """KV heads as vLLM 0.32 reads them; None when the config gives none (MHA).

    Falcon without ``new_decoder_architecture`` but with ``multi_query`` has one KV head, whatever
    ``num_kv_heads`` says (transformers' FalconConfig writes it equal to the heads); both flags
    default as FalconConfig's do (``multi_query`` true).
    """
    if (
        str(config.get("model_type", "")) in _FALCON_TYPES
        and not _config_bool(config, "new_decoder_architecture", default=False)
        and _config_bool(config, "multi_query", default=True)
    ):
        return 1
    for key in _KV_HEAD_KEYS:
        if config.get(key) is not None:
            return _opt_int(config, key)
    return None


def _attention_shape(config: Mapping[str, Any], *, name: str) -> tuple[int, int, int, int]:
    """Attention heads, hidden size, KV heads and head size, each checked against the others.

    A missing ``num_key_value_heads`` means MHA; one that does not divide the heads is an error
    (vLLM refuses such a model), and so is a derived head size of 0.
    """
    heads = _int(config, "num_attention_heads", source=name)
    hidden = _int(config, "hidden_size", source=name)
    kv_heads = _kv_heads(config) or heads
    if kv_heads > heads or heads % kv_heads:
        raise ModelConfigError(
            f"{name}: config.json num_key_value_heads {kv_heads} does not divide "
            f"num_attention_heads {heads}; fix it in config.json"
        )
    head_dim = _opt_int(config, "head_dim") or hidden // heads
    if head_dim == 0:
        raise ModelConfigError(
            f"{name}: config.json has no head_dim and hidden_size {hidden} / "
            f"num_attention_heads {heads} rounds to 0; give head_dim in config.json"
        )
    return heads, hidden, kv_heads, head_dim


#: Rope types whose ``factor`` vLLM (0.32, 0.33) does not apply to the context length it derives:
#: YaRN's ``max_position_embeddings`` is already the scaled length (vllm/config/model.py,
#: ``_get_and_verify_max_len``, the tuple beside "YaRN variants leave max_position_embeddings
#: already scaled"). Every other type's ``factor`` (linear, dynamic...) multiplies it.
_UNSCALED_ROPE = {
    "su",
    "longrope",
    "llama3",
    "yarn",
    "deepseek_yarn",
    "deepseek_llama_scaling",
}


def _rope_parameters(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rope parameter sets, one per layer type when nested (``iter_rope_parameters``)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    if not isinstance(rope, Mapping) or not rope:
        return []
    if all(isinstance(value, Mapping) for value in rope.values()):
        return [value for value in rope.values() if value]
    return [rope]


def _rope_type(rope: Mapping[str, Any]) -> str:
    # transformers (patch_rope_parameters in vLLM) renames the legacy "type" key to "rope_type".
    return str(rope.get("rope_type") or rope.get("type") or "default")


def _rope_factor(config: Mapping[str, Any]) -> float:
    """The factor vLLM 0.32 multiplies the derived context length by (1 when none applies).

    As ``_get_and_verify_max_len``: Gemma 3's length is already scaled; otherwise the last
    ``factor`` of a rope set whose type is not in :data:`_UNSCALED_ROPE` applies (linear: 4.0
    makes 32,768 positions 131,072), a null one counting 1.
    """
    if "gemma3" in str(config.get("model_type", "")):
        return 1.0
    scaling: Mapping[str, Any] = {}
    for rope in _rope_parameters(config):
        if _rope_type(rope) not in _UNSCALED_ROPE and "factor" in rope:
            scaling = rope
    factor = _config_factor(scaling, "factor", maximum=MAX_LAYERS, label="rope_scaling.factor")
    return 1.0 if factor is None else factor


#: The fields vLLM 0.32 reads a model's length from, in its order; the smallest present is the
#: length (``derive_max_model_len_and_key``): Qwen's ``seq_length``, GPT-2's ``n_positions``...
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def _config_length(config: Mapping[str, Any]) -> int | None:
    """The model's own length: the smallest of :data:`_LENGTH_KEYS` present, as vLLM takes it."""
    lengths = [length for key in _LENGTH_KEYS if (length := _opt_int(config, key)) is not None]
    return min(lengths, default=None)


def _context_lengths(config: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """vLLM's default ``max_model_len`` and the longest it accepts, each None when the same.

    "The same" is :func:`_config_length`, the smallest of the config's length fields. vLLM 0.32
    derives the length from it, or from the config's ``model_max_length`` when it has one
    (Command-R: 8,192 positions, 131,072 accepted; ``derive_max_model_len_and_key``), times
    :func:`_rope_factor`; with no ``--max-model-len`` it serves that length, or
    ``original_max_position_embeddings`` for LongRoPE models (Phi-3), and it accepts a
    ``--max-model-len`` up to that length or up to ``model_max_length``.
    """
    positions = _config_length(config)
    model_max = _opt_int(config, "model_max_length")
    base = model_max or positions
    if base is None:
        return None, None
    derived = int(base * _rope_factor(config))
    default = derived
    if any(_rope_type(rope) == "longrope" for rope in _rope_parameters(config)):
        default = _opt_int(config, "original_max_position_embeddings") or derived
    limit = max(derived, model_max or 0)
    return (
        default if default != positions else None,
        limit if limit != positions else None,
    )


def _per_layer_size(config: Mapping[str, Any], key: str) -> int | None:
    """A size some configs give per layer (Gemma 3n's ``intermediate_size``): a list's mean.

    The mean times the layers is the list's sum, which is what the parameter count needs.
    """
    value = config.get(key)
    if isinstance(value, list) and value:
        sizes = [
            _config_int({key: item}, key, minimum=0, label=f"{key}[{index}]") or 0
            for index, item in enumerate(value)
        ]
        return round(sum(sizes) / len(sizes)) or None
    return _opt_int(config, key, minimum=0)


def _count(config: Mapping[str, Any], key: str) -> int | None:
    """A non-negative integer field (0 included), or None when absent."""
    return _config_int(config, key, minimum=0, maximum=MAX_LAYERS)


def _architecture(config: Mapping[str, Any]) -> str | None:
    """The first ``architectures`` entry: the model class vLLM loads."""
    names = config.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0]
    return None


def _moe(config: Mapping[str, Any], num_layers: int) -> MoeSpec | None:
    experts = (
        _opt_int(config, "num_local_experts", minimum=0)
        or _opt_int(config, "n_routed_experts", minimum=0)
        or _opt_int(config, "num_experts", minimum=0)
    )
    if experts is None or experts < 2:
        return None
    per_token = _opt_int(config, "num_experts_per_tok") or _opt_int(config, "top_k") or 1
    size = _opt_int(config, "moe_intermediate_size", minimum=0) or _opt_int(
        config, "intermediate_size", minimum=0
    )
    return MoeSpec(
        num_experts=experts,
        experts_per_token=per_token,
        expert_intermediate_size=size or 0,
        moe_layers=_moe_layer_count(config, num_layers),
    )


def _moe_layer_count(config: Mapping[str, Any], num_layers: int) -> int:
    """How many layers hold experts: many MoE models interleave them with dense MLP layers.

    Each spelling is the one the model's own code reads (vLLM and Transformers agree): an explicit
    ``moe_layers`` list (Llama 4's config), Jamba's ``expert_layer_period``/``_offset``, Llama 4's
    ``interleave_moe_layer_step``, Qwen-MoE's ``decoder_sparse_step`` and ``mlp_only_layers``,
    DeepSeek's ``first_k_dense_replace`` and ``moe_layer_freq``. Counting every layer would put
    twice the experts' weights into a Jamba or Llama 4 Maverick estimated from its shape.
    """
    listed = config.get("moe_layers")
    if isinstance(listed, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in listed
    ):
        return len({i for i in listed if 0 <= i < num_layers})
    layers = range(num_layers)
    period = _opt_int(config, "expert_layer_period")
    if period is not None:
        offset = (_opt_int(config, "expert_layer_offset", minimum=0) or 0) % period
        return sum(1 for i in layers if i % period == offset)
    step = _opt_int(config, "interleave_moe_layer_step") or _opt_int(config, "decoder_sparse_step")
    if step is not None:
        dense_only = config.get("mlp_only_layers")
        skipped = (
            {i for i in dense_only if isinstance(i, int)} if isinstance(dense_only, list) else set()
        )
        return sum(1 for i in layers if (i + 1) % step == 0 and i not in skipped)
    dense = _opt_int(config, "first_k_dense_replace", minimum=0) or 0
    freq = _opt_int(config, "moe_layer_freq") or 1
    return sum(1 for i in layers if i >= dense and i % freq == 0)


# --- I/O edge ----------------------------------------------------------------------------------

#: Largest ``config.json`` read (real ones are a few KB; a multimodal one some 20 KB).
MAX_CONFIG_BYTES = 1024 * 1024
#: Largest ``model.safetensors.index.json`` read (a 671B model's is about 9 MB).
MAX_INDEX_BYTES = 32 * 1024 * 1024
#: Largest ``refs/main`` of the hub cache (a 40-character commit).
MAX_REF_BYTES = 4096
#: Time limit of one model file read (a stale network mount must not stall a poll for ever).
READ_TIMEOUT_S = 10.0


def hub_cache_dir(hf_home: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache: ``HF_HUB_CACHE``, ``HF_HOME/hub`` or the default."""
    env = os.environ if environ is None else environ
    if hf_home is not None:
        return hf_home / "hub"
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def find_cached_config(model_id: str, *, cache: Path) -> Path | None:
    """``config.json`` of ``org/name`` in a hub cache (the ``main`` revision first), or None."""
    repo = cache / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        try:
            revision = read_bounded(ref, max_bytes=MAX_REF_BYTES, timeout_s=READ_TIMEOUT_S)
        except FileReadError:
            revision = b""
        name = revision.decode("utf-8", errors="replace").strip()
        preferred = snapshots / name / "config.json"
        if name and "/" not in name and name != ".." and preferred.is_file():
            return preferred
    candidates = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None


#: What a config.json read error adds; a safetensors index's says what to do with it instead.
_CONFIG_HINT = "is it a model's config.json?"
_INDEX_HINT = "re-download it, or delete it to sum the *.safetensors file sizes instead"


def _read_json(
    path: Path,
    *,
    max_bytes: int,
    allowed: Sequence[Path] | None = None,
    hint: str = _CONFIG_HINT,
) -> Any:
    """One model JSON file: a regular file of at most ``max_bytes``, inside ``allowed`` if given.

    With ``allowed`` (a path a target named), symbolic links are resolved first and the real
    file must still be inside an allowed directory; the last component is then opened without
    following links. Whatever the file holds, the error is one line ending in ``hint``.
    """
    target: Path | str = path
    if allowed is not None:
        real = within(path, allowed)
        if real is None:
            raise ModelConfigError(f"{path} leads outside model_roots; it is not read")
        target = real
    try:
        raw = read_bounded(
            target,
            max_bytes=max_bytes,
            timeout_s=READ_TIMEOUT_S,
            regular_only=True,
            follow_symlinks=allowed is None,
        )
        return json.loads(raw.decode("utf-8"))
    except FileReadError as exc:
        raise ModelConfigError(f"{exc}; {hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path} is not valid JSON ({exc}); {hint}") from None
    except ValueError:
        # Python refuses to read an integer of more than 4,300 digits.
        raise ModelConfigError(f"{path} holds a number thousands of digits long; {hint}") from None
    except RecursionError:
        raise ModelConfigError(f"{path} nests JSON too deeply; {hint}") from None


def resolve_config_path(
    source: str | Path, *, hf_home: Path | None = None, local: bool = True
) -> Path:
    """Where the ``config.json`` of ``source`` (directory, file or hub id) lives.

    With ``local=False`` only the hub cache is looked in: ``source`` is never taken as a path.
    Raises :class:`ModelNotFoundError` when nothing is there, :class:`ModelConfigError` when a
    directory is there without a ``config.json`` or cannot be examined.
    """
    try:
        return _config_path(source, hf_home, local=local)
    except OSError as exc:
        # An unreadable directory (permissions, a stale mount): stat() itself fails there.
        raise ModelConfigError(
            f"cannot read the model at {source}: {exc.strerror or exc}; give the exporter "
            "read access to the model directory"
        ) from None


def _config_path(source: str | Path, hf_home: Path | None, *, local: bool) -> Path:
    path = Path(source).expanduser()
    if local and path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelConfigError(_no_config_file(config))
        return config
    if local and path.is_file():
        return path
    text = str(source)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        cache = hub_cache_dir(hf_home)
        found = find_cached_config(text, cache=cache)
        if found is not None:
            return found
        raise ModelNotFoundError(
            f"model {text!r} is not in the local Hugging Face cache ({cache}); nothing is "
            "downloaded: download it first, point --model at its directory, or use a catalogue name"
        )
    raise ModelNotFoundError(f"no model directory or config.json at {text!r}")


def _no_config_file(config: Path) -> str:
    """Why a directory's ``config.json`` is not a file to read, in words that are true."""
    try:
        mode = config.stat().st_mode
    except FileNotFoundError:
        if config.is_symlink():
            return f"{config} is a symbolic link to nothing; point it at the model's config.json"
        return f"{config.parent} has no config.json; point --model at a model directory"
    except OSError as exc:
        # A symbolic-link loop (ELOOP), a permission problem on the way...
        return f"cannot read {config}: {exc.strerror or exc}; make it the model's config.json"
    what = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
    return f"{config} is {what}; make it the model's config.json"


def load_model_arch(source: str | Path, *, hf_home: Path | None = None) -> ModelArch:
    """Read the architecture of a model directory, a ``config.json`` or a cached hub id."""
    return read_model_config(resolve_config_path(source, hf_home=hf_home), name=str(source))


def read_model_config(
    config_path: Path, *, name: str, allowed: Sequence[Path] | None = None
) -> ModelArch:
    """Read and parse one ``config.json`` (ModelConfigError when it cannot be used).

    ``allowed``: the directories a path a target named must stay in (``model_roots``).
    """
    return parse_model_config(
        _read_json(config_path, max_bytes=MAX_CONFIG_BYTES, allowed=allowed), name=name
    )


def model_weights_bytes(model_dir: Path, *, allowed: Sequence[Path] | None = None) -> int | None:
    """Checkpoint size in bytes, or None when the directory holds no safetensors.

    ``model.safetensors.index.json`` ``metadata.total_size`` when present, else the sum of the
    ``*.safetensors`` file sizes. An unreadable directory gives None too (the sizing then
    estimates the weights from the parameter count); a corrupt index raises ModelConfigError.
    """
    try:
        return _weights_bytes(model_dir, allowed)
    except OSError:
        return None


#: Largest checkpoint believed (1 PB): a bigger ``total_size`` is a corrupt index.
MAX_WEIGHTS_BYTES = 2**50
#: How a git-lfs pointer file starts: what a clone without git-lfs leaves instead of weights.
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
#: Pointer files are about 130 bytes; only files this small are opened to look.
_LFS_POINTER_MAX_BYTES = 1024


def _weights_bytes(model_dir: Path, allowed: Sequence[Path] | None) -> int | None:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = _read_json(index, max_bytes=MAX_INDEX_BYTES, allowed=allowed, hint=_INDEX_HINT)
        total = _index_total(data, index=index)
        if total is not None:
            return total
    files = sorted(f for f in model_dir.glob("*.safetensors") if f.is_file())
    if not files:
        return None
    pointers = [file.name for file in files if _is_lfs_pointer(file, allowed)]
    if pointers:
        raise ModelConfigError(
            f"{model_dir}: {len(pointers)} of {len(files)} *.safetensors files ({pointers[0]}...) "
            "are git-lfs pointer files, not weights (cloned without git-lfs, or an incomplete "
            "download): run `git lfs pull` there, or give --weights-gib"
        )
    return sum(file.stat().st_size for file in files)


def _index_total(data: Any, *, index: Path) -> int | None:
    """``metadata.total_size`` of a safetensors index, None when it gives none; checked."""
    metadata = data.get("metadata") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(metadata, dict | None):
        raise ModelConfigError(
            f"{index} is not a safetensors index (it needs a JSON object with a 'metadata' "
            f"object); {_INDEX_HINT}"
        )
    try:
        return _config_int(
            metadata or {}, "total_size", maximum=MAX_WEIGHTS_BYTES, label="metadata.total_size"
        )
    except _BadField as bad:
        message = str(bad).replace("; fix it in config.json", "")
        raise ModelConfigError(f"{index}: {message}; {_INDEX_HINT}") from None


def _is_lfs_pointer(file: Path, allowed: Sequence[Path] | None) -> bool:
    """Whether ``file`` is a small git-lfs pointer file (a file unreadable here is not one)."""
    if file.stat().st_size > _LFS_POINTER_MAX_BYTES:
        return False
    target = within(file, allowed) if allowed is not None else file
    if target is None:
        return False
    try:
        head = read_bounded(
            target, max_bytes=_LFS_POINTER_MAX_BYTES, timeout_s=READ_TIMEOUT_S, regular_only=True
        )
    except FileReadError:
        return False
    return head.startswith(LFS_POINTER_PREFIX)
