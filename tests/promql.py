"""Find the metric names a PromQL expression reads: a small lexer, not a grep.

Used by the tests that prove every name in the alert rules (and dashboards) exists in real
exposition. The public surface is :func:`metric_names`, :func:`number_literals` and
:class:`PromQLSyntaxError`::

    >>> sorted(metric_names('sum by (job) (rate(vllm:num_preemptions_total{engine="0"}[5m]))'))
    ['vllm:num_preemptions_total']
    >>> number_literals('rate(x[5m] offset 1d) > 0.05 and y > 0')
    ['0.05', '0']

What counts as a metric name: an identifier that is not a keyword, not a function or aggregation
being called, and not a label name (inside ``{...}``, or in the label lists of ``by``,
``without``, ``on``, ``ignoring``, ``group_left`` and ``group_right``); plus the value of a
``__name__="..."`` matcher. Strings, numbers, durations, ranges and subqueries (``[...]``),
``offset`` and ``@`` modifiers, comments and Grafana variables (``$job``, ``${job}``,
``[$__rate_interval]``) are skipped.

It raises :class:`PromQLSyntaxError` rather than guess: on an unknown function (a typo such as
``rates(...)`` would otherwise read as a metric name), a regex matcher on ``__name__`` (the name
cannot be known), an unterminated string, unbalanced brackets, or a character PromQL does not use.
It does not check the grammar beyond that: ``promtool check rules`` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["PromQLSyntaxError", "metric_names", "number_literals", "with_matchers"]


class PromQLSyntaxError(ValueError):
    """The expression cannot be read: the message says what and where (character offset)."""


#: Functions of Prometheus 2.x and 3.x (https://prometheus.io/docs/prometheus/latest/querying/functions/).
_FUNCTION_WORDS = """
    abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
    clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year
    days_in_month deg delta deriv double_exponential_smoothing exp floor histogram_avg
    histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
    histogram_sum holt_winters hour idelta increase info irate label_join label_replace
    last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi
    predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin
    sinh sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time stdvar_over_time
    sum_over_time tan tanh time timestamp vector year
"""
FUNCTIONS = frozenset(_FUNCTION_WORDS.split())

#: Aggregation operators (keywords, so any case): called like functions, maybe ``by`` first.
_AGGREGATION_WORDS = """
    avg bottomk count count_values group limit_ratio limitk max min quantile stddev stdvar sum
    topk
"""
AGGREGATIONS = frozenset(_AGGREGATION_WORDS.split())

#: Keywords followed by a parenthesised list of label names (optional for group_*).
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})

#: Other words that are never metric names in expression position.
KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool", "atan2", "inf", "nan"})

_TOKEN = re.compile(
    r"""
      (?P<space>\s+|\#[^\n]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
    | (?P<variable>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
    | (?P<number>0[xX][0-9a-fA-F]+
                |(?:\d+(?:ms|[smhdwy]))+
                |(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=,@(){}\[\]])
    """,
    re.VERBOSE,
)

_OPENERS = {"(": ")", "{": "}", "[": "]"}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    pos: int


def _tokens(expr: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            if expr[pos] in "\"'`":
                raise PromQLSyntaxError(f"unterminated string at {pos}: {expr[pos : pos + 30]!r}")
            raise PromQLSyntaxError(f"unexpected character {expr[pos]!r} at {pos}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append(_Token(kind, match.group(), pos))
        pos = match.end()
    return tokens


def _closing(tokens: list[_Token], start: int) -> int:
    """Index of the bracket that closes ``tokens[start]``; raise when it is unbalanced."""
    stack: list[str] = []
    for index in range(start, len(tokens)):
        text = tokens[index].text if tokens[index].kind == "op" else ""
        if text in _OPENERS:
            stack.append(_OPENERS[text])
        elif text in _OPENERS.values():
            if not stack or stack.pop() != text:
                raise PromQLSyntaxError(f"unbalanced {text!r} at {tokens[index].pos}")
            if not stack:
                return index
    raise PromQLSyntaxError(f"{tokens[start].text!r} at {tokens[start].pos} is never closed")


def _matcher_names(tokens: list[_Token], start: int, end: int) -> set[str]:
    """Metric names given inside ``{...}`` (tokens[start] is ``{``, tokens[end] is ``}``)."""
    names: set[str] = set()
    index = start + 1
    while index < end:
        token = tokens[index]
        alone = tokens[index - 1].text in {"{", ","} and tokens[index + 1].text in {",", "}"}
        if token.kind == "string" and alone:
            # Prometheus 3's quoted metric name: {"my.metric", job="x"}.
            names.add(_unquote(token.text))
        elif token.text == "__name__" and index + 2 < end:
            op, value = tokens[index + 1], tokens[index + 2]
            if op.text != "=" or value.kind != "string":
                raise PromQLSyntaxError(
                    f"__name__ matched with {op.text!r} at {op.pos}: the metric name is unknown"
                )
            names.add(_unquote(value.text))
        index += 1
    return names


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    if literal[0] == "`":
        return body
    return re.sub(r"\\(.)", r"\1", body)


def _next_text(tokens: list[_Token], index: int) -> str:
    return tokens[index + 1].text if index + 1 < len(tokens) else ""


def _identifier(tokens: list[_Token], index: int) -> tuple[str | None, int]:
    """Read the identifier at ``index``: (its metric name, or None; the index after it)."""
    token = tokens[index]
    word, following = token.text, _next_text(tokens, index)
    lowered = word.lower()
    if lowered in LABEL_LIST_KEYWORDS:
        # by (a, b), on (c), group_left (d): label names, not metrics.
        return None, _closing(tokens, index + 1) + 1 if following == "(" else index + 1
    if index > 0 and tokens[index - 1].text == "@":
        # x @ start() / x @ end(): a modifier, not a call of a metric.
        return None, _closing(tokens, index + 1) + 1 if following == "(" else index + 1
    if lowered in KEYWORDS:
        return None, index + 1
    if lowered in AGGREGATIONS and (following == "(" or following.lower() in {"by", "without"}):
        return None, index + 1
    if following == "(":
        if word not in FUNCTIONS:
            raise PromQLSyntaxError(f"unknown function {word!r} at {token.pos}")
        return None, index + 1
    return word, index + 1


def metric_names(expr: str) -> set[str]:
    """The metric names that ``expr`` selects (see the module docstring for the rules)."""
    return {name for name, _ in _selectors(expr)}


def with_matchers(expr: str, matchers: Callable[[str], str | None]) -> str:
    """``expr`` with ``matchers(name)`` (PromQL matchers, no braces) added to each selector.

    Names for which ``matchers`` returns None are left alone. A selector with braces gets the
    matchers first inside them (``x{a="b"}`` becomes ``x{m,a="b"}``), one without gets
    ``{m}``; ranges, offsets and everything else stay as they are. This is how the Helm chart
    scopes the rule file per release (``_rules.tpl``), done with this lexer instead of regexes,
    to compare the two.
    """
    tokens = _tokens(expr)
    edits: list[tuple[int, str]] = []
    for name, index in _selectors(expr):
        added = matchers(name)
        if added is None or index < 0:
            continue
        token = tokens[index]
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if following is not None and following.text == "{":
            edits.append((following.pos + 1, added + ","))
        else:
            edits.append((token.pos + len(token.text), "{" + added + "}"))
    out = expr
    for pos, text in sorted(edits, reverse=True):
        out = out[:pos] + text + out[pos:]
    return out


def _selectors(expr: str) -> list[tuple[str, int]]:
    """(metric name, index of its identifier token, or -1 for a name given in braces)."""
    tokens = _tokens(expr)
    names: list[tuple[str, int]] = []
    depth = 0  # of parentheses, whose contents are read token by token
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.kind == "ident":
            start = index
            name, index = _identifier(tokens, index)
            if name is not None:
                names.append((name, start))
            continue
        if token.kind == "op" and token.text in {"{", "["}:
            end = _closing(tokens, index)
            if token.text == "{":
                names += [(name, -1) for name in sorted(_matcher_names(tokens, index, end))]
            index = end + 1
            continue
        if token.kind == "op" and token.text in {"(", ")", "}", "]"}:
            depth += 1 if token.text == "(" else -1
            if depth < 0 or token.text in {"}", "]"}:
                raise PromQLSyntaxError(f"unbalanced {token.text!r} at {token.pos}")
        index += 1
    if depth:
        raise PromQLSyntaxError(f"{depth} unclosed '(' in {expr!r}")
    return names


def number_literals(expr: str) -> list[str]:
    """The numbers written in ``expr``, in order, as written: thresholds and constants.

    Durations are not numbers here: those of ranges and subqueries (``[5m]``, ``[1h:1m]``) and of
    ``offset`` are skipped, as are numbers inside strings and ``@`` timestamps. ``inf`` and
    ``nan`` count as numbers. The expression is checked as :func:`metric_names` checks it.
    """
    metric_names(expr)  # the same errors for the same unreadable input
    tokens = _tokens(expr)
    numbers: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.kind == "op" and token.text in {"[", "{"}:
            index = _closing(tokens, index) + 1
            continue
        previous = tokens[index - 1].text.lower() if index else ""
        is_number = token.kind == "number" or token.text.lower() in {"inf", "nan"}
        if is_number and previous not in {"offset", "@"}:
            numbers.append(token.text)
        index += 1
    return numbers
