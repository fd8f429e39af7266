"""Counters and histograms over a window of samples: increases, resets and quantiles.

Pure functions over plain values. vLLM's counters and histograms are cumulative since the
server started; when it restarts they start again from zero. Like Prometheus's ``increase()``,
every function here treats a decrease between two consecutive samples as a reset and counts the
new value as the increase since the reset, so an increase is never negative and never spikes by
the previous lifetime's total. A decrease within float noise (:data:`COUNTER_NOISE_RATIO`) is
no reset: it adds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from exporter.core.snapshot import Histogram


#: A counter lower than before by no more than this fraction of its value went down by float
#: noise, not by a reset: prometheus_client's multiprocess mode sums one file per process, and a
#: restarted counter starts again from zero, nowhere near its previous value.
COUNTER_NOISE_RATIO = 1e-9


def went_down(previous: float, current: float) -> bool:
    """Whether a cumulative counter went down between two samples: a reset, not float noise."""
    return current < previous - COUNTER_NOISE_RATIO * abs(previous)


def counter_increase(previous: float, current: float, *, reset: bool = False) -> float:
    """Increase of a cumulative counter between two consecutive samples.

    A decrease (:func:`went_down`), or ``reset=True`` (a restart detected by other means),
    means the counter started again from zero, so the increase is ``current``. A reading lower
    by float noise alone is no increase.
    """
    if reset or went_down(previous, current):
        return max(current, 0.0)
    return max(current - previous, 0.0)


def window_increase(
    values: Sequence[float | None],
    resets: Sequence[bool] | None = None,
    counted: Sequence[bool] | None = None,
) -> float:
    """Total increase of a counter over consecutive samples, reset-aware.

    ``values[i]`` is the counter at sample ``i`` (``None`` where it was absent: a gap, not a
    reset). ``resets[i]`` marks a restart detected between sample ``i - 1`` and ``i``.
    Pairs with a missing side contribute nothing, except after a detected reset, where the
    value counts from zero, unless ``counted[i]`` is False: no process restarting in that
    interval could have counted it, and the interval then adds nothing (see
    :func:`exporter.core.derive.restart_counts`).
    """
    total = 0.0
    previous: float | None = None
    pending_reset = False  # a restart seen while the value was absent applies to its return
    for i, value in enumerate(values):
        pending_reset |= bool(resets[i]) if resets is not None and i > 0 else False
        if value is None:
            continue
        if pending_reset and counted is not None and not counted[i]:
            pass  # an impossible count: this interval adds nothing
        elif previous is not None:
            total += counter_increase(previous, value, reset=pending_reset)
        elif pending_reset:
            total += max(value, 0.0)
        previous, pending_reset = value, False
    return total


@dataclass(frozen=True, slots=True)
class BucketCounts:
    """Non-cumulative view of a histogram over a window: observations per bucket.

    ``counts[i]`` observations fell in ``(bounds[i-1], bounds[i]]`` (``(0, bounds[0]]`` for the
    first; the last bound is ``inf``). ``sum`` is the sum of the observations.
    """

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float

    @property
    def total(self) -> float:
        """Number of observations."""
        return math.fsum(self.counts)

    @property
    def mean(self) -> float | None:
        """Mean observation, exact from the sums; ``None`` when empty."""
        total = self.total
        return self.sum / total if total > 0 else None


def _as_buckets(histogram: Histogram) -> BucketCounts:
    counts = [histogram.cumulative[0]] + [
        histogram.cumulative[i] - histogram.cumulative[i - 1]
        for i in range(1, len(histogram.cumulative))
    ]
    return BucketCounts(histogram.bounds, tuple(max(c, 0.0) for c in counts), histogram.sum)


def histogram_increase(
    previous: Histogram | None, current: Histogram, *, reset: bool = False
) -> BucketCounts | None:
    """Observations added between two consecutive samples of one histogram.

    ``None`` when the two samples cannot be compared (different buckets without a reset).
    A reset (detected, or a count going down) makes the whole current histogram the increase.
    """
    if previous is None or reset or went_down(previous.count, current.count):
        return _as_buckets(current)
    if previous.bounds != current.bounds:
        return None
    now, before = _as_buckets(current), _as_buckets(previous)
    counts = tuple(max(a - b, 0.0) for a, b in zip(now.counts, before.counts, strict=True))
    return BucketCounts(current.bounds, counts, max(current.sum - previous.sum, 0.0))


def merge_buckets(parts: Iterable[BucketCounts]) -> BucketCounts | None:
    """Add bucket counts with identical bounds; ``None`` when there is nothing to add.

    Parts with other bounds than the first are skipped: vLLM's buckets depend only on its
    version and ``max_model_len``, which change only across restarts.
    """
    bounds: tuple[float, ...] | None = None
    counts: list[float] = []
    total_sum = 0.0
    for part in parts:
        if bounds is None:
            bounds = part.bounds
            counts = [0.0] * len(bounds)
        elif part.bounds != bounds:
            continue
        for i, count in enumerate(part.counts):
            counts[i] += count
        total_sum += part.sum
    if bounds is None:
        return None
    return BucketCounts(bounds, tuple(counts), total_sum)


def bucket_quantile(q: float, buckets: BucketCounts) -> float | None:
    """The ``q``-quantile of a bucketed distribution, as PromQL's ``histogram_quantile`` does.

    Linear interpolation inside the bucket that holds the quantile, assuming observations spread
    evenly in it; the first bucket starts at 0. A quantile in the ``+Inf`` bucket returns the
    largest finite bound (a lower bound of the truth). ``None`` when there are no observations.
    """
    if not 0.0 <= q <= 1.0:
        msg = f"quantile must be within [0, 1], got {q}"
        raise ValueError(msg)
    total = buckets.total
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0.0
    for i, count in enumerate(buckets.counts):
        upper = buckets.bounds[i]
        if count > 0 and cumulative + count >= rank:
            lower = buckets.bounds[i - 1] if i else 0.0
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - cumulative) / count
        cumulative += count
    finite = [b for b in buckets.bounds if not math.isinf(b)]
    return finite[-1] if finite else None
