"""Specification of speculative decoding's memory (SpeculativeDecoding in exporter.sizing.model).

vLLM 0.32 loads the drafter into the target's runner; its attention layers join the target's in
one KV-cache group when both are all full attention, so a token costs both models' KV bytes, and
each running sequence reserves ``num_speculative_tokens`` lookahead slots. Worked by hand from the
published configs in the catalogue (Qwen3-32B: 64 layers, 8 KV heads of 128; Qwen3-0.6B: 28
layers, 8 KV heads of 128; DeepSeek-V3: 61 MLA layers of 512 + 64).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.errors import UsageError
from exporter.sizing.lookup import find_model_arch
from exporter.sizing.model import (
    Declined,
    Deployment,
    SizingResult,
    SpeculativeDecoding,
    size_deployment,
)
from exporter.sizing.modelconfig import load_model_arch
from tests import paths

GIB = 2**30
H100 = Deployment(gpu_memory_bytes=int(79.19 * GIB), max_model_len=8192)


def sized(model: str, deployment: Deployment) -> SizingResult:
    """Size a catalogue model and insist it was not declined."""
    outcome = size_deployment(find_model_arch(model).arch, deployment=deployment)
    assert not isinstance(outcome, Declined), outcome
    return outcome


def draft(model: str, tokens: int = 4) -> SpeculativeDecoding:
    """A draft model from the catalogue, with its checkpoint size if the catalogue knows it."""
    found = find_model_arch(model)
    return SpeculativeDecoding(
        num_speculative_tokens=tokens, draft=found.arch, draft_weights_bytes=found.weights_bytes
    )


def test_a_draft_models_kv_is_added_to_every_token() -> None:
    """Qwen3-32B with Qwen3-0.6B drafting: 262,144 + 114,688 = 376,832 bytes per token."""
    plain = sized("qwen3-32b", H100)
    spec = sized("qwen3-32b", replace(H100, speculative=draft("qwen3-0.6b")))
    assert plain.bytes_per_token == 64 * 2 * 8 * 128 * 2 == 262_144
    assert spec.draft_bytes_per_token == 28 * 2 * 8 * 128 * 2 == 114_688
    assert spec.bytes_per_token == 376_832
    assert spec.block_bytes == 16 * 376_832


def test_a_draft_models_weights_come_out_of_the_budget() -> None:
    """The draft's weights are added to the GPU's, and the budget shrinks by them."""
    plain = sized("qwen3-32b", H100)
    spec = sized("qwen3-32b", replace(H100, speculative=draft("qwen3-0.6b")))
    assert spec.draft_weights_bytes > 0
    assert spec.weights_bytes == plain.weights_bytes + spec.draft_weights_bytes
    assert plain.kv_budget_bytes - spec.kv_budget_bytes == spec.draft_weights_bytes


def test_lookahead_slots_add_to_each_sequence() -> None:
    """4 speculative tokens: a 2,000-token sequence holds ceil(2,004 / 16) = 126 blocks."""
    spec = sized("qwen3-32b", replace(H100, speculative=draft("qwen3-0.6b", tokens=4)))
    assert spec.lookahead_tokens == 4
    assert spec.blocks_per_sequence(2000) == 126
    assert spec.blocks_per_sequence(2000 - 4) == 125


def test_mtp_layers_have_the_targets_kv_shape() -> None:
    """DeepSeek-V3 with its one MTP layer: (61 + 1) x 576 x 2 = 71,424 bytes per token."""
    deployment = Deployment(gpu_memory_bytes=int(139.94 * GIB), tensor_parallel=8)
    plain = sized("deepseek-v3", deployment)
    mtp = sized(
        "deepseek-v3",
        replace(
            deployment, speculative=SpeculativeDecoding(num_speculative_tokens=1, mtp_layers=1)
        ),
    )
    assert plain.bytes_per_token == 61 * 576 * 2
    assert mtp.draft_bytes_per_token == 576 * 2
    assert mtp.bytes_per_token == 71_424
    # One MTP layer weighs about one of the 61 decoder layers (fp8, TP 8) plus its bf16 eh_proj.
    eh_proj = 2 * 7168 * 7168 * 2
    assert mtp.draft_weights_bytes > eh_proj
    assert mtp.draft_weights_bytes < plain.weights_bytes / 40


def test_sliding_window_models_are_declined() -> None:
    """Gemma 2's sliding layers would put the drafter in its own group: declined, with why."""
    outcome = size_deployment(
        find_model_arch("gemma-2-9b").arch,
        deployment=replace(H100, speculative=draft("qwen3-0.6b")),
    )
    assert isinstance(outcome, Declined)
    assert "speculative decoding" in outcome.reason


def test_pipeline_parallelism_is_declined() -> None:
    """Where vLLM puts the drafter's layers across stages is not modelled."""
    outcome = size_deployment(
        find_model_arch("qwen3-32b").arch,
        deployment=replace(H100, pipeline_parallel=2, speculative=draft("qwen3-0.6b")),
    )
    assert isinstance(outcome, Declined)
    assert "--pp 1" in outcome.reason


def test_no_speculative_tokens_is_refused() -> None:
    """vLLM needs at least one speculative token."""
    with pytest.raises(UsageError, match="--num-speculative-tokens"):
        sized("qwen3-32b", replace(H100, speculative=draft("qwen3-0.6b", tokens=0)))


def test_mtp_layers_beyond_the_checkpoints_are_refused() -> None:
    """DeepSeek-V3's config.json ships num_nextn_predict_layers 1: asking for 2 is refused."""
    arch = load_model_arch(paths.CONFIGS / "deepseek-v3")
    assert arch.mtp_layers == 1
    deployment = Deployment(
        gpu_memory_bytes=int(139.94 * GIB),
        tensor_parallel=8,
        speculative=SpeculativeDecoding(num_speculative_tokens=2, mtp_layers=2),
    )
    with pytest.raises(UsageError, match="num_nextn_predict_layers 1"):
        size_deployment(arch, deployment=deployment)
    fits = replace(deployment, speculative=SpeculativeDecoding(1, mtp_layers=1))
    assert not isinstance(size_deployment(arch, deployment=fits), Declined)
