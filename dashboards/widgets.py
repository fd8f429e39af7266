"""Panels with the invariants every panel of ours keeps, and a grid that places them.

Every panel here is built with grafana-foundation-sdk. The helpers take a one-sentence
description and a unit as required keyword arguments (a panel without them does not
type-check) and always set thresholds (plain green when nothing is bad). Thresholds that
correspond to an alert are given as
:class:`Limit` (a threshold of the rule file and which side of it is bad) and resolved against
:class:`~dashboards.rules.RuleFacts`: the panel turns the alert's severity colour at exactly the
alert's default, and links to the runbooks of the alerts that use it.

:func:`place` lays rows of panels out on Grafana's 24-column grid and numbers them.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from dashboards.queries import SCHEDULER_LIMITS
from dashboards.templating import DATASOURCE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grafana_foundation_sdk.cog import builder as cogbuilder
    from grafana_foundation_sdk.cog import variants as cogvariants

    from dashboards.rules import RuleFacts

#: Grafana's grid is 24 columns wide.
GRID_COLUMNS = 24

#: Colour of a threshold step by the severity of the alert behind it.
SEVERITY_COLOURS = {"critical": "red", "warning": "orange", "info": "blue"}
OK_COLOUR = "green"


class Bad(Enum):
    """Which side of a threshold is bad."""

    ABOVE = "above"
    BELOW = "below"
    #: Outside ``[-value, value]`` (a relative error that may go either way).
    OUTSIDE = "outside"


@dataclass(frozen=True, slots=True)
class Limit:
    """A threshold of the rule file drawn on a panel, and the side of it that alerts."""

    threshold: str
    bad: Bad


@dataclass(frozen=True, slots=True)
class Static:
    """A fixed threshold that no alert tunes (e.g. ``up < 1``): value, bad side, colour."""

    value: float
    bad: Bad
    colour: str = "red"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    #: Evaluate once at the end of the range (stat, table, bar gauge) instead of over it.
    instant: bool = False
    #: Return a table frame (labels as columns) rather than time series.
    table: bool = False


class PanelBuilder(Protocol):
    """What :func:`place` needs of a panel builder (stat, time series, table, bar gauge)."""

    def build(self) -> dm.Panel:
        """Build the panel model."""
        ...


@dataclass(frozen=True, slots=True)
class Cell:
    """A panel and its size on the grid (width in columns, height in rows)."""

    panel: PanelBuilder
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class Row:
    """A titled row of cells, laid out left to right and wrapped at 24 columns."""

    title: str
    cells: Sequence[Cell] = field(default_factory=tuple)


# ----------------------------------------------------------------------------- thresholds


def _colour(facts: RuleFacts, limit: Limit) -> str:
    """The colour of the most severe alert using ``limit``'s threshold (orange when none)."""
    severities = {a.severity for a in facts.alerts_using(limit.threshold)}
    for severity in ("critical", "warning", "info"):
        if severity in severities:
            return SEVERITY_COLOURS[severity]
    return SEVERITY_COLOURS["warning"]


def threshold_steps(facts: RuleFacts, limits: Sequence[Limit | Static]) -> list[dm.Threshold]:
    """Grafana threshold steps for ``limits``, all on the same bad side; empty: always green.

    Above: green up to each value, then that value's colour. Below: each value's colour under
    it, green from the highest one. Outside: bad below ``-value`` and above ``value``.
    """
    resolved = [
        (lim.value, lim.bad, lim.colour)
        if isinstance(lim, Static)
        else (facts.threshold(lim.threshold), lim.bad, _colour(facts, lim))
        for lim in limits
    ]
    sides = {bad for _, bad, _ in resolved}
    if len(sides) > 1:
        raise ValueError(f"thresholds of one panel must share their bad side, got {sides}")
    if not resolved:
        return [dm.Threshold(value=None, color=OK_COLOUR)]
    resolved.sort(key=lambda item: item[0])
    bad = resolved[0][1]
    if bad is Bad.ABOVE:
        return [dm.Threshold(value=None, color=OK_COLOUR)] + [
            dm.Threshold(value=value, color=colour) for value, _, colour in resolved
        ]
    if bad is Bad.BELOW:
        steps = [dm.Threshold(value=None, color=resolved[0][2])]
        for (value, _, _), (_, _, above_colour) in itertools.pairwise(resolved):
            steps.append(dm.Threshold(value=value, color=above_colour))
        steps.append(dm.Threshold(value=resolved[-1][0], color=OK_COLOUR))
        return steps
    if len(resolved) != 1:
        raise ValueError("an 'outside' threshold is one value (a symmetric band)")
    value, _, colour = resolved[0]
    return [
        dm.Threshold(value=None, color=colour),
        dm.Threshold(value=-value, color=OK_COLOUR),
        dm.Threshold(value=value, color=colour),
    ]


def thresholds(facts: RuleFacts, limits: Sequence[Limit | Static]) -> db.ThresholdsConfig:
    """The thresholds config of a panel or column (absolute mode)."""
    return (
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(threshold_steps(facts, limits))
    )


def thresholds_model(facts: RuleFacts, limits: Sequence[Limit | Static]) -> dm.ThresholdsConfig:
    """:func:`thresholds`, built (for field overrides, which take models)."""
    return thresholds(facts, limits).build()


def runbook_links(
    facts: RuleFacts, limits: Sequence[Limit | Static], alerts: Sequence[str] = ()
) -> list[cogbuilder.Builder[dm.DashboardLink]]:
    """Links to the runbooks of the alerts behind ``limits`` and of the named ``alerts``."""
    names = {
        a.name
        for lim in limits
        if isinstance(lim, Limit)
        for a in facts.alerts_using(lim.threshold)
    }
    names.update(alerts)
    return [
        db.DashboardLink(f"Runbook: {name}")
        .type(dm.DashboardLinkType.LINK)
        .url(facts.alert(name).runbook_url)
        .target_blank(True)
        for name in sorted(names)
    ]


# ----------------------------------------------------------------------------- queries


def _target(query: Query, ref_id: str) -> pb.Dataquery:
    target = (
        pb.Dataquery()
        .expr(query.expr)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
        .legend_format(query.legend or "__auto")
        .editor_mode(pm.QueryEditorMode.CODE)
    )
    target = target.instant() if query.instant else target.range()
    if query.table:
        target = target.format(pm.PromQueryFormat.TABLE)
    return target


def _targets(queries: Sequence[Query]) -> list[cogbuilder.Builder[cogvariants.Dataquery]]:
    if not queries:
        raise ValueError("a panel needs at least one query")
    if len(queries) > 26:
        raise ValueError("at most 26 queries (refIds A to Z)")
    return [_target(q, chr(ord("A") + i)) for i, q in enumerate(queries)]


# ----------------------------------------------------------------------------- panels


def stat_panel(
    title: str,
    *,
    description: str,
    unit: str,
    queries: Sequence[Query],
    facts: RuleFacts,
    limits: Sequence[Limit | Static] = (),
    alerts: Sequence[str] = (),
    mappings: Sequence[dm.ValueMapping] = (),
    decimals: int | None = None,
    graph: bool = False,
    text_mode_name: bool = False,
    show_name: bool = False,
) -> stat.Panel:
    """A big number coloured by its thresholds: the value now (``graph``: and its sparkline).

    Without ``graph`` the queries are instant, so a series that existed earlier in the time
    range (an old state, a restarted engine) does not linger. ``text_mode_name`` shows the
    series' name instead of its value (for state gauges whose one series at 1 names the state);
    ``show_name`` shows the name beside the value even for one series (a value and the label
    that says where it came from).
    """
    if text_mode_name and show_name:
        raise ValueError("text_mode_name and show_name are two different text modes")
    text_mode = cm.BigValueTextMode.AUTO
    if text_mode_name:
        text_mode = cm.BigValueTextMode.NAME
    elif show_name:
        text_mode = cm.BigValueTextMode.VALUE_AND_NAME
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets([replace(q, instant=not graph) for q in queries]))
        .unit(unit)
        .thresholds(thresholds(facts, limits))
        .color_mode(cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.AREA if graph else cm.BigValueGraphMode.NONE)
        .text_mode(text_mode)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .no_value("no data")
        .links(runbook_links(facts, limits, alerts))
    )
    if text_mode_name:
        # The one series named "ok" is good news; any other name is a state worth a look.
        panel = panel.override_by_regexp(
            "^(?!ok$).+$",
            [
                dm.DynamicConfigValue(
                    id_val="color", value={"mode": "fixed", "fixedColor": "orange"}
                )
            ],
        )
    if mappings:
        panel = panel.mappings(list(mappings))
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def timeseries_panel(
    title: str,
    *,
    description: str,
    unit: str,
    queries: Sequence[Query],
    facts: RuleFacts,
    limits: Sequence[Limit | Static] = (),
    alerts: Sequence[str] = (),
    stacked: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> timeseries.Panel:
    """Lines over time; thresholds drawn as dashed lines when an alert or fact sets them."""
    style = cm.GraphThresholdsStyleMode.DASHED if limits else cm.GraphThresholdsStyleMode.OFF
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .thresholds(thresholds(facts, limits))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(style))
        .fill_opacity(25 if stacked else 8)
        .line_width(1)
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
        .links(runbook_links(facts, limits, alerts))
    )
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    return panel


def bargauge_panel(
    title: str,
    *,
    description: str,
    unit: str,
    queries: Sequence[Query],
    facts: RuleFacts,
    limits: Sequence[Limit | Static] = (),
    alerts: Sequence[str] = (),
    minimum: float | None = None,
    maximum: float | None = None,
    data_links: Sequence[cogbuilder.Builder[dm.DashboardLink]] = (),
) -> bargauge.Panel:
    """Horizontal bars, one per series, coloured by thresholds (for top/bottom-k lists)."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .thresholds(thresholds(facts, limits))
        .display_mode(cm.BarGaugeDisplayMode.BASIC)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .show_unfilled(True)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .links(runbook_links(facts, limits, alerts))
    )
    if data_links:
        panel = panel.data_links(list(data_links))
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    return panel


def state_timeline_panel(
    title: str,
    *,
    description: str,
    unit: str,
    queries: Sequence[Query],
    facts: RuleFacts,
    mappings: Sequence[dm.ValueMapping],
    alerts: Sequence[str] = (),
) -> statetimeline.Panel:
    """One band per series, coloured by the state its value maps to (a limit, a mode).

    The states come from ``mappings`` (text and colour per value); thresholds stay plain green,
    so a value no mapping knows shows as itself rather than in an alarming colour.
    """
    if not mappings:
        raise ValueError("a state timeline needs value mappings: they are its states")
    return (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .thresholds(thresholds(facts, []))
        .mappings(list(mappings))
        .show_value(cm.VisibilityMode.AUTO)
        .merge_values(True)
        .row_height(0.8)
        .fill_opacity(70)
        .line_width(0)
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI))
        .links(runbook_links(facts, [], alerts))
    )


def limit_mapping() -> dm.ValueMap:
    """The codes of :func:`dashboards.queries.binding_limit` mapped back to the limits' names."""
    return dm.ValueMap(
        options={
            str(code): dm.ValueMappingResult(text=text, color=colour, index=code - 1)
            for code, (_, text, colour) in enumerate(SCHEDULER_LIMITS, start=1)
        }
    )


@dataclass(frozen=True, slots=True)
class Column:
    """A value column of a table panel: one instant query, its header, unit and thresholds."""

    header: str
    query: str
    unit: str
    limits: Sequence[Limit | Static] = ()
    #: Colour the cell's background by its thresholds.
    coloured: bool = False
    #: Query only for its labels (an info metric): the value column is not shown.
    hidden: bool = False
    #: Value mappings of the cells (a code shown as the name it stands for).
    mappings: Sequence[dm.ValueMapping] = ()


def table_panel(
    title: str,
    *,
    description: str,
    unit: str,
    facts: RuleFacts,
    columns: Sequence[Column],
    labels: Sequence[tuple[str, str]],
    alerts: Sequence[str] = (),
    sort_by: str | None = None,
    descending: bool = False,
    label_links: Sequence[tuple[str, db.DashboardLink]] = (),
) -> table.Panel:
    """A table with one row per label set and one column per query, joined on the labels.

    ``labels`` are the label columns to show, in order, with their headers; every other label
    and the timestamp are hidden. ``unit`` is the default unit; each column sets its own.
    ``label_links`` put a link (e.g. to the instance dashboard) on a label column.
    """
    shown = [name for name, _ in labels]
    rename = dict(labels)
    order: dict[str, int] = {name: i for i, name in enumerate(shown)}
    # The timestamp, and the job (the same on every row) are never worth a column.
    exclude = {"Time": True, "job": True}
    queries = []
    for i, column in enumerate(columns):
        # One query: Grafana calls its value column "Value"; several: "Value #<refId>".
        value = "Value" if len(columns) == 1 else f"Value #{chr(ord('A') + i)}"
        rename[value] = column.header
        order[value] = len(shown) + i
        if column.hidden:
            exclude[value] = True
        queries.append(Query(column.query, instant=True, table=True))
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .thresholds(thresholds(facts, []))
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": exclude,
                    "indexByName": order,
                    "renameByName": rename,
                },
            )
        )
        .links(runbook_links(facts, [lim for c in columns for lim in c.limits], alerts))
    )
    for column in columns:
        properties = [
            dm.DynamicConfigValue(id_val="unit", value=column.unit),
            dm.DynamicConfigValue(
                id_val="thresholds", value=thresholds_model(facts, column.limits)
            ),
        ]
        if column.mappings:
            properties.append(dm.DynamicConfigValue(id_val="mappings", value=list(column.mappings)))
        if column.coloured:
            properties.append(
                dm.DynamicConfigValue(
                    id_val="custom.cellOptions",
                    value=cm.TableColoredBackgroundCellOptions(
                        mode=cm.TableCellBackgroundDisplayMode.BASIC
                    ),
                )
            )
        panel = panel.override_by_name(column.header, properties)
    for name, link in label_links:
        panel = panel.override_by_name(
            rename[name], [dm.DynamicConfigValue(id_val="links", value=[link.build()])]
        )
    if sort_by is not None:
        panel = panel.sort_by([cb.TableSortByFieldState().display_name(sort_by).desc(descending)])
    return panel


# ----------------------------------------------------------------------------- dashboards

#: Grafana 10.4's dashboard schema version (what it writes when it saves a dashboard).
SCHEMA_VERSION = 39
FLEET_UID = "vllm-headroom-fleet"
INSTANCE_UID = "vllm-headroom-instance"
TAGS = ["vllm", "vllm-headroom"]


def dashboard_frame(
    title: str,
    uid: str,
    description: str,
    *,
    since: str,
    refresh: str,
    variables: Sequence[cogbuilder.Builder[dm.VariableModel]],
    target_selector: str,
) -> db.Dashboard:
    """A dashboard in our common frame, its rows still to add.

    Tags, a shared crosshair, the browser's time zone, ``now-<since>`` to now, and vLLM restarts
    marked on every panel.
    """
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time(f"now-{since}", "now")
        .refresh(refresh)
        .timezone("browser")
        .variables(list(variables))
        .annotation(restart_annotation(target_selector))
    )


def dashboard_link(title: str, uid: str, tooltip: str) -> db.DashboardLink:
    """A link to another of our dashboards that keeps the time range and the variables."""
    return (
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(f"/d/{uid}")
        .tooltip(tooltip)
        .icon("dashboard")
        .include_vars(True)
        .keep_time(True)
    )


def runbook_index_link(facts: RuleFacts) -> db.DashboardLink:
    """A link to the runbook index (``README.md`` beside the runbooks)."""
    return (
        db.DashboardLink("Runbooks")
        .type(dm.DashboardLinkType.LINK)
        .url(f"{facts.runbook_base}README.md")
        .tooltip("What each alert means and what to do about it")
        .icon("doc")
        .target_blank(True)
    )


def restart_annotation(target_selector: str) -> db.AnnotationQuery:
    """Mark vLLM restarts the sidecar detected: "what changed" starts there."""
    return (
        db.AnnotationQuery()
        .name("vLLM restarts")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("purple")
        .expr(f"changes(headroom_target_restarts_total{target_selector}[2m]) > 0")
    )


def assemble(builder: db.Dashboard, rows: Sequence[Row]) -> dm.Dashboard:
    """Build ``builder`` with ``rows`` laid out on the grid, at Grafana 10.4's schema version."""
    model = builder.build()
    model.panels = place(rows)
    model.schema_version = SCHEMA_VERSION
    return model


# ----------------------------------------------------------------------------- layout


def place(rows: Sequence[Row], *, first_id: int = 1) -> list[dm.Panel | dm.RowPanel]:
    """Lay ``rows`` out on the grid: a row header, then its cells left to right, wrapping.

    Panel ids are assigned in order from ``first_id``. A cell wider than the grid is an error;
    a cell that does not fit the rest of a line starts the next one.
    """
    placed: list[dm.Panel | dm.RowPanel] = []
    next_id = first_id
    y = 0
    for row in rows:
        header = db.Row(row.title).id(next_id).grid_pos(dm.GridPos(h=1, w=GRID_COLUMNS, x=0, y=y))
        placed.append(header.build())
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for cell in row.cells:
            if not 0 < cell.width <= GRID_COLUMNS or cell.height <= 0:
                raise ValueError(f"cell of {cell.width}x{cell.height} does not fit the grid")
            if x + cell.width > GRID_COLUMNS:
                y += line_height
                x, line_height = 0, 0
            # A copy: build() returns the builder's own model, and a builder may be placed twice.
            panel = copy.deepcopy(cell.panel.build())
            panel.id_val = next_id
            panel.grid_pos = dm.GridPos(h=cell.height, w=cell.width, x=x, y=y)
            placed.append(panel)
            next_id += 1
            x += cell.width
            line_height = max(line_height, cell.height)
        y += line_height
    return placed


def firing_alerts_table(
    facts: RuleFacts,
    *,
    description: str,
    alerts: str,
    firing: str,
    labels: Sequence[tuple[str, str]],
    height: int,
) -> Cell:
    """A full-width table of firing vllm-headroom alerts, when each became active, and runbooks.

    ``alerts`` and ``firing`` are the same selector of ``ALERTS``, the latter with
    ``alertstate="firing"``; ``labels`` are the columns (label, header), also the grouping.
    """
    key = ", ".join(label for label, _ in labels)
    active_since = (
        f"max by ({key}) (ALERTS_FOR_STATE{alerts} * 1000 and ignoring (alertstate) ALERTS{firing})"
    )
    runbook = (
        db.DashboardLink("Runbook")
        .url(f"{facts.runbook_base}${{__value.raw}}.md")
        .target_blank(True)
    )
    panel = table_panel(
        "Firing alerts",
        description=description,
        unit="short",
        facts=facts,
        columns=[Column("Active since", active_since, "dateTimeFromNow")],
        labels=list(labels),
        sort_by="Severity",
        label_links=[("alertname", runbook)],
    )
    return Cell(panel, 24, height)
