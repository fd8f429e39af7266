"""Specification of the LoRA buffers vLLM pre-allocates (exporter.sizing.lora).

The arithmetic follows vLLM 0.32.0's ``create_lora_weights`` of each LoRA layer class (see the
module docstring); the numbers below are worked by hand for Llama 3.1 8B (its published
config.json: hidden 4,096, 32 heads, 8 KV heads of 128, intermediate 14,336, vocabulary 128,256,
32 layers).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.errors import UsageError
from exporter.sizing.lora import (
    LoraSettings,
    LoraShape,
    embedding_lora_elements,
    layer_lora_elements,
    lora_bytes,
)
from exporter.sizing.model import Declined, Deployment, size_deployment
from exporter.sizing.modelconfig import load_model_arch
from tests import paths

GB = 10**9
LLAMA_8B = LoraShape(
    hidden_size=4096,
    num_attention_heads=32,
    head_dim=128,
    kv_heads_per_gpu=8,
    intermediate_size=14_336,
    vocab_size=128_256,
)


def test_one_decoder_layer_at_rank_16() -> None:
    """qkv 294,912 + o 131,072 + gate_up 589,824 + down 294,912 values per slot."""
    qkv = 3 * 16 * 4096 + (4096 + 1024 + 1024) * 16
    o_proj = 16 * 4096 + 4096 * 16
    gate_up = 2 * 16 * 4096 + 2 * 14_336 * 16
    down = 16 * 14_336 + 4096 * 16
    assert (qkv, o_proj, gate_up, down) == (294_912, 131_072, 589_824, 294_912)
    assert layer_lora_elements(LLAMA_8B, rank=16, tensor_parallel=1) == 1_310_720


def test_embedding_and_lm_head_are_not_split_by_tp() -> None:
    """Embedding A is vocab x rank, B hidden x rank; the LM head the transpose; TP keeps both."""
    assert embedding_lora_elements(LLAMA_8B, rank=16) == 16 * (128_256 + 4096) == 2_117_632


def test_llama_8b_one_slot_rank_16_is_88_mib() -> None:
    """vLLM's defaults (1 slot, rank 16) cost Llama 3.1 8B 92,356,608 bytes in bfloat16."""
    settings = LoraSettings()
    total = lora_bytes(
        LLAMA_8B,
        settings,
        tensor_parallel=1,
        layers=32,
        first_stage=True,
        last_stage=True,
        model_dtype="bfloat16",
    )
    assert total == (32 * 1_310_720 + 2 * 2_117_632) * 2 == 92_356_608


def test_bytes_scale_with_slots_and_rank() -> None:
    """Every buffer is max_loras x rank wide: 4 slots at rank 64 are 16 times the default."""
    one = lora_bytes(
        LLAMA_8B,
        LoraSettings(),
        tensor_parallel=1,
        layers=32,
        first_stage=True,
        last_stage=True,
        model_dtype="bfloat16",
    )
    many = lora_bytes(
        LLAMA_8B,
        LoraSettings(max_loras=4, max_lora_rank=64),
        tensor_parallel=1,
        layers=32,
        first_stage=True,
        last_stage=True,
        model_dtype="bfloat16",
    )
    assert many == 16 * one


def test_tensor_parallel_splits_only_the_sharded_side() -> None:
    """At TP 2 the A of column-parallel layers stays whole; only output/input shards halve."""
    tp2 = replace(LLAMA_8B, kv_heads_per_gpu=4)
    qkv = 3 * 16 * 4096 + (2048 + 512 + 512) * 16
    o_proj = 16 * 2048 + 4096 * 16
    gate_up = 2 * 16 * 4096 + 2 * 7168 * 16
    down = 16 * 7168 + 4096 * 16
    assert layer_lora_elements(tp2, rank=16, tensor_parallel=2) == qkv + o_proj + gate_up + down


def test_pipeline_stages_hold_embedding_first_and_lm_head_last() -> None:
    """A middle stage has only its decoder layers' buffers."""
    middle = lora_bytes(
        LLAMA_8B,
        LoraSettings(),
        tensor_parallel=1,
        layers=8,
        first_stage=False,
        last_stage=False,
        model_dtype="float16",
    )
    assert middle == 8 * 1_310_720 * 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (LoraSettings(max_loras=0), "--max-loras must be at least 1"),
        (LoraSettings(max_lora_rank=12), "not one of vLLM's"),
        (LoraSettings(max_loras=4, max_cpu_loras=2), "must be >= --max-loras"),
    ],
)
def test_what_vllm_refuses_is_refused(settings: LoraSettings, message: str) -> None:
    """The same limits vLLM's LoRAConfig enforces, each with the fix."""
    with pytest.raises(UsageError, match=message):
        settings.validate()


def test_cpu_slots_default_to_max_loras() -> None:
    """max_cpu_loras defaults to max_loras (host memory, never counted against the GPU)."""
    assert LoraSettings(max_loras=3).cpu_slots == 3
    assert LoraSettings(max_loras=3, max_cpu_loras=8).cpu_slots == 8


def test_lora_comes_out_of_the_kv_budget() -> None:
    """The sized deployment's budget shrinks by exactly the LoRA bytes."""
    arch = load_model_arch(paths.CONFIGS / "llama-3.1-8b-instruct")
    base = Deployment(
        gpu_memory_bytes=80 * GB,
        gpu_memory_utilization=0.9,
        weights_bytes=16 * GB,
        overhead_bytes=4 * GB,
        max_model_len=8192,
    )
    plain = size_deployment(arch, deployment=base)
    lora = size_deployment(arch, deployment=replace(base, lora=LoraSettings()))
    assert not isinstance(plain, Declined)
    assert not isinstance(lora, Declined)
    assert lora.lora_bytes == 92_356_608
    assert plain.kv_budget_bytes - lora.kv_budget_bytes == 92_356_608
    assert lora.kv_blocks < plain.kv_blocks


def test_exact_kv_budget_is_not_reduced() -> None:
    """With --kv-cache-memory-bytes the budget is given: LoRA is reported but not subtracted."""
    arch = load_model_arch(paths.CONFIGS / "llama-3.1-8b-instruct")
    fixed = Deployment(gpu_memory_bytes=0, kv_cache_memory_bytes=10 * GB, lora=LoraSettings())
    result = size_deployment(arch, deployment=fixed)
    assert not isinstance(result, Declined)
    assert result.kv_budget_bytes == 10 * GB


def test_moe_and_mla_models_are_declined() -> None:
    """Expert and MLA LoRA buffers are not modelled: declined in one line that says so."""
    arch = load_model_arch(paths.CONFIGS / "deepseek-v3")
    outcome = size_deployment(
        arch,
        deployment=Deployment(gpu_memory_bytes=141 * GB, tensor_parallel=8, lora=LoraSettings()),
    )
    assert isinstance(outcome, Declined)
    assert "--enable-lora" in outcome.reason


def test_only_classes_with_embedding_modules_get_embedding_buffers() -> None:
    """Qwen2 (Qwen2.5-7B) declares no embedding_modules in vLLM 0.32: decoder layers only.

    Qwen2.5-7B: hidden 3,584, 28 heads, 4 KV heads of 128, intermediate 18,944, 28 layers.
    """
    arch = load_model_arch(paths.CONFIGS / "qwen2.5-7b-instruct")
    assert arch.architecture == "Qwen2ForCausalLM"
    deployment = Deployment(
        gpu_memory_bytes=80 * GB, weights_bytes=16 * GB, overhead_bytes=4 * GB, lora=LoraSettings()
    )
    result = size_deployment(arch, deployment=deployment)
    assert not isinstance(result, Declined)
    qkv = 3 * 16 * 3584 + (3584 + 512 + 512) * 16
    o_proj = 16 * 3584 + 3584 * 16
    gate_up = 2 * 16 * 3584 + 2 * 18_944 * 16
    down = 16 * 18_944 + 3584 * 16
    assert result.lora_bytes == 28 * (qkv + o_proj + gate_up + down) * 2


def test_unknown_model_class_counts_embedding_buffers_and_says_so() -> None:
    """Without config.json's architectures the larger figure is taken, with a note."""
    arch = replace(load_model_arch(paths.CONFIGS / "llama-3.1-8b-instruct"), architecture=None)
    deployment = Deployment(
        gpu_memory_bytes=80 * GB, weights_bytes=16 * GB, overhead_bytes=4 * GB, lora=LoraSettings()
    )
    result = size_deployment(arch, deployment=deployment)
    assert not isinstance(result, Declined)
    assert result.lora_bytes == 92_356_608
    assert any(note.startswith("model class unknown") for note in result.assumptions)
