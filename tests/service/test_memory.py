"""Windows bounded in bytes, and one budget for all the windows of the process."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from exporter.core.derive import Sample, next_sample, window_snapshot
from exporter.core.footprint import sample_bytes
from exporter.core.reasons import EvictionReason
from exporter.service.memory import MIN_SAMPLES, MemoryBudget, Window
from exporter.testing import heavy
from exporter.testing.fakevllm import VllmState, render_metrics
from exporter.vllm.metrics import parse_vllm_metrics

KIB = 1024


def _fill(window: Window, case: heavy.Heavy, polls: int, start: int = 0) -> None:
    """Add ``polls`` samples of ``case`` to ``window``, one a second, never too close."""
    for scrape in range(start, start + polls):
        snapshot = parse_vllm_metrics(case.payload(scrape))
        window.add(
            next_sample(window.latest, float(scrape), snapshot),
            spacing=0.0,
            keep_seconds=1e9,
            capacity=10_000,
        )


def _healthy() -> heavy.Heavy:
    return heavy.Heavy(
        "healthy", lambda scrape: render_metrics(VllmState(finished=12 + 2 * scrape))
    )


def test_a_lean_sample_keeps_no_help_names_nor_cache_config_labels() -> None:
    """HELP names and cache_config_info labels, new every poll, are not kept in the window."""
    names = parse_vllm_metrics(heavy.help_names(50).payload(1))
    labels = parse_vllm_metrics(heavy.cache_config_labels(engines=2, labels=20).payload(1))
    assert len(names.families) > 50
    assert window_snapshot(names, None).families == frozenset()
    lean = window_snapshot(labels, None)
    assert all(e.cache_config and not e.cache_config.labels for e in lean.engines.values())
    assert all(e.cache_config and e.cache_config.num_gpu_blocks for e in lean.engines.values())


def _held_by_window(case: heavy.Heavy, polls: int, max_bytes: int = 2**30) -> int:
    """Bytes a window of ``polls`` samples of ``case`` holds, as tracemalloc traces them."""
    payloads = [case.payload(scrape) for scrape in range(polls)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        window = Window(max_bytes=max_bytes)
        for scrape, payload in enumerate(payloads):
            window.add(
                next_sample(window.latest, float(scrape), parse_vllm_metrics(payload)),
                spacing=0.0,
                keep_seconds=1e9,
                capacity=10_000,
            )
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_changing_help_names_do_not_grow_a_window() -> None:
    """2,000 new HELP names a poll: the window holds what a healthy target's does."""
    assert _held_by_window(heavy.help_names(2_000), 20) < 1.3 * _held_by_window(_healthy(), 20)


def test_changing_cache_config_labels_do_not_grow_a_window() -> None:
    """110 labels of every engine's cache_config_info, new every poll, are not kept."""
    labels = heavy.cache_config_labels(engines=4, chars=200)
    healthy = heavy.Heavy(
        "healthy_4", lambda n: render_metrics(VllmState(engines=4, finished=12 + 2 * n))
    )
    assert _held_by_window(labels, 12) < 1.3 * _held_by_window(healthy, 12)


@pytest.mark.parametrize("case", heavy.cases(scale=0.05), ids=lambda case: case.name)
def test_what_a_window_really_holds_stays_near_its_bytes(case: heavy.Heavy) -> None:
    """Every heavy case, 12 polls into a window of 1 MiB: tracemalloc sees at most 1.3 x."""
    assert _held_by_window(case, 12, max_bytes=1024 * KIB) < 1.3 * 1024 * KIB


def test_a_window_of_heavy_samples_stays_within_its_bytes() -> None:
    """256 moving buckets every poll: the oldest samples go, counted, the bytes stay bounded.

    (Long split-label values no longer fill a window: the parser keeps 1,024 characters of them.)
    """
    window = Window(max_bytes=1024 * KIB)
    _fill(window, heavy.moving_buckets(engines=2), 40)
    assert window.bytes <= 1024 * KIB
    assert MIN_SAMPLES < len(window) < 40
    assert window.evictions[EvictionReason.TARGET_BUDGET] == 40 - len(window)


def test_a_window_keeps_two_samples_however_heavy() -> None:
    """Rates need two samples: a window over its bytes with two keeps both."""
    window = Window(max_bytes=1)
    _fill(window, _healthy(), 5)
    assert len(window) == MIN_SAMPLES


def test_the_biggest_window_gives_up_samples_and_a_small_healthy_one_none() -> None:
    """Over the process budget, the heavy target's window shrinks; the healthy one is whole."""
    budget = MemoryBudget(limit_bytes=512 * KIB)
    healthy, hostile = (
        Window(max_bytes=2**30, budget=budget),
        Window(max_bytes=2**30, budget=budget),
    )
    for scrape in range(30):
        _fill(healthy, _healthy(), 1, start=scrape)
        _fill(hostile, heavy.moving_buckets(engines=2), 1, start=scrape)
    assert budget.used_bytes <= 512 * KIB
    assert len(healthy) == 30
    assert healthy.evictions.total() == 0
    assert hostile.evictions[EvictionReason.PROCESS_BUDGET] == 30 - len(hostile) > 0


def test_a_window_dropped_with_its_target_leaves_the_budget() -> None:
    """Fleet mode forgets stale targets: their windows no longer count against the budget."""
    budget = MemoryBudget(limit_bytes=2**30)
    window = Window(max_bytes=2**30, budget=budget)
    _fill(window, _healthy(), 3)
    assert budget.used_bytes > 0
    del window
    gc.collect()
    assert budget.used_bytes == 0


def test_a_sample_replaced_for_spacing_is_not_counted_twice() -> None:
    """Polls closer than the spacing replace the latest sample: its bytes are given back."""
    window = Window(max_bytes=2**30)
    case = _healthy()
    for scrape in range(20):
        sample: Sample = next_sample(
            window.latest, scrape / 100, parse_vllm_metrics(case.payload(scrape))
        )
        window.add(sample, spacing=10.0, keep_seconds=1e9, capacity=100)
    assert len(window) == MIN_SAMPLES
    snapshots = [s.snapshot for s in window.samples]
    assert window.bytes == sample_bytes(snapshots[0]) + sample_bytes(snapshots[1], snapshots[0])


def test_many_heavy_windows_of_two_samples_give_up_whole_windows_not_the_healthy_one() -> None:
    """Six heavy targets polled twice each over a small budget: whole heavy windows go."""
    budget = MemoryBudget(limit_bytes=512 * KIB)
    healthy = Window(max_bytes=2**30, budget=budget)
    hostile = [Window(max_bytes=2**30, budget=budget) for _ in range(6)]
    case = heavy.moving_buckets(engines=2)
    for scrape in range(2):
        _fill(healthy, _healthy(), 1, start=scrape)
        for window in hostile:
            _fill(window, case, 1, start=scrape)
    assert budget.used_bytes <= 512 * KIB
    assert len(healthy) == MIN_SAMPLES
    assert healthy.evictions.total() == 0
    assert len(hostile[-1]) >= 1  # the one just added to keeps its latest sample
    assert sum(w.evictions[EvictionReason.PROCESS_BUDGET] for w in hostile) > 0
    assert any(not window for window in hostile)


def test_what_a_target_holds_besides_its_samples_counts_in_the_budget() -> None:
    """A target's state (baseline, figures, poller) is counted with its window's samples."""
    budget = MemoryBudget(limit_bytes=2**30)
    window = Window(max_bytes=2**30, budget=budget)
    _fill(window, _healthy(), 2)
    samples = budget.used_bytes
    window.hold_state(100 * KIB)
    assert budget.used_bytes == samples + 100 * KIB == window.held_bytes


def test_a_small_healthy_target_is_kept_while_big_states_are_forgotten_biggest_first() -> None:
    """Over the budget with every window down to two samples, the biggest targets go whole.

    Each gives up its samples (``process_budget``), then itself, counted once
    (``forgotten``), until the total fits. The small healthy target loses nothing.
    """
    budget = MemoryBudget(limit_bytes=2**30)
    healthy = Window(max_bytes=2**30, budget=budget)
    _fill(healthy, _healthy(), 2)
    healthy.hold_state(10 * KIB)
    big = [Window(max_bytes=2**30, budget=budget) for _ in range(4)]
    for i, window in enumerate(big):
        _fill(window, _healthy(), 2)
        window.hold_state((300 + 10 * i) * KIB)
    budget.limit_bytes = 700 * KIB
    _fill(big[0], _healthy(), 1, start=2)  # over now: the biggest others go
    assert budget.used_bytes <= 700 * KIB
    assert [window.forgotten for window in big] == [False, False, True, True]
    assert big[3].evictions == {EvictionReason.PROCESS_BUDGET: 2, EvictionReason.FORGOTTEN: 1}
    assert (len(big[3]), big[3].held_bytes) == (0, 0)
    assert not big[1].evictions
    assert len(healthy) == MIN_SAMPLES
    assert not healthy.forgotten
    assert healthy.evictions.total() == 0


def test_a_lone_target_is_never_forgotten() -> None:
    """The sidecar's one target, however big its state, keeps its window and itself."""
    budget = MemoryBudget(limit_bytes=1)
    window = Window(max_bytes=2**30, budget=budget)
    _fill(window, _healthy(), 3)
    window.hold_state(10 * KIB)
    assert not window.forgotten
    assert len(window) == MIN_SAMPLES


class _CountedWindow(Window):
    """A window that counts how often anyone asks what it holds."""

    asked = 0

    @property
    def held_bytes(self) -> int:
        _CountedWindow.asked += 1
        return self.bytes + self.state_bytes


def test_a_poll_under_the_budget_does_not_look_at_the_other_targets() -> None:
    """At 1,000 targets a poll must not sum them all: the budget keeps its total as they change."""
    budget = MemoryBudget(limit_bytes=2**30)
    others = [_CountedWindow(max_bytes=2**30, budget=budget) for _ in range(1_000)]
    for window in others:
        window.hold_state(KIB)
    polled = _CountedWindow(max_bytes=2**30, budget=budget)
    _CountedWindow.asked = 0
    _fill(polled, _healthy(), 3)
    polled.hold_state(2 * KIB)
    assert _CountedWindow.asked < 20  # the polled window's own, never the 1,000 others'
    assert budget.held_bytes == budget.used_bytes == 1_000 * KIB + polled.held_bytes
    assert len(others) == 1_000


@pytest.mark.parametrize("seed", range(6))
def test_the_running_total_is_what_the_windows_hold_after_any_changes(seed: int) -> None:
    """Adds, replaced samples, state, clears, evictions, forgetting and windows gone: no drift."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    snapshots = [parse_vllm_metrics(_healthy().payload(scrape)) for scrape in range(3)]
    snapshots += [parse_vllm_metrics(heavy.moving_buckets(engines=2).payload(s)) for s in range(2)]
    budget = MemoryBudget(limit_bytes=2**30)
    windows = [Window(max_bytes=rng.choice([2**30, 64 * KIB]), budget=budget) for _ in range(5)]
    t = 0.0
    forgotten_gone = 0
    for _ in range(200):
        t += 1.0
        action = rng.randrange(6)
        window = rng.choice(windows)
        if action <= 1:
            sample = next_sample(window.latest, t, rng.choice(snapshots))
            window.add(sample, spacing=rng.choice([0.0, 3.0]), keep_seconds=20.0, capacity=8)
        elif action == 2:
            window.hold_state(rng.randrange(0, 200 * KIB))
        elif action == 3:
            window.clear()
        elif action == 4:
            budget.limit_bytes = rng.choice([2**30, budget.used_bytes // 2 + 1])
        else:
            forgotten_gone += window.evictions[EvictionReason.FORGOTTEN]
            windows.remove(window)
            del window  # its last reference: collected now, its share given back
            windows.append(Window(max_bytes=2**30, budget=budget))
        assert budget.held_bytes == budget.used_bytes == sum(w.held_bytes for w in windows)
    forgotten = forgotten_gone + sum(w.evictions[EvictionReason.FORGOTTEN] for w in windows)
    assert budget.forgotten_count == forgotten
