"""Specification of weight bytes from a parameter count: dtypes, weight formats, the split.

Expected figures are worked out by hand from the rules the module states: a group-wise 4-bit
weight costs 0.5 + (2 + 0.5) / 128 = 133/256 bytes, an MXFP4 one 0.5 + 1/32 = 17/32, an NVFP4
one 0.5 + 1/16 = 9/16; embeddings and the LM head stay in the model dtype.
"""

from __future__ import annotations

import pytest

from exporter.errors import UsageError
from exporter.sizing.weights import ParamSplit, dtype_bytes, weight_format, weights_bytes_total

# Llama 3.1 8B: 8,030,261,248 parameters; embedding and untied LM head of 128,256 x 4,096 each.
LLAMA_8B = ParamSplit(total=8_030_261_248, embedding=525_336_576, lm_head=525_336_576, experts=0)
# A small mixture of experts: 640 of its 800 decoder parameters are experts.
MOE = ParamSplit(total=1000, embedding=100, lm_head=100, experts=640)


# --- dtypes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        ("bfloat16", 2),
        ("bf16", 2),
        ("torch.bfloat16", 2),
        ("float16", 2),
        ("fp16", 2),
        ("half", 2),
        (" Float16 ", 2),
        ("float32", 4),
        ("fp32", 4),
        ("float", 4),
        ("torch.float32", 4),
    ],
)
def test_dtype_bytes_reads_torch_and_short_spellings(dtype: str, size: int) -> None:
    """16-bit dtypes are 2 bytes and 32-bit ones 4, with or without "torch.", in any case."""
    assert dtype_bytes(dtype) == size


@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn", "auto", "", "bfloat"])
def test_an_unknown_dtype_is_a_usage_error_naming_the_choices(dtype: str) -> None:
    """A dtype outside the table is refused with the ones to use instead, not guessed."""
    with pytest.raises(UsageError, match=r"use bfloat16, float16 or float32$") as caught:
        dtype_bytes(dtype)
    assert repr(dtype) in str(caught.value)


# --- weight formats --------------------------------------------------------------------------


@pytest.mark.parametrize("name", [None, "", "auto", "none", "NONE"])
def test_no_quantization_keeps_the_model_dtype(name: str | None) -> None:
    """Without a quantization the format has no bytes of its own: the model dtype applies."""
    fmt = weight_format(name)
    assert fmt.name == "none"
    assert fmt.bytes_per_param is None
    assert not fmt.experts_only


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("AWQ", "awq"),
        ("awq_marlin", "awq"),
        ("gptq-marlin", "gptq"),
        ("gptq_marlin_24", "gptq"),
        ("marlin", "gptq"),
        ("fbgemm_fp8", "fp8"),
        ("modelopt", "fp8"),
        ("ptpc_fp8", "fp8"),
        ("fp8_dynamic", "fp8"),
        ("int8_w8a8", "w8a8"),
        ("w8a8-int8", "w8a8"),
        ("bitsandbytes", "int4"),
        ("modelopt_fp4", "nvfp4"),
        (" MXFP4 ", "mxfp4"),
        ("bfloat16", "bf16"),
        ("float16", "fp16"),
        ("float32", "fp32"),
    ],
)
def test_vllms_quantization_spellings_name_their_format(spelling: str, name: str) -> None:
    """--quantization values and quant_method spellings (case, "-" for "_") find the format."""
    assert weight_format(spelling).name == name


@pytest.mark.parametrize(
    ("name", "bytes_per_param"),
    [
        ("fp8", 1.0),
        ("int8", 1.0),
        ("w8a8", 1.0),
        ("awq", 133 / 256),  # 64 bytes of 4-bit values + a 2-byte scale + a 0.5-byte zero / 128
        ("gptq", 133 / 256),
        ("int4", 133 / 256),
        ("w4a16", 133 / 256),
        ("nvfp4", 9 / 16),  # 8 bytes of 4-bit values + a 1-byte scale per 16
        ("mxfp4", 17 / 32),  # 16 bytes of 4-bit values + a 1-byte exponent per 32
        ("bf16", 2.0),
        ("fp16", 2.0),
        ("fp32", 4.0),
    ],
)
def test_each_format_costs_its_stated_bytes_per_parameter(
    name: str, bytes_per_param: float
) -> None:
    """8-bit formats are 1 byte; group-wise 4-bit ones a little over half a byte."""
    assert weight_format(name).bytes_per_param == bytes_per_param


def test_int4_group_scales_cost_a_little_over_half_a_byte() -> None:
    """AWQ and GPTQ weights are over 0.5 byte (their scales) but under MXFP4's 17/32."""
    awq = weight_format("awq").bytes_per_param
    mxfp4 = weight_format("mxfp4").bytes_per_param
    assert awq is not None
    assert mxfp4 is not None
    assert 0.5 < awq < mxfp4 < 0.54


@pytest.mark.parametrize(
    "name",
    [
        "fp8",
        "int8",
        "w8a8",
        "awq",
        "gptq",
        "int4",
        "w4a16",
        "nvfp4",
        "mxfp4",
        "fp32",
        "bf16",
        "fp16",
    ],
)
def test_only_mxfp4_quantizes_just_the_experts(name: str) -> None:
    """MXFP4 (gpt-oss) quantizes MoE experts only; every other format all linear layers."""
    assert weight_format(name).experts_only == (name == "mxfp4")


@pytest.mark.parametrize("name", ["int3", "compressed-tensors", "q4_k_m", "gguf"])
def test_an_unknown_format_is_a_usage_error_listing_the_known_ones(name: str) -> None:
    """An unknown format is refused, naming it, every known format, and that --quant may go."""
    with pytest.raises(UsageError, match=r"\(or omit --quant\)$") as caught:
        weight_format(name)
    message = str(caught.value)
    assert repr(name) in message
    assert (
        "awq, bf16, fp16, fp32, fp8, gptq, gptq_8bit, int4, int8, mxfp4, "
        "nvfp4, w4a16, w8a8" in message
    )


# --- the split -------------------------------------------------------------------------------


def test_the_decoder_is_what_the_embedding_and_lm_head_leave() -> None:
    """Decoder parameters are the total less the embedding and a separate LM head."""
    assert LLAMA_8B.decoder == 6_979_588_096
    assert MOE.decoder == 800
    assert ParamSplit(total=1000, embedding=100, lm_head=0, experts=0).decoder == 900


def test_the_decoder_is_never_negative() -> None:
    """An embedding larger than the stated total leaves no decoder, not a negative one."""
    assert ParamSplit(total=100, embedding=80, lm_head=40, experts=0).decoder == 0


# --- bytes of a checkpoint -------------------------------------------------------------------


def test_an_unquantized_model_is_its_parameters_times_the_dtype() -> None:
    """bf16 is 2 bytes a parameter and fp32 4: Llama 3.1 8B is 16.06 GB in bf16."""
    none = weight_format(None)
    assert weights_bytes_total(LLAMA_8B, fmt=none, dtype_size=2) == 16_060_522_496
    assert weights_bytes_total(LLAMA_8B, fmt=none, dtype_size=4) == 32_121_044_992


def test_every_expert_of_an_unquantized_moe_model_is_resident() -> None:
    """All experts count: an MoE model's bytes are all its parameters, not the active ones."""
    assert weights_bytes_total(MOE, fmt=weight_format(None), dtype_size=2) == 2000


def test_fp8_quantizes_the_decoder_and_keeps_embedding_and_head_in_the_dtype() -> None:
    """Llama 3.1 8B in fp8: 6,979,588,096 decoder bytes plus 2 x 1,050,673,152 for the rest."""
    total = weights_bytes_total(LLAMA_8B, fmt=weight_format("fp8"), dtype_size=2)
    assert total == 9_080_934_400


@pytest.mark.parametrize("name", ["awq", "gptq", "awq_marlin", "int4", "w4a16"])
def test_group_wise_int4_costs_its_scales_on_top_of_half_a_byte(name: str) -> None:
    """2,560 decoder parameters at 133/256 byte are 1,330 bytes; 200 bf16 others add 400."""
    split = ParamSplit(total=2760, embedding=100, lm_head=100, experts=0)
    assert weights_bytes_total(split, fmt=weight_format(name), dtype_size=2) == 1730


def test_nvfp4_costs_nine_sixteenths_of_a_byte() -> None:
    """1,600 decoder parameters at 9/16 byte are 900 bytes; 200 bf16 others add 400."""
    split = ParamSplit(total=1800, embedding=100, lm_head=100, experts=0)
    assert weights_bytes_total(split, fmt=weight_format("nvfp4"), dtype_size=2) == 1300


def test_mxfp4_quantizes_only_the_experts() -> None:
    """640 experts at 17/32 byte are 340 bytes; the 360 others stay bf16: 720 bytes."""
    assert weights_bytes_total(MOE, fmt=weight_format("mxfp4"), dtype_size=2) == 1060


def test_mxfp4_without_a_known_expert_share_quantizes_every_decoder_parameter() -> None:
    """With no expert count, all 800 decoder parameters are MXFP4 (425 bytes) plus 400."""
    split = ParamSplit(total=1000, embedding=100, lm_head=100, experts=0)
    assert weights_bytes_total(split, fmt=weight_format("mxfp4"), dtype_size=2) == 825


def test_a_tied_lm_head_is_counted_once() -> None:
    """With the head tied to the embedding, 900 decoder fp8 bytes plus a 200-byte embedding."""
    split = ParamSplit(total=1000, embedding=100, lm_head=0, experts=0)
    assert weights_bytes_total(split, fmt=weight_format("fp8"), dtype_size=2) == 1100


def test_a_format_applies_its_own_bytes_whatever_the_model_dtype() -> None:
    """fp8 layers are 1 byte under an fp32 model too; only the rest follows the dtype."""
    split = ParamSplit(total=1000, embedding=100, lm_head=100, experts=0)
    assert weights_bytes_total(split, fmt=weight_format("fp8"), dtype_size=4) == 800 + 800
