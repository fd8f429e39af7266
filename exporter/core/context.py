"""Context length (prompt + output tokens) of finished requests, from vLLM's two histograms.

vLLM observes each finished request twice: its prompt tokens in ``vllm:request_prompt_tokens``
and its generated tokens in ``vllm:request_generation_tokens``. The pairing is lost, so the
quantiles of the sum cannot be read off the two histograms. Adding each histogram's quantile
(PromQL's ``histogram_quantile`` on each, the comonotonic sum) assumes the longest prompts come
with the longest outputs, and interpolating evenly inside 1-2-5 buckets spreads every request
over a bucket up to 2.5 times wide: 128 + 256 tokens read as 680 at p95.

What the sidecar knows exactly is finer than the window's merged buckets: for each poll
interval and each histogram, how many requests finished in each bucket and the *sum* of their
lengths. This module places every request's context from that.

The method
----------
1. **Groups.** A poll interval's requests are a group whose prompts and outputs belong together
   (vLLM observes both when a request finishes). Should the two counts of an interval disagree
   (a poll between the two observations), up to four consecutive intervals are merged.
2. **One request** in a group is exact: its context is the prompt sum plus the output sum.
3. **Bucket priors.** Each bucket's mean and variance of one request are fitted to every
   group's exact sum: the means by generalised least squares (``sum c_b m_b`` against the sum,
   by iteration, starting from the groups that held that histogram in that bucket alone), the
   variances by least squares on the squared gaps, ``E[(S - sum c_b m_b)^2] = (1 - h) sum c_b
   v_b`` (``h`` the group's own weight in the fitted means; all buckets at once, reweighted
   a few times, each time halfway), with an even spread over the
   bucket (PromQL's assumption) counted as one more group. So groups spread over several
   buckets inform every bucket they touch, and a bucket seen in few groups leans to the even
   spread. For spreading (not for placing) the variances are raised to their 75 % upper
   confidence bound (chi-square, the fit's effective degrees of freedom).
4. **Placing a group.** Within a group, the priors are conditioned on the group's exact sum as
   normal variables would be: the gap between the sum and the priors goes to each request in
   proportion to its variance, each keeping ``variance x (1 - variance / group variance)``,
   within the range the sum and the other requests' buckets leave it (a truncated normal). So a
   group in one bucket gets its exact mean and the within-group share ``(n - 1) / n`` of the
   variance, and a wide bucket beside narrow ones is pinned by the sum.
5. **Pairing.** A group with all prompts in one bucket and all outputs in one bucket (a *cell*)
   is spread with the cell's own variance, ``sum n_i (m_i - m)^2 / (groups - 1)`` over those
   groups' exact mean contexts (unbiased whatever the sizes ``n_i``; it captures how prompt and
   output go together; identical means give 0), at its 75 % upper confidence bound. Elsewhere
   which prompt went with which output within a group cannot be known, but how prompt and
   output go together can be measured across groups: of two nearby groups (up to four apart),
   the exact mean prompt and mean output both rise or both fall with probability
   ``1/2 + asin(rho) / pi`` (``rho`` the normal-score correlation of a request's prompt and
   output). ``rho`` read from that share, at its upper confidence bound (one standard
   deviation) and within [0, 1], is the share of each group's requests paired longest with
   longest (the comonotonic sum); the rest pair each prompt bucket with each output bucket in
   proportion to their counts (independently). Negative correlation is paired as none (the
   higher of the two). Each pair's spread is ``sd_p^2 + sd_o^2 + 2 rho sd_p sd_o`` (the
   cell's, when measured, up to the comonotonic ``(sd_p + sd_o)^2``). Too few pairs of groups
   that differ (under 16) to measure: all longest with longest. Nearby groups, not the
   covariance about the window's means: traffic that changes within the window (documents,
   then chat) correlates prompt and output across the window whatever each request did.
6. **Shape.** Each pair becomes a two-piece distribution around its mean: half triangles
   peaked at the mean, the upper one 1.3 times as long as the lower (request lengths skew
   right), keeping the mean and (within the bounds) the variance. A piece that would cross a
   bound is cut there and flattened towards even; only where even is not enough does the other
   piece lengthen. Lengthening the upper piece alone (its length then grows with the square of
   the spread) made a spread measured high or low by chance move the p95 of lengths near a
   bucket's lower bound about twice as far. Capped at ``max_model_len``.
7. **Quantiles.** The ``q`` quantile of ``N`` requests is the ``r``-th smallest,
   ``r = ceil(q N)``. The estimate is the length below which the mixture of all groups holds
   ``r - 1/2`` requests (about the median of the r-th smallest), raised by one standard
   deviation of that count (requests placed independently) where every request lies in one
   bucket pair, by two where they spread over several (but to at most 10 % above the first):
   where the placement is uncertain, the figure errs high by about the uncertainty, and more
   so where the placement rests on a model (the pairing, and how a poll's sum divides among
   buckets) rather than on a measured spread. The count's variance includes the pairing's:
   a request paired independently took one of its group's pairs, which one unknown, so its
   chance of lying at or below a length is its pairs' mixture's, not each pair's alone. The
   mean is exact: sums over counts.

Bias and when it is exact
-------------------------
- Exact when every group holds one request (under about one request per poll interval), and
  for a constant shape seen in at least two groups, whatever their sizes (identical exact means
  measure no spread).
- Lengths within one bucket pair: the groups' exact means and the measured variance place the
  mass; what is left is the assumed shape given them, the noise of a variance measured over one
  window, and the deliberate rise. Measured (``benchmarks/context.py``, windows as the sidecar
  reads them: 10 minutes, reaching back for 400 requests up to an hour; 120 per shape and
  rate over three seeds): p95 +0.2 to +4.1 % typical, from -2.6 to +8.3 % in the worst
  windows, where the sum of quantiles read up to +14 % typical; over 48 more seeds (46,080
  windows of these shapes) 2 outside -5 % to +10 % (below). Over the requests of a
  10-minute window alone, at 60 requests or fewer, some read up to +20 % high: the p95 of so
  few is the third-longest request, and groups of 2-3 near it cannot be split; that is why
  the caller reaches back for more requests (``exporter.core.derive``).
- Where the data cannot say more, the estimate leans high: the pairing inside groups spread over
  several buckets is longest with longest as far as the measured correlation's upper bound
  allows (all of it where too few groups measure it), a bucket or cell seen in one group only
  is spread as evenly as its bounds allow (24 requests of 128 + 256 tokens all in one poll
  read 503 with ``max_model_len`` 512; over two polls or more, 384), and quantiles rise with
  the uncertainty, the pairing's included. With many requests per interval spread over many
  buckets: p95 +2 to +20 % at 10 requests a poll (independent prompt and output: +2 to +14 %;
  negatively correlated: +20 %), where pairing longest with longest read +2 to +29 % and the
  sum of quantiles up to +53 %. At 0.2 requests a poll (about 140 requests over an hour, the
  p95 their 8th longest) the rise for the pairing of a few polls of two can lift the estimate
  to the next longest request: up to +37 % in the benchmark, and in a heavy tail (log-normal,
  sigma 1) up to about +60 % in rare windows. The p50 of spread traffic reads up to 10 % low
  (bimodal: 8 %), its p99 up to 9.4 % low.
- These are estimates, not bounds, and no estimate can be within 10 % above and 5 % below the
  truth in every window: the histograms cannot tell a poll of 5,400 x 3 and 2,300 tokens from
  one of 4,625 x 4, and among 126 requests of 3,000 and 5,300 tokens the p95 is 3,000 with one
  and 4,625 with the other. In small windows (tens of requests), traffic that runs into
  ``max_model_len`` (its mass piles at the cap, but is spread below it here), or data built to
  defeat them (one group of ``302, 302, 698`` among groups with the same mean), the truth can
  lie more than 5 % above them. The benchmark's worst windows read p95 2.6 % low (one bucket
  pair), 1.5 % low (spread), and one window of the production-like shape with correlated prompt
  and output 5.8 % low (one bucket pair, 0.2 a poll). Over 48 more seeds (84,480 windows) 2 of
  the one-bucket-pair shapes miss -5 % to +10 %: the production-like shape at 0.2 a poll, -9.4 %
  (124 requests; three of the seven longest shared a poll with a much shorter one, and a poll's
  sum cannot say how it splits), and at 10 a poll, +10.5 %. Of 61,440 windows of the spread
  shapes over 48 other seeds (correlated ones included), none reads more than 4.5 % low. Pairing
  every poll longest with longest, as before, read such windows down to -14.1 % (a poll of two
  whose longer prompt went with the shorter output held two of the 7 longest requests); pairing
  independently without the pairing in the rise, 7 of 92,160 windows read up to 14.1 % low. The
  production-like shape's spread, measured over 120 polls' means alone, is off by 20 % in a rare
  window. Windows reaching back for 200 requests instead of 400 read 5.1 % low in rare draws,
  and 600 s windows of a few dozen requests that do not reach back from 7 % low to 56 % high
  (one bucket pair: up to 20 %).
- vLLM's live KV tokens per running sequence are not used: they describe unfinished requests,
  rounded to blocks, and say nothing of how a finished request's length splits.

Cost: linear in the occupied buckets of all groups (squared within a group, for the variance
fit and the independent pairs), plus one sort of the mixture's pieces: about 15 milliseconds
for 120 intervals, up to about 130 when many requests a poll spread over many buckets
(Python 3.11, one core). Bounded whatever the histograms: over ``_MAX_BUCKETS`` occupied
buckets of one histogram in a window, runs of neighbours merge (real vLLM histograms never
have that many), and over ``_PAIR_BUDGET`` independent pairs in a window each group merges
neighbouring placed buckets (count, mean and variance kept) down to its share. Windows within
both are estimated exactly as without them.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from exporter.core.exact import MAX_EXACT_WHOLE

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from exporter.core.windows import BucketCounts

#: One-sided confidence of the upper bound put on a measured variance (as a normal quantile).
_CONFIDENCE_Z = -0.6745  # 75 %
#: An even spread over the bucket counts as this many groups in a measured variance.
_PRIOR_GROUPS = 1.0
#: Standard deviations of the count of requests below a length by which quantiles are raised,
#: where every request lies in one bucket pair (the spread that places them is measured) ...
_RANK_Z = 1.0
#: ... and where they spread over several (which prompt went with which output, and how a
#: bucket's sum divides among requests of different buckets, are modelled, not measured),
_RANK_Z_SPREAD = 2.0
#: ... but then at most this factor above the single rise: the extra covers a model's error of
#: a few percent, not a jump to the longest request of a small window (600 s windows of some
#: 24 requests read up to 23 times the truth without it).
_SPREAD_RISE_LIMIT = 1.10
#: How much longer the upper piece of a request's shape is than the lower (lengths skew right).
_SKEW = 1.3
#: Standard deviations beyond which a bound no longer shifts a normal variable's moments.
_FAR = 5.0
#: Rounds of fitting the bucket means to every group's sum.
_REFITS = 4
#: Rounds of fitting the bucket variances to every group's sum.
_VARIANCE_FITS = 8
#: At most this many consecutive intervals are merged to make the two histograms' counts agree.
_MAX_MERGED = 4
#: Relative tolerance on ranks and sums (float sums of whole counts).
_EPS = 1e-9
#: Pairs of groups that must differ to measure how prompt and output go together ...
_MIN_DIFFERENCES = 16
#: ... compared with the groups up to this many after them (a drift in the traffic cancels).
_CONCORDANCE_LAGS = 4
#: One-sided confidence of the upper bound put on that measure (as a normal quantile).
_CORRELATION_Z = 1.0
#: Standard deviation of the share of concordant pairs with no correlation, times the square
#: root of their number: 1/2 for independent pairs; these share groups, which widens it to
#: 0.8 (measured by simulation with 20 to 400 groups, lags 1 to 4).
_CONCORDANCE_SD = 0.80
#: Shares at which a half-triangle piece is cut into even pieces (finer towards its tail).
_PIECE_SHARES = (0.0, 0.6, 0.9, 1.0)
#: At most this many occupied buckets of one histogram are told apart over a window; beyond it,
#: runs of neighbouring buckets are merged. vLLM's 1-2-5 buckets are at most 23 (up to 10M
#: tokens), so real histograms never are; the fits' time grows with the cube of it.
_MAX_BUCKETS = 24
#: At most about this many independently paired (prompt bucket, output bucket) pairs over a
#: window: their shapes are most of the estimate's time and memory (some 50 us each). Windows
#: within it are untouched (the benchmark's heaviest, 40 requests a poll over many buckets, hold
#: about 4,300); over it, each group's neighbouring buckets are merged until it pairs at most
#: its share ...
_PAIR_BUDGET = 8192
#: ... but each may pair this many (4 x 4).
_MIN_PAIRS = 16

#: The longest request believed, in tokens (2**40, a trillion): no model comes near. Bucket
#: bounds and sums past it are no vLLM's, and their squares could overflow into NaN.
_LONGEST = 2.0**40

_T = TypeVar("_T")

#: A bucket as whole-token values: (lowest, highest); highest is inf for an open bucket.
_Key = tuple[float, float]
#: One observation's mean and variance in a bucket, before its group's sum is known, and the
#: variance's upper confidence bound (for spreads, not for placing).
_Prior = tuple[float, float, float]
#: A quantile function, piecewise linear: knots (share of the requests, tokens), shares 0 to 1.
_Knots = tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class IntervalCounts:
    """Both histograms' bucket deltas over the same poll interval: the requests it finished."""

    prompt: BucketCounts
    generation: BucketCounts


@dataclass(frozen=True, slots=True)
class ContextQuantiles:
    """Context length (prompt + output tokens) of the requests finished over some intervals."""

    #: Quantile -> tokens, capped at ``max_model_len`` when known.
    quantiles: Mapping[float, float]
    #: Mean tokens, exact (from the histograms' sums and counts), capped likewise.
    mean: float
    #: Requests finished (the prompt histogram's count).
    requests: float


def _key(lower: float, upper: float, cap: float | None) -> _Key:
    """Whole-token range of the bucket ``(lower, upper]``; the open bucket ends at ``cap``.

    Bounds past ``_LONGEST`` (no vLLM's) are taken as ``_LONGEST``: figures stay finite.
    """
    lowest = min(math.floor(lower) + 1.0, _LONGEST) if lower > 0 else 0.0
    highest = upper if cap is None else min(upper, cap)
    if math.isfinite(highest):
        highest = min(highest, _LONGEST)
    return (lowest, max(highest, lowest))


@dataclass(slots=True)
class _Side:
    """One histogram's observations within a group: count per bucket and their sum."""

    counts: dict[_Key, float]
    total: float = 0.0
    sum: float = 0.0

    def add(self, buckets: BucketCounts, cap: float | None, merged: Mapping[_Key, _Key]) -> None:
        """Add an interval's bucket deltas, each bucket counted as the one ``merged`` names.

        The interval's sum is taken within what its buckets allow (each observation within its
        bucket, an open one at most ``_LONGEST``): a sum the buckets contradict (vLLM's
        ``_sum`` and buckets read at different moments, or not vLLM's) would place requests
        outside their buckets, or make figures infinite.
        """
        low = high = 0.0
        for bucket, count in _occupied(buckets, cap):
            key = merged.get(bucket, bucket)
            self.counts[key] = self.counts.get(key, 0.0) + count
            self.total += count
            low += count * bucket[0]
            high += count * (bucket[1] if math.isfinite(bucket[1]) else _LONGEST)
        self.sum += min(max(buckets.sum, low), high)

    @property
    def pure(self) -> _Key | None:
        """The single bucket holding every observation, if there is one."""
        return next(iter(self.counts)) if len(self.counts) == 1 else None


@dataclass(slots=True)
class _Group:
    """Requests known to have finished together: one interval, or a few merged."""

    prompt: _Side
    generation: _Side

    @property
    def counts_agree(self) -> bool:
        """As many prompts as outputs: every request observed on both sides."""
        return abs(self.prompt.total - self.generation.total) < 0.5

    @property
    def one_cell(self) -> bool:
        """Every prompt in one bucket, every output in one bucket, as many of each."""
        return (
            self.prompt.pure is not None and self.generation.pure is not None and self.counts_agree
        )


def _occupied(buckets: BucketCounts, cap: float | None) -> Iterator[tuple[_Key, float]]:
    """The buckets that counted observations, and how many each."""
    lower = 0.0
    for bound, count in zip(buckets.bounds, buckets.counts, strict=True):
        if count > 0:
            yield _key(lower, bound, cap), count
        lower = bound


def _runs(items: Sequence[_T], runs: int) -> Iterator[Sequence[_T]]:
    """``items`` cut into ``runs`` runs of neighbours, as even in length as can be."""
    for run in range(runs):
        yield items[run * len(items) // runs : (run + 1) * len(items) // runs]


def _merged_buckets(histograms: Iterable[BucketCounts], cap: float | None) -> dict[_Key, _Key]:
    """Each occupied bucket's merged bucket, where a window holds over ``_MAX_BUCKETS`` of them.

    Runs of neighbouring buckets become one (the lowest one's start to the highest one's end),
    so that a histogram of hundreds of buckets (no vLLM's; a target's that is not vLLM, or
    changed) costs what one of ``_MAX_BUCKETS`` does. Empty where none is merged.
    """
    occupied = sorted({key for buckets in histograms for key, _ in _occupied(buckets, cap)})
    if len(occupied) <= _MAX_BUCKETS:
        return {}
    merged: dict[_Key, _Key] = {}
    for run in _runs(occupied, _MAX_BUCKETS):
        whole = (run[0][0], max(key[1] for key in run))
        merged.update((key, whole) for key in run)
    return merged


def _groups(intervals: Sequence[IntervalCounts], cap: float | None) -> list[_Group]:
    """Intervals as groups whose prompt and output counts agree (merging a few if needed)."""
    prompt_buckets = _merged_buckets((i.prompt for i in intervals), cap)
    output_buckets = _merged_buckets((i.generation for i in intervals), cap)
    groups: list[_Group] = []
    current: _Group | None = None
    merged = 0
    for interval in intervals:
        if current is None:
            current, merged = _Group(_Side({}), _Side({})), 0
        current.prompt.add(interval.prompt, cap, prompt_buckets)
        current.generation.add(interval.generation, cap, output_buckets)
        merged += 1
        if current.prompt.total <= 0 and current.generation.total <= 0:
            current = None
        elif current.counts_agree or merged >= _MAX_MERGED:
            groups.append(current)
            current = None
    if current is not None:
        groups.append(current)
    return groups


@dataclass(slots=True)
class _Moments:
    """Exact means of the groups that fell in one bucket (or one cell), weighted by size."""

    weight: float = 0.0
    weighted_sum: float = 0.0
    weighted_squares: float = 0.0
    groups: int = 0

    def add(self, n: float, mean: float) -> None:
        self.weight += n
        self.weighted_sum += n * mean
        self.weighted_squares += n * mean * mean
        self.groups += 1

    @property
    def mean(self) -> float:
        """Mean of one request."""
        return self.weighted_sum / self.weight

    def variance(self, even: float, *, upper: bool = False) -> float:
        """One request's variance, from the spread of the groups' exact means.

        ``sum n_i (m_i - m)^2 / (groups - 1)`` estimates it without bias whatever the sizes
        ``n_i`` (a mean of ``n`` requests varies ``n`` times less); ``upper`` takes its one-sided
        upper confidence bound instead (chi-square). ``even``, the variance of an even spread
        over the bucket, counts as ``_PRIOR_GROUPS`` more groups, so that a bucket seen in few
        groups is not read as narrower than it may be. Identical means (a constant shape, seen
        at least twice) give 0.
        """
        df = self.groups - 1
        squares = self.weighted_squares - self.weighted_sum * self.weighted_sum / self.weight
        squares = max(squares, 0.0)
        if df >= 1 and squares <= _EPS * self.weighted_squares:
            return 0.0
        if upper and df >= 1:
            squares *= df / _chi2_lower(df)
        return (squares + _PRIOR_GROUPS * even) / (df + _PRIOR_GROUPS)


def _chi2_lower(df: float) -> float:
    """Lower quantile of chi-square with ``df`` degrees of freedom at ``_CONFIDENCE_Z``.

    Wilson-Hilferty's approximation, floored (it turns negative below 2 degrees of freedom).
    """
    root = 1.0 - 2.0 / (9.0 * df) + _CONFIDENCE_Z * math.sqrt(2.0 / (9.0 * df))
    return df * max(root, 0.1) ** 3


def _window_moments(
    groups: Sequence[_Group],
) -> tuple[dict[_Key, _Moments], dict[_Key, _Moments], dict[tuple[_Key, _Key], _Moments]]:
    """Exact group means per prompt bucket, per output bucket and per cell (pure groups)."""
    prompt: dict[_Key, _Moments] = {}
    output: dict[_Key, _Moments] = {}
    cells: dict[tuple[_Key, _Key], _Moments] = {}
    for group in groups:
        p, g = group.prompt, group.generation
        if p.pure is not None and p.total > 0:
            prompt.setdefault(p.pure, _Moments()).add(p.total, p.sum / p.total)
        if g.pure is not None and g.total > 0:
            output.setdefault(g.pure, _Moments()).add(g.total, g.sum / g.total)
        if group.one_cell and p.pure is not None and g.pure is not None:
            cells.setdefault((p.pure, g.pure), _Moments()).add(p.total, (p.sum + g.sum) / p.total)
    return prompt, output, cells


def _start(key: _Key, moments: Mapping[_Key, _Moments]) -> tuple[float, float, float]:
    """A bucket's starting mean and variance of one request, and an even spread's variance.

    The first two from the groups that held this histogram in this bucket alone; the variance
    of an even spread over the bucket (PromQL's assumption; an open bucket is taken as one 1-2-5
    step, x2, wide) stands in where no group was.
    """
    lowest, highest = key
    top = highest if math.isfinite(highest) else 2.0 * lowest
    even = (top - lowest) ** 2 / 12.0
    known = moments.get(key)
    if known is None:
        return (lowest + top) / 2.0, even, even
    return known.mean, known.variance(even), even


@dataclass(frozen=True, slots=True)
class _Placed:
    """The requests of one bucket of one histogram within a group, given the group's sum."""

    key: _Key
    count: float
    #: Mean and variance of one of them, given the group's sum.
    center: float
    variance: float
    #: The range one of them can take, given the sum and the other requests' buckets.
    lowest: float
    highest: float


def _place(side: _Side, priors: Mapping[_Key, _Prior]) -> list[_Placed]:
    """One histogram's requests within a group: each bucket's mean and spread, given the sum.

    The priors (mean, variance) of the group's observations are conditioned on their exact sum
    as normal variables would be: the gap between the sum and the priors' goes to each in
    proportion to its variance, and each keeps ``variance x (1 - variance / total variance)``.
    So one request, or several in one bucket, get their exact mean, and a wide bucket beside
    narrow ones is pinned by the sum. Means stay within what the sum and the other buckets
    allow.
    """
    total_sum, counts = side.sum, side.counts
    if side.pure is not None:  # the exact mean, the bucket's variance among n
        key, n = side.pure, side.total
        lowest = max(key[0], total_sum - (n - 1.0) * key[1])
        highest = min(key[1], total_sum - (n - 1.0) * key[0])
        if not lowest <= highest:
            lowest, highest = key
        center = min(max(total_sum / n, lowest), highest)
        return [_Placed(key, n, center, priors[key][2] * (n - 1.0) / n, lowest, highest)]
    low_total = sum(c * k[0] for k, c in counts.items())
    high_total = sum(c * k[1] for k, c in counts.items())
    spread = sum(c * priors[k][1] for k, c in counts.items())
    gap = total_sum - sum(c * priors[k][0] for k, c in counts.items())
    centers: dict[_Key, float] = {}
    variances: dict[_Key, float] = {}
    ranges: dict[_Key, tuple[float, float]] = {}
    for key in counts:
        mean, variance, upper = priors[key]
        lowest = max(key[0], total_sum - (high_total - key[1]))  # the others as high as can be
        highest = min(key[1], total_sum - (low_total - key[0]))  # ... and as low as can be
        if not lowest <= highest:  # sums no whole tokens can make: keep the bucket
            lowest, highest = key
        ranges[key] = (lowest, highest)
        if spread > 0:
            mean += variance / spread * gap
            upper *= 1.0 - variance / spread
        centers[key], variances[key] = _truncated(mean, upper, lowest, highest)
    gap = total_sum - sum(c * centers[k] for k, c in counts.items())
    if abs(gap) > _EPS * max(abs(total_sum), 1.0):  # clipped, or no variance: share the room
        room = {
            k: (ranges[k][1] - centers[k]) if gap > 0 else (centers[k] - ranges[k][0])
            for k in counts
        }
        total_room = sum(counts[k] * r for k, r in room.items())
        if 0 < total_room < math.inf:
            step = math.copysign(min(abs(gap) / total_room, 1.0), gap)
            for key in counts:
                centers[key] += step * room[key]
    return [
        _Placed(key, count, centers[key], variances[key], *ranges[key])
        for key, count in counts.items()
    ]


def _truncated(mean: float, variance: float, lowest: float, highest: float) -> tuple[float, float]:
    """Mean and variance of a normal variable kept within ``[lowest, highest]``."""
    if variance <= 0 or highest <= lowest:
        return min(max(mean, lowest), highest), 0.0
    sd = math.sqrt(variance)
    a, b = (lowest - mean) / sd, (highest - mean) / sd
    if a < -_FAR and b > _FAR:  # the bounds too far out to matter
        return mean, variance
    mass = _normal_cdf(b) - _normal_cdf(a)
    if mass < 1e-9:  # far outside: all of it at the nearer bound
        return (lowest if b <= 0 else highest), 0.0
    pa = _normal_pdf(a)
    pb = _normal_pdf(b)
    shift = (pa - pb) / mass
    tails = (a * pa if math.isfinite(a) else 0.0) - (b * pb if math.isfinite(b) else 0.0)
    kept = variance * max(1.0 + tails / mass - shift * shift, 0.0)
    return min(max(mean + sd * shift, lowest), highest), kept


def _normal_pdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) if math.isfinite(z) else 0.0


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _pairs(
    prompts: list[_Placed], outputs: list[_Placed], together: float, limit: int | None = None
) -> list[list[tuple[float, _Placed, _Placed]]]:
    """Prompts paired with outputs, as shares of each side's requests, in pools.

    A share ``together`` longest with longest (comonotonic; each pair a pool of its own), the
    rest independently (each prompt bucket with each output bucket in proportion to their
    counts; one pool: which of those pairs a request took is unknown), in at most ``limit``
    pairs (see :func:`_within`).
    """
    prompts = sorted(prompts, key=lambda p: p.center)
    outputs = sorted(outputs, key=lambda p: p.center)
    n_prompts = sum(p.count for p in prompts)
    n_outputs = sum(p.count for p in outputs)
    requests = max(n_prompts, n_outputs)
    if len(prompts) == 1 or len(outputs) == 1:  # every coupling is the same
        together = 1.0
    pools: list[list[tuple[float, _Placed, _Placed]]] = []
    if together < 1.0:
        apart = (1.0 - together) * requests
        apart_prompts, apart_outputs = _within(prompts, outputs, limit)
        pools.append(
            [
                (apart * p.count / n_prompts * o.count / n_outputs, p, o)
                for p in apart_prompts
                for o in apart_outputs
            ]
        )
    if together <= 0.0:
        return pools
    i = j = 0
    left_p = prompts[0].count / n_prompts
    left_g = outputs[0].count / n_outputs
    while i < len(prompts) and j < len(outputs):
        share = min(left_p, left_g)
        if share > _EPS:
            pools.append([(share * together * requests, prompts[i], outputs[j])])
        left_p -= share
        left_g -= share
        if left_p <= _EPS:
            i += 1
            left_p = prompts[i].count / n_prompts if i < len(prompts) else 0.0
        if left_g <= _EPS:
            j += 1
            left_g = outputs[j].count / n_outputs if j < len(outputs) else 0.0
    return pools


def _within(
    prompts: list[_Placed], outputs: list[_Placed], limit: int | None
) -> tuple[list[_Placed], list[_Placed]]:
    """Both sides' placed buckets (in order), neighbours merged to make at most ``limit`` pairs.

    The longer side is merged first, to as many as the shorter leaves room for; past the
    square root of ``limit`` both are. A merged bucket keeps its requests' count, mean and
    variance, so the independent pairs' mean and variance are kept; their shape is smoothed.
    """
    if limit is None or len(prompts) * len(outputs) <= limit:
        return prompts, outputs
    side = math.isqrt(limit)
    if len(prompts) <= side:
        return prompts, _merged_placed(outputs, limit // len(prompts))
    if len(outputs) <= side:
        return _merged_placed(prompts, limit // len(outputs)), outputs
    return _merged_placed(prompts, side), _merged_placed(outputs, side)


def _merged_placed(placed: Sequence[_Placed], runs: int) -> list[_Placed]:
    """``placed`` as ``runs`` runs of neighbours, each one bucket of their count, mean, spread."""
    merged: list[_Placed] = []
    for run in _runs(placed, runs):
        if len(run) == 1:
            merged.append(run[0])
            continue
        count = sum(p.count for p in run)
        center = sum(p.count * p.center for p in run) / count
        variance = sum(p.count * (p.variance + (p.center - center) ** 2) for p in run) / count
        merged.append(
            _Placed(
                (min(p.key[0] for p in run), max(p.key[1] for p in run)),
                count,
                center,
                variance,
                min(p.lowest for p in run),
                max(p.highest for p in run),
            )
        )
    return merged


def _pair_limit(groups: Sequence[_Group]) -> int | None:
    """How many pairs a group may pair independently: no limit within ``_PAIR_BUDGET``."""
    products = [len(g.prompt.counts) * len(g.generation.counts) for g in groups]
    spread = [product for product in products if product > 1]
    if sum(spread) <= _PAIR_BUDGET:
        return None
    return max(_PAIR_BUDGET // len(spread), _MIN_PAIRS)


def _together(groups: Sequence[_Group]) -> float:
    """How far a request's prompt and output go together: 0 independent, 1 comonotonic.

    Measured across groups, from nearby groups' exact mean prompt and mean output: the share
    of pairs of groups (up to ``_CONCORDANCE_LAGS`` apart) in which both rise or both fall. For
    prompt and output going together with (normal-score) correlation ``rho`` that share is
    ``1/2 + asin(rho) / pi`` (Greiner's relation, for means of several requests as for single
    ones), so ``rho`` is read from it, at its upper confidence bound, within [0, 1]. Signs of
    nearby groups' differences, not the groups' covariance about the window's means: traffic
    that changes within the window (long prompts and short outputs, then the reverse) would
    show a correlation of its own there, whatever each request's prompt and output did. 1 (the
    upper bound) where too few groups differ to say.
    """
    means = [
        (g.prompt.sum / g.prompt.total, g.generation.sum / g.prompt.total)
        for g in groups
        if g.prompt.total > 0 and g.counts_agree
    ]
    concordant = differences = 0
    for lag in range(1, _CONCORDANCE_LAGS + 1):
        for (prompt, output), (later_prompt, later_output) in zip(
            means[:-lag], means[lag:], strict=True
        ):
            product = (later_prompt - prompt) * (later_output - output)
            if product != 0.0:  # a tie says nothing
                differences += 1
                concordant += product > 0.0
    if differences < _MIN_DIFFERENCES:
        return 1.0
    share = concordant / differences + _CORRELATION_Z * _CONCORDANCE_SD / math.sqrt(differences)
    return max(math.sin(math.pi * (min(share, 1.0) - 0.5)), 0.0)


def _two_piece(mean: float, variance: float, lowest: float, highest: float) -> _Knots:
    """A distribution in ``[lowest, highest]`` with this mean and (at most) this variance.

    Two pieces meet at the mean, ``[mean - a, mean]`` below and ``[mean, mean + b]`` above, each
    a half triangle peaked at the mean, the upper one ``_SKEW`` times as long (request lengths
    are skewed right). The pieces' shares balance their first moments, which keeps the mean.
    A piece that would cross a bound is cut there and flattened towards even (more of its mass
    away from the mean) to keep the variance; only where even is not enough does the other
    piece lengthen, up to its own bound, and flatten in turn.
    """
    mean = min(max(mean, lowest), highest)
    below, above = mean - lowest, highest - mean
    if variance <= 0 or below <= 0 or above <= 0:
        return ((0.0, mean), (1.0, mean))
    a, b = math.sqrt(6.0 * variance / _SKEW), math.sqrt(6.0 * variance * _SKEW)
    if a <= below and b <= above:
        return _knots(mean, (a, 0.0), (b, 0.0))
    if a > below and b > above:  # both cut: both flatten alike (the variance is ab(1 + f) / 6)
        room = below * above  # 0 only where a side is under 1e-154 tokens: even is all there is
        flat = min(max(6.0 * variance / room - 1.0, 0.0), 1.0) if room > 0.0 else 1.0
        return _knots(mean, (below, flat), (above, flat))
    # One side cut: ``near`` is it, ``far`` the other, ``room`` how far the far one may go.
    lower_cut = a > below
    near, far, room = (below, b, above) if lower_cut else (above, a, below)
    near_flat, far_flat = _flatten(near, (far, 0.0), variance), 0.0
    if near_flat > 1.0:  # even is not enough: the far piece lengthens, then flattens
        near_flat, far = 1.0, min(_lengthen(near, variance), room)
        if far >= room:
            far_flat = min(max(_flatten(far, (near, 1.0), variance), 0.0), 1.0)
    near_piece, far_piece = (near, max(near_flat, 0.0)), (far, far_flat)
    if lower_cut:
        return _knots(mean, near_piece, far_piece)
    return _knots(mean, far_piece, near_piece)


def _moments(flat: float) -> tuple[float, float]:
    """First and second moments of a piece on [0, 1]: ``flat`` x even + the rest half triangle."""
    return (2.0 + flat) / 6.0, (1.0 + flat) / 6.0


def _flatten(near: float, far: tuple[float, float], variance: float) -> float:
    """How flat the piece of length ``near`` must be for ``variance``, the other one ``far``.

    ``far`` is the other piece's (length, flat). With the pieces' shares balancing their first
    moments, the variance is linear-fractional in the flat: solved exactly. Above 1 where even
    is not enough, below 0 where a half triangle already holds more.
    """
    length, flat = far
    m1, m2 = _moments(flat)
    pull = length * m1  # the far piece's first moment: the near piece's share is in proportion
    numerator = variance * (2.0 * near + 6.0 * pull) - pull * near * near
    numerator -= 2.0 * near * length * length * m2
    denominator = pull * near * near + near * length * length * m2 - variance * near
    return numerator / denominator if denominator > 0 else 2.0


def _lengthen(near: float, variance: float) -> float:
    """Length of the far half triangle for ``variance`` with an even piece of length ``near``.

    Solves ``variance x (near / 2 + far / 3) = near^2 far / 9 + near far^2 / 12``.
    """
    half = near * near / 9.0 - variance / 3.0
    return (-half + math.sqrt(half * half + near * near * variance / 6.0)) / (near / 6.0)


def _knots(mean: float, lower: tuple[float, float], upper: tuple[float, float]) -> _Knots:
    """Quantile knots of the two pieces, each (length, flat), their shares balancing the mean."""
    (a, flat_a), (b, flat_b) = lower, upper
    pull_a, pull_b = a * _moments(flat_a)[0], b * _moments(flat_b)[0]
    share = pull_b / (pull_a + pull_b)  # of the requests below the mean
    piece_a, piece_b = _piece(round(flat_a, 2)), _piece(round(flat_b, 2))  # cached
    below = tuple((share * (1.0 - v), mean - a * t) for v, t in reversed(piece_a[1:]))
    above = tuple((share + (1.0 - share) * v, mean + b * t) for v, t in piece_b)
    return (*below, *above)


@functools.lru_cache(maxsize=128)
def _piece(flat: float) -> _Knots:
    """Quantile knots (share, x) on [0, 1] of ``flat`` x even + (1 - flat) x half triangle.

    The half triangle's density falls from the mean (0) to nothing at the edge (1); its CDF is
    ``2x - x^2``, the mixture's ``(2 - flat) x - (1 - flat) x^2``.
    """
    if flat >= 1.0:
        return ((0.0, 0.0), (1.0, 1.0))
    c = 1.0 - flat
    return tuple(
        (v, ((2.0 - flat) - math.sqrt((2.0 - flat) ** 2 - 4.0 * c * v)) / (2.0 * c))
        for v in _PIECE_SHARES
    )


def _priors(sides: Sequence[_Side], moments: Mapping[_Key, _Moments]) -> dict[_Key, _Prior]:
    """Each bucket's mean and variance of one request, fitted to every group's exact sum.

    Starting from :func:`_start`, each bucket's mean becomes the mean of its requests as placed
    by :func:`_place` over all groups, repeatedly: the fixed point is the generalised
    least-squares fit of the bucket means to the groups' sums. Then the variances are fitted to
    the gaps left (:func:`_fit_variances`), and raised to their upper confidence bound.
    """
    keys = list(dict.fromkeys(key for side in sides for key in side.counts))
    index = {key: i for i, key in enumerate(keys)}
    starts = [_start(key, moments) for key in keys]
    means = [start[0] for start in starts]
    variances = [start[1] for start in starts]
    # A side in one bucket gives that bucket its exact sum whatever the priors: added once.
    fixed_totals = [0.0] * len(keys)
    fixed_weights = [0.0] * len(keys)
    mixed: list[tuple[float, list[tuple[int, float]]]] = []
    for side in sides:
        if side.pure is not None:
            fixed_totals[index[side.pure]] += side.sum
            fixed_weights[index[side.pure]] += side.total
        else:
            mixed.append((side.sum, [(index[k], c) for k, c in side.counts.items()]))
    for _ in range(_REFITS if mixed else 0):
        totals, weights = fixed_totals.copy(), fixed_weights.copy()
        for total_sum, counts in mixed:
            _refit_group(total_sum, counts, (means, variances), totals, weights)
        moved = 0.0
        for i, (lowest, highest) in enumerate(keys):
            if weights[i] > 0:
                fitted = min(max(totals[i] / weights[i], lowest), highest)
                moved = max(moved, abs(fitted - means[i]))
                means[i] = fitted
        if moved < 0.5:  # whole tokens: closer is noise
            break
    rows = [(side.sum, [(index[k], c) for k, c in side.counts.items()]) for side in sides]
    evens = [start[2] for start in starts]
    variances, dfs = _fit_variances(keys, rows, means, variances, evens)
    return {
        key: (means[i], variances[i], variances[i] * dfs[i] / _chi2_lower(dfs[i]))
        if dfs[i] >= 1
        else (means[i], variances[i], variances[i])
        for i, key in enumerate(keys)
    }


def _fit_variances(
    keys: Sequence[_Key],
    rows: Sequence[tuple[float, list[tuple[int, float]]]],
    means: Sequence[float],
    start: Sequence[float],
    evens: Sequence[float],
) -> tuple[list[float], list[float]]:
    """Each bucket's variance fitted to every group's squared gap between its sum and means.

    ``E[(S - sum c_b m_b)^2] = (1 - h) sum c_b v_b``, ``h`` the group's own weight in the fitted
    means (its leverage): a weighted least-squares fit of the ``v_b`` (weights
    ``1 / (sum c_b v_b)^2``, as the gap is about normal, refitted with the weights of the last
    fit), all buckets at once, each within what its bucket allows, with an even spread over
    the bucket counted as ``_PRIOR_GROUPS`` groups. At once: buckets that share groups trade
    variance, and fitting each with the others held swung from fit to fit (a bucket of
    2,001-5,000 tokens fitted 596, 0, 456, 0 tokens' spread in turn), leaving a wide bucket
    with none.
    """
    size = len(keys)
    variances = list(start)
    targets = []
    for total_sum, counts in rows:
        gap = total_sum - sum(c * means[i] for i, c in counts)
        targets.append(gap * gap)
    limits = [
        (k[1] - k[0]) ** 2 / 4.0 if math.isfinite(k[1]) else 3.0 * even
        for k, even in zip(keys, evens, strict=True)
    ]
    dfs = [0.0] * size
    for _ in range(_VARIANCE_FITS):
        dfs = [0.0] * size
        predicted = [max(sum(c * variances[i] for i, c in counts), 1e-9) for _, counts in rows]
        information = [0.0] * size
        for (_, counts), v in zip(rows, predicted, strict=True):
            for i, c in counts:
                information[i] += c * c / v
        # The normal equations, the even spread's pseudo-group on the diagonal.
        normal = [[0.0] * size for _ in range(size)]
        right = [0.0] * size
        for i, even in enumerate(evens):
            normal[i][i] += _PRIOR_GROUPS / max(even, 1e-9) ** 2
            right[i] += _PRIOR_GROUPS / max(even, 1e-9)
        for (_, counts), v, target in zip(rows, predicted, targets, strict=True):
            leverage = min(sum(c * c / (v * information[i]) for i, c in counts), 1.0)
            kept = 1.0 - leverage
            if kept <= _EPS:
                continue
            weight = 1.0 / (kept * v) ** 2
            for i, c in counts:
                dfs[i] += (kept * c * variances[i] / v) ** 2
                right[i] += weight * kept * c * target
                for j, d in counts:
                    normal[i][j] += weight * kept * kept * c * d
        fitted = _bounded_solve(normal, right, limits)
        # Halfway to the new fit: the weights follow the fit, and a full step can swing
        # between two fits for ever (a wide bucket's spread at 617 tokens, then at 0).
        variances = [(old + new) / 2.0 for old, new in zip(variances, fitted, strict=True)]
    return variances, dfs


def _bounded_solve(
    normal: Sequence[Sequence[float]], right: Sequence[float], limits: Sequence[float]
) -> list[float]:
    """The least-squares fit with these normal equations, each unknown within [0, its limit].

    Where the unbounded fit puts an unknown outside its range, the one furthest out is held at
    that bound and the others are fitted again (an active set; a handful of buckets).
    """
    held: dict[int, float] = {}
    while True:
        free = [i for i in range(len(right)) if i not in held]
        solved = _solve(
            [[normal[i][j] for j in free] for i in free],
            [right[i] - sum(normal[i][j] * x for j, x in held.items()) for i in free],
        )
        values = dict(held) | dict(zip(free, solved, strict=True))
        worst, bound, beyond = -1, 0.0, 0.0
        for i in free:
            x, limit = values[i], limits[i]
            out = max(-x, x - limit) / max(limit, 1e-9)
            if out > beyond:
                worst, bound, beyond = i, (0.0 if x < 0 else limit), out
        if worst < 0:
            return [min(max(values[i], 0.0), limits[i]) for i in range(len(right))]
        held[worst] = bound


def _solve(matrix: Sequence[Sequence[float]], vector: Sequence[float]) -> list[float]:
    """``x`` with ``matrix x = vector``: Gaussian elimination with partial pivoting.

    The matrix is symmetric positive definite here (a least-squares fit with a prior on every
    unknown); a pivot of 0 would mean an unknown nothing informs, and it is left at 0.
    """
    size = len(vector)
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    for k in range(size):
        pivot = max(range(k, size), key=lambda i: abs(rows[i][k]))
        rows[k], rows[pivot] = rows[pivot], rows[k]
        if rows[k][k] == 0.0:
            continue
        for i in range(k + 1, size):
            factor = rows[i][k] / rows[k][k]
            if factor:
                for j in range(k, size + 1):
                    rows[i][j] -= factor * rows[k][j]
    solution = [0.0] * size
    for k in reversed(range(size)):
        if rows[k][k] != 0.0:
            rest = sum(rows[k][j] * solution[j] for j in range(k + 1, size))
            solution[k] = (rows[k][size] - rest) / rows[k][k]
    return solution


def _refit_group(
    total_sum: float,
    counts: Sequence[tuple[int, float]],
    priors: tuple[Sequence[float], Sequence[float]],
    totals: list[float],
    weights: list[float],
) -> None:
    """Add one group's requests, placed given its sum, to the totals of their buckets."""
    means, variances = priors
    spread = gap = 0.0
    for i, c in counts:
        spread += c * variances[i]
        gap += c * means[i]
    gap = (total_sum - gap) / spread if spread > 0 else 0.0
    for i, c in counts:
        totals[i] += c * (means[i] + variances[i] * gap)
        weights[i] += c


def _even(prompt: _Key, output: _Key) -> float:
    """Variance of an even spread over a cell (prompt and output each even, comonotonic)."""
    widths = (k[1] - k[0] if math.isfinite(k[1]) else k[0] for k in (prompt, output))
    return sum(widths) ** 2 / 12.0


@dataclass(frozen=True, slots=True)
class _Pool:
    """Requests placed together: each took one of these (weight, quantile function) pieces."""

    pieces: tuple[tuple[float, _Knots], ...]
    weight: float
    #: The range the pieces span.
    lowest: float
    highest: float

    @classmethod
    def of(cls, pieces: Sequence[tuple[float, _Knots]]) -> _Pool:
        """The pool of these pieces."""
        return cls(
            tuple(pieces),
            sum(w for w, _ in pieces),
            min(knots[0][1] for _, knots in pieces),
            max(knots[-1][1] for _, knots in pieces),
        )


def _pair_shape(
    prompt: _Placed, output: _Placed, together: float, cell: float | None, cap: float | None
) -> _Knots:
    """One request's context from its placed prompt and output.

    Spread as the cell's variance ``cell`` where measured (comonotonic at most), else as far
    together as measured; within both sides' ranges, and ``max_model_len``.
    """
    sd_p, sd_o = math.sqrt(prompt.variance), math.sqrt(output.variance)
    if cell is not None:
        variance = min((sd_p + sd_o) ** 2, cell)
    else:
        variance = sd_p * sd_p + sd_o * sd_o + 2.0 * together * sd_p * sd_o
    highest = prompt.highest + output.highest
    if cap is not None:  # prompt + output never exceed max_model_len
        highest = min(highest, cap)
    lowest = min(prompt.lowest + output.lowest, highest)
    return _two_piece(prompt.center + output.center, variance, lowest, highest)


def _components(groups: Sequence[_Group], cap: float | None) -> list[_Pool]:
    """Every group's requests as weighted quantile functions of their context length, pooled.

    A pool's requests are placed together: each of them took one of its pairs, which one
    unknown (see :func:`_count_sd`).
    """
    prompt_moments, output_moments, cell_moments = _window_moments(groups)
    sides = [
        (g.prompt, g.generation) for g in groups if g.prompt.total > 0 and g.generation.total > 0
    ]
    prompt_priors = _priors([p for p, _ in sides], prompt_moments)
    output_priors = _priors([g for _, g in sides], output_moments)
    cell_variance = {
        (p, g): m.variance(_even(p, g), upper=True) for (p, g), m in cell_moments.items()
    }
    together = _together(groups)
    limit = _pair_limit(groups)
    pools: list[_Pool] = []
    for group in groups:
        p, g = group.prompt, group.generation
        if p.total <= 0 or g.total <= 0:
            continue
        within = (p.total - 1.0) / p.total if group.one_cell else 1.0
        placed = (_place(p, prompt_priors), _place(g, output_priors))
        shapes: dict[tuple[_Key, _Key], _Knots] = {}  # a pair both together and apart
        for pairs in _pairs(*placed, together, limit):
            pieces: list[tuple[float, _Knots]] = []
            for count, prompt, output in pairs:
                key = (prompt.key, output.key)
                if key not in shapes:
                    cell = cell_variance.get(key)
                    measured = None if cell is None else cell * within
                    shapes[key] = _pair_shape(prompt, output, together, measured, cap)
                pieces.append((count, shapes[key]))
            if pieces:
                pools.append(_Pool.of(pieces))
    return pools


class _Mixture:
    """The requests' lengths as one distribution: even pieces and atoms, swept once.

    ``positions`` are the pieces' ends and the atoms, sorted; ``below[i]`` is the mass strictly
    below ``positions[i]``, ``upto[i]`` the mass at or below it, ``density[i]`` the density
    between it and the next.
    """

    __slots__ = ("below", "density", "positions", "total", "upto")

    def __init__(self, components: Sequence[tuple[float, _Knots]]) -> None:
        atoms: defaultdict[float, float] = defaultdict(float)
        changes: defaultdict[float, float] = defaultdict(float)
        for weight, knots in components:
            for (u0, x0), (u1, x1) in itertools.pairwise(knots):
                mass = weight * (u1 - u0)
                width = x1 - x0
                if mass <= 0:
                    continue
                if width <= _EPS * (x0 if x0 > 1.0 else 1.0):
                    atoms[x0] += mass
                else:
                    changes[x0] += mass / width
                    changes[x1] -= mass / width
        self.positions = sorted(atoms.keys() | changes.keys())
        self.below: list[float] = []
        self.upto: list[float] = []
        self.density: list[float] = []
        cumulative = density = 0.0
        previous = self.positions[0] if self.positions else 0.0
        for x in self.positions:
            cumulative += density * (x - previous)
            self.below.append(cumulative)
            cumulative += atoms.get(x, 0.0)
            self.upto.append(cumulative)
            density = max(density + changes.get(x, 0.0), 0.0)
            self.density.append(density)
            previous = x
        self.total = cumulative

    def at_rank(self, rank: float) -> float:
        """The smallest length with at least ``rank`` requests at or below it."""
        i = bisect.bisect_left(self.upto, rank - _EPS)
        if i >= len(self.positions):
            return self.positions[-1]
        if i > 0 and self.below[i] >= rank - _EPS and self.density[i - 1] > 0:
            x = self.positions[i - 1] + (rank - self.upto[i - 1]) / self.density[i - 1]
            return min(max(x, self.positions[i - 1]), self.positions[i])
        return self.positions[i]


def _share_at_or_below(knots: _Knots, x: float) -> float:
    """The share of a quantile function's mass at or below ``x``."""
    if x < knots[0][1]:
        return 0.0
    if x >= knots[-1][1]:
        return 1.0
    for (u0, x0), (u1, x1) in itertools.pairwise(knots):
        if x < x1:
            return u0 if x < x0 else u0 + (u1 - u0) * (x - x0) / (x1 - x0)
    return 1.0


def _count_sd(pools: Sequence[_Pool], x: float) -> float:
    """Standard deviation of the number of requests at or below ``x``, each independent.

    A pool's ``W`` requests each lie at or below ``x`` with the pool's share ``F`` of its
    mass there: ``W F (1 - F)``. So where a group's pairing is unknown (a request's prompt
    may have gone with either of two outputs) the count varies with it as well as with each
    pair's spread.
    """
    variance = 0.0
    for pool in pools:
        if not pool.lowest <= x < pool.highest:
            continue  # all of it on one side of x: the count is certain
        below = sum(w * _share_at_or_below(knots, x) for w, knots in pool.pieces)
        share = below / pool.weight
        variance += pool.weight * share * (1.0 - share)
    return math.sqrt(variance)


def _one_pair(groups: Sequence[_Group]) -> bool:
    """Whether every request lies in one bucket pair (one bucket of prompts, one of outputs)."""
    cells: set[tuple[_Key | None, _Key | None]] = set()
    for group in groups:
        if group.prompt.total <= 0 or group.generation.total <= 0:
            continue
        if not group.one_cell:
            return False
        cells.add((group.prompt.pure, group.generation.pure))
    return len(cells) <= 1


def _quantiles(
    pools: Sequence[_Pool], quantiles: Sequence[float], *, spread: bool
) -> dict[float, float]:
    """The mixture's quantiles, raised by the uncertainty of the requests' placement.

    The ``q`` quantile of ``N`` requests is the ``r``-th smallest, ``r = ceil(q N)``. Where
    requests are known only as distributions, the number at or below a length ``x`` is random
    (mean ``F(x)``, standard deviation ``s(x)``); the estimate is the smallest ``x`` with
    ``F(x) >= r - 1/2 + z x s(x)``: about the median of the r-th smallest (``r - 1/2``),
    raised for the uncertainty, ``z`` being ``_RANK_Z``, or for requests ``spread`` over
    several bucket pairs ``_RANK_Z_SPREAD`` (at most ``_SPREAD_RISE_LIMIT`` times the first).
    Exact where every request is known exactly.
    """
    mixture = _Mixture([piece for pool in pools for piece in pool.pieces])
    total = mixture.total
    found: dict[float, float] = {}
    if total <= 0:
        return found
    for q in quantiles:
        rank = max(math.ceil(q * total - _EPS), 1) - 0.5
        found[q] = _raised(mixture, pools, rank, _RANK_Z)
        if spread:
            wider = _raised(mixture, pools, rank, _RANK_Z_SPREAD)
            found[q] = min(wider, found[q] * _SPREAD_RISE_LIMIT)
    return found


def _raised(mixture: _Mixture, pools: Sequence[_Pool], rank: float, z: float) -> float:
    """The smallest length with ``rank + z x s`` requests at or below it (``s``: see above)."""
    total = mixture.total
    low = mixture.at_rank(rank)
    high = mixture.at_rank(min(rank + z * _count_sd(pools, low), total))
    if high > low:  # s(x) is smaller further out: take it halfway, at both ends
        near = [p for p in pools if p.lowest < high and p.highest > low]
        spread = (_count_sd(near, low) + _count_sd(near, high)) / 2.0
        high = mixture.at_rank(min(rank + z * spread, total))
    return high


def estimate_context_quantiles(
    intervals: Sequence[IntervalCounts],
    quantiles: Sequence[float],
    *,
    max_model_len: int | None = None,
) -> ContextQuantiles | None:
    """Quantiles and exact mean of the context length of the requests finished in ``intervals``.

    ``intervals`` are consecutive poll intervals, each with both histograms' bucket deltas over
    it (see the module docstring for the method, its bias and when it is exact). ``quantiles``
    are within ``[0, 1]``. Values are capped at ``max_model_len`` when known. ``None`` when no
    request finished (either histogram counted nothing), or more than any vLLM finishes
    (2**53). Figures are finite whatever finite sums and bounds and whole counts come in (the
    parser refuses a fraction of an observation): sums are taken within what their buckets
    allow, bounds and lengths at most ``_LONGEST``.
    """
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            msg = f"quantile must be within [0, 1], got {q}"
            raise ValueError(msg)
    cap = float(max_model_len) if max_model_len else None
    prompt_count = math.fsum(i.prompt.total for i in intervals)
    output_count = math.fsum(i.generation.total for i in intervals)
    if prompt_count <= 0 or output_count <= 0:
        return None
    if max(prompt_count, output_count) > MAX_EXACT_WHOLE:
        # No vLLM finishes that many (a float cannot count by ones past it), and past it squares
        # of sums could overflow into NaN.
        return None
    groups = _groups(intervals, cap)
    mean = (  # the sums as the groups hold them: within what the buckets allow
        math.fsum(g.prompt.sum for g in groups) / prompt_count
        + math.fsum(g.generation.sum for g in groups) / output_count
    )
    pools = _components(groups, cap)
    spread = not _one_pair(groups)
    found = _quantiles(pools, quantiles, spread=spread) if pools else {}
    limit = cap if cap is not None else math.inf
    return ContextQuantiles(
        quantiles={q: min(found.get(q, mean), limit) for q in quantiles},
        mean=min(mean, limit),
        requests=prompt_count,
    )
