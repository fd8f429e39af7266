"""The PromQL name extractor of tests/promql.py: what it reads as a metric name, and what not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.promql import PromQLSyntaxError, metric_names, number_literals

#: Metric names as they occur: snake case, vLLM's colons, recording-rule names.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS |= {"offset", "bool", "atan2", "inf", "nan"}
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,12}(:[a-z][a-z0-9_]{0,8}){0,2}", fullmatch=True).filter(
    lambda n: n not in KEYWORDS
)
LABELS = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)


def test_names_with_colons_inside_functions_and_aggregations() -> None:
    """A recording-rule name inside rate() inside an aggregation is one metric name."""
    expr = 'sum without (engine) (rate(vllm:num_preemptions_total{engine="0"}[5m]))'
    assert metric_names(expr) == {"vllm:num_preemptions_total"}


def test_label_lists_matchers_strings_and_durations_are_not_names() -> None:
    """Labels of by/on/group_left, matcher values, strings and durations are skipped."""
    expr = (
        'a / on (job, instance) group_left (model_name) b{model_name="c", engine!~"d|e"}'
        ' offset 1d and label_replace(f, "dst", "g", "src", "(.*)") > bool 3'
    )
    assert metric_names(expr) == {"a", "b", "f"}


def test_name_matchers_and_quoted_names_count() -> None:
    """``{__name__="x"}`` and Prometheus 3's ``{"x.y"}`` name their metric."""
    assert metric_names('{__name__="up", job="x"}') == {"up"}
    assert metric_names('{"my.metric", job="x"}') == {"my.metric"}


def test_aggregation_with_its_grouping_first_and_keywords_in_any_case() -> None:
    """``sum by (x) (y)`` and ``SUM BY (x) (y)`` read y, not sum, by or x."""
    assert metric_names("sum by (job) (y)") == {"y"}
    assert metric_names("SUM BY (job) (y) AND z") == {"y", "z"}


def test_grafana_variables_and_comments_are_skipped() -> None:
    """``$__rate_interval``, ``${job}`` and ``# comments`` never read as names."""
    expr = 'rate(x{job=~"$job"}[$__rate_interval]) # a comment naming y\n * on() ${scale}'
    assert metric_names(expr) == {"x"}


def test_at_modifier_and_subqueries() -> None:
    """``@ start()`` is not a call to a metric and a subquery range is a duration."""
    assert metric_names("max_over_time(rate(x[1m])[1h:5m] @ end())") == {"x"}


@pytest.mark.parametrize(
    "expr",
    [
        "rates(x[5m])",  # a typo'd function would otherwise read as a metric
        '{__name__=~"headroom_.+"}',  # the name is unknown
        "sum(x",
        "x)",
        "x[5m",
        '"unterminated',
        "x ? y",
    ],
)
def test_unreadable_expressions_raise(expr: str) -> None:
    """What cannot be read is an error, never a silently shorter set of names."""
    with pytest.raises(PromQLSyntaxError):
        metric_names(expr)


def test_number_literals_skip_durations_offsets_and_strings() -> None:
    """Thresholds are found; windows, offsets, @ times and numbers in strings are not."""
    expr = 'rate(x{le="0.5"}[5m] offset 1d) > 0.05 and y @ 1700000000 < Inf unless z == 1e3'
    assert number_literals(expr) == ["0.05", "Inf", "1e3"]


@given(
    names=st.lists(NAMES, min_size=1, max_size=4, unique=True),
    labels=st.lists(LABELS, min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_names_survive_any_wrapping(
    names: list[str], labels: list[str], data: st.DataObject
) -> None:
    """However functions, aggregations, matchers and operators wrap them, the names come back."""
    parts = []
    for name in names:
        matchers = ",".join(f'{label}="{name}"' for label in labels)
        selector = data.draw(
            st.sampled_from([name, f"{name}{{{matchers}}}", f'{{__name__="{name}",{matchers}}}'])
        )
        wrapped = data.draw(
            st.sampled_from(
                [
                    selector,
                    f"rate({selector}[5m])",
                    f"sum by ({', '.join(labels)}) (rate({selector}[5m] offset 1h))",
                    f"histogram_quantile(0.95, sum without ({labels[0]}) ({selector}))",
                    f'label_replace({selector}, "{labels[0]}", "x", "", "")',
                    f"max_over_time({selector}[1h:1m])",
                ]
            )
        )
        parts.append(wrapped)
    operator = data.draw(st.sampled_from([" + ", " and ", f" / on ({labels[0]}) ", " or "]))
    assert metric_names(operator.join(parts)) == set(names)
