"""Specification of the probe's outputs: the --json document, the summary and the report."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import pytest

from exporter.errors import UsageError
from exporter.sweep.evaluate import Limits
from exporter.sweep.figure import check_report_path, draw_png, html_page, write_report
from exporter.sweep.plan import Mode
from exporter.sweep.report import TargetFacts, progress_line, render, to_json
from tests.sweep.test_runner import SHAPE, sweep

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.sweep.runner import SweepResult

KEYS = {
    "schema_version",
    "target",
    "driver",
    "mode",
    "shape",
    "limits",
    "ceiling",
    "levels",
    "baseline",
    "steps",
    "knee",
    "ended",
    "interrupted",
    "idle_after",
    "elapsed_s",
    "requests_sent",
    "single_latency_s",
    "notes",
}


@pytest.fixture(scope="module")
def result() -> SweepResult:
    """A KV-bound concurrency sweep of the simulated engine."""
    return sweep(1024, Mode.CONCURRENCY)


@pytest.fixture(scope="module")
def document(result: SweepResult) -> dict[str, object]:
    """Its --json document."""
    facts = TargetFacts("http://sim:8000", "simulated/llama-3.1-8b", "0.32.0+sim", 1024)
    return to_json(result, target=facts, shape=SHAPE, limits=Limits(), mode=Mode.CONCURRENCY)


def test_the_json_document_has_stable_keys_and_is_plain_json(document: dict[str, object]) -> None:
    """Every key is there and the whole document survives a JSON round trip."""
    assert document.keys() == KEYS
    assert json.loads(json.dumps(document)) == json.loads(json.dumps(document, sort_keys=True))
    knee = document["knee"]
    assert isinstance(knee, dict)
    assert (knee["level"], knee["binding"], knee["first_failure_level"]) == (8.0, "kv_cache", 10.0)
    steps = document["steps"]
    assert isinstance(steps, list)
    assert steps[0]["mode"] == "concurrency"
    assert steps[0]["ok"] is True


def test_the_summary_names_the_knee_its_share_of_the_ceiling_and_the_binding_limit(
    document: dict[str, object],
) -> None:
    """The terminal summary leads with the shape and ceiling and ends with the answer."""
    text = render(document)
    assert "ceiling        8 sequences of p95 length (limited by kv_cache)" in text
    assert "knee: 8 concurrent" in text
    assert "= 100% of the 8-sequence ceiling" in text
    assert "binding limit: the KV cache" in text
    assert "target idle" in text


def test_progress_lines_give_the_verdict(result: SweepResult) -> None:
    """One line a step while the sweep runs, its violations when it broke a limit."""
    assert result.baseline is not None
    assert progress_line(None, result.baseline).startswith("baseline (1 concurrent)")
    failing = result.steps[result.knee.first_failure or 0]
    assert "BROKE: " in progress_line(4, failing)


def test_the_html_report_is_self_contained(document: dict[str, object], tmp_path: Path) -> None:
    """One file: the summary, the curves as an inline PNG and the JSON document."""
    path = tmp_path / "probe.html"
    write_report(path, document)
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert 'src="data:image/png;base64,' in page
    assert "knee: 8 concurrent" in page
    assert "<link" not in page
    assert "<script" not in page


def test_the_png_report_is_a_png(document: dict[str, object], tmp_path: Path) -> None:
    """A .png report is the picture alone."""
    path = tmp_path / "probe.png"
    write_report(path, document)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert html_page(document, draw_png(document)).count("<img") == 1


def test_a_report_must_be_html_or_png(tmp_path: Path) -> None:
    """Another suffix is refused before any load is sent."""
    with pytest.raises(UsageError, match=r"name an \.html or \.png file"):
        check_report_path(tmp_path / "probe.pdf")


def test_without_matplotlib_a_report_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The optional dependency missing is a usage error that says how to install it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError) as caught:
        check_report_path(tmp_path / "probe.html")
    assert str(caught.value) == (
        "--report needs matplotlib, which is not installed: pip install 'vllm-headroom[report]'"
    )
