"""Every metric vllm-headroom exposes: name, type, labels, help text and source.

This table is the single source of truth. The collectors fill their families from it, reading
each value from the row object by the attribute named here and each label by its name (so
neither a name nor a field can drift), ``check --json`` takes its keys from it,
``docs/metrics.md`` is generated from it, and a test proves that the real exposition contains
exactly these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """Prometheus metric types we use."""

    GAUGE = "gauge"
    COUNTER = "counter"
    INFO = "info"


class Scope(StrEnum):
    """Which endpoint exposes a metric."""

    #: Per vLLM target: on ``/metrics`` in sidecar mode and on ``/probe`` in fleet mode.
    TARGET = "target"
    #: The exporter itself: always on ``/metrics``.
    EXPORTER = "exporter"


class Row(StrEnum):
    """What a metric's samples are read from: one object per sample set, labels by name."""

    #: One :class:`~exporter.core.derive.EngineDerived` per vLLM engine (``engine``,
    #: ``model_name``).
    ENGINE = "engine"
    #: The target's :class:`~exporter.core.views.PredictionView`.
    PREDICTION = "prediction"
    #: One :class:`~exporter.core.views.GpuMemoryView` per GPU (``gpu``, ``uuid``).
    GPU = "gpu"
    #: One :class:`~exporter.core.views.SourceHealth` per source (``source``).
    SOURCE = "source"
    #: The :class:`~exporter.core.views.TargetView` itself.
    TARGET = "target"
    #: The exporter's own state (:class:`~exporter.service.collector.ExporterView`).
    EXPORTER = "exporter"
    #: Written by the guarded collector around every builder.
    COLLECTOR = "collector"


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One exposed metric family, and where its samples come from."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    scope: Scope = Scope.TARGET
    #: Shown in docs/metrics.md: where the number comes from.
    source: str = ""
    #: The object the samples are read from.
    row: Row = Row.TARGET
    #: The attribute of the row holding the value. A mapping gives one sample per key, the key
    #: being the last label's value; an info metric's mapping holds its labels.
    field: str | None = None
    #: The key of the figure in ``check --json`` (engine objects and the prediction), if shown.
    check_key: str | None = None


ENGINE = ("engine", "model_name")
GPU = ("gpu", "uuid")
SOURCE = ("source",)

_DEFS: tuple[MetricDef, ...] = (
    # --- KV-cache capacity ------------------------------------------------------------------
    MetricDef(
        "headroom_kv_capacity_tokens",
        Kind.GAUGE,
        "KV-cache capacity vLLM allocated for this engine, in tokens.",
        ENGINE,
        source="vllm:cache_config_info kv_cache_size_tokens, else num_gpu_blocks x block_size "
        "(num_gpu_blocks divided over data-parallel engines)",
        row=Row.ENGINE,
        field="kv_capacity_tokens",
        check_key="kv_capacity_tokens",
    ),
    MetricDef(
        "headroom_kv_capacity_predicted_tokens",
        Kind.GAUGE,
        "KV-cache capacity the sizing model predicts for this engine, in vLLM's own terms.",
        ENGINE,
        source="sizing model over the model's config.json, GPU memory and cache_config_info",
        row=Row.ENGINE,
        field="kv_capacity_predicted_tokens",
        check_key="kv_capacity_predicted_tokens",
    ),
    MetricDef(
        "headroom_kv_capacity_prediction_error_ratio",
        Kind.GAUGE,
        "(predicted - actual) / actual KV-cache capacity.",
        ENGINE,
        source="headroom_kv_capacity_predicted_tokens and headroom_kv_capacity_tokens",
        row=Row.ENGINE,
        field="kv_capacity_error_ratio",
        check_key="kv_capacity_error_ratio",
    ),
    MetricDef(
        "headroom_kv_blocks",
        Kind.GAUGE,
        "KV-cache blocks of this engine, including vLLM's reserved null block.",
        ENGINE,
        source="vllm:cache_config_info num_gpu_blocks / engines",
        row=Row.ENGINE,
        field="kv_blocks",
        check_key="kv_blocks",
    ),
    MetricDef(
        "headroom_kv_block_size_tokens",
        Kind.GAUGE,
        "Tokens per KV-cache block.",
        ENGINE,
        source="vllm:cache_config_info block_size",
        row=Row.ENGINE,
        field="kv_block_size_tokens",
        check_key="kv_block_size_tokens",
    ),
    # --- KV offload tier (kept apart from the GPU pool) ---------------------------------------
    MetricDef(
        "headroom_kv_offload_blocks",
        Kind.GAUGE,
        "KV blocks of this engine's CPU offload pool (SimpleCPUOffloadConnector only), of the "
        "GPU pool's layout.",
        ENGINE,
        source="vllm:simple_kv_offload_info capacity_blocks, else vllm:cache_config_info "
        "simple_cpu_offload_num_blocks (0.33)",
        row=Row.ENGINE,
        field="kv_offload_capacity_blocks",
        check_key="kv_offload_blocks",
    ),
    MetricDef(
        "headroom_kv_offload_capacity_tokens",
        Kind.GAUGE,
        "KV tokens this engine's CPU offload pool holds (SimpleCPUOffloadConnector only). Not "
        "room to run: an offloaded block is loaded back into a GPU block before its request "
        "runs, so it holds cached prefixes for later hits (a preempted request's too), never "
        "running sequences.",
        ENGINE,
        source="headroom_kv_offload_blocks x headroom_kv_capacity_tokens / headroom_kv_blocks",
        row=Row.ENGINE,
        field="kv_offload_capacity_tokens",
        check_key="kv_offload_capacity_tokens",
    ),
    MetricDef(
        "headroom_kv_effective_capacity_tokens",
        Kind.GAUGE,
        "KV tokens this engine can keep, GPU pool plus CPU offload pool: the reach of its "
        "prefix cache. Running sequences fit only in the GPU pool (headroom_kv_capacity_tokens, "
        "which the headroom uses); absent without an offload pool of known size.",
        ENGINE,
        source="headroom_kv_capacity_tokens + headroom_kv_offload_capacity_tokens",
        row=Row.ENGINE,
        field="kv_effective_capacity_tokens",
        check_key="kv_effective_capacity_tokens",
    ),
    MetricDef(
        "headroom_kv_usable_tokens",
        Kind.GAUGE,
        "KV-cache tokens running requests can hold: capacity less the reserved null block.",
        ENGINE,
        source="capacity x (blocks - 1) / blocks",
        row=Row.ENGINE,
        field="kv_usable_tokens",
        check_key="kv_usable_tokens",
    ),
    MetricDef(
        "headroom_kv_used_tokens",
        Kind.GAUGE,
        "KV-cache tokens held by running requests, in whole blocks.",
        ENGINE,
        source="vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before 0.9.2) x usable tokens",
        row=Row.ENGINE,
        field="kv_used_tokens",
        check_key="kv_tokens_used",
    ),
    MetricDef(
        "headroom_kv_free_tokens",
        Kind.GAUGE,
        "KV-cache tokens free for new or growing requests (evictable prefix cache counts as free;"
        " 0 while the engine sleeps).",
        ENGINE,
        source="usable - used tokens; 0 asleep",
        row=Row.ENGINE,
        field="kv_free_tokens",
        check_key="kv_tokens_free",
    ),
    MetricDef(
        "headroom_kv_usage_ratio",
        Kind.GAUGE,
        "Fraction of the usable KV-cache blocks held by running requests (0 to 1).",
        ENGINE,
        source="vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc before 0.9.2",
        row=Row.ENGINE,
        field="kv_usage_ratio",
        check_key="kv_usage_ratio",
    ),
    # --- Real traffic -----------------------------------------------------------------------
    MetricDef(
        "headroom_context_length_p50_tokens",
        Kind.GAUGE,
        "Median context length (prompt + output tokens) of requests finished in the window.",
        ENGINE,
        source="bucket deltas of vllm:request_prompt_tokens + vllm:request_generation_tokens",
        row=Row.ENGINE,
        field="context_p50_tokens",
    ),
    MetricDef(
        "headroom_context_length_p95_tokens",
        Kind.GAUGE,
        "95th percentile context length (prompt + output tokens) of requests finished in the "
        "window; since vLLM started when none finished in it.",
        ENGINE,
        source="bucket deltas of vllm:request_prompt_tokens + vllm:request_generation_tokens",
        row=Row.ENGINE,
        field="context_p95_tokens",
    ),
    MetricDef(
        "headroom_context_length_p99_tokens",
        Kind.GAUGE,
        "99th percentile context length (prompt + output tokens) of requests finished in the "
        "window.",
        ENGINE,
        source="bucket deltas of vllm:request_prompt_tokens + vllm:request_generation_tokens",
        row=Row.ENGINE,
        field="context_p99_tokens",
    ),
    MetricDef(
        "headroom_context_length_mean_tokens",
        Kind.GAUGE,
        "Mean context length (prompt + output tokens) of requests finished in the window (exact).",
        ENGINE,
        source="_sum / _count deltas of the per-request token histograms",
        row=Row.ENGINE,
        field="context_mean_tokens",
    ),
    MetricDef(
        "headroom_context_window_requests",
        Kind.GAUGE,
        "Requests the context figures are read from: those finished within the context window, "
        "reaching back for context_min_requests (0: context figures are since vLLM started).",
        ENGINE,
        source="vllm:request_prompt_tokens_count delta",
        row=Row.ENGINE,
        field="context_window_requests",
    ),
    MetricDef(
        "headroom_context_window_seconds",
        Kind.GAUGE,
        "Seconds the context figures look back over: the context window, or further where it "
        "held fewer than context_min_requests requests (0: context figures are since vLLM "
        "started).",
        ENGINE,
        source="timestamps of the polls whose vllm:request_prompt_tokens deltas are counted",
        row=Row.ENGINE,
        field="context_window_seconds",
    ),
    # --- Concurrency and headroom -----------------------------------------------------------
    MetricDef(
        "headroom_p95_ceiling_sequences",
        Kind.GAUGE,
        "Sequences of p95 context length vLLM runs at once: the smallest of every limit (the "
        "usable KV cache counting no block shared, max_num_seqs, the --max-num-queued-reqs "
        "admission cap where declared; 0 while the engine sleeps).",
        ENGINE,
        source="min(headroom_p95_kv_ceiling_sequences, max_num_seqs, max_num_queued_reqs)",
        row=Row.ENGINE,
        field="p95_ceiling_sequences",
        check_key="p95_ceiling_sequences",
    ),
    MetricDef(
        "headroom_p95_ceiling_limited_by",
        Kind.GAUGE,
        "1 for the limit that caps the p95 ceiling (kv_cache, max_num_seqs, engine_asleep, "
        "queue_cap: vLLM's admission cap, past which it refuses requests with 503), 0 for the "
        "others.",
        (*ENGINE, "limit"),
        source="the smallest of the limits; on a tie, queue_cap, then max_num_seqs",
        row=Row.ENGINE,
        field="p95_ceiling_limited_by",
    ),
    MetricDef(
        "headroom_p95_kv_ceiling_sequences",
        Kind.GAUGE,
        "Sequences of p95 context length the usable KV cache alone holds, none sharing a block.",
        ENGINE,
        source="usable tokens // (ceil(p95 / block_size) x block_size) on a pool of one "
        "full-attention group; other layouts: usable blocks // the blocks the model's KV-cache "
        "groups take at p95, where they match vLLM's num_gpu_blocks / kv_cache_max_concurrency "
        "(absent without them, below max_model_len)",
        row=Row.ENGINE,
        field="p95_kv_ceiling_sequences",
        check_key="p95_kv_ceiling_sequences",
    ),
    MetricDef(
        "headroom_p95_effective_ceiling_sequences",
        Kind.GAUGE,
        "Sequences of p95 context length vLLM runs at once when prefix-cache blocks shared "
        "between them are held once (the prefix hit ratio of the window), under max_num_seqs.",
        ENGINE,
        source="(usable - shared) // (p95 blocks - shared), shared = hit ratio x mean prompt",
        row=Row.ENGINE,
        field="p95_effective_ceiling_sequences",
        check_key="p95_effective_ceiling_sequences",
    ),
    MetricDef(
        "headroom_mean_ceiling_sequences",
        Kind.GAUGE,
        "Sequences of mean context length vLLM runs at once (KV cache and max_num_seqs).",
        ENGINE,
        source="min(usable tokens // (ceil(mean / block_size) x block_size), max_num_seqs); "
        "other layouts as headroom_p95_kv_ceiling_sequences",
        row=Row.ENGINE,
        field="mean_ceiling_sequences",
        check_key="mean_ceiling_sequences",
    ),
    MetricDef(
        "headroom_p95_available_sequences",
        Kind.GAUGE,
        "Headroom: how many more sequences of p95 context length vLLM would start now, under "
        "every limit (free KV cache counting no block shared, free max_num_seqs slots, room "
        "under the admission cap: 0 while vLLM refuses requests).",
        ENGINE,
        source="min(free tokens // (ceil(p95 / block_size) x block_size) (other layouts as "
        "headroom_p95_kv_ceiling_sequences), "
        "max_num_seqs - running sequences, max_num_queued_reqs - running - waiting of the "
        "server; 0 when vllm:admission_rejections_total rose in the rate window)",
        row=Row.ENGINE,
        field="p95_available_sequences",
        check_key="p95_available_sequences",
    ),
    MetricDef(
        "headroom_p95_available_limited_by",
        Kind.GAUGE,
        "1 for the limit that stops the next p95 sequence now (kv_cache, max_num_seqs, "
        "engine_asleep, queue_cap), 0 for the others.",
        (*ENGINE, "limit"),
        source="the smallest of the free KV cache, the free max_num_seqs slots and the room "
        "under the admission cap",
        row=Row.ENGINE,
        field="p95_available_limited_by",
    ),
    MetricDef(
        "headroom_p95_kv_available_sequences",
        Kind.GAUGE,
        "More sequences of p95 context length the free KV cache alone holds now.",
        ENGINE,
        source="free tokens // (ceil(p95 / block_size) x block_size)",
        row=Row.ENGINE,
        field="p95_kv_available_sequences",
        check_key="p95_kv_available_sequences",
    ),
    MetricDef(
        "headroom_p95_effective_available_sequences",
        Kind.GAUGE,
        "Headroom counting shared prefix-cache blocks once: more p95 sequences vLLM would start "
        "now when each holds only its own blocks beyond the shared prefix.",
        ENGINE,
        source="free tokens // (p95 blocks - shared), under the free max_num_seqs slots",
        row=Row.ENGINE,
        field="p95_effective_available_sequences",
        check_key="p95_effective_available_sequences",
    ),
    MetricDef(
        "headroom_p95_available_requests",
        Kind.GAUGE,
        "Headroom in requests: more p95 requests that fit now (a request with n > 1 holds n "
        "sequences).",
        ENGINE,
        source="headroom_p95_available_sequences // headroom_sequences_per_request",
        row=Row.ENGINE,
        field="p95_available_requests",
        check_key="p95_available_requests",
    ),
    MetricDef(
        "headroom_p95_available_ratio",
        Kind.GAUGE,
        "Headroom as a fraction of the p95 ceiling (0: full, 1: empty).",
        ENGINE,
        source="headroom_p95_available_sequences / headroom_p95_ceiling_sequences",
        row=Row.ENGINE,
        field="p95_available_ratio",
    ),
    MetricDef(
        "headroom_max_num_seqs",
        Kind.GAUGE,
        "The scheduler's limit on running sequences (--max-num-seqs, or --max-num-active-seqs "
        "when lower), by where it was learnt: command_line, setting or default.",
        (*ENGINE, "origin"),
        source="the vLLM process's command line, else the max_num_seqs setting, else vLLM's "
        "default for its version, GPU and world size (docs/sizing.md)",
        row=Row.ENGINE,
        field="max_num_seqs_by_source",
        check_key="max_num_seqs",
    ),
    MetricDef(
        "headroom_engine_asleep",
        Kind.GAUGE,
        "1 while the engine sleeps or is paused (it runs nothing), 0 while awake (vLLM 0.12+).",
        ENGINE,
        source='vllm:engine_sleep_state{sleep_state="awake"} = 0',
        row=Row.ENGINE,
        field="engine_asleep",
        check_key="engine_asleep",
    ),
    MetricDef(
        "headroom_prefix_cache_hit_ratio",
        Kind.GAUGE,
        "Prompt tokens found in the device prefix cache over those looked up, over the context "
        "window as far as it reached back for requests (since vLLM started when none were "
        "looked up in it).",
        ENGINE,
        source="increase of vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total",
        row=Row.ENGINE,
        field="prefix_cache_hit_ratio",
        check_key="prefix_cache_hit_ratio",
    ),
    MetricDef(
        "headroom_shared_prefix_tokens",
        Kind.GAUGE,
        "Mean prompt tokens per request served from the prefix cache: the part of a sequence "
        "the effective ceiling counts once.",
        ENGINE,
        source="headroom_prefix_cache_hit_ratio x mean prompt tokens of the window",
        row=Row.ENGINE,
        field="shared_prefix_tokens",
        check_key="shared_prefix_tokens",
    ),
    MetricDef(
        "headroom_kv_tokens_per_running_sequence",
        Kind.GAUGE,
        "KV-cache tokens in use per running sequence (shared blocks counted once): below the "
        "context length when sequences share prefixes.",
        ENGINE,
        source="headroom_kv_used_tokens / headroom_sequences_running",
        row=Row.ENGINE,
        field="kv_tokens_per_running_sequence",
        check_key="kv_tokens_per_running_sequence",
    ),
    MetricDef(
        "headroom_prompt_tokens_cached_ratio",
        Kind.GAUGE,
        "Prompt tokens served from a cache tier (device, host, disk, p2p, external_unspecified) "
        "over all prompt tokens, in the context window (vLLM 0.32+).",
        (*ENGINE, "source"),
        source="increase of vllm:prompt_tokens_cached_by_source_total / vllm:prompt_tokens_total",
        row=Row.ENGINE,
        field="prompt_tokens_cached_ratio_by_source",
        check_key="prompt_tokens_cached_ratio",
    ),
    MetricDef(
        "headroom_prompt_tokens_ratio",
        Kind.GAUGE,
        "Prompt tokens by where their KV came from (local_compute, local_cache_hit, "
        "external_kv_transfer: a KV connector, the prefill side of P/D or an offload tier, "
        "apart from the GPU pool) over all prompt tokens, in the context window (V1).",
        (*ENGINE, "source"),
        source="increase of vllm:prompt_tokens_by_source_total / vllm:prompt_tokens_total",
        row=Row.ENGINE,
        field="prompt_tokens_ratio_by_source",
        check_key="prompt_tokens_ratio",
    ),
    MetricDef(
        "headroom_preemptions_per_second",
        Kind.GAUGE,
        "Preemptions per second over the rate window (reset-aware).",
        ENGINE,
        source="increase of vllm:num_preemptions_total",
        row=Row.ENGINE,
        field="preemptions_per_second",
    ),
    MetricDef(
        "headroom_preemptions_per_finished_request",
        Kind.GAUGE,
        "Preemptions per finished sequence over the rate window (vLLM counts each of a "
        "request's n sequences as a request); absent when none finished.",
        ENGINE,
        source="increase of vllm:num_preemptions_total / increase of vllm:request_success_total",
        row=Row.ENGINE,
        field="preemptions_per_finished_request",
    ),
    MetricDef(
        "headroom_finished_requests_per_second",
        Kind.GAUGE,
        "Requests finished per second over the rate window; a request with n > 1 counts once.",
        ENGINE,
        source="increase of vllm:request_params_n_count (once per request), else of "
        "vllm:request_success_total (all finished reasons)",
        row=Row.ENGINE,
        field="finished_requests_per_second",
    ),
    MetricDef(
        "headroom_requests_running",
        Kind.GAUGE,
        "Requests in vLLM's running batch; a request with n > 1 counts once.",
        ENGINE,
        source="vllm:num_requests_running / mean n (V1 counts each of a request's n sequences)",
        row=Row.ENGINE,
        field="requests_running",
        check_key="num_requests_running",
    ),
    MetricDef(
        "headroom_sequences_running",
        Kind.GAUGE,
        "Sequences in vLLM's running batch: what max_num_seqs and the KV cache limit.",
        ENGINE,
        source="vllm:num_requests_running (V1); x mean n on V0, which counts requests",
        row=Row.ENGINE,
        field="sequences_running",
        check_key="num_sequences_running",
    ),
    MetricDef(
        "headroom_sequences_per_request",
        Kind.GAUGE,
        "Mean n (parallel samples) of requests finished in the context window (exact).",
        ENGINE,
        source="_sum / _count deltas of vllm:request_params_n",
        row=Row.ENGINE,
        field="sequences_per_request",
        check_key="sequences_per_request",
    ),
    MetricDef(
        "headroom_requests_waiting",
        Kind.GAUGE,
        "Requests waiting in vLLM's queue.",
        ENGINE,
        source="vllm:num_requests_waiting",
        row=Row.ENGINE,
        field="requests_waiting",
        check_key="num_requests_waiting",
    ),
    MetricDef(
        "headroom_requests_waiting_by_reason",
        Kind.GAUGE,
        "Requests waiting in vLLM's queue, by reason (vLLM 0.20+).",
        (*ENGINE, "reason"),
        source="vllm:num_requests_waiting_by_reason",
        row=Row.ENGINE,
        field="requests_waiting_by_reason",
        check_key="num_requests_waiting_by_reason",
    ),
    MetricDef(
        "headroom_requests_kv_fetch_by_stage",
        Kind.GAUGE,
        "Waiting requests whose KV is loaded asynchronously by a KV connector (P/D's decode "
        "side, KV offload), by stage: waiting_to_start, in_progress, completed_waiting.",
        (*ENGINE, "stage"),
        source="vllm:num_requests_kv_fetch_by_stage (kv_role kv_consumer or kv_both)",
        row=Row.ENGINE,
        field="requests_kv_fetch_by_stage",
        check_key="num_requests_kv_fetch_by_stage",
    ),
    # --- Sizing chain (per GPU of this target) ----------------------------------------------
    MetricDef(
        "headroom_kv_bytes_per_token",
        Kind.GAUGE,
        "KV-cache bytes one token costs on one GPU (all layers, K and V, this GPU's share).",
        source="sizing model: 2 x layers x kv_heads_per_gpu x head_dim x dtype bytes (MLA: latent)",
        row=Row.PREDICTION,
        field="bytes_per_token",
        check_key="bytes_per_token",
    ),
    MetricDef(
        "headroom_predicted_weights_bytes",
        Kind.GAUGE,
        "Model weights per GPU, as the sizing model counts them.",
        source="model.safetensors index / file sizes, else parameters x bytes per parameter",
        row=Row.PREDICTION,
        field="weights_bytes",
        check_key="weights_bytes",
    ),
    MetricDef(
        "headroom_predicted_overhead_bytes",
        Kind.GAUGE,
        "Activation peak and non-torch memory per GPU, as the sizing model estimates them.",
        source="sizing model overhead estimate (docs/sizing.md)",
        row=Row.PREDICTION,
        field="overhead_bytes",
        check_key="overhead_bytes",
    ),
    MetricDef(
        "headroom_predicted_kv_budget_bytes",
        Kind.GAUGE,
        "KV-cache memory per GPU the sizing model predicts vLLM allocates.",
        source="total x gpu_memory_utilization - weights - overhead, or kv_cache_memory_bytes",
        row=Row.PREDICTION,
        field="kv_budget_bytes",
        check_key="kv_budget_bytes",
    ),
    MetricDef(
        "headroom_sizing_info",
        Kind.INFO,
        "The inputs of the sizing model for this target (value 1, facts in labels).",
        (
            "model",
            "attention",
            "layers",
            "kv_heads",
            "head_dim",
            "kv_dtype",
            "tensor_parallel",
            "pipeline_parallel",
            "block_size",
            "vllm_version",
        ),
        source="config.json, /v1/models, /version, vllm:cache_config_info and settings",
        row=Row.PREDICTION,
        field="info",
    ),
    MetricDef(
        "headroom_prediction_state",
        Kind.GAUGE,
        "1 for the current state of the capacity prediction: ok, or why it is missing.",
        ("state",),
        source="model discovery and the sizing model",
        row=Row.PREDICTION,
        field="state_flags",
    ),
    # --- GPU memory (NVML, or dcgm-exporter with gpu_source=dcgm) ---------------------------
    MetricDef(
        "headroom_gpu_memory_total_bytes",
        Kind.GAUGE,
        "Memory of a GPU vLLM uses.",
        GPU,
        source="NVML nvmlDeviceGetMemoryInfo; dcgm: DCGM_FI_DEV_FB_USED + _FREE + _RESERVED",
        row=Row.GPU,
        field="total_bytes",
    ),
    MetricDef(
        "headroom_gpu_memory_used_bytes",
        Kind.GAUGE,
        "Memory in use on a GPU vLLM uses, by every process.",
        GPU,
        source="NVML nvmlDeviceGetMemoryInfo; dcgm: DCGM_FI_DEV_FB_USED",
        row=Row.GPU,
        field="used_bytes",
    ),
    MetricDef(
        "headroom_gpu_memory_free_bytes",
        Kind.GAUGE,
        "Memory free on a GPU vLLM uses.",
        GPU,
        source="NVML nvmlDeviceGetMemoryInfo; dcgm: DCGM_FI_DEV_FB_FREE",
        row=Row.GPU,
        field="free_bytes",
    ),
    MetricDef(
        "headroom_gpu_memory_vllm_bytes",
        Kind.GAUGE,
        "Memory used on a GPU by vLLM's own processes.",
        GPU,
        source="NVML running compute processes matched to vLLM's PIDs (never from dcgm)",
        row=Row.GPU,
        field="vllm_bytes",
    ),
    MetricDef(
        "headroom_gpu_memory_foreign_bytes",
        Kind.GAUGE,
        "Memory used on a GPU by processes other than this vLLM (OOM risk on shared GPUs); "
        "absent when NVML's processes cannot be matched to vLLM's PIDs.",
        GPU,
        source="NVML used memory - memory of vLLM's processes (matched by PID; never from dcgm)",
        row=Row.GPU,
        field="foreign_bytes",
    ),
    MetricDef(
        "headroom_gpu_memory_unexplained_bytes",
        Kind.GAUGE,
        "Memory used on a GPU beyond what vLLM claims (total x gpu_memory_utilization): "
        "another process, or vLLM outgrowing its budget.",
        GPU,
        source="used memory - CUDA total x vllm:cache_config_info gpu_memory_utilization",
        row=Row.GPU,
        field="unexplained_bytes",
    ),
    MetricDef(
        "headroom_gpu_memory_vllm_predicted_bytes",
        Kind.GAUGE,
        "Memory vLLM is predicted to claim on a GPU: total x gpu_memory_utilization.",
        GPU,
        source="CUDA total (NVML or dcgm) x vllm:cache_config_info gpu_memory_utilization",
        row=Row.GPU,
        field="vllm_predicted_bytes",
    ),
    # --- Health of the sources --------------------------------------------------------------
    MetricDef(
        "headroom_target_up",
        Kind.GAUGE,
        "1 if the last poll of vLLM's /metrics succeeded, else 0.",
        source="the poller",
        row=Row.TARGET,
        field="up",
    ),
    MetricDef(
        "headroom_source_up",
        Kind.GAUGE,
        "1 if the last read of a source succeeded, else 0 (vllm_metrics, vllm_models, "
        "vllm_version, model_config, nvml or dcgm).",
        SOURCE,
        source="the poller",
        row=Row.SOURCE,
        field="up",
    ),
    MetricDef(
        "headroom_source_last_success_timestamp_seconds",
        Kind.GAUGE,
        "Unix time of the last successful read of a source.",
        SOURCE,
        source="the poller",
        row=Row.SOURCE,
        field="last_success_time",
    ),
    MetricDef(
        "headroom_source_errors_total",
        Kind.COUNTER,
        "Failed reads of a source, by reason.",
        (*SOURCE, "reason"),
        source="the poller",
        row=Row.SOURCE,
        field="errors",
    ),
    MetricDef(
        "headroom_source_duration_seconds",
        Kind.GAUGE,
        "How long the last read of a source took.",
        SOURCE,
        source="the poller",
        row=Row.SOURCE,
        field="duration_seconds",
    ),
    MetricDef(
        "headroom_target_restarts_total",
        Kind.COUNTER,
        "vLLM restarts detected (process start time changed or counters went down).",
        source="the poller",
        row=Row.TARGET,
        field="restarts_total",
    ),
    MetricDef(
        "headroom_dropped_samples",
        Kind.GAUGE,
        "Samples of the last vLLM payload the parser left out, by reason: too_many_series "
        "(cardinality caps), label_too_long, not_finite, out_of_range, unexpected_series (a "
        "second series, or a sample of another shape: a counter without _total); 0 for any sane "
        "vLLM.",
        ("reason",),
        source="the parser",
        row=Row.TARGET,
        field="dropped_samples",
    ),
    MetricDef(
        "headroom_admission_rejections_per_second",
        Kind.GAUGE,
        "Requests vLLM's API server refused at a queue limit (--max-num-queued-reqs or "
        "--max-num-queued-tokens, answered 503), per second over the rate window (vLLM 0.32+).",
        source="increase of vllm:admission_rejections_total (all reasons)",
        row=Row.TARGET,
        field="admission_rejections_per_second",
    ),
    MetricDef(
        "headroom_admission_rejections_by_reason_per_second",
        Kind.GAUGE,
        "headroom_admission_rejections_per_second by the cap that refused, as vLLM names it: "
        "reason max_num_queued_reqs (the --max-num-queued-reqs cap) or max_num_queued_tokens "
        "(--max-num-queued-tokens); only where vLLM labels its refusals with a reason (0.32+).",
        ("reason",),
        source="increase of vllm:admission_rejections_total, each reason",
        row=Row.TARGET,
        field="admission_rejections_by_reason_per_second",
    ),
    MetricDef(
        "headroom_window_samples",
        Kind.GAUGE,
        "Samples of the target held for the windows.",
        source="the poller",
        row=Row.TARGET,
        field="window_samples",
    ),
    MetricDef(
        "headroom_window_evictions_total",
        Kind.COUNTER,
        "Window samples of the target given up for memory, by reason: target_budget (its "
        "window was over the per-target share), process_budget (all targets were over "
        "memory_limit_bytes' share and this one was the biggest; oldest first, down to two "
        "samples before any window gives up its last ones), forgotten (fleet mode: then, with "
        "no sample left, its whole state was forgotten, counted once each time; its next probe "
        "starts it again).",
        ("reason",),
        source="the poller",
        row=Row.TARGET,
        field="window_evictions_total",
    ),
    # --- The exporter itself ----------------------------------------------------------------
    MetricDef(
        "headroom_build_info",
        Kind.INFO,
        "vllm-headroom's version (value 1).",
        ("version", "mode"),
        Scope.EXPORTER,
        source="the package",
        row=Row.EXPORTER,
        field="build_info",
    ),
    MetricDef(
        "headroom_poll_interval_seconds",
        Kind.GAUGE,
        "How often the sidecar polls its target (the cadence of the windows' samples).",
        scope=Scope.EXPORTER,
        source="settings",
        row=Row.EXPORTER,
        field="poll_interval_seconds",
    ),
    MetricDef(
        "headroom_collector_success",
        Kind.GAUGE,
        "1 if a collector built its metrics on this scrape, else 0.",
        ("collector",),
        Scope.EXPORTER,
        source="the exposition",
        row=Row.COLLECTOR,
    ),
    MetricDef(
        "headroom_collector_duration_seconds",
        Kind.GAUGE,
        "How long a collector took on this scrape.",
        ("collector",),
        Scope.EXPORTER,
        source="the exposition",
        row=Row.COLLECTOR,
    ),
    MetricDef(
        "headroom_probe_requests_total",
        Kind.COUNTER,
        "/probe requests, by outcome (ok, denied_not_in_allowlist, denied_forbidden_address, "
        "bad_target, throttled, timeout); every outcome is exposed from 0.",
        ("outcome",),
        Scope.EXPORTER,
        source="fleet mode",
        row=Row.EXPORTER,
        field="probe_requests",
    ),
    MetricDef(
        "headroom_probe_targets",
        Kind.GAUGE,
        "Targets whose windows fleet mode remembers.",
        scope=Scope.EXPORTER,
        source="fleet mode",
        row=Row.EXPORTER,
        field="probe_targets",
    ),
    MetricDef(
        "headroom_probe_evictions_total",
        Kind.COUNTER,
        "Targets forgotten because of the bound on remembered targets, their age, or the "
        'memory budget (headroom_window_evictions_total{reason="forgotten"}).',
        scope=Scope.EXPORTER,
        source="fleet mode",
        row=Row.EXPORTER,
        field="probe_evictions",
    ),
    MetricDef(
        "headroom_probe_response_budget_refusals_total",
        Kind.COUNTER,
        "/metrics answers of probed targets stopped by the budget of the answers read at once "
        "(a quarter of memory_limit_bytes, shared fairly); when it is full the biggest answer "
        "over its fair share gives way, by reason: over_share (it was the answer asking for "
        "room: refused), cut (it was another: cut, its bytes freed at once); every reason is "
        "exposed from 0. Such an answer is dropped and its target's poll fails.",
        ("reason",),
        Scope.EXPORTER,
        source="fleet mode",
        row=Row.EXPORTER,
        field="probe_response_refusals",
    ),
)

METRICS: dict[str, MetricDef] = {d.name: d for d in _DEFS}

#: The metrics read from each kind of row object, in table order.
ROWS: dict[Row, tuple[MetricDef, ...]] = {
    row: tuple(d for d in _DEFS if d.row is row and d.field is not None) for row in Row
}


def check_values(row: Row, source: object) -> dict[str, object]:
    """The ``check --json`` figures of one row object, keyed as the table says."""
    values: dict[str, object] = {}
    for d in ROWS[row]:
        if d.check_key is not None:
            value = getattr(source, d.field or "")
            values[d.check_key] = dict(value) if isinstance(value, Mapping) else value
    return values


def metric(name: str) -> MetricDef:
    """The definition of an exposed metric; ``KeyError`` for a name we do not expose."""
    return METRICS[name]


def render_markdown() -> str:
    """The table of ``docs/metrics.md`` (a test keeps the checked-in file equal to this)."""
    lines = [
        "# Metrics",
        "",
        "Every metric vllm-headroom exposes. Generated from `exporter/service/metricdefs.py` by",
        "`make docs`; a test fails when this file and the code disagree, and another proves that",
        "the exporter's real exposition contains exactly these names and labels.",
        "",
        "All names share the prefix `headroom_` and use base units. Per-target metrics are on",
        "`/metrics` in sidecar mode and on `/probe?target=...` in fleet mode; exporter metrics are",
        "always on `/metrics`. Values that cannot be known are absent, never NaN. Info metrics",
        "have the value 1 and carry their facts in labels. The process collector's standard",
        "`process_*` metrics (the exporter's own CPU, memory and file descriptors) are also",
        "exposed on `/metrics`.",
        "",
        "How the derived figures are defined (windows, estimators and their bias) is in",
        "[derivations.md](derivations.md).",
        "",
    ]
    for scope, title in ((Scope.TARGET, "Per target"), (Scope.EXPORTER, "The exporter")):
        lines += [
            f"## {title}",
            "",
            "| metric | type | labels | meaning | source |",
            "| --- | --- | --- | --- | --- |",
        ]
        for d in _DEFS:
            if d.scope is not scope:
                continue
            labels = ", ".join(f"`{label}`" for label in d.labels) or "-"
            lines.append(
                f"| `{d.name}` | {d.kind.value} | {labels} | {d.help} | {d.source or '-'} |"
            )
        lines.append("")
    return "\n".join(lines)
