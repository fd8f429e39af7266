"""Specification of the derived capacity figures of one target over a window of snapshots."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.derive import (
    Sample,
    WindowSettings,
    derive_target,
    detect_restart,
    estimate_context,
    next_sample,
    sequences_that_fit,
)
from exporter.core.snapshot import CacheConfig, EngineMetrics, Histogram, VllmSnapshot
from exporter.core.windows import BucketCounts

INF = math.inf
TOKEN_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, INF)
WINDOWS = WindowSettings(context_seconds=600.0, rate_seconds=60.0)

# The real CPU server of the captures: 8 blocks of 128 tokens, 1,024 tokens reported.
CPU_CACHE = CacheConfig(num_gpu_blocks=8, block_size=128, kv_cache_size_tokens=1024)


def chain(*samples: Sample) -> list[Sample]:
    """Samples in poll order, each with the restart since the one before detected, as polled."""
    polled: list[Sample] = []
    for sample in samples:
        polled.append(next_sample(polled[-1] if polled else None, sample.t, sample.snapshot))
    return polled


def token_hist(bucket: int, n: int, each: float) -> Histogram:
    """A per-request token histogram with ``n`` observations of ``each`` in bucket ``bucket``."""
    cumulative = tuple(float(n) if i >= bucket else 0.0 for i in range(len(TOKEN_BOUNDS)))
    return Histogram(TOKEN_BOUNDS, cumulative, float(n), n * each)


def engine(
    *,
    finished: int = 0,
    preemptions: float = 0.0,
    usage: float = 0.0,
    waiting: float = 0.0,
    running: float = 0.0,
    cache: CacheConfig | None = CPU_CACHE,
    name: str = "0",
) -> EngineMetrics:
    """One engine after ``finished`` requests of 101 prompt + 380 output tokens."""
    return EngineMetrics(
        engine=name,
        model_name="tiny",
        requests_running=running,
        requests_waiting=waiting,
        kv_cache_usage_ratio=usage,
        preemptions_total=preemptions,
        requests_finished_total=float(finished),
        prompt_tokens=token_hist(7, finished, 101.0),
        generation_tokens=token_hist(8, finished, 380.0),
        cache_config=cache,
    )


def snap(*engines: EngineMetrics, start: float = 1000.0) -> VllmSnapshot:
    """A snapshot of the given engines from a server started at ``start``."""
    return VllmSnapshot(engines={e.engine: e for e in engines}, process_start_time_seconds=start)


def test_capacity_is_vllms_reported_tokens_and_usable_excludes_the_null_block() -> None:
    """1,024 tokens in 8 blocks: running requests can hold 7 blocks, 896 tokens."""
    derived = derive_target([Sample(0.0, snap(engine()))], windows=WINDOWS)
    (e,) = derived.engines
    assert e.kv_capacity_tokens == 1024
    assert e.kv_blocks == 8
    assert e.kv_usable_tokens == 896


def test_capacity_without_kv_cache_size_tokens_is_blocks_times_block_size() -> None:
    """Before vLLM 0.24 the capacity is num_gpu_blocks x block_size."""
    cache = CacheConfig(num_gpu_blocks=100, block_size=16)
    (e,) = derive_target([Sample(0.0, snap(engine(cache=cache)))], windows=WINDOWS).engines
    assert e.kv_capacity_tokens == 1600
    assert e.kv_usable_tokens == 99 * 16


def test_data_parallel_blocks_are_split_across_engines() -> None:
    """num_gpu_blocks is the sum over data-parallel engines, repeated on each: split it."""
    cache = CacheConfig(num_gpu_blocks=200, block_size=16)
    derived = derive_target(
        [Sample(0.0, snap(engine(cache=cache, name="0"), engine(cache=cache, name="1")))],
        windows=WINDOWS,
    )
    assert [e.engine for e in derived.engines] == ["0", "1"]
    assert [e.kv_capacity_tokens for e in derived.engines] == [1600, 1600]


def test_tokens_in_use_follow_the_usage_ratio_in_whole_blocks() -> None:
    """Usage 4/7 of the usable blocks is 4 blocks = 512 tokens used, 384 free."""
    (e,) = derive_target([Sample(0.0, snap(engine(usage=4 / 7)))], windows=WINDOWS).engines
    assert e.kv_used_tokens == 512
    assert e.kv_free_tokens == 384


def test_context_quantiles_come_from_requests_finished_in_the_window() -> None:
    """Twelve requests of 101 + 380 tokens: p95 is bracketed by the buckets they fell in."""
    samples = chain(Sample(0.0, snap(engine(finished=0))), Sample(30.0, snap(engine(finished=12))))
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.context is not None
    assert e.context.basis == "window"
    assert e.context.window_requests == 12
    assert e.context.mean == pytest.approx(481.0)
    p95 = e.context.quantiles[0.95]
    assert 100 + 200 <= p95 <= 200 + 500  # prompt in (100, 200], output in (200, 500]
    assert p95 >= 481  # the estimate errs on the safe side here


def test_context_falls_back_to_everything_since_start_when_the_window_is_empty() -> None:
    """With nothing finished in the window, the figures are vLLM's lifetime distribution."""
    samples = chain(
        Sample(0.0, snap(engine(finished=12))), Sample(700.0, snap(engine(finished=12)))
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.context is not None
    assert e.context.basis == "lifetime"
    assert e.context.window_requests == 0


def test_no_finished_requests_at_all_means_no_context_and_no_headroom() -> None:
    """An idle new server has no traffic to judge: context and headroom are absent, not 0."""
    (e,) = derive_target([Sample(0.0, snap(engine()))], windows=WINDOWS).engines
    assert e.context is None
    assert e.p95_ceiling_sequences is None
    assert e.p95_available_sequences is None


def test_headroom_counts_whole_p95_sequences_in_the_free_blocks() -> None:
    """Free 384 tokens hold no p95 sequence of ~680 tokens (6 blocks); the pool holds one."""
    samples = chain(
        Sample(0.0, snap(engine(finished=0))),
        Sample(30.0, snap(engine(finished=12, usage=4 / 7))),
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.context is not None
    blocks_per_sequence = math.ceil(e.context.quantiles[0.95] / 128)
    assert e.p95_ceiling_sequences == 7 // blocks_per_sequence
    assert e.p95_available_sequences == 3 // blocks_per_sequence
    assert e.mean_ceiling_sequences == 7 // math.ceil(481 / 128)


def test_headroom_ratio_is_zero_when_not_even_one_sequence_fits() -> None:
    """A p95 longer than the pool gives a ceiling of 0 and a ratio of 0, not a division error."""
    cache = CacheConfig(num_gpu_blocks=3, block_size=128, kv_cache_size_tokens=384)
    samples = chain(
        Sample(0.0, snap(engine(finished=0, cache=cache))),
        Sample(30.0, snap(engine(finished=12, cache=cache))),
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.p95_ceiling_sequences == 0
    assert e.p95_available_ratio == 0.0


def test_preemption_rate_is_the_increase_over_the_rate_window() -> None:
    """15 preemptions over 30 seconds are 0.5 per second and 1.25 per finished request."""
    samples = chain(
        Sample(0.0, snap(engine(finished=0, preemptions=0))),
        Sample(30.0, snap(engine(finished=12, preemptions=15))),
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.preemptions_per_second == pytest.approx(0.5)
    assert e.preemptions_per_finished_request == pytest.approx(1.25)
    assert e.finished_requests_per_second == pytest.approx(0.4)


def test_preemption_rate_never_goes_negative_or_spikes_across_a_restart() -> None:
    """After a restart the counters start from zero: the rate counts only what happened."""
    samples = chain(
        Sample(0.0, snap(engine(finished=100, preemptions=900), start=1000.0)),
        Sample(10.0, snap(engine(finished=0, preemptions=0), start=2000.0)),
        Sample(20.0, snap(engine(finished=2, preemptions=1), start=2000.0)),
    )
    derived = derive_target(samples, windows=WINDOWS)
    (e,) = derived.engines
    assert e.preemptions_per_second == pytest.approx(1 / 20)
    assert not derived.restarted


def test_restart_is_flagged_on_the_sample_that_follows_it() -> None:
    """The latest sample after a restart carries the restart flag (to refresh model facts)."""
    samples = chain(
        Sample(0.0, snap(engine(finished=5), start=1000.0)),
        Sample(10.0, snap(engine(finished=0), start=2000.0)),
    )
    assert derive_target(samples, windows=WINDOWS).restarted


def test_detect_restart_sees_counters_going_down_without_a_start_time() -> None:
    """Without process_start_time_seconds a counter going down still reveals a restart."""
    before = replace(snap(engine(finished=5)), process_start_time_seconds=None)
    after = replace(snap(engine(finished=1)), process_start_time_seconds=None)
    assert detect_restart(before, after)
    assert not detect_restart(before, before)


def test_context_after_a_restart_counts_requests_of_both_lifetimes() -> None:
    """Requests finished before and after a restart within the window all count."""
    samples = chain(
        Sample(0.0, snap(engine(finished=0), start=1000.0)),
        Sample(10.0, snap(engine(finished=4), start=1000.0)),
        Sample(20.0, snap(engine(finished=3), start=2000.0)),
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.context is not None
    assert e.context.window_requests == 7


def test_prediction_error_is_relative_to_the_actual_capacity() -> None:
    """Predicting 1,126 tokens for an actual 1,024 is a +10% error."""
    derived = derive_target(
        [Sample(0.0, snap(engine()))], windows=WINDOWS, predicted_capacity_tokens=1126.4
    )
    assert derived.engines[0].kv_capacity_error_ratio == pytest.approx(0.1)


def test_prediction_stands_in_for_headroom_when_vllm_reports_no_capacity() -> None:
    """vLLM 0.8.x labels num_gpu_blocks "None": headroom uses the prediction instead."""
    cache = CacheConfig(num_gpu_blocks=None, block_size=16)
    samples = chain(
        Sample(0.0, snap(engine(finished=0, cache=cache))),
        Sample(30.0, snap(engine(finished=12, cache=cache))),
    )
    (e,) = derive_target(samples, windows=WINDOWS, predicted_capacity_tokens=16_000).engines
    assert e.kv_capacity_tokens is None
    assert e.kv_capacity_error_ratio is None
    assert e.p95_ceiling_sequences is not None
    assert e.p95_ceiling_sequences > 0


def test_context_is_capped_at_max_model_len() -> None:
    """No request is longer than max_model_len, whatever the bucket interpolation says."""
    prompt = BucketCounts(TOKEN_BOUNDS, (0, 0, 0, 0, 0, 0, 0, 0, 10, 0), 4000.0)
    context = estimate_context(
        prompt, prompt, window_requests=10, basis="window", max_model_len=512
    )
    assert context is not None
    assert max(context.quantiles.values()) == 512


def test_no_targets_samples_derive_nothing() -> None:
    """Before the first successful poll there is nothing to derive."""
    assert derive_target([], windows=WINDOWS).engines == ()


@given(st.floats(0, 1e7), st.floats(1, 1e6), st.sampled_from([1, 16, 128]))
def test_sequences_never_exceed_tokens_over_context(
    tokens: float, context: float, block_size: int
) -> None:
    """Sequences that fit never exceed tokens / context (block rounding only lowers it)."""
    assert sequences_that_fit(tokens, context, block_size) <= tokens / context + 1e-9
