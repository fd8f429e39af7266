"""Every vLLM ``/metrics`` family the project knows: the one table of vLLM's names.

The input-side twin of :mod:`exporter.service.metricdefs`: the parser
(:mod:`exporter.vllm.metrics`), the coverage check (:mod:`exporter.vllm.coverage`), the version
guess (:mod:`exporter.vllm.version`), the simulator (:mod:`exporter.sim`) and the fake vLLM
(:mod:`exporter.testing.fakevllm`) take their ``vllm:`` names from here, so that a name vLLM adds
or renames costs one row. ``tests/vllm/test_families.py`` checks the table against every capture
in ``tests/fixtures/vllm-metrics/`` and that no other module spells a ``vllm:`` name.

Sources: vLLM's V1 loggers (``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/perf.py`` and
``vllm/v1/spec_decode/metrics.py`` of 0.32.0, read in the cached CPU install), the V0 engine's
``vllm/engine/metrics.py`` (0.5 to 0.10) as the V0 captures show it, and the capture headers.
Pure data and small pure accessors.

Names are as ``prometheus_client`` names a family: a counter without its ``_total`` (the sample
is ``vllm:num_preemptions_total``, the 0.0.4 ``# TYPE`` line says ``vllm:num_preemptions_total``
too: :attr:`Family.type_name`). Versions are tuples: ``(0, 9, 2)`` a release, ``(0, 11)`` a
release series. vLLM's deprecation policy (0.7 on; ``--show-hidden-metrics-for-version``): a
family deprecated in X.Y is still shown in X.Y, hidden in X.Y+1 unless that flag names X.Y, and
removed in X.Y+2; :meth:`Family.last_series` is the last series that can write it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Iterable

#: A vLLM release (``(0, 9, 2)``) or release series (``(0, 11)``: every 0.11.x).
Version: TypeAlias = tuple[int, ...]

#: The prefix of every vLLM family (``process_*`` families are the client library's).
PREFIX: Final = "vllm:"


class Kind(StrEnum):
    """The Prometheus type vLLM declares (an ``info`` is a gauge of value 1 with labels)."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Family:
    """One family vLLM writes (or wrote), and what the sidecar makes of it.

    ``feeds`` is the :class:`~exporter.core.snapshot.EngineMetrics` (or, with ``per_server``,
    :class:`~exporter.core.snapshot.VllmSnapshot`) field the parser fills from it; None: not
    read. Families feeding the same field are in the table newest first: the first one present
    wins. ``split``: the label vLLM splits it by, each value kept. ``needed_for``: the figures
    that cannot be made without it (:mod:`exporter.vllm.coverage`). ``dates_version``: its
    ``since`` or last series is firm enough (a capture, a dated vLLM PR) to guess a payload's
    version from (:mod:`exporter.vllm.version`).
    """

    name: str
    kind: Kind
    #: What it is, in a few words (vLLM's HELP text, shortened).
    about: str
    feeds: str | None = None
    split: str | None = None
    needed_for: str | None = None
    #: The engines that write it: ``"V0"``, ``"V1"`` or ``"V0+V1"``.
    engines: str = "V0+V1"
    #: First release with it; None: before 0.5, the oldest the captures show.
    since: Version | None = None
    #: Release series that deprecated it (shown there, hidden in the next, then removed).
    deprecated: Version | None = None
    #: Last release series that writes it, when not from ``deprecated`` (V0 is gone in 0.11).
    until: Version | None = None
    #: The family that replaces it (a rename, or the same figure in other units).
    replaced_by: str | None = None
    #: Written once per API server, without an ``engine`` label.
    per_server: bool = False
    dates_version: bool = False

    @property
    def type_name(self) -> str:
        """The name on a text-format 0.0.4 ``# TYPE`` line: a counter with ``_total``."""
        return self.name + "_total" if self.kind is Kind.COUNTER else self.name

    @property
    def hidden_in(self) -> Version | None:
        """The series in which it is hidden unless ``--show-hidden-metrics-for-version``."""
        return None if self.deprecated is None else _next_series(self.deprecated)

    @property
    def removed_in(self) -> Version | None:
        """The series that no longer has it (known only through the deprecation policy)."""
        hidden = self.hidden_in
        return None if hidden is None else _next_series(hidden)

    @property
    def last_series(self) -> Version | None:
        """The last release series that can write it; None while vLLM still does."""
        if self.until is not None:
            return self.until
        return self.hidden_in


def _next_series(series: Version) -> Version:
    return (series[0], series[1] + 1)


_G, _C, _H, _I = Kind.GAUGE, Kind.COUNTER, Kind.HISTOGRAM, Kind.INFO

#: The table. Order matters twice: the families the figures need come first, in the order
#: :mod:`exporter.vllm.coverage` names them, and a renamed family follows its newer name.
FAMILIES: Final[tuple[Family, ...]] = (
    # --- what the headroom figures need -------------------------------------------------------
    Family(
        "vllm:cache_config_info",
        _I,
        "the engine's CacheConfig as labels (values are Python str())",
        feeds="cache_config",
        needed_for="KV capacity and the sequences that fit",
    ),
    Family(
        "vllm:kv_cache_usage_perc",
        _G,
        "KV-cache usage, 0 to 1",
        feeds="kv_cache_usage_ratio",
        needed_for="tokens in use and free, and the headroom",
        engines="V1",
        since=(0, 9, 2),
        dates_version=True,
    ),
    Family(
        "vllm:gpu_cache_usage_perc",
        _G,
        "GPU KV-cache usage, 0 to 1",
        feeds="kv_cache_usage_ratio",
        deprecated=(0, 10),
        replaced_by="vllm:kv_cache_usage_perc",
        dates_version=True,
    ),
    Family(
        "vllm:request_prompt_tokens",
        _H,
        "prefill tokens of each finished request",
        feeds="prompt_tokens",
        needed_for="context length (prompt part)",
    ),
    Family(
        "vllm:request_generation_tokens",
        _H,
        "generated tokens of each finished request",
        feeds="generation_tokens",
        needed_for="context length (output part)",
    ),
    Family(
        "vllm:num_requests_running",
        _G,
        "requests in model execution batches",
        feeds="requests_running",
        needed_for="running requests and the max_num_seqs headroom",
    ),
    Family(
        "vllm:num_requests_waiting",
        _G,
        "requests waiting to be processed",
        feeds="requests_waiting",
        needed_for="the queue",
    ),
    Family(
        "vllm:num_preemptions",
        _C,
        "preemptions by the engine",
        feeds="preemptions_total",
        needed_for="preemptions",
    ),
    Family(
        "vllm:request_success",
        _C,
        "finished requests, by finished_reason",
        feeds="requests_finished_total",
        split="finished_reason",
        needed_for="finished requests",
    ),
    # --- other families the parser reads -----------------------------------------------------
    Family(
        "vllm:num_requests_swapped",
        _G,
        "requests swapped to CPU",
        feeds="requests_swapped",
        engines="V0",
        until=(0, 10),
        dates_version=True,
    ),
    Family(
        "vllm:num_requests_waiting_by_reason",
        _G,
        "waiting requests by reason (capacity, deferred)",
        feeds="requests_waiting_by_reason",
        split="reason",
        engines="V1",
        since=(0, 20),
        dates_version=True,
    ),
    Family(
        "vllm:engine_sleep_state",
        _G,
        "sleep level, one series per state (awake, weights_offloaded, discard_all)",
        feeds="sleep_state",
        split="sleep_state",
        engines="V1",
        since=(0, 12),
    ),
    Family("vllm:prompt_tokens", _C, "prefill tokens processed", feeds="prompt_tokens_total"),
    Family(
        "vllm:generation_tokens", _C, "generation tokens processed", feeds="generation_tokens_total"
    ),
    Family(
        "vllm:prefix_cache_queries",
        _C,
        "prefix-cache queries, in tokens",
        feeds="prefix_cache_queries_total",
        engines="V1",
        since=(0, 9, 2),
    ),
    Family(
        "vllm:prefix_cache_hits",
        _C,
        "prefix-cache hits, in tokens",
        feeds="prefix_cache_hits_total",
        engines="V1",
        since=(0, 9, 2),
    ),
    Family(
        "vllm:gpu_prefix_cache_queries",
        _C,
        "prefix-cache queries (in blocks until 0.9.0, then tokens)",
        feeds="prefix_cache_queries_total",
        engines="V1",
        deprecated=(0, 10),
        replaced_by="vllm:prefix_cache_queries",
        dates_version=True,
    ),
    Family(
        "vllm:gpu_prefix_cache_hits",
        _C,
        "prefix-cache hits (in blocks until 0.9.0, then tokens)",
        feeds="prefix_cache_hits_total",
        engines="V1",
        deprecated=(0, 10),
        replaced_by="vllm:prefix_cache_hits",
        dates_version=True,
    ),
    Family(
        "vllm:prompt_tokens_cached",
        _C,
        "prompt tokens served from any cache (local and external)",
        feeds="prompt_tokens_cached_total",
        engines="V1",
        since=(0, 16),
    ),
    Family(
        "vllm:prompt_tokens_cached_by_source",
        _C,
        "prefix-cache hit tokens by the tier that supplied them",
        feeds="prompt_tokens_cached_by_source",
        split="source",
        engines="V1",
        since=(0, 32),
    ),
    Family(
        "vllm:time_to_first_token_seconds",
        _H,
        "time to first token",
        feeds="time_to_first_token",
    ),
    Family(
        "vllm:inter_token_latency_seconds",
        _H,
        "inter-token latency",
        feeds="inter_token_latency",
        engines="V1",
        since=(0, 11),
        dates_version=True,
    ),
    Family(
        "vllm:time_per_output_token_seconds",
        _H,
        "time per output token (the inter-token latency before 0.11)",
        feeds="inter_token_latency",
        until=(0, 10),
        replaced_by="vllm:inter_token_latency_seconds",
    ),
    Family(
        "vllm:e2e_request_latency_seconds",
        _H,
        "end-to-end request latency",
        feeds="e2e_request_latency",
    ),
    Family(
        "vllm:request_queue_time_seconds",
        _H,
        "time spent waiting (queued)",
        feeds="request_queue_time",
    ),
    Family(
        "vllm:request_params_n",
        _H,
        "the n request parameter, once per request",
        feeds="request_params_n",
    ),
    Family(
        "vllm:admission_rejections",
        _C,
        "admission attempts rejected by a queue limit, by reason",
        feeds="admission_rejections_total",
        split="reason",
        engines="V1",
        since=(0, 32),
        per_server=True,
        dates_version=True,
    ),
    # Declared only with a KV connector whose kv_role consumes KV (kv_consumer or kv_both: the
    # decode side of P/D, and --kv-offloading-size, which sets kv_both); in 0.32.0's loggers.py
    # already (its first release not established: not used to date a payload).
    Family(
        "vllm:num_requests_kv_fetch_by_stage",
        _G,
        "waiting requests by async KV load stage (waiting_to_start, in_progress, "
        "completed_waiting)",
        feeds="requests_kv_fetch_by_stage",
        split="stage",
        engines="V1",
        since=(0, 32),
    ),
    # SimpleCPUOffloadConnector only (vllm/v1/simple_kv_offload/metrics.py, 0.32.0 and
    # 0.33.0): an info gauge whose capacity_blocks label is the offload pool in KV blocks.
    Family(
        "vllm:simple_kv_offload_info",
        _I,
        "SimpleCPUOffloadConnector facts as labels (backend, capacity_blocks...)",
        feeds="kv_offload_capacity_blocks",
        engines="V1",
        since=(0, 32),
    ),
    Family(
        "process_start_time_seconds",
        _G,
        "start of the server process (client library collector): restarts",
        feeds="process_start_time_seconds",
        per_server=True,
    ),
    # --- known, not read ----------------------------------------------------------------------
    Family(
        "vllm:request_num_preemptions",
        _H,
        "preemptions of each finished request",
        engines="V1",
        since=(0, 30),
        dates_version=True,
    ),
    Family(
        "vllm:lora_requests_info",
        _G,
        "running and waiting LoRA adapters, as labels",
        since=(0, 6, 4),
        dates_version=True,
    ),
    Family(
        "vllm:cpu_cache_usage_perc",
        _G,
        "CPU (swap) KV-cache usage",
        engines="V0",
        until=(0, 10),
        dates_version=True,
    ),
    Family(
        "vllm:cpu_prefix_cache_hit_rate",
        _G,
        "CPU prefix-cache hit rate",
        engines="V0",
        until=(0, 10),
    ),
    Family(
        "vllm:gpu_prefix_cache_hit_rate",
        _G,
        "GPU prefix-cache hit rate",
        engines="V0",
        until=(0, 10),
    ),
    # Removed on 2025-01-24 (vLLM PR 12383).
    Family(
        "vllm:avg_prompt_throughput_toks_per_s",
        _G,
        "average prefill throughput",
        engines="V0",
        until=(0, 7),
        dates_version=True,
    ),
    Family(
        "vllm:avg_generation_throughput_toks_per_s",
        _G,
        "average generation throughput",
        engines="V0",
        until=(0, 7),
        dates_version=True,
    ),
    Family("vllm:iteration_tokens_total", _H, "tokens per engine step"),
    Family("vllm:request_max_num_generation_tokens", _H, "max generation tokens requested"),
    Family("vllm:request_params_max_tokens", _H, "the max_tokens request parameter"),
    Family("vllm:request_inference_time_seconds", _H, "time spent running"),
    Family("vllm:request_prefill_time_seconds", _H, "time spent in prefill"),
    Family("vllm:request_decode_time_seconds", _H, "time spent in decode"),
    Family(
        "vllm:request_time_per_output_token_seconds",
        _H,
        "mean time per output token of each request",
        engines="V1",
    ),
    Family(
        "vllm:request_prefill_kv_computed_tokens",
        _H,
        "new KV tokens computed in prefill (cached ones excluded)",
        engines="V1",
    ),
    Family(
        "vllm:prompt_tokens_by_source",
        _C,
        "prompt tokens by source (local_compute, local_cache_hit, external_kv_transfer)",
        feeds="prompt_tokens_by_source",
        split="source",
        engines="V1",
    ),
    Family(
        "vllm:external_prefix_cache_queries",
        _C,
        "KV-connector prefix-cache queries, in tokens",
        engines="V1",
    ),
    Family(
        "vllm:external_prefix_cache_hits",
        _C,
        "KV-connector prefix-cache hits, in tokens",
        engines="V1",
    ),
    # Declared only with speculative decoding on (vllm/v1/spec_decode/metrics.py SpecDecodingProm,
    # 0.32.0); V1's counters since about 0.8.5 (not firm: not used to date a payload).
    Family(
        "vllm:spec_decode_num_drafts",
        _C,
        "speculative-decoding drafts",
        engines="V1",
        since=(0, 8, 5),
    ),
    Family(
        "vllm:spec_decode_num_draft_tokens",
        _C,
        "speculative-decoding draft tokens",
        engines="V1",
        since=(0, 8, 5),
    ),
    Family(
        "vllm:spec_decode_num_accepted_tokens",
        _C,
        "speculative-decoding accepted tokens",
        engines="V1",
        since=(0, 8, 5),
    ),
    Family(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        _C,
        "accepted tokens by draft position",
        split="position",
        engines="V1",
        since=(0, 8, 5),
    ),
    Family("vllm:mm_cache_queries", _C, "multi-modal cache queries, in items", engines="V1"),
    Family("vllm:mm_cache_hits", _C, "multi-modal cache hits, in items", engines="V1"),
    # vLLM declares these with `_total` in the name (vllm/v1/metrics/perf.py): prometheus_client
    # strips it, so the family is as below and the sample `..._total`.
    Family("vllm:estimated_flops_per_gpu", _C, "MFU estimate: FLOPs per GPU", engines="V1"),
    Family(
        "vllm:estimated_read_bytes_per_gpu", _C, "MFU estimate: bytes read per GPU", engines="V1"
    ),
    Family(
        "vllm:estimated_write_bytes_per_gpu",
        _C,
        "MFU estimate: bytes written per GPU",
        engines="V1",
    ),
    # --- written only when configured (vLLM 0.33.0's loggers.py, read in the released wheel) --
    Family(
        "vllm:corrupted_requests",
        _C,
        "requests with NaNs in logits (VLLM_COMPUTE_NANS_IN_LOGITS only)",
        engines="V1",
    ),
    Family(
        "vllm:watermark_requests",
        _C,
        "finished requests by watermark status (watermark_config only)",
        engines="V1",
    ),
    Family(
        "vllm:kv_block_lifetime_seconds",
        _H,
        "KV block lifetime, allocation to eviction (kv_cache_metrics only)",
        engines="V1",
    ),
    Family(
        "vllm:kv_block_idle_before_evict_seconds",
        _H,
        "KV block idle time before eviction (kv_cache_metrics only)",
        engines="V1",
    ),
    Family(
        "vllm:kv_block_reuse_gap_seconds",
        _H,
        "time between reuses of a KV block (kv_cache_metrics only)",
        engines="V1",
    ),
    # KV offload, written only with its connector (0.32.0 and 0.33.0): SimpleCPUOffloadConnector
    # (vllm/v1/simple_kv_offload/metrics.py) and OffloadingConnector, the default of
    # --kv-offloading-size (vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py,
    # vllm/v1/kv_offload/cpu/common.py). Only the first's pool size (simple_kv_offload_info)
    # is read; the second writes no size at all.
    Family(
        "vllm:simple_kv_offload_used_blocks",
        _G,
        "offload-pool blocks pinned by transfers or cache hits (evictable ones not counted)",
        engines="V1",
        since=(0, 32),
    ),
    Family(
        "vllm:simple_kv_offload_pending_store_blocks",
        _G,
        "offload blocks in pending stores",
        engines="V1",
        since=(0, 32),
    ),
    Family(
        "vllm:simple_kv_offload_load_blocks",
        _C,
        "KV blocks restored to GPU from the offload pool",
        engines="V1",
        since=(0, 32),
    ),
    Family(
        "vllm:simple_kv_offload_save_outcomes",
        _C,
        "offload store decisions, by outcome",
        split="outcome",
        engines="V1",
        since=(0, 32),
    ),
    Family(
        "vllm:kv_offload_cpu_cache_usage_perc",
        _G,
        "share of the CPU offload space pinned by in-flight transfers (not its fill)",
        engines="V1",
        since=(0, 32),
    ),
    Family("vllm:kv_offload_load_bytes", _C, "bytes loaded from offload to GPU", engines="V1"),
    Family("vllm:kv_offload_store_bytes", _C, "bytes stored from GPU to offload", engines="V1"),
)

_BY_NAME: Final = {family.name: family for family in FAMILIES}


def family(name: str) -> Family:
    """The row of ``name`` (as :attr:`Family.name` spells it); KeyError names the fix."""
    row = _BY_NAME.get(name)
    if row is None:
        raise KeyError(f"{name!r} is not in exporter/vllm/families.py FAMILIES: add its row")
    return row


def named(short: str) -> str:
    """``"vllm:" + short`` once checked against the table: how other modules spell a name.

    Importing a module that names a family vLLM does not have (a typo) fails at once.
    """
    return family(PREFIX + short).name


def feeding(field: str) -> tuple[Family, ...]:
    """The families that fill ``field``, newest first (the first one present wins)."""
    return tuple(row for row in FAMILIES if row.feeds == field)


def read(kind: Kind, *, split: bool = False) -> tuple[Family, ...]:
    """The families of ``kind`` the parser reads per engine, with or without a split label."""
    return tuple(
        row
        for row in FAMILIES
        if row.kind is kind
        and row.feeds is not None
        and not row.per_server
        and (row.split is not None) == split
    )


def names(rows: Iterable[Family]) -> tuple[str, ...]:
    """The names of ``rows``, in order."""
    return tuple(row.name for row in rows)
