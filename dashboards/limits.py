"""Where panels meet the alert rule file: the thresholds they draw and the alerts they link.

This is the one place that names ``alerts/vllm-headroom.rules.yml``'s ``headroom:threshold:*``
rules and ``VllmHeadroom*`` alerts. Threshold values are read from that file when the dashboards
are generated, and every name here must exist there: generation fails, naming it, otherwise.
"""

from __future__ import annotations

from dashboards.widgets import Bad, Limit, Static

# --- thresholds (the value and the bad side; the colour is the severity of the alert using it)

#: Preemptions per second of one vLLM instance (absolute half of the preemption spike).
PREEMPTION_RATE = Limit("preemptions_per_second", Bad.ABOVE)
#: Preemptions per finished request (relative half of the preemption spike).
PREEMPTIONS_PER_REQUEST = Limit("preemptions_per_finished_request", Bad.ABOVE)
#: KV-cache usage of one engine (saturation, together with a growing queue).
KV_SATURATION = Limit("kv_saturation_ratio", Bad.ABOVE)
#: Headroom of one engine at p95 context, in sequences and as a share of its ceiling.
HEADROOM_SEQUENCES = Limit("headroom_min_sequences", Bad.BELOW)
HEADROOM_RATIO = Limit("headroom_min_ratio", Bad.BELOW)
#: Headroom of every instance serving a model, summed (scale out).
FLEET_SEQUENCES = Limit("fleet_min_sequences", Bad.BELOW)
FLEET_RATIO = Limit("fleet_min_ratio", Bad.BELOW)
#: A model's p95 context length against a day earlier (rerun the sizing).
CONTEXT_GROWTH = Limit("context_growth_factor", Bad.ABOVE)
#: (predicted - actual) / actual capacity, either way.
CAPACITY_DRIFT = Limit("capacity_drift_ratio", Bad.OUTSIDE)
#: Memory of other processes on vLLM's GPUs; memory beyond vLLM's claim when they cannot be told.
FOREIGN_MEMORY = Limit("gpu_foreign_memory_bytes", Bad.ABOVE)
UNEXPLAINED_MEMORY = Limit("gpu_unexplained_memory_bytes", Bad.ABOVE)
#: Free memory on vLLM's GPUs.
FREE_MEMORY = Limit("gpu_free_memory_min_bytes", Bad.BELOW)
#: Age of the last successful read of vLLM's /metrics.
STALE = Limit("stale_seconds", Bad.ABOVE)
#: How many times too fast a model spends its SLO error budget (the 1h and 5m page).
SLO_FAST_BURN = Limit("slo_burn_rate_fast", Bad.ABOVE)

#: Seconds ahead that the exhaustion alert extrapolates tokens in use (drawn as a trend line).
KV_EXHAUSTION_HORIZON = "kv_exhaustion_horizon_seconds"

# --- facts, not tunables

#: An ``up``-style gauge: anything below 1 is down.
DOWN = Static(1, Bad.BELOW)
#: An SLO's error budget left: below 0 it is overspent.
BUDGET_SPENT = Static(0, Bad.BELOW)
#: A count of things that should be zero (targets down, restarts): any is worth a look.
NONZERO = Static(1, Bad.ABOVE, colour="orange")

# --- alerts without a drawn threshold that a panel still explains

VLLM_UNREACHABLE = "VllmHeadroomVllmUnreachable"
TARGET_DOWN = "VllmHeadroomTargetDown"
EXPORTER_ABSENT = "VllmHeadroomExporterAbsent"
NVML_UNAVAILABLE = "VllmHeadroomNvmlUnavailable"
VLLM_NOT_SCRAPED = "VllmHeadroomVllmNotScraped"
PREDICTION_UNAVAILABLE = "VllmHeadroomPredictionUnavailable"
KV_EXHAUSTION = "VllmHeadroomKvCacheExhaustionPredicted"
KV_SATURATED_ALERT = "VllmHeadroomKvCacheSaturated"
CONTEXT_GROWTH_ALERT = "VllmHeadroomContextGrowth"
MAX_NUM_SEQS_BINDING = "VllmHeadroomMaxNumSeqsBinding"
ADMISSION_REJECTIONS = "VllmHeadroomAdmissionRejections"
HEADROOM_LOW = "VllmHeadroomLow"
ENGINE_STALLED = "VllmHeadroomEngineStalled"
TTFT_BUDGET_TICKET = "VllmHeadroomTtftBudgetBurnSlow"
ERROR_BUDGET_TICKET = "VllmHeadroomErrorBudgetBurnSlow"
