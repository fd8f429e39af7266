"""The fleet overview: every instance by model, how close each is, and what is firing.

Read top to bottom at 2 a.m.: the fleet at a glance (targets down, firing alerts, headroom per
model, which limit binds how many engines, requests refused at queue limits), then one table row
per engine of every instance with capacity, usage, headroom, preemptions, queue, prediction
error, foreign GPU memory, the binding limit and the effective headroom, then the instances
nearest their ceiling, the trends (the ceiling under every limit against the one with today's
prefix sharing), then the firing alerts with their runbooks. Every number comes from the sidecars'
``headroom_*`` series; click an instance to open its drill-down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grafana_foundation_sdk.builders import dashboard as db

from dashboards import limits
from dashboards.queries import (
    CLUSTER,
    ENGINE_KEY,
    FLEET_ENGINE,
    JOB,
    NAMESPACE,
    TARGET,
    binding_limit,
    metric,
    per_engine,
    scope_variables,
    selector,
)
from dashboards.templating import label_variable
from dashboards.widgets import (
    FLEET_UID,
    INSTANCE_UID,
    Cell,
    Column,
    Query,
    Row,
    assemble,
    bargauge_panel,
    dashboard_frame,
    dashboard_link,
    firing_alerts_table,
    limit_mapping,
    runbook_index_link,
    stat_panel,
    table_panel,
    timeseries_panel,
)

if TYPE_CHECKING:
    from grafana_foundation_sdk.cog import builder as cogbuilder
    from grafana_foundation_sdk.models import dashboard as dm

    from dashboards.rules import RuleFacts

TITLE = "vLLM headroom / Fleet"

#: The labels of one alert instance worth showing (absent ones simply do not appear).
#: A model's fleet: every instance serving it in one namespace (as the fleet alerts group).
MODEL_KEY = "namespace, model_name"
MODEL_LEGEND = "{{model_name}} {{namespace}}"
ALERT_KEY = "alertname, severity, namespace, instance, model_name, engine, gpu, source"
ALERTS = selector('alertname=~"VllmHeadroom.*"', CLUSTER, NAMESPACE)
#: Per-model series the rules record (no job or instance: summed over the model's instances).
MODELS = selector(CLUSTER, NAMESPACE, 'model_name=~"$model"')
FIRING = selector('alertname=~"VllmHeadroom.*"', CLUSTER, NAMESPACE, 'alertstate="firing"')

#: Link from a table row or bar to the instance dashboard of that instance and model.
_DRILL_DOWN = (
    f"/d/{INSTANCE_UID}?${{datasource:queryparam}}&${{job:queryparam}}"
    "&var-namespace=${__data.fields.namespace}&var-instance=${__data.fields.instance}"
    "&var-model=${__data.fields.model_name}&${__url_time_range}"
)
_DRILL_DOWN_FIELD = (
    f"/d/{INSTANCE_UID}?${{datasource:queryparam}}&${{job:queryparam}}"
    "&var-namespace=${__field.labels.namespace}&var-instance=${__field.labels.instance}"
    "&var-model=${__field.labels.model_name}&${__url_time_range}"
)


#: Refusals per second by the admission cap that refused (the flag to raise).
BY_REASON = "headroom_admission_rejections_by_reason_per_second"


def _drill_down(url: str) -> db.DashboardLink:
    return db.DashboardLink("Open the instance dashboard").url(url)


def _variables() -> list[cogbuilder.Builder[dm.VariableModel]]:
    return [
        *scope_variables(),
        label_variable(
            "model",
            label="Model",
            query=(
                f"label_values(headroom_kv_capacity_tokens{{{CLUSTER}, {JOB}, {NAMESPACE}}}, "
                "model_name)"
            ),
            description="Served model name(s), as vLLM reports them in model_name.",
        ),
        label_variable(
            "instance",
            label="Instance",
            query=(
                "label_values(headroom_kv_capacity_tokens"
                f'{{{CLUSTER}, {JOB}, {NAMESPACE}, model_name=~"$model"}}, instance)'
            ),
            description="Sidecar (or probed vLLM) instance(s) serving the selected models.",
        ),
    ]


def _overview(facts: RuleFacts) -> Row:
    # Jobs that served vllm-headroom metrics within a day (as the target-down alert counts them).
    exporter_jobs = (
        "group by (job) (max_over_time(headroom_build_info[1d]) "
        "or max_over_time(headroom_target_up[1d]))"
    )
    return Row(
        "Fleet at a glance",
        [
            Cell(
                stat_panel(
                    "Exporters down",
                    description=(
                        "Targets of vllm-headroom scrape jobs that Prometheus cannot reach."
                    ),
                    unit="short",
                    queries=[
                        Query(
                            f"count((up{{{JOB}}} == 0) and on (job) {exporter_jobs}) or vector(0)"
                        )
                    ],
                    facts=facts,
                    limits=[limits.NONZERO],
                    alerts=[limits.TARGET_DOWN, limits.EXPORTER_ABSENT],
                ),
                3,
                4,
            ),
            Cell(
                stat_panel(
                    "vLLM unreachable",
                    description="Instances whose sidecar's last poll of vLLM's /metrics failed.",
                    unit="short",
                    queries=[
                        Query(f"count({metric('headroom_target_up', TARGET)} == 0) or vector(0)")
                    ],
                    facts=facts,
                    limits=[limits.NONZERO],
                    alerts=[limits.VLLM_UNREACHABLE],
                ),
                3,
                4,
            ),
            Cell(
                stat_panel(
                    "Firing alerts",
                    description="vllm-headroom alerts firing now (details in the table below).",
                    unit="short",
                    queries=[Query(f"count(ALERTS{FIRING}) or vector(0)")],
                    facts=facts,
                    limits=[limits.NONZERO],
                ),
                3,
                4,
            ),
            Cell(
                stat_panel(
                    "Engines sized",
                    description="vLLM engines (data-parallel ranks) the selected sidecars size.",
                    unit="short",
                    queries=[
                        Query(
                            f"count({metric('headroom_kv_capacity_tokens', FLEET_ENGINE)}) "
                            "or vector(0)"
                        )
                    ],
                    facts=facts,
                ),
                3,
                4,
            ),
            Cell(
                stat_panel(
                    "Fleet headroom at p95 context, per model",
                    description=(
                        "More sequences of p95 context length all instances of a model can take "
                        "now, summed over its instances and engines."
                    ),
                    unit="count:seqs",
                    queries=[
                        Query(
                            f"sum by ({MODEL_KEY}) "
                            f"({metric('headroom_p95_available_sequences', FLEET_ENGINE)})",
                            legend=MODEL_LEGEND,
                        )
                    ],
                    facts=facts,
                    limits=[limits.FLEET_SEQUENCES],
                    graph=True,
                ),
                12,
                4,
            ),
            Cell(
                stat_panel(
                    "Engines by binding limit",
                    description=(
                        "How many engines each limit of vLLM's scheduler stops now: the KV "
                        "cache, max_num_seqs (every running slot taken) or sleep."
                    ),
                    unit="short",
                    queries=[
                        Query(
                            "count by (limit) ("
                            f"{metric('headroom_p95_available_limited_by', FLEET_ENGINE)} == 1)",
                            legend="{{limit}}",
                        )
                    ],
                    facts=facts,
                    alerts=[limits.MAX_NUM_SEQS_BINDING],
                    show_name=True,
                ),
                12,
                4,
            ),
            Cell(
                stat_panel(
                    "Requests refused at the queue limit",
                    description=(
                        "Requests the selected vLLM servers refused with 503 per second at their "
                        "queue limits (0.32+), in all and by the cap that refused: "
                        "max_num_queued_reqs is --max-num-queued-reqs, max_num_queued_tokens "
                        "--max-num-queued-tokens."
                    ),
                    unit="reqps",
                    queries=[
                        Query(
                            f"sum({metric('headroom_admission_rejections_per_second', TARGET)})",
                            legend="refused",
                        ),
                        Query(
                            f"sum by (reason) ({metric(BY_REASON, TARGET)})", legend="{{reason}}"
                        ),
                    ],
                    facts=facts,
                    alerts=[limits.ADMISSION_REJECTIONS],
                    graph=True,
                ),
                12,
                4,
            ),
        ],
    )


def _instances(facts: RuleFacts) -> Row:
    by = f"max by ({ENGINE_KEY})"
    columns = [
        Column(
            "Capacity",
            f"{by} ({metric('headroom_kv_capacity_tokens', FLEET_ENGINE)})",
            "count:tokens",
        ),
        Column(
            "In use",
            f"{by} ({metric('headroom_kv_used_tokens', FLEET_ENGINE)})",
            "count:tokens",
        ),
        Column(
            "KV usage",
            f"{by} ({metric('headroom_kv_usage_ratio', FLEET_ENGINE)})",
            "percentunit",
            [limits.KV_SATURATION],
            coloured=True,
        ),
        Column(
            "p95 context",
            f"{by} ({metric('headroom_context_length_p95_tokens', FLEET_ENGINE)})",
            "count:tokens",
        ),
        Column(
            "Headroom @p95",
            f"{by} ({metric('headroom_p95_available_sequences', FLEET_ENGINE)})",
            "count:seqs",
            [limits.HEADROOM_SEQUENCES],
            coloured=True,
        ),
        Column(
            "Headroom ratio",
            f"{by} ({metric('headroom_p95_available_ratio', FLEET_ENGINE)})",
            "percentunit",
            [limits.HEADROOM_RATIO],
            coloured=True,
        ),
        Column(
            "Preemptions",
            f"{by} ({metric('headroom_preemptions_per_second', FLEET_ENGINE)})",
            "count:/s",
            [limits.PREEMPTION_RATE],
            coloured=True,
        ),
        Column(
            "Waiting",
            f"{by} ({metric('headroom_requests_waiting', FLEET_ENGINE)})",
            "count:req",
        ),
        Column(
            "Prediction error",
            f"{by} ({metric('headroom_kv_capacity_prediction_error_ratio', FLEET_ENGINE)})",
            "percentunit",
            [limits.CAPACITY_DRIFT],
            coloured=True,
        ),
        Column(
            "Foreign GPU memory",
            per_engine(
                f"sum by (job, instance) ({metric('headroom_gpu_memory_foreign_bytes', TARGET)})",
                metric("headroom_kv_capacity_tokens", FLEET_ENGINE),
            ),
            "bytes",
            [limits.FOREIGN_MEMORY],
            coloured=True,
        ),
        Column(
            "Limited by",
            binding_limit("headroom_p95_available_limited_by", FLEET_ENGINE, ENGINE_KEY),
            "none",
            mappings=[limit_mapping()],
        ),
        Column(
            "max_num_seqs",
            f"{by} ({metric('headroom_max_num_seqs', FLEET_ENGINE)})",
            "count:seqs",
        ),
        Column(
            "Headroom @p95, shared prefixes",
            f"{by} ({metric('headroom_p95_effective_available_sequences', FLEET_ENGINE)})",
            "count:seqs",
        ),
    ]
    return Row(
        "Instances",
        [
            Cell(
                table_panel(
                    "Instances by model",
                    description=(
                        "One row per vLLM engine: KV capacity, usage and headroom for sequences "
                        "of p95 context, preemptions, queue, sizing error, foreign GPU memory, "
                        "the limit that binds, max_num_seqs and the headroom with today's prefix "
                        "sharing (click an instance to drill down)."
                    ),
                    unit="short",
                    facts=facts,
                    columns=columns,
                    labels=[
                        ("model_name", "Model"),
                        ("namespace", "Namespace"),
                        ("pod", "Pod"),
                        ("instance", "Instance"),
                        ("engine", "Engine"),
                    ],
                    sort_by="Headroom ratio",
                    label_links=[("instance", _drill_down(_DRILL_DOWN))],
                ),
                24,
                10,
            ),
            Cell(
                table_panel(
                    "Fleet totals per model",
                    description=(
                        "Per model and namespace, summed over its instances: capacity, tokens in "
                        "use, headroom at p95 context (as the fleet alert counts it), "
                        "preemptions, queue, and the ceiling and headroom with and without "
                        "today's prefix sharing."
                    ),
                    unit="short",
                    facts=facts,
                    columns=_totals(),
                    labels=[("model_name", "Model"), ("namespace", "Namespace")],
                    sort_by="Headroom ratio",
                ),
                24,
                6,
            ),
        ],
    )


def _totals() -> list[Column]:
    def total(name: str) -> str:
        return f"sum by ({MODEL_KEY}) ({metric(name, FLEET_ENGINE)})"

    return [
        Column(
            "Instances",
            f"count by ({MODEL_KEY}) (group by ({MODEL_KEY}, instance) "
            f"({metric('headroom_kv_capacity_tokens', FLEET_ENGINE)}))",
            "short",
        ),
        Column("Capacity", total("headroom_kv_capacity_tokens"), "count:tokens"),
        Column("In use", total("headroom_kv_used_tokens"), "count:tokens"),
        Column(
            "KV usage",
            f"{total('headroom_kv_used_tokens')} / {total('headroom_kv_usable_tokens')}",
            "percentunit",
        ),
        Column(
            "Headroom @p95",
            total("headroom_p95_available_sequences"),
            "count:seqs",
            [limits.FLEET_SEQUENCES],
            coloured=True,
        ),
        Column(
            "Headroom ratio",
            f"{total('headroom_p95_available_sequences')} "
            f"/ {total('headroom_p95_ceiling_sequences')}",
            "percentunit",
            [limits.FLEET_RATIO],
            coloured=True,
        ),
        Column("Preemptions", total("headroom_preemptions_per_second"), "count:/s"),
        Column("Waiting", total("headroom_requests_waiting"), "count:req"),
        Column("Ceiling @p95", total("headroom_p95_ceiling_sequences"), "count:seqs"),
        Column(
            "Ceiling @p95, shared prefixes",
            total("headroom_p95_effective_ceiling_sequences"),
            "count:seqs",
        ),
        Column(
            "Headroom @p95, shared prefixes",
            total("headroom_p95_effective_available_sequences"),
            "count:seqs",
        ),
    ]


def _nearest(facts: RuleFacts) -> Row:
    key = "max by (namespace, instance, model_name, engine)"
    legend = "{{instance}} {{model_name}} engine {{engine}}"
    return Row(
        "Nearest their ceiling",
        [
            Cell(
                bargauge_panel(
                    "Least headroom (ratio of the p95 ceiling)",
                    description=(
                        "The ten engines with the smallest share of their p95-context ceiling "
                        "still free: first to preempt when traffic grows."
                    ),
                    unit="percentunit",
                    queries=[
                        Query(
                            f"bottomk(10, {key} "
                            f"({metric('headroom_p95_available_ratio', FLEET_ENGINE)}))",
                            legend=legend,
                            instant=True,
                        )
                    ],
                    facts=facts,
                    limits=[limits.HEADROOM_RATIO],
                    minimum=0,
                    maximum=1,
                    data_links=[_drill_down(_DRILL_DOWN_FIELD)],
                ),
                12,
                8,
            ),
            Cell(
                bargauge_panel(
                    "Highest KV-cache usage",
                    description=(
                        "The ten engines whose running requests hold the largest share of the "
                        "usable KV cache now."
                    ),
                    unit="percentunit",
                    queries=[
                        Query(
                            f"topk(10, {key} ({metric('headroom_kv_usage_ratio', FLEET_ENGINE)}))",
                            legend=legend,
                            instant=True,
                        )
                    ],
                    facts=facts,
                    limits=[limits.KV_SATURATION],
                    minimum=0,
                    maximum=1,
                    data_links=[_drill_down(_DRILL_DOWN_FIELD)],
                ),
                12,
                8,
            ),
        ],
    )


def _burn(ratio: str, window: str, objective: str) -> str:
    """A model's SLO burn rate: its recorded bad ratio over the budget (1 - objective).

    The objective is read from its threshold series, per release where the chart labels them
    (headroom_release, absent for the plain rule file: both sides then match on nothing).
    """
    bad = metric(
        f"{ratio}:ratio_rate{window}", selector(CLUSTER, NAMESPACE, 'model_name=~"$model"')
    )
    budget = f"(1 - headroom:threshold:{objective})"
    return f"{bad} / on (headroom_release) group_left () {budget}"


def _burn_rates(ratio: str, objective: str) -> list[Query]:
    """The fast-burn page's two windows (1h and 5m) of one SLO, a line per model."""
    return [
        Query(_burn(ratio, window, objective), legend=f"{window} {MODEL_LEGEND}")
        for window in ("1h", "5m")
    ]


def _burn_cell(facts: RuleFacts, title: str, budget: str, ratio: str, objective: str) -> Cell:
    """One SLO's fast-burn panel: its burn rate per model over the page's two windows."""
    return Cell(
        timeseries_panel(
            title,
            description=(
                f"How many times faster than its objective allows each model spends its {budget},"
                " over 1h and 5m: the page needs both above the line."
            ),
            unit="suffix:×",
            queries=_burn_rates(ratio, objective),
            facts=facts,
            limits=[limits.SLO_FAST_BURN],
            minimum=0,
        ),
        12,
        8,
    )


def _budget_cell(facts: RuleFacts) -> Cell:
    """Each SLO's error budget left over 30 days, per model (nothing until an objective is set)."""
    budgets = (
        ("TTFT", "headroom:model_ttft_budget_remaining:ratio_30d"),
        ("errors", "headroom:model_requests_failed_budget_remaining:ratio_30d"),
    )
    return Cell(
        timeseries_panel(
            "Error budget left (30 days)",
            description=(
                "The share of each SLO's 30-day error budget still unspent per model (1: "
                "untouched, below 0: overspent); empty until the SLO's objective is set."
            ),
            unit="percentunit",
            queries=[
                Query(metric(name, MODELS), legend=f"{slo} {MODEL_LEGEND}") for slo, name in budgets
            ],
            facts=facts,
            limits=[limits.BUDGET_SPENT],
            alerts=[limits.TTFT_BUDGET_TICKET, limits.ERROR_BUDGET_TICKET],
            maximum=1,
        ),
        12,
        8,
    )


def _trends(facts: RuleFacts) -> Row:
    def total(name: str) -> str:
        return f"sum by ({MODEL_KEY}) ({metric(name, FLEET_ENGINE)})"

    # The context-growth alert's own expression: the per-model p95 (engines with enough
    # requests in their window) averaged over an hour, against the same hour a day earlier.
    p95 = metric(
        "headroom:model_context_length_p95_tokens:max",
        selector(CLUSTER, NAMESPACE, 'model_name=~"$model"'),
    )
    growth = f"avg_over_time({p95}[1h]) / avg_over_time({p95}[1h] offset 1d)"
    return Row(
        "What changed",
        [
            Cell(
                timeseries_panel(
                    "Fleet headroom at p95 context",
                    description=(
                        "More sequences of p95 context length each model's instances can take, "
                        "summed, over time."
                    ),
                    unit="count:seqs",
                    queries=[Query(total("headroom_p95_available_sequences"), legend=MODEL_LEGEND)],
                    facts=facts,
                    limits=[limits.FLEET_SEQUENCES],
                    minimum=0,
                ),
                6,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Fleet headroom ratio",
                    description=(
                        "Each model's summed headroom as a share of its summed p95 ceiling "
                        "(0: every instance full)."
                    ),
                    unit="percentunit",
                    queries=[
                        Query(
                            f"{total('headroom_p95_available_sequences')} "
                            f"/ {total('headroom_p95_ceiling_sequences')}",
                            legend=MODEL_LEGEND,
                        )
                    ],
                    facts=facts,
                    limits=[limits.FLEET_RATIO],
                    minimum=0,
                    maximum=1,
                ),
                6,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Preemptions per model",
                    description="Preemptions per second summed over each model's engines.",
                    unit="count:/s",
                    queries=[Query(total("headroom_preemptions_per_second"), legend=MODEL_LEGEND)],
                    facts=facts,
                    minimum=0,
                ),
                6,
                8,
            ),
            Cell(
                timeseries_panel(
                    "p95 context vs a day earlier",
                    description=(
                        "Each model's p95 context length over the last hour divided by the same "
                        "hour yesterday (needs the recording rules and a day of history)."
                    ),
                    unit="suffix:×",
                    queries=[Query(growth, legend=MODEL_LEGEND)],
                    facts=facts,
                    limits=[limits.CONTEXT_GROWTH],
                    minimum=0,
                ),
                6,
                8,
            ),
            _burn_cell(
                facts,
                "Time-to-first-token budget burn",
                "TTFT error budget (requests slower than the SLO's target)",
                "headroom:model_ttft_slow",
                "slo_ttft_objective",
            ),
            _burn_cell(
                facts,
                "Error budget burn",
                "error budget (requests that failed: HTTP 5xx or an engine error)",
                "headroom:model_requests_failed",
                "slo_error_objective",
            ),
            _budget_cell(facts),
            Cell(
                timeseries_panel(
                    "Fleet ceiling: every limit vs shared prefixes",
                    description=(
                        "Each model's p95 ceiling summed over its engines: under every limit "
                        "counting no block shared (what the fleet alert reads), the KV caches "
                        "alone, and with today's prefix sharing counted once."
                    ),
                    unit="count:seqs",
                    queries=[
                        Query(
                            total("headroom_p95_ceiling_sequences"),
                            legend="every limit, " + MODEL_LEGEND,
                        ),
                        Query(
                            total("headroom_p95_kv_ceiling_sequences"),
                            legend="KV cache alone, " + MODEL_LEGEND,
                        ),
                        Query(
                            total("headroom_p95_effective_ceiling_sequences"),
                            legend="with shared prefixes, " + MODEL_LEGEND,
                        ),
                    ],
                    facts=facts,
                    minimum=0,
                ),
                12,
                8,
            ),
            Cell(
                timeseries_panel(
                    "Engines by binding limit over time",
                    description=(
                        "How many engines each limit of vLLM's scheduler stopped over time: a "
                        "shift to max_num_seqs or to sleep is a change of configuration or use."
                    ),
                    unit="short",
                    queries=[
                        Query(
                            "count by (limit) ("
                            f"{metric('headroom_p95_available_limited_by', FLEET_ENGINE)} == 1)",
                            legend="{{limit}}",
                        )
                    ],
                    facts=facts,
                    alerts=[limits.MAX_NUM_SEQS_BINDING],
                    minimum=0,
                ),
                12,
                8,
            ),
        ],
    )


def _alerts(facts: RuleFacts) -> Row:
    return Row(
        "Firing alerts",
        [
            firing_alerts_table(
                facts,
                description=(
                    "vllm-headroom alerts firing now, with when they became active (click "
                    "an alert name for its runbook)."
                ),
                alerts=ALERTS,
                firing=FIRING,
                labels=[
                    ("alertname", "Alert"),
                    ("severity", "Severity"),
                    ("namespace", "Namespace"),
                    ("instance", "Instance"),
                    ("model_name", "Model"),
                    ("engine", "Engine"),
                    ("gpu", "GPU"),
                    ("source", "Source"),
                ],
                height=8,
            )
        ],
    )


def build(facts: RuleFacts) -> dm.Dashboard:
    """The fleet overview dashboard, its thresholds and runbook links taken from ``facts``."""
    builder = (
        dashboard_frame(
            TITLE,
            FLEET_UID,
            "Every vLLM instance's KV-cache capacity and headroom for real traffic, by model, "
            "from the vllm-headroom sidecars.",
            since="6h",
            refresh="1m",
            variables=_variables(),
            target_selector=TARGET,
        )
        .link(
            dashboard_link(
                "Instance drill-down", INSTANCE_UID, "One instance's sizing chain and history"
            )
        )
        .link(runbook_index_link(facts))
    )
    rows = [_overview(facts), _instances(facts), _nearest(facts), _trends(facts), _alerts(facts)]
    return assemble(builder, rows)
