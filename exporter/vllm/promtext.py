r"""A fast, selective parser of the Prometheus text exposition format.

The sidecar parses vLLM's ``/metrics`` every few seconds, for every target, and uses a small part
of it: a few dozen families out of a hundred, on payloads that reach a megabyte under data
parallelism. So this parser is *selective*: the caller names the families it wants, and every
other line costs one dictionary miss on its metric name. Only samples of wanted families are
tokenised, validated and returned.

Format: the text exposition format 0.0.4, plus what is cheap of OpenMetrics (``# EOF``, ``# UNIT``
and other comments are ignored, exemplars are checked and skipped, float timestamps are
accepted). Lines end with ``\n`` (``\r\n`` too). Names in ``# HELP``/``# TYPE`` lines and sample
names are matched literally; a sample named ``<family>_bucket``, ``_count``, ``_sum``, ``_total``
or ``_created`` belongs to ``<family>`` (an exact name wins over a suffixed one, so the histogram
``vllm:iteration_tokens_total`` can be wanted as such).

Strictness: where a value could be misread, a line of a wanted family is refused as the
reference parsers (prometheus/common, client_python) refuse it: after the labels come a value,
then only a timestamp and an exemplar (``# {labels} value [timestamp]``), each after a blank
(``1#2`` is not a value); a number is ASCII, without ``_`` or control characters around it; an
invalid UTF-8 byte anywhere in the line is an error, whatever the line's shape, so every label
accepted can be written out again. The documented leniencies, none of which can change what a
line reads as (docs/reliability.md, "The parser against the reference parsers"):

- lines of other families are never looked at, malformed or not (Prometheus refuses the whole
  scrape); their invalid bytes are skipped with them;
- OpenMetrics exemplars after a 0.0.4 value are skipped (Prometheus's 0.0.4 parser refuses them,
  client_python reads the exemplar's value as the timestamp); float timestamps are kept as
  written;
- ``\r\n`` line ends, a UTF-8 byte-order mark, blanks and tabs around the label set and its
  ``=`` and ``,``, a trailing comma, no blank between ``}`` and the value;
- ``# TYPE`` lines are checked only for wanted families, and neither their order nor the order
  of samples is checked (the metrics layer refuses a series written twice).

Errors: a malformed line of a wanted family raises :class:`~exporter.errors.ParseError` naming
the line number and the problem. Malformed lines of other families are skipped unseen, as are
comments, blank lines and unknown families. Work per line is linear in its length: no regular
expression here can backtrack more than a constant number of times per character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from exporter.errors import ParseError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "METRIC_TYPES",
    "SUFFIXES",
    "Exposition",
    "TextSample",
    "WantedFamilies",
    "parse_exposition",
    "wanted_families",
]

#: Sample-name suffixes that map a sample back to its family (histograms, summaries, counters).
SUFFIXES: tuple[str, ...] = ("_bucket", "_count", "_sum", "_total", "_created")

#: Types a ``# TYPE`` line may declare: the 0.0.4 ones and OpenMetrics' additions.
METRIC_TYPES: frozenset[str] = frozenset(
    {
        "counter",
        "gauge",
        "histogram",
        "summary",
        "untyped",
        "unknown",
        "info",
        "stateset",
        "gaugehistogram",
    }
)

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The unquoted parts of a plain label set: `name=` first, then `,name=`.
_FIRST_LABEL_PART = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*=")
_NEXT_LABEL_PART = re.compile(r",[a-zA-Z_][a-zA-Z0-9_]*=")

_BLANKS = re.compile(r"[ \t]+")
_NAME_END = re.compile(r"[ \t{]")
# What may follow the labels: a value, a timestamp, an OpenMetrics exemplar, each after a blank
# (none needed after `}`), and nothing else: "1#2" is not a value, "1 2 3" has a token too many.
# Each repeated piece is one character of a class disjoint from what may follow it (or one whole
# quoted string), so a line has one parse and a failing match backtracks linearly. No possessive
# quantifiers: Python 3.11.2 (Debian 12's) mis-matches some of them (an exemplar after a value).
_TAIL = re.compile(
    r"[ \t]*([^ \t#]+)(?:[ \t]+([^ \t#]+))?"
    r'(?:[ \t]+#[ \t]+\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}[ \t]+([^ \t]+)'
    r"(?:[ \t]+([^ \t]+))?)?[ \t]*\Z"
)

_UNSEEN: tuple[str, ...] = ("\0",)  # not a label-name sequence: NUL is not a name character
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_EXCERPT_CHARS = 80


class TextSample(NamedTuple):
    """One sample of a wanted family, as written in the exposition.

    ``family`` is the wanted name it matched, ``suffix`` the rest of the sample name (``""``,
    ``"_bucket"``, ``"_total"``...). ``labels`` is shared by the samples of one payload that have
    the same label text: read it, never change it. ``timestamp`` is as written, in the format's unit
    (milliseconds in 0.0.4, seconds in OpenMetrics); vLLM never writes one. ``lineno`` is the
    1-based line of the payload, for error messages that point at the input.
    """

    family: str
    suffix: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None
    lineno: int

    @property
    def name(self) -> str:
        """The sample name as written: family plus suffix."""
        return self.family + self.suffix


@dataclass(frozen=True, slots=True)
class WantedFamilies:
    """A compiled set of wanted family names: build it once, parse with it on every poll.

    ``lookup`` maps every sample name that belongs to a wanted family (the family itself and each
    name with a suffix of :data:`SUFFIXES`) to ``(family, suffix)``.
    """

    names: frozenset[str]
    lookup: Mapping[str, tuple[str, str]] = field(repr=False)


def wanted_families(names: Iterable[str], *, suffixes: Iterable[str] = SUFFIXES) -> WantedFamilies:
    """Compile family names into a :class:`WantedFamilies` lookup.

    Counters are named without ``_total`` (``"vllm:num_preemptions"`` matches the sample
    ``vllm:num_preemptions_total``), as OpenMetrics and ``prometheus_client`` name them.
    ``suffixes`` are the sample-name suffixes that belong to a family (default
    :data:`SUFFIXES`); leave one out (``_created``) and its samples are skipped like unwanted ones.
    """
    frozen = frozenset((names,) if isinstance(names, str) else names)  # one name, not its letters
    lookup: dict[str, tuple[str, str]] = {}
    # Sorted so that the mapping of an ambiguous suffixed name never depends on set order.
    for family in sorted(frozen):
        for suffix in suffixes:
            lookup.setdefault(family + suffix, (family, suffix))
    for family in frozen:
        lookup[family] = (family, "")  # an exact family name wins over a suffixed reading
    return WantedFamilies(names=frozen, lookup=lookup)


@dataclass(frozen=True, slots=True)
class Exposition:
    """What :func:`parse_exposition` found.

    ``samples`` are the wanted samples in payload order. ``types`` maps each wanted family to
    the type its first ``# TYPE`` line declared. ``declared`` holds every name of every
    ``# HELP`` or ``# TYPE`` line, wanted or not, as written (0.0.4 counters end in ``_total``).
    """

    samples: tuple[TextSample, ...]
    types: Mapping[str, str]
    declared: frozenset[str]
    #: Samples of wanted families past ``max_samples``: counted, never built.
    overflow: int = 0
    #: Lines of wanted families longer than :data:`MAX_LINE_CHARS`: counted, never parsed.
    too_long: int = 0


# One flat loop on purpose: it runs once per line of every poll, and calls cost more than branches.
def parse_exposition(  # noqa: PLR0912, PLR0915
    payload: str | bytes,
    wanted: WantedFamilies | Iterable[str],
    *,
    max_samples: int | None = None,
) -> Exposition:
    """Parse ``payload`` and return the samples of the ``wanted`` families only.

    Raises :class:`~exporter.errors.ParseError` (naming the line) when a line of a wanted family
    is malformed or the payload is not UTF-8 where it matters; everything else is skipped.
    Past ``max_samples`` wanted samples the rest are read and counted, not kept
    (:attr:`Exposition.overflow`): a payload of a million series costs its text and its
    parsing, not a million sample objects.
    """
    if not isinstance(wanted, WantedFamilies):
        wanted = wanted_families(wanted)
    text, clean = _decode(payload)
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        if text.endswith("\r"):
            text = text[:-1]

    lookup = wanted.lookup
    room = max_samples if max_samples is not None else -1
    overflow = too_long = 0
    samples: list[TextSample] = []
    append = samples.append
    new_sample = tuple.__new__  # skips NamedTuple's Python-level __new__: this loop is hot
    types: dict[str, str] = {}
    declared: set[str] = set()
    # Label-name sequences seen in this payload, e.g. ('engine=', ',le=', ',model_name=', '')
    # -> ('engine', 'le', 'model_name'); None when not of the plain form (see _plain_label_names).
    label_names: dict[tuple[str, ...], tuple[str, ...] | None] = {}
    # Label sets repeat across families (every histogram of an engine has the same `le` labels):
    # one dict per distinct label text, shared by its samples, which is why labels are read-only.
    label_sets: dict[str, dict[str, str]] = {}
    # Value texts already read: a histogram's buckets repeat their counts (8 engines of vLLM
    # 0.32: 187 distinct texts in 1,219 samples), and a lookup costs less than the checks.
    numbers: dict[str, float] = {}

    # Samples of one series come in runs (a histogram's buckets): while lines start with the
    # `name{` of the previous plain line, its lookup result stands. The first prefix is NUL,
    # which starts no sample line.
    run_prefix, run_hit, run_brace = "\0", None, 0
    # Module constants as locals: this loop reads them for every wanted sample.
    max_line, max_label_sets, max_numbers = MAX_LINE_CHARS, MAX_LABEL_SETS, MAX_NUMBERS

    for lineno, line in enumerate(text.split("\n"), 1):
        if line.startswith(run_prefix):
            if run_hit is None:
                continue  # the commonest line: one more sample of an unwanted series
            hit, brace = run_hit, run_brace
        else:
            if not line:
                continue
            if line[0] == "#":
                # The commonest comments, `# HELP name ...` and `# TYPE name ...` of a family
                # not wanted: only the name matters. A printable name holds no blank of any
                # kind, so it is the name _comment's split would find; anything else goes there.
                if line.startswith(("# HELP ", "# TYPE ")):
                    end = line.find(" ", 7)
                    comment_name = line[7:end] if end != -1 else line[7:]
                    if (
                        comment_name
                        and comment_name.isprintable()
                        and (line[2] == "H" or comment_name not in lookup)
                    ):
                        declared.add(comment_name)
                        continue
                _comment(line, lineno, lookup, types, declared)
                continue
            brace = line.find("{")
            name = line[:brace] if brace > 0 else line
            found = lookup.get(name)
            if brace > 0 and " " not in name and "\t" not in name:
                run_prefix, run_hit, run_brace = line[: brace + 1], found, brace
                if found is None:
                    continue  # a plain name, then labels, of an unwanted family
            elif found is None:
                unusual_name, pos = _split_name(line)
                if unusual_name is None:
                    _comment(line.lstrip(" \t"), lineno, lookup, types, declared)
                    continue
                found = lookup.get(unusual_name)
                if found is None:
                    continue
                if len(line) > max_line:
                    too_long += 1
                    continue
                if not clean:
                    _check_encodable(line, lineno, found)
                labels, value, timestamp = _parse_sample_carefully(line, pos, lineno, found)
                if len(samples) == room:
                    overflow += 1
                    continue
                append(new_sample(TextSample, (*found, labels, value, timestamp, lineno)))
                continue
            hit = found
        if not clean:
            _check_encodable(line, lineno, hit)
        # The plain form, with string methods only: `name{a="x",b="y"} value`, without escapes,
        # blanks in the label set, timestamp or exemplar: what vLLM writes. Anything else,
        # errors included, takes the careful path.
        close = line.rfind("} ")
        if close - brace > max_line or (close == -1 and len(line) > max_line):
            too_long += 1  # skipped unparsed: its label values could only be dropped
            continue
        if close > brace > 0:
            value_text = line[close + 2 :]
            label_text = line[brace + 1 : close]
            plain = label_sets.get(label_text)
            if plain is None:
                plain = _plain_labels(label_text, label_names)
                if plain is not None:
                    if len(label_sets) >= max_label_sets:
                        label_sets.clear()  # endless distinct series must not grow the memo
                    label_sets[label_text] = plain
            if plain is not None:
                number = numbers.get(value_text)
                # float() alone would also take "1_000", non-ASCII digits and, around the
                # number, control characters that are not blanks ("1\x0c"): the careful path
                # names them. Only a text that passed these checks is remembered.
                if (
                    number is None
                    and "_" not in value_text
                    and value_text.isascii()
                    and value_text.isprintable()
                ):
                    try:
                        number = float(value_text)
                    except ValueError:
                        pass
                    else:
                        if len(numbers) >= max_numbers:
                            numbers.clear()  # endless distinct values must not grow the memo
                        if len(value_text) <= MAX_NUMBER_CHARS:  # any float's repr fits
                            numbers[value_text] = number
                if number is not None:
                    if len(samples) == room:
                        overflow += 1
                        continue
                    # Concatenation: measured a third faster than unpacking `hit` here. A
                    # remembered value is copied (`* 1.0`, exact, -0.0 and NaN included):
                    # one float per sample, what the window's memory estimate counts.
                    value = number * 1.0
                    append(new_sample(TextSample, hit + (plain, value, None, lineno)))  # noqa: RUF005
                    continue
        pos = brace if brace > 0 else len(line)  # no labels: the whole line is the name
        labels, value, timestamp = _parse_sample_carefully(line, pos, lineno, hit)
        if len(samples) == room:
            overflow += 1
            continue
        append(new_sample(TextSample, (*hit, labels, value, timestamp, lineno)))

    if not clean:  # names of lines never read may hold invalid bytes: not remembered
        declared = {name for name in declared if _encodable(name)}
    return Exposition(
        samples=tuple(samples),
        types=types,
        declared=frozenset(declared),
        overflow=overflow,
        too_long=too_long,
    )


#: Distinct label texts remembered while parsing one payload.
MAX_LABEL_SETS = 4096
#: Distinct value texts remembered while parsing one payload, and the longest remembered.
MAX_NUMBERS = 4096
MAX_NUMBER_CHARS = 32
#: Longest sample line of a wanted family that is parsed (vLLM's longest, cache_config_info,
#: is about 2,000 characters): a longer one is counted and skipped, never copied into labels.
MAX_LINE_CHARS = 65_536


def _plain_labels(
    label_text: str, label_names: dict[tuple[str, ...], tuple[str, ...] | None]
) -> dict[str, str] | None:
    """Labels of a label set without escapes or blanks, or None if it is not of that form.

    An exemplar or a stray ``} `` in the line leaves unquoted text that is not ``,name=``: None.
    """
    if "\\" in label_text:
        return None  # escapes: only the careful path unescapes
    parts = label_text.split('"')
    if not len(parts) % 2:
        return None  # an odd number of quotes
    key = tuple(parts[::2])
    names = label_names.get(key, _UNSEEN)
    if names is _UNSEEN:
        names = label_names[key] = _plain_label_names(key)
    if names is None:
        return None
    # Same length by construction (one value between two names); zip's `strict` keyword
    # alone doubles the cost of this line, which runs for every new label set.
    return dict(zip(names, parts[1::2]))  # noqa: B905


def _plain_label_names(key: tuple[str, ...]) -> tuple[str, ...] | None:
    """Label names from the unquoted parts of a plain label set, or None if it is not plain.

    ``key`` is every other part of the label set split on ``"``: ``('a=', ',b=', '')`` for
    ``a="1",b="2"`` (``(..., ',')`` with a trailing comma, ``('',)`` for ``{}``). Each part is
    matched whole by a pattern mapped in C: ``cache_config_info`` has some 40 labels.
    """
    *named, last = key
    if last not in ("", ","):
        return None
    if not named:
        return None if last else ()  # "{,}": the careful path says what is wrong
    first, *rest = named
    if _FIRST_LABEL_PART.fullmatch(first) is None or not all(map(_NEXT_LABEL_PART.fullmatch, rest)):
        return None
    names = (first[:-1], *[part[1:-1] for part in rest])
    if len(set(names)) != len(names):
        return None  # duplicates: the careful path names them
    return names


def _decode(payload: str | bytes) -> tuple[str, bool]:
    """The payload as text, and whether all of it is valid UTF-8 (then no line needs a check).

    Invalid bytes survive as lone surrogates: harmless in lines we skip, and an error in every
    line we read (see _check_encodable), instead of failing the whole payload up front. A str
    payload may hold lone surrogates too: it is checked the same way.
    """
    if isinstance(payload, str):
        text, clean = payload, payload.isascii() or _encodable(payload)
    else:
        try:
            text, clean = payload.decode("utf-8"), True
        except UnicodeDecodeError:
            text, clean = payload.decode("utf-8", "surrogateescape"), False
    # A byte-order mark would glue itself to the first metric name and hide that line.
    return text.removeprefix("\ufeff"), clean


def _encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode, i.e. has no lone surrogate (what invalid bytes become)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_encodable(line: str, lineno: int, hit: tuple[str, str]) -> None:
    if not line.isascii() and not _encodable(line):
        raise _error(lineno, hit, "not valid UTF-8", line)


def _split_name(line: str) -> tuple[str | None, int]:
    """Return the metric name of an unusual sample line and where it ends.

    Handles leading blanks, blanks between the name and its labels, and label-less samples.
    Returns ``(None, 0)`` for a comment indented by blanks, ``("", 0)`` for a blank line.
    """
    start = len(line) - len(line.lstrip(" \t"))
    if start == len(line):
        return "", 0
    if line[start] == "#":
        return None, 0
    end = _NAME_END.search(line, start)
    stop = len(line) if end is None else end.start()
    return line[start:stop], stop


def _comment(
    line: str,
    lineno: int,
    lookup: Mapping[str, tuple[str, str]],
    types: dict[str, str],
    declared: set[str],
) -> None:
    """Record the name of a ``# HELP``/``# TYPE`` line; check TYPE lines of wanted families."""
    parts = line[1:].split(None, 3)
    if len(parts) < 2 or parts[0] not in ("TYPE", "HELP"):
        return  # any other comment, OpenMetrics' "# EOF" and "# UNIT" included
    name = parts[1]
    declared.add(name)
    if parts[0] == "HELP":
        return
    hit = lookup.get(name)
    # `<counter>_created` companions are separate gauge families in 0.0.4: not the family's type.
    if hit is None or hit[1] not in ("", "_total"):
        return
    if len(parts) < 3:
        raise _error(lineno, hit, "TYPE line without a type", line, what="# TYPE line of")
    declared_type = parts[2]
    if declared_type not in METRIC_TYPES or len(parts) > 3:
        raise _error(lineno, hit, f"unknown metric type {parts[2]!r}", line, what="# TYPE line of")
    types.setdefault(hit[0], declared_type)


def _parse_sample_carefully(
    line: str, pos: int, lineno: int, hit: tuple[str, str]
) -> tuple[dict[str, str], float, float | None]:
    """Parse labels, value and timestamp from ``pos`` one token at a time, naming any error."""
    pos = _skip_blanks(line, pos)
    labels: dict[str, str] = {}
    if line.startswith("{", pos):
        labels, pos = _parse_labels(line, pos + 1, lineno, hit)
    match = _TAIL.match(line, pos)
    if match is None:
        rest = line[pos:]
        if not rest.strip(" \t"):
            raise _error(lineno, hit, "missing value", line)
        problem = (
            "expected 'value [timestamp]', then only an exemplar '# {labels} value', each after"
            f" a blank; found {rest[:_EXCERPT_CHARS]!r}"
        )
        raise _error(lineno, hit, problem, line)
    value_text, ts_text, exemplar_value, exemplar_ts = match.groups()
    value = _number(value_text, lineno, hit, "value", line)
    timestamp = None if ts_text is None else _number(ts_text, lineno, hit, "timestamp", line)
    if exemplar_value is not None:  # an OpenMetrics exemplar: checked, not kept
        _number(exemplar_value, lineno, hit, "exemplar value", line)
        if exemplar_ts is not None:
            _number(exemplar_ts, lineno, hit, "exemplar timestamp", line)
    return labels, value, timestamp


def _parse_labels(
    line: str, pos: int, lineno: int, hit: tuple[str, str]
) -> tuple[dict[str, str], int]:
    """Parse a label set from just after ``{``; return the labels and the index after ``}``."""
    labels: dict[str, str] = {}
    pos = _skip_blanks(line, pos)
    while not line.startswith("}", pos):
        name_match = _LABEL_NAME.match(line, pos)
        if name_match is None:
            if pos >= len(line):
                raise _error(lineno, hit, "label set not closed with '}'", line)
            found = line[pos : pos + 12]
            problem = f"bad label name at column {pos + 1}: expected a name, found {found!r}"
            raise _error(lineno, hit, problem, line)
        name = name_match.group()
        pos = _skip_blanks(line, name_match.end())
        if not line.startswith("=", pos):
            raise _error(lineno, hit, f"expected '=' after label {name!r}", line)
        pos = _skip_blanks(line, pos + 1)
        if not line.startswith('"', pos):
            raise _error(lineno, hit, f"value of label {name!r} is not quoted", line)
        value, pos = _label_value(line, pos + 1, lineno, hit, name)
        if name in labels:
            raise _error(lineno, hit, f"duplicate label name {name!r}", line)
        labels[name] = value
        pos = _skip_blanks(line, pos)
        if line.startswith(",", pos):
            pos = _skip_blanks(line, pos + 1)
        elif pos >= len(line):
            raise _error(lineno, hit, "label set not closed with '}'", line)
        elif not line.startswith("}", pos):
            raise _error(lineno, hit, f"expected ',' or '}}' after label {name!r}", line)
    return labels, pos + 1


def _skip_blanks(line: str, pos: int) -> int:
    match = _BLANKS.match(line, pos)
    return pos if match is None else match.end()


def _label_value(
    line: str, pos: int, lineno: int, hit: tuple[str, str], name: str
) -> tuple[str, int]:
    r"""Read a quoted label value from just after its opening quote; unescape ``\\ \" \n``."""
    quote = line.find('"', pos)
    backslash = line.find("\\", pos)
    if backslash == -1 or (quote != -1 and quote < backslash):
        if quote == -1:
            raise _error(lineno, hit, f"value of label {name!r} has no closing quote", line)
        return line[pos:quote], quote + 1
    parts: list[str] = []
    # Each find below starts past the previous hit, so the scan is linear in the line length.
    while True:
        if quote != -1 and quote < pos:
            quote = line.find('"', pos)
        if backslash != -1 and backslash < pos:
            backslash = line.find("\\", pos)
        if quote == -1:
            raise _error(lineno, hit, f"value of label {name!r} has no closing quote", line)
        if backslash == -1 or quote < backslash:
            parts.append(line[pos:quote])
            return "".join(parts), quote + 1
        parts.append(line[pos:backslash])
        escaped = _ESCAPES.get(line[backslash + 1 : backslash + 2])
        if escaped is None:
            raise _error(
                lineno,
                hit,
                f'invalid escape in the value of label {name!r} (only \\\\, \\" and \\n)',
                line,
            )
        parts.append(escaped)
        pos = backslash + 2


def _number(text: str, lineno: int, hit: tuple[str, str], what: str, line: str) -> float:
    # float() alone would also take "1_000", non-ASCII digits and control characters around
    # the number ("1\x0c"), all of which Prometheus rejects.
    if "_" not in text and text.isascii() and text.isprintable():
        try:
            return float(text)
        except ValueError:
            pass
    raise _error(lineno, hit, f"{what} {text[:_EXCERPT_CHARS]!r} is not a number", line)


def _error(
    lineno: int, hit: tuple[str, str], problem: str, line: str, *, what: str = "sample of"
) -> ParseError:
    """Build the one-line error for a malformed line of a wanted family."""
    excerpt = line if len(line) <= _EXCERPT_CHARS else line[:_EXCERPT_CHARS] + "..."
    return ParseError(
        f"line {lineno}: malformed {what} {hit[0]}: {problem}: {excerpt!r} "
        "(is the target a Prometheus /metrics endpoint, and the payload complete?)"
    )
