"""The selective Prometheus text parser: what it returns, what it skips, and when it refuses."""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.errors import ParseError
from exporter.vllm.promtext import SUFFIXES, Exposition, parse_exposition, wanted_families

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.vllm.promtext import TextSample, WantedFamilies


def _flat(exposition: Exposition) -> list[tuple[str, dict[str, str], float, float | None]]:
    return [(s.name, dict(s.labels), s.value, s.timestamp) for s in exposition.samples]


def _same_value(left: float, right: float) -> bool:
    return (math.isnan(left) and math.isnan(right)) or left == right


PAYLOAD = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 15.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:unwanted gauge
vllm:unwanted{engine="0"} 1.0
# TYPE vllm:e2e histogram
vllm:e2e_bucket{engine="0",le="1.0"} 2.0
vllm:e2e_bucket{engine="0",le="+Inf"} 5.0
vllm:e2e_count{engine="0"} 5.0
vllm:e2e_sum{engine="0"} 9.5
"""
WANTED = ["vllm:num_requests_running", "vllm:num_preemptions", "vllm:e2e"]


def test_returns_only_samples_of_wanted_families() -> None:
    """Samples of families that were not asked for never come back."""
    exposition = parse_exposition(PAYLOAD, WANTED)
    assert {s.family for s in exposition.samples} == set(WANTED)
    assert all("unwanted" not in s.name for s in exposition.samples)


def test_maps_suffixed_sample_names_back_to_their_family() -> None:
    """`_bucket/_count/_sum/_total/_created` samples belong to the family, with the suffix kept."""
    exposition = parse_exposition(PAYLOAD, WANTED)
    pairs = [(s.family, s.suffix) for s in exposition.samples]
    assert pairs == [
        ("vllm:num_requests_running", ""),
        ("vllm:num_preemptions", "_total"),
        ("vllm:num_preemptions", "_created"),
        ("vllm:e2e", "_bucket"),
        ("vllm:e2e", "_bucket"),
        ("vllm:e2e", "_count"),
        ("vllm:e2e", "_sum"),
    ]
    assert [s.name for s in exposition.samples][1] == "vllm:num_preemptions_total"


def test_an_exact_family_name_wins_over_a_suffixed_reading() -> None:
    """A histogram named `x_total` is wanted as such: its buckets are not counter samples of x."""
    payload = 'it_total_bucket{le="1"} 1\nit_total_count 1\nit_total_sum 1\nit_total 7\n'
    exposition = parse_exposition(payload, ["it_total", "it"])
    assert [(s.family, s.suffix) for s in exposition.samples] == [
        ("it_total", "_bucket"),
        ("it_total", "_count"),
        ("it_total", "_sum"),
        ("it_total", ""),
    ]


def test_a_single_family_may_be_named_by_a_bare_string() -> None:
    """`wanted="ab"` is the family ab, not the families "a" and "b"."""
    exposition = parse_exposition("ab 1\na 2\nb 3\n", "ab")
    assert _flat(exposition) == [("ab", {}, 1.0, None)]


def test_left_out_suffixes_are_skipped_like_unwanted_families() -> None:
    """A family compiled without `_created` never returns its creation timestamps."""
    wanted = wanted_families(WANTED, suffixes=("_total", "_bucket", "_count", "_sum"))
    exposition = parse_exposition(PAYLOAD, wanted)
    assert "_created" not in {s.suffix for s in exposition.samples}
    assert len(exposition.samples) == 6


def test_records_declared_types_and_names() -> None:
    """TYPE lines give the wanted families' types (a `_created` gauge does not override them)."""
    exposition = parse_exposition(PAYLOAD, WANTED)
    assert exposition.types == {
        "vllm:num_requests_running": "gauge",
        "vllm:num_preemptions": "counter",
        "vllm:e2e": "histogram",
    }
    assert {"vllm:num_preemptions_total", "vllm:num_preemptions_created", "vllm:unwanted"} <= (
        exposition.declared
    )


def test_skips_comments_blank_lines_and_unknown_families() -> None:
    """Free comments, `# EOF`, blank lines and families nobody asked for cost nothing."""
    payload = "\n# a free comment\n#\n\nfoo 1\n# EOF\nvllm:num_requests_running 2\n\n"
    exposition = parse_exposition(payload, WANTED)
    assert _flat(exposition) == [("vllm:num_requests_running", {}, 2.0, None)]


def test_keeps_samples_of_a_family_that_are_out_of_order() -> None:
    """Samples of one family separated by other families' lines all come back, in order."""
    payload = 'a{x="1"} 1\nb 2\na{x="2"} 3\n# TYPE c gauge\nc 4\na{x="3"} 5\n'
    exposition = parse_exposition(payload, ["a"])
    assert [s.labels["x"] for s in exposition.samples] == ["1", "2", "3"]
    assert [s.lineno for s in exposition.samples] == [1, 3, 6]


def test_unescapes_label_values_and_keeps_quoted_commas_and_braces() -> None:
    r"""`\"`, `\\` and `\n` are unescaped; commas, braces and `=` inside quotes are text."""
    payload = r'a{p="say \"hi\"",q="C:\\dir\\",r="one\ntwo",s="x,y={z}",t="# not a comment"} 1'
    (sample,) = parse_exposition(payload, ["a"]).samples
    assert sample.labels == {
        "p": 'say "hi"',
        "q": "C:\\dir\\",
        "r": "one\ntwo",
        "s": "x,y={z}",
        "t": "# not a comment",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NaN", math.nan),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("1.5e-3", 0.0015),
        ("2E+10", 2e10),
        ("-0", 0.0),
        ("17", 17.0),
    ],
)
def test_reads_special_and_exponent_values(text: str, expected: float) -> None:
    """NaN, ±Inf and exponent floats are read as Go's strconv.ParseFloat reads them."""
    (sample,) = parse_exposition(f'a{{x="1"}} {text}\n', ["a"]).samples
    assert _same_value(sample.value, expected)


def test_reads_an_optional_timestamp_as_written() -> None:
    """A timestamp after the value is kept as written (milliseconds in 0.0.4)."""
    payload = 'a{x="1"} 1 1700000000000\na 2 -5\na{x="2"} 3\n'
    stamps = [s.timestamp for s in parse_exposition(payload, ["a"]).samples]
    assert stamps == [1.7e12, -5.0, None]


def test_crlf_line_endings_parse_like_lf() -> None:
    """A payload with CRLF line endings gives the same samples and line numbers as with LF."""
    assert _flat(parse_exposition(PAYLOAD.replace("\n", "\r\n"), WANTED)) == _flat(
        parse_exposition(PAYLOAD, WANTED)
    )


def test_tolerates_blanks_where_the_format_allows_them() -> None:
    """Leading blanks, blanks and tabs around labels and a trailing comma are all accepted."""
    payload = '  a{x="1"} 1\na {x="2"} 2\na{ x = "3" ,\ty="4" , } 3\na{x="5",}\t5  \n\ta 6\n'
    samples = parse_exposition(payload, ["a"]).samples
    assert [(dict(s.labels), s.value) for s in samples] == [
        ({"x": "1"}, 1.0),
        ({"x": "2"}, 2.0),
        ({"x": "3", "y": "4"}, 3.0),
        ({"x": "5"}, 5.0),
        ({}, 6.0),
    ]


def test_skips_openmetrics_exemplars() -> None:
    """An OpenMetrics exemplar after `#` is not part of the value."""
    payload = 'a_bucket{le="1"} 4 # {trace_id="abc"} 0.5 1.7e9\na_total 2 # {t="x"} 1\n'
    samples = parse_exposition(payload, ["a"]).samples
    assert [(s.name, s.value, s.timestamp) for s in samples] == [
        ("a_bucket", 4.0, None),
        ("a_total", 2.0, None),
    ]


def test_bytes_and_str_payloads_give_the_same_samples() -> None:
    """The payload may come as the HTTP body's bytes or as decoded text."""
    assert parse_exposition(PAYLOAD.encode(), WANTED) == parse_exposition(PAYLOAD, WANTED)


def test_a_byte_order_mark_does_not_hide_the_first_line() -> None:
    """A UTF-8 BOM before the first sample is not read as part of its name."""
    (sample,) = parse_exposition("\ufeffa 1\n".encode(), ["a"]).samples
    assert sample.value == 1.0


def test_samples_with_the_same_label_text_have_equal_labels() -> None:
    """Label sets shared between lines (the same `le` in two histograms) read the same."""
    payload = 'a_bucket{le="1",m="x"} 1\nb_bucket{le="1",m="x"} 2\n'
    first, second = parse_exposition(payload, ["a", "b"]).samples
    assert first.labels == second.labels == {"le": "1", "m": "x"}


MALFORMED = [
    pytest.param('a{x="1"}', "missing value", id="no-value"),
    pytest.param("a", "missing value", id="bare-name"),
    pytest.param('a{x="1"} one', "not a number", id="bad-value"),
    pytest.param('a{x="1"} 1_000', "not a number", id="underscore-value"),
    pytest.param('a{x="1"} \u0661', "not a number", id="non-ascii-digit"),
    pytest.param('a{x="1"} 1 2 3', "expected 'value [timestamp]'", id="extra-token"),
    pytest.param('a{x="1"} 1 soon', "timestamp", id="bad-timestamp"),
    pytest.param('a{x="1"} 1#2', "found ' 1#2'", id="hash-glued-to-value"),
    pytest.param("a 1#2", "found '1#2'", id="hash-glued-to-label-less-value"),
    pytest.param('a{x="1"} 1 2#3', "found ' 1 2#3'", id="hash-glued-to-timestamp"),
    pytest.param("a 1 #2", "found '1 #2'", id="comment-that-is-no-exemplar"),
    pytest.param('a{x="1"} 1 # {t="x"}', "exemplar", id="exemplar-without-value"),
    pytest.param('a{x="1"} 1 # {t="x"} z', "exemplar value 'z'", id="bad-exemplar-value"),
    pytest.param('a{x="1"} 1\x0c', "value '1\\x0c' is not a number", id="form-feed-after-value"),
    pytest.param("a \x0b1", "is not a number", id="vertical-tab-before-value"),
    pytest.param('a{x="1"} 1 2\x0c', "timestamp", id="form-feed-after-timestamp"),
    pytest.param('a{x="1" 1', "expected ',' or '}'", id="unclosed-label-set"),
    pytest.param('a{x="1', "no closing quote", id="unterminated-value"),
    pytest.param("a{x=1} 1", "not quoted", id="unquoted-value"),
    pytest.param('a{x"1"} 1', "expected '='", id="missing-equals"),
    pytest.param('a{1x="1"} 1', "bad label name", id="bad-label-name"),
    pytest.param('a{x="1",...} 1', "bad label name", id="docs-elision"),
    pytest.param('a{x="1",x="2"} 1', "duplicate label name", id="duplicate-label"),
    pytest.param('a{x="\\t"} 1', "invalid escape", id="bad-escape"),
    pytest.param('a{x="1"', "label set not closed", id="truncated-line"),
    pytest.param("# TYPE a gaug", "unknown metric type", id="bad-type"),
    pytest.param("# TYPE a", "without a type", id="type-without-type"),
]


@pytest.mark.parametrize(("line", "problem"), MALFORMED)
def test_a_malformed_line_of_a_wanted_family_names_its_line(line: str, problem: str) -> None:
    """A malformed line of a wanted family raises ParseError naming the line and the problem."""
    payload = f"# a comment\nb 1\n{line}\nb 2\n"
    with pytest.raises(ParseError, match=r"^line 3: .*a: ") as caught:
        parse_exposition(payload, ["a"])
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("line", "problem"), MALFORMED)
def test_a_malformed_line_of_an_unwanted_family_is_skipped(line: str, problem: str) -> None:
    """The same malformed lines cost nothing when their family is not wanted."""
    payload = f"{line}\nb 1\n"
    assert _flat(parse_exposition(payload, ["b"])) == [("b", {}, 1.0, None)], problem


def test_invalid_utf8_fails_only_in_a_wanted_line() -> None:
    """Bytes that are not UTF-8 raise in a wanted line and are skipped in any other."""
    payload = b'b{x="\xff"} 1\na 2\n'
    assert _flat(parse_exposition(payload, ["a"])) == [("a", {}, 2.0, None)]
    with pytest.raises(ParseError, match=r"^line 1: .*not valid UTF-8"):
        parse_exposition(payload, ["b"])


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b'a{x="\xff"} 1', id="plain"),
        pytest.param(b'a{x="\xff",y="\\n"} 1', id="escapes"),
        pytest.param(b' a{x="\xff"} 1', id="leading-blank"),
        pytest.param(b'a {x="\xff"} 1', id="blank-before-labels"),
        pytest.param(b'a{x="1"} 1 # {t="\xff"} 1', id="in-an-exemplar"),
        pytest.param(b"a 1 # {} 1\xff", id="after-an-exemplar"),
        pytest.param(b'a{x="1"} 1\na{x="\xff"} 1', id="second-line-of-a-run"),
    ],
)
def test_invalid_utf8_is_refused_on_every_path_of_a_wanted_line(line: bytes) -> None:
    """Whichever way a wanted line is read, an invalid byte in it is refused, never kept."""
    with pytest.raises(ParseError, match=r"^line \d: .*not valid UTF-8"):
        parse_exposition(line + b"\n", ["a"])
    surrogates = line.decode("utf-8", "surrogateescape") + "\n"  # the same, as a str payload
    with pytest.raises(ParseError, match="not valid UTF-8"):
        parse_exposition(surrogates, ["a"])


def test_names_of_lines_never_read_keep_no_invalid_bytes() -> None:
    """A HELP or TYPE line of another family with an invalid byte leaves no name behind."""
    payload = b"# HELP vllm:\xff x\n# TYPE vllm:\xfe gauge\n# TYPE vllm:ok gauge\na 1\n"
    assert parse_exposition(payload, ["a"]).declared == {"vllm:ok"}


def test_comment_names_end_at_any_blank() -> None:
    """A HELP or TYPE name ends at a blank of any kind, as the whitespace split reads it."""
    payload = "# HELP vllm:a\x0cmore help\n# TYPE vllm:b\x0bgauge\n# HELP vllm:c help\na 1\n"
    assert parse_exposition(payload, ["a"]).declared == {"vllm:a", "vllm:b", "vllm:c"}


HOSTILE_LINES = [
    pytest.param("a{x=" + '"' + "\\" * 200_001 + '"} 1', id="backslashes"),
    pytest.param("a{x=" + '\\"' * 100_000 + "} 1", id="escaped-quotes"),
    pytest.param("a{" + 'x="1",' * 50_000 + "} 1", id="duplicate-labels"),
    pytest.param("a{" + ",".join(f'l{i}="{i}"' for i in range(30_000)) + "} 1", id="many"),
    pytest.param("a" + " 1" * 100_000, id="many-tokens"),
    pytest.param("a{" + "{" * 200_000 + "} 1", id="braces"),
    pytest.param('a{x="' + "} " * 100_000 + '"} 1', id="closers-in-a-value"),
]


@pytest.mark.parametrize("line", HOSTILE_LINES)
def test_hostile_lines_cost_linear_time(line: str) -> None:
    """A 200 kB adversarial line of a wanted family is parsed or refused within a second."""
    start = time.perf_counter()
    try:
        parse_exposition(line + "\n", ["a"])
    except ParseError as error:
        message = str(error)
    else:
        message = "line 1: parsed"
    assert message.startswith("line 1: ")
    # Quadratic work on 200 kB would take minutes; linear work takes milliseconds.
    assert time.perf_counter() - start < 1.0


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_arbitrary_text_either_parses_or_raises_parse_error(text: str) -> None:
    """No input makes the parser fail with anything but ParseError."""
    with contextlib.suppress(ParseError):
        parse_exposition(text, ["a", "b"])


# --- agreement with prometheus_client's parser on generated well-formed expositions ----------

_NAMES = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True).map(lambda name: f"m_{name}")
_LABEL_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True).filter(
    lambda name: name not in ("le", "quantile")
)
_LABEL_VALUES = st.text(alphabet=st.sampled_from([*'ab ,={}#"\\\n\té€', "\U0001f600"]), max_size=8)
_VALUES = st.floats(allow_nan=True, allow_infinity=True)
_TIMESTAMPS = st.none() | st.integers(min_value=0, max_value=2**52)


def _go_float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample_line(
    name: str, labels: dict[str, str], value: float, timestamp: int | None, *, braces: bool
) -> str:
    label_text = ",".join(f'{key}="{_escape(text)}"' for key, text in labels.items())
    head = f"{name}{{{label_text}}}" if labels or braces else name
    stamp = "" if timestamp is None else f" {timestamp}"
    return f"{head} {_go_float(value)}{stamp}"


@st.composite
def _expositions(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A well-formed exposition of a few families of every type, and the wanted subset."""
    names = draw(st.lists(_NAMES, min_size=1, max_size=5, unique=True))
    # No family may be another's name plus a suffix: then grouping is ambiguous by design.
    names = [n for n in names if not any(n == o + s for o in names for s in SUFFIXES)]
    lines: list[str] = []
    late: list[str] = []
    for name in names:
        kind = draw(st.sampled_from(["gauge", "counter", "histogram", "summary", "untyped"]))
        series = draw(
            st.lists(st.dictionaries(_LABEL_NAMES, _LABEL_VALUES, max_size=3), max_size=3)
        )
        type_name = f"{name}_total" if kind == "counter" else name
        if draw(st.booleans()):
            lines.append(f"# HELP {type_name} Some help, with \\\\ and \\n escapes.")
        lines.append(f"# TYPE {type_name} {kind}")
        for labels in series:
            ts = draw(_TIMESTAMPS)
            braces = draw(st.booleans())
            if kind == "histogram":
                for le in ("0.5", "1.0", "+Inf"):
                    value = draw(_VALUES)
                    bucket = {**labels, "le": le}
                    lines.append(_sample_line(f"{name}_bucket", bucket, value, ts, braces=braces))
                for suffix in ("_count", "_sum"):
                    value = draw(_VALUES)
                    lines.append(_sample_line(name + suffix, labels, value, ts, braces=braces))
            elif kind == "summary":
                value = draw(_VALUES)
                quantile = {**labels, "quantile": "0.5"}
                lines.append(_sample_line(name, quantile, value, ts, braces=braces))
                lines.append(_sample_line(f"{name}_count", labels, draw(_VALUES), ts, braces=True))
            else:
                sample = _sample_line(type_name, labels, draw(_VALUES), ts, braces=braces)
                (late if draw(st.booleans()) and lines else lines).append(sample)
    wanted = draw(st.lists(st.sampled_from(names), min_size=1, unique=True)) if names else []
    return "\n".join(lines + late) + "\n", wanted


def _peer_samples(
    text: str, wanted: WantedFamilies
) -> list[tuple[str, dict[str, str], float, float | None]]:
    flat = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted.lookup:
                stamp = None if sample.timestamp is None else float(sample.timestamp)
                flat.append((sample.name, sample.labels, float(sample.value), stamp))
    return flat


def _ours(
    text: str, wanted: Iterable[str]
) -> list[tuple[str, dict[str, str], float, float | None]]:
    # prometheus_client reads 0.0.4 timestamps as milliseconds and returns seconds.
    return [
        (name, labels, value, None if stamp is None else stamp / 1000)
        for name, labels, value, stamp in _flat(parse_exposition(text, wanted))
    ]


@settings(max_examples=150, deadline=None)
@given(_expositions())
def test_agrees_with_prometheus_client_on_wanted_families(case: tuple[str, list[str]]) -> None:
    """On well-formed input we return exactly the peer parser's samples of the wanted families."""
    text, wanted = case
    ours = _ours(text, wanted)
    peer = _peer_samples(text, wanted_families(wanted))
    assert len(ours) == len(peer)
    for mine, theirs in zip(ours, peer, strict=True):
        assert mine[:2] == theirs[:2]
        assert _same_value(mine[2], theirs[2])
        assert mine[3] == theirs[3]


@settings(max_examples=100, deadline=None)
@given(_expositions(), st.data())
def test_wanting_more_families_never_changes_the_samples_of_the_others(
    case: tuple[str, list[str]], data: st.DataObject
) -> None:
    """The samples of a family do not depend on which other families are wanted."""
    text, wanted = case
    fewer = data.draw(st.lists(st.sampled_from(wanted), unique=True)) if wanted else []

    def comparable(samples: Iterable[TextSample]) -> list[tuple[object, ...]]:
        return [(*s[:3], repr(s.value), *s[4:]) for s in samples]  # repr: NaN equals NaN

    all_of_them = [s for s in parse_exposition(text, wanted).samples if s.family in fewer]
    assert comparable(parse_exposition(text, fewer).samples) == comparable(all_of_them)


def test_samples_past_the_cap_are_counted_not_kept() -> None:
    """A payload of endless wanted series keeps max_samples of them and counts the rest."""
    text = "".join(f'vllm:x{{engine="{i}"}} 1\n' for i in range(1000))
    exposition = parse_exposition(text, ["vllm:x"], max_samples=10)
    assert len(exposition.samples) == 10
    assert exposition.overflow == 990
    assert parse_exposition(text, ["vllm:x"]).overflow == 0


# --- agreement with prometheus_client's parser line by line, on generated and mutated lines ---

# Characters a mutation inserts or substitutes: the format's own punctuation, digits and number
# letters, blanks and the whitespace that is not a blank, non-ASCII digits and a lone surrogate
# (what an invalid byte becomes).
_MUTATIONS = [*' \t#{}",=\\_.eE+-019naIf:', "\x0b", "\x0c", "\x1f", "\r", "\xa0", "\u0661", "²"]
_MUTATIONS.append("\udcff")


@st.composite
def _mutated_lines(draw: st.DrawFn) -> str:
    """A well-formed sample line of family `m_a` (maybe with an exemplar), then a few edits."""
    name = draw(st.sampled_from(["m_a", "m_a_total", "m_a_bucket", "m_a_sum"]))
    labels = draw(st.dictionaries(_LABEL_NAMES, _LABEL_VALUES, max_size=3))
    line = _sample_line(name, labels, draw(_VALUES), draw(_TIMESTAMPS), braces=draw(st.booleans()))
    if draw(st.booleans()):
        line += ' # {trace_id="ab"} 0.5'
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        where = draw(st.integers(min_value=0, max_value=len(line)))
        edit = draw(st.sampled_from(["insert", "delete", "replace"]))
        char = draw(st.sampled_from(_MUTATIONS))
        if edit == "insert":
            line = line[:where] + char + line[where:]
        elif edit == "delete":
            line = line[:where] + line[where + 1 :]
        else:
            line = line[:where] + char + line[where + 1 :]
    return line


def _peer_line(line: str) -> tuple[str, dict[str, str], float] | None:
    """prometheus_client's reading of one line: its one sample, or None when it refuses it."""
    try:
        samples = [s for f in text_string_to_metric_families(line + "\n") for s in f.samples]
    except Exception:  # noqa: BLE001 - the peer refuses with ValueError, IndexError, ...
        return None
    if len(samples) != 1:
        return None
    (sample,) = samples
    return sample.name, sample.labels, float(sample.value)


@settings(max_examples=500, deadline=None)
@given(_mutated_lines())
def test_where_both_parsers_accept_a_line_they_read_it_the_same(line: str) -> None:
    """A line both we and prometheus_client accept has the same name, labels and value in both."""
    try:
        ours = parse_exposition(line + "\n", ["m_a"]).samples
    except ParseError:
        ours = ()
    raw = (line + "\n").encode("utf-8", "surrogateescape")
    try:
        from_bytes = parse_exposition(raw, ["m_a"]).samples
    except ParseError:
        from_bytes = ()
    assert [s[:3] for s in ours] == [s[:3] for s in from_bytes]  # str or bytes: one reading
    for sample in ours:
        # Whatever we accept can be written again: no lone surrogate from an invalid byte.
        assert all(_encodable(k) and _encodable(v) for k, v in sample.labels.items())
    peer = _peer_line(line)
    if ours and peer is not None:
        (sample,) = ours
        assert (sample.name, dict(sample.labels)) == peer[:2]
        assert _same_value(sample.value, peer[2])


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
