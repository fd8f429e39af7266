"""The Helm chart's alerting side: its PrometheusRule, the monitors' jobs, and routing links.

The chart embeds the rules of ``alerts/vllm-headroom.rules.yml`` (its copy marks each selector,
``alerts/rules.py``) and applies its values (``_rules.tpl``). These tests apply the same values to
the unscoped file in Python, scoping every selector with the PromQL lexer of ``tests/promql.py``
where the chart fills the markers, and compare (an oracle that never reads the markers); then
run what the chart renders under promtool, two releases side by side in one Prometheus: each
pod gets its own release's alerts, once, with its own thresholds and severity.

Helm is the pinned binary of ``scripts/e2e/install-helm.sh`` and promtool Debian's
(``scripts/e2e/install-prometheus.sh``): without them these tests fail when ``CI`` is set and
skip otherwise (the fixtures of tests/test_helm.py).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest
import yaml

from alerts.rules import GROUPS, Alert
from tests import paths
from tests.promql import metric_names, with_matchers
from tests.test_helm import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    RULES_FILE,
    RenderError,
    _helm_run,
    _quiet,
    ci,
    load_yaml,
    only,
    render,
    render_error,
    validate_manifest,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

THRESHOLD_GROUP = "vllm-headroom-thresholds"
THRESHOLD_PREFIX = "headroom:threshold:"
CHART_VALUES = CHART / "values.yaml"

pytestmark = pytest.mark.e2e


# --------------------------------------------------------------------------- the Python side


def _merged(base: Any, override: Any) -> Any:
    """Helm's merge of values: mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = _merged(base[key], value) if key in base else value
        return out
    return copy.deepcopy(override)


def chart_values(*files: Path, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The chart's values with ``files`` and ``extra`` merged over them, as Helm does."""
    values: dict[str, Any] = load_yaml(CHART_VALUES)
    for path in files:
        values = _merged(values, load_yaml(path))
    merged: dict[str, Any] = _merged(values, dict(extra or {}))
    return merged


def fullname(release: str, values: Mapping[str, Any]) -> str:
    """The chart's vllm-headroom.fullname."""
    if values.get("fullnameOverride"):
        return str(values["fullnameOverride"])[:63].rstrip("-")
    name = values.get("nameOverride") or "vllm-headroom"
    return (release if name in release else f"{release}-{name}")[:63].rstrip("-")


def jobs(release: str, namespace: str, values: Mapping[str, Any]) -> dict[str, str]:
    """The job label of each component, as the chart's monitors set it."""
    base = f"{namespace}/{fullname(release, values)}"
    return {"vllm": f"{base}-vllm", "exporter": f"{base}-exporter"}


def go_quote_meta(text: str) -> str:
    """Go's regexp.QuoteMeta (Helm's regexQuoteMeta): a backslash before each regex operator."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def default_selector(release: str, namespace: str, values: Mapping[str, Any]) -> str:
    """The matchers the chart scopes raw series with when prometheusRule.selector is empty.

    This release's jobs: the exporter's, and vLLM's (the chart's monitors', or with
    vllmMetrics.enabled false the existing scrape vllmMetrics.job names).
    """
    if values["vllmMetrics"]["enabled"]:
        pattern = f"{namespace}/{fullname(release, values)}-(vllm|exporter)".replace(".", "\\\\.")
    else:
        exporter = jobs(release, namespace, values)["exporter"]
        foreign = values["vllmMetrics"]["job"]
        pattern = f"{go_quote_meta(exporter)}|{go_quote_meta(foreign)}".replace("\\", "\\\\")
    if values["shape"] == "fleet":
        return f'job=~"{pattern}"'
    return f'namespace="{namespace}",job=~"{pattern}"'


#: Alerts whose expression keeps no target label: scoped, the chart labels them with the
#: release's namespace (AlertmanagerConfig routes only its own namespace's alerts).
RELEASE_NAMESPACED = frozenset(
    rule.alert
    for group in GROUPS
    for rule in group.rules
    if isinstance(rule, Alert) and rule.release_namespace
)


def expected_groups(
    rules: Mapping[str, Any], values: Mapping[str, Any], release: str, namespace: str
) -> list[dict[str, Any]]:
    """The rule groups the chart should render for these (fully merged) values."""
    v = values["prometheusRule"]
    scoped = v.get("scope", "release") == "release"
    selector = v.get("selector") or default_selector(release, namespace, values)
    release_label = f"{namespace}/{fullname(release, values)}"
    thresholds = dict(v.get("thresholds") or {})
    probe = values["vllm"]["startupProbe"]
    if values["shape"] == "vllm" and "vllm_startup_seconds" not in thresholds:
        budget = probe["periodSeconds"] * probe["failureThreshold"]
        thresholds["vllm_startup_seconds"] = budget + probe.get("initialDelaySeconds", 0)
    alert_labels = dict(v.get("alertLabels") or {})
    if scoped:
        alert_labels["headroom_release"] = release_label
    if values["shape"] == "vllm":
        alert_labels["model_name"] = values["vllm"]["servedModelName"] or values["vllm"]["model"]

    def scope(name: str) -> str:
        return f'headroom_release="{release_label}"' if name.startswith("headroom:") else selector

    groups = []
    for group in rules["groups"]:
        kept = []
        for source in group["rules"]:
            rule = copy.deepcopy(source)
            if scoped:
                rule["expr"] = with_matchers(rule["expr"], scope)
            if "alert" in rule:
                alert = _alert(rule, v, alert_labels)
                if alert is None:
                    continue
                rule = alert
                if scoped and rule["alert"] in RELEASE_NAMESPACED:
                    rule["labels"]["namespace"] = namespace
            else:
                name = rule["record"].removeprefix(THRESHOLD_PREFIX)
                if group["name"] == THRESHOLD_GROUP and name in thresholds:
                    rule["expr"] = f"vector({thresholds[name]})"
                if scoped:
                    rule["labels"] = {**rule.get("labels", {}), "headroom_release": release_label}
            kept.append(rule)
        groups.append({**group, "rules": kept})
    return groups


def _alert(
    rule: dict[str, Any], v: Mapping[str, Any], alert_labels: Mapping[str, str]
) -> dict[str, Any] | None:
    """An alert rule with its knobs, labels and links applied; None when it is disabled."""
    knobs = (v.get("alerts") or {}).get(rule["alert"], {})
    if not knobs.get("enabled", True):
        return None
    if "for" in knobs:
        rule["for"] = knobs["for"]
    if "keepFiringFor" in knobs:
        rule["keep_firing_for"] = knobs["keepFiringFor"]
    rule["labels"] = {**alert_labels, **rule.get("labels", {})}
    if "severity" in knobs:
        rule["labels"]["severity"] = knobs["severity"]
    annotations = rule["annotations"]
    if v.get("runbookUrl"):
        annotations["runbook_url"] = v["runbookUrl"].replace("{alertname}", rule["alert"])
    grafana = (v.get("grafanaUrl") or "").rstrip("/")
    if grafana and annotations["dashboard_url"].startswith("/"):
        annotations["dashboard_url"] = grafana + annotations["dashboard_url"]
    return rule


def comparable(groups: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Rule groups with each threshold's vector(N) as a number, as Go and Python differ."""
    result = copy.deepcopy(list(groups))
    for group in result:
        for rule in group["rules"]:
            found = re.fullmatch(r"vector\(([^)]*)\)", str(rule.get("expr", "")).strip())
            if group["name"] == THRESHOLD_GROUP and found:
                rule["expr"] = ("vector", float(found.group(1)))
    return result


def rule_names(kind: str) -> list[str]:
    """Alert names (kind "alert") or threshold names (kind "threshold") of the rule file."""
    names = []
    for group in load_yaml(RULES_FILE)["groups"]:
        for rule in group["rules"]:
            if kind == "alert" and "alert" in rule:
                names.append(rule["alert"])
            record = rule.get("record", "")
            if kind == "threshold" and record.startswith(THRESHOLD_PREFIX):
                names.append(record.removeprefix(THRESHOLD_PREFIX))
    return names


def _promtool_check(promtool: Path, groups: list[dict[str, Any]], path: Path) -> None:
    path.write_text(yaml.safe_dump({"groups": groups}))
    done = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def render_release(
    helm: Path, release: str, namespace: str, values: Mapping[str, Any], tmp_path: Path
) -> list[dict[str, Any]]:
    """Render the chart as ``release`` in ``namespace`` with ``values`` over ci/vllm-values."""
    path = tmp_path / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    done = _helm_run(
        helm,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--values",
        str(ci("vllm")),
        "--values",
        str(path),
    )
    if done.returncode != 0:
        raise RenderError(_quiet(done.stderr).strip())
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


# ------------------------------------------------------------------- the rendered rules


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_prometheus_rule_is_the_alerts_file_with_values_applied(helm: Path, values: Path) -> None:
    """The PrometheusRule is the rule file with the values applied in Python, scope included."""
    rendered = only(render(helm, values), "PrometheusRule")["spec"]["groups"]
    expected = expected_groups(load_yaml(RULES_FILE), chart_values(values), RELEASE, NAMESPACE)
    assert comparable(rendered) == comparable(expected)


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_prometheus_rule_passes_promtool(
    helm: Path, promtool: Path, values: Path, tmp_path: Path
) -> None:
    """The rendered rule groups pass promtool check rules."""
    groups = only(render(helm, values), "PrometheusRule")["spec"]["groups"]
    _promtool_check(promtool, groups, tmp_path / "rendered.rules.yml")


def test_every_alert_and_threshold_knob_is_applied(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """Every alert and threshold knob renders as in Python, and the result passes promtool."""
    alerts_names = rule_names("alert")
    thresholds_names = rule_names("threshold")
    assert len(alerts_names) >= 2
    assert thresholds_names
    alerts = {
        alerts_names[0]: {"enabled": False},
        alerts_names[1]: {"for": "42m", "severity": "info", "keepFiringFor": "7m"},
    }
    thresholds: dict[str, float] = {
        name: 1000.0 * (index + 1) + 0.25 for index, name in enumerate(thresholds_names)
    }
    thresholds[thresholds_names[0]] = 3_000_000_000  # bytes-sized numbers keep every digit
    # The SLO objectives are ratios in (0, 1) (the schema refuses anything else).
    thresholds["slo_ttft_objective"] = 0.975
    thresholds["slo_error_objective"] = 0.9975
    sets = (
        "--set prometheusRule.enabled=true",
        f"--set-json prometheusRule.alerts={json.dumps(alerts)}",
        f"--set-json prometheusRule.thresholds={json.dumps(thresholds)}",
    )
    rendered = only(render(helm, ci("vllm"), sets=sets), "PrometheusRule")
    validate_manifest(rendered)
    groups = rendered["spec"]["groups"]
    extra = {"prometheusRule": {"alerts": alerts, "thresholds": thresholds}}
    values = chart_values(ci("vllm"), extra=extra)
    assert comparable(groups) == comparable(
        expected_groups(load_yaml(RULES_FILE), values, RELEASE, NAMESPACE)
    )
    names = [r.get("alert") for g in groups for r in g["rules"]]
    assert alerts_names[0] not in names
    exprs = [r["expr"] for g in groups for r in g["rules"] if "record" in r]
    assert "vector(3000000000)" in exprs
    _promtool_check(promtool, groups, tmp_path / "rendered.rules.yml")


def test_scope_cluster_renders_the_rule_file_as_it_stands(helm: Path) -> None:
    """scope: cluster applies the knobs only: no selector, no headroom_release anywhere."""
    sets = ("--set prometheusRule.scope=cluster",)
    groups = only(render(helm, ci("vllm"), sets=sets), "PrometheusRule")["spec"]["groups"]
    values = chart_values(ci("vllm"), extra={"prometheusRule": {"scope": "cluster"}})
    assert comparable(groups) == comparable(
        expected_groups(load_yaml(RULES_FILE), values, RELEASE, NAMESPACE)
    )
    source = {
        rule.get("alert") or rule["record"]: rule["expr"]
        for group in load_yaml(RULES_FILE)["groups"]
        for rule in group["rules"]
    }
    for group in groups:
        for rule in group["rules"]:
            assert rule["expr"] == source[rule.get("alert") or rule["record"]] or (
                group["name"] == THRESHOLD_GROUP
            )
            assert "headroom_release" not in rule.get("labels", {})


def test_every_selector_of_every_rule_is_scoped_per_release(helm: Path) -> None:
    """Each series an expression reads carries the release's matchers, raw or recorded."""
    groups = only(render(helm, ci("vllm")), "PrometheusRule")["spec"]["groups"]
    selector = default_selector(RELEASE, NAMESPACE, chart_values(ci("vllm")))
    release = f'headroom_release="{NAMESPACE}/{RELEASE}-vllm-headroom"'
    checked = 0
    for group in groups:
        for rule in group["rules"]:
            expr = rule["expr"]
            if group["name"] == THRESHOLD_GROUP:
                assert rule["labels"] == {"headroom_release": release.split('"')[1]}
                continue
            for name in metric_names(expr):
                wanted = release if name.startswith("headroom:") else selector
                found = re.findall(re.escape(name) + r"\{([^}]*)\}", expr)
                assert found, (name, expr)
                assert all(m.startswith(wanted) for m in found), (name, expr)
                checked += 1
    assert checked > 100


def test_a_selector_value_replaces_the_release_jobs(helm: Path) -> None:
    """prometheusRule.selector scopes raw series where another scrape configuration names jobs."""
    sets = ('--set-string prometheusRule.selector=job=~"vllm|headroom"\\,namespace="llm"',)
    groups = only(render(helm, ci("vllm"), sets=sets), "PrometheusRule")["spec"]["groups"]
    exprs = " ".join(r["expr"] for g in groups for r in g["rules"])
    assert 'vllm:num_preemptions_total{job=~"vllm|headroom",namespace="llm"}' in exprs
    assert "-exporter)" not in exprs


#: An existing scrape of vLLM's /metrics (production-stack's ServiceMonitor names its job after
#: the engine Service), with a character a regular expression would read as an operator.
FOREIGN_JOB = "vllm-llama3-engine-service.v1"
FOREIGN = {"vllmMetrics": {"enabled": False, "job": FOREIGN_JOB}}


def test_a_foreign_vllm_job_replaces_the_charts_own(helm: Path) -> None:
    """vllmMetrics.enabled=false with vllmMetrics.job: the rules read vLLM's series from that job.

    The monitors stop scraping vLLM; every raw selector reads the exporter's job or the foreign
    one (quoted, so that its dot is a dot), as in Python.
    """
    sets = ("--set vllmMetrics.enabled=false", f"--set vllmMetrics.job={FOREIGN_JOB}")
    manifests = render(helm, ci("vllm"), sets=sets)
    groups = only(manifests, "PrometheusRule")["spec"]["groups"]
    values = chart_values(ci("vllm"), extra=FOREIGN)
    assert comparable(groups) == comparable(
        expected_groups(load_yaml(RULES_FILE), values, RELEASE, NAMESPACE)
    )
    exprs = " ".join(r["expr"] for g in groups for r in g["rules"])
    exporter = f"{NAMESPACE}/{RELEASE}-vllm-headroom-exporter"
    jobs_matcher = f'job=~"{exporter}|vllm-llama3-engine-service\\\\.v1"'
    assert f'vllm:num_preemptions_total{{namespace="{NAMESPACE}",{jobs_matcher}}}' in exprs
    assert "-vllm)" not in exprs
    endpoints = only(manifests, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["headroom"]


def test_the_startup_budget_follows_the_startup_probe(helm: Path) -> None:
    """vllm_startup_seconds is vLLM's startup probe budget unless the values set it."""

    def threshold(*sets: str) -> str:
        groups = only(render(helm, ci("vllm"), sets=sets), "PrometheusRule")["spec"]["groups"]
        [group] = [g for g in groups if g["name"] == THRESHOLD_GROUP]
        [rule] = [r for r in group["rules"] if r["record"].endswith(":vllm_startup_seconds")]
        return str(rule["expr"])

    assert threshold() == "vector(1800)"
    assert threshold("--set vllm.startupProbe.failureThreshold=360") == "vector(3600)"
    assert threshold("--set vllm.startupProbe.initialDelaySeconds=60") == "vector(1860)"
    assert threshold("--set prometheusRule.thresholds.vllm_startup_seconds=900") == "vector(900)"


def test_alerts_carry_routing_labels_and_absolute_links(helm: Path) -> None:
    """alertLabels, headroom_release and model_name on every alert; links built from values."""
    sets = (
        '--set-json prometheusRule.alertLabels={"team":"inference","service":"chat"}',
        "--set prometheusRule.runbookUrl=https://runbooks.example.com/vllm/{alertname}.md",
        "--set prometheusRule.grafanaUrl=https://grafana.example.com/",
    )
    groups = only(render(helm, ci("vllm"), sets=sets), "PrometheusRule")["spec"]["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert len(alerts) == len(rule_names("alert"))
    for rule in alerts:
        labels, annotations = rule["labels"], rule["annotations"]
        assert labels["team"] == "inference"
        assert labels["service"] == "chat"
        assert labels["headroom_release"] == f"{NAMESPACE}/{RELEASE}-vllm-headroom"
        assert labels["model_name"] == "llama-3.1-8b"
        assert labels["severity"] in {"critical", "warning", "info"}
        name = rule["alert"]
        assert annotations["runbook_url"] == f"https://runbooks.example.com/vllm/{name}.md"
        assert annotations["dashboard_url"].startswith(
            "https://grafana.example.com/d/vllm-headroom-"
        )


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        pytest.param(
            ("--set prometheusRule.scope=namespace",),
            "prometheusRule.scope must be one of the following",
            id="unknown-scope",
        ),
        pytest.param(
            ("--set-string prometheusRule.selector=job",),
            "prometheusRule.selector: Does not match pattern",
            id="selector-not-matchers",
        ),
        pytest.param(
            ("--set prometheusRule.alertLabels.severity=page",),
            "prometheusRule.alertLabels",
            id="alert-label-overriding-severity",
        ),
        pytest.param(
            ("--set prometheusRule.runbookUrl=https://runbooks.example.com/",),
            "prometheusRule.runbookUrl: Does not match pattern",
            id="runbook-url-without-alertname",
        ),
    ],
)
def test_bad_alerting_values_fail_at_render_time(
    helm: Path, sets: tuple[str, ...], message: str
) -> None:
    """A scope, selector, label or link the rules cannot use stops helm template."""
    error = render_error(helm, ci("vllm"), sets=sets)
    assert message in error, error


# ------------------------------------------------------------------------ jobs per component


@pytest.mark.parametrize("name", ["vllm", "vllm-uuids", "sidecar", "fleet"])
def test_monitors_give_vllm_and_the_exporter_a_job_each(helm: Path, name: str) -> None:
    """Every scrape endpoint sets job to <namespace>/<fullname>-vllm or -exporter first."""
    manifests = render(helm, ci(name))
    names = jobs(RELEASE, NAMESPACE, chart_values(ci(name)))
    seen: dict[str, str] = {}
    for manifest in manifests:
        kind = manifest["kind"]
        if kind in {"PodMonitor", "ServiceMonitor"}:
            key = "podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"
            endpoints = [
                (e["path"], e["port"], e.get("relabelings", [])) for e in manifest["spec"][key]
            ]
        elif kind == "ScrapeConfig":
            spec = manifest["spec"]
            endpoints = [(spec["metricsPath"], "", spec["relabelings"])]
        else:
            continue
        for path, port, relabelings in endpoints:
            [job] = [r["replacement"] for r in relabelings if r.get("targetLabel") == "job"]
            component = "vllm" if path == "/metrics" and port != "headroom" else "exporter"
            assert job == names[component], (kind, path, port)
            seen[component] = job
    assert set(seen) == {"vllm", "exporter"}


# ----------------------------------------------------------------- two releases, one Prometheus


def _series(name: str, labels: Mapping[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _pod(release: str, namespace: str, pod: str, ip: str, model: str) -> dict[str, Any]:
    """The targets of one pod of a release, labelled as the chart's monitors label them."""
    names = jobs(release, namespace, chart_values(ci("vllm")))
    common = {"namespace": namespace, "pod": pod}
    return {
        "vllm": {"job": names["vllm"], **common, "instance": f"{ip}:8000"},
        "exporter": {"job": names["exporter"], **common, "instance": f"{ip}:8742"},
        "model": model,
    }


def _traffic(pod: Mapping[str, Any], *, vllm_answers: bool) -> list[dict[str, str]]:
    """Ten idle minutes, then a sustained spike of 1/s preemptions at 10 finished requests/s.

    The exporter started at 0 and vLLM answered it once at 1m; with ``vllm_answers`` false it
    stops answering at 2m (VllmUnreachable after its for).
    """
    engine = {**pod["vllm"], "engine": "0", "model_name": pod["model"]}
    up = "1x80" if vllm_answers else "1x4 0x76"
    return [
        _series("vllm:num_preemptions_total", engine, "0x20 30+30x59"),
        _series("vllm:request_success_total", {**engine, "finished_reason": "stop"}, "0+300x80"),
        _series("vllm:num_requests_running", engine, "8x80"),
        _series("headroom_target_up", pod["exporter"], up),
        _series("headroom_build_info", {**pod["exporter"], "mode": "sidecar"}, "1x80"),
        _series("process_start_time_seconds", pod["exporter"], "0x80"),
        _series(
            "headroom_source_last_success_timestamp_seconds",
            {**pod["exporter"], "source": "vllm_metrics"},
            "60x80",
        ),
        _series("up", pod["vllm"], "1x80"),
        _series("up", pod["exporter"], "1x80"),
    ]


#: Release a (team a) pages a preemption spike as a warning and at the default thresholds;
#: release b raises its preemption thresholds out of reach. Both label their alerts by team.
RELEASE_A = {
    "vllm": {"servedModelName": "llama"},
    "prometheusRule": {
        "alerts": {"VllmHeadroomPreemptionSpike": {"severity": "warning"}},
        "alertLabels": {"team": "a"},
    },
}
RELEASE_B = {
    "vllm": {"servedModelName": "mistral"},
    "prometheusRule": {
        "thresholds": {"preemptions_per_second": 5, "preemptions_per_second_spike": 50},
        "alertLabels": {"team": "b"},
    },
}


def _two_releases(
    helm: Path,
    promtool: Path,
    tmp_path: Path,
    *,
    scope: str,
    checks: list[dict[str, Any]],
    release_b: Mapping[str, Any] = RELEASE_B,
) -> subprocess.CompletedProcess[str]:
    """Both releases' rules and both pods' traffic in one promtool run; ``checks`` at 30 s.

    The rules are two files, as prometheus-operator writes them; pod b's vLLM stops answering
    at 2m.
    """
    files = []
    for release, namespace, own in (("a", "team-a", RELEASE_A), ("b", "team-b", release_b)):
        values = _merged(own, {"prometheusRule": {"scope": scope}})
        rule = only(render_release(helm, release, namespace, values, tmp_path), "PrometheusRule")
        groups = rule["spec"]["groups"]
        for group in groups:
            for item in group["rules"]:
                item.pop("annotations", None)  # these tests are about labels and timing
        path = tmp_path / f"{release}.rules.yml"
        path.write_text(yaml.safe_dump({"groups": groups}))
        files.append(path.name)
    pod_a = _pod("a", "team-a", "a-0", "10.0.0.1", "llama")
    pod_b = _pod("b", "team-b", "b-0", "10.0.1.1", "mistral")
    suite = {
        "rule_files": files,
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": _traffic(pod_a, vllm_answers=True)
                + _traffic(pod_b, vllm_answers=False),
                "alert_rule_test": checks,
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return subprocess.run(
        [str(promtool), "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def _labels(release: str, namespace: str, pod: str, **more: str) -> dict[str, str]:
    release_label = f"{namespace}/{release}-vllm-headroom"
    return {"headroom_release": release_label, "namespace": namespace, "pod": pod, **more}


def test_two_releases_side_by_side_each_pod_gets_its_own_alerts_once(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """Per release: own pods only, once, own severity and thresholds, no threshold collision.

    Pod a preempts at 1/s: release a pages it (as a warning, its value) within 2 minutes;
    release b's pod preempts just the same, but b's thresholds are out of reach. Pod b's vLLM
    stops answering: one VllmUnreachable, b's. No VllmHeadroomThresholdMissing: each release's
    thresholds are its own series.
    """
    a = _labels("a", "team-a", "a-0", team="a", model_name="llama")
    b = _labels("b", "team-b", "b-0", team="b", model_name="mistral")
    spike = {
        **a,
        "severity": "warning",
        "job": "team-a/a-vllm-headroom-vllm",
        "instance": "10.0.0.1:8000",
    }
    unreachable = {
        **b,
        "severity": "critical",
        "job": "team-b/b-vllm-headroom-exporter",
        "instance": "10.0.1.1:8742",
    }
    checks: list[dict[str, Any]] = [
        {"eval_time": "10m30s", "alertname": "VllmHeadroomPreemptionSpike", "exp_alerts": []},
        {
            "eval_time": "12m",
            "alertname": "VllmHeadroomPreemptionSpike",
            "exp_alerts": [{"exp_labels": spike}],
        },
        {
            "eval_time": "30m",
            "alertname": "VllmHeadroomPreemptionSpike",
            "exp_alerts": [{"exp_labels": spike}],
        },
        {
            "eval_time": "30m",
            "alertname": "VllmHeadroomVllmUnreachable",
            "exp_alerts": [{"exp_labels": unreachable}],
        },
        {"eval_time": "30m", "alertname": "VllmHeadroomThresholdMissing", "exp_alerts": []},
        {"eval_time": "30m", "alertname": "VllmHeadroomExporterAbsent", "exp_alerts": []},
        {"eval_time": "30m", "alertname": "VllmHeadroomTargetDown", "exp_alerts": []},
        {"eval_time": "30m", "alertname": "VllmHeadroomVllmNotScraped", "exp_alerts": []},
    ]
    done = _two_releases(helm, promtool, tmp_path, scope="release", checks=checks)
    assert done.returncode == 0, done.stdout + done.stderr


def _one_release(
    helm: Path,
    promtool: Path,
    tmp_path: Path,
    *,
    values: Mapping[str, Any],
    vllm_job: str,
    checks: list[dict[str, Any]],
) -> subprocess.CompletedProcess[str]:
    """Release a's rules (``values`` over ci/vllm-values) and one preempting pod, in promtool.

    The pod's vLLM series carry ``vllm_job``, its exporter's the chart's job.
    """
    rule = only(render_release(helm, "a", "team-a", values, tmp_path), "PrometheusRule")
    groups = rule["spec"]["groups"]
    for group in groups:
        for item in group["rules"]:
            item.pop("annotations", None)  # these tests are about which series the rules read
    (tmp_path / "a.rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    pod = _pod("a", "team-a", "a-0", "10.0.0.1", "llama-3.1-8b")
    pod["vllm"]["job"] = vllm_job
    suite = {
        "rule_files": ["a.rules.yml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": _traffic(pod, vllm_answers=True),
                "alert_rule_test": checks,
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return subprocess.run(
        [str(promtool), "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_vllm_scraped_by_a_foreign_job_still_pages_its_preemptions(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """vllmMetrics.enabled=false plus vllmMetrics.job: the preemption page fires from that job.

    vLLM's series come from the existing scrape (job vllm-llama3-engine-service.v1), the
    exporter's from the chart's monitor: the sustained 1/s preemptions page within 2 minutes,
    labelled with the foreign job, and VllmHeadroomVllmNotScraped stays quiet.
    """
    spike = {
        **_labels("a", "team-a", "a-0", model_name="llama-3.1-8b"),
        "severity": "critical",
        "job": FOREIGN_JOB,
        "instance": "10.0.0.1:8000",
    }
    checks: list[dict[str, Any]] = [
        {"eval_time": "10m30s", "alertname": "VllmHeadroomPreemptionSpike", "exp_alerts": []},
        {
            "eval_time": "12m",
            "alertname": "VllmHeadroomPreemptionSpike",
            "exp_alerts": [{"exp_labels": spike}],
        },
        {"eval_time": "40m", "alertname": "VllmHeadroomVllmNotScraped", "exp_alerts": []},
        {"eval_time": "40m", "alertname": "VllmHeadroomExporterAbsent", "exp_alerts": []},
    ]
    done = _one_release(
        helm, promtool, tmp_path, values=FOREIGN, vllm_job=FOREIGN_JOB, checks=checks
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_foreign_vllm_job_the_rules_do_not_read_pages_nothing(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """The counter-case: the same traffic under the chart's own jobs only (the issue's silence).

    The rules read vLLM from <namespace>/<fullname>-vllm, which nothing scrapes: no preemption
    page, only VllmHeadroomVllmNotScraped, 30 minutes later.
    """
    checks: list[dict[str, Any]] = [
        {"eval_time": "12m", "alertname": "VllmHeadroomPreemptionSpike", "exp_alerts": []},
        {"eval_time": "40m", "alertname": "VllmHeadroomVllmNotScraped", "exp_alerts": []},
    ]
    done = _one_release(helm, promtool, tmp_path, values={}, vllm_job=FOREIGN_JOB, checks=checks)
    assert done.returncode != 0
    report = done.stdout + done.stderr
    assert "VllmHeadroomVllmNotScraped" in report
    assert "VllmHeadroomPreemptionSpike" not in report, report


def test_two_unscoped_releases_collide_on_thresholds(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """The counter-case (scope: cluster in both): two threshold values, one series.

    Both releases record headroom:threshold:* without a label that tells them apart: the
    evaluation fails with "duplicate sample for timestamp", the collision the per-release scope
    prevents.
    """
    checks = [{"eval_time": "30m", "alertname": "VllmHeadroomThresholdMissing", "exp_alerts": []}]
    done = _two_releases(helm, promtool, tmp_path, scope="cluster", checks=checks)
    assert done.returncode != 0
    assert "duplicate sample for timestamp" in done.stdout + done.stderr


def test_two_unscoped_releases_page_the_other_team_for_a_pod(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """The counter-case with equal thresholds: both rule files evaluate every pod.

    Pod b's VllmUnreachable fires twice, once labelled for team a: the wrong team is paged.
    """
    same_thresholds = {**RELEASE_B, "prometheusRule": {"alertLabels": {"team": "b"}}}
    checks = [{"eval_time": "30m", "alertname": "VllmHeadroomVllmUnreachable", "exp_alerts": []}]
    done = _two_releases(
        helm, promtool, tmp_path, scope="cluster", checks=checks, release_b=same_thresholds
    )
    assert done.returncode != 0
    report = done.stdout + done.stderr
    got = report.split("got:[", 1)[1]
    assert got.count("Labels:{") == 2, report
    assert 'pod="b-0"' in got
    assert 'team="a"' in got
    assert 'team="b"' in got


# ------------------------------------------------------------------------ Alertmanager

CRD = paths.REPO / "tests" / "fixtures" / "crds" / "monitoring.coreos.com_alertmanagerconfigs.json"
EXAMPLE = paths.REPO / "alerts" / "alertmanager" / "vllm-headroom.yml"
PAGE = (
    '--set-json alertmanagerConfig.page={"webhookConfigs":[{"url":"https://pager.example.com/h"}]}'
)


def _strict(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused, as kubectl's strict field validation does."""
    if isinstance(schema, dict):
        out = {key: _strict(value) for key, value in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def _amc_validator() -> jsonschema.Draft7Validator:
    """A validator for the CRD's v1alpha1 schema, strict about unknown fields.

    OpenAPI v3 read as JSON Schema draft 7; its Go-syntax patterns (the weekdays') are only
    compiled when a field uses them.
    """
    crd = json.loads(CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def _amc(helm: Path, *sets: str) -> dict[str, Any]:
    manifests = render(helm, ci("vllm"), sets=("--set alertmanagerConfig.enabled=true", *sets))
    return only(manifests, "AlertmanagerConfig")


def test_alertmanager_config_validates_against_prometheus_operators_crd(helm: Path) -> None:
    """The AlertmanagerConfig passes the v1alpha1 schema of prometheus-operator 0.93's CRD."""
    validator = _amc_validator()
    validator.validate(_amc(helm, PAGE))
    ticket = '--set-json alertmanagerConfig.ticket={"slackConfigs":[{"channel":"#llm"}]}'
    validator.validate(_amc(helm, PAGE, ticket))
    broken = _amc(helm, PAGE)
    broken["spec"]["route"]["groupWiat"] = "10s"
    with pytest.raises(jsonschema.ValidationError, match="groupWiat"):
        validator.validate(broken)
    broken = _amc(helm, PAGE)
    broken["spec"]["inhibitRules"][0]["sourceMatch"][0]["matchType"] = "~="
    with pytest.raises(jsonschema.ValidationError, match="~="):
        validator.validate(broken)


def test_alertmanager_config_needs_a_pager(helm: Path) -> None:
    """Enabled without a page receiver, the render stops and says what to set."""
    error = render_error(helm, ci("vllm"), sets=("--set alertmanagerConfig.enabled=true",))
    assert "alertmanagerConfig.page: set the pager's receiver" in error


def _matchers(items: Sequence[Mapping[str, str]]) -> set[str]:
    return {f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"' for m in items}


def test_alertmanager_config_routes_and_inhibits_as_the_example(helm: Path) -> None:
    """The chart's routes and inhibit rules are those of alerts/alertmanager/vllm-headroom.yml.

    The AlertmanagerConfig's own top route also matches this release's headroom_release.
    """
    spec = _amc(helm, PAGE)["spec"]
    example = load_yaml(EXAMPLE)
    release = f'headroom_release="{NAMESPACE}/{RELEASE}-vllm-headroom"'
    assert _matchers(spec["route"]["matchers"]) == {'alertname=~"VllmHeadroom.*"', release}
    [top] = example["route"]["routes"]
    assert spec["route"]["groupBy"] == top["group_by"]
    for key, camel in (("group_wait", "groupWait"), ("group_interval", "groupInterval")):
        assert spec["route"][camel] == top[key]
    assert spec["route"]["repeatInterval"] == top["repeat_interval"]
    ours = 'alertname=~"VllmHeadroom.*"'
    assert top["matchers"] == [ours]
    for mine, theirs in zip(spec["route"]["routes"], top["routes"], strict=True):
        assert _matchers(mine["matchers"]) == set(theirs["matchers"])
        assert mine["receiver"].removeprefix(f"{RELEASE}-") == theirs["receiver"]
        assert mine.get("groupBy") == theirs.get("group_by")
        for key, camel in (
            ("group_wait", "groupWait"),
            ("group_interval", "groupInterval"),
            ("repeat_interval", "repeatInterval"),
        ):
            assert mine.get(camel) == theirs.get(key)
    inhibit = [
        (_matchers(r["sourceMatch"]), _matchers(r["targetMatch"]), r["equal"])
        for r in spec["inhibitRules"]
    ]
    expected = [
        (set(r["source_matchers"]), set(r["target_matchers"]), r["equal"])
        for r in example["inhibit_rules"]
    ]
    assert inhibit == expected


# ------------------------------------------------------------------------ SLO objectives


def _slo_run(helm: Path, promtool: Path, tmp_path: Path, objective: float | None) -> str:
    """promtool over the release's rules: 2% of its pod's requests answered 5xx for 20 minutes.

    Returns promtool's output for a check that expects no error-budget page at 20m.
    """
    values: dict[str, Any] = {"vllm": {"servedModelName": "llama"}}
    if objective is not None:
        values["prometheusRule"] = {"thresholds": {"slo_error_objective": objective}}
    rule = only(render_release(helm, "a", "team-a", values, tmp_path), "PrometheusRule")
    groups = rule["spec"]["groups"]
    for group in groups:
        for item in group["rules"]:
            item.pop("annotations", None)
    (tmp_path / "a.rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    pod = _pod("a", "team-a", "a-0", "10.0.0.1", "llama")
    handler = {**pod["vllm"], "handler": "/v1/completions", "method": "POST"}
    series = [
        _series("http_requests_total", {**handler, "status": "2xx"}, "0+98x40"),
        _series("http_requests_total", {**handler, "status": "5xx"}, "0+2x40"),
        _series("vllm:num_requests_running", {**pod["vllm"], "model_name": "llama"}, "3x40"),
    ]
    check = {"eval_time": "20m", "alertname": "VllmHeadroomErrorBudgetBurn", "exp_alerts": []}
    suite = {
        "rule_files": ["a.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [check]}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(suite, sort_keys=False))
    done = subprocess.run(
        [str(promtool), "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    return done.stdout + done.stderr


def test_slo_alerts_are_off_until_the_values_state_an_objective(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """Unset, the objective records nothing and 2% errors page nobody; 0.999 pages the release."""
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off = _slo_run(helm, promtool, tmp_path / "off", None)
    assert "SUCCESS" in off, off
    on = _slo_run(helm, promtool, tmp_path / "on", 0.999)
    assert "FAILED" in on, on
    assert 'alertname="VllmHeadroomErrorBudgetBurn"' in on
    assert 'headroom_release="team-a/a-vllm-headroom"' in on
    assert 'model_name="llama"' in on


def test_an_objective_outside_zero_and_one_is_refused_by_the_schema(helm: Path) -> None:
    """99.9 for 99.9% would be a negative budget: the chart refuses it at render time."""
    sets = (
        "--set prometheusRule.enabled=true",
        "--set prometheusRule.thresholds.slo_error_objective=99.9",
    )
    message = render_error(helm, ci("vllm"), sets=sets)
    assert "slo_error_objective" in message
