"""Hostile inputs, round three: a target that "restarts" at every poll with huge counters.

Each payload carries a new ``process_start_time_seconds`` and counters near 1e12: each poll is
a restart, and a restart counts the new process's counters as the increase. A real sidecar
polls the fake vLLM every 0.2 s; what it exports is judged from outside. Figures go to the
``restarts`` section.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from exporter.core.derive import COUNTER_CEILINGS_PER_SECOND, Counted
from exporter.testing.fakevllm import VllmState, render_metrics
from tests.reliability.test_hostile_inputs import sidecar

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.testing.processes import Scrape

    from .conftest import Figures

#: Where each payload's start time lies, for the ``served``-th answer.
START_TIMES: dict[str, Callable[[int], float]] = {
    # Just before each answer: a process that started within the poll interval.
    "just_before_each_poll": lambda _served: time.time() - 0.05,
    # In 1970, one second later at each answer: a process "running" for 56 years.
    "in_1970": lambda served: 1.0 + served,
    # An hour ahead of the clock.
    "in_the_future": lambda served: time.time() + 3600 + served,
}


@pytest.mark.parametrize("start", list(START_TIMES))
def test_a_new_start_time_every_poll_with_huge_counters_exports_no_huge_rate(
    start: str, figures: Figures
) -> None:
    """Counters near 1e12 and a new start time in every payload: no rate near the counters."""
    start_time = START_TIMES[start]

    def payload(served: int) -> bytes:
        huge = 10**12 + served
        state = VllmState(preemptions=huge, finished=huge, start_time=start_time(served))
        return render_metrics(state)

    rates: list[float] = []

    def seen(scrape: Scrape) -> bool:
        rates.extend(scrape.series("headroom_preemptions_per_second").values())
        return (scrape.value("headroom_target_restarts_total") or 0.0) >= 5

    with sidecar(payload) as (_vllm, exporter):
        scrape, took = exporter.wait_for(seen, timeout=30, every=0.05)
        restarts = scrape.value("headroom_target_restarts_total") or 0.0
        assert exporter.non_json_lines() == []
    worst = max(rates, default=0.0)
    figures.record(
        "restarts",
        f"new_start_time_every_poll_{start}",
        {"restarts": restarts, "seconds": round(took, 2), "worst_preemptions_per_second": worst},
    )
    assert rates, "no preemption rate was exported at all"
    assert worst <= COUNTER_CEILINGS_PER_SECOND[Counted.PREEMPTIONS]
    assert worst < 10, f"{worst:.3g} preemptions/s from counters that moved by 1 a poll"
