"""Render the simulated engine's metrics as a vLLM 0.32.0 ``/metrics`` payload.

A pure function of plain data: :func:`render` takes a :class:`~exporter.sim.engine.SimMetrics`,
the scenario and the start time, builds fresh metric families and serialises them with
``prometheus_client.generate_latest``, so the text is byte-for-byte in the format the client library
emits (which is what vLLM serves). The families, their order, HELP texts, label names and bucket
bounds are those of the real 0.32.0 capture (:mod:`exporter.sim.families`).

Prefix-cache hits come from the device (GPU) cache, as without a KV connector:
``prefix_cache_hits`` and ``prompt_tokens_cached_by_source{source="device"}`` count them at
admission, ``prompt_tokens_cached`` and ``prompt_tokens_by_source{source="local_cache_hit"}``
when the request's first token comes out, as vLLM 0.32 does. What the simulation does not model
is exposed as vLLM exposes it when the feature is idle: external (KV connector) and multi-modal
caches, admission rejections and the MFU estimates (``estimated_*_per_gpu``, zero unless vLLM
runs with MFU metrics) stay at zero. Of the ``process_*`` and ``python_*`` families of the
client library's default collectors only ``process_start_time_seconds`` is served (the sidecar
uses it to detect restarts), set to the simulation's start; the rest would describe the demo
process, not a vLLM server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporter.sim import families
from exporter.sim.scenario import (
    kv_cache_max_concurrency,
    kv_cache_size_tokens,
    num_gpu_blocks,
)
from exporter.vllm.families import named

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from exporter.core.snapshot import Histogram
    from exporter.sim.engine import SimMetrics
    from exporter.sim.scenario import Scenario

_MFU_FAMILIES = (
    (
        named("estimated_flops_per_gpu"),
        "Estimated number of floating point operations per GPU "
        "(for Model Flops Utilization calculations).",
    ),
    (
        named("estimated_read_bytes_per_gpu"),
        "Estimated number of bytes read from memory per GPU "
        "(for Model Flops Utilization calculations).",
    ),
    (
        named("estimated_write_bytes_per_gpu"),
        "Estimated number of bytes written to memory per GPU "
        "(for Model Flops Utilization calculations).",
    ),
)


def cache_config_labels(scenario: Scenario) -> dict[str, str]:
    """Return the labels of ``vllm:cache_config_info`` for this scenario (``engine`` included).

    The full label set of vLLM 0.32.0's ``CacheConfig``, each value as Python ``str()`` of the
    field, as vLLM writes them; fields the simulation has no use for keep vLLM's defaults.
    """
    engine = scenario.engine
    block_size = str(engine.block_size)
    return {
        "_block_size_resolved": "True",
        "block_size": block_size,
        "cache_dtype": "auto" if scenario.model.kv_dtype_bytes != 1 else "fp8",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": block_size,
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(engine.enable_prefix_caching),
        "engine": engine.engine,
        "gpu_memory_utilization": str(engine.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(kv_cache_max_concurrency(scenario)),
        "kv_cache_memory_bytes": str(engine.kv_cache_memory_bytes),
        "kv_cache_size_tokens": str(kv_cache_size_tokens(scenario)),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(num_gpu_blocks(scenario)),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": str(engine.user_specified_block_size),
    }


def render(metrics: SimMetrics, scenario: Scenario, *, started_at: float) -> bytes:
    """Return the ``/metrics`` payload (Prometheus text format 0.0.4, UTF-8).

    ``started_at`` is the wall-clock time (Unix seconds) the simulated server started: it is
    ``process_start_time_seconds`` and the value of every ``_created`` series.
    """
    return generate_latest(_Families(build_families(metrics, scenario, started_at=started_at)))


def build_families(metrics: SimMetrics, scenario: Scenario, *, started_at: float) -> list[Metric]:
    """Return the metric families of the payload, in vLLM's order."""
    base = {"engine": scenario.engine.engine, "model_name": scenario.model.served_name}
    out: list[Metric] = []

    start = Metric(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "gauge",
    )
    start.add_sample("process_start_time_seconds", {}, started_at)
    out.append(start)

    for name, doc in _MFU_FAMILIES:
        out.append(_counter(name, doc, [(base, 0.0)], started_at))

    out.append(
        _gauge(
            named("num_requests_running"),
            "Number of requests in model execution batches.",
            [(base, metrics.num_requests_running)],
        )
    )
    out.append(
        _gauge(
            named("num_requests_waiting"),
            "Number of requests waiting to be processed.",
            [(base, metrics.num_requests_waiting)],
        )
    )
    # The simulation has no LoRA budget or KV transfer: every waiting request waits for capacity.
    waiting_by_reason = {"capacity": metrics.num_requests_waiting, "deferred": 0}
    out.append(
        _gauge(
            named("num_requests_waiting_by_reason"),
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [({**base, "reason": r}, waiting_by_reason[r]) for r in families.WAITING_REASONS],
        )
    )
    out.append(
        _gauge(
            named("engine_sleep_state"),
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            [
                ({**base, "sleep_state": s}, 1.0 if s == "awake" else 0.0)
                for s in families.SLEEP_STATES
            ],
        )
    )
    out.append(
        _gauge(
            named("kv_cache_usage_perc"),
            "KV-cache usage. 1 means 100 percent usage.",
            [(base, metrics.kv_cache_usage)],
        )
    )

    counters: tuple[tuple[str, str, float], ...] = (
        (
            named("prefix_cache_queries"),
            "Prefix cache queries, in terms of number of queried tokens.",
            metrics.prefix_cache_queries,
        ),
        (
            named("prefix_cache_hits"),
            "Prefix cache hits, in terms of number of cached tokens.",
            metrics.prefix_cache_hits,
        ),
        (
            named("external_prefix_cache_queries"),
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
            0.0,
        ),
        (
            named("external_prefix_cache_hits"),
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
            0.0,
        ),
        (
            named("mm_cache_queries"),
            "Multi-modal cache queries, in terms of number of queried items.",
            0.0,
        ),
        (
            named("mm_cache_hits"),
            "Multi-modal cache hits, in terms of number of cached items.",
            0.0,
        ),
        (
            named("num_preemptions"),
            "Cumulative number of preemption from the engine.",
            metrics.num_preemptions,
        ),
        (named("prompt_tokens"), "Number of prefill tokens processed.", metrics.prompt_tokens),
    )
    for name, doc, value in counters:
        out.append(_counter(name, doc, [(base, value)], started_at))

    # No KV transfer: a prompt token was either computed or found in the local prefix cache.
    by_source = {
        "local_compute": metrics.prompt_tokens - metrics.prompt_tokens_cached,
        "local_cache_hit": metrics.prompt_tokens_cached,
    }
    out.append(
        _counter(
            named("prompt_tokens_by_source"),
            "Number of prompt tokens by source.",
            [({**base, "source": s}, by_source.get(s, 0)) for s in families.PROMPT_TOKEN_SOURCES],
            started_at,
        )
    )
    out.append(
        _counter(
            named("prompt_tokens_cached"),
            "Number of cached prompt tokens (local + external).",
            [(base, metrics.prompt_tokens_cached)],
            started_at,
        )
    )
    out.append(
        _counter(
            named("prompt_tokens_cached_by_source"),
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            [
                ({**base, "source": s}, metrics.prefix_cache_hits if s == "device" else 0.0)
                for s in families.CACHED_TOKEN_SOURCES
            ],
            started_at,
        )
    )
    out.append(
        _counter(
            named("generation_tokens"),
            "Number of generation tokens processed.",
            [(base, metrics.generation_tokens)],
            started_at,
        )
    )
    out.append(
        _counter(
            named("request_success"),
            "Count of successfully processed requests.",
            [
                ({**base, "finished_reason": r}, metrics.request_success.get(r, 0))
                for r in families.FINISHED_REASONS
            ],
            started_at,
        )
    )
    # vLLM counts admission rejections in the API server: no engine label.
    model_only = {"model_name": scenario.model.served_name}
    out.append(
        _counter(
            named("admission_rejections"),
            "Number of admission attempts rejected by a queue limit, by reason.",
            [({**model_only, "reason": r}, 0.0) for r in families.ADMISSION_REJECTION_REASONS],
            started_at,
        )
    )

    for family in families.histogram_families(scenario.engine.max_model_len):
        out.append(
            _histogram(
                family.name,
                family.documentation,
                base,
                metrics.histograms[family.name],
                started_at,
            )
        )

    cache_config = named("cache_config_info")
    info = Metric(cache_config, "Information of the LLMEngine CacheConfig", "gauge")
    info.add_sample(cache_config, cache_config_labels(scenario), 1.0)
    out.append(info)
    return out


class _Families(Collector):
    """A one-shot collector over families built for one scrape (``generate_latest`` wants one)."""

    def __init__(self, metric_families: list[Metric]) -> None:
        self._families = metric_families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _gauge(name: str, doc: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> Metric:
    metric = Metric(name, doc, "gauge")
    for labels, value in samples:
        metric.add_sample(name, dict(labels), float(value))
    return metric


def _counter(
    name: str,
    doc: str,
    samples: Iterable[tuple[Mapping[str, str], float]],
    created: float,
) -> Metric:
    # ``name`` without ``_total``: the text format appends it to the family, as the client does.
    metric = Metric(name, doc, "counter")
    rows = list(samples)
    for labels, value in rows:
        metric.add_sample(name + "_total", dict(labels), float(value))
    for labels, _ in rows:
        metric.add_sample(name + "_created", dict(labels), created)
    return metric


def _histogram(
    name: str, doc: str, labels: Mapping[str, str], histogram: Histogram, created: float
) -> Metric:
    metric = Metric(name, doc, "histogram")
    for bound, cumulative in zip(histogram.bounds, histogram.cumulative, strict=True):
        # The client's own formatting of ``le`` ("1.0", "+Inf"); the function is untyped.
        le: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
        metric.add_sample(name + "_bucket", {**labels, "le": le}, cumulative)
    metric.add_sample(name + "_count", dict(labels), histogram.count)
    metric.add_sample(name + "_sum", dict(labels), histogram.sum)
    metric.add_sample(name + "_created", dict(labels), created)
    return metric
