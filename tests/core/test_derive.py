"""Specification of the derived capacity figures of one target over a window of snapshots."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.ceiling import QueueCaps, RunningLimit
from exporter.core.context import estimate_context_quantiles
from exporter.core.derive import (
    COUNTER_CEILINGS_PER_SECOND,
    Counted,
    EngineDerived,
    Sample,
    WindowSettings,
    carried,
    derive_target,
    detect_restart,
    next_sample,
    restart_baseline,
    restart_evidence,
    sequences_that_fit,
)
from exporter.core.reasons import Limit, MaxNumSeqsSource
from exporter.core.snapshot import CacheConfig, EngineMetrics, Histogram, VllmSnapshot
from exporter.testing.fakevllm import VllmState, render_metrics
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

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


def test_preemptions_per_finished_request_is_absent_when_nothing_finished() -> None:
    """Traffic stopped: 0 preemptions per second, and no ratio of 0 over 0.

    docs/metrics.md: "absent when none finished", with or without preemptions in the window.
    """
    idle = chain(
        Sample(0.0, snap(engine(finished=12, preemptions=15))),
        Sample(30.0, snap(engine(finished=12, preemptions=15))),
    )
    (e,) = derive_target(idle, windows=WINDOWS).engines
    assert e.preemptions_per_second == 0.0
    assert e.preemptions_per_finished_request is None
    stuck = chain(
        Sample(0.0, snap(engine(finished=12, preemptions=15))),
        Sample(30.0, snap(engine(finished=12, preemptions=18))),
    )
    (e,) = derive_target(stuck, windows=WINDOWS).engines
    assert e.preemptions_per_finished_request is None


def test_an_engine_that_joins_mid_window_is_rated_over_the_time_it_was_read() -> None:
    """A data-parallel engine joining mid-window is rated from its first read, never spiking.

    Engine 1 joins engine 0 under one process: its first rate is its increase over the 5 s it
    was read in (8 preemptions: 1.6 a second), not over the target's 60 s window (0.13 a
    second: 12 times too low for its first minute).
    """

    def joining(*, finished: int, preempted: float) -> EngineMetrics:
        return engine(name="1", finished=finished, preemptions=preempted)

    samples = [
        Sample(t, snap(engine(finished=int(t), preemptions=t)))
        for t in (0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0)
    ]
    samples += [
        Sample(
            55.0, snap(engine(finished=55, preemptions=55), joining(finished=90, preempted=100))
        ),
        Sample(
            60.0, snap(engine(finished=60, preemptions=60), joining(finished=96, preempted=108))
        ),
    ]
    joined = derive_target(chain(*samples[:-1]), windows=WINDOWS).engines[1]
    assert joined.preemptions_per_second is None  # one read: no rate yet, and no spike
    zero, one = derive_target(chain(*samples), windows=WINDOWS).engines
    assert zero.preemptions_per_second == pytest.approx(1.0)
    assert one.preemptions_per_second == pytest.approx(8 / 5)
    assert one.finished_requests_per_second == pytest.approx(6 / 5)
    assert one.preemptions_per_finished_request == pytest.approx(8 / 6)


def test_a_read_gap_across_the_window_start_keeps_its_increase_in_the_rate() -> None:
    """A read gap longer than the rate window: the rate is the average since the read before.

    vLLM unanswered for 100 s, then 90 more preemptions: 90 over 100 s, not none, and not the
    last 5 s alone.
    """
    seconds = WINDOWS.rate_seconds
    samples = chain(
        Sample(0.0, snap(engine(finished=0, preemptions=0))),
        Sample(5.0, snap(engine(finished=0, preemptions=10))),
        Sample(5.0 + seconds + 40.0, snap(engine(finished=30, preemptions=100))),
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.preemptions_per_second == pytest.approx(90 / (seconds + 40.0))
    assert e.finished_requests_per_second == pytest.approx(30 / (seconds + 40.0))
    later = chain(*samples, Sample(samples[-1].t + 5.0, snap(engine(finished=30, preemptions=101))))
    (e,) = derive_target(later, windows=WINDOWS).engines
    assert e.preemptions_per_second == pytest.approx(91 / (seconds + 45.0))


def test_the_rate_window_reaches_back_to_the_read_that_covers_its_start() -> None:
    """The window's start falls between two reads: what they counted is in the rate.

    Reads every 10 s, the last 5 s after one: 30 preemptions counted between the two reads
    around the window's start, over the time since the earlier.
    """
    seconds = WINDOWS.rate_seconds
    times = [*(10.0 * i for i in range(int(seconds / 10) + 2)), seconds + 25.0]
    start = times[-1] - seconds
    counted = [0.0 if t <= start - 5.0 else 30.0 for t in times]
    samples = chain(
        *(Sample(t, snap(engine(preemptions=c))) for t, c in zip(times, counted, strict=True))
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.preemptions_per_second == pytest.approx(30 / (seconds + 5.0))


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


def test_a_counter_a_hair_lower_under_the_same_start_time_is_no_restart() -> None:
    """Float noise (multiprocess prometheus_client sums files) is not a counter going down.

    Read as one, it refused the target for 60 s and emptied its window under a start time,
    and without one counted a restart and the whole lifetime again as the increase.
    """
    before = snap(engine(finished=97, preemptions=105.0), start=1000.0)
    after = snap(engine(finished=97, preemptions=105.0 - 1e-9), start=1000.0)
    assert restart_evidence(before, after) is None
    unstarted = [replace(s, process_start_time_seconds=None) for s in (before, after)]
    assert restart_evidence(*unstarted) is None
    samples = chain(Sample(0.0, unstarted[0]), Sample(5.0, unstarted[1]))
    derived = derive_target(samples, windows=WINDOWS)
    assert not derived.restarted
    assert derived.engines[0].preemptions_per_second == 0.0
    assert restart_evidence(before, snap(engine(finished=97, preemptions=104.0), start=1000.0))


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
    """No request is longer than max_model_len, whatever the buckets would allow."""
    long = replace(
        engine(finished=10),
        prompt_tokens=token_hist(8, 10, 400.0),
        generation_tokens=token_hist(8, 10, 400.0),
    )
    samples = chain(Sample(0.0, snap(engine())), Sample(30.0, snap(long)))
    (e,) = derive_target(samples, windows=WINDOWS, max_model_len=512).engines
    assert e.context is not None
    assert max(e.context.quantiles.values()) == 512
    assert e.context_mean_tokens == 512


def test_a_constant_shape_is_exact_however_wide_its_buckets() -> None:
    """Requests of 101 + 380 tokens finishing over several polls: p95 is 481, not 680."""
    samples = chain(*(Sample(5.0 * i, snap(engine(finished=2 * i))) for i in range(6)))
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.context_p95_tokens == pytest.approx(481.0)
    assert e.context_mean_tokens == pytest.approx(481.0)


def test_no_targets_samples_derive_nothing() -> None:
    """Before the first successful poll there is nothing to derive."""
    assert derive_target([], windows=WINDOWS).engines == ()


@given(st.floats(0, 1e7), st.floats(1, 1e6), st.sampled_from([1, 16, 128]))
def test_sequences_never_exceed_tokens_over_context(
    tokens: float, context: float, block_size: int
) -> None:
    """Sequences that fit never exceed tokens / context (block rounding only lowers it)."""
    assert sequences_that_fit(tokens, context, block_size) <= tokens / context + 1e-9


# --- every limit of the scheduler, not only the KV pool ----------------------------------------


def limited(limit: int) -> RunningLimit:
    """A max_num_seqs learnt from vLLM's command line."""
    return RunningLimit(limit, MaxNumSeqsSource.COMMAND_LINE)


def test_max_num_seqs_caps_the_ceiling_and_is_named() -> None:
    """Short requests fit the pool many times over: --max-num-seqs 2 is the ceiling."""
    small = replace(engine(finished=10), prompt_tokens=token_hist(2, 10, 4.0))
    small = replace(small, generation_tokens=token_hist(2, 10, 4.0))
    derived = derive_target([Sample(0.0, snap(small))], windows=WINDOWS, running_limit=limited(2))
    (e,) = derived.engines
    assert e.p95_kv_ceiling_sequences == 7.0  # one block each, 7 usable blocks
    assert e.p95_ceiling_sequences == 2.0
    assert e.p95_ceiling_limit == Limit.MAX_NUM_SEQS
    assert e.p95_ceiling_limited_by == {
        "kv_cache": 0.0,
        "max_num_seqs": 1.0,
        "engine_asleep": 0.0,
        "queue_cap": 0.0,
    }
    assert e.max_num_seqs_by_source == {"command_line": 2.0}


def test_headroom_is_zero_when_the_scheduler_is_full_however_free_the_pool() -> None:
    """2 running under --max-num-seqs 2 with the pool nearly empty: 0 more, limited by it."""
    busy = replace(engine(finished=10, running=2, waiting=5, usage=2 / 7))
    busy = replace(
        busy, prompt_tokens=token_hist(2, 10, 4.0), generation_tokens=token_hist(2, 10, 4.0)
    )
    (e,) = derive_target(
        [Sample(0.0, snap(busy))], windows=WINDOWS, running_limit=limited(2)
    ).engines
    assert e.p95_kv_available_sequences == 5.0
    assert e.p95_available_sequences == 0.0
    assert e.p95_available_limit == Limit.MAX_NUM_SEQS
    assert e.p95_available_ratio == 0.0


def capped(limit: int, *, requests: int | None = None, tokens: int | None = None) -> RunningLimit:
    """A max_num_seqs and the admission caps, learnt from vLLM's command line."""
    return replace(limited(limit), queue_caps=QueueCaps(requests=requests, tokens=tokens))


def test_a_full_admission_cap_stops_the_headroom_over_every_engine_of_the_server() -> None:
    """--max-num-queued-reqs 6: 2 running + 1 waiting on each of two engines, so 0 more."""
    busy = [
        engine(finished=10, running=2, waiting=1, usage=2 / 7, name=name) for name in ("0", "1")
    ]
    derived = derive_target(
        [Sample(0.0, snap(*busy))], windows=WINDOWS, running_limit=capped(256, requests=6)
    )
    for e in derived.engines:
        assert e.p95_available_sequences == 0.0
        assert e.p95_available_limit == Limit.QUEUE_CAP
        assert e.p95_available_limited_by["queue_cap"] == 1.0


def test_a_cap_under_max_num_seqs_is_the_ceiling() -> None:
    """--max-num-queued-reqs 3 under --max-num-seqs 256 and a pool of 7: 3, the queue cap."""
    small = replace(engine(finished=10), prompt_tokens=token_hist(2, 10, 4.0))
    small = replace(small, generation_tokens=token_hist(2, 10, 4.0))
    derived = derive_target(
        [Sample(0.0, snap(small))], windows=WINDOWS, running_limit=capped(256, requests=3)
    )
    (e,) = derived.engines
    assert (e.p95_ceiling_sequences, e.p95_ceiling_limit) == (3.0, Limit.QUEUE_CAP)
    assert e.mean_ceiling_sequences == 3.0


def test_rejections_in_the_window_stop_the_headroom_at_an_undeclared_cap() -> None:
    """vLLM refused 10 requests in 20 s (a token cap): 0 more, limited by the queue cap."""
    first = replace(snap(engine(finished=10)), admission_rejections_total=5.0)
    second = replace(snap(engine(finished=10)), admission_rejections_total=15.0)
    derived = derive_target(chain(Sample(0.0, first), Sample(20.0, second)), windows=WINDOWS)
    (e,) = derived.engines
    assert (e.p95_available_sequences, e.p95_available_limit) == (0.0, Limit.QUEUE_CAP)
    quiet = replace(snap(engine(finished=10)), admission_rejections_total=15.0)
    (e,) = derive_target(chain(Sample(0.0, second), Sample(20.0, quiet)), windows=WINDOWS).engines
    assert e.p95_available_limit == Limit.KV_CACHE


def test_without_a_limit_the_kv_pool_alone_decides() -> None:
    """No max_num_seqs known: the ceiling is the pool's, named kv_cache."""
    (e,) = derive_target([Sample(0.0, snap(engine(finished=10)))], windows=WINDOWS).engines
    assert e.p95_ceiling_sequences == e.p95_kv_ceiling_sequences
    assert e.p95_ceiling_limit == Limit.KV_CACHE
    assert e.max_num_seqs_by_source == {}


def test_a_sleeping_engine_has_no_ceiling_and_no_headroom() -> None:
    """engine_sleep_state awake=0: the ceiling and headroom are 0, limited by the sleep."""
    asleep = replace(
        engine(finished=10),
        sleep_state={"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0},
    )
    (e,) = derive_target(
        [Sample(0.0, snap(asleep))], windows=WINDOWS, running_limit=limited(8)
    ).engines
    assert e.asleep is True
    assert e.engine_asleep == 1.0
    assert e.p95_ceiling_sequences == 0.0
    assert e.p95_available_sequences == 0.0
    assert e.p95_ceiling_limit == Limit.ENGINE_ASLEEP
    assert e.kv_free_tokens == 0.0  # the pool is configured (usable), but nothing is free
    assert e.kv_usable_tokens is not None
    assert e.kv_usable_tokens > 0
    awake = replace(
        asleep, sleep_state={"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    )
    (e,) = derive_target([Sample(0.0, snap(awake))], windows=WINDOWS).engines
    assert e.engine_asleep == 0.0
    assert e.p95_ceiling_limit == Limit.KV_CACHE
    assert e.kv_free_tokens is not None
    assert e.kv_free_tokens > 0


def test_sleep_state_absent_before_0_12_means_unknown_not_asleep() -> None:
    """No vllm:engine_sleep_state: the engine is taken as awake, the gauge absent."""
    (e,) = derive_target([Sample(0.0, snap(engine(finished=10)))], windows=WINDOWS).engines
    assert e.asleep is None
    assert e.engine_asleep is None


# --- sequences versus requests (n > 1) ----------------------------------------------------------

N_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, INF)


def params_n(requests: int, n: int) -> Histogram:
    """``vllm:request_params_n`` after ``requests`` requests of ``n`` each."""
    index = N_BOUNDS.index(next(b for b in N_BOUNDS if n <= b))
    cumulative = tuple(float(requests) if i >= index else 0.0 for i in range(len(N_BOUNDS)))
    return Histogram(N_BOUNDS, cumulative, float(requests), float(requests * n))


def test_n_2_requests_count_twice_as_sequences_and_once_as_requests() -> None:
    """V1 runs an n=2 request as 2 sequences: 4 running sequences are 2 running requests."""
    e0 = replace(engine(finished=20, running=4), request_params_n=params_n(10, 2))
    (e,) = derive_target([Sample(0.0, snap(e0))], windows=WINDOWS).engines
    assert e.sequences_per_request == 2.0
    assert e.sequences_running == 4.0
    assert e.requests_running == 2.0


def test_headroom_in_requests_divides_by_the_mean_n() -> None:
    """6 more sequences fit and each request holds 2: 3 more requests."""
    e0 = replace(
        engine(finished=20, running=0),
        prompt_tokens=token_hist(2, 20, 4.0),
        generation_tokens=token_hist(2, 20, 4.0),
        request_params_n=params_n(10, 2),
    )
    (e,) = derive_target([Sample(0.0, snap(e0))], windows=WINDOWS, running_limit=limited(6)).engines
    assert e.p95_available_sequences == 6.0
    assert e.p95_available_requests == 3.0


def test_v0_counts_requests_so_sequences_are_requests_times_n() -> None:
    """V0 (num_requests_swapped exposed) counts sequence groups: 2 running requests of n=2."""
    e0 = replace(
        engine(finished=20, running=2), requests_swapped=0.0, request_params_n=params_n(10, 2)
    )
    (e,) = derive_target([Sample(0.0, snap(e0))], windows=WINDOWS).engines
    assert e.requests_running == 2.0
    assert e.sequences_running == 4.0


def test_mean_n_comes_from_the_window_not_the_lifetime() -> None:
    """10 requests of n=1 before the window, 10 of n=4 inside it: the window's n is 4."""
    before = replace(engine(finished=10), request_params_n=params_n(10, 1))
    inside = replace(
        engine(finished=50),
        request_params_n=Histogram(
            N_BOUNDS, (10.0, 10.0, 20.0, 20.0, 20.0, 20.0), 20.0, 10.0 + 40.0
        ),
    )
    samples = chain(Sample(0.0, snap(before)), Sample(30.0, snap(inside)))
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.sequences_per_request == 4.0


# --- prefix sharing -----------------------------------------------------------------------------


def sharing(
    *, finished: int, queries: float, hits: float, running: float = 0.0, usage: float = 0.0
) -> EngineMetrics:
    """Requests of a 384-token shared prefix + 64 own prompt tokens + 64 output tokens."""
    return replace(
        engine(finished=finished, running=running, usage=usage),
        prompt_tokens=Histogram(
            TOKEN_BOUNDS, (0,) * 8 + (float(finished),) * 2, float(finished), finished * 448.0
        ),
        generation_tokens=Histogram(
            TOKEN_BOUNDS, (0,) * 6 + (float(finished),) * 4, float(finished), finished * 64.0
        ),
        prefix_cache_queries_total=queries,
        prefix_cache_hits_total=hits,
    )


def test_shared_prefixes_raise_the_effective_ceiling_above_the_unshared_one() -> None:
    """Every request hits its 384-token prefix: 4 sequences share 3 blocks, 1 block each."""
    before = sharing(finished=0, queries=0.0, hits=0.0)
    after = sharing(finished=10, queries=4480.0, hits=3840.0, running=4, usage=1.0)
    samples = chain(Sample(0.0, snap(before)), Sample(30.0, snap(after)))
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.prefix_cache_hit_ratio == pytest.approx(3840 / 4480)
    assert e.shared_prefix_tokens == pytest.approx(384.0)
    assert e.p95_kv_ceiling_sequences is not None
    assert e.p95_effective_ceiling_sequences is not None
    assert e.p95_effective_ceiling_sequences > e.p95_kv_ceiling_sequences
    # 896 usable tokens: the 384 shared once, then one own block of 128 per sequence.
    context = e.context_p95_tokens
    assert context is not None
    own = math.ceil(context / 128) * 128 - 384
    assert e.p95_effective_ceiling_sequences == math.floor((896 - 384) / own)
    assert e.kv_tokens_per_running_sequence == pytest.approx(896 / 4)


def test_no_prefix_hits_means_the_effective_ceiling_is_the_unshared_one() -> None:
    """A hit ratio of 0 shares nothing: both ceilings agree."""
    before = sharing(finished=0, queries=0.0, hits=0.0)
    after = sharing(finished=10, queries=4480.0, hits=0.0)
    (e,) = derive_target(
        chain(Sample(0.0, snap(before)), Sample(30.0, snap(after))), windows=WINDOWS
    ).engines
    assert e.prefix_cache_hit_ratio == 0.0
    assert e.p95_effective_ceiling_sequences == e.p95_kv_ceiling_sequences


def test_the_effective_ceiling_is_capped_by_max_num_seqs_too() -> None:
    """Sharing cannot lift the ceiling past the scheduler's limit."""
    before = sharing(finished=0, queries=0.0, hits=0.0)
    after = sharing(finished=10, queries=4480.0, hits=3840.0)
    samples = chain(Sample(0.0, snap(before)), Sample(30.0, snap(after)))
    (e,) = derive_target(samples, windows=WINDOWS, running_limit=limited(2)).engines
    assert e.p95_effective_ceiling_sequences == 2.0


def test_without_prefix_cache_counters_there_is_no_effective_figure() -> None:
    """Before vLLM exposes prefix cache counters the effective figures are absent, not guessed."""
    (e,) = derive_target([Sample(0.0, snap(engine(finished=10)))], windows=WINDOWS).engines
    assert e.prefix_cache_hit_ratio is None
    assert e.p95_effective_ceiling_sequences is None
    assert e.kv_tokens_per_running_sequence is None  # nothing running


def test_cached_prompt_share_by_source_over_the_window() -> None:
    """600 of 1,000 prompt tokens in the window came from host memory: host 0.6, device 0."""

    def cached(prompt: float, host: float) -> EngineMetrics:
        return replace(
            engine(finished=1),
            prompt_tokens_total=prompt,
            prompt_tokens_cached_by_source={"device": 0.0, "host": host},
        )

    samples = chain(
        Sample(0.0, snap(cached(500.0, 100.0))), Sample(30.0, snap(cached(1500.0, 700.0)))
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.prompt_tokens_cached_ratio_by_source == {"device": 0.0, "host": 0.6}


def test_prompt_tokens_by_origin_keep_pd_transfers_apart_from_the_gpu_pool() -> None:
    """A P/D decode instance: 800 of 1,000 prompt tokens in the window came over a KV connector."""

    def by_source(prompt: float, computed: float, hit: float, transferred: float) -> EngineMetrics:
        return replace(
            engine(finished=1),
            prompt_tokens_total=prompt,
            prompt_tokens_by_source={
                "local_compute": computed,
                "local_cache_hit": hit,
                "external_kv_transfer": transferred,
            },
        )

    samples = chain(
        Sample(0.0, snap(by_source(500.0, 500.0, 0.0, 0.0))),
        Sample(30.0, snap(by_source(1500.0, 600.0, 100.0, 800.0))),
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.prompt_tokens_ratio_by_source == {
        "local_compute": 0.1,
        "local_cache_hit": 0.1,
        "external_kv_transfer": 0.8,
    }


# --- the KV offload tier, kept apart from the GPU pool ---------------------------------------


def test_the_offload_pool_counts_in_the_effective_capacity_never_in_the_headroom() -> None:
    """32 offload blocks of the 1,024-token pool's 128 tokens: 4,096 more tokens to keep.

    The headroom stays that of the GPU pool: an offloaded block runs nothing until loaded back.
    """
    plain = derive_target([Sample(0.0, snap(engine(finished=4)))], windows=WINDOWS).engines[0]
    offloading = replace(engine(finished=4), kv_offload_capacity_blocks=32)
    (e,) = derive_target([Sample(0.0, snap(offloading))], windows=WINDOWS).engines
    assert e.kv_offload_capacity_blocks == 32
    assert e.kv_offload_capacity_tokens == 32 * 128
    assert e.kv_effective_capacity_tokens == 1024 + 32 * 128
    assert e.kv_capacity_tokens == plain.kv_capacity_tokens == 1024
    assert e.p95_ceiling_sequences == plain.p95_ceiling_sequences is not None
    assert e.p95_available_sequences == plain.p95_available_sequences


def test_an_offload_block_holds_the_gpu_pools_tokens_per_block_on_hybrid_models() -> None:
    """3,000 tokens in 100 blocks of 16 (sliding-window groups): an offload block holds 30."""
    hybrid = CacheConfig(num_gpu_blocks=100, block_size=16, kv_cache_size_tokens=3000)
    offloading = replace(engine(cache=hybrid), kv_offload_capacity_blocks=50)
    (e,) = derive_target([Sample(0.0, snap(offloading))], windows=WINDOWS).engines
    assert e.kv_offload_capacity_tokens == 1500
    assert e.kv_effective_capacity_tokens == 4500


def test_the_offload_pool_of_each_data_parallel_engine_is_its_own() -> None:
    """num_gpu_blocks is summed over engines; each engine's offload pool is per engine."""
    cache = CacheConfig(num_gpu_blocks=200, block_size=16)
    engines = [replace(engine(cache=cache, name=n), kv_offload_capacity_blocks=10) for n in "01"]
    derived = derive_target([Sample(0.0, snap(*engines))], windows=WINDOWS)
    assert [e.kv_offload_capacity_tokens for e in derived.engines] == [160, 160]


def test_033s_cache_config_names_the_pool_when_the_info_gauge_is_absent() -> None:
    """simple_cpu_offload_num_blocks stands in; the scheduler's own info gauge wins over it."""
    cache = replace(CPU_CACHE, simple_cpu_offload_num_blocks=16)
    from_config = derive_target([Sample(0.0, snap(engine(cache=cache)))], windows=WINDOWS)
    assert from_config.engines[0].kv_offload_capacity_tokens == 16 * 128
    both = replace(engine(cache=cache), kv_offload_capacity_blocks=8)
    from_info = derive_target([Sample(0.0, snap(both))], windows=WINDOWS)
    assert from_info.engines[0].kv_offload_capacity_tokens == 8 * 128


def test_without_an_offload_pool_of_known_size_there_is_no_effective_capacity() -> None:
    """No connector, or one that writes no size (OffloadingConnector, LMCache): absent."""
    (e,) = derive_target([Sample(0.0, snap(engine()))], windows=WINDOWS).engines
    assert (e.kv_offload_capacity_tokens, e.kv_effective_capacity_tokens) == (None, None)
    unknown_pool = replace(engine(cache=None), kv_offload_capacity_blocks=32)
    (e,) = derive_target([Sample(0.0, snap(unknown_pool))], windows=WINDOWS).engines
    assert e.kv_offload_capacity_blocks == 32
    assert (e.kv_offload_capacity_tokens, e.kv_effective_capacity_tokens) == (None, None)


def test_kv_fetch_stages_are_passed_through_per_engine() -> None:
    """Waiting requests by async KV load stage, as vLLM counts them."""
    stages = {"waiting_to_start": 2.0, "in_progress": 1.0, "completed_waiting": 0.0}
    fetching = replace(engine(), requests_kv_fetch_by_stage=stages)
    (e,) = derive_target([Sample(0.0, snap(fetching))], windows=WINDOWS).engines
    assert e.requests_kv_fetch_by_stage == stages


def test_admission_rejections_are_a_rate_per_server() -> None:
    """10 queue-limit refusals in 20 s: 0.5 per second; absent where vLLM does not count them."""
    first = replace(snap(engine()), admission_rejections_total=5.0)
    second = replace(snap(engine()), admission_rejections_total=15.0)
    derived = derive_target(chain(Sample(0.0, first), Sample(20.0, second)), windows=WINDOWS)
    assert derived.admission_rejections_per_second == 0.5
    plain = derive_target(
        chain(Sample(0.0, snap(engine())), Sample(20.0, snap(engine()))), windows=WINDOWS
    )
    assert plain.admission_rejections_per_second is None


def refusals(reqs: float, tokens: float, *, start: float = 1000.0) -> VllmSnapshot:
    """One engine's server that refused ``reqs`` at the request cap and ``tokens`` at the other."""
    by_reason = {"max_num_queued_reqs": reqs, "max_num_queued_tokens": tokens}
    return replace(
        snap(engine(), start=start),
        admission_rejections_total=reqs + tokens,
        admission_rejections_by_reason=by_reason,
    )


def test_admission_rejections_are_a_rate_per_reason_too() -> None:
    """10 refusals at the request cap in 20 s, none at the token cap: 0.5 and 0 per second."""
    samples = chain(Sample(0.0, refusals(5, 3)), Sample(20.0, refusals(15, 3)))
    derived = derive_target(samples, windows=WINDOWS)
    assert derived.admission_rejections_by_reason_per_second == {
        "max_num_queued_reqs": 0.5,
        "max_num_queued_tokens": 0.0,
    }
    assert derived.admission_rejections_per_second == 0.5


def test_the_rates_by_reason_span_the_same_window_as_the_total() -> None:
    """Polls every 10 s for 2 minutes: each reason and the total over the last 60 s, alike."""
    samples = chain(*(Sample(10.0 * i, refusals(3 * i, i * i)) for i in range(13)))
    derived = derive_target(samples, windows=WINDOWS)
    by_reason = derived.admission_rejections_by_reason_per_second
    assert by_reason["max_num_queued_reqs"] == pytest.approx(3 * 6 / 60)
    assert by_reason["max_num_queued_tokens"] == pytest.approx((144 - 36) / 60)
    assert sum(by_reason.values()) == pytest.approx(derived.admission_rejections_per_second)


def test_a_reset_of_one_reason_counts_from_zero() -> None:
    """The token cap's counter goes from 40 down to 6 (no start time to say why): 6 count."""
    before = replace(refusals(10, 40), process_start_time_seconds=None)
    after = replace(refusals(30, 6), process_start_time_seconds=None)
    samples = chain(Sample(0.0, before), Sample(20.0, after))
    derived = derive_target(samples, windows=WINDOWS)
    assert derived.admission_rejections_by_reason_per_second == {
        "max_num_queued_reqs": 1.0,
        "max_num_queued_tokens": pytest.approx(0.3),
    }


def test_after_a_restart_each_reason_counts_the_new_process_whole() -> None:
    """Started 4 s after the first poll, 20 + 10 refusals by the next (10 s later): 2 and 1/s."""
    samples = walled_chain(
        walled(0.0, refusals(900, 100, start=T0 - 3600)),
        walled(10.0, refusals(20, 10, start=T0 + 4)),
    )
    assert samples[1].restarted
    derived = derive_target(samples, windows=WINDOWS)
    assert derived.admission_rejections_by_reason_per_second == {
        "max_num_queued_reqs": pytest.approx(2.0),
        "max_num_queued_tokens": pytest.approx(1.0),
    }
    assert derived.admission_rejections_per_second == pytest.approx(3.0)


def test_a_restart_no_process_could_have_counted_adds_nothing_to_any_reason() -> None:
    """A start time an hour before the first poll, counts far lower: that interval counts 0."""
    samples = walled_chain(
        walled(0.0, refusals(900, 100, start=T0 - 7200)),
        walled(10.0, refusals(20, 10, start=T0 - 3600)),
    )
    assert samples[1].restarted
    derived = derive_target(samples, windows=WINDOWS)
    assert derived.admission_rejections_by_reason_per_second == {
        "max_num_queued_reqs": 0.0,
        "max_num_queued_tokens": 0.0,
    }
    assert derived.admission_rejections_per_second == 0.0


def test_a_window_sample_keeps_one_copy_of_the_reasons_that_did_not_change() -> None:
    """Counts move every poll; the reasons' strings are the first sample's (footprint counts so)."""
    capture = (paths.CAPTURES / "vllm-0.33.0-reconstructed.prom").read_text()
    first = next_sample(None, 0.0, parse_vllm_metrics(capture))
    later = parse_vllm_metrics(capture.replace("} 4.0", "} 9.0"))
    second = next_sample(first, 5.0, later)
    kept, before = second.snapshot.admission_rejections_by_reason, first.snapshot
    assert kept["max_num_queued_reqs"] == 9.0
    assert [id(reason) for reason in kept] == [
        id(reason) for reason in before.admission_rejections_by_reason
    ]
    assert [id(reason) for reason in later.admission_rejections_by_reason] != [
        id(reason) for reason in kept
    ]


def test_no_rate_by_reason_without_two_polls_or_before_vllm_counts_refusals() -> None:
    """One poll gives no rate; a vLLM without the counter gives no reason either."""
    one = derive_target([Sample(0.0, refusals(5, 0))], windows=WINDOWS)
    assert one.admission_rejections_by_reason_per_second == {}
    old = derive_target(
        chain(Sample(0.0, snap(engine())), Sample(20.0, snap(engine()))), windows=WINDOWS
    )
    assert old.admission_rejections_by_reason_per_second == {}


def test_finished_requests_count_a_request_with_n_2_once() -> None:
    """10 requests of n=2 finish in 20 s: vLLM counts 20 successes, the rate is 0.5 requests/s."""
    before = replace(engine(finished=0), request_params_n=params_n(0, 2))
    after = replace(engine(finished=20), request_params_n=params_n(10, 2))
    (e,) = derive_target(
        chain(Sample(0.0, snap(before)), Sample(20.0, snap(after))), windows=WINDOWS
    ).engines
    assert e.finished_requests_per_second == 0.5


# --- every recorded capture: the limits hold together ------------------------------------------

_CAPTURES = sorted(
    p
    for p in [
        *paths.CAPTURES.glob("*.prom"),
        *(paths.FIXTURES / "vllm-cpu" / "burst").glob("*.prom"),
    ]
    if not p.name.startswith("14_")  # the docs' example elides a line: it does not parse
)


@pytest.mark.parametrize("path", _CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("limit", [None, 1, 4, 1024])
def test_every_capture_derives_a_ceiling_under_its_limits(path: Path, limit: int | None) -> None:
    """Each real payload (0.6 to 0.33, idle and mid-burst): the limits combine as specified.

    The ceiling is the smaller of the pool's figure and max_num_seqs and names it; the headroom
    never exceeds the free slots; the effective ceiling is never below the unshared one; requests
    times the mean n are the sequences.
    """
    snapshot = parse_vllm_metrics(path.read_bytes())
    running_limit = limited(limit) if limit is not None else None
    samples = chain(Sample(0.0, snapshot), Sample(5.0, snapshot))
    for e in derive_target(samples, windows=WINDOWS, running_limit=running_limit).engines:
        if e.p95_ceiling_sequences is not None:
            kv = e.p95_kv_ceiling_sequences
            expected = min(x for x in (kv, limit) if x is not None)
            assert e.p95_ceiling_sequences == expected
            assert e.p95_ceiling_limit == (
                Limit.MAX_NUM_SEQS
                if limit is not None and (kv is None or limit <= kv)
                else Limit.KV_CACHE
            )
        if e.p95_available_sequences is not None and limit is not None:
            assert e.p95_available_sequences <= max(0.0, limit - (e.sequences_running or 0))
        if e.p95_effective_ceiling_sequences is not None and e.p95_ceiling_sequences is not None:
            assert e.p95_effective_ceiling_sequences >= e.p95_ceiling_sequences
        if e.requests_running is not None and e.sequences_running is not None:
            assert e.requests_running * (e.sequences_per_request or 1.0) == pytest.approx(
                e.sequences_running
            )
        assert e.engine_asleep in (None, 0.0), "every recorded vLLM was awake"


# --- The context window reaches back for requests where it holds too few -------------------


def engine_after(short: int, long: int) -> EngineMetrics:
    """One engine after ``short`` requests of 101 + 380 tokens and ``long`` of 401 + 380."""
    prompt = Histogram(
        TOKEN_BOUNDS,
        tuple(float(short) * (i >= 7) + float(long) * (i >= 8) for i in range(len(TOKEN_BOUNDS))),
        float(short + long),
        101.0 * short + 401.0 * long,
    )
    return replace(
        engine(finished=short + long),
        prompt_tokens=prompt,
        generation_tokens=token_hist(8, short + long, 380.0),
    )


def a_request_a_minute(minutes: int, *, long_until: int = 0) -> list[Sample]:
    """Polls a minute apart with one request finished between each two.

    The first ``long_until`` requests are 401 + 380 tokens long, the rest 101 + 380.
    """
    return chain(
        *(
            Sample(60.0 * m, snap(engine_after(max(0, m - long_until), min(m, long_until))))
            for m in range(minutes + 1)
        )
    )


def reaching(min_requests: int, max_seconds: float = 3600.0) -> WindowSettings:
    """A 600 s context window that reaches back for ``min_requests`` over ``max_seconds``."""
    return WindowSettings(
        context_seconds=600.0,
        rate_seconds=60.0,
        context_min_requests=min_requests,
        context_max_seconds=max_seconds,
    )


def test_a_window_with_too_few_requests_reaches_back_until_it_holds_the_minimum() -> None:
    """Ten requests in the last 600 s, 30 wanted: twenty older minutes join, no more."""
    (e,) = derive_target(a_request_a_minute(50), windows=reaching(30)).engines
    assert e.context is not None
    assert e.context.window_requests == 30
    assert e.context_window_seconds == 1800.0


def test_a_window_with_enough_requests_stays_as_it_is() -> None:
    """Ten requests in the last 600 s, ten wanted: nothing older joins."""
    (e,) = derive_target(a_request_a_minute(50), windows=reaching(10)).engines
    assert e.context_window_requests == 10
    assert e.context_window_seconds == 600.0


def test_the_reach_stops_at_context_max_seconds() -> None:
    """However few the requests, the window never spans more than context_max_seconds."""
    (e,) = derive_target(a_request_a_minute(50), windows=reaching(1000, 1200.0)).engines
    assert e.context_window_requests == 20
    assert e.context_window_seconds == 1200.0


def test_the_reach_stops_where_the_kept_samples_end() -> None:
    """A sidecar that started 15 minutes ago reaches back 15 minutes, no further."""
    (e,) = derive_target(a_request_a_minute(15), windows=reaching(1000)).engines
    assert e.context_window_requests == 15
    assert e.context_window_seconds == 900.0


def test_context_min_requests_0_keeps_the_window_fixed() -> None:
    """0 turns the reach off: the window is the last 600 s, however few requests it holds."""
    (e,) = derive_target(a_request_a_minute(50), windows=reaching(0)).engines
    assert e.context_window_requests == 10
    assert e.context_window_seconds == 600.0


def test_the_requests_reached_back_for_shape_the_quantiles() -> None:
    """The last ten minutes were short requests, the twenty before long: p95 of 30 is long."""
    samples = a_request_a_minute(50, long_until=40)
    (fixed,) = derive_target(samples, windows=reaching(0)).engines
    (reached,) = derive_target(samples, windows=reaching(30)).engines
    assert fixed.context_p95_tokens == pytest.approx(481.0)
    assert reached.context_p95_tokens == pytest.approx(781.0)
    assert reached.context_mean_tokens == pytest.approx((10 * 481 + 20 * 781) / 30)


def test_the_prefix_hit_ratio_reaches_back_with_the_window() -> None:
    """Hit ratio and mean prompt describe the same requests, the ones the window reached for.

    Ten requests that shared their 384-token prefix half an hour ago, two without hits in the
    last ten minutes: the window reaches back for 12, and so does the hit ratio (not 0 of the
    last ten minutes' lookups, which would leave the shared prefix of 12 requests at 0).
    """
    shared = sharing(finished=10, queries=4480.0, hits=3840.0)
    later = sharing(finished=12, queries=4480.0 + 896.0, hits=3840.0)
    samples = chain(
        Sample(0.0, snap(sharing(finished=0, queries=0.0, hits=0.0))),
        Sample(60.0, snap(shared)),
        Sample(1800.0, snap(shared)),
        Sample(2100.0, snap(later)),
        Sample(2400.0, snap(later)),
    )
    (fixed,) = derive_target(samples, windows=reaching(0)).engines
    (reached,) = derive_target(samples, windows=reaching(12)).engines
    assert fixed.prefix_cache_hit_ratio == 0.0
    assert reached.context_window_requests == 12
    assert reached.prefix_cache_hit_ratio == pytest.approx(3840 / 5376)
    assert reached.shared_prefix_tokens == pytest.approx(3840 / 5376 * 448.0)


def test_the_lifetime_fallback_spans_no_window() -> None:
    """Nothing finished in all the reach: the figures are since vLLM started, over no window."""
    samples = chain(
        Sample(0.0, snap(engine(finished=12))), Sample(700.0, snap(engine(finished=12)))
    )
    (e,) = derive_target(samples, windows=reaching(200)).engines
    assert e.context is not None
    assert e.context.basis == "lifetime"
    assert e.context_window_seconds == 0.0


# --- Busy context figures stand for context_refresh_seconds --------------------------------


def busy(
    polls: int, *, long_from: int | None = None, restart_at: int | None = None
) -> list[Sample]:
    """Polls 5 s apart, 10 requests of 101 + 380 tokens finished between each two.

    From poll ``long_from`` on, 100 requests of 401 + 380 instead; at poll ``restart_at`` vLLM
    restarts (a new start time, counters from 0) and goes on as before.
    """
    samples = []
    for m in range(polls + 1):
        short_polls = min(m, long_from) if long_from is not None else m
        long_polls = m - short_polls
        start, since = 1000.0, 0
        if restart_at is not None and m >= restart_at:
            start, since = 2000.0, restart_at - 1
        short = 10 * max(0, short_polls - since)
        long = 100 * max(0, long_polls - max(0, since - short_polls))
        samples.append(Sample(5.0 * m, snap(engine_after(short, long), start=start)))
    return chain(*samples)


def polled(samples: list[Sample], windows: WindowSettings = WINDOWS) -> list[EngineDerived]:
    """The engine's figures at each poll, each derived with the poll before's as the poller does."""
    previous, figures = None, []
    for latest in range(1, len(samples) + 1):
        previous = derive_target(samples[:latest], windows=windows, previous=previous)
        figures.append(previous.engines[0])
    return figures


def computed_at(figures: EngineDerived) -> float:
    """When the engine's context figures were computed."""
    assert figures.context is not None
    return figures.context.computed_at


def test_busy_context_figures_stand_for_context_refresh_seconds() -> None:
    """Over 400 requests, the context figures are computed every 30 s; the rest every poll.

    1,200 requests a window (10 a 5 s poll), then a flood of long ones from the 125th poll:
    the figures of 620 s stand until 650 s, when the flood shows, while the rates follow it at
    once. Recomputing a busy window every poll cost over 1 % of a core.
    """
    figures = polled(busy(130, long_from=125))
    assert [computed_at(f) for f in figures[39:47]] == [195.0, 200.0] + [200.0] * 5 + [230.0]
    assert [computed_at(f) for f in figures[124:131]] == [620.0] * 6 + [650.0]
    assert figures[129].context is figures[124].context
    assert figures[129].context_p95_tokens is not None
    assert figures[129].context_p95_tokens < 401 + 380
    assert figures[130].context_p95_tokens == pytest.approx(401 + 380)
    rate_before = figures[124].finished_requests_per_second
    rate_flooded = figures[129].finished_requests_per_second
    assert rate_before is not None
    assert rate_flooded is not None
    assert rate_flooded > 2 * rate_before


def test_a_restart_computes_the_context_figures_at_once() -> None:
    """The window a restart leaves is not the one the standing figures were read from."""
    figures = polled(busy(130, restart_at=126))
    assert computed_at(figures[125]) == 620.0
    assert computed_at(figures[126]) == 630.0


def test_context_refresh_seconds_0_computes_them_every_poll() -> None:
    """0: every poll, as before the setting (and in the demo, whose phases last a minute)."""
    every_poll = WindowSettings(context_seconds=600.0, rate_seconds=60.0, context_refresh_seconds=0)
    figures = polled(busy(60), every_poll)
    assert [computed_at(f) for f in figures[1:]] == [5.0 * m for m in range(1, 61)]


def test_what_is_carried_to_the_next_poll_gives_the_same_figures_as_the_whole() -> None:
    """A poller keeps only the standing context figures: every later figure is the same.

    Busy polls (figures that stand), quiet ones (under 400 requests: none carried) and a
    restart, derived with the whole figures of the poll before and with what is carried.
    """
    for samples in (busy(70, restart_at=50), busy(30)):
        whole = carried_previous = None
        for latest in range(1, len(samples) + 1):
            window = samples[:latest]
            expected = derive_target(window, windows=WINDOWS, previous=whole)
            got = derive_target(window, windows=WINDOWS, previous=carried_previous)
            assert got == expected
            whole, carried_previous = expected, carried(expected)
    standing = carried(derive_target(busy(60), windows=WINDOWS))
    assert [e.engine for e in standing.engines] == ["0"]
    assert carried(derive_target(busy(10), windows=WINDOWS)).engines == ()


def test_a_new_max_model_len_computes_the_context_figures_at_once() -> None:
    """Figures capped at another max_model_len (learnt after the first polls) do not stand."""
    samples = busy(60)
    before = derive_target(samples[:60], windows=WINDOWS)
    kept = derive_target(samples, windows=WINDOWS, previous=before)
    capped = derive_target(samples, windows=WINDOWS, previous=before, max_model_len=512)
    assert kept.engines[0].context is before.engines[0].context
    assert computed_at(capped.engines[0]) == 300.0


def idle(polls: int, *, restart_at: int | None = None) -> list[Sample]:
    """Polls 5 s apart of a server that finished 12 requests before the first and none since.

    At poll ``restart_at`` it restarts with 3 requests finished, and none after.
    """
    return chain(
        *(
            Sample(5.0 * m, snap(engine(finished=3), start=2000.0))
            if restart_at is not None and m >= restart_at
            else Sample(5.0 * m, snap(engine(finished=12)))
            for m in range(polls)
        )
    )


def counting_estimates(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the context estimator's runs (one item a run)."""
    runs: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return estimate_context_quantiles(*args, **kwargs)

    monkeypatch.setattr("exporter.core.derive.estimate_context_quantiles", counted)
    return runs


def test_an_idle_servers_figures_since_start_are_computed_once_while_its_histograms_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing finished since the first poll: the same figures, computed at the first poll only.

    Each poll's figures are what a derivation from nothing but the samples gives (stamped with
    the latest sample); a fleet's idle targets computed them again at every probe.
    """
    samples = idle(40)
    fresh = [derive_target(samples[:k], windows=WINDOWS).engines[0] for k in range(1, 41)]
    runs = counting_estimates(monkeypatch)
    figures = polled(samples)
    assert len(runs) == 1
    assert figures == fresh
    assert all(f.context is not None and f.context.basis == "lifetime" for f in figures)
    assert [computed_at(f) for f in figures] == [5.0 * m for m in range(40)]


def test_figures_since_start_are_computed_again_when_the_histograms_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Figures since start are computed again at once where their inputs change.

    Histograms that change with no request finished (their sum only), or another max_model_len.
    """
    quiet = engine(finished=12)
    assert quiet.prompt_tokens is not None
    moved = replace(quiet, prompt_tokens=replace(quiet.prompt_tokens, sum=12 * 150.0))
    samples = chain(*(Sample(5.0 * m, snap(quiet if m < 10 else moved)) for m in range(20)))
    fresh = [derive_target(samples[:k], windows=WINDOWS).engines[0] for k in range(1, 21)]
    runs = counting_estimates(monkeypatch)
    figures = polled(samples)
    assert figures == fresh
    assert all(f.context is not None and f.context.basis == "lifetime" for f in figures)
    assert len(runs) == 2  # the first poll's, and the tenth's
    assert figures[10].context != figures[9].context  # a mean of 150 + 380, not 101 + 380
    previous = derive_target(samples[:19], windows=WINDOWS)
    capped = derive_target(samples, windows=WINDOWS, previous=previous, max_model_len=300)
    assert len(runs) == 4  # previous's own, and the capped one's
    assert capped.engines[0].context_p95_tokens is not None
    assert capped.engines[0].context_p95_tokens <= 300


def test_a_restart_computes_the_figures_of_its_requests_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a restart the new lifetime's 3 requests are the window's: computed every poll."""
    samples = idle(30, restart_at=20)
    fresh = [derive_target(samples[:k], windows=WINDOWS).engines[0] for k in range(1, 31)]
    runs = counting_estimates(monkeypatch)
    figures = polled(samples)
    assert figures == fresh
    assert len(runs) == 1 + 10  # the first poll's, then each poll from the restart on
    assert [f.context.basis for f in figures if f.context is not None] == (
        ["lifetime"] * 20 + ["window"] * 10
    )


def test_figures_since_start_are_not_kept_from_a_poll_that_is_not_the_one_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept only from the sample just before the latest: a missed poll computes them again."""
    samples = idle(10)
    at_5 = derive_target(samples[:6], windows=WINDOWS)
    runs = counting_estimates(monkeypatch)
    later = derive_target(samples[:8], windows=WINDOWS, previous=at_5)  # polls 6 and 7 missed
    assert len(runs) == 1
    assert later == derive_target(samples[:8], windows=WINDOWS)


def spaced(
    polls: int, *, finished: Callable[[int], int], restart_at: int | None = None
) -> list[list[Sample]]:
    """The window at each poll where the spacing replaces the latest sample every time.

    Polls 5 s apart; the first two samples stay and each later poll's sample takes the place
    of the one before it (``exporter.service.memory``'s window, polled faster than its
    spacing), each detected against the sample it replaces, as the poller does. ``finished``
    gives the requests finished by each poll; at ``restart_at`` vLLM starts again.
    """
    windows: list[list[Sample]] = []
    kept: list[Sample] = []
    for m in range(polls):
        start = 2000.0 if restart_at is not None and m >= restart_at else 1000.0
        sample = next_sample(
            kept[-1] if kept else None, 5.0 * m, snap(engine(finished=finished(m)), start=start)
        )
        if len(kept) >= 2:
            kept.pop()
            sample = replace(sample, restarted=sample.restarted or windows[-1][-1].restarted)
        kept.append(sample)
        windows.append(list(kept))
    return windows


def derived_in_turn(windows: list[list[Sample]]) -> list[EngineDerived]:
    """The engine's figures of each window, each derived with the one before's."""
    previous, figures = None, []
    for window in windows:
        previous = derive_target(window, windows=WINDOWS, previous=previous)
        figures.append(previous.engines[0])
    return figures


def test_figures_since_start_stand_where_the_window_replaced_the_sample_they_were_computed_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle target probed faster than the window's spacing: computed at the first poll only.

    Fleet mode keeps a sample every 12 s or so (its windows shared over probe_max_targets);
    probed every 5 s, two probes in three replaced the latest sample, and computed the figures
    again although nothing had finished since.
    """
    windows = spaced(12, finished=lambda _m: 12)
    fresh = [derive_target(w, windows=WINDOWS).engines[0] for w in windows]
    runs = counting_estimates(monkeypatch)
    figures = derived_in_turn(windows)
    assert len(runs) == 1
    assert figures == fresh
    assert all(f.context is not None and f.context.basis == "lifetime" for f in figures)


def test_figures_from_a_replaced_sample_are_computed_again_when_the_histograms_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replaced sample's histograms are gone: any change since the one before computes again.

    Requests finish at the 6th poll (whose sample the 7th replaces), or vLLM restarts there
    with the same histograms as before (its restart carried to the sample that replaces it).
    """
    for windows in (
        spaced(10, finished=lambda m: 12 if m < 6 else 13),
        spaced(10, finished=lambda _m: 12, restart_at=6),
    ):
        fresh = [derive_target(w, windows=WINDOWS).engines[0] for w in windows]
        runs = counting_estimates(monkeypatch)
        assert derived_in_turn(windows) == fresh
        assert len(runs) > 1


def test_a_restart_baseline_gives_the_same_evidence_as_the_whole_snapshot() -> None:
    """Counters only, no labels nor buckets: every restart verdict is the whole snapshot's."""

    def parsed(**state: object) -> VllmSnapshot:
        return parse_vllm_metrics(render_metrics(VllmState(engines=2, **state)))  # type: ignore[arg-type]

    before = parsed()
    for after in (
        parsed(finished=20),  # counters up: no restart
        parsed(finished=2),  # counters down, same start time: impossible
        parsed(start_time=1_795_952_200.0, finished=2),  # a new process
        parsed(start_time=1_795_952_000.0),  # the start time went back
    ):
        assert restart_evidence(restart_baseline(before), after) == restart_evidence(before, after)
    baseline = restart_baseline(before)
    assert baseline.engines == tuple(before.engines)
    assert len(baseline.counters) == 6 * len(before.engines)  # numbers only: no label, bucket


# --- counters after a restart -----------------------------------------------------------------

#: Wall-clock time of the first poll in these tests (the target's start times are near it).
T0 = 1_800_000_000.0


def walled(t: float, snapshot: VllmSnapshot) -> Sample:
    """A sample polled ``t`` seconds after T0, with its wall-clock time."""
    return Sample(t, snapshot, wall=T0 + t)


def walled_chain(*samples: Sample) -> list[Sample]:
    """Like :func:`chain`, keeping each sample's wall-clock time."""
    out: list[Sample] = []
    for sample in samples:
        previous = out[-1] if out else None
        out.append(next_sample(previous, sample.t, sample.snapshot, wall=sample.wall))
    return out


def preemption_rate(samples: list[Sample]) -> float | None:
    """The one engine's preemptions per second over the rate window."""
    (e,) = derive_target(samples, windows=WINDOWS).engines
    return e.preemptions_per_second


def test_a_restart_between_two_polls_counts_the_new_process_whole() -> None:
    """Started 4 s after the first poll, 30 preemptions by the next (10 s later): 30 count."""
    samples = walled_chain(
        walled(0.0, snap(engine(preemptions=900), start=T0 - 3600)),
        walled(10.0, snap(engine(preemptions=30), start=T0 + 4)),
    )
    assert preemption_rate(samples) == pytest.approx(3.0)


def test_a_storm_of_new_start_times_with_huge_counters_yields_no_rate_at_all() -> None:
    """Each poll a new start time (just before it) and 1e12 preemptions: nothing counts.

    No process counts 1e12 in 5 s, so no interval counts it (before: 2e11 per second).
    """
    samples = walled_chain(
        *(
            walled(5.0 * i, snap(engine(preemptions=1e12 + i), start=T0 + 5.0 * i - 1))
            for i in range(13)
        )
    )
    assert all(s.restarted for s in samples[1:])
    assert preemption_rate(samples) == 0.0


@pytest.mark.parametrize(
    ("start", "why"),
    [
        (T0 + 10 + 3600, "started an hour after the poll that read it"),
        (T0 - 3600, "already running an hour before the poll that read the other process"),
        (1.0, "started in 1970, 'restarting' at every poll"),
    ],
)
def test_a_start_time_no_restart_between_the_polls_could_have_counts_nothing(
    start: float, why: str
) -> None:
    """A new process that did not start between the two polls counts nothing there: ``why``."""
    samples = walled_chain(
        walled(0.0, snap(engine(preemptions=900), start=T0 - 7200)),
        walled(10.0, snap(engine(preemptions=5_000), start=start)),
    )
    assert samples[1].restarted
    assert preemption_rate(samples) == 0.0, why


def test_a_start_time_within_the_clock_skew_allowance_still_counts() -> None:
    """Clocks 30 s apart (fleet mode reads other machines' start times): the restart counts."""
    samples = walled_chain(
        walled(0.0, snap(engine(preemptions=900), start=T0 - 7200)),
        walled(10.0, snap(engine(preemptions=50), start=T0 + 10 + 30)),
    )
    assert preemption_rate(samples) == pytest.approx(5.0)


def test_a_count_above_the_ceiling_for_the_time_between_polls_counts_nothing() -> None:
    """The ceiling is per second between the polls: at it the count stands, above it not."""
    ceiling = COUNTER_CEILINGS_PER_SECOND[Counted.PREEMPTIONS]
    for count, rate in ((ceiling * 10, ceiling), (ceiling * 10 + 1, 0.0)):
        samples = walled_chain(
            walled(0.0, snap(engine(preemptions=900), start=T0 - 7200)),
            walled(10.0, snap(engine(preemptions=count), start=T0 + 1)),
        )
        assert preemption_rate(samples) == pytest.approx(rate)


def test_without_a_start_time_a_counter_reset_is_bounded_by_the_ceiling_too() -> None:
    """Counters going down (no start time exposed) to 1e12 count nothing; to 20, 20."""
    for count, rate in ((1e12, 0.0), (20.0, 2.0)):
        samples = walled_chain(
            Sample(0.0, VllmSnapshot(engines={"0": engine(preemptions=1e13)})),
            Sample(10.0, VllmSnapshot(engines={"0": engine(preemptions=count)})),
        )
        assert samples[1].restarted
        assert preemption_rate(samples) == pytest.approx(rate)


@settings(max_examples=60, deadline=None)
@given(
    count=st.floats(min_value=0, max_value=1e300),
    start_offset=st.floats(min_value=-1e10, max_value=1e10),
    elapsed=st.floats(min_value=0.01, max_value=WINDOWS.rate_seconds),
)
def test_a_restart_never_yields_a_rate_above_the_ceiling(
    count: float, start_offset: float, elapsed: float
) -> None:
    """Whatever the new count and start time, the rate after a restart stays under the ceiling."""
    samples = walled_chain(
        walled(0.0, snap(engine(preemptions=1.0, finished=1), start=T0 - 7200)),
        walled(elapsed, snap(engine(preemptions=count, finished=1), start=T0 + start_offset)),
    )
    rate = preemption_rate(samples)
    assert rate is not None
    assert rate <= COUNTER_CEILINGS_PER_SECOND[Counted.PREEMPTIONS] * (1 + 1e-9)


def _prompts(n: int, total: float) -> Histogram:
    """``n`` prompts in (100, 200], their ``_sum`` said to be ``total`` (true or not)."""
    return replace(token_hist(7, n, 101.0), sum=total)


@pytest.mark.parametrize(
    "total",
    [
        pytest.param(1e200, id="square-overflows"),
        pytest.param(2.0**53, id="largest-countable"),
        pytest.param(1e6, id="far-above-the-bucket"),
        pytest.param(1212.0 + 201.0, id="one-past-the-bucket"),
        pytest.param(1212.0 + 5.0, id="below-the-bucket"),
    ],
)
@pytest.mark.parametrize("max_model_len", [None, 512])
def test_the_sidecar_survives_a_sum_its_buckets_contradict(
    total: float, max_model_len: int | None
) -> None:
    """One prompt in (100, 200] over a poll, its sum growing by more or less: no exception.

    The sidecar's poll must not fail (headroom_target_up stays 1), and no figure lies outside
    what the buckets allow: the request's context is 101 to 200 prompt plus 380 output tokens.
    """
    before = engine(finished=12)
    after = replace(
        engine(finished=13),
        prompt_tokens=_prompts(13, total),
        generation_tokens=token_hist(8, 13, 380.0),
    )
    samples = chain(Sample(0.0, snap(before)), Sample(15.0, snap(after)))
    (e,) = derive_target(samples, windows=WINDOWS, max_model_len=max_model_len).engines
    if e.context is None:  # a sum past 2**53 is no vLLM's: no traffic, rather than NaN
        assert total > 2.0**53
        return
    figures = [*e.context.quantiles.values(), e.context.mean]
    assert all(math.isfinite(x) and 101.0 + 380.0 <= x <= 200.0 + 500.0 for x in figures)
    assert e.context.mean <= 200.0 + 380.0


@pytest.mark.parametrize("total", ["1e200", "1e6", "6001", "1199"])
def test_a_payload_with_an_impossible_sum_derives_without_it(total: str) -> None:
    """The sidecar's path from the payload: the parser drops the histogram, derive goes on."""
    text = (paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text()
    line = 'vllm:request_prompt_tokens_sum{engine="0",model_name="tiny"} 1212.0'
    assert line in text
    snapshot = parse_vllm_metrics(text.replace(line, line.replace("1212.0", total)))
    assert snapshot.dropped == {"out_of_range": 12}
    samples = chain(Sample(0.0, snapshot), Sample(15.0, snapshot))
    (e,) = derive_target(samples, windows=WINDOWS, max_model_len=512).engines
    assert e.context is None
    assert e.kv_capacity_tokens == 1024


# --- impossible figures from a hostile target: unknown, never a crashed poll -----------------

HUGE = int(1e308)


@pytest.mark.parametrize(
    "cache",
    [
        CacheConfig(num_gpu_blocks=HUGE, block_size=16),
        CacheConfig(num_gpu_blocks=8, block_size=16, kv_cache_size_tokens=HUGE),
        CacheConfig(num_gpu_blocks=HUGE, block_size=16, kv_cache_size_tokens=HUGE),
        CacheConfig(num_gpu_blocks=8, block_size=HUGE),
        CacheConfig(num_gpu_blocks=2**60, block_size=2**10),
    ],
    ids=["blocks-1e308", "tokens-1e308", "both-1e308", "block-size-1e308", "product-2**70"],
)
def test_a_kv_cache_past_any_gpu_is_unknown_not_a_crash(cache: CacheConfig) -> None:
    """1e308 blocks or tokens (or a product past 2**53) is an unknown capacity, not infinite."""
    samples = chain(
        Sample(0.0, snap(engine(finished=0, usage=0.5, cache=cache))),
        Sample(30.0, snap(engine(finished=12, usage=0.5, cache=cache))),
    )
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.kv_capacity_tokens is None
    for value in (e.kv_usable_tokens, e.kv_used_tokens, e.kv_free_tokens):
        assert value is None
    assert e.context is not None  # the traffic figures still stand


@pytest.mark.parametrize("predicted", [math.inf, 1e308, math.nan])
def test_a_prediction_past_any_gpu_stands_for_nothing(predicted: float) -> None:
    """An infinite or 1e308-token predicted capacity is no usable pool."""
    cache = CacheConfig(block_size=16)
    samples = [Sample(0.0, snap(engine(usage=0.5, cache=cache)))]
    (e,) = derive_target(samples, windows=WINDOWS, predicted_capacity_tokens=predicted).engines
    assert e.kv_usable_tokens is None


@pytest.mark.parametrize("max_model_len", [10**4000, 2**60, -5])
def test_a_max_model_len_no_model_has_is_unknown(max_model_len: int) -> None:
    """A 4,000-digit (or 2**60, or negative) max_model_len caps nothing, and crashes nothing."""
    samples = chain(Sample(0.0, snap(engine(finished=0))), Sample(30.0, snap(engine(finished=12))))
    (e,) = derive_target(samples, windows=WINDOWS, max_model_len=max_model_len).engines
    assert e.context is not None
    assert e.context.max_model_len is None
    assert e.context.mean == pytest.approx(481.0)


def _hostile_hist(kind: str, n: int) -> Histogram:
    if kind == "count-1e308":
        return Histogram(TOKEN_BOUNDS, (0.0,) * 9 + (1e308,), float(n), n * 101.0)
    if kind == "sum-1e155":
        return Histogram(TOKEN_BOUNDS, token_hist(7, n, 101.0).cumulative, float(n), 1e155)
    return Histogram(TOKEN_BOUNDS, token_hist(7, n, 101.0).cumulative, float(n), math.inf)


@pytest.mark.parametrize("kind", ["count-1e308", "sum-1e155", "sum-inf"])
def test_a_token_histogram_no_vllm_writes_is_no_traffic(kind: str) -> None:
    """Counts of 1e308, or a sum whose square is infinite: no context figures, no crash."""
    hostile = replace(engine(finished=12), prompt_tokens=_hostile_hist(kind, 12))
    samples = chain(Sample(0.0, snap(engine(finished=1))), Sample(30.0, snap(hostile)))
    (e,) = derive_target(samples, windows=WINDOWS).engines
    assert e.context is None
    assert e.kv_capacity_tokens == 1024  # the rest of the engine's figures stand
