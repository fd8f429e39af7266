"""Specification of the context-length estimate from both histograms' per-interval deltas."""

from __future__ import annotations

import bisect
import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core import context
from exporter.core.context import IntervalCounts, estimate_context_quantiles
from exporter.core.windows import BucketCounts, bucket_quantile, merge_buckets
from exporter.sim.families import build_1_2_5_buckets
from tests import paths

QUANTILES = (0.5, 0.95, 0.99)


def bounds(max_model_len: int) -> tuple[float, ...]:
    """vLLM's token buckets for ``max_model_len``: 1-2-5 bounds, then +Inf."""
    return (*build_1_2_5_buckets(max_model_len), math.inf)


def bucketed(values: list[int], edges: tuple[float, ...]) -> BucketCounts:
    """Bucket deltas of these observations, as the sidecar computes them between two polls."""
    counts = [0.0] * len(edges)
    for value in values:
        counts[bisect.bisect_left(edges, value)] += 1.0  # Prometheus buckets are "<= le"
    return BucketCounts(edges, tuple(counts), float(sum(values)))


def intervals(
    groups: list[list[tuple[int, int]]], *, max_model_len: int = 32768
) -> list[IntervalCounts]:
    """One interval per group of (prompt, output) requests, bucketed as vLLM does."""
    edges = bounds(max_model_len)
    return [
        IntervalCounts(bucketed([p for p, _ in g], edges), bucketed([o for _, o in g], edges))
        for g in groups
    ]


def true_quantile(values: list[int], q: float) -> float:
    """The smallest value with at least a share ``q`` of the values at or below it."""
    ordered = sorted(values)
    return float(ordered[max(math.ceil(q * len(ordered) - 1e-9), 1) - 1])


def sum_of_quantiles(deltas: list[IntervalCounts], q: float) -> float:
    """The previous method: PromQL's histogram_quantile of each histogram, added."""
    prompt = merge_buckets(d.prompt for d in deltas)
    output = merge_buckets(d.generation for d in deltas)
    assert prompt is not None
    assert output is not None
    p, g = bucket_quantile(q, prompt), bucket_quantile(q, output)
    assert p is not None
    assert g is not None
    return p + g


requests = st.tuples(st.integers(1, 40000), st.integers(0, 8000))


@given(st.lists(st.one_of(st.just(None), requests), min_size=1, max_size=60))
def test_intervals_of_one_request_give_every_context_exactly(
    polls: list[tuple[int, int] | None],
) -> None:
    """With at most one request per interval, every quantile is an exact request's context."""
    groups = [[] if r is None else [r] for r in polls]
    result = estimate_context_quantiles(intervals(groups), (0.0, *QUANTILES, 1.0))
    contexts = [p + o for p, o in (r for r in polls if r is not None)]
    if not contexts:
        assert result is None
        return
    assert result is not None
    for q, value in result.quantiles.items():
        assert value == true_quantile(contexts, q)
    assert result.mean == pytest.approx(sum(contexts) / len(contexts))
    assert result.requests == len(contexts)


@given(
    st.tuples(st.integers(1, 20000), st.integers(1, 8000)),
    st.lists(st.integers(0, 30), min_size=2, max_size=40).filter(
        lambda sizes: sum(1 for n in sizes if n) >= 2
    ),
)
def test_a_constant_shape_is_exact_whatever_the_requests_per_interval(
    request: tuple[int, int], sizes: list[int]
) -> None:
    """Identical requests seen in two intervals or more read exactly, however many per interval."""
    result = estimate_context_quantiles(intervals([[request] * n for n in sizes]), QUANTILES)
    assert result is not None
    assert set(result.quantiles.values()) == {float(sum(request))}
    assert result.mean == pytest.approx(sum(request))


@pytest.mark.parametrize("sizes", [[8, 8, 8], [12, 12], [1] * 24, [5, 0, 9, 0, 10]])
def test_the_benchmark_clients_128_plus_256_tokens_read_384(sizes: list[int]) -> None:
    """The issue's run (24 requests of 128 + 256 tokens) reads 384 at every quantile, not 512."""
    deltas = intervals([[(128, 256)] * n for n in sizes], max_model_len=512)
    result = estimate_context_quantiles(deltas, QUANTILES, max_model_len=512)
    assert result is not None
    assert result.quantiles == dict.fromkeys(QUANTILES, 384.0)
    assert result.mean == 384.0
    assert sum_of_quantiles(deltas, 0.95) == pytest.approx(680.0)  # what the sum of quantiles read


def test_the_128_plus_256_run_in_one_interval_stays_within_its_bucket_pair() -> None:
    """All 24 in one poll leave the spread unknown: the mean is exact, p95 within the pair."""
    deltas = intervals([[(128, 256)] * 24], max_model_len=8192)
    result = estimate_context_quantiles(deltas, QUANTILES, max_model_len=8192)
    assert result is not None
    assert result.mean == 384.0
    assert 384.0 <= result.quantiles[0.95] <= 700.0  # prompt (100, 200], output (200, 500]
    assert result.quantiles[0.95] < sum_of_quantiles(deltas, 0.95)


def test_nothing_finished_gives_no_estimate() -> None:
    """No interval, or intervals where no request finished, give None rather than zeros."""
    edges = bounds(512)
    empty = BucketCounts(edges, (0.0,) * len(edges), 0.0)
    assert estimate_context_quantiles([], QUANTILES) is None
    assert estimate_context_quantiles([IntervalCounts(empty, empty)] * 3, QUANTILES) is None


def test_max_model_len_caps_the_quantiles_and_the_mean() -> None:
    """No request is longer than max_model_len, whatever the buckets and sums say."""
    deltas = intervals([[(400, 300)], [(450, 200), (300, 150)]], max_model_len=512)
    result = estimate_context_quantiles(deltas, QUANTILES, max_model_len=512)
    assert result is not None
    assert max(result.quantiles.values()) == 512.0
    assert result.mean == 512.0


def test_a_poll_between_a_requests_two_observations_still_pairs_them() -> None:
    """A prompt counted one interval and its output the next are merged into one exact request."""
    edges = bounds(8192)
    nothing = bucketed([], edges)
    deltas = [
        IntervalCounts(bucketed([3000], edges), nothing),
        IntervalCounts(nothing, bucketed([40], edges)),
        IntervalCounts(bucketed([100], edges), bucketed([900], edges)),
    ]
    result = estimate_context_quantiles(deltas, (0.0, 1.0))
    assert result is not None
    assert result.quantiles == {0.0: 1000.0, 1.0: 3040.0}


def test_quantiles_outside_zero_to_one_are_refused() -> None:
    """A quantile of 1.5 is a caller's mistake, not a figure."""
    with pytest.raises(ValueError, match="within"):
        estimate_context_quantiles(intervals([[(10, 10)]]), (1.5,))


def random_traffic(
    shape: tuple[float, float, float, float, float], rate: float, seed: int
) -> tuple[list[IntervalCounts], list[int]]:
    """120 polls of Poisson(rate) requests, log-normal lengths with correlation ``rho``."""
    prompt_median, prompt_sigma, output_median, output_sigma, rho = shape
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    groups: list[list[tuple[int, int]]] = []
    for _ in range(120):
        n, product, limit = 0, rng.random(), math.exp(-rate)
        while product > limit:
            n, product = n + 1, product * rng.random()
        group: list[tuple[int, int]] = []
        while len(group) < n:
            a = rng.gauss(0.0, 1.0)
            b = rho * a + math.sqrt(1.0 - rho * rho) * rng.gauss(0.0, 1.0)
            p = max(1, round(prompt_median * math.exp(prompt_sigma * a)))
            o = max(1, round(output_median * math.exp(output_sigma * b)))
            if p + o <= 32768:  # vLLM refuses longer
                group.append((p, o))
        groups.append(group)
    return intervals(groups), [p + o for g in groups for p, o in g]


@settings(max_examples=40, derandomize=True)
@given(
    st.tuples(
        st.floats(20.0, 3000.0),
        st.floats(0.0, 0.6),
        st.floats(10.0, 1500.0),
        st.floats(0.0, 0.6),
        st.floats(-0.9, 0.9),
    ),
    st.floats(1.0, 10.0),
    st.integers(0, 2**32 - 1),
)
def test_p95_is_never_more_than_5_percent_below_the_truth_on_random_traffic(
    shape: tuple[float, float, float, float, float], rate: float, seed: int
) -> None:
    """On random (not adversarial) traffic, bucketed by vLLM's rule, p95 is at most 5 % low."""
    deltas, contexts = random_traffic(shape, rate, seed)
    result = estimate_context_quantiles(deltas, QUANTILES, max_model_len=32768)
    assert result is not None
    assert result.quantiles[0.95] >= 0.95 * true_quantile(contexts, 0.95)
    assert result.mean == pytest.approx(sum(contexts) / len(contexts))


def p95_and_truth(deltas: list[IntervalCounts], contexts: list[int]) -> tuple[float, float]:
    """The estimated p95 of these deltas (max_model_len 32,768) and the true p95 of contexts."""
    result = estimate_context_quantiles(deltas, QUANTILES, max_model_len=32768)
    assert result is not None
    return result.quantiles[0.95], true_quantile(contexts, 0.95)


def p95_of_benchmark_window(name: str) -> tuple[float, float]:
    """The estimated and the true p95 of a window kept from the benchmark (max_model_len 8192)."""
    document = json.loads((paths.CONTEXT / name).read_text())
    groups = [[(p, o) for p, o in group] for group in document["intervals"]]
    result = estimate_context_quantiles(
        intervals(groups, max_model_len=8192), QUANTILES, max_model_len=8192
    )
    assert result is not None
    return result.quantiles[0.95], true_quantile([p + o for g in groups for p, o in g], 0.95)


def test_a_window_spread_over_bucket_pairs_leans_high_where_polls_cannot_be_split() -> None:
    """The benchmark's lowest window: p95 no more than 5 % low where the data cannot say more.

    163 requests over an hour at 0.2 a poll, outputs log-normal over three buckets. The p95 is
    the 9th longest request (3,331 tokens); 5 of the 9 longest finished in a poll with one
    other request whose output lay in the bucket below theirs. The data cannot split such a
    poll's exact sum: three of the five were placed 340 to 530 tokens short (their partners
    lay near the low end of their bucket). Where requests spread over several bucket pairs,
    the quantiles rise by two standard deviations of the placement's uncertainty, not one:
    with one, this window read 8.4 % low.
    """
    estimate, truth = p95_of_benchmark_window("spread-window-seed-18.json")
    assert truth == 3331
    assert estimate >= 0.95 * truth


def test_buckets_that_share_polls_get_their_spreads_fitted_together() -> None:
    """10 requests a poll, outputs over five buckets: no bucket's spread fitted away to nothing.

    1,163 requests in 120 polls; the p95 (2,974 tokens) lies in the 2,001-5,000 output bucket,
    which shares every poll with others. Fitting each bucket's spread with the others held
    swung from fit to fit and ended with that bucket's at 0, so its requests sat at their
    placed means and the p95 read 9.3 % low; fitted together, halfway each time, they settle.
    """
    estimate, truth = p95_of_benchmark_window("spread-window-seed-24.json")
    assert truth == 2974
    assert 0.95 * truth <= estimate <= 1.20 * truth


def test_a_poll_whose_prompt_and_output_went_apart_is_not_read_longest_with_longest() -> None:
    """Where the polls show prompt and output independent, a poll is paired as such.

    147 requests over an hour at 0.2 a poll, prompt and output drawn independently over
    several buckets. The p95 is the 8th longest request (2,086 tokens); one poll of three held
    2,364 + 343, 585 + 226 and 305 + 1,781 tokens: its longest prompt went with a short output,
    its longest output with a short prompt. Paired longest with longest, that poll has one
    request above 2,000 tokens, not two, and the p95 read 8.9 % low. Nearby polls' mean prompt
    and mean output rise and fall together no more often than chance has them, so the poll's
    buckets pair mostly independently.
    """
    estimate, truth = p95_of_benchmark_window("spread-window-seed-41.json")
    assert truth == 2086
    assert estimate >= 0.95 * truth


def test_the_rise_covers_not_knowing_which_prompt_went_with_which_output() -> None:
    """A poll of two whose pairing decides the p95: the rise counts the pairing's uncertainty.

    139 requests over an hour at 0.2 a poll, prompt and output independent over several
    buckets; the p95 is the 7th longest (3,352 tokens). One poll held 3,364 + 489 and
    1,371 + 1,981 tokens: both at or above the p95. Paired longest with longest they read as
    one of 5,345 and one of 1,860, and the p95 read 14.1 % low. Paired independently it read
    the same while the rise counted only each pair's own spread: each of the two requests took
    one of the four pairs, which one unknown, and the count above a length varies with that
    choice too. Counted, the quantile rises with it.
    """
    estimate, truth = p95_of_benchmark_window("pairing-window-seed-18.json")
    assert truth == 3352
    assert estimate >= 0.95 * truth


def test_prompt_and_output_that_go_together_are_paired_longest_with_longest() -> None:
    """Each output 0.4 times its prompt, over several buckets, 10 a poll: p95 not low.

    Within a poll, which prompt went with which output is lost; across polls, a poll's
    prompt sum and output sum rise and fall together, and that says the longest prompts came
    with the longest outputs. Paired independently instead, this window's p95 reads 6.3 % low.
    """
    estimate, truth = p95_and_truth(*random_traffic((500.0, 1.0, 200.0, 1.0, 1.0), 10.0, seed=1))
    assert 0.95 * truth <= estimate <= 1.10 * truth


def test_traffic_that_changes_within_the_window_is_paired_as_each_request_was() -> None:
    """Five minutes of one kind of traffic, then five of another: each request's pair is kept.

    60 polls of 10 requests whose prompt and output (both log-normal around 600 tokens) are
    equal, then 60 polls of short prompts (around 50) with long outputs (around 1,200, rising
    with the prompt). Across the window, longer prompts came with shorter outputs; within each
    request, the longer prompt with the longer output. Measured about the window's means, the
    correlation is negative, the first polls were paired independently, and the p95 read
    6.1 % low; nearby polls still rise and fall together.
    """
    rng = random.Random(1)  # noqa: S311 - test data, not secrets
    groups: list[list[tuple[int, int]]] = []
    for poll in range(120):
        group: list[tuple[int, int]] = []
        n, product, limit = 0, rng.random(), math.exp(-10.0)
        while product > limit:
            n, product = n + 1, product * rng.random()
        for _ in range(n):
            z = rng.gauss(0.0, 1.0)
            if poll < 60:
                group.append((round(600 * math.exp(z)), round(600 * math.exp(z))))
            else:
                group.append((round(50 * math.exp(z / 2)), round(1200 * math.exp(z / 2))))
        groups.append(group)
    estimate, truth = p95_and_truth(intervals(groups), [p + o for g in groups for p, o in g])
    assert 0.95 * truth <= estimate <= 1.10 * truth


def test_independent_prompt_and_output_are_not_paired_longest_with_longest() -> None:
    """Prompt and output drawn independently over several buckets, 10 a poll: p95 within 15 %.

    Pairing every poll longest with longest, as the sum of quantiles does across the whole
    window, reads this p95 19 % high; nearby polls' sums rise and fall together no more than
    chance has them, and each poll's buckets pair (mostly) independently. What is left above
    the truth is the rise for not knowing which prompt went with which output.
    """
    estimate, truth = p95_and_truth(*random_traffic((500.0, 1.0, 200.0, 0.8, 0.0), 10.0, seed=0))
    assert 0.95 * truth <= estimate <= 1.15 * truth


def test_lengths_within_one_bucket_pair_read_p95_within_10_percent() -> None:
    """Prompts of 2,000-5,000 and outputs of 200-500 tokens, 10 a poll: p95 within 10 %."""
    rng = random.Random(7)  # noqa: S311 - test data, not secrets

    def within(median: float, low: int, high: int) -> int:
        while not low < (value := round(rng.lognormvariate(math.log(median), 0.25))) <= high:
            pass
        return value

    groups = [
        [(within(3000, 2000, 5000), within(300, 200, 500)) for _ in range(10)] for _ in range(120)
    ]
    result = estimate_context_quantiles(intervals(groups), QUANTILES, max_model_len=32768)
    truth = true_quantile([p + o for g in groups for p, o in g], 0.95)
    assert result is not None
    assert abs(result.quantiles[0.95] / truth - 1.0) <= 0.10
    assert sum_of_quantiles(intervals(groups), 0.95) / truth - 1.0 > 0.10  # the old method


@pytest.mark.parametrize("requests_per_poll", [2, 10])
def test_lengths_skew_right_where_no_bound_is_near(requests_per_poll: int) -> None:
    """Request lengths skew right: the p95 lies further above the mean than the p5 below it.

    Groups in one bucket pair, their exact means spread about 300 tokens a request around
    16,500, far from the pair's bounds (10,001-20,000 + 1,001-2,000): the shape is assumed,
    and it is the one real traffic has (log-normal-like), not a symmetric one.
    """
    step = round(300 / math.sqrt(requests_per_poll))  # a group's mean spreads sqrt(n) times less
    groups = [[(15000 + (step if i % 2 else -step), 1500)] * requests_per_poll for i in range(120)]
    result = estimate_context_quantiles(intervals(groups), (0.05, 0.95), max_model_len=32768)
    assert result is not None
    above = result.quantiles[0.95] - result.mean
    below = result.mean - result.quantiles[0.05]
    assert above / below == pytest.approx(1.2, abs=0.1)


def fine_buckets(count: int, width: int) -> tuple[float, ...]:
    """``count`` buckets ``width`` tokens wide, the last open: no vLLM's, a target's that is not."""
    return (*(float(width * (i + 1)) for i in range(count - 1)), math.inf)


class ShapesBuilt:
    """Counts the request shapes the estimator builds (its time and memory), up to a limit."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: float) -> None:
        self.count, self.limit = 0, limit
        original = context._two_piece

        def counted(*args: float) -> tuple[tuple[float, float], ...]:
            self.count += 1
            if self.count > self.limit:  # fail now, not after minutes
                pytest.fail(f"more than {self.limit:g} request shapes")
            return original(*args)

        monkeypatch.setattr(context, "_two_piece", counted)


def test_histograms_of_hundreds_of_buckets_cost_what_vllms_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A target with 256 buckets a histogram, every one busy, is bounded, and read as well.

    vLLM's histograms have at most 23 buckets. Pairing each prompt bucket with each output
    bucket in every poll, 256-bucket histograms built some 65,000 shapes a poll, 40 polls of
    300 requests millions of them (minutes and gigabytes on every poll of the sidecar). Over
    24 occupied buckets, runs of neighbours are merged; past about 8,192 independent pairs a
    window, each poll merges its neighbouring buckets down to its share. The estimate stays
    within 1 % of that of 24 buckets of the same requests, all of them paired.
    """
    rng = random.Random(256)  # noqa: S311 - test data, not secrets
    groups = [[(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(300)] for _ in range(40)]

    def deltas(edges: tuple[float, ...]) -> list[IntervalCounts]:
        return [
            IntervalCounts(bucketed([p for p, _ in g], edges), bucketed([o for _, o in g], edges))
            for g in groups
        ]

    # 8,192 independent pairs, and each poll's longest-with-longest ones: under 48 a poll.
    built = ShapesBuilt(monkeypatch, limit=8192 + 40 * 48)
    fine = estimate_context_quantiles(deltas(fine_buckets(256, 20)), QUANTILES)
    built.count, built.limit = 0, math.inf
    monkeypatch.setattr(context, "_PAIR_BUDGET", 10**9)
    coarse = estimate_context_quantiles(deltas(fine_buckets(24, 218)), QUANTILES)
    # Unbounded: every prompt bucket with every output one (23 hold requests, the open one none).
    assert built.count >= 40 * 23 * 23
    assert fine is not None
    assert coarse is not None
    for q in QUANTILES:
        assert fine.quantiles[q] == pytest.approx(coarse.quantiles[q], rel=0.01)
    truth = true_quantile([p + o for g in groups for p, o in g], 0.95)
    assert fine.quantiles[0.95] >= 0.95 * truth


def test_a_busy_window_of_vllms_buckets_is_not_merged(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 requests a poll over vLLM's buckets stay within the bound: estimated as without it.

    The bound is for histograms that are not vLLM's; its own, at the busiest traffic the
    benchmark draws (some 4,300 independent pairs a window), are never merged.
    """
    deltas, _ = random_traffic((500.0, 1.0, 200.0, 0.8, 0.0), 40.0, 7)
    bounded = estimate_context_quantiles(deltas, QUANTILES, max_model_len=32768)
    monkeypatch.setattr(context, "_PAIR_BUDGET", 10**9)
    monkeypatch.setattr(context, "_MAX_BUCKETS", 10**9)
    assert estimate_context_quantiles(deltas, QUANTILES, max_model_len=32768) == bounded


def test_no_figure_is_within_the_goal_for_two_windows_the_histograms_cannot_tell_apart() -> None:
    """Within 10 % for one bucket pair and never more than 5 % low cannot hold in every window.

    130 requests in one bucket pair (prompts 2,001-5,000 tokens, outputs 201-500), each alone
    in its poll but four that finished in one. In one window those four are three of 5,400
    tokens and one of 2,300; in the other, four of 4,625 (the same sums, the same buckets).
    The p95 is the 7th longest: 3,000 in the first, 4,625 in the second. A figure within 10 %
    of the first (at most 3,300) is 29 % below the second. So issue 16's goal can be met only
    as a rate (``benchmarks/README.md`` counts the windows outside it); the estimate leans
    towards the longer reading.
    """
    alone = [[(4900, 400)]] * 3 + [[(2700, 300)]] * 123
    uneven = [*alone[:60], [(4950, 450), (4950, 450), (4950, 450), (2050, 250)], *alone[60:]]
    even = [*alone[:60], [(4225, 400)] * 4, *alone[60:]]
    assert intervals(uneven) == intervals(even)
    truths = [true_quantile([p + o for g in w for p, o in g], 0.95) for w in (uneven, even)]
    assert truths == [3000, 4625]
    assert 1.10 * truths[0] < 0.95 * truths[1]
    estimate, _ = p95_and_truth(intervals(even), [p + o for g in even for p, o in g])
    assert truths[0] < estimate < truths[1] * 1.10
    assert estimate > 0.9 * truths[1]


_HOSTILE_BOUNDS = (100.0, 200.0, 500.0, math.inf)


def _counts(
    counts: tuple[float, ...], total: float, bounds: tuple[float, ...] = _HOSTILE_BOUNDS
) -> BucketCounts:
    return BucketCounts(bounds, counts, total)


@pytest.mark.parametrize(
    "intervals",
    [
        pytest.param(
            [IntervalCounts(_counts((0, 12, 0, 0), 1e200), _counts((0, 0, 12, 0), 4560))],
            id="sum-1e200-in-a-closed-bucket",
        ),
        pytest.param(
            [IntervalCounts(_counts((0, 0, 0, 3), 1e200), _counts((0, 0, 3, 0), 900))],
            id="sum-1e200-in-the-open-bucket",
        ),
        pytest.param(
            [
                IntervalCounts(
                    _counts((0, 3, 0, 0), 3e300, (1.0, 1e300, 1e301, math.inf)),
                    _counts((0, 0, 3, 0), 900),
                )
            ],
            id="bounds-1e300",
        ),
        pytest.param(
            [IntervalCounts(_counts((0, 1e300, 0, 0), 1.5e302), _counts((0, 0, 1e300, 0), 3e302))],
            id="counts-1e300",
        ),
        pytest.param(
            [
                IntervalCounts(_counts((0, k, 0, 1), 1e200), _counts((1, 0, k, 0), 300.0 * k))
                for k in range(1, 30)
            ],
            id="many-groups-sums-1e200",
        ),
        pytest.param(  # whole counts, a subnormal sum: the two-piece shape divided by 0
            [IntervalCounts(_counts((20, 0, 0, 0), 1e-320), _counts((6, 4, 3, 0), 0.0))],
            id="sum-1e-320",
        ),
    ],
)
@pytest.mark.parametrize("max_model_len", [None, 512])
def test_finite_inputs_never_make_a_figure_nan_or_infinite(
    intervals: list[IntervalCounts], max_model_len: int | None
) -> None:
    """Whatever finite counts, bounds and sums come in: finite figures, or None; no exception."""
    found = estimate_context_quantiles(intervals, (0.5, 0.95, 0.99), max_model_len=max_model_len)
    if found is not None:
        assert all(math.isfinite(x) for x in (*found.quantiles.values(), found.mean))
        if max_model_len is not None:
            assert max(*found.quantiles.values(), found.mean) <= max_model_len


# Whole counts only: the parser refuses a fraction of an observation (tests/vllm/test_metrics.py).
_any_count = st.one_of(
    st.integers(0, 50),
    st.integers(0, 2**53).map(float),
    st.sampled_from([0.0, 1.0, 2.0**52, 2.0**53, 1e15, 1e300]),
)
_any_histogram = st.builds(
    lambda counts, total: _counts(tuple(counts), total),
    st.lists(_any_count, min_size=4, max_size=4),
    st.one_of(st.floats(0.0, 1e300, allow_subnormal=True), st.integers(0, 10**6)),
)


@given(
    st.lists(st.builds(IntervalCounts, _any_histogram, _any_histogram), min_size=1, max_size=6),
    st.sampled_from([None, 512]),
)
@settings(max_examples=300, deadline=None)
def test_any_finite_counts_and_sums_give_finite_figures_or_none(
    intervals: list[IntervalCounts], max_model_len: int | None
) -> None:
    """Whole counts of any size, sums subnormal to 1e300: finite figures or None, no error."""
    found = estimate_context_quantiles(intervals, (0.5, 0.95, 0.99), max_model_len=max_model_len)
    if found is not None:
        assert all(math.isfinite(x) for x in (*found.quantiles.values(), found.mean))


@pytest.mark.parametrize(
    ("total", "mean"),
    [
        pytest.param(1e6, 200.0 + 380.0, id="above: each prompt at most 200"),
        pytest.param(5.0, 101.0 + 380.0, id="below: each prompt at least 101"),
    ],
)
def test_a_sum_its_buckets_contradict_is_taken_within_them(total: float, mean: float) -> None:
    """12 prompts in (100, 200] said to sum to 1e6 or 5: taken within what the buckets allow.

    The mean is the nearest the buckets allow (83,713 before), every figure within them.
    """
    found = estimate_context_quantiles(
        [IntervalCounts(_counts((0, 12, 0, 0), total), _counts((0, 0, 12, 0), 12 * 380.0))],
        (0.5, 0.95),
    )
    assert found is not None
    assert found.mean == pytest.approx(mean)
    assert all(101.0 + 201.0 <= x <= 200.0 + 500.0 for x in found.quantiles.values())
