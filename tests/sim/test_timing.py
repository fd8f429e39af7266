"""The step cost model: decode is memory-bound, prefill compute-bound, numbers plausible."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.sim.scenario import default_scenario, kv_cache_size_tokens
from exporter.sim.timing import step_duration_s

SCENARIO = default_scenario()
GPU, MODEL = SCENARIO.gpu, SCENARIO.model


def duration(tokens: int, context: int) -> float:
    """Step time on the default simulated H100 with the default model."""
    return step_duration_s(GPU, MODEL, scheduled_tokens=tokens, context_tokens=context)


def test_single_stream_decode_speed_is_plausible_for_an_8b_model_on_h100() -> None:
    """One sequence decodes at 80-200 tokens/s (weights streamed once per token)."""
    assert 80 <= 1 / duration(1, 1000) <= 200


def test_full_pool_decode_batch_is_memory_bound() -> None:
    """A decode batch attending to the whole KV pool takes 20-50 ms, set by bytes, not FLOPs."""
    step = duration(100, kv_cache_size_tokens(SCENARIO))
    assert 0.020 <= step <= 0.050
    # Doubling the tokens of a small batch costs nothing: memory time dominates.
    assert duration(100, 10_000) == duration(50, 10_000)


def test_prefill_chunk_is_compute_bound() -> None:
    """A full 8,192-token prefill chunk runs at 10k-40k prompt tokens/s and scales with tokens."""
    chunk = SCENARIO.engine.max_num_batched_tokens
    assert 10_000 <= chunk / duration(chunk, chunk) <= 40_000
    assert duration(chunk, chunk) > 1.9 * duration(chunk // 2, chunk // 2) - GPU.step_overhead_s


@given(
    tokens=st.integers(1, 20_000),
    context=st.integers(1, 500_000),
    more_tokens=st.integers(0, 5_000),
    more_context=st.integers(0, 50_000),
)
def test_more_work_never_takes_less_time(
    tokens: int, context: int, more_tokens: int, more_context: int
) -> None:
    """Step time is at least the fixed overhead and grows with tokens and context."""
    base = duration(tokens, context)
    assert base >= GPU.step_overhead_s
    assert duration(tokens + more_tokens, context + more_context) >= base
