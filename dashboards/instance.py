"""The instance drill-down: why this vLLM is where it is, and what changed.

Top to bottom: the sizing chain as it stands (bytes per token -> weights and overhead -> KV
budget -> capacity -> concurrency at mean and p95 context) and the inputs behind it; predicted
against actual capacity and tokens in use over time; headroom and context length; the scheduler's
limits (which one binds, the ceiling under every limit against the KV cache's alone and with
shared prefixes, max_num_seqs and where it was learnt, sleep, queue-limit refusals); prefix
sharing; preemptions and the queue; latency from vLLM's own histograms; GPU memory per GPU; and
the exporter's own health. Panels reading vLLM directly support vLLM's old and new metric names
side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grafana_foundation_sdk.models import dashboard as dm

from dashboards import limits
from dashboards.queries import (
    CLUSTER,
    ENGINE_SERIES,
    JOB,
    NAMESPACE,
    TARGET,
    VLLM,
    binding_limit,
    bucket_rate,
    histogram_quantile,
    metric,
    prefer,
    rate,
    scope_variables,
    selector,
)
from dashboards.templating import (
    VLLM_INSTANCE,
    host_variable,
    label_variable,
)
from dashboards.widgets import (
    FLEET_UID,
    INSTANCE_UID,
    Cell,
    Column,
    Limit,
    Query,
    Row,
    assemble,
    dashboard_frame,
    dashboard_link,
    firing_alerts_table,
    limit_mapping,
    runbook_index_link,
    stat_panel,
    state_timeline_panel,
    table_panel,
    timeseries_panel,
)

if TYPE_CHECKING:
    from grafana_foundation_sdk.cog import builder as cogbuilder

    from dashboards.rules import RuleFacts

TITLE = "vLLM headroom / Instance"

#: Quantiles of the latency panels.
LATENCY_QUANTILES = (0.5, 0.95, 0.99)
ENGINE_LEGEND = "engine {{engine}}"


def per_engine(name: str, what: str) -> Query:
    """One sidecar series per engine of the selected instance, drawn as ``what, engine N``."""
    return Query(metric(name, ENGINE_SERIES), legend=f"{what}, {ENGINE_LEGEND}")


#: max_num_seqs per engine (one line, whichever source the sidecar learnt it from).
MAX_NUM_SEQS = Query(
    f"max by (engine) ({metric('headroom_max_num_seqs', ENGINE_SERIES)})",
    legend=f"max_num_seqs, {ENGINE_LEGEND}",
)

_UP_MAPPING = dm.ValueMap(
    options={
        "0": dm.ValueMappingResult(text="DOWN", color="red", index=0),
        "1": dm.ValueMappingResult(text="UP", color="green", index=1),
    }
)
_ASLEEP_MAPPING = dm.ValueMap(
    options={
        "0": dm.ValueMappingResult(text="awake", color="green", index=0),
        "1": dm.ValueMappingResult(text="asleep", color="blue", index=1),
    }
)


def _variables() -> list[cogbuilder.Builder[dm.VariableModel]]:
    engines_of = selector(CLUSTER, JOB, NAMESPACE, 'instance=~"$instance"', 'model_name=~"$model"')
    return [
        *scope_variables(),
        label_variable(
            "model",
            label="Model",
            query=(
                f"label_values(headroom_kv_capacity_tokens{{{CLUSTER}, {JOB}, {NAMESPACE}}}, "
                "model_name)"
            ),
            description="Served model name, as vLLM reports it in model_name.",
        ),
        label_variable(
            "instance",
            label="Instance",
            query=(
                "label_values(headroom_kv_capacity_tokens"
                f'{{{CLUSTER}, {JOB}, {NAMESPACE}, model_name=~"$model"}}, instance)'
            ),
            description="The sidecar (or probed vLLM) instance to drill into.",
            multi=False,
        ),
        host_variable(f'{CLUSTER}, {JOB}, {NAMESPACE}, instance=~"$instance"'),
        label_variable(
            "engine",
            label="Engine",
            query=f"label_values(headroom_kv_capacity_tokens{engines_of}, engine)",
            description="vLLM engine(s): one per data-parallel rank (absent before vLLM 0.8.3).",
        ),
    ]


def _sizing(facts: RuleFacts) -> Row:
    def chain(title: str, name: str, unit: str, description: str, *, engine: bool = False) -> Cell:
        sel = ENGINE_SERIES if engine else TARGET
        return Cell(
            stat_panel(
                title,
                description=description,
                unit=unit,
                queries=[Query(metric(name, sel), legend=ENGINE_LEGEND if engine else "")],
                facts=facts,
            ),
            3,
            4,
        )

    return Row(
        "Sizing chain",
        [
            chain(
                "KV bytes per token",
                "headroom_kv_bytes_per_token",
                "bytes",
                "KV-cache bytes one token of context costs on one GPU (all layers, K and V).",
            ),
            chain(
                "Weights per GPU",
                "headroom_predicted_weights_bytes",
                "bytes",
                "Model weights each GPU holds, as the sizing model counts them.",
            ),
            chain(
                "Overhead per GPU",
                "headroom_predicted_overhead_bytes",
                "bytes",
                "Activation peak and non-torch memory per GPU, as the sizing model estimates it.",
            ),
            chain(
                "KV budget per GPU",
                "headroom_predicted_kv_budget_bytes",
                "bytes",
                "GPU memory left for the KV cache: total x utilization - weights - overhead.",
            ),
            chain(
                "Capacity (vLLM)",
                "headroom_kv_capacity_tokens",
                "count:tokens",
                "KV-cache capacity in tokens that vLLM actually allocated, per engine.",
                engine=True,
            ),
            chain(
                "Capacity (predicted)",
                "headroom_kv_capacity_predicted_tokens",
                "count:tokens",
                "KV-cache capacity in tokens that the sizing model predicts, per engine.",
                engine=True,
            ),
            chain(
                "Concurrency at mean context",
                "headroom_mean_ceiling_sequences",
                "count:seqs",
                "Sequences of the mean context length vLLM runs at once under every limit (the "
                "usable KV cache counting no block shared, max_num_seqs).",
                engine=True,
            ),
            chain(
                "Concurrency at p95 context",
                "headroom_p95_ceiling_sequences",
                "count:seqs",
                "Sequences of the p95 context length vLLM runs at once under every limit (the "
                "usable KV cache counting no block shared, max_num_seqs; 0 asleep).",
                engine=True,
            ),
            Cell(
                table_panel(
                    "Sizing inputs",
                    description=(
                        "What the sizing model was given: model, attention kind, layers, KV "
                        "heads, head size, KV dtype, parallelism, block size and vLLM version."
                    ),
                    unit="short",
                    facts=facts,
                    columns=[
                        Column(
                            "info",
                            "max by (model, attention, layers, kv_heads, head_dim, kv_dtype, "
                            "tensor_parallel, pipeline_parallel, block_size, vllm_version) "
                            f"({metric('headroom_sizing_info', TARGET)})",
                            "none",
                            hidden=True,
                        )
                    ],
                    labels=[
                        ("model", "Model"),
                        ("attention", "Attention"),
                        ("layers", "Layers"),
                        ("kv_heads", "KV heads"),
                        ("head_dim", "Head dim"),
                        ("kv_dtype", "KV dtype"),
                        ("tensor_parallel", "TP"),
                        ("pipeline_parallel", "PP"),
                        ("block_size", "Block size"),
                        ("vllm_version", "vLLM"),
                    ],
                ),
                16,
                4,
            ),
            Cell(
                stat_panel(
                    "Prediction state",
                    description="Whether the sizing model has a prediction, or why it has none.",
                    unit="none",
                    queries=[
                        Query(
                            f"max by (state) ({metric('headroom_prediction_state', TARGET)}) == 1",
                            legend="{{state}}",
                        )
                    ],
                    facts=facts,
                    alerts=[limits.PREDICTION_UNAVAILABLE],
                    text_mode_name=True,
                ),
                4,
                4,
            ),
            Cell(
                stat_panel(
                    "Prediction error",
                    description="(predicted - actual) / actual KV-cache capacity, per engine.",
                    unit="percentunit",
                    queries=[
                        Query(
                            metric("headroom_kv_capacity_prediction_error_ratio", ENGINE_SERIES),
                            legend=ENGINE_LEGEND,
                        )
                    ],
                    facts=facts,
                    limits=[limits.CAPACITY_DRIFT],
                ),
                4,
                4,
            ),
        ],
    )


def _capacity(facts: RuleFacts) -> Row:
    # The exhaustion alert extrapolates tokens in use this far ahead (seconds).
    horizon = facts.threshold(limits.KV_EXHAUSTION_HORIZON)
    # The saturation alert's own figure: vLLM's usage gauge averaged over 5 minutes.
    usage_5m = prefer(
        f"avg_over_time({metric('vllm:kv_cache_usage_perc', VLLM)}[5m])",
        f"avg_over_time({metric('vllm:gpu_cache_usage_perc', VLLM)}[5m])",
    )
    return Row(
        "Capacity",
        [
            Cell(
                timeseries_panel(
                    "Predicted vs actual KV capacity",
                    description=(
                        "KV-cache capacity vLLM allocated against what the sizing model "
                        "predicts: a gap means the budget changed (version, utilization, "
                        "another process); with a CPU offload pool of known size, the GPU pool "
                        "plus it (what the prefix cache keeps, never room to run)."
                    ),
                    unit="count:tokens",
                    queries=[
                        per_engine("headroom_kv_capacity_tokens", "actual"),
                        per_engine("headroom_kv_capacity_predicted_tokens", "predicted"),
                        per_engine("headroom_kv_effective_capacity_tokens", "with CPU offload"),
                    ],
                    facts=facts,
                    minimum=0,
                ),
                8,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Prediction error",
                    description="(predicted - actual) / actual KV-cache capacity over time.",
                    unit="percentunit",
                    queries=[
                        Query(
                            metric("headroom_kv_capacity_prediction_error_ratio", ENGINE_SERIES),
                            legend=ENGINE_LEGEND,
                        )
                    ],
                    facts=facts,
                    limits=[limits.CAPACITY_DRIFT],
                ),
                4,
                8,
            ),
            Cell(
                timeseries_panel(
                    "KV tokens in use vs capacity",
                    description=(
                        "Tokens held by running requests (whole blocks) against the usable "
                        "tokens (capacity less vLLM's reserved null block) and the capacity."
                    ),
                    unit="count:tokens",
                    queries=[
                        per_engine("headroom_kv_used_tokens", "in use"),
                        per_engine("headroom_kv_usable_tokens", "usable"),
                        per_engine("headroom_kv_capacity_tokens", "capacity"),
                        Query(
                            f"predict_linear({metric('headroom_kv_used_tokens', ENGINE_SERIES)}"
                            f"[30m], {horizon:g})",
                            legend=f"in use in {horizon / 60:g} min at the 30 min trend, "
                            "engine {{engine}}",
                        ),
                    ],
                    facts=facts,
                    alerts=[limits.KV_EXHAUSTION],
                    minimum=0,
                ),
                6,
                8,
            ),
            Cell(
                timeseries_panel(
                    "KV-cache usage",
                    description=(
                        "Share of the usable KV-cache blocks held by running requests, now and "
                        "averaged over 5 minutes as the saturation alert sees it."
                    ),
                    unit="percentunit",
                    queries=[
                        per_engine("headroom_kv_usage_ratio", "sidecar"),
                        Query(usage_5m, legend="vLLM 5 min average, engine {{engine}}"),
                    ],
                    facts=facts,
                    limits=[limits.KV_SATURATION],
                    minimum=0,
                    maximum=1,
                ),
                6,
                8,
            ),
        ],
    )


def _headroom(facts: RuleFacts) -> Row:
    quantiles = [
        Query(
            metric(f"headroom_context_length_{name}_tokens", ENGINE_SERIES),
            legend=f"{name}, engine {{{{engine}}}}",
        )
        for name in ("p50", "p95", "p99", "mean")
    ]
    yesterday = Query(
        f"{metric('headroom_context_length_p95_tokens', ENGINE_SERIES)} offset 1d",
        legend="p95 a day earlier, engine {{engine}}",
    )
    return Row(
        "Headroom for real traffic",
        [
            Cell(
                timeseries_panel(
                    "Headroom at p95 context",
                    description=(
                        "How many more sequences of p95 context length vLLM would start now "
                        "under every limit, counting no block shared (what the alerts read), "
                        "against the ceiling, with the headroom today's prefix sharing gives and "
                        "the headroom in requests (n sequences each)."
                    ),
                    unit="count:seqs",
                    queries=[
                        per_engine("headroom_p95_available_sequences", "available"),
                        per_engine("headroom_p95_ceiling_sequences", "ceiling"),
                        per_engine(
                            "headroom_p95_effective_available_sequences",
                            "available with shared prefixes",
                        ),
                        per_engine("headroom_p95_available_requests", "available requests"),
                    ],
                    facts=facts,
                    limits=[limits.HEADROOM_SEQUENCES],
                    minimum=0,
                ),
                8,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Headroom ratio",
                    description="Headroom at p95 context as a share of the p95 ceiling (0: full).",
                    unit="percentunit",
                    queries=[
                        Query(
                            metric("headroom_p95_available_ratio", ENGINE_SERIES),
                            legend=ENGINE_LEGEND,
                        )
                    ],
                    facts=facts,
                    limits=[limits.HEADROOM_RATIO],
                    minimum=0,
                    maximum=1,
                ),
                8,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Context length of finished requests",
                    description=(
                        "Prompt + output tokens of the requests finished in the context window "
                        "(by default the last 10 minutes, or as far back as it takes to hold 400 "
                        "requests, up to an hour: headroom_context_window_seconds): quantiles "
                        "estimated from vLLM's histograms, the exact mean, and p95 a day earlier."
                    ),
                    unit="count:tokens",
                    queries=[*quantiles, yesterday],
                    facts=facts,
                    alerts=[limits.CONTEXT_GROWTH_ALERT],
                    minimum=0,
                ),
                8,
                8,
            ),
        ],
    )


def _limits(facts: RuleFacts) -> Row:
    by_engine = "engine"
    next_limit = binding_limit("headroom_p95_available_limited_by", ENGINE_SERIES, by_engine)
    ceiling_limit = binding_limit("headroom_p95_ceiling_limited_by", ENGINE_SERIES, by_engine)
    return Row(
        "Scheduler limits",
        [
            Cell(
                stat_panel(
                    "Binding limit",
                    description=(
                        "The limit of vLLM's scheduler that stops the next p95 sequence now: "
                        "the KV cache, max_num_seqs (every running slot taken), sleep, or the "
                        "queue cap (--max-num-queued-reqs reached, or vLLM refusing requests)."
                    ),
                    unit="none",
                    queries=[Query(next_limit, legend=ENGINE_LEGEND)],
                    facts=facts,
                    alerts=[limits.HEADROOM_LOW, limits.MAX_NUM_SEQS_BINDING],
                    mappings=[limit_mapping()],
                ),
                5,
                4,
            ),
            Cell(
                stat_panel(
                    "Ceiling set by",
                    description=(
                        "The limit that sets the p95 ceiling: the KV cache when it holds fewer "
                        "p95 sequences than max_num_seqs, else max_num_seqs (on a tie too); the "
                        "queue cap when --max-num-queued-reqs is under both."
                    ),
                    unit="none",
                    queries=[Query(ceiling_limit, legend=ENGINE_LEGEND)],
                    facts=facts,
                    mappings=[limit_mapping()],
                ),
                5,
                4,
            ),
            Cell(
                stat_panel(
                    "max_num_seqs",
                    description=(
                        "The scheduler's limit on running sequences and where the sidecar learnt "
                        "it: vLLM's command line, the sidecar's setting, or vLLM's default."
                    ),
                    unit="count:seqs",
                    queries=[
                        Query(
                            metric("headroom_max_num_seqs", ENGINE_SERIES),
                            legend="{{origin}}, engine {{engine}}",
                        )
                    ],
                    facts=facts,
                    alerts=[limits.MAX_NUM_SEQS_BINDING],
                    decimals=0,
                    show_name=True,
                ),
                5,
                4,
            ),
            Cell(
                stat_panel(
                    "Engine state",
                    description=(
                        "Whether the engine is awake or sleeps or is paused (vLLM 0.12+), when "
                        "its ceiling and headroom are 0."
                    ),
                    unit="none",
                    queries=[
                        Query(metric("headroom_engine_asleep", ENGINE_SERIES), legend=ENGINE_LEGEND)
                    ],
                    facts=facts,
                    mappings=[_ASLEEP_MAPPING],
                ),
                4,
                4,
            ),
            Cell(
                stat_panel(
                    "Sequences per request",
                    description=(
                        "Mean n (parallel samples) of the requests finished in the window: each "
                        "request runs that many sequences against max_num_seqs and the KV cache."
                    ),
                    unit="short",
                    queries=[
                        Query(
                            metric("headroom_sequences_per_request", ENGINE_SERIES),
                            legend=ENGINE_LEGEND,
                        )
                    ],
                    facts=facts,
                    decimals=2,
                ),
                5,
                4,
            ),
            Cell(
                state_timeline_panel(
                    "Binding limit over time",
                    description=(
                        "Per engine, the limit that stopped the next p95 sequence and the one "
                        "that set the ceiling, over time."
                    ),
                    unit="none",
                    queries=[
                        Query(next_limit, legend="next sequence, engine {{engine}}"),
                        Query(ceiling_limit, legend="ceiling, engine {{engine}}"),
                    ],
                    facts=facts,
                    mappings=[limit_mapping()],
                    alerts=[limits.MAX_NUM_SEQS_BINDING],
                ),
                24,
                5,
            ),
            Cell(
                timeseries_panel(
                    "Ceiling: every limit, KV cache alone, shared prefixes",
                    description=(
                        "Sequences of p95 context vLLM runs at once under every limit (the "
                        "alerts' figure), what the KV cache alone holds counting no block "
                        "shared, what it holds with today's prefix sharing (under max_num_seqs), "
                        "and max_num_seqs."
                    ),
                    unit="count:seqs",
                    queries=[
                        per_engine("headroom_p95_ceiling_sequences", "every limit"),
                        per_engine("headroom_p95_kv_ceiling_sequences", "KV cache alone"),
                        per_engine(
                            "headroom_p95_effective_ceiling_sequences", "with shared prefixes"
                        ),
                        MAX_NUM_SEQS,
                    ],
                    facts=facts,
                    alerts=[limits.MAX_NUM_SEQS_BINDING],
                    minimum=0,
                ),
                8,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Running sequences vs max_num_seqs",
                    description=(
                        "Sequences running (what max_num_seqs counts), requests running (n "
                        "sequences each) and waiting, against max_num_seqs: running flat at the "
                        "limit while requests wait is the limit binding."
                    ),
                    unit="short",
                    queries=[
                        per_engine("headroom_sequences_running", "sequences running"),
                        per_engine("headroom_requests_running", "requests running"),
                        per_engine("headroom_requests_waiting", "requests waiting"),
                        MAX_NUM_SEQS,
                    ],
                    facts=facts,
                    alerts=[limits.MAX_NUM_SEQS_BINDING],
                    minimum=0,
                ),
                8,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Requests refused at the queue limit",
                    description=(
                        "Requests vLLM's API server refused with 503 per second because its "
                        "queue was at a cap (0.32+), in all and by the cap that refused: "
                        "max_num_queued_reqs is --max-num-queued-reqs, max_num_queued_tokens "
                        "--max-num-queued-tokens."
                    ),
                    unit="reqps",
                    queries=[
                        Query(
                            metric("headroom_admission_rejections_per_second", TARGET),
                            legend="refused",
                        ),
                        Query(
                            metric("headroom_admission_rejections_by_reason_per_second", TARGET),
                            legend="{{reason}}",
                        ),
                    ],
                    facts=facts,
                    alerts=[limits.ADMISSION_REJECTIONS],
                    minimum=0,
                ),
                8,
                8,
            ),
        ],
    )


def _sharing(facts: RuleFacts) -> Row:
    return Row(
        "Prefix sharing",
        [
            Cell(
                timeseries_panel(
                    "Prefix cache hit ratio",
                    description=(
                        "Prompt tokens found in the device prefix cache over those looked up in "
                        "the window: what the effective ceiling and headroom count as shared."
                    ),
                    unit="percentunit",
                    queries=[
                        Query(
                            metric("headroom_prefix_cache_hit_ratio", ENGINE_SERIES),
                            legend=ENGINE_LEGEND,
                        )
                    ],
                    facts=facts,
                    minimum=0,
                    maximum=1,
                ),
                8,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Prompt tokens served from cache, by tier",
                    description=(
                        "Share of prompt tokens served from each cache tier in the window "
                        "(device, host or disk offloading, p2p, external; vLLM 0.32+): only "
                        "device hits are blocks the GPU pool shares."
                    ),
                    unit="percentunit",
                    queries=[
                        Query(
                            metric("headroom_prompt_tokens_cached_ratio", ENGINE_SERIES),
                            legend="{{source}}, engine {{engine}}",
                        )
                    ],
                    facts=facts,
                    minimum=0,
                    maximum=1,
                ),
                8,
                8,
            ),
            Cell(
                timeseries_panel(
                    "KV tokens per running sequence vs shared prefix",
                    description=(
                        "KV tokens in use per running sequence (shared blocks counted once) "
                        "against the mean context length and the prefix an average request "
                        "finds cached: below the context when running sequences share blocks."
                    ),
                    unit="count:tokens",
                    queries=[
                        per_engine(
                            "headroom_kv_tokens_per_running_sequence", "in use per running sequence"
                        ),
                        per_engine("headroom_context_length_mean_tokens", "mean context"),
                        per_engine("headroom_shared_prefix_tokens", "shared prefix"),
                    ],
                    facts=facts,
                    minimum=0,
                ),
                8,
                8,
            ),
        ],
    )


def _traffic(facts: RuleFacts) -> Row:
    # The preemption-spike alert's own figures: vLLM's counters over 5 minutes, per instance.
    preemptions_5m = f"sum without (engine) ({rate('vllm:num_preemptions_total', VLLM, '5m')})"
    finished_5m = (
        f"sum without (engine, finished_reason) ({rate('vllm:request_success_total', VLLM, '5m')})"
    )
    histogram_mean = (
        f"sum({rate('vllm:request_num_preemptions_sum', VLLM)}) "
        f"/ sum({rate('vllm:request_num_preemptions_count', VLLM)})"
    )
    waiting = prefer(
        f"sum by (reason) ({metric('vllm:num_requests_waiting_by_reason', VLLM)})",
        f"label_replace(sum({metric('vllm:num_requests_waiting', VLLM)}), "
        '"reason", "any reason", "", "")',
    )
    return Row(
        "Preemptions and queue",
        [
            Cell(
                timeseries_panel(
                    "Preemption rate",
                    description=(
                        "Requests preempted per second (their KV cache evicted to make room): "
                        "vLLM's counter over 5 minutes as the alert sees it, and the sidecar's."
                    ),
                    unit="count:/s",
                    queries=[
                        Query(preemptions_5m, legend="vLLM, 5 min"),
                        per_engine("headroom_preemptions_per_second", "sidecar"),
                    ],
                    facts=facts,
                    limits=[limits.PREEMPTION_RATE],
                    minimum=0,
                ),
                6,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Preemptions per finished request",
                    description=(
                        "Preemptions divided by requests finished: vLLM's counters over 5 "
                        "minutes (the alert), the sidecar's, and vLLM's per-request histogram "
                        "(0.30+)."
                    ),
                    unit="short",
                    queries=[
                        Query(f"{preemptions_5m} / {finished_5m}", legend="vLLM, 5 min"),
                        per_engine("headroom_preemptions_per_finished_request", "sidecar"),
                        Query(histogram_mean, legend="vLLM per-request histogram mean"),
                    ],
                    facts=facts,
                    limits=[limits.PREEMPTIONS_PER_REQUEST],
                    minimum=0,
                ),
                6,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Running and waiting requests",
                    description=(
                        "Requests in vLLM's running batch and in its queue, by reason where vLLM "
                        "gives one (0.20+); of the waiting, those whose KV a connector loads (P/D, "
                        "KV offload), by stage; swapped is V0 only."
                    ),
                    unit="count:req",
                    queries=[
                        Query(
                            f"sum({metric('vllm:num_requests_running', VLLM)})", legend="running"
                        ),
                        Query(waiting, legend="waiting: {{reason}}"),
                        Query(
                            f"sum({metric('vllm:num_requests_swapped', VLLM)})",
                            legend="swapped (V0)",
                        ),
                        Query(
                            "sum by (stage) "
                            f"({metric('headroom_requests_kv_fetch_by_stage', ENGINE_SERIES)})",
                            legend="KV fetch: {{stage}}",
                        ),
                    ],
                    facts=facts,
                    alerts=[limits.KV_SATURATED_ALERT],
                    minimum=0,
                ),
                6,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Finished requests",
                    description=(
                        "Requests vLLM finished per second, whatever the finish reason (flat at 0 "
                        "while requests run or wait: the engine may be stalled)."
                    ),
                    unit="reqps",
                    queries=[
                        Query(
                            metric("headroom_finished_requests_per_second", ENGINE_SERIES),
                            legend=ENGINE_LEGEND,
                        )
                    ],
                    facts=facts,
                    alerts=[limits.ENGINE_STALLED],
                    minimum=0,
                ),
                6,
                8,
            ),
        ],
    )


def _latency(facts: RuleFacts) -> Row:
    ttft = bucket_rate("vllm:time_to_first_token_seconds", VLLM)
    itl = prefer(
        bucket_rate("vllm:inter_token_latency_seconds", VLLM),
        bucket_rate("vllm:time_per_output_token_seconds", VLLM),
    )
    return Row(
        "Latency (vLLM's histograms)",
        [
            Cell(
                timeseries_panel(
                    "Time to first token",
                    description=(
                        "Seconds from arrival to the first output token (queueing and prefill "
                        "included), quantiles over the rate interval."
                    ),
                    unit="s",
                    queries=[
                        Query(histogram_quantile(q, ttft), legend=f"p{q * 100:g}")
                        for q in LATENCY_QUANTILES
                    ],
                    facts=facts,
                    alerts=[limits.VLLM_NOT_SCRAPED],
                    minimum=0,
                ),
                12,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Inter-token latency",
                    description=(
                        "Seconds between output tokens while decoding (inter_token_latency, "
                        "time_per_output_token before vLLM 0.11), quantiles."
                    ),
                    unit="s",
                    queries=[
                        Query(histogram_quantile(q, f"({itl})"), legend=f"p{q * 100:g}")
                        for q in LATENCY_QUANTILES
                    ],
                    facts=facts,
                    alerts=[limits.VLLM_NOT_SCRAPED],
                    minimum=0,
                ),
                12,
                8,
            ),
        ],
    )


def _gpu(facts: RuleFacts) -> Row:
    def gpu_metric(name: str) -> str:
        return metric(f"headroom_gpu_memory_{name}_bytes", TARGET)

    def one(title: str, name: str, description: str, limit: Limit) -> Cell:
        return Cell(
            timeseries_panel(
                title,
                description=description,
                unit="bytes",
                queries=[Query(gpu_metric(name), legend="GPU {{gpu}}")],
                facts=facts,
                limits=[limit],
                minimum=0,
            ),
            5,
            8,
        )

    return Row(
        "GPU memory",
        [
            Cell(
                timeseries_panel(
                    "GPU memory per GPU",
                    description=(
                        "Each GPU's memory: used by vLLM, by other processes (foreign), beyond "
                        "vLLM's claim (unexplained) and free, against vLLM's claim and the total."
                    ),
                    unit="bytes",
                    queries=[
                        Query(gpu_metric("vllm"), legend="GPU {{gpu}} vLLM"),
                        Query(gpu_metric("foreign"), legend="GPU {{gpu}} foreign"),
                        Query(gpu_metric("unexplained"), legend="GPU {{gpu}} unexplained"),
                        Query(gpu_metric("free"), legend="GPU {{gpu}} free"),
                        Query(gpu_metric("vllm_predicted"), legend="GPU {{gpu}} vLLM claim"),
                        Query(gpu_metric("total"), legend="GPU {{gpu}} total"),
                    ],
                    facts=facts,
                    alerts=[limits.NVML_UNAVAILABLE],
                    minimum=0,
                ),
                9,
                8,
            ),
            one(
                "Foreign GPU memory",
                "foreign",
                "Memory that processes other than this vLLM use on its GPUs: the OOM risk on "
                "shared GPUs.",
                limits.FOREIGN_MEMORY,
            ),
            one(
                "Unexplained GPU memory",
                "unexplained",
                "Memory used beyond vLLM's claim (total x utilization), which the alert watches "
                "when processes cannot be matched to vLLM.",
                limits.UNEXPLAINED_MEMORY,
            ),
            one(
                "Free GPU memory",
                "free",
                "Memory free on each of vLLM's GPUs, as NVML or dcgm-exporter reports it.",
                limits.FREE_MEMORY,
            ),
        ],
    )


def _health(facts: RuleFacts) -> Row:
    errors = f"sum by (source, reason) ({rate('headroom_source_errors_total', TARGET)})"
    last_poll = metric(
        "headroom_source_last_success_timestamp_seconds",
        selector(CLUSTER, JOB, NAMESPACE, 'instance=~"$instance"', 'source="vllm_metrics"'),
    )
    return Row(
        "Exporter health",
        [
            Cell(
                stat_panel(
                    "vLLM target",
                    description="Whether the sidecar's last poll of vLLM's /metrics succeeded.",
                    unit="none",
                    queries=[Query(metric("headroom_target_up", TARGET))],
                    facts=facts,
                    limits=[limits.DOWN],
                    alerts=[limits.VLLM_UNREACHABLE],
                    mappings=[_UP_MAPPING],
                ),
                3,
                4,
            ),
            Cell(
                stat_panel(
                    "Sources",
                    description=(
                        "Whether the last read of each source (vLLM's endpoints, the model "
                        "config, NVML or dcgm-exporter) succeeded."
                    ),
                    unit="none",
                    queries=[Query(metric("headroom_source_up", TARGET), legend="{{source}}")],
                    facts=facts,
                    limits=[limits.DOWN],
                    alerts=[limits.NVML_UNAVAILABLE],
                    mappings=[_UP_MAPPING],
                ),
                12,
                4,
            ),
            Cell(
                stat_panel(
                    "Age of vLLM figures",
                    description="Seconds since the sidecar last read vLLM's /metrics successfully.",
                    unit="s",
                    queries=[Query(f"time() - {last_poll}")],
                    facts=facts,
                    limits=[limits.STALE],
                    decimals=0,
                ),
                6,
                4,
            ),
            Cell(
                stat_panel(
                    "vLLM restarts",
                    description="vLLM restarts the sidecar detected within the time range shown.",
                    unit="short",
                    queries=[
                        Query(
                            "increase("
                            f"{metric('headroom_target_restarts_total', TARGET)}[$__range])"
                        )
                    ],
                    facts=facts,
                    limits=[limits.NONZERO],
                    decimals=0,
                ),
                3,
                4,
            ),
            Cell(
                timeseries_panel(
                    "Source errors by reason",
                    description=(
                        "Failed reads per second of each source; the reasons appear only while "
                        "errors occur."
                    ),
                    unit="count:/s",
                    queries=[
                        Query(
                            f"sum by (source) ({rate('headroom_source_errors_total', TARGET)})",
                            legend="{{source}}",
                        ),
                        Query(f"{errors} > 0", legend="{{source}}: {{reason}}"),
                    ],
                    facts=facts,
                    minimum=0,
                ),
                12,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Source read duration",
                    description="How long the last read of each source took.",
                    unit="s",
                    queries=[
                        Query(
                            metric("headroom_source_duration_seconds", TARGET),
                            legend="{{source}}",
                        )
                    ],
                    facts=facts,
                    minimum=0,
                ),
                12,
                8,
            ),
        ],
    )


def _alerts(facts: RuleFacts) -> Row:
    matchers = ('alertname=~"VllmHeadroom.*"', CLUSTER, NAMESPACE, VLLM_INSTANCE)
    return Row(
        "Alerts on this instance",
        [
            firing_alerts_table(
                facts,
                description=(
                    "vllm-headroom alerts firing now for this instance (sidecar or vLLM "
                    "series on its host); click an alert name for its runbook."
                ),
                alerts=selector(*matchers),
                firing=selector(*matchers, 'alertstate="firing"'),
                labels=[
                    ("alertname", "Alert"),
                    ("severity", "Severity"),
                    ("instance", "Instance"),
                    ("model_name", "Model"),
                    ("engine", "Engine"),
                    ("gpu", "GPU"),
                    ("source", "Source"),
                ],
                height=6,
            )
        ],
    )


def build(facts: RuleFacts) -> dm.Dashboard:
    """The instance drill-down dashboard, its thresholds and runbook links from ``facts``."""
    builder = (
        dashboard_frame(
            TITLE,
            INSTANCE_UID,
            "One vLLM instance: its KV-cache sizing chain, capacity and headroom for real "
            "traffic under every limit of vLLM's scheduler, prefix sharing, preemptions, "
            "latency, GPU memory and the exporter's health.",
            since="3h",
            refresh="30s",
            variables=_variables(),
            target_selector=TARGET,
        )
        .link(dashboard_link("Fleet overview", FLEET_UID, "Every instance by model"))
        .link(runbook_index_link(facts))
    )
    rows = [
        _alerts(facts),
        _sizing(facts),
        _capacity(facts),
        _headroom(facts),
        _limits(facts),
        _sharing(facts),
        _traffic(facts),
        _latency(facts),
        _gpu(facts),
        _health(facts),
    ]
    return assemble(builder, rows)
