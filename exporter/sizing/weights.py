"""Model weights per GPU, from a parameter count and the weight format.

When the model directory is readable the checkpoint size is the better source
(:func:`exporter.sizing.modelconfig.model_weights_bytes`); this module covers planning, where only
the architecture and the parameter count are known. All experts of a mixture-of-experts model are
resident, so MoE models count every parameter. Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.errors import UsageError

#: Bytes per element of the torch dtypes a checkpoint or a KV cache can use.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
}


def _group_bytes(bits: int) -> float:
    """Bytes per weight of a group-wise format (4 bits: 0.5 + (2 + 0.5) / 128).

    The packed values, plus one fp16 scale and one packed zero point per group of 128 weights.
    """
    return bits / 8 + (2 + bits / 8) / 128


# Group-wise 4-bit formats (AWQ, GPTQ, compressed-tensors w4a16).
_INT4_GROUP_BYTES = _group_bytes(4)
# MXFP4 (gpt-oss experts): 4-bit values plus one 8-bit shared exponent per block of 32.
_MXFP4_BYTES = 0.5 + 1 / 32


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How the linear layers of a checkpoint are stored.

    ``bytes_per_param`` applies to the quantized linear layers; embeddings, the LM head and the
    norms stay in the model dtype. ``experts_only`` formats (MXFP4) quantize only MoE experts.
    """

    name: str
    bytes_per_param: float | None  # None: the model dtype (no quantization)
    experts_only: bool = False


_FORMATS: dict[str, WeightFormat] = {
    "none": WeightFormat("none", None),
    "fp8": WeightFormat("fp8", 1.0),
    "int8": WeightFormat("int8", 1.0),
    "w8a8": WeightFormat("w8a8", 1.0),
    "awq": WeightFormat("awq", _INT4_GROUP_BYTES),
    "gptq": WeightFormat("gptq", _INT4_GROUP_BYTES),
    # GPTQ's other width (quantization_config.bits): vLLM 0.32's GPTQ kernels (AutoGPTQConfig,
    # vllm/model_executor/layers/quantization/auto_gptq.py) take 4- and 8-bit weights only.
    "gptq_8bit": WeightFormat("gptq_8bit", _group_bytes(8)),
    "int4": WeightFormat("int4", _INT4_GROUP_BYTES),
    "w4a16": WeightFormat("w4a16", _INT4_GROUP_BYTES),
    "nvfp4": WeightFormat("nvfp4", 0.5 + 1 / 16),
    "mxfp4": WeightFormat("mxfp4", _MXFP4_BYTES, experts_only=True),
    "fp32": WeightFormat("fp32", 4.0),
    "bf16": WeightFormat("bf16", 2.0),
    "fp16": WeightFormat("fp16", 2.0),
}

# Spellings found in vLLM's --quantization values and in quantization_config.quant_method.
_ALIASES: dict[str, str] = {
    "": "none",
    "auto": "none",
    "fbgemm_fp8": "fp8",
    "modelopt": "fp8",
    "ptpc_fp8": "fp8",
    "fp8_dynamic": "fp8",
    "int8_w8a8": "w8a8",
    "w8a8_int8": "w8a8",
    "awq_marlin": "awq",
    "gptq_marlin": "gptq",
    "gptq_marlin_24": "gptq",
    "marlin": "gptq",
    "bitsandbytes": "int4",
    "modelopt_fp4": "nvfp4",
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
}


def weight_format(name: str | None) -> WeightFormat:
    """Look up a weight format by vLLM's ``--quantization`` spelling; ``None`` means unquantized."""
    key = (name or "none").strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in _FORMATS:
        known = ", ".join(sorted(k for k in _FORMATS if k != "none"))
        raise UsageError(f"unknown weight format {name!r}: use one of {known} (or omit --quant)")
    return _FORMATS[key]


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a torch dtype name (``bfloat16``, ``float16``, ``float32``...)."""
    key = dtype.strip().lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise UsageError(f"unknown dtype {dtype!r}: use bfloat16, float16 or float32")
    return DTYPE_BYTES[key]


@dataclass(frozen=True, slots=True)
class PerLayerInputs:
    """Gemma 3n's and Gemma 4's per-layer input embeddings (PLE): a second, wider token table.

    vLLM 0.32 builds ``embed_tokens_per_layer`` (``vocab_size`` x layers x ``width``, a
    ``VocabParallelEmbedding`` like the input embedding) and keeps it on the GPU (gemma3n.py,
    gemma4.py). The model cards' "effective" sizes leave it out because phones can keep it off
    the accelerator; vLLM does not, and at 2.3B parameters for Gemma 3n E4B it is GiBs of
    weights that would otherwise be handed to the KV cache.
    """

    vocab_size: int
    width: int  # hidden_size_per_layer_input

    def table_params(self, layers: int) -> int:
        """The embedding table: one ``width`` slice per layer for every token."""
        return self.vocab_size * layers * self.width

    def projection_params(self, layers: int, hidden: int) -> int:
        """The linear layers around it: hidden -> layers x width, then per layer two more.

        Each layer gates (hidden -> width) and projects back (width -> hidden).
        """
        return 3 * hidden * layers * self.width


@dataclass(frozen=True, slots=True)
class ParamSplit:
    """A parameter count split into the parts that weight formats and stages treat differently."""

    total: int
    embedding: int  # input embeddings (vocab x hidden, plus a per-layer table), in the model dtype
    lm_head: int  # separate output projection; 0 when tied to the embedding
    experts: int  # MoE expert weights (the part MXFP4 quantizes)

    @property
    def decoder(self) -> int:
        """Parameters in the decoder layers (attention, MLP, experts, norms, vision tower)."""
        return max(0, self.total - self.embedding - self.lm_head)


def weights_bytes_total(split: ParamSplit, *, fmt: WeightFormat, dtype_size: int) -> float:
    """Bytes of the whole checkpoint once loaded: quantized linear layers plus 16-bit rest."""
    if fmt.bytes_per_param is None:
        return float(split.total * dtype_size)
    # An experts-only format on a model whose expert share is unknown falls back to all linears.
    quantized = split.experts if fmt.experts_only and split.experts else split.decoder
    rest = split.total - quantized
    return quantized * fmt.bytes_per_param + rest * dtype_size
