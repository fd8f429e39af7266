"""The Prometheus rules of vllm-headroom as one table, rendered for any pair of selectors.

This table is the one source of the rules: ``make docs`` (``python -m alerts.generate``) renders
it into ``alerts/vllm-headroom.rules.yml`` (unscoped: what users load directly and what the
promtool tests in tests/alerts/ evaluate) and into the Helm chart's copy
``helm/vllm-headroom/files/alerts/vllm-headroom.rules.yml``, which keeps the markers below for
``templates/_rules.tpl`` to fill with each release's selectors (the monitoring-mixin way: the
selector is a parameter, not PromQL rewritten by patterns).

Every selector of a series that Prometheus scrapes (``vllm:*``, ``headroom_*``, ``process_*``,
vLLM's ``http_requests_total``, ``up``) carries :data:`SCRAPED`, every selector of a series these
rules record (``headroom:*:*``, thresholds included) carries :data:`RECORDED`, always first in the
braces: ``name{<scraped>}`` or ``name{<scraped>,label="value"}``. :func:`fill` puts matchers in
their place, or with none drops the marker (and braces left empty), giving the plain selector.
Multi-line texts are YAML folded blocks (``>-``) as written: line breaks fold into spaces except
around more-indented lines. Each runbook_url is derived from the alert's name.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import yaml

#: Marks the selector of a scraped series; the chart fills in the release's jobs (or
#: prometheusRule.selector).
SCRAPED = "<scraped>"
#: Marks the selector of a recorded series; the chart fills in headroom_release="<ns>/<name>".
RECORDED = "<recorded>"
#: Marks the ``namespace`` label of an alert whose expression keeps no target label (see
#: ``Alert.release_namespace``); the chart fills in the release's namespace (unscoped: no label).
NAMESPACE = "<namespace>"
#: Where each alert's runbook lives: ``RUNBOOKS + <alert>.md``.
RUNBOOKS = "https://github.com/vllm-headroom/vllm-headroom/blob/main/docs/runbooks/"


@dataclass(frozen=True)
class Record:
    """A recording rule; ``comment`` becomes the YAML comment above it."""

    record: str
    expr: str
    comment: str = ""


@dataclass(frozen=True)
class Alert:
    """An alerting rule with the labels and annotations every alert of vllm-headroom carries."""

    alert: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    dashboard_url: str
    keep_firing_for: str = ""
    comment: str = ""
    #: Its expression aggregates every target label away (absent, count): in a release the chart
    #: labels it with the release's namespace, by which Alertmanager routes (prometheus-operator's
    #: AlertmanagerConfig matches only alerts of its own namespace).
    release_namespace: bool = False


@dataclass(frozen=True)
class Group:
    """A rule group; ``comment`` becomes the YAML comment above it."""

    name: str
    rules: tuple[Record | Alert, ...]
    comment: str = ""
    interval: str = ""


GROUPS: tuple[Group, ...] = (
    Group(
        "vllm-headroom-thresholds",
        comment="""
            Tunables. Each is one series without labels (per release, the chart labels it with
            headroom_release); the dashboards read their defaults from here.
        """,
        rules=(
            Record("headroom:threshold:preemptions_per_second", "vector(0.05)"),
            Record("headroom:threshold:preemptions_per_second_spike", "vector(0.5)"),
            Record("headroom:threshold:preemptions_per_finished_request", "vector(0.05)"),
            Record("headroom:threshold:kv_saturation_ratio", "vector(0.9)"),
            Record("headroom:threshold:kv_exhaustion_horizon_seconds", "vector(3600)"),
            Record("headroom:threshold:kv_exhaustion_min_usage_ratio", "vector(0.5)"),
            Record("headroom:threshold:headroom_min_sequences", "vector(2)"),
            Record("headroom:threshold:headroom_min_ratio", "vector(0.1)"),
            Record("headroom:threshold:fleet_min_sequences", "vector(4)"),
            Record("headroom:threshold:fleet_min_ratio", "vector(0.2)"),
            Record("headroom:threshold:context_growth_factor", "vector(1.5)"),
            Record("headroom:threshold:context_growth_min_requests", "vector(20)"),
            Record("headroom:threshold:capacity_drift_ratio", "vector(0.1)"),
            Record("headroom:threshold:gpu_foreign_memory_bytes", "vector(1073741824)"),
            Record("headroom:threshold:gpu_unexplained_memory_bytes", "vector(2147483648)"),
            Record("headroom:threshold:gpu_free_memory_min_bytes", "vector(536870912)"),
            Record("headroom:threshold:stale_seconds", "vector(120)"),
            Record("headroom:threshold:vllm_startup_seconds", "vector(1800)"),
            Record("headroom:threshold:vllm_restarts_per_hour", "vector(3)"),
            Record("headroom:threshold:slo_ttft_seconds", "vector(2.5)"),
            Record(
                "headroom:threshold:slo_ttft_objective",
                comment="""
                    The SLO objectives: unset (recording nothing, absent(vector(0)) is empty) until you
                    state one, e.g. vector(0.99) for 99% of first tokens within slo_ttft_seconds and
                    vector(0.999) for 99.9% of requests without error. Unset, its SLO alerts cannot fire.
                """,
                expr="absent(vector(0))",
            ),
            Record("headroom:threshold:slo_error_objective", "absent(vector(0))"),
            Record("headroom:threshold:slo_burn_rate_fast", "vector(14.4)"),
            Record("headroom:threshold:slo_burn_rate_slow", "vector(6)"),
            Record("headroom:threshold:slo_ticket_burn_rate_fast", "vector(3)"),
            Record("headroom:threshold:slo_ticket_burn_rate_slow", "vector(1)"),
            Record("headroom:threshold:slo_min_requests_per_second", "vector(0.05)"),
        ),
    ),
    Group(
        "vllm-headroom-recording",
        comment="""
            Recording rules: what the alerts and the dashboards share. `headroom:` takes the level slot of
            the level:metric:operations convention; the metric part starts with its aggregation level
            (vllm_* per vLLM instance or engine as labelled, model_* per model and namespace).
        """,
        rules=(
            Record(
                "headroom:vllm_kv_usage:avg5m",
                comment="""
                    KV-cache usage per engine, averaged over 5m (usage swings with every finished request).
                    vLLM 0.9.2 renamed gpu_cache_usage_perc to kv_cache_usage_perc and exposed both until
                    0.12: the new name wins where both exist (same labels), the old one serves V0 and old V1.
                """,
                expr="""
                    avg_over_time(vllm:kv_cache_usage_perc{<scraped>}[5m])
                    or avg_over_time(vllm:gpu_cache_usage_perc{<scraped>}[5m])
                """,
            ),
            Record(
                "headroom:vllm_requests_waiting:deriv5m",
                comment="Queue growth per engine, in requests per second (least-squares slope over 5m).",
                expr="deriv(vllm:num_requests_waiting{<scraped>}[5m])",
            ),
            Record(
                "headroom:model_p95_available_sequences:sum",
                comment="""
                    Fleet figures per model (and namespace, and cluster where Thanos/Mimir add one), summed
                    over every instance and data-parallel engine of the sidecar that serves that model.
                """,
                expr="sum by (cluster, namespace, model_name) (headroom_p95_available_sequences{<scraped>})",
            ),
            Record(
                "headroom:model_p95_ceiling_sequences:sum",
                expr="sum by (cluster, namespace, model_name) (headroom_p95_ceiling_sequences{<scraped>})",
            ),
            Record(
                "headroom:model_p95_available:ratio",
                expr="headroom:model_p95_available_sequences:sum{<recorded>} / headroom:model_p95_ceiling_sequences:sum{<recorded>}",
            ),
            Record(
                "headroom:model_requests_running:sum",
                expr="sum by (cluster, namespace, model_name) (headroom_requests_running{<scraped>})",
            ),
            Record(
                "headroom:model_requests_waiting:sum",
                expr="sum by (cluster, namespace, model_name) (headroom_requests_waiting{<scraped>})",
            ),
            Record(
                "headroom:model_instances:count",
                expr="""
                    count by (cluster, namespace, model_name) (
                      count by (cluster, namespace, model_name, job, instance) (headroom_kv_usable_tokens{<scraped>})
                    )
                """,
            ),
            Record(
                "headroom:model_context_length_p95_tokens:max",
                comment="""
                    p95 context length per model, from engines with enough requests in their window to mean
                    something (the sidecar falls back to vLLM's lifetime when its window is empty). Per model,
                    not per instance: pods get new names on every rollout, traffic belongs to the model.
                """,
                expr="""
                    max by (cluster, namespace, model_name) (
                      headroom_context_length_p95_tokens{<scraped>}
                      and headroom_context_window_requests{<scraped>}
                        >= scalar(headroom:threshold:context_growth_min_requests{<recorded>})
                    )
                """,
            ),
            Record(
                "headroom:exporter_jobs:present",
                comment="Scrape jobs that serve vllm-headroom metrics (sidecar /metrics, fleet /metrics or /probe).",
                expr="group by (job) (headroom_build_info{<scraped>}) or group by (job) (headroom_target_up{<scraped>})",
            ),
        ),
    ),
    Group(
        "vllm-headroom-slo",
        comment="""
            Service-level objectives, per model: what users feel. Off until you state an objective:
            headroom:threshold:slo_ttft_objective and slo_error_objective record nothing by default, so
            no burn rate, budget or SLO alert exists for them (set them in the Helm values, or replace
            their expr by vector(<objective>) in your copy, or record them in a rule file of your own).
            Multiwindow, multi-burn-rate alerts with the SRE workbook's windows (chapter 5): the page
            when the budget burns slo_burn_rate_fast (14.4) times too fast over 1h and 5m, or
            slo_burn_rate_slow (6) times over 6h and 30m; the ticket at slo_ticket_burn_rate_fast (3)
            over 1d and 2h, or slo_ticket_burn_rate_slow (1) over 3d and 6h. An alert's value is the
            burn rate of the long window of the pair that fired. A model with fewer than
            slo_min_requests_per_second (over the last 5 minutes for the page, 2 hours for the ticket)
            never alerts: one slow request among three is not an outage.
        """,
        rules=(
            Record(
                "headroom:model_ttft_requests:rate5m",
                comment="""
                    Each SLI is two per-model rates over 5m, bad and all; a window's ratio divides their
                    sums over that window (each 5m rate weighs its traffic, so a quiet hour counts less than
                    a busy one), which costs one recorded series per model, not a raw range of days.
                    TTFT: requests whose first token took longer than slo_ttft_seconds, which must be a
                    bucket boundary of vLLM's histogram (0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, ...):
                    count_values turns it into an `le` label ("2.5"; "1" becomes "1.0" as vLLM writes it).
                """,
                expr="sum by (cluster, namespace, model_name) (rate(vllm:time_to_first_token_seconds_count{<scraped>}[5m]))",
            ),
            Record(
                "headroom:model_ttft_slow:rate5m",
                expr="""
                    headroom:model_ttft_requests:rate5m{<recorded>}
                    - on (cluster, namespace, model_name) sum by (cluster, namespace, model_name) (
                        rate(vllm:time_to_first_token_seconds_bucket{<scraped>}[5m])
                        and on (le) label_replace(
                          count_values("le", headroom:threshold:slo_ttft_seconds{<recorded>}), "le", "$1.0", "le", "^([0-9]+)$"
                        )
                      )
                """,
            ),
            Record(
                "headroom:model_requests:rate5m",
                comment="""
                    Errors as users see them: the responses of vLLM's inference API (every /v1/ handler
                    but /v1/models) counted by its HTTP server (http_requests_total, status grouped as
                    "2xx", "4xx", "5xx"), given the model of the vLLM that served them. Failed: 5xx, which
                    includes the 503 of requests refused at --max-num-queued-reqs or --max-num-queued-tokens
                    (vllm:admission_rejections_total counts those too) and the 500 of a generation error;
                    or vLLM's finished_reason="error" where that is larger (a stream that fails after its
                    200 is only counted there; the larger of the two never counts a request twice).
                    Client aborts and 4xx are not failures (docs/alerting.md). Without http_requests_total
                    (a scrape that drops it) every finished request counts as a request.
                """,
                expr="""
                    sum by (cluster, namespace, model_name) (
                      sum by (cluster, namespace, job, instance) (
                        rate(http_requests_total{<scraped>,handler=~"/v1/.+",handler!="/v1/models"}[5m])
                      )
                      * on (cluster, namespace, job, instance) group_left (model_name)
                        group by (cluster, namespace, job, instance, model_name) (vllm:num_requests_running{<scraped>})
                    )
                    or sum by (cluster, namespace, model_name) (rate(vllm:request_success_total{<scraped>}[5m]))
                """,
            ),
            Record(
                "headroom:model_requests_failed:rate5m",
                expr="""
                    max by (cluster, namespace, model_name) (
                      label_replace(
                        sum by (cluster, namespace, model_name) (
                          sum by (cluster, namespace, job, instance) (
                            rate(http_requests_total{<scraped>,handler=~"/v1/.+",handler!="/v1/models",status="5xx"}[5m])
                          )
                          * on (cluster, namespace, job, instance) group_left (model_name)
                            group by (cluster, namespace, job, instance, model_name) (vllm:num_requests_running{<scraped>})
                        ),
                        "sli", "http_5xx", "", ""
                      )
                      or label_replace(
                        sum by (cluster, namespace, model_name) (
                          rate(vllm:request_success_total{<scraped>,finished_reason="error"}[5m])
                        ),
                        "sli", "finished_error", "", ""
                      )
                    )
                    or on (cluster, namespace, model_name) 0 * headroom:model_requests:rate5m{<recorded>}
                """,
            ),
            Record(
                "headroom:model_ttft_slow:ratio_rate5m",
                comment="The share of bad requests over each window the alerts read (30d: the budget group).",
                expr="headroom:model_ttft_slow:rate5m{<recorded>} / headroom:model_ttft_requests:rate5m{<recorded>}",
            ),
            Record(
                "headroom:model_ttft_slow:ratio_rate30m",
                expr="sum_over_time(headroom:model_ttft_slow:rate5m{<recorded>}[30m]) / sum_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[30m])",
            ),
            Record(
                "headroom:model_ttft_slow:ratio_rate1h",
                expr="sum_over_time(headroom:model_ttft_slow:rate5m{<recorded>}[1h]) / sum_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[1h])",
            ),
            Record(
                "headroom:model_ttft_slow:ratio_rate2h",
                expr="sum_over_time(headroom:model_ttft_slow:rate5m{<recorded>}[2h]) / sum_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[2h])",
            ),
            Record(
                "headroom:model_ttft_slow:ratio_rate6h",
                expr="sum_over_time(headroom:model_ttft_slow:rate5m{<recorded>}[6h]) / sum_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[6h])",
            ),
            Record(
                "headroom:model_ttft_slow:ratio_rate1d",
                expr="sum_over_time(headroom:model_ttft_slow:rate5m{<recorded>}[1d]) / sum_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[1d])",
            ),
            Record(
                "headroom:model_ttft_slow:ratio_rate3d",
                expr="sum_over_time(headroom:model_ttft_slow:rate5m{<recorded>}[3d]) / sum_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[3d])",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate5m",
                expr="headroom:model_requests_failed:rate5m{<recorded>} / headroom:model_requests:rate5m{<recorded>}",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate30m",
                expr="sum_over_time(headroom:model_requests_failed:rate5m{<recorded>}[30m]) / sum_over_time(headroom:model_requests:rate5m{<recorded>}[30m])",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate1h",
                expr="sum_over_time(headroom:model_requests_failed:rate5m{<recorded>}[1h]) / sum_over_time(headroom:model_requests:rate5m{<recorded>}[1h])",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate2h",
                expr="sum_over_time(headroom:model_requests_failed:rate5m{<recorded>}[2h]) / sum_over_time(headroom:model_requests:rate5m{<recorded>}[2h])",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate6h",
                expr="sum_over_time(headroom:model_requests_failed:rate5m{<recorded>}[6h]) / sum_over_time(headroom:model_requests:rate5m{<recorded>}[6h])",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate1d",
                expr="sum_over_time(headroom:model_requests_failed:rate5m{<recorded>}[1d]) / sum_over_time(headroom:model_requests:rate5m{<recorded>}[1d])",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate3d",
                expr="sum_over_time(headroom:model_requests_failed:rate5m{<recorded>}[3d]) / sum_over_time(headroom:model_requests:rate5m{<recorded>}[3d])",
            ),
            Alert(
                "VllmHeadroomTtftBudgetBurn",
                expr="""
                    (
                      headroom:model_ttft_slow:ratio_rate1h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_fast{<recorded>})
                      and headroom:model_ttft_slow:ratio_rate5m{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_fast{<recorded>})
                      or
                      headroom:model_ttft_slow:ratio_rate6h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_slow{<recorded>})
                      and headroom:model_ttft_slow:ratio_rate30m{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_slow{<recorded>})
                    )
                    and on (cluster, namespace, model_name)
                      headroom:model_ttft_requests:rate5m{<recorded>} >= scalar(headroom:threshold:slo_min_requests_per_second{<recorded>})
                """,
                for_="2m",
                severity="critical",
                summary="""
                    Requests to {{ $labels.model_name }} wait too long for their first token: the TTFT SLO burns
                    its error budget fast.
                """,
                description="""
                    {{ $labels.model_name }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }} burns its
                    time-to-first-token error budget {{ $value | printf "%.1f" }} times as fast as the objective
                    allows: {{ with printf "headroom:model_ttft_slow:ratio_rate5m{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} of requests over the last 5 minutes
                    and {{ with printf "headroom:model_ttft_slow:ratio_rate1h{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} over the last hour waited longer than
                    {{ with printf "headroom:threshold:slo_ttft_seconds{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }} s for their first token (objective:
                    {{ with printf "headroom:threshold:slo_ttft_objective{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} within it; page at a burn rate of
                    {{ with printf "headroom:threshold:slo_burn_rate_fast{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }} over 1h and 5m, or
                    {{ with printf "headroom:threshold:slo_burn_rate_slow{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }} over 6h and 30m). Users wait: look for the cause on
                    its instances (preemption, a full KV cache, a queue at max_num_seqs).
                """,
                dashboard_url="/d/vllm-headroom-fleet?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomTtftBudgetBurnSlow",
                expr="""
                    (
                      headroom:model_ttft_slow:ratio_rate1d{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_fast{<recorded>})
                      and headroom:model_ttft_slow:ratio_rate2h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_fast{<recorded>})
                      or
                      headroom:model_ttft_slow:ratio_rate3d{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_slow{<recorded>})
                      and headroom:model_ttft_slow:ratio_rate6h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_slow{<recorded>})
                    )
                    and on (cluster, namespace, model_name)
                      avg_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[2h])
                        >= scalar(headroom:threshold:slo_min_requests_per_second{<recorded>})
                """,
                for_="15m",
                severity="warning",
                summary="""
                    {{ $labels.model_name }} spends its time-to-first-token error budget faster than the
                    objective allows.
                """,
                description="""
                    {{ $labels.model_name }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }} burns its
                    time-to-first-token error budget {{ $value | printf "%.1f" }} times as fast as the objective
                    allows over days: {{ with printf "headroom:model_ttft_slow:ratio_rate1d{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} of requests over the last day
                    waited longer than {{ with printf "headroom:threshold:slo_ttft_seconds{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }} s for their first token
                    ({{ with printf "headroom:model_ttft_budget_remaining:ratio_30d{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} of the 30-day budget left). Not urgent:
                    at this pace the budget runs out before the month does; find the cause in working hours.
                """,
                dashboard_url="/d/vllm-headroom-fleet?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomErrorBudgetBurn",
                expr="""
                    (
                      headroom:model_requests_failed:ratio_rate1h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_fast{<recorded>})
                      and headroom:model_requests_failed:ratio_rate5m{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_fast{<recorded>})
                      or
                      headroom:model_requests_failed:ratio_rate6h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_slow{<recorded>})
                      and headroom:model_requests_failed:ratio_rate30m{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_burn_rate_slow{<recorded>})
                    )
                    and on (cluster, namespace, model_name)
                      headroom:model_requests:rate5m{<recorded>} >= scalar(headroom:threshold:slo_min_requests_per_second{<recorded>})
                """,
                for_="2m",
                severity="critical",
                summary="vLLM fails requests to {{ $labels.model_name }}: the error SLO burns its error budget fast.",
                description="""
                    {{ $labels.model_name }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }} burns its
                    error budget {{ $value | printf "%.1f" }} times as fast as the objective allows:
                    {{ with printf "headroom:model_requests_failed:ratio_rate5m{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} of requests over the last 5 minutes
                    and {{ with printf "headroom:model_requests_failed:ratio_rate1h{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} over the last hour failed
                    (HTTP 5xx, refusals at the queue limit included, or finished_reason="error"; objective:
                    {{ with printf "headroom:threshold:slo_error_objective{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} without error; page at a burn rate of
                    {{ with printf "headroom:threshold:slo_burn_rate_fast{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }} over 1h and 5m, or
                    {{ with printf "headroom:threshold:slo_burn_rate_slow{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }} over 6h and 30m). Clients get errors now:
                    vLLM's logs say why.
                """,
                dashboard_url="/d/vllm-headroom-fleet?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomErrorBudgetBurnSlow",
                expr="""
                    (
                      headroom:model_requests_failed:ratio_rate1d{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_fast{<recorded>})
                      and headroom:model_requests_failed:ratio_rate2h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_fast{<recorded>})
                      or
                      headroom:model_requests_failed:ratio_rate3d{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_slow{<recorded>})
                      and headroom:model_requests_failed:ratio_rate6h{<recorded>} / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                        > scalar(headroom:threshold:slo_ticket_burn_rate_slow{<recorded>})
                    )
                    and on (cluster, namespace, model_name)
                      avg_over_time(headroom:model_requests:rate5m{<recorded>}[2h])
                        >= scalar(headroom:threshold:slo_min_requests_per_second{<recorded>})
                """,
                for_="15m",
                severity="warning",
                summary="{{ $labels.model_name }} spends its error budget faster than the objective allows.",
                description="""
                    {{ $labels.model_name }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }} burns its
                    error budget {{ $value | printf "%.1f" }} times as fast as the objective allows over days:
                    {{ with printf "headroom:model_requests_failed:ratio_rate1d{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} of requests over the last day failed
                    ({{ with printf "headroom:model_requests_failed_budget_remaining:ratio_30d{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }} of the 30-day budget left). Not urgent:
                    at this pace the budget runs out before the month does; find the cause in working hours.
                """,
                dashboard_url="/d/vllm-headroom-fleet?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
        ),
    ),
    Group(
        "vllm-headroom-slo-budget",
        interval="5m",
        comment="""
            The error budget left over the SLO's 30 days, per model: a 30-day range of every model's 5m
            rates is the costliest read of these rules, and a budget moves slowly, so every 5 minutes.
        """,
        rules=(
            Record(
                "headroom:model_ttft_slow:ratio_rate30d",
                expr="sum_over_time(headroom:model_ttft_slow:rate5m{<recorded>}[30d]) / sum_over_time(headroom:model_ttft_requests:rate5m{<recorded>}[30d])",
            ),
            Record(
                "headroom:model_requests_failed:ratio_rate30d",
                expr="sum_over_time(headroom:model_requests_failed:rate5m{<recorded>}[30d]) / sum_over_time(headroom:model_requests:rate5m{<recorded>}[30d])",
            ),
            Record(
                "headroom:model_ttft_budget_remaining:ratio_30d",
                comment="""
                    The error budget left over the last 30 days (the SLO window; Prometheus's retention
                    bounds it): 1 untouched, 0 spent, below 0 overspent. Absent while the objective is unset.
                """,
                expr="""
                    1 - headroom:model_ttft_slow:ratio_rate30d{<recorded>}
                      / on () group_left () (1 - headroom:threshold:slo_ttft_objective{<recorded>})
                """,
            ),
            Record(
                "headroom:model_requests_failed_budget_remaining:ratio_30d",
                expr="""
                    1 - headroom:model_requests_failed:ratio_rate30d{<recorded>}
                      / on () group_left () (1 - headroom:threshold:slo_error_objective{<recorded>})
                """,
            ),
        ),
    ),
    Group(
        "vllm-headroom-capacity",
        comment="Capacity: what the sizing model says about real traffic.",
        rules=(
            Record(
                "headroom:vllm_preemptions:rate1m",
                comment="""
                    Rules of a group run in order at each evaluation: these rates are recorded here, before
                    the alert that reads them, so that it never sees them one evaluation late.
                    vLLM's own counters, read directly (the same names in V0 and V1). rate() is reset-safe
                    across vLLM restarts. Summed over data-parallel engines: one figure per vLLM instance.
                    Windows as in multiwindow burn-rate alerts: 1m and 2m say "now", 5m says "sustained".
                    A 1m rate needs two samples a minute (a scrape interval of 30 s or less); the 2m and 5m
                    rates work at a 1-minute scrape interval too.
                """,
                expr="sum without (engine) (rate(vllm:num_preemptions_total{<scraped>}[1m]))",
            ),
            Record(
                "headroom:vllm_preemptions:rate2m",
                expr="sum without (engine) (rate(vllm:num_preemptions_total{<scraped>}[2m]))",
            ),
            Record(
                "headroom:vllm_preemptions:rate5m",
                expr="sum without (engine) (rate(vllm:num_preemptions_total{<scraped>}[5m]))",
            ),
            Record(
                "headroom:vllm_requests_finished:rate1m",
                comment="Every finished request, whatever its finished_reason (stop, length, abort...).",
                expr="sum without (engine, finished_reason) (rate(vllm:request_success_total{<scraped>}[1m]))",
            ),
            Record(
                "headroom:vllm_requests_finished:rate5m",
                expr="sum without (engine, finished_reason) (rate(vllm:request_success_total{<scraped>}[5m]))",
            ),
            Record(
                "headroom:vllm_preemptions_per_finished_request:ratio_rate1m",
                comment="+Inf when vLLM preempts and finishes nothing (stuck); NaN when idle (no alert fires).",
                expr="headroom:vllm_preemptions:rate1m{<recorded>} / headroom:vllm_requests_finished:rate1m{<recorded>}",
            ),
            Record(
                "headroom:vllm_preemptions_per_finished_request:ratio_rate5m",
                expr="headroom:vllm_preemptions:rate5m{<recorded>} / headroom:vllm_requests_finished:rate5m{<recorded>}",
            ),
            Alert(
                "VllmHeadroomPreemptionSpike",
                comment="""
                    Multiwindow, as the SRE workbook's burn-rate alerts. A spike pages when the last minute
                    preempts at preemptions_per_second_spike (10x the base rate) for the `for`: one burst,
                    however large, moves the 1-minute rate for one scrape interval only (at the 30 s the
                    chart scrapes at), less than the `for`. A slower leak pages when the 5-minute rate
                    reaches preemptions_per_second and the 2-minute rate has stayed there for 2 minutes (a
                    burst stays in a 2-minute rate for less than that) and the `for`. Both branches return
                    the 2-minute rate, so one instance is one alert; the description carries the evidence
                    (KV usage, queue) so that the one page says why. keep_firing_for: the page stays active
                    5 minutes after its condition clears, as long as the TTFT SLO's 5-minute window still
                    holds the slow first tokens it caused, so that symptom page joins the model's open page
                    group (Alertmanager groups pages per model) instead of paging anew as the incident ends.
                """,
                expr="""
                    (
                      headroom:vllm_preemptions:rate2m{<recorded>}
                      and headroom:vllm_preemptions:rate1m{<recorded>}
                        >= scalar(headroom:threshold:preemptions_per_second_spike{<recorded>})
                      and headroom:vllm_preemptions_per_finished_request:ratio_rate1m{<recorded>}
                        >= scalar(headroom:threshold:preemptions_per_finished_request{<recorded>})
                    )
                    or (
                      headroom:vllm_preemptions:rate2m{<recorded>} >= scalar(headroom:threshold:preemptions_per_second{<recorded>})
                      and min_over_time(headroom:vllm_preemptions:rate2m{<recorded>}[2m])
                        >= scalar(headroom:threshold:preemptions_per_second{<recorded>})
                      and headroom:vllm_preemptions:rate5m{<recorded>}
                        >= scalar(headroom:threshold:preemptions_per_second{<recorded>})
                      and headroom:vllm_preemptions_per_finished_request:ratio_rate5m{<recorded>}
                        >= scalar(headroom:threshold:preemptions_per_finished_request{<recorded>})
                    )
                """,
                for_="1m",
                keep_firing_for="5m",
                severity="critical",
                summary="""
                    vLLM {{ $labels.instance }} ({{ $labels.model_name }}) is preempting requests:
                    its KV cache cannot hold the sequences it admitted.
                """,
                description="""
                    vLLM {{ $labels.instance }} serving {{ $labels.model_name }} preempted
                    {{ $value | printf "%.2f" }} requests per second over the last 2 minutes
                    ({{ with printf "headroom:vllm_preemptions:rate1m{job=%q,instance=%q,model_name=%q}" $labels.job $labels.instance $labels.model_name | query }}{{ . | first | value | printf "%.2f" }}{{ end }}/s and
                    {{ with printf "headroom:vllm_preemptions_per_finished_request:ratio_rate1m{job=%q,instance=%q,model_name=%q}" $labels.job $labels.instance $labels.model_name | query }}{{ . | first | value | printf "%.2f" }}{{ end }}
                    per finished request over the last minute,
                    {{ with printf "headroom:vllm_preemptions:rate5m{job=%q,instance=%q,model_name=%q}" $labels.job $labels.instance $labels.model_name | query }}{{ . | first | value | printf "%.2f" }}{{ end }}/s and
                    {{ with printf "headroom:vllm_preemptions_per_finished_request:ratio_rate5m{job=%q,instance=%q,model_name=%q}" $labels.job $labels.instance $labels.model_name | query }}{{ . | first | value | printf "%.2f" }}{{ end }}
                    over 5 minutes; it pages at
                    {{ with printf "headroom:threshold:preemptions_per_second_spike{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }}/s over a minute, or
                    {{ with printf "headroom:threshold:preemptions_per_second{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }}/s sustained, with at least
                    {{ with printf "headroom:threshold:preemptions_per_finished_request{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }}
                    per request). Evidence: KV cache
                    {{ with printf "max(headroom:vllm_kv_usage:avg5m{job=%q,instance=%q,model_name=%q})" $labels.job $labels.instance $labels.model_name | query }}{{ . | first | value | humanizePercentage }}
                    full on average over 5 minutes{{ else }}usage not scraped{{ end }},
                    {{ with printf "sum(vllm:num_requests_waiting{job=%q,instance=%q,model_name=%q})" $labels.job $labels.instance $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}
                    requests waiting{{ else }}queue not scraped{{ end }}. Every preempted request loses its KV blocks and is recomputed:
                    latency and GPU time go up for everyone.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomKvCacheSaturated",
                comment="keep_firing_for: as the preemption page (it holds the model's page group open too).",
                expr="""
                    headroom:vllm_kv_usage:avg5m{<recorded>} >= scalar(headroom:threshold:kv_saturation_ratio{<recorded>})
                    and vllm:num_requests_waiting{<scraped>} > 0
                    and headroom:vllm_requests_waiting:deriv5m{<recorded>} > 0
                """,
                for_="5m",
                keep_firing_for="5m",
                severity="critical",
                summary="""
                    vLLM {{ $labels.instance }} ({{ $labels.model_name }}) has a full KV cache and a
                    growing queue.
                """,
                description="""
                    The KV cache of vLLM {{ $labels.instance }}{{ with $labels.engine }} engine
                    {{ . }}{{ end }} ({{ $labels.model_name }}) was {{ $value | humanizePercentage }} full
                    on average over
                    5 minutes (threshold
                    {{ with printf "headroom:threshold:kv_saturation_ratio{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }})
                    while
                    {{ with printf "vllm:num_requests_waiting{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    requests wait and the queue keeps growing: arrivals exceed what the cache can run,
                    so queueing time grows without bound.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomKvCacheExhaustionPredicted",
                expr="""
                    headroom_kv_usage_ratio{<scraped>} >= scalar(headroom:threshold:kv_exhaustion_min_usage_ratio{<recorded>})
                    and predict_linear(
                          headroom_kv_used_tokens{<scraped>}[30m],
                          scalar(headroom:threshold:kv_exhaustion_horizon_seconds{<recorded>})
                        )
                      >= headroom_kv_usable_tokens{<scraped>}
                """,
                for_="15m",
                severity="warning",
                summary="""
                    vLLM {{ $labels.instance }} ({{ $labels.model_name }}) will run out of KV cache at
                    the current trend.
                """,
                description="""
                    The KV cache of vLLM {{ $labels.instance }} engine {{ $labels.engine }}
                    ({{ $labels.model_name }}) is {{ $value | humanizePercentage }} full, and the trend of
                    tokens in use over the last 30 minutes reaches its
                    {{ with printf "headroom_kv_usable_tokens{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    usable tokens within
                    {{ with printf "headroom:threshold:kv_exhaustion_horizon_seconds{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizeDuration }}{{ end }}.
                    After that, vLLM preempts and queues.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomLow",
                comment="""
                    Headroom under every limit of vLLM's scheduler (free KV cache counting no block shared,
                    free max_num_seqs slots), the conservative figure: shared prefixes vanish when the traffic
                    mix changes, so the effective figure (headroom_p95_effective_available_sequences) is only
                    shown beside it. A sleeping or paused engine has a ceiling of 0 on purpose: not a ticket.
                """,
                expr="""
                    headroom_p95_available_sequences{<scraped>}
                    and (
                      headroom_p95_available_sequences{<scraped>} < scalar(headroom:threshold:headroom_min_sequences{<recorded>})
                      or headroom_p95_available_ratio{<scraped>} < scalar(headroom:threshold:headroom_min_ratio{<recorded>})
                    )
                    and headroom_requests_running{<scraped>} > 0
                    unless headroom_engine_asleep{<scraped>} == 1
                """,
                for_="15m",
                severity="warning",
                summary="""
                    vLLM {{ $labels.instance }} ({{ $labels.model_name }}) is near its real-traffic
                    ceiling.
                """,
                description="""
                    vLLM {{ $labels.instance }} engine {{ $labels.engine }} ({{ $labels.model_name }})
                    would start only {{ $value | printf "%.0f" }} more sequences of the p95 context length
                    ({{ with printf "headroom_context_length_p95_tokens{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    tokens) under every limit of its scheduler, counting no prefix block shared, out of a
                    ceiling of
                    {{ with printf "headroom_p95_ceiling_sequences{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    (thresholds: fewer than
                    {{ with printf "headroom:threshold:headroom_min_sequences{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }}
                    sequences or
                    {{ with printf "headroom:threshold:headroom_min_ratio{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }}
                    of the ceiling). The limit that stops the next one is
                    {{ with printf "headroom_p95_available_limited_by{job=%q,instance=%q,engine=%q,model_name=%q} == 1" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | label "limit" }}{{ else }}unknown{{ end }}{{ with printf "headroom_p95_effective_available_sequences{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }};
                    with the prefix sharing of today's traffic
                    {{ . | first | value | printf "%.0f" }} more would fit{{ end }}.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomMaxNumSeqsBinding",
                comment="""
                    Requests wait although the KV cache would hold more p95 sequences: the scheduler's
                    running limit (--max-num-seqs), not memory, holds them back. Running sequences exactly at
                    the learnt limit prove the limit real (vLLM never runs more): a limit learnt too low (a
                    --config file the sidecar cannot read) stays quiet instead of blaming the wrong knob.
                """,
                expr="""
                    headroom_p95_kv_available_sequences{<scraped>} > 0
                    and ignoring (limit) headroom_p95_available_limited_by{<scraped>,limit="max_num_seqs"} == 1
                    and headroom_sequences_running{<scraped>} == max without (origin) (headroom_max_num_seqs{<scraped>})
                    and (
                      sum without (reason) (headroom_requests_waiting_by_reason{<scraped>,reason="capacity"})
                      or headroom_requests_waiting{<scraped>}
                    ) > 0
                """,
                for_="15m",
                severity="warning",
                summary="""
                    vLLM {{ $labels.instance }} ({{ $labels.model_name }}) queues requests at its
                    --max-num-seqs limit while its KV cache has room.
                """,
                description="""
                    vLLM {{ $labels.instance }} engine {{ $labels.engine }} ({{ $labels.model_name }})
                    runs
                    {{ with printf "headroom_max_num_seqs{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}
                    sequences, its max_num_seqs (origin: {{ . | first | label "origin" }}){{ end }},
                    while
                    {{ with printf "headroom_requests_waiting{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    requests wait, and its free KV cache still holds {{ $value | printf "%.0f" }} more
                    sequences of the p95 context length, counting no block shared (the whole pool holds
                    {{ with printf "headroom_p95_kv_ceiling_sequences{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}).
                    The scheduler's limit, not memory, makes them wait: raise --max-num-seqs towards
                    the KV cache's figure.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomAdmissionRejections",
                comment="""
                    vLLM's API server refuses requests with 503 when its queue is at --max-num-queued-reqs or
                    --max-num-queued-tokens (counted from vLLM 0.32): clients see errors. A refusal in every
                    rate window (60 s by default) for the whole `for` is sustained shedding, not a blip. One
                    alert per server, on the total; the description names the cap(s) that refused now (the
                    rates by reason, each of vLLM's reasons named after its flag's setting).
                """,
                expr="headroom_admission_rejections_per_second{<scraped>} > 0",
                for_="15m",
                severity="warning",
                summary="vLLM behind {{ $labels.instance }} refuses requests at its queue limit.",
                description="""
                    The vLLM that vllm-headroom {{ $labels.instance }} (job {{ $labels.job }}) watches
                    keeps refusing requests with HTTP 503 because its queue is at an admission cap:
                    {{ $value | printf "%.2f" }} per second now, and some in every rate window since this
                    alert became pending. Refused by
                    {{ range $i, $s := printf "headroom_admission_rejections_by_reason_per_second{job=%q,instance=%q} > 0" $labels.job $labels.instance | query | sortByLabel "reason" }}{{ if $i }}, {{ end }}{{ $s.Labels.reason }} ({{ $s.Value | printf "%.2f" }} per second{{ if match "^max_num_queued_(reqs|tokens)$" $s.Labels.reason }}, flag --{{ reReplaceAll "_" "-" $s.Labels.reason }}{{ end }}){{ else }}a cap this sidecar does not name (--max-num-queued-reqs or --max-num-queued-tokens){{ end }}.
                    Clients see errors: arrivals exceed what the running batch, at its ceiling, drains,
                    and the queue in front of it is full.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomFleetLow",
                expr="""
                    headroom:model_p95_available_sequences:sum{<recorded>}
                    and (
                      headroom:model_p95_available_sequences:sum{<recorded>}
                        < scalar(headroom:threshold:fleet_min_sequences{<recorded>})
                      or headroom:model_p95_available:ratio{<recorded>} < scalar(headroom:threshold:fleet_min_ratio{<recorded>})
                    )
                    and headroom:model_requests_running:sum{<recorded>} > 0
                """,
                for_="15m",
                severity="warning",
                summary="""
                    The fleet serving {{ $labels.model_name }} is near its real-traffic ceiling: scale
                    out.
                """,
                description="""
                    Across its
                    {{ with printf "headroom:model_instances:count{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    instance(s), {{ $labels.model_name }}{{ if $labels.namespace }} in namespace
                    {{ $labels.namespace }}{{ end }} has room for {{ $value | printf "%.0f" }} more
                    sequences of its p95 context length, out of a ceiling of
                    {{ with printf "headroom:model_p95_ceiling_sequences:sum{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    (thresholds: fewer than
                    {{ with printf "headroom:threshold:fleet_min_sequences{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }}
                    sequences or
                    {{ with printf "headroom:threshold:fleet_min_ratio{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }}
                    of the ceiling).
                """,
                dashboard_url="/d/vllm-headroom-fleet?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomContextGrowth",
                expr="""
                    avg_over_time(headroom:model_context_length_p95_tokens:max{<recorded>}[1h])
                      / avg_over_time(headroom:model_context_length_p95_tokens:max{<recorded>}[1h] offset 1d)
                    > scalar(headroom:threshold:context_growth_factor{<recorded>})
                """,
                for_="30m",
                severity="warning",
                summary="""
                    Requests to {{ $labels.model_name }} got much longer than a day ago: rerun the
                    sizing.
                """,
                description="""
                    The p95 context length (prompt + output) of {{ $labels.model_name }}{{ if $labels.namespace }}
                    in namespace {{ $labels.namespace }}{{ end }}, averaged over the last hour, is
                    {{ $value | printf "%.2f" }} times what it was at this time yesterday (threshold
                    {{ with printf "headroom:threshold:context_growth_factor{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }}x);
                    it is now
                    {{ with printf "headroom:model_context_length_p95_tokens:max{namespace=%q,model_name=%q,headroom_release=%q}" $labels.namespace $labels.model_name $labels.headroom_release | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    tokens. Every sequence now holds proportionally more KV blocks, so the concurrency
                    ceiling of every instance at p95 fell by about the same factor.
                """,
                dashboard_url="/d/vllm-headroom-fleet?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomCapacityDrift",
                expr="""
                    headroom_kv_capacity_prediction_error_ratio{<scraped>}
                      > scalar(headroom:threshold:capacity_drift_ratio{<recorded>})
                    or headroom_kv_capacity_prediction_error_ratio{<scraped>}
                      < -scalar(headroom:threshold:capacity_drift_ratio{<recorded>})
                """,
                for_="15m",
                severity="warning",
                summary="""
                    vLLM {{ $labels.instance }} ({{ $labels.model_name }}) allocated a KV cache that the
                    sizing model does not explain.
                """,
                description="""
                    The sizing model predicts a KV cache of
                    {{ with printf "headroom_kv_capacity_predicted_tokens{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}
                    tokens for vLLM {{ $labels.instance }} engine {{ $labels.engine }}
                    ({{ $labels.model_name }}), vLLM allocated
                    {{ with printf "headroom_kv_capacity_tokens{job=%q,instance=%q,engine=%q,model_name=%q}" $labels.job $labels.instance $labels.engine $labels.model_name | query }}{{ . | first | value | printf "%.0f" }}{{ end }}:
                    an error of {{ $value | humanizePercentage }} (tolerance
                    {{ with printf "headroom:threshold:capacity_drift_ratio{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizePercentage }}{{ end }}).
                    {{ if gt $value 0.0 }}vLLM got less memory than predicted: another process, a lower
                    utilization, or a larger model or overhead took it.{{ else }}vLLM got more memory than
                    predicted: a higher utilization, an explicit --kv-cache-memory-bytes, or a smaller
                    model.{{ end }}
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
        ),
    ),
    Group(
        "vllm-headroom-progress",
        comment="""
            Progress: an engine that holds requests and makes none. No gauge moves when vLLM's engine
            stops (a scheduler deadlock, a hung collective, a stopped process) while its API server
            still answers /health and /metrics: the gauges freeze at their last values. Counters tell:
            every engine step that does work generates tokens, finishes a prefill or finishes (or
            aborts) a request.
        """,
        rules=(
            Alert(
                "VllmHeadroomEngineStalled",
                comment="""
                    Per engine: requests running or waiting all along the last 2 minutes, and in them no
                    token generated, no prompt token processed and no request finished, whatever its
                    finished_reason. Quiet when idle (no request; a request that just arrived at an idle
                    engine has not waited 2 minutes), asleep or paused at any time in the 2 minutes (engine_sleep_state: a
                    woken engine has not had its window yet), loading or restarted (the counters must have
                    existed 2 minutes ago: a new series has no 2-minute history), scaled to zero (no
                    series), or making any progress however slow. The 2-minute window holds two samples at
                    a 1-minute scrape interval; at the chart's 30 s it pages at most 2.5 minutes after the
                    stall (tests/alerts/progress.yml), so for 0s: the window is the wait.
                """,
                expr="""
                    min_over_time(vllm:num_requests_running{<scraped>}[2m])
                      + min_over_time(vllm:num_requests_waiting{<scraped>}[2m]) > 0
                    and on (job, instance, engine) increase(vllm:generation_tokens_total{<scraped>}[2m]) == 0
                    and on (job, instance, engine) increase(vllm:prompt_tokens_total{<scraped>}[2m]) == 0
                    and on (job, instance, engine)
                      sum without (finished_reason) (increase(vllm:request_success_total{<scraped>}[2m])) == 0
                    and on (job, instance, engine) vllm:generation_tokens_total{<scraped>} offset 2m
                    unless on (job, instance, engine)
                      min_over_time(vllm:engine_sleep_state{<scraped>,sleep_state="awake"}[2m]) < 1
                """,
                for_="0s",
                severity="critical",
                summary="""
                    vLLM {{ $labels.instance }} ({{ $labels.model_name }}) holds requests and makes no
                    progress: its engine is stalled.
                """,
                description="""
                    vLLM {{ $labels.instance }}{{ with $labels.engine }} engine {{ . }}{{ end }} serving
                    {{ $labels.model_name }} has {{ $value | printf "%.0f" }} requests running or waiting,
                    and for 2 minutes it generated no token, processed no prompt token and finished no
                    request, although Prometheus still scrapes its /metrics: its API server answers, its
                    engine does not work. Every request to it hangs until its client times out, and the
                    balancer keeps sending it more (its /health still answers 200).
                """,
                dashboard_url="/d/vllm-headroom-instance?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
        ),
    ),
    Group(
        "vllm-headroom-gpu",
        comment="GPU memory (NVML or dcgm-exporter; fleet mode: dcgm-exporter only, gpu_source=dcgm).",
        rules=(
            Alert(
                "VllmHeadroomGpuForeignMemory",
                comment="""
                    Foreign memory when the sidecar could match NVML's processes to vLLM's PIDs; otherwise
                    (always with dcgm-exporter, which lists no processes) the memory used beyond what vLLM claims (total x utilization), with its own threshold
                    because older vLLM (< 0.21) legitimately spends its CUDA graphs out of that slack.
                """,
                expr="""
                    label_replace(
                      headroom_gpu_memory_foreign_bytes{<scraped>}
                        > scalar(headroom:threshold:gpu_foreign_memory_bytes{<recorded>}),
                      "memory", "foreign", "", ""
                    )
                    or label_replace(
                      headroom_gpu_memory_unexplained_bytes{<scraped>}
                        > scalar(headroom:threshold:gpu_unexplained_memory_bytes{<recorded>})
                      unless headroom_gpu_memory_foreign_bytes{<scraped>},
                      "memory", "unexplained", "", ""
                    )
                """,
                for_="5m",
                severity="critical",
                summary="""
                    Another process holds memory on GPU {{ $labels.gpu }} of {{ $labels.instance }}:
                    vLLM may run out of memory.
                """,
                description="""
                    {{ if eq $labels.memory "foreign" }}Processes other than vLLM hold
                    {{ $value | humanize1024 }}B on GPU {{ $labels.gpu }} ({{ $labels.uuid }}) of
                    {{ $labels.instance }} (threshold
                    {{ with printf "headroom:threshold:gpu_foreign_memory_bytes{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanize1024 }}{{ end }}B).{{ else }}GPU
                    {{ $labels.gpu }} ({{ $labels.uuid }}) of {{ $labels.instance }} has
                    {{ $value | humanize1024 }}B in use beyond what vLLM claims (total x
                    gpu_memory_utilization; threshold
                    {{ with printf "headroom:threshold:gpu_unexplained_memory_bytes{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanize1024 }}{{ end }}B);
                    which processes hold it is not known (NVML's could not be matched to vLLM's, or the
                    source is dcgm-exporter, which lists none), so this is another process or vLLM
                    outgrowing its budget.{{ end }}
                    vLLM sized its KV cache assuming the GPU was its own: any allocation it makes now can
                    fail with CUDA out of memory.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomGpuFreeMemoryLow",
                expr="headroom_gpu_memory_free_bytes{<scraped>} < scalar(headroom:threshold:gpu_free_memory_min_bytes{<recorded>})",
                for_="10m",
                severity="warning",
                summary="GPU {{ $labels.gpu }} of {{ $labels.instance }} is almost out of free memory.",
                description="""
                    GPU {{ $labels.gpu }} ({{ $labels.uuid }}) of {{ $labels.instance }} has
                    {{ $value | humanize1024 }}B free (floor
                    {{ with printf "headroom:threshold:gpu_free_memory_min_bytes{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanize1024 }}{{ end }}B).
                    vLLM preallocates its budget, but PyTorch workspaces, NCCL and CUDA graphs still
                    allocate outside it: the next one may fail with CUDA out of memory.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
        ),
    ),
    Group(
        "vllm-headroom-availability",
        comment="""
            Availability of vLLM and of the exporter. `for` rides out a rolling restart; a pod that is
            still loading its model is inside its startup budget and not down.
        """,
        rules=(
            Alert(
                "VllmHeadroomVllmUnreachable",
                comment="""
                    A sidecar whose vLLM has not answered once since the sidecar started, less than
                    vllm_startup_seconds ago (the chart sets it from vLLM's startup probe: periodSeconds x
                    failureThreshold), is waiting for a model to load, not failing. After the first answer,
                    any outage counts from its start. A vLLM that crash-loops answers between its crashes,
                    and each answer would start the outage's `for` again: vllm_restarts_per_hour restarts
                    seen within an hour (new start times) page as well, as one incident while they go on.
                """,
                expr="""
                    headroom_target_up{<scraped>} == 0
                    unless on (job, instance) (
                      time() - process_start_time_seconds{<scraped>}
                        < scalar(headroom:threshold:vllm_startup_seconds{<recorded>})
                      unless on (job, instance)
                        headroom_source_last_success_timestamp_seconds{<scraped>,source="vllm_metrics"}
                    )
                    or on (job, instance)
                      increase(headroom_target_restarts_total{<scraped>}[1h])
                        >= scalar(headroom:threshold:vllm_restarts_per_hour{<recorded>})
                """,
                for_="15m",
                severity="critical",
                summary="The vllm-headroom exporter {{ $labels.instance }} cannot read its vLLM's /metrics, or its vLLM keeps restarting.",
                description="""
                    vllm-headroom {{ $labels.instance }} (job {{ $labels.job }}) keeps failing to poll
                    vLLM's /metrics, or saw it restart at least
                    {{ with printf "headroom:threshold:vllm_restarts_per_hour{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value }}{{ end }}
                    times within an hour: vLLM is down, crash looping, past its startup budget of
                    {{ with printf "headroom:threshold:vllm_startup_seconds{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizeDuration }}{{ end }}
                    without answering, or refusing the exporter. Its capacity gauges are withdrawn while
                    vLLM does not answer.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomTargetDown",
                expr="""
                    up{<scraped>} == 0
                    and on (job) max_over_time(headroom:exporter_jobs:present{<recorded>}[1d])
                """,
                for_="15m",
                severity="warning",
                summary="Prometheus cannot scrape {{ $labels.instance }} of job {{ $labels.job }}.",
                description="""
                    Prometheus keeps failing to scrape {{ $labels.instance }} in job {{ $labels.job }},
                    a job that serves vllm-headroom metrics: the exporter is down, crash looping or
                    unreachable, and no capacity alert can fire for it.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomExporterAbsent",
                comment="""
                    vLLM pods that Prometheus scrapes but no exporter watches (the sidecar is missing from
                    the pod, or its endpoint is not scraped). Per pod where Kubernetes labels one. Nothing
                    scraped at all (scaled to zero, or nothing deployed) is not an outage: quiet.
                """,
                expr="""
                    group by (cluster, namespace, pod, model_name) (vllm:num_requests_running{<scraped>})
                    unless on (cluster, namespace, pod)
                      group by (cluster, namespace, pod) (headroom_target_up{<scraped>})
                """,
                for_="15m",
                severity="warning",
                summary="""
                    vLLM {{ with $labels.pod }}pod {{ . }}{{ else }}({{ $labels.model_name }}){{ end }}{{ with $labels.namespace }}
                    in namespace {{ . }}{{ end }} is scraped but no vllm-headroom exporter watches it.
                """,
                description="""
                    Prometheus scrapes vLLM{{ with $labels.pod }} pod {{ . }}{{ end }} serving
                    {{ $labels.model_name }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }}, but
                    no vllm-headroom exporter reports on it (no headroom_target_up series there): the
                    sidecar is not in the pod, or its endpoint is not scraped, so none of the capacity
                    alerts can fire for it.
                """,
                dashboard_url="/d/vllm-headroom-fleet?var-model={{ $labels.model_name | urlquery }}{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}",
            ),
            Alert(
                "VllmHeadroomDataStale",
                expr="""
                    time() - headroom_source_last_success_timestamp_seconds{<scraped>,source="vllm_metrics"}
                      > scalar(headroom:threshold:stale_seconds{<recorded>})
                    unless on (job, instance) headroom_target_up{<scraped>} == 0
                """,
                for_="10m",
                severity="warning",
                summary="vllm-headroom {{ $labels.instance }} serves stale vLLM figures.",
                description="""
                    The last successful read of vLLM's /metrics by vllm-headroom {{ $labels.instance }}
                    (job {{ $labels.job }}) is {{ $value | humanizeDuration }} old (threshold
                    {{ with printf "headroom:threshold:stale_seconds{headroom_release=%q}" $labels.headroom_release | query }}{{ . | first | value | humanizeDuration }}{{ end }})
                    although its last poll did not fail: the poller is stuck, or the exporter's clock is
                    wrong.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomNvmlUnavailable",
                comment="""
                    Either GPU source: the name is older than gpu_source=dcgm and is kept, as silences
                    and routes match it.
                """,
                expr='headroom_source_up{<scraped>,source=~"nvml|dcgm"} == 0',
                for_="15m",
                severity="warning",
                summary="""
                    vllm-headroom {{ $labels.instance }} cannot read GPU memory through
                    {{ if eq $labels.source "dcgm" }}dcgm-exporter{{ else }}NVML{{ end }}.
                """,
                description="""
                    vllm-headroom {{ $labels.instance }} (job {{ $labels.job }}) keeps failing to read
                    {{ if eq $labels.source "dcgm" }}dcgm-exporter{{ else }}NVML{{ end }}: the GPU memory
                    gauges are missing, so the GPU memory alerts cannot fire and the capacity prediction
                    has no GPU size.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomVllmNotScraped",
                comment="""
                    The preemption and saturation alerts read vLLM's own /metrics. If Prometheus scrapes the
                    exporters but no vLLM, those alerts can never fire: say so instead of staying silent.
                """,
                expr="""
                    group by (cluster, namespace) (headroom_target_up{<scraped>} == 1)
                    unless on (cluster, namespace) group by (cluster, namespace) (vllm:num_requests_running{<scraped>})
                """,
                for_="30m",
                severity="warning",
                summary="""
                    Prometheus scrapes vllm-headroom but not vLLM's own /metrics{{ if $labels.namespace }}
                    in namespace {{ $labels.namespace }}{{ end }}.
                """,
                description="""
                    vllm-headroom exporters are up{{ if $labels.namespace }} in namespace
                    {{ $labels.namespace }}{{ end }}, but Prometheus has no vllm: series there: the
                    preemption and KV saturation alerts read vLLM's /metrics directly and cannot fire.
                """,
                dashboard_url="/d/vllm-headroom-fleet",
            ),
            Alert(
                "VllmHeadroomPredictionUnavailable",
                expr='headroom_prediction_state{<scraped>,state!~"ok|waiting_for_target"} == 1',
                for_="30m",
                severity="info",
                summary="""
                    vllm-headroom {{ $labels.instance }} cannot predict its vLLM's KV capacity
                    ({{ $labels.state }}).
                """,
                description="""
                    vllm-headroom {{ $labels.instance }} (job {{ $labels.job }}) has no capacity
                    prediction: {{ $labels.state }}. Actual capacity and headroom are still exported,
                    but VllmHeadroomCapacityDrift cannot fire for it.
                """,
                dashboard_url="/d/vllm-headroom-instance?var-job={{ $labels.job | urlquery }}&var-instance={{ $labels.instance | urlquery }}",
            ),
            Alert(
                "VllmHeadroomThresholdMissing",
                comment="""
                    A threshold rule that is missing (deleted, renamed, a broken override), or recorded twice
                    (a second rule file writing the same name), makes scalar() return NaN, and every
                    comparison against NaN is false: the alerts reading it would never fire. The same for a
                    slo_ttft_seconds that is no bucket boundary of vLLM's TTFT histogram: no bucket matches.
                    The SLO objectives are unset by default (absent is their off switch): only two of them,
                    or one outside (0, 1) (99.9 for 99.9%: a negative budget), fire.
                """,
                expr="""
                    label_replace(absent(headroom:threshold:preemptions_per_second{<recorded>}) or count(headroom:threshold:preemptions_per_second{<recorded>}) > 1, "threshold", "preemptions_per_second", "", "")
                    or label_replace(absent(headroom:threshold:preemptions_per_second_spike{<recorded>}) or count(headroom:threshold:preemptions_per_second_spike{<recorded>}) > 1, "threshold", "preemptions_per_second_spike", "", "")
                    or label_replace(absent(headroom:threshold:preemptions_per_finished_request{<recorded>}) or count(headroom:threshold:preemptions_per_finished_request{<recorded>}) > 1, "threshold", "preemptions_per_finished_request", "", "")
                    or label_replace(absent(headroom:threshold:kv_saturation_ratio{<recorded>}) or count(headroom:threshold:kv_saturation_ratio{<recorded>}) > 1, "threshold", "kv_saturation_ratio", "", "")
                    or label_replace(absent(headroom:threshold:kv_exhaustion_horizon_seconds{<recorded>}) or count(headroom:threshold:kv_exhaustion_horizon_seconds{<recorded>}) > 1, "threshold", "kv_exhaustion_horizon_seconds", "", "")
                    or label_replace(absent(headroom:threshold:kv_exhaustion_min_usage_ratio{<recorded>}) or count(headroom:threshold:kv_exhaustion_min_usage_ratio{<recorded>}) > 1, "threshold", "kv_exhaustion_min_usage_ratio", "", "")
                    or label_replace(absent(headroom:threshold:headroom_min_sequences{<recorded>}) or count(headroom:threshold:headroom_min_sequences{<recorded>}) > 1, "threshold", "headroom_min_sequences", "", "")
                    or label_replace(absent(headroom:threshold:headroom_min_ratio{<recorded>}) or count(headroom:threshold:headroom_min_ratio{<recorded>}) > 1, "threshold", "headroom_min_ratio", "", "")
                    or label_replace(absent(headroom:threshold:fleet_min_sequences{<recorded>}) or count(headroom:threshold:fleet_min_sequences{<recorded>}) > 1, "threshold", "fleet_min_sequences", "", "")
                    or label_replace(absent(headroom:threshold:fleet_min_ratio{<recorded>}) or count(headroom:threshold:fleet_min_ratio{<recorded>}) > 1, "threshold", "fleet_min_ratio", "", "")
                    or label_replace(absent(headroom:threshold:context_growth_factor{<recorded>}) or count(headroom:threshold:context_growth_factor{<recorded>}) > 1, "threshold", "context_growth_factor", "", "")
                    or label_replace(absent(headroom:threshold:context_growth_min_requests{<recorded>}) or count(headroom:threshold:context_growth_min_requests{<recorded>}) > 1, "threshold", "context_growth_min_requests", "", "")
                    or label_replace(absent(headroom:threshold:capacity_drift_ratio{<recorded>}) or count(headroom:threshold:capacity_drift_ratio{<recorded>}) > 1, "threshold", "capacity_drift_ratio", "", "")
                    or label_replace(absent(headroom:threshold:gpu_foreign_memory_bytes{<recorded>}) or count(headroom:threshold:gpu_foreign_memory_bytes{<recorded>}) > 1, "threshold", "gpu_foreign_memory_bytes", "", "")
                    or label_replace(absent(headroom:threshold:gpu_unexplained_memory_bytes{<recorded>}) or count(headroom:threshold:gpu_unexplained_memory_bytes{<recorded>}) > 1, "threshold", "gpu_unexplained_memory_bytes", "", "")
                    or label_replace(absent(headroom:threshold:gpu_free_memory_min_bytes{<recorded>}) or count(headroom:threshold:gpu_free_memory_min_bytes{<recorded>}) > 1, "threshold", "gpu_free_memory_min_bytes", "", "")
                    or label_replace(absent(headroom:threshold:stale_seconds{<recorded>}) or count(headroom:threshold:stale_seconds{<recorded>}) > 1, "threshold", "stale_seconds", "", "")
                    or label_replace(absent(headroom:threshold:vllm_startup_seconds{<recorded>}) or count(headroom:threshold:vllm_startup_seconds{<recorded>}) > 1, "threshold", "vllm_startup_seconds", "", "")
                    or label_replace(absent(headroom:threshold:vllm_restarts_per_hour{<recorded>}) or count(headroom:threshold:vllm_restarts_per_hour{<recorded>}) > 1, "threshold", "vllm_restarts_per_hour", "", "")
                    or label_replace(absent(headroom:threshold:slo_ttft_seconds{<recorded>}) or count(headroom:threshold:slo_ttft_seconds{<recorded>}) > 1, "threshold", "slo_ttft_seconds", "", "")
                    or label_replace(count(headroom:threshold:slo_ttft_objective{<recorded>}) > 1 or count(headroom:threshold:slo_ttft_objective{<recorded>} <= 0 or headroom:threshold:slo_ttft_objective{<recorded>} >= 1), "threshold", "slo_ttft_objective", "", "")
                    or label_replace(count(headroom:threshold:slo_error_objective{<recorded>}) > 1 or count(headroom:threshold:slo_error_objective{<recorded>} <= 0 or headroom:threshold:slo_error_objective{<recorded>} >= 1), "threshold", "slo_error_objective", "", "")
                    or label_replace(absent(headroom:threshold:slo_burn_rate_fast{<recorded>}) or count(headroom:threshold:slo_burn_rate_fast{<recorded>}) > 1, "threshold", "slo_burn_rate_fast", "", "")
                    or label_replace(absent(headroom:threshold:slo_burn_rate_slow{<recorded>}) or count(headroom:threshold:slo_burn_rate_slow{<recorded>}) > 1, "threshold", "slo_burn_rate_slow", "", "")
                    or label_replace(absent(headroom:threshold:slo_ticket_burn_rate_fast{<recorded>}) or count(headroom:threshold:slo_ticket_burn_rate_fast{<recorded>}) > 1, "threshold", "slo_ticket_burn_rate_fast", "", "")
                    or label_replace(absent(headroom:threshold:slo_ticket_burn_rate_slow{<recorded>}) or count(headroom:threshold:slo_ticket_burn_rate_slow{<recorded>}) > 1, "threshold", "slo_ticket_burn_rate_slow", "", "")
                    or label_replace(absent(headroom:threshold:slo_min_requests_per_second{<recorded>}) or count(headroom:threshold:slo_min_requests_per_second{<recorded>}) > 1, "threshold", "slo_min_requests_per_second", "", "")
                    or label_replace(
                      group(vllm:time_to_first_token_seconds_bucket{<scraped>})
                      unless on () group(
                        vllm:time_to_first_token_seconds_bucket{<scraped>}
                        and on (le) label_replace(
                          count_values("le", headroom:threshold:slo_ttft_seconds{<recorded>}), "le", "$1.0", "le", "^([0-9]+)$"
                        )
                      ),
                      "threshold", "slo_ttft_seconds", "", ""
                    )
                """,
                for_="10m",
                severity="warning",
                summary="""
                    The vllm-headroom threshold headroom:threshold:{{ $labels.threshold }}{{ if eq $labels.threshold "slo_ttft_objective" "slo_error_objective" }}
                    is recorded twice or outside (0, 1){{ else }} is missing, recorded
                    twice{{ if eq $labels.threshold "slo_ttft_seconds" }}, or no bucket boundary of vLLM's
                    TTFT histogram{{ end }}{{ end }}.
                """,
                description="""
                    The recording rule headroom:threshold:{{ $labels.threshold }}{{ if eq $labels.threshold "slo_ttft_objective" "slo_error_objective" }}
                    has more than one series, or a value outside (0, 1) (an objective is a ratio: 0.999,
                    not 99.9){{ else }} has no series, or more than one{{ if eq $labels.threshold "slo_ttft_seconds" }},
                    or its value is not the `le` of any bucket of
                    vllm:time_to_first_token_seconds{{ end }}{{ end }}: every vllm-headroom alert that
                    compares against it is silently disabled. Keep exactly one rule recording it, as
                    vector(VALUE), in the rule file (or the Helm values that override it).
                """,
                dashboard_url="/d/vllm-headroom-fleet",
                release_namespace=True,
            ),
        ),
    ),
)


#: The header of the rendered file (alerts/generate.py adds a line about where it comes from).
HEADER = """\
vllm-headroom: Prometheus recording and alerting rules. The Helm chart renders its PrometheusRule
from these rules and applies its values to them structurally, by rule name:
  - a threshold is the `expr: vector(<default>)` of a `headroom:threshold:<name>` rule below;
    override it by replacing that expr with `vector(<value>)`;
  - `for`, `labels.severity` (and `enabled`) are set per alert by its `alert:` name;
  - per release (prometheusRule.scope: release, the chart's default) every series selector of
    every expression gets the release's scope: the scrape jobs of that release for what
    Prometheus scrapes, and the label headroom_release="<namespace>/<release>" for what these
    rules record (the chart adds that label to every recorded series and alert). Annotation
    queries of recorded series match headroom_release={{ $labels.headroom_release }}, which is
    empty here and so matches the unlabelled series of this file as it stands.
No alert expression holds a literal tunable: alerts read `scalar(headroom:threshold:<name>)`,
and VllmHeadroomThresholdMissing fires if any threshold rule is missing (a missing threshold
would otherwise turn every comparison against it into NaN and silently disable the alert).

Sources: per-engine gauges of the sidecar (`headroom_*`, labels `engine`, `model_name`), its GPU
gauges (`gpu`, `uuid`), its per-target gauges (health, queue-limit refusals), its process start
time, and, for preemption, saturation and the SLOs, vLLM's own /metrics scraped directly
(`vllm:*`, both the V0 and V1 names, and its API server's `http_requests_total`). Prometheus
adds `job` and `instance` (and `namespace`, `pod` in Kubernetes).
Thresholds, defaults and the reasons for them: docs/runbooks/README.md. Unit tests:
tests/alerts/*.yml (promtool), tests/test_alerts.py.
"""

_RULE = "  # " + "-" * 90


def fill(expr: str, marker: str, matchers: str) -> str:
    """``expr`` with ``matchers`` in place of ``marker``; with none, the marker (and ``{}``) gone.

    What templates/_rules.tpl does with Helm's plain ``replace``; the markers themselves as
    matchers leave the expression unchanged (the chart's copy).
    """
    if matchers:
        return expr.replace(marker, matchers)
    return expr.replace("{" + marker + "}", "").replace(marker + ",", "")


def _text(text: str) -> str:
    """A table text without the indentation and blank edges of its triple-quoted literal."""
    return textwrap.dedent(text).strip("\n")


def _comment(text: str, indent: int) -> list[str]:
    return [" " * indent + ("# " + line).rstrip() for line in _text(text).splitlines()]


def _scalar(key: str, text: str, indent: int, *, block: bool = False) -> list[str]:
    """``key: text`` as a plain scalar where YAML reads it back unchanged, else a folded block."""
    value = _text(text)
    pad = " " * indent
    plain = f"{key}: {value}"
    if not block and "\n" not in value and yaml.safe_load(plain) == {key: value}:
        return [pad + plain]
    return [f"{pad}{key}: >-", *(f"{pad}  {line}".rstrip() for line in value.splitlines())]


def _rule(rule: Record | Alert, scraped: str, recorded: str, namespace: str) -> list[str]:
    expr = fill(fill(_text(rule.expr), SCRAPED, scraped), RECORDED, recorded)
    if isinstance(rule, Record):
        return [f"      - record: {rule.record}", *_scalar("expr", expr, 8)]
    lines = [f"      - alert: {rule.alert}", *_scalar("expr", expr, 8), f"        for: {rule.for_}"]
    if rule.keep_firing_for:
        lines.append(f"        keep_firing_for: {rule.keep_firing_for}")
    labels = [f"          severity: {rule.severity}"]
    if rule.release_namespace and namespace:
        labels.append(f'          namespace: "{namespace}"')
    return [
        *lines,
        "        labels:",
        *labels,
        "        annotations:",
        *_scalar("summary", rule.summary, 10, block=True),
        *_scalar("description", rule.description, 10, block=True),
        f"          runbook_url: {RUNBOOKS}{rule.alert}.md",
        *_scalar("dashboard_url", rule.dashboard_url, 10),
    ]


def render(
    scraped: str = "", recorded: str = "", namespace: str = "", *, header: str = HEADER
) -> str:
    """The rule file with these matchers in place of the markers (none: unscoped; pure).

    ``namespace``: the value of the ``namespace`` label of alerts whose expression keeps none
    (none: no such label).
    """
    lines = _comment(header, 0)
    lines.append("groups:")
    for index, group in enumerate(GROUPS):
        lines += [*([""] if index else []), _RULE, *_comment(group.comment, 2)]
        lines.append(f"  - name: {group.name}")
        if group.interval:
            lines.append(f"    interval: {group.interval}")
        lines.append("    rules:")
        for position, rule in enumerate(group.rules):
            if position and (rule.comment or isinstance(rule, Alert)):
                lines.append("")
            lines += _comment(rule.comment, 6)
            lines += _rule(rule, scraped, recorded, namespace)
    return "\n".join(lines) + "\n"
