"""Specification of the one table of vLLM's families (exporter.vllm.families).

The table knows every ``vllm:`` family of every real capture, in the versions the capture is
from; the parser reads exactly the rows that feed a figure, and each of them; and no other
module of the package spells a vLLM family name of its own.
"""

from __future__ import annotations

import ast
import math
import re

import pytest

from exporter.vllm.families import FAMILIES, Family, Kind, family, feeding, named
from exporter.vllm.metrics import WANTED, parse_vllm_metrics
from tests import paths

#: What each capture's header says of its vLLM: the first and last release it can be from
#: (``None``: open). The docs example (0.33 docs) is dated by its docs' release.
CAPTURE_VERSIONS: dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]] = {
    "02_v0.6.0_V0_korean-doc.prom": ((0, 6, 0), (0, 6, 2)),
    "04_v0.6.4-0.6.6_V0_test-fixture.prom": ((0, 6, 4), (0, 6, 6)),
    "05_v0.5.4-0.6.x_V0_meetkai-functionary-pr263_help-type-only.prom": ((0, 5, 4), (0, 6)),
    "07_v0.9.2-0.10.x_V0engine-cpu_full.prom": ((0, 9, 2), (0, 10)),
    "08_v0.10.0_V1_production-stack-issue617.prom": ((0, 10, 0), (0, 10, 0)),
    "10_v0.11+_V1_rhoai-lab-doc.prom": ((0, 11, 0), None),
    "14_v0.33.0-docs_V1_vllm-docs-examples.prom": ((0, 33, 0), (0, 33, 0)),
    "vllm-0.32.0-cpu-idle.prom": ((0, 32, 0), (0, 32, 0)),
    "vllm-0.32.0-cpu-after-load.prom": ((0, 32, 0), (0, 32, 0)),
    "vllm-0.33.0-reconstructed.prom": ((0, 33, 0), (0, 33, 0)),
}

#: A ``vllm:`` name as it stands in a payload or a text (sample, ``# TYPE`` line, prose).
_NAME = re.compile(r"vllm:[a-z][a-z0-9_]*")
_SAMPLE_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum")

#: Modules of the package that may write a vLLM family name as a string of their own, and why.
SPELLING_ALLOWED = {
    "exporter/vllm/families.py": "the table itself",
    "exporter/service/metricdefs.py": "`source` is prose for docs/metrics.md, saying where a "
    "figure comes from (its names are checked against the table below)",
}


def _row_of(written: str) -> Family | None:
    """The table row of a name as written (``_total``, ``_bucket``... folded), or None."""
    known = {row.name: row for row in FAMILIES}
    stems = [written] + [written.removesuffix(s) for s in _SAMPLE_SUFFIXES if written.endswith(s)]
    return next((known[stem] for stem in stems if stem in known), None)


def _capture_names(name: str) -> set[str]:
    text = (paths.CAPTURES / name).read_text(encoding="utf-8")
    lines = (line for line in text.splitlines() if not line.startswith("# ") or " TYPE " in line)
    return {match.group() for line in lines for match in _NAME.finditer(line.split("{")[0])}


def _series_of(version: tuple[int, ...]) -> tuple[int, ...]:
    return version[:2]


def _written_in(row: Family, low: tuple[int, ...], high: tuple[int, ...] | None) -> bool:
    """Whether vLLM can write ``row`` in some release between ``low`` and ``high``."""
    starts_in_time = row.since is None or high is None or row.since[: len(high)] <= high
    last = row.last_series
    ends_in_time = last is None or last >= _series_of(low)
    return starts_in_time and ends_in_time


# --- the table knows what vLLM writes ---------------------------------------------------------


def test_every_capture_is_dated() -> None:
    """A new capture gets its version range here, so that the table is checked against it."""
    assert set(CAPTURE_VERSIONS) == {path.name for path in paths.CAPTURES.glob("*.prom")}


@pytest.mark.parametrize("capture", sorted(CAPTURE_VERSIONS))
def test_every_family_of_every_capture_is_in_the_table(capture: str) -> None:
    """A ``vllm:`` name the table lacks is a row to add (with what it feeds, if anything)."""
    unknown = sorted(name for name in _capture_names(capture) if _row_of(name) is None)
    assert not unknown, f"{capture}: add rows to exporter/vllm/families.py for {unknown}"


@pytest.mark.parametrize("capture", sorted(CAPTURE_VERSIONS))
def test_the_table_dates_each_family_as_the_captures_show_it(capture: str) -> None:
    """No family is in a capture of a release before its ``since`` or after its last series."""
    low, high = CAPTURE_VERSIONS[capture]
    rows = {_row_of(name) for name in _capture_names(capture)}
    wrong = sorted(row.name for row in rows if row is not None and not _written_in(row, low, high))
    assert not wrong


def test_each_family_is_one_row() -> None:
    """Names are unique, and written as prometheus_client names them (counters without _total)."""
    names = [row.name for row in FAMILIES]
    assert len(names) == len(set(names))
    assert all(row.name.startswith("vllm:") or row.per_server for row in FAMILIES)
    assert not [
        row.name for row in FAMILIES if row.kind is Kind.COUNTER and row.name.endswith("_total")
    ]


def test_a_counter_is_declared_with_total_and_other_kinds_as_named() -> None:
    """The ``# TYPE`` line of text format 0.0.4 names a counter with ``_total``."""
    assert family("vllm:num_preemptions").type_name == "vllm:num_preemptions_total"
    assert family("vllm:num_requests_running").type_name == "vllm:num_requests_running"
    assert family("vllm:iteration_tokens_total").type_name == "vllm:iteration_tokens_total"


def test_a_replaced_family_follows_the_family_that_replaces_it_and_feeds_the_same() -> None:
    """The parser takes the first family present per figure: the newer name wins."""
    order = {row.name: index for index, row in enumerate(FAMILIES)}
    for row in FAMILIES:
        if row.replaced_by is not None:
            newer = family(row.replaced_by)
            assert order[newer.name] < order[row.name], row.name
            assert newer.feeds == row.feeds, row.name


def test_deprecation_follows_vllms_policy_shown_then_hidden_then_removed() -> None:
    """Deprecated in X.Y, hidden in X.Y+1 (--show-hidden-metrics-for-version), removed in X.Y+2."""
    usage = family("vllm:gpu_cache_usage_perc")
    assert usage.deprecated == (0, 10)
    assert usage.hidden_in == (0, 11)
    assert usage.removed_in == (0, 12)
    assert usage.last_series == (0, 11)
    assert family("vllm:kv_cache_usage_perc").last_series is None


def test_v0_only_families_end_with_v0_in_0_10_at_the_latest() -> None:
    """V0 is gone in 0.11: no V0 family is open-ended."""
    v0 = [row for row in FAMILIES if row.engines == "V0"]
    assert v0
    assert all(row.last_series is not None and row.last_series <= (0, 10) for row in v0)


def test_a_name_outside_the_table_is_refused_with_the_fix() -> None:
    """Modules spell names through named(): a typo fails when the module is imported."""
    assert named("num_requests_running") == "vllm:num_requests_running"
    with pytest.raises(KeyError, match=r"families\.py FAMILIES: add its row"):
        named("num_request_running")


# --- the parser reads exactly the rows that feed a figure -------------------------------------


def test_the_parser_wants_exactly_the_families_that_feed_a_figure() -> None:
    """Every other line of a payload is skipped without being parsed."""
    assert WANTED.names == {row.name for row in FAMILIES if row.feeds is not None}


#: Labels of each info family's series the parser reads (vLLM writes more), engine aside.
_INFO_LABELS = {
    "vllm:cache_config_info": 'block_size="16",num_gpu_blocks="64"',
    # vllm/v1/simple_kv_offload/metrics.py INFO_LABELS (0.32.0)
    "vllm:simple_kv_offload_info": 'backend="cpu",capacity_blocks="32",lazy_offload="false",'
    'model_name="m",page_cache="false"',
}


def _payload(row: Family) -> str:
    """One engine's minimal series of ``row``, as vLLM writes it."""
    labels = "" if row.per_server else 'engine="0",model_name="m"'
    if row.split is not None:
        labels = ",".join(part for part in (labels, f'{row.split}="a"') if part)
    braces = f"{{{labels}}}" if labels else ""
    if row.kind is Kind.HISTOGRAM:
        return (
            f'{row.name}_bucket{{{labels},le="1.0"}} 1\n'
            f'{row.name}_bucket{{{labels},le="+Inf"}} 2\n'
            f"{row.name}_count{braces} 2\n{row.name}_sum{braces} 3\n"
        )
    if row.kind is Kind.INFO:
        return f'{row.name}{{engine="0",{_INFO_LABELS[row.name]}}} 1\n'
    return f"{row.type_name}{braces} 0.5\n"


@pytest.mark.parametrize("row", [row for row in FAMILIES if row.feeds], ids=lambda row: row.name)
def test_every_family_that_feeds_a_figure_is_parsed_into_it(row: Family) -> None:
    """A payload of the family alone fills the field it feeds (a replaced name included)."""
    snapshot = parse_vllm_metrics(_payload(row))
    assert row.feeds is not None
    holder = snapshot if row.per_server else snapshot.engines["0"]
    value = getattr(holder, row.feeds)
    assert value not in (None, {}), row.name
    if isinstance(value, float):
        assert math.isfinite(value)


@pytest.mark.parametrize(
    "row", [row for row in FAMILIES if not row.feeds], ids=lambda row: row.name
)
def test_a_family_that_feeds_nothing_is_skipped_unparsed(row: Family) -> None:
    """Known, not read: a payload of it alone gives no engine."""
    assert parse_vllm_metrics(_payload(row)).engines == {}


def test_each_field_is_fed_by_the_newest_family_present() -> None:
    """Both names of the usage in one payload: the newer one is read."""
    rows = feeding("kv_cache_usage_ratio")
    payload = "".join(
        f'{row.name}{{engine="0",model_name="m"}} {value}\n'
        for row, value in zip(rows, (0.25, 0.75), strict=True)
    )
    assert parse_vllm_metrics(payload).engines["0"].kv_cache_usage_ratio == 0.25


# --- no name is spelled twice -----------------------------------------------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _spelled_names() -> dict[str, list[str]]:
    """Package modules and the strings of their code that begin with a vLLM family name."""
    found: dict[str, list[str]] = {}
    for path in sorted((paths.REPO / "exporter").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in docstrings:
                continue
            value = node.value
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            if isinstance(text, str) and _NAME.match(text):
                module = path.relative_to(paths.REPO).as_posix()
                found.setdefault(module, []).append(f"line {node.lineno}: {text[:50]!r}")
    return found


def test_no_module_but_the_table_spells_a_vllm_family_name() -> None:
    """Code names vLLM's families through exporter.vllm.families (named(), the rows)."""
    spelled = _spelled_names()
    wrong = {module: where for module, where in spelled.items() if module not in SPELLING_ALLOWED}
    assert not wrong, f"spell these through exporter.vllm.families.named(): {wrong}"


def test_every_allowed_exception_is_still_needed() -> None:
    """An allowance nobody uses any more is taken out."""
    spelled = _spelled_names()
    assert [module for module in SPELLING_ALLOWED if module not in spelled] == []


def test_every_vllm_name_the_package_or_its_docs_mention_is_in_the_table() -> None:
    """Prose too (docstrings, messages, metric sources, the docs): no stale or misspelled name."""
    texts = [
        *(paths.REPO / "exporter").rglob("*.py"),
        *paths.DOCS.rglob("*.md"),
        paths.REPO / "README.md",
        paths.REPO / "DEVELOPERS.md",
    ]
    unknown = sorted(
        {
            f"{path.relative_to(paths.REPO).as_posix()}: {match.group()}"
            for path in texts
            for match in _NAME.finditer(path.read_text(encoding="utf-8"))
            if _row_of(match.group()) is None
        }
    )
    assert not unknown
