"""Specification of alerts/generate.py and alerts/rules.py: one rule table, two files, one scope.

The table renders into the unscoped alerts/vllm-headroom.rules.yml and into the chart's copy with
the selector markers left in; the chart's templates/_rules.tpl fills them per release with plain
``replace``. These tests prove that the markers sit on every selector and only there (against the
PromQL lexer of tests/promql.py), that Helm leaves none behind, and that the chart refuses a rule
file without them. tests/test_helm_rules.py compares whole renderings with values applied.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import yaml

from alerts.generate import CHART_COPY, UNSCOPED, generate
from alerts.rules import RECORDED, SCRAPED, fill
from tests import paths
from tests.promql import with_matchers
from tests.test_helm import CHART, RenderError, ci, only, render

if TYPE_CHECKING:
    from pathlib import Path

REPO = paths.REPO
MARKERS = (SCRAPED, RECORDED)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m alerts.generate`` with ``args``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "alerts.generate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def exprs(text: str) -> dict[str, str]:
    """Rule name (record or alert) -> expr of a rule file's text."""
    doc = yaml.safe_load(text)
    return {r.get("alert") or r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def test_the_generated_files_are_fresh() -> None:
    """Both files hold what the table renders (make docs); --check agrees and writes nothing."""
    for path, text in generate().items():
        assert (REPO / path).read_text(encoding="utf-8") == text, f"{path}: run make docs"
    done = run("--check")
    assert (done.returncode, done.stderr) == (0, "")


def test_check_names_each_stale_file_and_a_run_rewrites_it(tmp_path: Path) -> None:
    """--check exits 1 naming a changed and a missing file; a run writes both; --check passes."""
    (tmp_path / UNSCOPED).parent.mkdir(parents=True)
    (tmp_path / UNSCOPED).write_text("groups: []\n")
    done = run("--root", str(tmp_path), "--check")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"alerts: {path} is out of date: run make docs" for path in (UNSCOPED, CHART_COPY)
    ]
    assert not (tmp_path / CHART_COPY).exists()
    assert run("--root", str(tmp_path)).returncode == 0
    assert run("--root", str(tmp_path), "--check").returncode == 0


def test_fill_puts_matchers_in_place_or_drops_the_marker() -> None:
    """Matchers replace the marker; none leave the plain selector, braces gone where empty."""
    expr = 'rate(a{<scraped>}[5m]) / b{<scraped>,le="1"} > scalar(t{<recorded>})'
    assert fill(expr, SCRAPED, 'job="j"') == (
        'rate(a{job="j"}[5m]) / b{job="j",le="1"} > scalar(t{<recorded>})'
    )
    assert fill(fill(expr, SCRAPED, ""), RECORDED, "") == 'rate(a[5m]) / b{le="1"} > scalar(t)'
    assert fill(expr, SCRAPED, SCRAPED) == expr


def test_the_unscoped_file_has_no_marker_and_the_chart_copy_marks_every_selector() -> None:
    """Every selector of the chart's copy carries its marker, exactly where the lexer finds one.

    Filling the markers with stand-ins gives the unscoped expression with the stand-ins added to
    each selector by tests/promql.py: recorded series (headroom:*) one, scraped series the other.
    """
    files = generate()
    assert not any(marker in files[UNSCOPED] for marker in MARKERS)
    unscoped, marked = exprs(files[UNSCOPED]), exprs(files[CHART_COPY])
    assert unscoped.keys() == marked.keys()
    assert all(SCRAPED in expr for expr in marked.values() if "vllm:" in expr)

    def stand_in(name: str) -> str:
        return "R" if name.startswith("headroom:") else "S"

    for name, expr in marked.items():
        filled = fill(fill(expr, SCRAPED, "S"), RECORDED, "R")
        assert filled == with_matchers(unscoped[name], stand_in), name


@pytest.mark.parametrize(
    "sets",
    [(), ("--set prometheusRule.scope=cluster",)],
    ids=["scope-release", "scope-cluster"],
)
@pytest.mark.parametrize("values", ["vllm", "fleet"])
def test_helm_fills_every_marker(helm: Path, values: str, sets: tuple[str, ...]) -> None:
    """No marker is left anywhere in the rendered chart, scoped or not."""
    manifests = render(helm, ci(values), sets=("--set prometheusRule.enabled=true", *sets))
    only(manifests, "PrometheusRule")
    text = yaml.safe_dump_all(manifests)
    assert not [marker for marker in MARKERS if marker in text]


def _chart_with_rules(tmp_path: Path, text: str) -> Path:
    chart = tmp_path / "vllm-headroom"
    shutil.copytree(CHART, chart)
    (chart / "files" / "alerts" / UNSCOPED.name).write_text(text)
    return chart


def test_the_chart_refuses_a_rule_file_without_markers(helm: Path, tmp_path: Path) -> None:
    """The unscoped file in place of the chart's copy fails the render, saying what to do."""
    chart = _chart_with_rules(tmp_path, generate()[UNSCOPED])
    with pytest.raises(RenderError) as caught:
        render(helm, ci("vllm"), sets=("--set prometheusRule.enabled=true",), chart=chart)
    assert "has no selector markers (<scraped>, <recorded>)" in str(caught.value)
    assert "make docs" in str(caught.value)


def test_the_chart_refuses_a_marker_it_cannot_fill(helm: Path, tmp_path: Path) -> None:
    """A marker outside a selector's braces would survive unscoped: the render fails, naming it."""
    text = generate()[CHART_COPY].replace(
        "deriv(vllm:num_requests_waiting{<scraped>}[5m])",
        "deriv(vllm:num_requests_waiting<scraped>[5m])",
    )
    chart = _chart_with_rules(tmp_path, text)
    with pytest.raises(RenderError) as caught:
        render(
            helm,
            ci("vllm"),
            sets=("--set prometheusRule.enabled=true", "--set prometheusRule.scope=cluster"),
            chart=chart,
        )
    assert "a selector marker of rule headroom:vllm_requests_waiting:deriv5m is left" in str(
        caught.value
    )
