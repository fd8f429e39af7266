"""The two lanes of phase 2: the beside lane starts when the main lane is quiet, never before."""

from __future__ import annotations

import threading
import time
import types
from typing import TYPE_CHECKING, cast

from tests.e2e import conftest, lanes

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import pytest


def _as(monkeypatch: pytest.MonkeyPatch, lane: str, shared: Path | None) -> None:
    monkeypatch.setattr(lanes, "LANE", lane)
    if shared is None:
        monkeypatch.delenv("HEADROOM_E2E_LANES", raising=False)
    else:
        monkeypatch.setenv("HEADROOM_E2E_LANES", str(shared))


def _later(seconds: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_one_lane_never_waits_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plain pytest (no shared directory): every call returns at once."""
    for lane in ("main", "beside", ""):
        _as(monkeypatch, lane, None)
        started = time.monotonic()
        lanes.wait_for_quiet()
        lanes.main_lane_quiet()
        lanes.beside_lane_done()
        lanes.wait_for_beside_lane()
        lanes.wait_for_unit_tests()
        assert time.monotonic() - started < 0.5
    assert list(tmp_path.iterdir()) == []


def test_the_beside_lane_starts_when_the_main_lane_is_quiet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The beside lane waits for the main lane's word, and only for it."""
    _as(monkeypatch, "beside", tmp_path)
    lanes.main_lane_quiet()  # the beside lane cannot say it for the main lane
    assert not (tmp_path / "quiet").exists()
    timer = _later(1.0, (tmp_path / "quiet").touch)
    started = time.monotonic()
    lanes.wait_for_quiet()
    assert time.monotonic() - started >= 0.9
    timer.join()


def test_the_main_lane_waits_for_the_beside_lane_only_once_it_released_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before its quiet minutes the main lane never waits; after them, until the lane ends."""
    _as(monkeypatch, "main", tmp_path)
    started = time.monotonic()
    lanes.wait_for_beside_lane()  # nothing released yet: no beside lane runs
    assert time.monotonic() - started < 0.5
    lanes.main_lane_quiet()
    assert (tmp_path / "quiet").exists()
    timer = _later(1.0, (tmp_path / "done").touch)
    started = time.monotonic()
    lanes.wait_for_beside_lane()
    assert time.monotonic() - started >= 0.9
    timer.join()


def test_both_lanes_wait_for_the_unit_tests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A lane's burst waits for the word that the unit tests ended; a plain pytest never waits."""
    _as(monkeypatch, "", tmp_path)
    started = time.monotonic()
    lanes.wait_for_unit_tests()
    assert time.monotonic() - started < 0.5
    for lane in ("main", "beside"):
        _as(monkeypatch, lane, tmp_path)
        timer = _later(1.0, (tmp_path / "units").touch)
        started = time.monotonic()
        lanes.wait_for_unit_tests()
        assert time.monotonic() - started >= 0.9
        timer.join()
        (tmp_path / "units").unlink()


def test_a_lane_that_never_answers_costs_time_not_a_hang(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both waits end at their bound and say so."""
    monkeypatch.setattr(lanes, "QUIET_TIMEOUT_S", 0.5)
    monkeypatch.setattr(lanes, "DONE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(lanes, "UNITS_TIMEOUT_S", 0.5)
    _as(monkeypatch, "beside", tmp_path)
    lanes.wait_for_quiet()
    _as(monkeypatch, "main", tmp_path)
    lanes.main_lane_quiet()
    lanes.wait_for_beside_lane()
    lanes.wait_for_unit_tests()
    out = capsys.readouterr().out
    assert "no word that the main lane is quiet after 0 s; going on" in out
    assert "no word that the beside lane has ended after 0 s; going on" in out
    assert "no word that the unit tests have ended after 0 s; going on" in out


def _item(fixtures: tuple[str, ...], **module_flags: bool) -> pytest.Item:
    module = types.SimpleNamespace(**module_flags)
    return cast("pytest.Item", types.SimpleNamespace(fixturenames=fixtures, module=module))


def test_each_test_is_held_only_for_what_its_module_does_not_wait_for_itself() -> None:
    """Tests that load the cores wait; the alerting scenario's module is held by nothing."""
    assert conftest.holds(_item(("capsys",))) == []
    assert conftest.holds(_item(("vllm_server",))) == [
        lanes.wait_for_unit_tests,
        lanes.wait_for_beside_lane,
        lanes.wait_for_quiet,
    ]
    assert conftest.holds(_item(("vllm_factory",), WAITS_FOR_THE_BESIDE_LANE=True)) == [
        lanes.wait_for_unit_tests,
        lanes.wait_for_quiet,
    ]
    # Its scenario waits for the unit tests itself, then lets the beside lane start; its later
    # tests only read the record: held until the beside lane ended, they held the sidecar
    # scenario's idle half-minute too (a CI run's second alerting test: 132 s of setup).
    assert conftest.holds(_item(("vllm_server",), WAITS_FOR_THE_UNIT_TESTS=True)) == []
