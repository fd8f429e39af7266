"""The alert and recording rules (``alerts/``), their promtool unit tests and their runbooks.

What this pins, beyond ``promtool test rules tests/alerts/*.yml`` (run here too):

- the rule file is valid for promtool, and every alert has a unit test that fires it and one that
  stays quiet, with the situations the issue names (restart, V0 names, idle, data parallelism);
- every metric name a rule or an annotation template reads exists in real exposition: our
  goldens, the real vLLM captures, or a recording rule of the file itself;
- the Helm chart's contract: tunables only as ``headroom:threshold:*`` rules, every one guarded
  by VllmHeadroomThresholdMissing, and overrides applied structurally (by rule name) work;
- every alert has a runbook page with the agreed sections, linking back, and the index documents
  every threshold with the default the file really has;
- the alerts read the conservative figures (every limit of the scheduler, no block shared), and
  the runbooks say what to change for every limit the exporter names.

promtool comes from Debian's ``prometheus`` package (``bash scripts/e2e/install-prometheus.sh``):
without it these tests fail when ``CI`` is set and skip otherwise.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from exporter.core.reasons import AdmissionReason
from tests import paths
from tests.e2e.harness import alertmanager_binary
from tests.promql import PromQLSyntaxError, metric_names, number_literals
from tests.tools import require

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

REPO = paths.REPO
RULES = REPO / "alerts" / "vllm-headroom.rules.yml"
RULE_FILES = sorted((REPO / "alerts").glob("*.yml"))
UNIT_TESTS = sorted((REPO / "tests" / "alerts").glob("*.yml"))
RUNBOOKS = REPO / "docs" / "runbooks"
DASHBOARD_FILES = sorted((REPO / "dashboards").glob("vllm-headroom-*.json"))
GOLDENS = sorted((REPO / "tests" / "golden" / "exposition").glob("*.prom"))
#: The real vLLM captures (tests/fixtures/vllm-metrics).
CAPTURES = sorted(paths.CAPTURES.glob("*.prom"))

THRESHOLD_GROUP = "vllm-headroom-thresholds"
THRESHOLD_PREFIX = "headroom:threshold:"
#: Thresholds that are off until the user states them: the SLO objectives. Their rule records
#: nothing (``UNSET``), so the SLO alerts and budgets do not exist until an objective is set.
OPTIONAL_THRESHOLDS = {"slo_ttft_objective", "slo_error_objective"}
UNSET = "absent(vector(0))"
META_ALERT = "VllmHeadroomThresholdMissing"
RUNBOOK_URL = "https://github.com/vllm-headroom/vllm-headroom/blob/main/docs/runbooks/{}.md"
DASHBOARD_UIDS = ("vllm-headroom-instance", "vllm-headroom-fleet")
SEVERITIES = {"critical", "warning", "info"}

#: Series that Prometheus itself writes for every target (never in any exposition).
PROMETHEUS_SYNTHETIC = {"up"}

#: Alerts about traffic against capacity: an idle instance must keep each of them quiet, and
#: their runbooks walk through the capacity fixes in order.
CAPACITY_ALERTS = {
    "VllmHeadroomPreemptionSpike",
    "VllmHeadroomKvCacheSaturated",
    "VllmHeadroomKvCacheExhaustionPredicted",
    "VllmHeadroomLow",
    "VllmHeadroomFleetLow",
    "VllmHeadroomContextGrowth",
    "VllmHeadroomAdmissionRejections",
}
#: Alerts whose condition is itself a duration, every sample of a window (no progress counter
#: moved in 2 minutes while requests were held): the window is their wait, and a `for` on top
#: would push the page past its 3 minutes.
WINDOW_IS_THE_WAIT = {"VllmHeadroomEngineStalled"}
#: Alerts about a scheduler limit other than the KV cache: quiet when idle too, but their first
#: fix is the limit's own setting, not the KV levers.
LIMIT_ALERTS = {"VllmHeadroomMaxNumSeqsBinding"}
#: The sidecar's per-engine ceiling and headroom figures, which are 0 while an engine sleeps: an
#: alert reading any of them (directly or through a recording rule) has a case with one asleep.
SLEEP_SENSITIVE = {
    "headroom_p95_available_sequences",
    "headroom_p95_available_ratio",
    "headroom_p95_ceiling_sequences",
    "headroom_p95_available_limited_by",
    "headroom_p95_ceiling_limited_by",
}

#: The capacity fixes, in the order every capacity runbook gives them: the safe ones (no
#: restart, or no change to what the model computes) before FP8 KV cache, which changes numerics.
CAPACITY_FIXES = (
    ("scale out", r"[Ss]cale out"),
    ("max-num-seqs", r"--max-num-seqs"),
    ("utilization", r"--gpu-memory-utilization"),
    ("max-model-len", r"--max-model-len"),
    ("FP8 KV cache", r"FP8 KV cache"),
    ("tensor parallelism", r"[Tt]ensor parallel"),
)

#: The sections every runbook page has, in this order.
RUNBOOK_SECTIONS = ("Meaning", "Confirm", "Fix", "Escalation", "When to ignore", "Threshold")


# ---------------------------------------------------------------------------------- helpers


def _run(argv: list[str | Path], *, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    # promtool's unit tests over every rule file take about 100 s of CPU: 900 s only guards a hang.
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, check=False, timeout=900
    )


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return document


def _rules(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for group in document["groups"]:
        for rule in group["rules"]:
            yield group["name"], rule


def _alerts(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for _, rule in _rules(document) if "alert" in rule}


def _thresholds(document: dict[str, Any]) -> dict[str, str]:
    """Threshold name (without the prefix) -> its expression, from the thresholds group."""
    [group] = [g for g in document["groups"] if g["name"] == THRESHOLD_GROUP]
    return {r["record"].removeprefix(THRESHOLD_PREFIX): r["expr"] for r in group["rules"]}


DOCUMENT = _load(RULES)
ALERTS = _alerts(DOCUMENT)
RECORDED = {rule["record"] for _, rule in _rules(DOCUMENT) if "record" in rule}

#: Go template strings handed to ``query`` or to ``printf`` (whose result goes to ``query``).
_TEMPLATE_QUERY = re.compile(r'\b(?:query|printf)\s+"((?:[^"\\]|\\.)*)"')


def _template_queries(text: str) -> list[str]:
    """The PromQL that an annotation template runs, with printf's %q verbs filled in."""
    return [
        bytes(raw, "utf-8").decode("unicode_escape").replace("%q", '"x"')
        for raw in _TEMPLATE_QUERY.findall(text)
        if raw not in {"%.0f", "%.1f", "%.2f"}
    ]


def _exposed_names(paths: list[Path]) -> set[str]:
    """Sample names in Prometheus text expositions (comments and # TYPE lines are not samples)."""
    names: set[str] = set()
    for path in paths:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", line)
            if match:
                names.add(match.group(1))
    return names


def _unit_test_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in UNIT_TESTS:
        for group in _load(path)["tests"]:
            groups.append({**group, "file": path.name})
    return groups


def _expr_names(rule: dict[str, Any]) -> set[str]:
    """Metric names an alert reads, following the recording rules it reads to their inputs."""
    by_record = {r["record"]: r for _, r in _rules(DOCUMENT) if "record" in r}
    seen: set[str] = set()
    todo = list(metric_names(rule["expr"]))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in by_record:
            todo.extend(metric_names(by_record[name]["expr"]))
    return seen


def _threshold_defaults() -> dict[str, str]:
    """Threshold name -> its default as the docs write it: the number, or ``unset``."""
    return {
        name: "unset" if expr.strip() == UNSET else re.sub(r"^vector\((.*)\)$", r"\1", expr.strip())
        for name, expr in _thresholds(DOCUMENT).items()
    }


def _runbook(alert: str) -> str:
    return (RUNBOOKS / f"{alert}.md").read_text(encoding="utf-8")


def _section(page: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}[^\n]*\n(.*?)(?=^## |\Z)", page, re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


# ----------------------------------------------------------------------------- promtool


def test_rule_files_pass_promtool_check(promtool: Path) -> None:
    """promtool check rules accepts every rule file, with every rule counted."""
    for path in RULE_FILES:
        done = _run([promtool, "check", "rules", path])
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"SUCCESS: {sum(1 for _ in _rules(_load(path)))} rules found" in done.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    """Every promtool unit test in tests/alerts/ passes against the rule file."""
    assert UNIT_TESTS, "no promtool unit tests in tests/alerts/"
    done = _run([promtool, "test", "rules", *UNIT_TESTS])
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_stays_quiet() -> None:
    """Each alert has at least one promtool case expecting it and one expecting silence."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for group in _unit_test_groups():
        for case in group.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert set(ALERTS) - quiet == set()
    # The meta-alert's firing case needs a rule file without thresholds: it is generated below
    # (test_a_missing_threshold_fires_the_meta_alert_naming_it).
    assert set(ALERTS) - fires == {META_ALERT}


def test_unit_tests_cover_restart_v0_names_idle_and_data_parallel_engines() -> None:
    """Named promtool cases cover a vLLM restart, V0 names, an idle instance and DP engines."""
    cases: dict[str, set[str]] = {name: set() for name in ALERTS}
    for group in _unit_test_groups():
        for case in group.get("alert_rule_test", []):
            cases[case["alertname"]].add(group["name"])
    per_engine = {
        line.split("{")[0]
        for path in GOLDENS
        for line in path.read_text(encoding="utf-8").splitlines()
        if 'engine="' in line and not line.startswith("#")
    }

    def covered(alert: str, word: str) -> bool:
        return any(word in name for name in cases[alert])

    for alert, rule in ALERTS.items():
        names = _expr_names(rule)
        reads_vllm = any(name.startswith("vllm:") for name in names)
        if reads_vllm:
            assert covered(alert, "V0"), f"{alert}: no case with V0 names"
        if reads_vllm and alert in CAPACITY_ALERTS:
            assert covered(alert, "restart"), f"{alert}: no vLLM restart case"
        if alert in CAPACITY_ALERTS | LIMIT_ALERTS:
            assert covered(alert, "idle"), f"{alert}: no idle-instance case"
        engine_level = alert in CAPACITY_ALERTS | LIMIT_ALERTS | {"VllmHeadroomCapacityDrift"}
        if engine_level and (reads_vllm or names & per_engine):
            assert covered(alert, "data-parallel"), f"{alert}: no data-parallel case"
        if names & SLEEP_SENSITIVE:
            assert covered(alert, "asleep"), f"{alert}: no case with an engine asleep"


# ------------------------------------------------------------------- names in exposition


def test_every_metric_name_the_rules_read_exists_in_real_exposition() -> None:
    """Each name a rule or annotation reads is in our goldens, the vLLM captures, or recorded.

    Our goldens hold the exporter's own process metrics too (process_start_time_seconds, which
    VllmHeadroomVllmUnreachable reads for the startup budget).
    """
    assert GOLDENS, "no golden expositions"
    assert CAPTURES, "no vLLM captures in tests/fixtures/vllm-metrics"
    ours, vllms = _exposed_names(GOLDENS), _exposed_names(CAPTURES)
    unknown: dict[str, set[str]] = {}
    for _, rule in _rules(DOCUMENT):
        where = rule.get("alert") or rule["record"]
        queries = [rule["expr"]]
        for text in rule.get("annotations", {}).values():
            queries += _template_queries(text)
        for query in queries:
            for name in metric_names(query):
                known = (
                    name in RECORDED
                    or name in PROMETHEUS_SYNTHETIC
                    or (not name.startswith("vllm:") and name in ours)
                    or (name.startswith("vllm:") and name in vllms)
                    # vLLM's API server's own HTTP metrics (prometheus-fastapi-instrumentator)
                    or (name.startswith("http_") and name in vllms)
                )
                if not known:
                    unknown.setdefault(where, set()).add(name)
    assert unknown == {}


def test_alerts_read_the_conservative_figures_never_the_effective_ones() -> None:
    """No rule's expression reads a figure that counts shared prefix blocks once.

    Sharing belongs to today's traffic mix and vanishes when it changes; the effective figures
    are context in annotations and on dashboards, never what an alert or a fleet sum compares.
    """
    assert "headroom_p95_available_sequences" in _expr_names(ALERTS["VllmHeadroomLow"])
    assert "headroom_p95_available_sequences" in _expr_names(ALERTS["VllmHeadroomFleetLow"])
    for _, rule in _rules(DOCUMENT):
        effective = {n for n in metric_names(rule["expr"]) if "effective" in n}
        assert effective == set(), rule.get("alert") or rule["record"]


def test_the_name_check_reads_annotation_queries_and_rejects_unknown_names() -> None:
    """The extractor sees printf/query strings in templates, and a typo'd name is not exposed."""
    text = (
        '{{ with printf "headroom_kv_usable_tokens{job=%q}" $labels.job | query }}'
        '{{ . | first | value | printf "%.0f" }}{{ end }} and '
        '{{ with query "headroom:threshold:stale_seconds" }}{{ . | first | value }}{{ end }}'
    )
    queries = _template_queries(text)
    assert [metric_names(q) for q in queries] == [
        {"headroom_kv_usable_tokens"},
        {"headroom:threshold:stale_seconds"},
    ]
    vllms = _exposed_names(CAPTURES)
    assert "vllm:num_preemptions_total" in vllms
    assert "vllm:num_preemptions" not in vllms  # the counter's name without _total never exists


# ------------------------------------------------------------------------ shape and style


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_has_prefix_severity_and_annotations_with_links(name: str) -> None:
    """One prefix, a known severity, the four annotations, its own runbook and a dashboard."""
    rule = ALERTS[name]
    assert re.fullmatch(r"VllmHeadroom[A-Z][A-Za-z0-9]+", name)
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url", "dashboard_url"}
    assert annotations["runbook_url"] == RUNBOOK_URL.format(name)
    assert annotations["dashboard_url"].startswith(tuple(f"/d/{uid}" for uid in DASHBOARD_UIDS))
    assert "$labels." in annotations["description"] or name in {"VllmHeadroomExporterAbsent"}, (
        "the description should name what it is about"
    )
    if name in WINDOW_IS_THE_WAIT:
        assert rule["for"] == "0s"
        assert "[2m]" in rule["expr"]
    else:
        assert re.fullmatch(r"\d+[mh]", rule["for"]), "every alert waits a little"


def test_recording_rule_names_follow_level_metric_operations() -> None:
    """Recorded series are ``headroom:<level_metric>:<operations>``: three colon-separated parts."""
    for name in RECORDED:
        parts = name.split(":")
        assert parts[0] == "headroom", name
        assert len(parts) == 3, name
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", part) for part in parts), name


def test_alert_expressions_hold_no_literal_tunables() -> None:
    """Outside the thresholds group the only numbers written are 0 and 1 (facts, not tunables)."""
    for group, rule in _rules(DOCUMENT):
        if group == THRESHOLD_GROUP:
            continue
        literals = set(number_literals(rule["expr"]))
        assert literals <= {"0", "1"}, rule.get("alert") or rule["record"]


def test_the_literal_check_sees_a_hidden_tunable() -> None:
    """A threshold written into an expression is caught; windows and offsets are not."""
    assert number_literals("rate(x[5m] offset 1d) > 0.05") == ["0.05"]
    assert number_literals("predict_linear(x[30m], 3600) >= y") == ["3600"]


# --------------------------------------------------------------------------- thresholds


def test_every_threshold_is_one_labelless_vector_with_a_number() -> None:
    """The chart's contract: each threshold is ``vector(<number>)``, nothing else."""
    thresholds = _thresholds(DOCUMENT)
    assert thresholds
    for name, expr in thresholds.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name)
        if name in OPTIONAL_THRESHOLDS:
            assert expr.strip() == UNSET, f"{name}: unset by default, got {expr!r}"
            continue
        value = re.fullmatch(r"vector\(([-+]?[0-9.]+(?:e[-+]?\d+)?)\)", expr.strip())
        assert value, f"{name}: {expr!r}"
        float(value.group(1))


def test_every_threshold_is_read_by_an_alert_and_guarded_by_the_meta_alert() -> None:
    """Each threshold is read by a rule, each reference resolves, and the meta-alert guards all."""
    defined = set(_thresholds(DOCUMENT))
    referenced: set[str] = set()
    for group, rule in _rules(DOCUMENT):
        if group == THRESHOLD_GROUP or rule.get("alert") == META_ALERT:
            continue
        referenced |= {
            n.removeprefix(THRESHOLD_PREFIX)
            for n in metric_names(rule["expr"])
            if n.startswith(THRESHOLD_PREFIX)
        }
    assert referenced == defined
    guarded = {
        n.removeprefix(THRESHOLD_PREFIX)
        for n in metric_names(ALERTS[META_ALERT]["expr"])
        if n.startswith(THRESHOLD_PREFIX)
    }
    assert guarded == defined
    labels = set(re.findall(r'"threshold", "([a-z0-9_]+)"', ALERTS[META_ALERT]["expr"]))
    assert labels == defined, "each absent() must be labelled with its own threshold"


def _override(
    document: dict[str, Any],
    *,
    thresholds: dict[str, float] | None = None,
    drop_thresholds: bool = False,
    alerts: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A copy of the rule file with overrides applied by rule name, as the Helm chart does."""
    out = copy.deepcopy(document)
    for group in out["groups"]:
        if group["name"] == THRESHOLD_GROUP and drop_thresholds:
            group["rules"] = []
        for rule in group["rules"]:
            name = rule.get("record", "").removeprefix(THRESHOLD_PREFIX)
            if thresholds and name in thresholds:
                rule["expr"] = f"vector({thresholds[name]})"
            for key, value in (alerts or {}).get(rule.get("alert", ""), {}).items():
                if key == "severity":
                    rule["labels"]["severity"] = value
                else:
                    rule[key] = value
    return out


def _promtool_test(
    promtool: Path, tmp_path: Path, rules: dict[str, Any], tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    suite = {"rule_files": ["rules.yml"], "evaluation_interval": "30s", "tests": tests}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return _run([promtool, "test", "rules", "test.yml"], cwd=tmp_path)


#: A leak of 0.1 preemptions/s at 0.1 per finished request, sampled every 30 s (fires with the
#: defaults through the sustained branch: pending at 3m, firing at 4m).
SPIKE_SERIES = [
    {
        "series": 'vllm:num_preemptions_total{job="vllm",instance="a:8000",model_name="m"}',
        "values": "0+3x40",
    },
    {
        "series": 'vllm:request_success_total{job="vllm",instance="a:8000",model_name="m"}',
        "values": "0+30x40",
    },
]


def _spike_case(eval_time: str, severity: str | None) -> dict[str, Any]:
    labels = {"job": "vllm", "instance": "a:8000", "model_name": "m"}
    expected = [] if severity is None else [{"exp_labels": {**labels, "severity": severity}}]
    return {
        "eval_time": eval_time,
        "alertname": "VllmHeadroomPreemptionSpike",
        "exp_alerts": expected,
    }


def _without_annotations(document: dict[str, Any]) -> dict[str, Any]:
    # promtool compares annotations too; these tests are about labels, thresholds and timing.
    out = copy.deepcopy(document)
    for _, rule in _rules(out):
        rule.pop("annotations", None)
    return out


def test_a_missing_threshold_fires_the_meta_alert_naming_it(promtool: Path, tmp_path: Path) -> None:
    """Without its thresholds the meta-alert fires per threshold while the spike goes unseen."""
    rules = _without_annotations(_override(DOCUMENT, drop_thresholds=True))
    missing = sorted(set(_thresholds(DOCUMENT)) - OPTIONAL_THRESHOLDS)  # unset is their default
    expected = [{"exp_labels": {"severity": "warning", "threshold": name}} for name in missing]
    tests = [
        {
            "interval": "30s",
            "input_series": SPIKE_SERIES,
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": META_ALERT, "exp_alerts": []},
                {"eval_time": "15m", "alertname": META_ALERT, "exp_alerts": expected},
                _spike_case("15m", None),
            ],
        }
    ]
    done = _promtool_test(promtool, tmp_path, rules, tests)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_threshold_recorded_twice_fires_the_meta_alert(promtool: Path, tmp_path: Path) -> None:
    """A second rule recording one threshold (scalar() is NaN then too) fires the meta-alert."""
    rules = _without_annotations(DOCUMENT)
    [group] = [g for g in rules["groups"] if g["name"] == THRESHOLD_GROUP]
    group["rules"].append(
        {
            "record": f"{THRESHOLD_PREFIX}stale_seconds",
            "expr": "vector(60)",
            "labels": {"source": "my-override"},
        }
    )
    expected = [{"exp_labels": {"severity": "warning", "threshold": "stale_seconds"}}]
    tests = [
        {
            "interval": "30s",
            "input_series": SPIKE_SERIES,
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": META_ALERT, "exp_alerts": expected}
            ],
        }
    ]
    done = _promtool_test(promtool, tmp_path, rules, tests)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_objective_given_as_a_percentage_fires_the_meta_alert(
    promtool: Path, tmp_path: Path
) -> None:
    """99.9 for 99.9% (a negative budget that no burn rate can exceed) fires the meta-alert."""
    rules = _without_annotations(_override(DOCUMENT, thresholds={"slo_error_objective": 99.9}))
    expected = [{"exp_labels": {"severity": "warning", "threshold": "slo_error_objective"}}]
    tests = [
        {
            "interval": "30s",
            "input_series": SPIKE_SERIES,
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": META_ALERT, "exp_alerts": expected}
            ],
        }
    ]
    done = _promtool_test(promtool, tmp_path, rules, tests)
    assert done.returncode == 0, done.stdout + done.stderr


def test_overrides_applied_by_rule_name_change_threshold_for_and_severity(
    promtool: Path, tmp_path: Path
) -> None:
    """A replaced vector() silences the leak; a longer for and a severity make it a late warning."""
    defaults = _without_annotations(DOCUMENT)
    raised = _without_annotations(_override(DOCUMENT, thresholds={"preemptions_per_second": 1}))
    delayed = _without_annotations(
        _override(
            DOCUMENT,
            alerts={"VllmHeadroomPreemptionSpike": {"for": "10m", "severity": "warning"}},
        )
    )
    # The leak is pending from 3m (the 5m rate, the 5m ratio and 2 minutes of the 2m rate at
    # their thresholds), so it fires from 4m with the default for of 1m, from 13m with 10m.
    cases = [
        (defaults, [_spike_case("3m30s", None), _spike_case("4m", "critical")]),
        (raised, [_spike_case("15m", None)]),
        (delayed, [_spike_case("12m30s", None), _spike_case("13m", "warning")]),
    ]
    for index, (rules, expected) in enumerate(cases):
        workdir = tmp_path / str(index)
        workdir.mkdir()
        tests = [{"interval": "30s", "input_series": SPIKE_SERIES, "alert_rule_test": expected}]
        done = _promtool_test(promtool, workdir, rules, tests)
        assert done.returncode == 0, f"case {index}: {done.stdout}{done.stderr}"


# ----------------------------------------------------------------------------- runbooks


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_every_alert_has_a_runbook_page_that_links_back(name: str) -> None:
    """docs/runbooks/<alert>.md links to the rules and the index and has the agreed sections."""
    page = _runbook(name)
    assert page.startswith(f"# {name}\n")
    assert "](../../alerts/vllm-headroom.rules.yml)" in page
    assert "](README.md)" in page
    positions = [page.find(f"\n## {title}") for title in RUNBOOK_SECTIONS]
    assert all(p >= 0 for p in positions), dict(zip(RUNBOOK_SECTIONS, positions, strict=True))
    assert positions == sorted(positions)
    severity = ALERTS[name]["labels"]["severity"]
    assert f"`{severity}`" in _section(page, "Threshold")
    assert f"`{ALERTS[name]['for']}`" in _section(page, "Threshold")
    assert "vllm-headroom check" in _section(page, "Confirm") or name in {
        "VllmHeadroomExporterAbsent",
        "VllmHeadroomTargetDown",
        "VllmHeadroomThresholdMissing",
        "VllmHeadroomVllmNotScraped",
    }


@pytest.mark.parametrize(
    "name", sorted(n for n, rule in ALERTS.items() if rule["labels"]["severity"] == "critical")
)
def test_every_page_names_the_harm_it_predicts_and_why_it_cannot_wait(name: str) -> None:
    """A critical alert wakes someone: its runbook says, before anything else, why it must."""
    header = _runbook(name).split("\n## ", 1)[0]
    assert "**Harm, and why now:**" in header


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_runbooks_state_the_real_default_of_each_threshold_their_alert_reads(name: str) -> None:
    """Each threshold an alert reads appears in its runbook as `name` = `default` from the file.

    So does its keep_firing_for, where it has one (the runbook says why it resolves late).
    """
    section = _section(_runbook(name), "Threshold")
    defaults = _threshold_defaults()
    read = {
        n.removeprefix(THRESHOLD_PREFIX)
        for n in _expr_names(ALERTS[name])
        if n.startswith(THRESHOLD_PREFIX)
    }
    if name == META_ALERT:
        read = set()  # it watches them all; the index lists them
    for threshold in read:
        assert f"`{THRESHOLD_PREFIX}{threshold}` = `{defaults[threshold]}`" in section, threshold
    if "keep_firing_for" in ALERTS[name]:
        assert f"`keep_firing_for` = `{ALERTS[name]['keep_firing_for']}`" in section


@pytest.mark.parametrize("name", sorted(CAPACITY_ALERTS))
def test_capacity_runbooks_give_the_fixes_in_order(name: str) -> None:
    """Scale out, max-num-seqs, utilization, max-model-len, FP8 KV cache, tensor parallelism."""
    fixes = _section(_runbook(name), "Fix")
    positions = []
    for label, pattern in CAPACITY_FIXES:
        match = re.search(pattern, fixes)
        assert match, f"{name}: the fixes do not mention {label}"
        positions.append(match.start())
    assert positions == sorted(positions), f"{name}: fixes out of order"


def _exposed_limits() -> set[str]:
    """The limits the sidecar's one-hot ``*_limited_by`` gauges name in our golden expositions."""
    found: set[str] = set()
    for path in GOLDENS:
        text = path.read_text(encoding="utf-8")
        found |= set(re.findall(r'^headroom_p95_\w+_limited_by\{[^}]*limit="(\w+)"', text, re.M))
    return found


def test_runbooks_say_what_to_change_for_every_limit_the_exporter_names() -> None:
    """VllmHeadroomLow's fixes and the index's levers name each limit (and prefix sharing)."""
    exposed = _exposed_limits()
    assert {"kv_cache", "max_num_seqs", "engine_asleep"} <= exposed
    fixes = _section(_runbook("VllmHeadroomLow"), "Fix")
    index = (RUNBOOKS / "README.md").read_text(encoding="utf-8")
    levers = _section(index, "The capacity levers")
    for limit in exposed:
        assert f"**`{limit}`**" in fixes, f"VllmHeadroomLow: no fix for {limit}"
        assert f"| `{limit}` |" in levers, f"the capacity levers: no row for {limit}"
    for words in (
        "[Pp]refix-friendly prompts",
        "[Pp]refix-aware",
        "FP8 KV cache",
        "--max-num-seqs",
    ):
        assert re.search(words, levers), words
    assert re.search(r"[Pp]refix-friendly prompts", fixes)


def test_the_max_num_seqs_runbook_raises_the_limit_first_and_prices_it_with_plan() -> None:
    """Its first fix raises --max-num-seqs, priced with plan's what-if, capped by the KV figure."""
    fixes = _section(_runbook("VllmHeadroomMaxNumSeqsBinding"), "Fix")
    first = fixes.split("\n2. ", 1)[0]
    assert "**Raise `--max-num-seqs`**" in first
    assert re.search(r"vllm-headroom plan [^`]*--max-num-seqs", first, re.S)
    assert "headroom_p95_kv_ceiling_sequences" in first, "raise it towards the KV figure"


def test_the_admission_runbook_names_the_flag_of_each_cap_that_refuses() -> None:
    """Each reason vLLM refuses with is a row of the meaning and a fix raising its own flag.

    The alert's description makes the flag from the reason (``--`` and ``_`` as ``-``), as the
    runbook's table does.
    """
    page = _runbook("VllmHeadroomAdmissionRejections")
    meaning, fixes = _section(page, "Meaning"), _section(page, "Fix")
    description = ALERTS["VllmHeadroomAdmissionRejections"]["annotations"]["description"]
    assert "headroom_admission_rejections_by_reason_per_second" in description
    assert '--{{ reReplaceAll "_" "-" $s.Labels.reason }}' in description
    for reason in AdmissionReason:
        flag = "--" + reason.replace("_", "-")
        assert re.search(rf"^\| `{reason}` \| [^|]+ \| `{flag}` \|$", meaning, re.M), reason
        assert f'`reason="{reason}"`: **`{flag}`**' in fixes, reason


def test_the_index_documents_why_alerts_use_the_conservative_figures() -> None:
    """The index says why alerts read the conservative figures; VllmHeadroomLow says it too."""
    index = (RUNBOOKS / "README.md").read_text(encoding="utf-8")
    why = _section(index, "Conservative figures, not the effective ones")
    meaning = _section(_runbook("VllmHeadroomLow"), "Meaning")
    for text in (why, meaning):
        assert "**conservative**" in text
        assert "headroom_p95_available_sequences" in text
        assert "headroom_p95_effective_available_sequences" in text


def _panel_titles(node: Any) -> set[str]:
    if isinstance(node, dict):
        titles = {node["title"]} if "title" in node and "type" in node else set()
        return titles.union(*(_panel_titles(child) for child in node.get("panels", [])))
    return set()


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_runbook_headers_name_dashboard_panels_that_exist(name: str) -> None:
    """The panels and rows a runbook's header points to are titles in the checked-in dashboards."""
    header = _runbook(name).split("\n## ", 1)[0]
    pointed = re.findall(r'"([^"]+)"', header.split("Dashboard:", 1)[1])
    titles = set().union(*(_panel_titles(json.loads(path.read_text())) for path in DASHBOARD_FILES))
    assert set(pointed) <= titles


def test_runbook_pages_match_the_alerts_one_to_one() -> None:
    """No page for an alert that does not exist, none missing."""
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == set(ALERTS)


def test_the_index_links_every_page_and_documents_every_threshold_default() -> None:
    """The index links each page and lists each threshold with the rule file's real default."""
    index = (RUNBOOKS / "README.md").read_text(encoding="utf-8")
    for name in ALERTS:
        assert f"]({name}.md)" in index, name
    rows = dict(re.findall(r"^\| `headroom:threshold:([a-z0-9_]+)` \| `([^`]+)` \|", index, re.M))
    assert rows == _threshold_defaults()


# ----------------------------------------------------------------------------- the lexer


def test_metric_names_rejects_what_it_cannot_read() -> None:
    """A regex on __name__ cannot be proven against exposition: it is refused, not skipped."""
    with pytest.raises(PromQLSyntaxError):
        metric_names('{__name__=~"headroom_.+"}')


# ------------------------------------------------------------------------ time to page

#: Spike shapes for the time-to-page table of the VllmHeadroomPreemptionSpike runbook: (row
#: name, preemptions per second in each 30 s scrape interval after the onset, finished requests
#: per second). Ten idle minutes come first; the onset is the first interval that preempts.
PAGE_SHAPES: list[tuple[str, list[float], float]] = [
    ("spike of 1/s, sustained", [1.0] * 24, 10.0),
    ("spike of 0.5/s, sustained", [0.5] * 24, 10.0),
    ("0.2/s, sustained", [0.2] * 24, 1.0),
    ("slow leak of 0.1/s", [0.1] * 24, 1.0),
    ("slow leak of 0.06/s", [0.06] * 24, 1.0),
    ("0.05/s, exactly the threshold", [0.05] * 24, 1.0),
    ("0.04/s, below the threshold", [0.04] * 24, 1.0),
    ("one burst of 10", [10 / 30] + [0.0] * 23, 1.0),
    ("one burst of 300", [300 / 30] + [0.0] * 23, 1.0),
    ("two bursts of 20, a minute apart", [20 / 30, 0.0, 20 / 30] + [0.0] * 21, 1.0),
    ("one minute at 1/s, then none", [1.0, 1.0] + [0.0] * 22, 10.0),
]
#: What the issue asks: a sustained 1/s spike within 2 minutes, a slow leak (0.1/s, twice the
#: threshold) within 5, and never a single burst.
PAGE_WITHIN = {"spike of 1/s, sustained": 120, "slow leak of 0.1/s": 300}
NEVER_PAGE = {"one burst of 10", "one burst of 300", "two bursts of 20, a minute apart"}

_STEP = 30
_IDLE_STEPS = 20


def _seconds(duration: str) -> int:
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", duration))


def _counter(per_second: list[float], idle: float = 0.0) -> str:
    """A counter's samples: ``idle`` per second for the idle steps, then ``per_second``."""
    values, total = [0.0], 0.0
    for rate in [idle] * _IDLE_STEPS + per_second:
        total += rate * _STEP
        values.append(total)
    return " ".join(f"{v:g}" for v in values)


def _time_to_page(
    promtool: Path, workdir: Path, per_second: list[float], finished: float
) -> int | None:
    """Seconds from the onset to the first evaluation at which the alert fires (None: never).

    Every evaluation from the onset on expects silence; promtool names the times that fired.
    """
    steps = len(per_second)
    labels = 'job="vllm",instance="a:8000",model_name="m"'
    series = [
        {"series": f"vllm:num_preemptions_total{{{labels}}}", "values": _counter(per_second)},
        {
            "series": f'vllm:request_success_total{{{labels},finished_reason="stop"}}',
            "values": _counter([finished] * steps, idle=finished),
        },
    ]
    onset = _IDLE_STEPS * _STEP
    cases = [
        {"eval_time": f"{t}s", "alertname": "VllmHeadroomPreemptionSpike", "exp_alerts": []}
        for t in range(onset, onset + steps * _STEP + 1, _STEP)
    ]
    workdir.mkdir()
    done = _promtool_test(
        promtool,
        workdir,
        _without_annotations(DOCUMENT),
        [{"interval": f"{_STEP}s", "input_series": series, "alert_rule_test": cases}],
    )
    fired = [_seconds(t) for t in re.findall(r"time: ([0-9hms]+),", done.stdout + done.stderr)]
    assert done.returncode == (1 if fired else 0), done.stdout + done.stderr
    return min(fired) - onset if fired else None


def _page_table() -> dict[str, str]:
    """The time-to-page table of the VllmHeadroomPreemptionSpike runbook: shape -> cell."""
    section = _section(_runbook("VllmHeadroomPreemptionSpike"), "Time to page")
    rows = re.findall(r"^\| ([^|]+?) \| [^|]+ \| [^|]+ \| ([^|]+?) \|$", section, re.M)
    return dict(rows[2:])  # after the header and its rule


def _cell(seconds: int | None) -> str:
    if seconds is None:
        return "never"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def test_time_to_page_for_spike_shapes_is_measured_and_written_in_the_runbook(
    promtool: Path, tmp_path: Path
) -> None:
    """promtool measures each shape's time to page; the runbook's table says the same.

    A sustained 1/s spike pages within 2 minutes, a 0.1/s leak within 5, no single burst ever;
    30 s scrape and evaluation intervals (the chart's), Prometheus 2's promtool.
    """
    measured = {
        name: _time_to_page(promtool, tmp_path / str(index), rates, finished)
        for index, (name, rates, finished) in enumerate(PAGE_SHAPES)
    }
    for name, limit in PAGE_WITHIN.items():
        seconds = measured[name]
        assert seconds is not None, name
        assert seconds <= limit, (name, seconds)
    for name in NEVER_PAGE:
        assert measured[name] is None, (name, measured[name])
    assert _page_table() == {name: _cell(seconds) for name, seconds in measured.items()}


# ------------------------------------------------------------------- one page per incident


def _fired(output: str) -> dict[str, set[int]]:
    """promtool's failures of cases that expected silence: alert name -> seconds it fired at."""
    found: dict[str, set[int]] = {}
    for name, when in re.findall(r"alertname: (\w+), time: ([0-9hms]+),", output):
        found.setdefault(name, set()).add(_seconds(when))
    return found


def test_the_capacity_page_outlasts_the_slow_first_tokens_it_caused(
    promtool: Path, tmp_path: Path
) -> None:
    """While the TTFT SLO page fires, so does the preemption page whose page group it joins.

    After six healthy hours (the SLO's longest window), fifteen minutes of preemptions at 1/s
    with every first token slow, then healthy traffic again: the TTFT SLO's 5-minute window
    keeps the slow tokens for minutes after the preemptions stop. The preemption page's
    keep_firing_for holds it active meanwhile, so the symptom page joins the model's open page
    group instead of paging a second time as the incident ends; it resolves after.
    """
    labels = 'job="vllm",instance="a:8000",model_name="m"'
    # Steps of 30 s: 6 h healthy, 15 min of the incident, 20 min after.
    onset, length, total = 720, 30, 790
    burst = [1.0 if onset <= i < onset + length else 0.0 for i in range(total)]
    fast = [0.0 if onset <= i < onset + length else 5.0 for i in range(total)]

    def counter(per_second: list[float]) -> str:
        values, sum_ = [0.0], 0.0
        for rate in per_second:
            sum_ += rate * _STEP
            values.append(sum_)
        return " ".join(f"{v:g}" for v in values)

    series = [
        {"series": f"vllm:num_preemptions_total{{{labels}}}", "values": counter(burst)},
        {
            "series": f'vllm:request_success_total{{{labels},finished_reason="stop"}}',
            "values": counter([10.0] * total),
        },
        {
            "series": f'vllm:time_to_first_token_seconds_bucket{{{labels},le="2.5"}}',
            "values": counter(fast),
        },
        {
            "series": f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}}',
            "values": counter([5.0] * total),
        },
        {
            "series": f"vllm:time_to_first_token_seconds_count{{{labels}}}",
            "values": counter([5.0] * total),
        },
    ]
    alerts = ("VllmHeadroomPreemptionSpike", "VllmHeadroomTtftBudgetBurn")
    cases = [
        {"eval_time": f"{t}s", "alertname": name, "exp_alerts": []}
        for t in range(onset * _STEP, total * _STEP + 1, _STEP)
        for name in alerts
    ]
    done = _promtool_test(
        promtool,
        tmp_path,
        _without_annotations(_override(DOCUMENT, thresholds={"slo_ttft_objective": 0.99})),
        [{"interval": f"{_STEP}s", "input_series": series, "alert_rule_test": cases}],
    )
    fired = _fired(done.stdout + done.stderr)
    page, symptom = (fired.get(name, set()) for name in alerts)
    end = (onset + length) * _STEP
    assert page, done.stdout
    assert {t for t in symptom if t > end}, "the symptom should outlast the cause (else: no test)"
    assert symptom <= page, f"the TTFT page fires unmuted at {sorted(symptom - page)} s"
    assert max(page) < total * _STEP, "the preemption page never resolved"


# ------------------------------------------------------------------------ Alertmanager

ALERTMANAGER_EXAMPLE = REPO / "alerts" / "alertmanager" / "vllm-headroom.yml"
RECEIVER_BY_SEVERITY = {
    "critical": "vllm-headroom-page",
    "warning": "vllm-headroom-ticket",
    "info": "vllm-headroom-none",
}


@pytest.fixture(scope="module")
def amtool() -> Path:
    """amtool beside Debian's alertmanager (the cache's, else PATH's)."""
    return require(alertmanager_binary).parent / "amtool"


def test_the_alertmanager_example_passes_amtool(amtool: Path) -> None:
    """amtool check-config accepts the shipped routing and inhibition example."""
    done = _run([amtool, "check-config", ALERTMANAGER_EXAMPLE])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 inhibit rules" in done.stdout


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_the_example_routes_every_alert_by_its_severity(amtool: Path, name: str) -> None:
    """Each alert, with the labels the chart gives it, reaches the receiver of its severity."""
    severity = ALERTS[name]["labels"]["severity"]
    labels = [f"alertname={name}", f"severity={severity}", "namespace=llm", "pod=llm-0"]
    done = _run(
        [amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_EXAMPLE}", *labels]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == [RECEIVER_BY_SEVERITY[severity]]


@pytest.mark.parametrize(
    "labels",
    [
        ["alertname=KubePodCrashLooping", "severity=critical", "namespace=llm", "pod=llm-0"],
        ["alertname=KubePodCrashLooping", "severity=warning", "namespace=llm"],
        ["alertname=Watchdog", "severity=none"],
        ["alertname=NodeFilesystemAlmostOutOfSpace", "severity=info", "model_name=llama"],
    ],
)
def test_the_example_leaves_alerts_that_are_not_ours_to_the_users_tree(
    amtool: Path, labels: list[str]
) -> None:
    """Another alert, whatever its severity or labels, takes the user's default receiver only."""
    done = _run(
        [amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_EXAMPLE}", *labels]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["default"]


# ------------------------------------------------------------------- applying a fix

DEPLOYERS = REPO / "tests" / "fixtures" / "deployers"
#: Runbooks whose fixes are vLLM arguments or replicas: each links the deployers' table.
FIX_BY_DEPLOYER = CAPACITY_ALERTS | LIMIT_ALERTS


def _tar_text(path: Path, suffix: str) -> str:
    import tarfile

    with tarfile.open(path) as tar:
        parts = []
        for member in tar.getmembers():
            if member.name.endswith(suffix):
                extracted = tar.extractfile(member)
                assert extracted is not None
                parts.append(extracted.read().decode())
    return "\n".join(parts)


@pytest.mark.parametrize("name", sorted(FIX_BY_DEPLOYER))
def test_runbook_fixes_link_how_to_apply_them_with_each_deployer(name: str) -> None:
    """Every capacity fix section points to the table of where each fix goes."""
    assert "(README.md#applying-a-fix)" in _section(_runbook(name), "Fix")


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_every_runbook_says_when_and_to_whom_to_escalate(name: str) -> None:
    """An Escalation section, linking the general policy of the index."""
    assert "(README.md#escalation)" in _section(_runbook(name), "Escalation")


def test_the_deployers_fields_in_the_fix_table_exist_in_their_charts() -> None:
    """Each values field the table names is one the deployer's own chart or CRD reads."""
    index = (RUNBOOKS / "README.md").read_text(encoding="utf-8")
    table = _section(index, "Applying a fix")
    stack = _tar_text(DEPLOYERS / "vllm-stack-0.1.12.tgz", "deployment-vllm-multi.yaml")
    stack += _tar_text(DEPLOYERS / "vllm-stack-0.1.12.tgz", "_helpers.tpl")
    for key in re.findall(r"`vllmConfig\.(\w+)", table):
        assert re.search(rf'hasKey \. "{key}"|\.{key}\b', stack), key
    assert "replicaCount" in stack
    assert "requestGPU" in stack
    modelservice = yaml.safe_load(
        _tar_text(DEPLOYERS / "llm-d-modelservice-v0.4.12.tgz", "llm-d-modelservice/values.yaml")
    )
    assert "tensor" in modelservice["decode"]["parallelism"]
    assert "replicas" in modelservice["decode"]
    assert "containers" in modelservice["decode"]
    import gzip

    crd = yaml.safe_load(
        gzip.decompress((DEPLOYERS / "serving.kserve.io_inferenceservices.yaml.gz").read_bytes())
    )
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    predictor = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "predictor"
    ]["properties"]
    assert {"minReplicas", "maxReplicas", "model"} <= set(predictor)
    assert "args" in predictor["model"]["properties"]
    chart = yaml.safe_load((REPO / "helm" / "vllm-headroom" / "values.yaml").read_text())
    assert {"args", "replicas", "resources"} <= set(chart["vllm"])
    for fix in ("--max-num-seqs", "--gpu-memory-utilization", "--max-model-len", "fp8"):
        assert fix in table, fix
