"""Two lanes of end-to-end tests, so that a scenario's minutes of waiting are not lost.

The alerting scenario (``test_alerting_e2e.py``) spends about four minutes after its burst
waiting on the rules' own durations (a 2-minute rate, the stalled engine's page, Alertmanager's
group_interval) while its vLLM's engine is stopped and the CPU idles. ``scripts/test.sh`` runs
the modules that start no shared vLLM (its ``BESIDE``: their own vLLM servers or none) in a second
pytest, the ``beside`` lane, whose tests with a vLLM wait until the main lane says the burst is
over; the main lane's next tests with a vLLM then wait for the beside lane to end, so that no two
bursts ever share the two cores. Both lanes start with phase 1's unit tests, and their tests that
start no vLLM run first, while the unit tests run (the sharding scenario in the beside lane); then
the alerting scenario's vLLM, Prometheus and Alertmanager start and its idle minute passes, and its
burst (as any test with a vLLM, in either lane) waits until ``scripts/test.sh`` says the unit tests
have ended (tests/e2e/conftest.py orders and holds the tests). After the alerting scenario the
sidecar scenario starts its servers and spends its idle half-minute while the beside lane ends,
and its burst waits for that. Every wait is bounded: a lane that dies costs time, never a hang.

Without ``HEADROOM_E2E_LANES`` (a directory both lanes share) every function here does nothing:
a plain ``pytest`` runs every module in one process, as before.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: The lane this process is: "main" or "beside" (unset: one lane, no waiting).
LANE = os.environ.get("HEADROOM_E2E_LANE", "")

#: How long the beside lane's tests with a vLLM wait for the main lane's quiet minutes before
#: they start anyway (the main lane reaches them about 5.5 minutes in; a failed start signals at
#: once).
QUIET_TIMEOUT_S = 900.0
#: How long the main lane waits for the beside lane to end (its tests with a vLLM take about 3
#: minutes once the main lane is quiet).
DONE_TIMEOUT_S = 600.0
#: How long either lane holds its tests with a vLLM for phase 1's unit tests (about 3.5 minutes).
UNITS_TIMEOUT_S = 900.0


def _flag(name: str) -> Path | None:
    shared = os.environ.get("HEADROOM_E2E_LANES")
    return Path(shared) / name if shared else None


def _signal(name: str) -> None:
    flag = _flag(name)
    if flag is not None:
        flag.touch()


def _wait(name: str, timeout_s: float, what: str) -> None:
    flag = _flag(name)
    if flag is None:
        return
    started = time.monotonic()
    while not flag.exists():
        if time.monotonic() - started > timeout_s:
            print(f"\nlanes: no word that {what} after {timeout_s:.0f} s; going on", flush=True)
            return
        time.sleep(1.0)
    print(f"\nlanes: {what} (waited {time.monotonic() - started:.0f} s)", flush=True)


def main_lane_quiet() -> None:
    """The main lane's burst is over (or never comes): the beside lane may start."""
    if LANE == "main":
        _signal("quiet")


def wait_for_quiet() -> None:
    """In the beside lane, before a test with a vLLM: wait until the main lane's CPU is free."""
    if LANE == "beside":
        _wait("quiet", QUIET_TIMEOUT_S, "the main lane is quiet")


def beside_lane_done() -> None:
    """The beside lane has ended: the main lane may go on with its next burst."""
    if LANE == "beside":
        _signal("done")


def wait_for_beside_lane() -> None:
    """In the main lane, once it let the beside lane start: wait for the beside lane to end."""
    if LANE == "main" and (flag := _flag("quiet")) is not None and flag.exists():
        _wait("done", DONE_TIMEOUT_S, "the beside lane has ended")


def wait_for_unit_tests() -> None:
    """In either lane, before a test with a vLLM: wait until phase 1's unit tests have ended.

    ``scripts/test.sh`` touches the flag once both unit-test processes have exited, passed or
    not: a burst on both cores would slow them past their wall-clock bounds.
    """
    if LANE in ("main", "beside"):
        _wait("units", UNITS_TIMEOUT_S, "the unit tests have ended")
