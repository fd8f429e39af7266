"""The targets' memory: each one's samples, bounded in bytes, and one budget for them all.

A window held hundreds of samples whatever they weighed: a target that sends long label values,
many moving buckets or changing ``cache_config_info`` labels made each sample heavy, and fleet
mode multiplied that by every target. Here each :class:`Window` knows what its samples cost
(:func:`~exporter.core.footprint.sample_bytes`) and what its target holds besides them between
polls (:func:`~exporter.core.footprint.state_bytes`: the restart baseline, the figures the next
poll reads, the poller itself), and one :class:`MemoryBudget` holds all the targets of the
process to a total derived from the memory limit (``memory_limit_bytes``). When the total is
over, the biggest window gives up its oldest sample first, down to two samples (a rate needs
two); when every window is down to two, the biggest target other than the one just added to
gives up its last samples, and then, with none left, is forgotten whole (fleet mode drops it;
its next probe starts it again, like a new one). A small healthy target loses nothing while a
bigger one is over, and every sample given up and every target forgotten is counted by reason
(``headroom_window_evictions_total``).

A poll costs the budget O(1), not O(targets): the budget keeps the total as the windows change
(each window's share in a :class:`_Share`, given back when the window is collected), and only
walks the windows when the total is over the limit, where it also recounts the total from them.
A fleet of ``probe_max_targets`` windows summed on every poll cost each probe about 0.14 ms a
sum at 1,000 targets (twice a poll), quadratic in the fleet's size.
"""

from __future__ import annotations

import weakref
from collections import Counter, deque
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.core.derive import detect_restart
from exporter.core.footprint import sample_bytes
from exporter.core.reasons import EvictionReason

if TYPE_CHECKING:
    from exporter.core.derive import Sample

#: Fewest samples a window keeps whatever the budget: the rates need two.
MIN_SAMPLES = 2
#: The budget recounts its total from the windows at least once in this many reclaims (about
#: 4 windows a call at 1,000 targets): a window collected on another thread in the middle of a
#: recount can leave the running total off by its share, and never for long.
RECOUNT_EVERY = 256


class _Share:
    """What one window holds as the budget counted it: given back when the window is gone."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class MemoryBudget:
    """Bytes all the targets of the process may hold together (one per exporter).

    Windows register themselves; a window dropped with its poller (fleet mode forgets stale
    targets) leaves the budget with it. Windows change only on the event loop's thread; a
    window may be collected on any thread, so what it gives back is queued (a deque's append
    is atomic) and taken off the total on the loop's next look at it.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._windows: weakref.WeakSet[Window] = weakref.WeakSet()
        #: What the live windows hold, as they reported each change.
        self._held = 0
        #: Shares of windows collected since the total last took them off.
        self._gone: deque[_Share] = deque()
        #: Windows forgotten whole since start: their owners look for them only when it moves.
        self.forgotten_count = 0
        self._calls = 0

    def register(self, window: Window, share: _Share) -> None:
        """Count ``window`` (its ``share``) in the total from now on."""
        self._windows.add(window)
        self._held += share.held
        weakref.finalize(window, self._gone.append, share)

    def moved(self, share: _Share, delta: int) -> None:
        """A window's holding changed by ``delta`` bytes."""
        share.held += delta
        self._held += delta

    @property
    def held_bytes(self) -> int:
        """What all the targets hold now, as counted on each change (O(1))."""
        while self._gone:
            self._held -= self._gone.popleft().held
        return self._held

    @property
    def used_bytes(self) -> int:
        """What all the targets hold now, summed window by window (O(targets))."""
        return sum(window.held_bytes for window in self._windows)

    def reclaim(self, requester: Window) -> None:
        """Evict oldest samples, then whole targets, biggest first, until the total fits.

        Windows give up samples down to two first; then the biggest target other than
        ``requester`` (its latest sample is being derived from) gives up its last samples,
        and with none left is forgotten. Biggest by all it holds: a target whose state alone
        is big goes before a small one loses a sample.
        """
        self._calls += 1
        if self._calls % RECOUNT_EVERY and self.held_bytes <= self.limit_bytes:
            return
        windows = list(self._windows)
        excess = sum(window.held_bytes for window in windows) - self.limit_bytes
        while excess > 0:
            donors = [window for window in windows if len(window) > MIN_SAMPLES]
            if donors:
                biggest = max(donors, key=_held)
                excess -= biggest.evict_oldest(EvictionReason.PROCESS_BUDGET)
                continue
            donors = [
                window
                for window in windows
                if window is not requester and not window.forgotten and window.held_bytes
            ]
            if not donors:
                break
            biggest = max(donors, key=_held)
            if biggest:
                excess -= biggest.evict_oldest(EvictionReason.PROCESS_BUDGET)
            else:
                excess -= biggest.forget()
        # Recounted from the windows, whatever the running total said before.
        self._gone.clear()
        self._held = excess + self.limit_bytes


def _held(window: Window) -> int:
    return window.held_bytes


class Window:
    """One target's samples in time order, with what each costs, bounded in count and bytes.

    It also carries the estimate of what its target holds between polls outside the samples
    (:attr:`state_bytes`), so that the budget counts the whole target.
    """

    def __init__(self, *, max_bytes: int, budget: MemoryBudget | None = None) -> None:
        self.max_bytes = max_bytes
        self._budget = budget
        self._share = _Share()
        self._samples: deque[Sample] = deque()
        self._sizes: deque[int] = deque()
        self.bytes = 0
        #: What the target holds besides the samples, as its poller last estimated it.
        self.state_bytes = 0
        #: The budget gave up the whole target: its owner (fleet mode) is to drop it.
        self.forgotten = False
        #: Samples given up for memory, and targets forgotten, by reason (an
        #: EvictionReason); never reset.
        self.evictions: Counter[str] = Counter()
        if budget is not None:
            budget.register(self, self._share)

    def _report(self, held_before: int) -> None:
        """Tell the budget what the last change did to what this window holds."""
        if self._budget is not None:
            self._budget.moved(self._share, self.held_bytes - held_before)

    def __len__(self) -> int:
        return len(self._samples)

    def __bool__(self) -> bool:
        return bool(self._samples)

    @property
    def held_bytes(self) -> int:
        """All the target holds: its samples and its state."""
        return self.bytes + self.state_bytes

    @property
    def samples(self) -> list[Sample]:
        """The samples, oldest first (a copy)."""
        return list(self._samples)

    @property
    def latest(self) -> Sample | None:
        """The newest sample, if any."""
        return self._samples[-1] if self._samples else None

    def clear(self) -> None:
        """Forget every sample (not an eviction: nothing in them is to be trusted)."""
        before = self.held_bytes
        self._samples.clear()
        self._sizes.clear()
        self.bytes = 0
        self._report(before)

    def add(self, sample: Sample, *, spacing: float, keep_seconds: float, capacity: int) -> None:
        """Add ``sample``; bounded by age, by count through ``spacing``, and by bytes.

        A sample closer than ``spacing`` to the one before the latest replaces the latest
        (carrying a restart seen by either, or one between the sample it now follows and it:
        counters lower by float noise at each poll may be lower by more across the polls
        replaced). One sample older than ``keep_seconds`` stays: the baseline of the first
        increase.
        """
        before = self.held_bytes
        samples = self._samples
        if len(samples) >= MIN_SAMPLES and sample.t - samples[-2].t < spacing:
            latest = samples.pop()
            self.bytes -= self._sizes.pop()
            restarted = (
                sample.restarted
                or latest.restarted
                or detect_restart(samples[-1].snapshot, sample.snapshot)
            )
            sample = replace(sample, restarted=restarted)
        previous = samples[-1].snapshot if samples else None
        size = sample_bytes(sample.snapshot, previous)
        samples.append(sample)
        self._sizes.append(size)
        self.bytes += size
        while len(samples) >= MIN_SAMPLES and samples[1].t < sample.t - keep_seconds:
            self._pop_oldest()
        while len(samples) > capacity:
            self._pop_oldest()
        while len(samples) > MIN_SAMPLES and self.bytes > self.max_bytes:
            self._evict(EvictionReason.TARGET_BUDGET)
        self._report(before)
        if self._budget is not None:
            self._budget.reclaim(self)

    def hold_state(self, state_bytes: int) -> None:
        """Count ``state_bytes`` as the target's state from now on (the budget may reclaim)."""
        grew = state_bytes > self.state_bytes
        before = self.held_bytes
        self.state_bytes = state_bytes
        self._report(before)
        if grew and self._budget is not None:
            self._budget.reclaim(self)

    def forget(self) -> int:
        """Give up the whole target: its samples now, its state when its owner drops it.

        Counted once under ``forgotten``; the bytes freed (as estimated).
        """
        freed = self.held_bytes
        self.clear()
        before = self.held_bytes
        self.state_bytes = 0
        self._report(before)
        self.forgotten = True
        self.evictions[EvictionReason.FORGOTTEN] += 1
        if self._budget is not None:
            self._budget.forgotten_count += 1
        return freed

    def evict_oldest(self, reason: EvictionReason) -> int:
        """Give up the oldest sample for memory, counted under ``reason``; the bytes freed."""
        freed = self._evict(reason)
        if self._budget is not None:
            self._budget.moved(self._share, -freed)
        return freed

    def _evict(self, reason: EvictionReason) -> int:
        self.evictions[reason] += 1
        return self._pop_oldest()

    def _pop_oldest(self) -> int:
        self._samples.popleft()
        freed = self._sizes.popleft()
        # The next sample was estimated as sharing with the one gone: count it whole now.
        if self._samples:
            whole = sample_bytes(self._samples[0].snapshot)
            freed -= whole - self._sizes[0]
            self._sizes[0] = whole
        self.bytes -= freed
        return freed
