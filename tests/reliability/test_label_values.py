"""Hostile inputs, round three: any label value vLLM may send, through every stage.

A label value is text vLLM copies from elsewhere (a model name, a rank, a config value). Any
Unicode text must come out the other end as an exported label, or be refused with a reason
(``parse_error``, a drop counted by reason); never as ``internal_error`` nor as a traceback of
``check``. Each value goes through the whole chain: the parser, two polls (so that rates are
derived), the exposition, and back through ``prometheus_client``'s own parser.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli.main import main
from exporter.core.reasons import HttpReason, Source
from exporter.service.collector import GuardedCollector, target_families, target_rows
from exporter.service.poller import TargetPoller
from exporter.testing.fakevllm import VllmState, render_metrics
from exporter.vllm.client import VllmClient
from exporter.vllm.metrics import parse_vllm_metrics

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.core.views import TargetView

HEALTHY = render_metrics(VllmState())


def escaped(value: str) -> bytes:
    """``value`` written as a label value of the text format (backslash, quote, newline)."""
    text = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return text.encode("utf-8")


def with_engine(raw: bytes) -> bytes:
    """The fake vLLM's healthy payload with its engine label set to ``raw`` (already escaped)."""
    return HEALTHY.replace(b'engine="0"', b'engine="' + raw + b'"')


def poll_twice(payload: bytes) -> TargetView:
    """Two polls of a server answering ``payload``: the second derives rates from the first."""

    async def go() -> TargetView:
        answer = httpx.MockTransport(
            lambda _request: httpx.Response(
                200, content=payload, headers={"content-type": "text/plain"}
            )
        )
        async with httpx.AsyncClient(transport=answer) as http:
            client = VllmClient(
                "http://vllm:8000", client=http, timeout_seconds=2, max_bytes=1 << 24
            )
            poller = TargetPoller("http://vllm:8000", client=client, parse=parse_vllm_metrics)
            await poller.poll_once()
            return await poller.poll_once()

    return asyncio.run(go())


def exported_engines(view: TargetView) -> set[str]:
    """The ``engine`` label values of the exposition, read back by prometheus_client.

    The probe's OpenMetrics, written without client_python's objects, is checked on the way:
    the bytes of client_python's encoder.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GuardedCollector({"target": lambda: target_families(view)}))
    text = generate_latest(registry).decode("utf-8")
    probe = GuardedCollector({"target": lambda: target_rows(view)}, clock=lambda: 0.0)
    probe_registry = CollectorRegistry(auto_describe=False)
    probe_registry.register(probe)
    assert probe.openmetrics() == openmetrics_latest(probe_registry)  # type: ignore[no-untyped-call]
    return {
        sample.labels["engine"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "engine" in sample.labels
    }


def assert_exported_or_refused(value: str | None, view: TargetView) -> None:
    """Up with ``value`` exported as the engine, or down for a reason that is not ours."""
    health = view.sources[Source.VLLM_METRICS]
    assert HttpReason.INTERNAL_ERROR not in health.errors, health.last_error
    engines = exported_engines(view)
    if health.up:
        assert value is not None
        assert engines == {value}
    else:
        assert engines == set()
        assert health.last_error


#: Any text, and often numbers of every script (Nd, No, Nl): a rank is read as a number.
LABEL_TEXT = st.text(min_size=1, max_size=24) | st.text(
    st.characters(categories=("Nd", "No", "Nl")), min_size=1, max_size=3
)


@settings(max_examples=80, deadline=None)
@given(LABEL_TEXT)
def test_any_unicode_engine_label_is_exported_as_sent_or_refused_with_a_reason(
    value: str,
) -> None:
    """Any text (every category hypothesis draws, controls included) survives every stage."""
    assert_exported_or_refused(value, poll_twice(with_engine(escaped(value))))


#: One value of each class of text a label could hold (the ones that broke: digits other than
#: ASCII's, which str.isdigit() admits and int() refuses or misreads).
UNICODE_CLASSES = {
    "superscript digit (No)": "²",
    "Arabic-Indic digit (Nd)": "٣",
    "ASCII digit then Devanagari digit": "1०",
    "fraction (No)": "½",
    "Roman numeral (Nl)": "Ⅻ",
    "letter with accent (Ll)": "é",
    "emoji outside the BMP (So)": "\U0001f600",
    "right-to-left override (Cf)": "\u202e0",
    "zero width space (Cf)": "\u200b",
    "NUL (Cc)": "a\x00",
    "line and paragraph separators (Zl, Zp)": "\u2028\u2029",
    "private use (Co)": "\ue000",
    "unassigned (Cn)": "\u0378",
    "combining mark alone (Mn)": "\u0301",
    "quote, backslash, newline": 'a"b\\c\nd',
}


@pytest.mark.parametrize("value", list(UNICODE_CLASSES.values()), ids=list(UNICODE_CLASSES))
def test_each_class_of_unicode_as_an_engine_label_is_exported_as_sent(value: str) -> None:
    """Each class is a valid label value: exported exactly, and the target up."""
    view = poll_twice(with_engine(escaped(value)))
    assert view.sources[Source.VLLM_METRICS].up, view.sources[Source.VLLM_METRICS].last_error
    assert exported_engines(view) == {value}


@pytest.mark.parametrize(
    "raw",
    [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"],
    ids=["0xff", "truncated", "encoded surrogate", "overlong", "beyond U+10FFFF"],
)
def test_invalid_utf8_in_a_label_is_refused_as_a_parse_error(raw: bytes) -> None:
    """Bytes that are not UTF-8 (surrogates included, impossible in str) are a parse error."""
    view = poll_twice(with_engine(raw))
    health = view.sources[Source.VLLM_METRICS]
    assert not health.up
    assert set(health.errors) == {HttpReason.PARSE_ERROR}
    assert_exported_or_refused(None, view)


@pytest.mark.parametrize(
    ("value", "printed"),
    [
        ("²", "²"),
        ("٣", "٣"),
        ("\U0001f600", "\U0001f600"),
        ("a\x00", "a\\x00"),
        ("\x1b]0;pwn\x07", "\\x1b]0;pwn\\x07"),
    ],
    ids=["superscript", "Arabic-Indic", "emoji", "NUL", "terminal escape"],
)
def test_check_reads_a_capture_with_any_engine_label_without_a_traceback(
    value: str, printed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check`` of a capture whose engine is ``²`` reports it (exit 0), never a traceback.

    What would not print on a terminal (an escape sequence, NUL) is shown escaped.
    """
    capture = tmp_path / "odd-engine.prom"
    capture.write_bytes(with_engine(escaped(value)))
    code = main(["check", str(capture)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 0, err
    assert f"engine {printed} (tiny)" in out.splitlines()
    assert "\x1b" not in out
    assert "\x00" not in out
