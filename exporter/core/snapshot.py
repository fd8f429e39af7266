"""Plain data read from one vLLM ``/metrics`` payload, normalised across vLLM versions.

This is the contract between the parser (``exporter.vllm.metrics``), the derivations
(``exporter.core.derive``), the ``check`` command and the demo's simulated engine. Everything
here is immutable plain data: no I/O, no clocks, no parsing.

Normalisation rules (see ``docs/metrics.md`` and DESIGN section 4):

- One :class:`EngineMetrics` per vLLM ``engine`` label value (V1 >= 0.8.3: one per data-parallel
  rank). Payloads without an ``engine`` label (V0, V1 <= 0.8.2) yield a single engine ``"0"``.
- Renamed families are merged: ``gpu_cache_usage_perc`` and ``kv_cache_usage_perc`` both become
  :attr:`EngineMetrics.kv_cache_usage_ratio`; ``time_per_output_token_seconds`` and
  ``inter_token_latency_seconds`` both become :attr:`EngineMetrics.inter_token_latency`.
- Counters are the cumulative ``<name>_total`` samples; ``<name>_created`` series are ignored.
- ``None`` means "this vLLM does not expose it" (or the series is absent), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram.

    ``bounds`` are the ``le`` upper bounds in ascending order, the last one ``inf``;
    ``cumulative[i]`` is the number of observations ``<= bounds[i]``.
    """

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The capacity facts of ``vllm:cache_config_info`` (label values are Python ``str()``).

    ``"None"`` label values become ``None``. ``num_gpu_blocks`` is vLLM's own figure: it includes
    the reserved null block and, under data parallelism, is the sum over engines repeated on every
    engine's series. ``block_size`` is the minimum over KV-cache groups on hybrid models.
    """

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    sliding_window: int | None = None
    #: 0.33+: the offload pool of ``SimpleCPUOffloadConnector`` in KV blocks (the workers'
    #: aligned count); None without that connector.
    simple_cpu_offload_num_blocks: int | None = None
    #: Every label of the series, verbatim (minus ``engine``), for the info metric and ``check``.
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """What one vLLM engine (one data-parallel rank) reports, normalised across versions."""

    engine: str
    model_name: str | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    #: ``vllm:num_requests_waiting_by_reason`` (0.20+), e.g. ``{"capacity": 3, "deferred": 0}``.
    requests_waiting_by_reason: Mapping[str, float] = field(default_factory=dict)
    #: V0 only: ``vllm:num_requests_swapped``.
    requests_swapped: float | None = None
    #: 0 to 1: ``vllm:kv_cache_usage_perc`` (or ``vllm:gpu_cache_usage_perc`` before 0.9.2).
    kv_cache_usage_ratio: float | None = None
    preemptions_total: float | None = None
    #: ``vllm:request_success_total`` summed over ``finished_reason``.
    requests_finished_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    #: Per finished request: ``vllm:request_prompt_tokens``.
    prompt_tokens: Histogram | None = None
    #: Per finished request: ``vllm:request_generation_tokens``.
    generation_tokens: Histogram | None = None
    time_to_first_token: Histogram | None = None
    #: ``vllm:inter_token_latency_seconds`` (0.11+) or ``vllm:time_per_output_token_seconds``.
    inter_token_latency: Histogram | None = None
    #: ``vllm:e2e_request_latency_seconds``.
    e2e_request_latency: Histogram | None = None
    #: ``vllm:request_queue_time_seconds``.
    request_queue_time: Histogram | None = None
    #: ``vllm:request_params_n``: the ``n`` of each finished request, observed once per request
    #: when its last sequence ends (V1 runs a request with ``n > 1`` as ``n`` sequences).
    request_params_n: Histogram | None = None
    #: ``vllm:engine_sleep_state`` (0.12+): ``{"awake": 1, "weights_offloaded": 0, ...}``.
    sleep_state: Mapping[str, float] = field(default_factory=dict)
    #: ``vllm:prefix_cache_queries_total`` / ``_hits_total``: prompt tokens looked up in, and
    #: found in, the device prefix cache at admission (tokens from 0.9; before 0.9.2 the
    #: ``gpu_prefix_cache_*`` names, counted in blocks before 0.9).
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    #: ``vllm:prompt_tokens_cached_total`` (0.16+): prompt tokens served from any cache.
    prompt_tokens_cached_total: float | None = None
    #: ``vllm:prompt_tokens_cached_by_source_total`` (0.32+): by ``device``, ``host``, ``disk``,
    #: ``p2p`` and ``external_unspecified``.
    prompt_tokens_cached_by_source: Mapping[str, float] = field(default_factory=dict)
    #: ``vllm:prompt_tokens_by_source_total`` (V1): prompt tokens by where their KV came from,
    #: ``local_compute``, ``local_cache_hit`` or ``external_kv_transfer`` (a KV connector: the
    #: prefill instance of P/D, or an offload tier).
    prompt_tokens_by_source: Mapping[str, float] = field(default_factory=dict)
    #: ``vllm:num_requests_kv_fetch_by_stage`` (V1, with a KV connector that loads KV: P/D's
    #: decode side, KV offload): waiting requests by async KV load stage.
    requests_kv_fetch_by_stage: Mapping[str, float] = field(default_factory=dict)
    #: The ``capacity_blocks`` label of ``vllm:simple_kv_offload_info``: the offload pool of
    #: ``SimpleCPUOffloadConnector`` in KV blocks of the GPU pool's layout.
    kv_offload_capacity_blocks: int | None = None
    cache_config: CacheConfig | None = None


@dataclass(frozen=True, slots=True)
class VllmSnapshot:
    """One parsed ``/metrics`` payload of one vLLM server."""

    #: Keyed by engine label value; ``"0"`` when vLLM exposes no ``engine`` label. In rank
    #: order (numeric ranks first, as numbers), which is the order everything downstream shows.
    engines: Mapping[str, EngineMetrics]
    #: Names of the ``vllm:`` families present (as in ``# TYPE`` or samples), for version guesses.
    families: frozenset[str] = frozenset()
    #: ``process_start_time_seconds`` of the API server process, if exposed (restart detection).
    process_start_time_seconds: float | None = None
    #: ``vllm:admission_rejections_total`` summed over reasons (0.32+; no ``engine`` label).
    admission_rejections_total: float | None = None
    #: The same counter by ``reason``, the cap that refused (``max_num_queued_reqs``,
    #: ``max_num_queued_tokens``: :class:`~exporter.core.reasons.AdmissionReason`). vLLM's
    #: reasons are always kept, a few others besides; one past that cap is left out here (and
    #: counted in :attr:`dropped`) but still in the total. Empty where vLLM writes no reason.
    admission_rejections_by_reason: Mapping[str, float] = field(default_factory=dict)
    #: True when vLLM labelled its series with ``engine`` (V1 >= 0.8.3), even if only ``"0"``.
    engine_labelled: bool = False
    #: Samples the parser left out, by reason (:class:`~exporter.core.reasons.DropReason`):
    #: past a cardinality cap, impossible values, a second series where vLLM writes one. Empty
    #: for any real vLLM.
    dropped: Mapping[str, int] = field(default_factory=dict)

    @property
    def dropped_samples(self) -> int:
        """Samples left out, whatever the reason."""
        return sum(self.dropped.values())
