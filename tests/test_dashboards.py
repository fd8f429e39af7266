"""Specification of the Grafana dashboards: generated, valid, proven against real series.

No Grafana server can be installed here, so everything Grafana would check on import is checked
on the JSON model instead: structure, data source references, unique panel ids, a grid without
overlaps, defined variables, units, thresholds and descriptions on every panel. Every metric name
of every query (panels, variables, annotations) is found by parsing the PromQL
(``tests/promql.py``) and proven to exist in real exposition: our sidecar's goldens, the real
vLLM captures, or a recording rule of ``alerts/``. Panel thresholds are proven equal to the
alert defaults read independently from the rule file.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dashboards import fleet, generate, instance, limits
from dashboards.queries import SCHEDULER_LIMITS
from dashboards.rules import RuleFacts, RulesFileError, load_rules, parse_rules
from dashboards.templating import expand, prometheus_regex_escape, referenced_variables
from dashboards.widgets import (
    GRID_COLUMNS,
    Bad,
    Cell,
    Limit,
    Query,
    Row,
    Static,
    place,
    stat_panel,
    state_timeline_panel,
    threshold_steps,
)
from tests import paths
from tests.conftest import CAPTURES
from tests.promql import metric_names

if TYPE_CHECKING:
    from pathlib import Path

ROOT = paths.REPO
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "alerts" / "vllm-headroom.rules.yml"
RUNBOOKS = ROOT / "docs" / "runbooks"
GOLDEN = paths.GOLDEN / "exposition"
UIDS = {"vllm-headroom-fleet", "vllm-headroom-instance"}

#: Series Prometheus itself synthesises (not exposed by any target): the alert state series and
#: the scrape health of every target.
PROMETHEUS_SERIES = {"ALERTS", "ALERTS_FOR_STATE", "up"}
#: Grafana's unit ids we use, plus its parametric units (``count:<unit>``: K/M/B-scaled count
#: with a suffix; ``suffix:<text>``: a fixed suffix), from Grafana's valueFormats.
GRAFANA_UNITS = {"short", "none", "bytes", "percentunit", "s", "reqps", "dateTimeFromNow"}
PARAMETRIC_UNITS = ("count:", "suffix:")
#: Grafana's built-in variables our queries use.
BUILTIN_VARIABLES = {"__rate_interval", "__range", "__interval"}


# ----------------------------------------------------------------------------- helpers


def _load(uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / f"{uid}.json").read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    """Both checked-in dashboards by uid."""
    return {uid: _load(uid) for uid in UIDS}


@pytest.fixture(scope="module")
def facts() -> RuleFacts:
    """The real rule file, parsed by the generator's own reader."""
    return load_rules(RULES)


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows included (rows are not collapsed: their panels follow at top level)."""
    out: list[dict[str, Any]] = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _visuals(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _panels(board) if p["type"] != "row"]


def _panel(board: dict[str, Any], title: str, kind: str | None = None) -> dict[str, Any]:
    found = [p for p in _visuals(board) if p["title"] == title and kind in (None, p["type"])]
    assert len(found) == 1, f"{len(found)} panels titled {title!r}"
    return found[0]


def _queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel query and annotation of a dashboard."""
    out = [
        (f"panel {p['title']!r} {t['refId']}", t["expr"])
        for p in _visuals(board)
        for t in p.get("targets", [])
    ]
    out += [(f"annotation {a['name']!r}", a["expr"]) for a in board["annotations"]["list"]]
    return out


def _variable_selectors(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, series selector) of every ``label_values(<selector>, <label>)`` variable."""
    out = []
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"], re.DOTALL)
        assert match, f"variable {variable['name']}: {variable['query']!r}"
        out.append((f"variable {variable['name']!r}", match[1]))
    return out


def _exposed_names() -> set[str]:
    """Every series name in our goldens and the real vLLM captures (samples and TYPE lines)."""
    names: set[str] = set()
    files = sorted(GOLDEN.glob("*.prom")) + sorted(CAPTURES.glob("*.prom"))
    assert len(files) >= 10, files
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            typed = re.match(r"# TYPE (\S+) (\w+)", line)
            if typed:
                name, kind = typed[1], typed[2]
                names.add(name)
                if kind in {"histogram", "summary"}:
                    names |= {f"{name}_sum", f"{name}_count"}
                if kind == "histogram":
                    names.add(f"{name}_bucket")
            elif line and not line.startswith("#"):
                sample = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line)
                if sample:
                    names.add(sample[0])
    return names


def _rule_defaults() -> dict[str, float]:
    """Threshold defaults read straight from the rule file (independently of the generator)."""
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    [group] = [g for g in document["groups"] if g["name"] == "vllm-headroom-thresholds"]
    out = {}
    for rule in group["rules"]:
        if rule["expr"].strip() == "absent(vector(0))":
            continue  # unset by default (the SLO objectives): no panel draws it
        value = re.fullmatch(r"vector\((.+)\)", rule["expr"].strip())
        assert value, rule
        out[rule["record"].removeprefix("headroom:threshold:")] = float(value[1])
    return out


def _colour_at(steps: list[dict[str, Any]], value: float) -> str:
    """The colour Grafana gives ``value``: the last step whose value is at most ``value``."""
    colour = steps[0]["color"]
    for step in steps[1:]:
        if value >= step["value"]:
            colour = step["color"]
    return str(colour)


def _field_thresholds(panel: dict[str, Any], column: str | None) -> list[dict[str, Any]]:
    if column is None:
        steps: list[dict[str, Any]] = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        return steps
    for override in panel["fieldConfig"]["overrides"]:
        if override["matcher"] == {"id": "byName", "options": column}:
            for prop in override["properties"]:
                if prop["id"] == "thresholds":
                    found: list[dict[str, Any]] = prop["value"]["steps"]
                    return found
    raise AssertionError(f"no thresholds for column {column!r} of {panel['title']!r}")


def _units(panel: dict[str, Any]) -> list[str]:
    units = [panel["fieldConfig"]["defaults"].get("unit")]
    for override in panel["fieldConfig"]["overrides"]:
        units += [p["value"] for p in override["properties"] if p["id"] == "unit"]
    return units


# ----------------------------------------------------------------------------- generation


def test_checked_in_json_equals_what_the_code_generates(facts: RuleFacts) -> None:
    """Regenerating the dashboards from code and the rule file changes nothing."""
    files = generate.generate(facts)
    assert set(files) == {f"{uid}.json" for uid in UIDS}
    for name, text in files.items():
        assert (DASHBOARDS / name).read_text(encoding="utf-8") == text, (
            f"dashboards/{name} is stale: run python -m dashboards.generate"
        )


def test_generation_is_deterministic(facts: RuleFacts) -> None:
    """Two generations from the same rule facts produce byte-identical JSON."""
    assert generate.generate(facts) == generate.generate(facts)


def test_check_mode_passes_on_fresh_files_and_fails_on_stale_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check exits 0 on what it generated and 1, naming the file, after a file changed."""
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.main(["--out", str(tmp_path), "--check"]) == 0
    stale = tmp_path / "vllm-headroom-fleet.json"
    stale.write_text(stale.read_text(encoding="utf-8").replace("Fleet", "Fleat"))
    capsys.readouterr()
    assert generate.main(["--out", str(tmp_path), "--check"]) == 1
    assert "vllm-headroom-fleet.json is out of date" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read the alert rule file"),
        ("groups: [unclosed", "not valid YAML at line"),
        ("groups: []\n", "defines no alerts"),
        (
            "groups:\n- name: a\n  rules:\n  - alert: VllmHeadroomX\n    expr: up\n"
            "    labels: {severity: warning}\n    annotations: {runbook_url: https://x/VllmHeadroomX.md}\n",
            "the rule file defines no ",
        ),
    ],
)
def test_a_bad_rule_file_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, problem: str
) -> None:
    """A missing, malformed or incomplete rule file is one clear line on stderr and exit 2."""
    rules = tmp_path / "rules.yml"
    if content is not None:
        rules.write_text(content)
    assert generate.main(["--rules", str(rules), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert problem in err
    assert not list(tmp_path.glob("*.json"))


def test_panel_thresholds_follow_the_rule_file() -> None:
    """Changing a threshold's default in the rule file moves the panel threshold with it."""
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == "headroom:threshold:kv_saturation_ratio":
                rule["expr"] = "vector(0.42)"
    board = json.loads(generate.render(instance.build(parse_rules(document))))
    steps = _field_thresholds(_panel(board, "KV-cache usage"), None)
    assert [s["value"] for s in steps] == [None, 0.42]


# ----------------------------------------------------------------------------- the JSON model


def test_dashboards_have_stable_uids_titles_and_grafana_10_4_schema(
    boards: dict[str, dict[str, Any]],
) -> None:
    """Both uids exist, with a title, tags, a description and Grafana 10.4's schemaVersion 39."""
    assert set(boards) == UIDS
    for uid, board in boards.items():
        assert board["uid"] == uid
        assert board["schemaVersion"] == 39
        assert board["title"].startswith("vLLM headroom / ")
        assert board["description"]
        assert "vllm-headroom" in board["tags"]
        assert "id" not in board, "a provisioned dashboard must not carry a database id"


def test_variables_are_the_agreed_ones(boards: dict[str, dict[str, Any]]) -> None:
    """datasource, cluster, job, namespace, model, instance on both; engine, host on the drill."""
    names = {uid: [v["name"] for v in b["templating"]["list"]] for uid, b in boards.items()}
    assert names["vllm-headroom-fleet"] == [
        "datasource",
        "cluster",
        "job",
        "namespace",
        "model",
        "instance",
    ]
    assert names["vllm-headroom-instance"] == [
        "datasource",
        "cluster",
        "job",
        "namespace",
        "model",
        "instance",
        "host",
        "engine",
    ]
    for board in boards.values():
        [cluster] = [v for v in board["templating"]["list"] if v["name"] == "cluster"]
        # Single-cluster Prometheus has no cluster label: All must be .* (which matches the
        # empty value of a missing label), never the expansion of an empty list of values.
        assert cluster["includeAll"] is True
        assert cluster["allValue"] == ".*"
        assert cluster["current"]["value"] == "$__all"
    drill = {v["name"]: v for v in boards["vllm-headroom-instance"]["templating"]["list"]}
    assert drill["instance"]["multi"] is False, "the drill-down shows one instance"
    assert drill["host"]["hide"] == 2, "host is derived, not chosen"
    assert "allValue" not in drill["host"], "All must expand to the hosts, not to .*"


def test_every_datasource_reference_is_the_datasource_variable(
    boards: dict[str, dict[str, Any]],
) -> None:
    """Panels, queries, variables and annotations all query ${datasource} (a Prometheus)."""
    for board in boards.values():
        refs = []
        for panel in _visuals(board):
            refs.append(panel["datasource"])
            refs += [t["datasource"] for t in panel["targets"]]
        refs += [v["datasource"] for v in board["templating"]["list"] if v["type"] == "query"]
        refs += [a["datasource"] for a in board["annotations"]["list"]]
        assert refs
        assert all(ref == {"type": "prometheus", "uid": "${datasource}"} for ref in refs), refs
        [source] = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
        assert source["name"] == "datasource"
        assert source["query"] == "prometheus"


def test_panel_ids_are_unique(boards: dict[str, dict[str, Any]]) -> None:
    """No two panels (rows included) of a dashboard share an id."""
    for board in boards.values():
        ids = [p["id"] for p in _panels(board)]
        assert len(ids) == len(set(ids))
        assert all(isinstance(i, int) and i > 0 for i in ids)


def _assert_grid(panels: list[dict[str, Any]]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["w"] > 0, panel["title"]
        assert pos["h"] > 0, panel["title"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= GRID_COLUMNS, panel["title"]
        assert pos["y"] >= 0, panel["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"{panel['title']!r} overlaps another panel"
        cells |= mine


def test_grid_positions_fit_24_columns_without_overlap(boards: dict[str, dict[str, Any]]) -> None:
    """Every panel lies within the 24 columns and covers no cell another panel covers."""
    for board in boards.values():
        _assert_grid(_panels(board))


def test_every_panel_has_a_unit_thresholds_and_a_one_sentence_description(
    boards: dict[str, dict[str, Any]],
) -> None:
    """Units are Grafana's; thresholds start with a base step; descriptions are one sentence."""
    for board in boards.values():
        for panel in _visuals(board):
            title = panel["title"]
            description = panel.get("description", "")
            assert description.endswith("."), title
            assert not re.search(r"[.!?]\s", description), f"{title}: more than one sentence"
            for unit in _units(panel):
                assert unit in GRAFANA_UNITS or unit.startswith(PARAMETRIC_UNITS), (title, unit)
            steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert steps[0]["value"] is None, title
            values = [s["value"] for s in steps[1:]]
            assert values == sorted(values), title


def test_table_columns_are_renamed_and_each_has_a_unit(boards: dict[str, dict[str, Any]]) -> None:
    """Each table query's value column gets a header, and each header its own unit override."""
    for board in boards.values():
        for panel in _visuals(board):
            if panel["type"] != "table":
                continue
            [merge, organize] = panel["transformations"]
            assert merge["id"] == "merge"
            assert organize["id"] == "organize"
            renames = organize["options"]["renameByName"]
            values = [k for k in renames if k.startswith("Value")]
            assert len(values) == len(panel["targets"]), panel["title"]
            overridden = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]}
            for value in values:
                if not organize["options"]["excludeByName"].get(value):
                    assert renames[value] in overridden, (panel["title"], value)
            assert all(t["format"] == "table" and t["instant"] for t in panel["targets"])


def test_every_variable_a_query_uses_is_defined(boards: dict[str, dict[str, Any]]) -> None:
    """Queries, variable queries and links refer only to defined or built-in variables."""
    for board in boards.values():
        defined = {v["name"] for v in board["templating"]["list"]}
        texts = [expr for _, expr in _queries(board)]
        texts += [v["query"] for v in board["templating"]["list"]]
        used: set[str] = set()
        for text in texts:
            used |= referenced_variables(text)
        assert used - BUILTIN_VARIABLES <= defined, used - BUILTIN_VARIABLES - defined
        assert {"job", "namespace", "instance", "model"} <= used


def test_variables_are_defined_before_the_variables_that_use_them(
    boards: dict[str, dict[str, Any]],
) -> None:
    """A variable's query only uses variables listed above it (Grafana refreshes in order)."""
    for board in boards.values():
        seen: set[str] = set()
        for variable in board["templating"]["list"]:
            assert referenced_variables(variable.get("query", "")) <= seen, variable["name"]
            seen.add(variable["name"])


# ----------------------------------------------------------------------------- real series


def test_every_metric_name_exists_in_real_exposition(boards: dict[str, dict[str, Any]]) -> None:
    """Each name in each query is in our goldens, the vLLM captures, or a recording rule."""
    known = _exposed_names() | load_rules(RULES).recorded | PROMETHEUS_SERIES
    used: set[str] = set()
    for board in boards.values():
        for where, expr in _queries(board) + _variable_selectors(board):
            names = metric_names(expr)
            assert names, f"{where}: no metric in {expr!r}"
            assert names <= known, f"{where}: unknown {sorted(names - known)}"
            used |= names
    # Not vacuous: the dashboards read our series, vLLM's own, and both vLLM name generations.
    assert {"headroom_kv_capacity_tokens", "vllm:time_to_first_token_seconds_bucket"} <= used
    assert {"vllm:inter_token_latency_seconds_bucket"} <= used
    assert {"vllm:time_per_output_token_seconds_bucket"} <= used
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} <= used


def test_the_name_check_catches_a_misspelt_metric() -> None:
    """The exposition check would reject a counter without its _total (a classic mistake)."""
    known = _exposed_names()
    assert "vllm:num_preemptions_total" in known
    assert metric_names("rate(vllm:num_preemptions[5m])") - known == {"vllm:num_preemptions"}


def test_vllm_series_are_never_filtered_by_the_sidecars_job(
    boards: dict[str, dict[str, Any]],
) -> None:
    """vLLM's own series are matched by host and model, never by the sidecar's job."""
    for board in boards.values():
        for where, expr in _queries(board):
            for selector in re.findall(r"vllm:[a-z_:]+(\{[^}]*\})", expr):
                assert "$job" not in selector, where
                assert "$host" in selector, where


# ----------------------------------------------------------------------------- limits

#: A binding-limit query's terms: ``(<gauge>{..., limit="<limit>"} == 1) * <code>``.
_LIMIT_CODE = re.compile(r'limit="(\w+)"\} == 1\) \* (\d+)')


def _exposed_limits() -> set[str]:
    """The limits our goldens' one-hot ``headroom_p95_*_limited_by`` gauges name."""
    found: set[str] = set()
    for path in sorted(GOLDEN.glob("*.prom")):
        text = path.read_text(encoding="utf-8")
        found |= set(re.findall(r'^headroom_p95_\w+_limited_by\{[^}]*limit="(\w+)"', text, re.M))
    return found


def _mapping_texts(panel: dict[str, Any], ref_id: str) -> dict[str, str]:
    """Value -> text of the value mappings that apply to query ``ref_id`` of ``panel``."""
    mappings = panel["fieldConfig"]["defaults"].get("mappings", [])
    if panel["type"] == "table":
        [organize] = [x for x in panel["transformations"] if x["id"] == "organize"]
        header = organize["options"]["renameByName"][f"Value #{ref_id}"]
        [override] = [
            o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == header
        ]
        mappings = next(p["value"] for p in override["properties"] if p["id"] == "mappings")
    return {k: v["text"] for m in mappings for k, v in m["options"].items()}


def test_every_binding_limit_query_codes_each_limit_the_exporter_names(
    boards: dict[str, dict[str, Any]],
) -> None:
    """Each limit in real exposition gets a code, and the panel maps that code to its name."""
    exposed = _exposed_limits()
    assert exposed == {limit for limit, _, _ in SCHEDULER_LIMITS}
    texts = {limit: text for limit, text, _ in SCHEDULER_LIMITS}
    seen = 0
    for board in boards.values():
        for panel in _visuals(board):
            for target in panel.get("targets", []):
                codes = dict(_LIMIT_CODE.findall(target["expr"]))
                if not codes:
                    continue
                seen += 1
                assert set(codes) == exposed, (panel["title"], codes)
                mapped = _mapping_texts(panel, target["refId"])
                assert {limit: mapped[code] for limit, code in codes.items()} == texts
    # The instance's stat, ceiling stat and two timeline bands; the fleet table's column.
    assert seen == 5


def test_each_effective_figure_is_shown_beside_its_conservative_one(
    boards: dict[str, dict[str, Any]],
) -> None:
    """A panel that reads a shared-prefix (effective) figure also reads the conservative one.

    The alerts read the conservative figures; the effective ones are today's expectation, never
    to be read alone.
    """
    shown = 0
    for board in boards.values():
        for panel in _visuals(board):
            names = set().union(*(metric_names(t["expr"]) for t in panel.get("targets", [])))
            for name in {n for n in names if n.startswith("headroom_p95_effective_")}:
                shown += 1
                conservative = name.replace("_effective_", "_")
                assert conservative in names, (panel["title"], name)
    assert shown >= 5


def test_the_scheduler_limits_have_their_panels(boards: dict[str, dict[str, Any]]) -> None:
    """The binding limit, the ceilings, max_num_seqs by origin, sleep and refusals are shown."""
    board = boards["vllm-headroom-instance"]
    names_of = {
        p["title"]: set().union(*(metric_names(t["expr"]) for t in p["targets"]))
        for p in _visuals(board)
    }
    assert _panel(board, "Binding limit over time", "state-timeline")
    assert {
        "headroom_p95_ceiling_sequences",
        "headroom_p95_kv_ceiling_sequences",
        "headroom_p95_effective_ceiling_sequences",
        "headroom_max_num_seqs",
    } <= names_of["Ceiling: every limit, KV cache alone, shared prefixes"]
    [origin] = _panel(board, "max_num_seqs", "stat")["targets"]
    assert "{{origin}}" in origin["legendFormat"]
    assert names_of["Engine state"] == {"headroom_engine_asleep"}
    assert names_of["Requests refused at the queue limit"] == {
        "headroom_admission_rejections_per_second",
        "headroom_admission_rejections_by_reason_per_second",
    }
    [_, by_reason] = _panel(board, "Requests refused at the queue limit")["targets"]
    assert by_reason["legendFormat"] == "{{reason}}"  # the cap: the flag to raise
    [_, fleet_by_reason] = _panel(
        boards["vllm-headroom-fleet"], "Requests refused at the queue limit"
    )["targets"]
    assert fleet_by_reason["expr"].startswith("sum by (reason) (")
    assert metric_names(fleet_by_reason["expr"]) == {
        "headroom_admission_rejections_by_reason_per_second"
    }
    assert fleet_by_reason["legendFormat"] == "{{reason}}"
    assert {"headroom_sequences_running", "headroom_requests_running"} <= names_of[
        "Running sequences vs max_num_seqs"
    ]
    assert {"headroom_prefix_cache_hit_ratio"} == names_of["Prefix cache hit ratio"]
    assert {"headroom_prompt_tokens_cached_ratio"} == names_of[
        "Prompt tokens served from cache, by tier"
    ]


# ----------------------------------------------------------------------------- thresholds

FLEET, INSTANCE = "vllm-headroom-fleet", "vllm-headroom-instance"
ABOVE, BELOW, OUTSIDE = Bad.ABOVE, Bad.BELOW, Bad.OUTSIDE
INSTANCES, TOTALS = "Instances by model", "Fleet totals per model"

#: (dashboard, panel, table column or None, threshold of the rule file, bad side).
WIRING = [
    (FLEET, "Fleet headroom at p95 context, per model", None, "fleet_min_sequences", BELOW),
    (FLEET, INSTANCES, "KV usage", "kv_saturation_ratio", ABOVE),
    (FLEET, INSTANCES, "Headroom @p95", "headroom_min_sequences", BELOW),
    (FLEET, INSTANCES, "Headroom ratio", "headroom_min_ratio", BELOW),
    (FLEET, INSTANCES, "Preemptions", "preemptions_per_second", ABOVE),
    (FLEET, INSTANCES, "Prediction error", "capacity_drift_ratio", OUTSIDE),
    (FLEET, INSTANCES, "Foreign GPU memory", "gpu_foreign_memory_bytes", ABOVE),
    (FLEET, TOTALS, "Headroom @p95", "fleet_min_sequences", BELOW),
    (FLEET, TOTALS, "Headroom ratio", "fleet_min_ratio", BELOW),
    (FLEET, "Least headroom (ratio of the p95 ceiling)", None, "headroom_min_ratio", BELOW),
    (FLEET, "Highest KV-cache usage", None, "kv_saturation_ratio", ABOVE),
    (FLEET, "Fleet headroom at p95 context", None, "fleet_min_sequences", BELOW),
    (FLEET, "Fleet headroom ratio", None, "fleet_min_ratio", BELOW),
    (FLEET, "p95 context vs a day earlier", None, "context_growth_factor", ABOVE),
    (INSTANCE, "KV-cache usage", None, "kv_saturation_ratio", ABOVE),
    (INSTANCE, "Headroom at p95 context", None, "headroom_min_sequences", BELOW),
    (INSTANCE, "Headroom ratio", None, "headroom_min_ratio", BELOW),
    (INSTANCE, "Preemption rate", None, "preemptions_per_second", ABOVE),
    (INSTANCE, "Preemptions per finished request", None, "preemptions_per_finished_request", ABOVE),
    (INSTANCE, "Foreign GPU memory", None, "gpu_foreign_memory_bytes", ABOVE),
    (INSTANCE, "Unexplained GPU memory", None, "gpu_unexplained_memory_bytes", ABOVE),
    (INSTANCE, "Free GPU memory", None, "gpu_free_memory_min_bytes", BELOW),
    (INSTANCE, "Age of vLLM figures", None, "stale_seconds", ABOVE),
]


@pytest.mark.parametrize("wiring", WIRING, ids=lambda w: f"{w[1]}/{w[2]}")
def test_panel_thresholds_equal_the_alert_defaults(
    boards: dict[str, dict[str, Any]], wiring: tuple[str, str, str | None, str, Bad]
) -> None:
    """The panel turns from green to an alert colour exactly at the rule file's default."""
    uid, title, column, threshold, bad = wiring
    default = _rule_defaults()[threshold]
    steps = _field_thresholds(_panel(boards[uid], title), column)
    just_below, just_above = default - abs(default) * 1e-6 - 1e-9, default
    ok, bad_below, bad_above = "green", _colour_at(steps, just_below), _colour_at(steps, just_above)
    if bad is Bad.ABOVE:
        assert (bad_below, bad_above != ok) == (ok, True), steps
    elif bad is Bad.BELOW:
        assert (bad_below != ok, bad_above) == (True, ok), steps
    else:
        assert [s["value"] for s in steps[1:]] == [-default, default], steps
        assert _colour_at(steps, 0) == ok
        assert _colour_at(steps, -default * 1.01) != ok
        assert _colour_at(steps, default) != ok


def test_both_prediction_error_panels_share_the_drift_tolerance(
    boards: dict[str, dict[str, Any]],
) -> None:
    """The instance dashboard's stat and time series of the prediction error band at ±tolerance."""
    default = _rule_defaults()["capacity_drift_ratio"]
    board = boards["vllm-headroom-instance"]
    for kind in ("stat", "timeseries"):
        steps = _field_thresholds(_panel(board, "Prediction error", kind), None)
        assert [s["value"] for s in steps[1:]] == [-default, default]


def test_the_exhaustion_trend_looks_as_far_ahead_as_the_alert(
    boards: dict[str, dict[str, Any]],
) -> None:
    """The projected tokens-in-use line uses the alert's horizon and 30-minute trend."""
    horizon = _rule_defaults()["kv_exhaustion_horizon_seconds"]
    panel = _panel(boards["vllm-headroom-instance"], "KV tokens in use vs capacity")
    [trend] = [t["expr"] for t in panel["targets"] if t["expr"].startswith("predict_linear")]
    match = re.fullmatch(r"predict_linear\(.*\[30m\], ([0-9.e+]+)\)", trend)
    assert match
    assert float(match[1]) == horizon


def test_threshold_colours_follow_the_alert_severity(facts: RuleFacts) -> None:
    """A paging (critical) alert's threshold is red, a ticket (warning) alert's orange."""
    critical = Limit("preemptions_per_second", Bad.ABOVE)
    warning = Limit("headroom_min_sequences", Bad.BELOW)
    assert {a.severity for a in facts.alerts_using(critical.threshold)} == {"critical"}
    assert {a.severity for a in facts.alerts_using(warning.threshold)} == {"warning"}
    assert threshold_steps(facts, [critical])[1].color == "red"
    assert threshold_steps(facts, [warning])[0].color == "orange"


def test_every_named_threshold_and_alert_exists_and_is_used(facts: RuleFacts) -> None:
    """Each threshold the panels draw exists and an alert compares against it; alerts exist."""
    drawn = [v for v in vars(limits).values() if isinstance(v, Limit)]
    assert len(drawn) >= 10
    for limit in drawn:
        facts.threshold(limit.threshold)
        assert facts.alerts_using(limit.threshold), limit.threshold
    for name in [v for k, v in vars(limits).items() if k.isupper() and isinstance(v, str)]:
        if name.startswith("VllmHeadroom"):
            facts.alert(name)
        else:
            facts.threshold(name)


# ----------------------------------------------------------------------------- links


def _links(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = list(board["links"])
    for panel in _visuals(board):
        out += panel.get("links", [])
    return out


def test_runbook_links_are_the_alerts_runbook_urls_and_the_pages_exist(
    boards: dict[str, dict[str, Any]], facts: RuleFacts
) -> None:
    """Every runbook link is its alert's runbook_url, and that page exists in docs/runbooks/."""
    linked: set[str] = set()
    for board in boards.values():
        for link in _links(board):
            if not link["title"].startswith("Runbook: "):
                continue
            name = link["title"].removeprefix("Runbook: ")
            assert link["url"] == facts.alert(name).runbook_url
            assert (RUNBOOKS / f"{name}.md").is_file(), name
            linked.add(name)
    # Every alert is explained by some panel, except the meta-alert about the rule file itself
    # (it is about configuration, not about a number on a dashboard).
    unlinked = {a.name for a in facts.alerts} - linked
    assert unlinked <= {"VllmHeadroomThresholdMissing"}, unlinked
    assert facts.runbook_base.endswith("/docs/runbooks/")
    assert (RUNBOOKS / "README.md").is_file()


def test_the_dashboards_link_to_each_other_keeping_time_and_variables(
    boards: dict[str, dict[str, Any]],
) -> None:
    """Each dashboard links to the other, carrying the time range and variables along."""
    for uid, other in (
        ("vllm-headroom-fleet", "vllm-headroom-instance"),
        ("vllm-headroom-instance", "vllm-headroom-fleet"),
    ):
        [link] = [x for x in boards[uid]["links"] if x["url"] == f"/d/{other}"]
        assert link["keepTime"] is True
        assert link["includeVars"] is True


def test_fleet_rows_drill_down_to_their_instance(boards: dict[str, dict[str, Any]]) -> None:
    """The instance column and the top/bottom-k bars open the instance dashboard for that row."""
    board = boards["vllm-headroom-fleet"]
    table = _panel(board, "Instances by model")
    [instance_override] = [
        o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "Instance"
    ]
    [url] = [link["url"] for p in instance_override["properties"] for link in p["value"]]
    assert url.startswith("/d/vllm-headroom-instance?")
    assert "var-instance=${__data.fields.instance}" in url
    for title in ("Least headroom (ratio of the p95 ceiling)", "Highest KV-cache usage"):
        [link] = _panel(board, title)["fieldConfig"]["defaults"]["links"]
        assert "var-instance=${__field.labels.instance}" in link["url"]


def test_alert_tables_link_each_alert_to_its_runbook(
    boards: dict[str, dict[str, Any]], facts: RuleFacts
) -> None:
    """The alert name column links to <runbook base><alert>.md for whichever alert it shows."""
    for board in boards.values():
        table = _panel(board, "Firing alerts", "table")
        [override] = [
            o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "Alert"
        ]
        [url] = [link["url"] for p in override["properties"] for link in p["value"]]
        assert url == f"{facts.runbook_base}${{__value.raw}}.md"
        assert 'alertname=~"VllmHeadroom.*"' in table["targets"][0]["expr"]


# ----------------------------------------------------------------------------- rule reader

_ALERT: dict[str, object] = {
    "alert": "VllmHeadroomX",
    "expr": "x > scalar(headroom:threshold:a)",
    "labels": {"severity": "critical"},
    "annotations": {"runbook_url": "https://example.org/runbooks/VllmHeadroomX.md"},
}


def _doc(*rules: dict[str, object], group: str = "vllm-headroom-thresholds") -> object:
    return {"groups": [{"name": group, "rules": list(rules)}]}


def test_parse_rules_reads_thresholds_alerts_and_recorded_names() -> None:
    """Threshold defaults, alerts with their severity, runbook and thresholds, recorded names."""
    facts = parse_rules(
        {
            "groups": [
                {
                    "name": "vllm-headroom-thresholds",
                    "rules": [
                        {"record": "headroom:threshold:a", "expr": "vector(0.5)"},
                        {"record": "headroom:threshold:b", "expr": " vector( 1e9 ) "},
                    ],
                },
                {
                    "name": "other",
                    "rules": [{"record": "headroom:x:sum", "expr": "sum(x)"}, _ALERT],
                },
            ]
        }
    )
    assert facts.thresholds == {"a": 0.5, "b": 1e9}
    assert facts.recorded == {"headroom:threshold:a", "headroom:threshold:b", "headroom:x:sum"}
    [alert] = facts.alerts
    assert (alert.name, alert.severity) == ("VllmHeadroomX", "critical")
    assert alert.thresholds == frozenset({"a"})
    assert facts.runbook_base == "https://example.org/runbooks/"


def test_only_a_threshold_read_through_scalar_is_a_comparison() -> None:
    """absent(t) or count(t) > 1 (the missing-threshold meta-alert) does not use t's value."""
    meta = {**_ALERT, "expr": "absent(headroom:threshold:a) or count(headroom:threshold:a) > 1"}
    used = {**_ALERT, "alert": "VllmHeadroomY", "expr": "x > scalar( headroom:threshold:a )"}
    facts = parse_rules(_doc({"record": "headroom:threshold:a", "expr": "vector(1)"}, meta, used))
    assert [a.name for a in facts.alerts_using("a")] == ["VllmHeadroomY"]


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([], "no top-level 'groups' list"),
        ({"groups": [1]}, "is not a mapping with a 'rules' list"),
        (_doc({"record": "headroom:threshold:a", "expr": "vector(x)"}), "vector(<number>)"),
        (_doc({"record": "headroom:a", "expr": "vector(1)"}), "is not named headroom:threshold:"),
        (_doc({**_ALERT, "labels": {}}), "has no labels.severity"),
        (_doc({**_ALERT, "annotations": {}}), "has no annotations.runbook_url"),
    ],
)
def test_parse_rules_rejects_what_is_not_the_agreed_shape(document: object, problem: str) -> None:
    """A rule file of another shape is a RulesFileError whose one line names the problem."""
    with pytest.raises(RulesFileError, match=re.escape(problem)) as caught:
        parse_rules(document, where="f.yml")
    assert "\n" not in str(caught.value)


def test_missing_threshold_and_alert_names_are_clear_errors() -> None:
    """Asking for a threshold or alert the file lacks names it and what the file has."""
    facts = parse_rules(_doc({"record": "headroom:threshold:a", "expr": "vector(1)"}, _ALERT))
    with pytest.raises(RulesFileError, match=r"no threshold headroom:threshold:zz .*defines: a"):
        facts.threshold("zz")
    with pytest.raises(RulesFileError, match="no alert VllmHeadroomNope"):
        facts.alert("VllmHeadroomNope")


def test_runbook_urls_must_share_one_base() -> None:
    """Runbook URLs that are not <base>/<AlertName>.md make the alert-table links impossible."""
    other = {**_ALERT, "alert": "VllmHeadroomY", "annotations": {"runbook_url": "https://x/Y.md"}}
    facts = parse_rules(_doc(_ALERT, other))
    with pytest.raises(RulesFileError, match="one base URL"):
        _ = facts.runbook_base


# ----------------------------------------------------------------------------- widgets

_EMPTY = parse_rules({"groups": []})


@given(
    value=st.floats(-1e12, 1e12, allow_nan=False),
    threshold=st.floats(-1e9, 1e9, allow_nan=False),
    bad=st.sampled_from([Bad.ABOVE, Bad.BELOW]),
)
def test_a_single_threshold_colours_exactly_the_bad_side(
    value: float, threshold: float, bad: Bad
) -> None:
    """Above: bad from the threshold up; below: bad strictly under it (as the alerts compare)."""
    steps = [s.to_json() for s in threshold_steps(_EMPTY, [Static(threshold, bad)])]
    is_bad = _colour_at(steps, value) != "green"
    assert is_bad == (value >= threshold if bad is Bad.ABOVE else value < threshold)


@given(
    value=st.floats(-1e6, 1e6, allow_nan=False),
    tolerance=st.floats(1e-3, 1e3, allow_nan=False),
)
def test_an_outside_threshold_is_a_symmetric_band(value: float, tolerance: float) -> None:
    """Outside: green within [-tolerance, tolerance), the alert colour beyond either side."""
    steps = [s.to_json() for s in threshold_steps(_EMPTY, [Static(tolerance, Bad.OUTSIDE)])]
    assert (_colour_at(steps, value) == "green") == (-tolerance <= value < tolerance)


def test_several_below_thresholds_step_up_through_their_colours() -> None:
    """Two floors: the lower one's colour under it, the upper one's between, green above."""
    steps = threshold_steps(
        _EMPTY, [Static(5, Bad.BELOW, colour="orange"), Static(2, Bad.BELOW, colour="red")]
    )
    assert [(s.value, s.color) for s in steps] == [(None, "red"), (2, "orange"), (5, "green")]


def test_thresholds_of_one_panel_must_agree_on_the_bad_side() -> None:
    """Mixing above and below thresholds on one panel is a programming error, said loudly."""
    with pytest.raises(ValueError, match="share their bad side"):
        threshold_steps(_EMPTY, [Static(1, Bad.ABOVE), Static(2, Bad.BELOW)])


_CELL = st.tuples(st.integers(1, GRID_COLUMNS), st.integers(1, 12))


@given(rows=st.lists(st.lists(_CELL, max_size=6), min_size=1, max_size=4))
def test_place_never_overlaps_and_numbers_panels_in_order(
    rows: list[list[tuple[int, int]]],
) -> None:
    """Any rows of cells land inside the grid, without overlap, with ids 1, 2, 3..."""
    panel = stat_panel("t", description="d.", unit="short", queries=[Query("up")], facts=_EMPTY)
    placed = [
        json.loads(json.dumps(p.to_json(), default=lambda o: o.to_json()))
        for p in place(
            [Row(f"r{i}", [Cell(panel, w, h) for w, h in row]) for i, row in enumerate(rows)]
        )
    ]
    for p in placed:
        p.setdefault("title", "row")
    _assert_grid(placed)
    assert [p["id"] for p in placed] == list(range(1, len(placed) + 1))


def test_a_state_timeline_needs_its_states() -> None:
    """A state timeline without value mappings would draw bare codes: refused."""
    with pytest.raises(ValueError, match="needs value mappings"):
        state_timeline_panel(
            "t", description="d.", unit="none", queries=[Query("up")], facts=_EMPTY, mappings=[]
        )


def test_a_stat_shows_either_the_name_or_the_name_and_value() -> None:
    """The two text modes of a stat exclude each other."""
    with pytest.raises(ValueError, match="two different text modes"):
        stat_panel(
            "t",
            description="d.",
            unit="short",
            queries=[Query("up")],
            facts=_EMPTY,
            text_mode_name=True,
            show_name=True,
        )


def test_place_rejects_a_cell_wider_than_the_grid() -> None:
    """A 25-column cell is an error, not a silently clipped panel."""
    panel = stat_panel("t", description="d.", unit="short", queries=[Query("up")], facts=_EMPTY)
    with pytest.raises(ValueError, match="does not fit the grid"):
        place([Row("r", [Cell(panel, 25, 4)])])


# ----------------------------------------------------------------------------- variables


def test_referenced_variables_reads_every_grafana_syntax() -> None:
    """$a, ${b}, ${c:regex} and [[d]] are references; $1 (a regex group) and ${__data.x} are not."""
    text = 'x{a=~"$a", b="${b}", c=~"${c:regex}", d="[[d]]"} label_replace(x, "y", "$1", "", "")'
    assert referenced_variables(text + " ${__data.fields.instance}") == {"a", "b", "c", "d"}


def test_expand_fills_single_and_multi_values_as_the_prometheus_data_source() -> None:
    """A single value goes in as is; several are regex-escaped and joined as (a|b)."""
    expr = 'up{job=~"$job", instance=~"$host(:[0-9]+)?", x="$__rate_interval"}'
    out = expand(expr, {"job": ".*", "host": ["10.0.0.1", "b"], "__rate_interval": "1m"})
    assert out == 'up{job=~".*", instance=~"(10\\\\.0\\\\.0\\\\.1|b)(:[0-9]+)?", x="1m"}'
    with pytest.raises(KeyError, match=r"\$job"):
        expand("up{job=~'$job'}", {})


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters='"')))
def test_escaped_values_match_themselves_literally(value: str) -> None:
    """Escaped for a PromQL string, a value is a regex that matches exactly that value."""
    in_string = prometheus_regex_escape(value)
    regex = re.sub(r"\\(.)", r"\1", in_string)  # what PromQL's string unquoting leaves
    assert re.fullmatch(regex, value, re.DOTALL)


def test_fleet_and_instance_builders_are_pure(facts: RuleFacts) -> None:
    """Building a dashboard twice from the same facts gives equal models (no hidden state)."""
    for module in (fleet, instance):
        assert generate.render(module.build(facts)) == generate.render(module.build(facts))
