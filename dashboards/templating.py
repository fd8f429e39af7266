"""Dashboard variables: their definitions, and how Grafana fills them into a query.

Every query filters by the same variables, so an on-call engineer narrows both dashboards the
same way: ``datasource``, ``job``, ``namespace``, ``model``, ``instance`` and (on the instance
dashboard) ``engine``. Multi-value variables use the custom all-value ``.*`` so that a label
Prometheus never attached (no ``namespace`` outside Kubernetes, no ``engine`` before vLLM
0.8.3) still matches.

vLLM's own series come from a different scrape job than the sidecar's (another port, or another
target in fleet mode), so they cannot be matched by ``job`` or ``instance``. The hidden variable
``host`` holds the host part of the selected sidecar instance; :data:`VLLM_INSTANCE` matches
every instance on that host, with or without scheme and port.

:func:`expand` interpolates variables the way Grafana's Prometheus data source does (values of
multi-value variables regex-escaped for PromQL strings), so tests can run the panels' queries
against a real Prometheus.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: Every panel and query uses this data source: the ``datasource`` variable.
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

#: A matcher for vLLM's own ``instance`` label on the selected sidecar's host.
VLLM_INSTANCE = 'instance=~"([a-z][a-z0-9+.-]*://)?$host(:[0-9]+)?(/.*)?"'

#: Grafana's built-in variables our queries use, with what they mean.
BUILTINS = {
    "__rate_interval": "a rate window of at least four scrape intervals",
    "__range": "the dashboard's time range",
    "__interval": "the step between points",
}

_ALL = dm.VariableOption(selected=True, text="All", value="$__all")

# $name, ${name}, ${name:format} and the deprecated [[name]] (Grafana's own grammar).
_REFERENCE = re.compile(r"\$(\w+)|\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)(?::(\w+))?\]\]")


def datasource_variable() -> db.DatasourceVariable:
    """The Prometheus data source every panel queries."""
    return (
        db.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus (or Thanos, Mimir) that scrapes the sidecars and vLLM.")
    )


def label_variable(
    name: str,
    *,
    label: str,
    query: str,
    description: str,
    multi: bool = True,
    hidden: bool = False,
    all_value: str | None = ".*",
    regex: str | None = None,
) -> db.QueryVariable:
    """A variable listing the values of a label (``label_values(...)``), refreshed with time."""
    variable = (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(multi)
    )
    if multi:
        variable = variable.current(_ALL)
        if all_value is not None:
            variable = variable.all_value(all_value)
    if hidden:
        variable = variable.hide(dm.VariableHide.HIDE_VARIABLE)
    if regex is not None:
        variable = variable.regex(regex)
    return variable


def host_variable(instance_selector: str) -> db.QueryVariable:
    """The hidden ``host``: the host part of every selected sidecar instance.

    Its current value is "All" with no custom all-value, so Grafana expands ``$host`` to every
    option, regex-escaped: exactly the hosts of the instances that ``instance_selector`` picks.
    """
    return label_variable(
        "host",
        label="Host",
        query=f"label_values(headroom_target_up{{{instance_selector}}}, instance)",
        description="Host part of the selected instance, to find vLLM's own series (hidden).",
        hidden=True,
        all_value=None,
        # The first group is the value: the host without scheme, port or path (IPv6 in []).
        regex=r"/^(?:[a-z][a-z0-9+.-]*:\/\/)?(\[[^\]]+\]|[^:\/]+)/",
    )


def referenced_variables(text: str) -> set[str]:
    """Names of the variables ``text`` refers to, in any of Grafana's syntaxes."""
    names = {_name(match) for match in _REFERENCE.finditer(text)}
    # "$1" is a capture-group reference (label_replace), which Grafana leaves alone too.
    return {name for name in names if not name.isdigit()}


def prometheus_regex_escape(value: str) -> str:
    r"""Escape ``value`` as Grafana's Prometheus data source does for a regex in a PromQL string.

    A backslash becomes four (two for the string, two for the regex), a regex metacharacter
    gets two: ``a.b`` -> ``a\\.b`` in the query text.
    """
    escaped = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m[0], escaped)


def expand(text: str, values: Mapping[str, str | Sequence[str]]) -> str:
    """Interpolate variables into ``text`` as Grafana's Prometheus data source does.

    A ``str`` value is a single-value variable (inserted as is); a sequence is a multi-value
    selection, regex-escaped and joined as ``(a|b)`` (one value: no parentheses). Built-ins such
    as ``__rate_interval`` are given like any other value. A reference without a value raises
    ``KeyError`` naming it.
    """

    def substitute(match: re.Match[str]) -> str:
        name = _name(match)
        if name.isdigit():
            return match[0]
        if name not in values:
            raise KeyError(f"no value for variable ${name} in {text!r}")
        value = values[name]
        if isinstance(value, str):
            return value
        escaped = [prometheus_regex_escape(v) for v in value]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return _REFERENCE.sub(substitute, text)


def _name(match: re.Match[str]) -> str:
    return next(group for group in (match[1], match[2], match[4]) if group)
