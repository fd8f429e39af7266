"""Attacks on the layout path of the derivations: hostile ``cache_config_info`` labels.

Every combination below is one the parser lets through (``exporter/vllm/metrics.py``:
blocks, block size and tokens from 1 to 2**53, a concurrency from 0 to 2**53), on one engine
or two data-parallel ones, with and without a layout from the prediction that agrees with
vLLM's figures. ``derive_target`` must never raise, and what it exports must hold together:
finite, whole sequences, tokens in use within the usable ones, headroom within the ceiling.
"""

from __future__ import annotations

import itertools
import math

import pytest

from exporter.core.derive import EngineDerived, Sample, WindowSettings, derive_target, next_sample
from exporter.core.pool import GroupBlocks, PoolLayout
from exporter.core.snapshot import CacheConfig, EngineMetrics, Histogram, VllmSnapshot

INF = math.inf
#: A Gemma 2-like pool: 32 blocks of 128 tokens, 12 blocks per 1,024-token request.
AGREEING = PoolLayout(
    (GroupBlocks("full", None, 128), GroupBlocks("sliding", 512, 128, 4)), 1024, 12
)
_SEQUENCES = (
    "p95_kv_ceiling_sequences",
    "p95_kv_available_sequences",
    "mean_ceiling_sequences",
    "p95_ceiling_sequences",
    "p95_available_sequences",
)


def _derived(
    caches: list[CacheConfig | None],
    *,
    context: int,
    usage: float,
    max_model_len: int | None,
    layout: PoolLayout | None,
) -> tuple[EngineDerived, ...]:
    samples: list[Sample] = []
    for t, n in ((0.0, 0), (10.0, 50)):
        bounds = (1.0, float(max(context - 1, 1)), INF)
        prompt = Histogram(bounds, (0.0, n, n), n, float(n * (context - 1)))
        output = Histogram(bounds, (n, n, n), n, float(n))
        engines = {
            str(i): EngineMetrics(
                engine=str(i),
                model_name="m",
                requests_running=0.0,
                requests_waiting=0.0,
                kv_cache_usage_ratio=usage,
                preemptions_total=0.0,
                requests_finished_total=float(n),
                prompt_tokens=prompt,
                generation_tokens=output,
                cache_config=cache,
            )
            for i, cache in enumerate(caches)
        }
        snapshot = VllmSnapshot(engines=engines)
        samples.append(next_sample(samples[-1] if samples else None, t, snapshot))
    windows = WindowSettings(context_min_requests=0)
    target = derive_target(
        samples, windows=windows, max_model_len=max_model_len, pool_layout=layout
    )
    return target.engines


def _hold_together(engine: EngineDerived) -> None:
    for name in (*_SEQUENCES, "kv_used_tokens", "kv_usable_tokens", "kv_free_tokens"):
        value = getattr(engine, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    for name in _SEQUENCES:
        value = getattr(engine, name)
        assert value is None or value == int(value), (name, value)
    if engine.kv_used_tokens is not None and engine.kv_usable_tokens is not None:
        assert engine.kv_used_tokens <= engine.kv_usable_tokens
    ceiling, available = engine.p95_kv_ceiling_sequences, engine.p95_kv_available_sequences
    if ceiling is not None and available is not None:
        assert available <= ceiling


@pytest.mark.parametrize("layout", [None, AGREEING], ids=["no-layout", "agreeing-layout"])
@pytest.mark.parametrize("max_model_len", [1024, None, 1])
def test_hostile_labels_are_never_an_error_and_the_figures_hold_together(
    layout: PoolLayout | None, max_model_len: int | None
) -> None:
    """Each engine alone, every combination of the parser's extremes."""
    blocks = (1, 2, 32, 2**53)
    sizes = (None, 1, 128, 2**53)
    tokens = (None, 1, 1985, 2730, 2**53)
    concurrencies = (None, 0.0, 5e-324, 1e-300, 0.5, 2.6666666666666665, 64.0, 2.0**53)
    for count, size, capacity, concurrency in itertools.product(
        blocks, sizes, tokens, concurrencies
    ):
        cache = CacheConfig(
            num_gpu_blocks=count,
            block_size=size,
            kv_cache_size_tokens=capacity,
            kv_cache_max_concurrency=concurrency,
        )
        for context, usage in ((2, 1.0), (128, 0.5), (1024, 0.0)):
            for engine in _derived(
                [cache], context=context, usage=usage, max_model_len=max_model_len, layout=layout
            ):
                _hold_together(engine)


@pytest.mark.parametrize(
    "caches",
    [
        # Data parallel: num_gpu_blocks is the sum; odd sums make fractional blocks per engine.
        [CacheConfig(64, 128, 2730, 2.6666666666666665)] * 2,
        [CacheConfig(64, 128, 2730, 2.6666666666666665), CacheConfig(65, 128, 2730, 2.0)],
        [CacheConfig(64, 128, 2730, 2.6666666666666665), None],
        [CacheConfig(65, 128, 2730, 2.6666666666666665), CacheConfig()],
    ],
    ids=["same", "different", "one-without-labels", "one-with-empty-labels"],
)
def test_data_parallel_engines_that_differ_are_never_an_error(
    caches: list[CacheConfig | None],
) -> None:
    """Engines whose labels differ, or one without them: each is derived on its own."""
    for context, layout in itertools.product((1, 128, 1024), (None, AGREEING)):
        for engine in _derived(
            caches, context=context, usage=0.9, max_model_len=1024, layout=layout
        ):
            _hold_together(engine)


@pytest.mark.parametrize(
    "layout",
    [
        PoolLayout((), 1024, 12),
        PoolLayout((GroupBlocks("state", None, 128, max_blocks=0),), 1024, 12),
    ],
    ids=["no-groups", "a-state-group-of-no-blocks"],
)
def test_a_layout_of_no_blocks_makes_no_figure(layout: PoolLayout) -> None:
    """A layout claiming vLLM's blocks while its groups take none (no sizing model makes one)."""
    cache = CacheConfig(32, 128, 2730, 2.6666666666666665)
    (engine,) = _derived([cache], context=128, usage=0.5, max_model_len=1024, layout=layout)
    assert engine.p95_kv_ceiling_sequences is None
