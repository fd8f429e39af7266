"""Specification of the sizing model (exporter.sizing.model), worked examples and properties."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.errors import UnsupportedModelError, UsageError
from exporter.sizing.model import (
    Declined,
    Deployment,
    MlaDims,
    ModelArch,
    SizingResult,
    in_flight_tokens,
    kv_bytes_per_element,
    kv_heads_per_gpu,
    pipeline_partition,
    require_sized,
    size_deployment,
    utilization_needed,
)
from exporter.sizing.modelconfig import load_model_arch, parse_model_config
from exporter.vllm.version import VllmVersion
from tests import paths

CONFIGS = paths.CONFIGS
GB = 10**9
GIB = 2**30


def sized(arch: ModelArch, deployment: Deployment) -> SizingResult:
    """Size and insist the model was not declined."""
    return require_sized(size_deployment(arch, deployment=deployment))


def arch(name: str) -> ModelArch:
    """Load a fixture config by directory name."""
    return load_model_arch(CONFIGS / name)


LLAMA = Deployment(
    gpu_memory_bytes=80 * GB,
    gpu_memory_utilization=0.9,
    weights_bytes=16 * GB,
    overhead_bytes=4 * GB,
    dtype="float16",
    max_model_len=8192,
)


def test_worked_example_bytes_per_token() -> None:
    """Llama 3.1 8B in FP16 costs exactly 131,072 bytes (128 KiB) of KV per token."""
    result = sized(arch("llama-3.1-8b-instruct"), LLAMA)
    assert result.bytes_per_token == 131_072
    assert result.bytes_per_token * 2000 == 250 * 2**20  # a 2,000-token sequence: 250 MiB


def test_worked_example_budget_and_sequences() -> None:
    """80 GB x 0.9 - 16 GB - 4 GB = 52 GB holds about 200 x 2,000 or 50 x 8,000 tokens."""
    result = sized(arch("llama-3.1-8b-instruct"), LLAMA)
    assert result.kv_budget_bytes == 52 * GB
    assert result.sequences_at(2000) == 198
    assert result.sequences_at(8000) == 49


def test_worked_example_fp8_doubles() -> None:
    """An FP8 KV cache halves bytes per token and doubles the sequences that fit."""
    result = sized(arch("llama-3.1-8b-instruct"), replace(LLAMA, kv_cache_dtype="fp8"))
    assert result.bytes_per_token == 65_536
    assert result.sequences_at(2000) == 396
    assert result.sequences_at(8000) == 99


def test_tiny_cpu_model_matches_vllm_032() -> None:
    """The tiny CPU model costs 1,024 bytes/token and gives vLLM 0.32's 8 blocks = 1,024 tokens."""
    deployment = Deployment(
        gpu_memory_bytes=0,
        device="cpu",
        kv_cache_memory_bytes=1_048_576,
        max_model_len=512,
        vllm_version=VllmVersion(0, 32, 0),
    )
    result = sized(arch("tiny-llama"), deployment)
    assert result.bytes_per_token == 1024
    assert result.block_size == 128
    assert result.kv_blocks == 8
    assert result.kv_capacity_tokens == 1024
    assert result.kv_cache_size_tokens == 1024
    assert result.max_concurrency == 2.0
    assert result.usable_tokens == 7 * 128


def test_qwen25_7b_bytes_per_token() -> None:
    """Qwen2.5 7B: 2 x 28 layers x 4 KV heads x 128 x 2 bytes = 57,344 bytes per token."""
    result = sized(arch("qwen2.5-7b-instruct"), replace(LLAMA, weights_bytes=None))
    assert result.bytes_per_token == 57_344
    assert result.attention_kind == "GQA"


def test_deepseek_v3_mla_bytes_and_tp_invariance() -> None:
    """DeepSeek-V3 caches 576 values per layer (61 x 576 x 2 bytes), the same on every TP rank."""
    model = arch("deepseek-v3")
    deployment = Deployment(gpu_memory_bytes=140 * GIB, tensor_parallel=8, max_model_len=8192)
    result = sized(model, deployment)
    assert result.bytes_per_token == 61 * 576 * 2
    for tp in (1, 2, 4, 16):
        other = sized(model, replace(deployment, tensor_parallel=tp, weights_bytes=4 * GIB))
        assert other.bytes_per_token == result.bytes_per_token


def test_gemma2_9b_matches_vllm_019_log() -> None:
    """Gemma 2 9B with 54.12 GiB of KV memory gives vLLM 0.19's logged 168,880 tokens."""
    deployment = Deployment(
        gpu_memory_bytes=int(79.19 * GIB),  # an H100: vLLM's 8,192-token batch default
        kv_cache_memory_bytes=int(54.12 * GIB),
        max_model_len=8192,
        vllm_version=VllmVersion(0, 19, 0),
    )
    result = sized(arch("gemma-2-9b-it"), deployment)
    assert [g.kind for g in result.kv_groups] == ["sliding", "full"]
    assert result.legacy_log_tokens == 168_880
    assert result.reported_capacity_tokens == 168_880
    # vLLM logged "Maximum concurrency for 8,192 tokens per request: 20.60x".
    assert f"{result.max_concurrency:.2f}" == "20.60"


def test_gemma3_vlm_groups_and_concurrency() -> None:
    """Gemma 3 12B (text_config nested) forms 6 groups of 8 layers; vLLM 0.19 logged 15.88x."""
    deployment = Deployment(
        gpu_memory_bytes=int(79.19 * GIB),
        kv_cache_memory_bytes=int(47.72 * GIB),
        max_model_len=8192,
        vllm_version=VllmVersion(0, 19, 0),
    )
    result = sized(arch("gemma-3-12b-it"), deployment)
    assert len(result.kv_groups) == 6
    assert result.kv_groups[0].num_layers == 8
    assert result.legacy_log_tokens == 130_304
    assert f"{result.max_concurrency:.2f}" == "15.88"
    # From vLLM 0.24 the reported capacity is concurrency x max_model_len instead.
    newer = sized(arch("gemma-3-12b-it"), replace(deployment, vllm_version=VllmVersion(0, 24)))
    assert newer.reported_capacity_tokens == int(newer.max_concurrency * 8192)


def test_mistral_sliding_window_bounds_sequence_blocks() -> None:
    """Mistral 7B v0.1 windows every layer: a long sequence takes what admission reserves.

    vLLM 0.32 admits a request of T tokens with min(ceil(T / 16), cap) free blocks, the cap
    being the window's blocks and the in-flight tokens' (max_admission_blocks_per_request:
    out-of-window blocks are freed only as tokens are processed): 4,095 + 2 x 8,192 tokens on a
    GPU, where async scheduling keeps two batches in flight.
    """
    result = sized(arch("mistral-7b-v0.1"), replace(LLAMA, max_model_len=32768))
    assert result.attention_kind == "GQA (sliding window)"
    assert result.blocks_per_sequence(2000) == 125
    assert result.max_num_batched_tokens == 8192
    assert result.blocks_per_sequence(30000) == math.ceil((4095 + 2 * 8192) / 16) + 1
    assert result.blocks_per_sequence(30000) == result.blocks_per_max_len_request
    assert result.sequences_at(30000) > result.usable_tokens // 30000


@pytest.mark.parametrize(
    ("device", "pipeline", "version", "batches"),
    [
        # async scheduling, on by default on GPUs: one batch more than the stages
        ("cuda", 1, VllmVersion(0, 32, 0), 2),
        ("cuda", 4, VllmVersion(0, 32, 0), 5),
        # the CPU backend turns async scheduling off: one batch a stage
        ("cpu", 1, VllmVersion(0, 32, 0), 1),
        ("cpu", 2, VllmVersion(0, 32, 0), 2),
        # before 0.32 (not read): one batch, as the recordings of older releases agree
        ("cuda", 1, VllmVersion(0, 19, 0), 1),
    ],
)
def test_a_windows_admission_counts_every_batch_in_flight(
    device: str, pipeline: int, version: VllmVersion, batches: int
) -> None:
    """vLLM 0.32's max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens."""
    deployment = replace(
        LLAMA,
        device=device,  # type: ignore[arg-type]
        pipeline_parallel=pipeline,
        vllm_version=version,
    )
    assert in_flight_tokens(deployment, 8192) == batches * 8192


def test_kv_heads_replicated_beyond_tp() -> None:
    """KV heads split by TP and are replicated (never fewer than 1) once TP exceeds them."""
    assert kv_heads_per_gpu(8, 2) == 4
    assert kv_heads_per_gpu(8, 8) == 1
    assert kv_heads_per_gpu(8, 16) == 1


def test_pipeline_partition_spares_last_stage() -> None:
    """Pipeline stages split layers evenly, extra layers going to the stages before the last."""
    assert pipeline_partition(32, 4) == (8, 8, 8, 8)
    assert pipeline_partition(30, 4) == (7, 8, 8, 7)
    assert sum(pipeline_partition(61, 8)) == 61


def test_pipeline_parallel_halves_layers_per_gpu() -> None:
    """With PP 2 each GPU holds half the layers, so bytes per token halve."""
    model = arch("llama-3.1-8b-instruct")
    one = sized(model, replace(LLAMA, weights_bytes=None, overhead_bytes=None))
    two = sized(model, replace(LLAMA, weights_bytes=None, overhead_bytes=None, pipeline_parallel=2))
    assert two.bytes_per_token * 2 == one.bytes_per_token
    assert len(two.stages) == 2


def test_kv_dtype_bytes() -> None:
    """auto follows the model dtype; fp8 variants are 1 byte; fp32 is 4; unknown is refused."""
    assert kv_bytes_per_element("auto", model_dtype="bfloat16") == 2
    assert kv_bytes_per_element("auto", model_dtype="float32") == 4
    assert kv_bytes_per_element("fp8_e5m2", model_dtype="bfloat16") == 1
    assert kv_bytes_per_element("fp8_e4m3", model_dtype="bfloat16") == 1
    with pytest.raises(UsageError, match="unknown KV cache dtype"):
        kv_bytes_per_element("int3", model_dtype="bfloat16")


def test_utilization_outside_range_is_refused() -> None:
    """A utilization outside (0, 1] is bad input, not a silent clamp."""
    with pytest.raises(UsageError, match=r"\(0, 1\]"):
        sized(arch("tiny-llama"), replace(LLAMA, gpu_memory_utilization=1.2))


def test_tp_that_does_not_divide_kv_heads_is_refused() -> None:
    """vLLM refuses a TP that neither divides the KV heads nor is a multiple of them."""
    heads_divide = replace(arch("qwen2.5-7b-instruct"), num_attention_heads=84)  # 4 KV heads
    with pytest.raises(UsageError, match="KV heads do not divide"):
        sized(heads_divide, replace(LLAMA, tensor_parallel=3))


@pytest.mark.parametrize("tp", [3, 64, 2**53])
def test_tp_that_does_not_divide_the_attention_heads_is_refused(tp: int) -> None:
    """vLLM refuses a TP that does not divide the attention heads (Qwen2.5 7B: 28), KV aside."""
    with pytest.raises(UsageError, match="does not divide the model's 28 attention heads"):
        sized(arch("qwen2.5-7b-instruct"), replace(LLAMA, tensor_parallel=tp))


def test_declined_model_says_why() -> None:
    """A declined architecture yields Declined, and require_sized raises with the reason."""
    model = replace(arch("tiny-llama"), declined="hybrid state-space model")
    outcome = size_deployment(model, deployment=LLAMA)
    assert isinstance(outcome, Declined)
    with pytest.raises(UnsupportedModelError, match="state-space"):
        require_sized(outcome)


def test_default_utilization_depends_on_version() -> None:
    """Without --gpu-memory-utilization: 0.9 before vLLM 0.20, 0.92 from 0.20."""
    base = replace(LLAMA, gpu_memory_utilization=None)
    old = sized(arch("tiny-llama"), replace(base, vllm_version=VllmVersion(0, 19)))
    new = sized(arch("tiny-llama"), replace(base, vllm_version=VllmVersion(0, 20)))
    assert (old.gpu_memory_utilization, new.gpu_memory_utilization) == (0.9, 0.92)


def test_utilization_needed_is_the_smallest_that_fits() -> None:
    """The inverse question returns a utilization that fits, while 0.001 less does not."""
    model = arch("llama-3.1-8b-instruct")
    needed = utilization_needed(model, deployment=LLAMA, sequences=150, context_tokens=2000)
    assert needed is not None
    fits = sized(model, replace(LLAMA, gpu_memory_utilization=needed))
    below = sized(model, replace(LLAMA, gpu_memory_utilization=round(needed - 0.001, 3)))
    assert fits.sequences_at(2000) >= 150 > below.sequences_at(2000)
    assert utilization_needed(model, deployment=LLAMA, sequences=10**6, context_tokens=2000) is None


shapes = st.builds(
    lambda layers, kv, heads_mult, head_dim: ModelArch(
        name="prop",
        num_layers=layers,
        num_attention_heads=kv * heads_mult,
        num_kv_heads=kv,
        head_dim=head_dim,
        hidden_size=kv * heads_mult * head_dim,
        vocab_size=32000,
        params=10**9,
        max_position_embeddings=8192,
    ),
    st.integers(1, 96),
    st.sampled_from([1, 2, 4, 8, 16, 32]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([64, 80, 128, 256]),
)
PROP = Deployment(gpu_memory_bytes=80 * GIB, max_model_len=8192, vllm_version=VllmVersion(0, 19))


@settings(max_examples=60, deadline=None)
@given(shapes, st.floats(0.3, 0.95), st.floats(0.001, 0.05))
def test_more_utilization_never_fewer_tokens(model: ModelArch, util: float, step: float) -> None:
    """Raising the utilization never lowers the KV capacity."""
    low = sized(model, replace(PROP, gpu_memory_utilization=util))
    high = sized(model, replace(PROP, gpu_memory_utilization=min(1.0, util + step)))
    assert high.kv_capacity_tokens >= low.kv_capacity_tokens


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 64))
def test_fp8_gives_twice_the_tokens_within_a_block(model: ModelArch, budget_mib: int) -> None:
    """With the same budget an FP8 KV cache holds twice the tokens, to within one block."""
    fixed = replace(PROP, kv_cache_memory_bytes=budget_mib * 2**20 * 64)
    sixteen = sized(model, fixed)
    eight = sized(model, replace(fixed, kv_cache_dtype="fp8"))
    assert abs(eight.kv_capacity_tokens - 2 * sixteen.kv_capacity_tokens) <= sixteen.block_size


@settings(max_examples=60, deadline=None)
@given(shapes, st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_tp_beyond_kv_heads_stops_shrinking(model: ModelArch, tp: int) -> None:
    """Once TP reaches the KV heads, doubling it no longer shrinks bytes per token."""
    if tp < model.num_kv_heads or tp % model.num_kv_heads:
        return
    # As many query heads as both TPs divide (vLLM refuses a TP that does not divide them).
    model = replace(model, num_attention_heads=math.lcm(model.num_attention_heads, 2 * tp))
    one = sized(model, replace(PROP, tensor_parallel=tp))
    two = sized(model, replace(PROP, tensor_parallel=tp * 2))
    assert one.bytes_per_token == two.bytes_per_token == 2 * model.num_layers * model.head_dim * 2


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 96), st.sampled_from([1, 2, 4, 8, 16]))
def test_mla_bytes_do_not_change_with_tp(layers: int, tp: int) -> None:
    """MLA's latent is replicated on every rank: bytes per token ignore TP."""
    model = ModelArch(
        name="mla",
        num_layers=layers,
        num_attention_heads=16,
        num_kv_heads=16,
        head_dim=128,
        hidden_size=2048,
        vocab_size=32000,
        params=10**9,
        mla=MlaDims(512, 64),
        max_position_embeddings=8192,
    )
    result = sized(model, replace(PROP, tensor_parallel=tp))
    assert result.bytes_per_token == layers * 576 * 2


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 40_000))
def test_sequences_never_exceed_tokens_over_context(model: ModelArch, context: int) -> None:
    """Full-attention sequences of T tokens never exceed usable tokens / T."""
    result = sized(model, PROP)
    assert result.sequences_at(context) <= result.usable_tokens // context


# --- hybrid state-space / linear-attention models -----------------------------------------------

#: Qwen3-Next-80B-A3B's attention and linear-attention fields as transformers 5.19's
#: Qwen3NextConfig defaults give them (its docstring names Qwen/Qwen3-Next-80B-A3B-Instruct):
#: 48 layers, one full-attention layer in four (2 KV heads x 256), 36 gated-delta-net layers (16
#: key heads and 32 value heads of 128, a 4-tap convolution). The context length is given.
QWEN3_NEXT = {
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "full_attention_interval": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}
HYBRID_GPU = Deployment(
    gpu_memory_bytes=80 * GB, kv_cache_memory_bytes=10 * GIB, max_model_len=262144
)


def qwen3_next() -> ModelArch:
    """The Qwen3-Next-80B-A3B shape above, parsed like any config.json."""
    return parse_model_config(QWEN3_NEXT, name="qwen3-next-80b-a3b")


def test_hybrid_block_size_is_raised_until_one_attention_page_holds_a_state() -> None:
    """Qwen3-Next at TP 1 on a GPU: the 544-token attention block vLLM logs for it.

    One linear-attention state: conv (4 - 1) x (128 x 16 x 2 + 128 x 32) x 2 B = 49,152 B plus
    SSM 32 x 128 x 128 x 2 B = 1,048,576 B = 1,097,728 B. One attention token: 2 x 2 x 256 x 2 =
    2,048 B. Block = 16 x cdiv(1,097,728, 16 x 2,048) = 16 x 34 = 544 tokens.
    """
    result = sized(qwen3_next(), HYBRID_GPU)
    assert result.state_bytes == 1_097_728
    assert result.state_dtypes == ("bfloat16", "bfloat16")
    assert (result.requested_block_size, result.block_size) == (16, 544)
    assert result.block_bytes == 544 * 2_048 * 12  # one page per layer of a 12-layer group


def test_hybrid_groups_blocks_and_concurrency_at_tp4() -> None:
    """Qwen3-Next at TP 4, 10 GiB of KV cache, 262,144-token requests, worked by hand.

    TP 4 > 2 KV heads: one replicated head, 2 x 1 x 256 x 2 = 1,024 B per attention token. The
    state splits 4 ways: conv 3 x 2,048 x 2 + SSM 8 x 128 x 128 x 2 = 274,432 B; block = 16 x
    cdiv(274,432, 16,384) = 272 tokens; page = 278,528 B. 12 attention and 36 state layers:
    group size 12, so one attention group and three state groups, 12 pages per block:
    floor(10 GiB / 3,342,336) = 3,212 blocks. A 262,144-token request needs cdiv(262,144, 272) =
    964 attention blocks + 2 per state group (prefix caching on: mamba cache mode align) = 970.
    """
    result = sized(qwen3_next(), replace(HYBRID_GPU, tensor_parallel=4))
    assert (result.state_bytes, result.block_size) == (274_432, 272)
    assert [group.kind for group in result.kv_groups] == ["full", "state", "state", "state"]
    assert result.block_bytes == 3_342_336
    assert result.kv_blocks == 3_212
    assert result.blocks_per_max_len_request == 970
    assert result.max_concurrency == pytest.approx(3_212 / 970)
    assert result.kv_cache_size_tokens == int(3_212 / 970 * 262_144)
    assert result.mamba_cache_mode == "align"


def test_without_prefix_caching_a_state_group_holds_one_block_per_request() -> None:
    """--no-enable-prefix-caching: mamba cache mode none, 1 state block per request per group."""
    base = replace(HYBRID_GPU, tensor_parallel=4)
    result = sized(qwen3_next(), replace(base, enable_prefix_caching=False))
    assert result.mamba_cache_mode == "none"
    assert result.blocks_per_max_len_request == 964 + 3


def test_state_blocks_do_not_grow_with_context() -> None:
    """A state group holds its few blocks at any context; attention groups grow with it."""
    result = sized(qwen3_next(), replace(HYBRID_GPU, tensor_parallel=4))
    assert result.blocks_per_sequence(1) == 1 + 3 * 2
    assert result.blocks_per_sequence(272 * 10) == 10 + 3 * 2


def test_ssm_cache_dtype_flags_size_the_state() -> None:
    """--mamba-ssm-cache-dtype float32 doubles the SSM state; --mamba-cache-dtype sets the conv."""
    base = replace(HYBRID_GPU, tensor_parallel=4)
    wide = sized(qwen3_next(), replace(base, mamba_ssm_cache_dtype="float32"))
    assert wide.state_dtypes == ("bfloat16", "float32")
    assert wide.state_bytes == 3 * 2_048 * 2 + 8 * 128 * 128 * 4
    both = sized(qwen3_next(), replace(base, mamba_cache_dtype="float32"))
    assert both.state_dtypes == ("float32", "float32")


def test_a_user_block_size_is_raised_too() -> None:
    """vLLM overrides a --block-size too small for the state (platforms/interface.py)."""
    result = sized(qwen3_next(), replace(HYBRID_GPU, tensor_parallel=4, block_size=32))
    assert (result.requested_block_size, result.block_size) == (32, 288)  # 32 x cdiv(274432, 32768)


def test_cpu_keeps_the_ssm_state_in_float32_unless_a_16_bit_gdn_state_is_asked_for() -> None:
    """The CPU backend (AVX512-BF16) resets auto to float32; bfloat16 is kept for GDN layers."""
    cpu = replace(HYBRID_GPU, device="cpu", tensor_parallel=4)
    assert sized(qwen3_next(), cpu).state_dtypes == ("bfloat16", "float32")
    kept = sized(qwen3_next(), replace(cpu, mamba_ssm_cache_dtype="bfloat16"))
    assert kept.state_dtypes == ("bfloat16", "bfloat16")
    assert any("AVX512-BF16" in line for line in kept.assumptions)


def test_hybrid_with_pipeline_parallelism_is_declined() -> None:
    """Per-stage state pages are not modelled: declined in one line, not guessed."""
    outcome = size_deployment(qwen3_next(), deployment=replace(HYBRID_GPU, pipeline_parallel=2))
    assert isinstance(outcome, Declined)
    assert "pipeline parallelism" in outcome.reason


def test_state_heads_tp_must_divide() -> None:
    """A TP that does not divide the state's heads is refused, as vLLM's divide() does."""
    with pytest.raises(UsageError, match="does not divide"):
        sized(qwen3_next(), replace(HYBRID_GPU, tensor_parallel=64))  # 32 value heads


#: Jamba-v0.1's fields as transformers 5.19's JambaConfig defaults give them (its docstring names
#: ai21labs/Jamba-v0.1): 32 layers, attention at i % 8 == 4 (4 layers, 8 KV heads x 128), 28
#: Mamba1 layers (expand 2 x 4,096, state 16, a 4-tap convolution).
JAMBA = {
    "model_type": "jamba",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}


def test_jamba_mamba1_is_sized_by_vllms_arithmetic() -> None:
    """Jamba-v0.1 at TP 1 on a GPU with 10 GiB of KV cache, derived by hand from vLLM 0.32's source.

    (vLLM's CPU build has no Mamba1 kernel, so no real start checks this one.) A Mamba1 state:
    conv 3 x 8,192 x 2 B = 49,152 + SSM 8,192 x 16 x 2 B = 262,144 -> 311,296 B. One attention
    token: 2 x 8 x 128 x 2 = 4,096 B; block = 16 x cdiv(311,296, 65,536) = 80 tokens, page
    327,680 B. 4 attention and 28 Mamba layers: group size 4, one attention group and seven state
    groups, 4 pages per block: 10 GiB // 1,310,720 = 8,192 blocks. A 262,144-token request:
    cdiv(262,144, 80) = 3,277 attention blocks + 7 x 2 state blocks (align mode) = 3,291.
    """
    arch = parse_model_config(JAMBA, name="jamba-v0.1")
    assert arch.state is not None
    assert (arch.attention_layers, arch.state.num_layers, arch.state.kind) == (4, 28, "mamba1")
    result = sized(arch, HYBRID_GPU)
    assert (result.state_bytes, result.block_size) == (311_296, 80)
    assert len(result.kv_groups) == 8
    assert result.block_bytes == 1_310_720
    assert result.kv_blocks == 8_192
    assert result.blocks_per_max_len_request == 3_291
    assert result.kv_cache_size_tokens == int(8_192 / 3_291 * 262_144)


def test_a_hybrid_on_a_vllm_older_than_the_arithmetic_read_is_declined() -> None:
    """The state arithmetic is 0.32's; an older vLLM is declined, a newer one assumed the same."""
    old = size_deployment(
        qwen3_next(), deployment=replace(HYBRID_GPU, vllm_version=VllmVersion(0, 31))
    )
    assert isinstance(old, Declined)
    assert "0.32.0" in old.reason
    newer = sized(qwen3_next(), replace(HYBRID_GPU, vllm_version=VllmVersion(0, 33)))
    assert any("assumed unchanged in 0.33.0" in line for line in newer.assumptions)


def test_multimodal_encoder_cache_is_named_not_sized() -> None:
    """Gemma 3's vision encoder: the note gives the encoder cache's floor and why no more.

    vLLM's encoder budget is max(max_num_batched_tokens, the largest item's tokens); the
    item's tokens come from the processor, so only the floor, 8,192 x 3,840 x 2 bytes, is known.
    """
    gemma = arch("gemma-3-12b-it")
    assert gemma.multimodal
    assert not arch("llama-3.1-8b-instruct").multimodal
    text_only = {**json.loads((CONFIGS / "gemma-3-12b-it" / "config.json").read_text())}
    text_only["vision_config"] = None  # a wrapper config written without its encoder
    assert not parse_model_config(text_only, name="text-only").multimodal
    h100 = Deployment(gpu_memory_bytes=int(79.19 * GIB), max_model_len=8192)
    notes = sized(gemma, h100).assumptions
    (note,) = [n for n in notes if n.startswith("multimodal model")]
    assert f"{8192 * 3840 * 2 / 2**20:,.0f} MiB" in note
    assert "processor" in note
    overridden = sized(gemma, replace(h100, overhead_bytes=4 * GIB)).assumptions
    assert not any(n.startswith("multimodal model") for n in overridden)


@pytest.mark.parametrize("weights", [0, 130, 1000, GIB // 2])
def test_weights_below_the_embeddings_are_refused(weights: int) -> None:
    """A checkpoint smaller than its own embeddings (git-lfs pointers, a cut download) is an error.

    It was taken as given: the missing gigabytes went into the KV cache, silently.
    """
    with pytest.raises(UsageError, match=r"embeddings alone.*git lfs pull"):
        size_deployment(
            arch("llama-3.1-8b-instruct"), deployment=replace(LLAMA, weights_bytes=weights)
        )


@pytest.mark.parametrize("tied", [True, False])
def test_a_checkpoint_holding_its_embeddings_once_is_not_refused(tied: bool) -> None:
    """The floor is the input embeddings alone, whatever the config says of the LM head.

    A real tied checkpoint (Gemma-3-270m: 536 MB, 335 MB of it embeddings) sizes, as it did
    before the floor, also where its config leaves tie_word_embeddings unsaid.
    """
    gemma = replace(
        arch("llama-3.1-8b-instruct"),
        hidden_size=640,
        vocab_size=262144,
        num_layers=18,
        tie_word_embeddings=tied,
    )
    outcome = sized(gemma, replace(LLAMA, weights_bytes=536_223_224))
    assert outcome.weights_bytes >= 536_223_224


def test_without_max_model_len_the_length_vllm_serves_is_sized() -> None:
    """A linear rope factor 4 over 32,768 positions: vLLM 0.32 serves 131,072 by default.

    (``_get_and_verify_max_len``: ``max_model_len = int(derived_max_model_len)`` when none is
    given, after the factor has multiplied it.) A request of that length needs 131,072 / 16 =
    8,192 blocks.
    """
    config = {
        **json.loads((CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text()),
        "max_position_embeddings": 32768,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }
    model = parse_model_config(config, name="linear-rope")
    result = sized(model, replace(LLAMA, max_model_len=None))
    assert result.max_model_len == 131_072
    assert [group.blocks_per_max_len_request for group in result.kv_groups] == [8_192]
