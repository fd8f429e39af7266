"""Specification of the traffic shape: histograms, recorded lengths and explicit lengths."""

from __future__ import annotations

import bisect
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.snapshot import EngineMetrics, Histogram, VllmSnapshot
from exporter.core.windows import BucketCounts
from exporter.errors import UsageError
from exporter.sim.families import build_1_2_5_buckets
from exporter.sweep.shape import (
    MAX_CONTEXT_TOKENS,
    RequestShape,
    TrafficShape,
    check_fits,
    fixed_shape,
    lengths_from_buckets,
    nearest_rank,
    parse_lengths,
    shape_from_histograms,
    snapshot_buckets,
)


def bucketed(values: list[int], max_model_len: int) -> BucketCounts:
    """What vLLM's per-request histogram holds after observing ``values``."""
    bounds = (*build_1_2_5_buckets(max_model_len), math.inf)
    counts = [0.0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    return BucketCounts(bounds, tuple(counts), float(sum(values)))


def bucket_width(buckets: BucketCounts, value: float, cap: int) -> float:
    """Width of the bucket that holds ``value`` (the +Inf bucket ends at ``cap``)."""
    j = bisect.bisect_left(buckets.bounds, value)
    lower = buckets.bounds[j - 1] if j else 0.0
    upper = buckets.bounds[j] if not math.isinf(buckets.bounds[j]) else float(cap)
    return upper - lower


def _clip(value: float, cap: int) -> int:
    return round(min(float(cap), max(1.0, value)))


@st.composite
def traffic(draw: st.DrawFn) -> tuple[list[int], int]:
    """Request lengths of several shapes (log-normal, uniform, bimodal, constant, exponential)."""
    cap = draw(st.sampled_from([512, 2048, 8192, 32768]))
    kind = draw(st.sampled_from(["lognormal", "uniform", "bimodal", "constant", "exponential"]))
    n = draw(st.integers(min_value=1, max_value=500))
    rng = draw(st.randoms(use_true_random=False))
    median = draw(st.floats(min_value=2, max_value=cap / 2))
    sigma = draw(st.floats(min_value=0.05, max_value=1.5))

    def one() -> float:
        if kind == "lognormal":
            return rng.lognormvariate(math.log(median), sigma)
        if kind == "uniform":
            return rng.uniform(1, cap)
        if kind == "bimodal":
            return rng.choice([rng.gauss(median / 10, 3), rng.gauss(median, median / 10)])
        if kind == "constant":
            return median
        return rng.expovariate(1 / median)

    return [_clip(one(), cap) for _ in range(n)], cap


def observed_span(buckets: BucketCounts, cap: int) -> float:
    """From the lower bound of the lowest bucket with observations to the upper of the highest."""
    seen = [j for j, count in enumerate(buckets.counts) if count > 0]
    lower = buckets.bounds[seen[0] - 1] if seen[0] else 0.0
    top = buckets.bounds[seen[-1]]
    return (float(cap) if math.isinf(top) else top) - lower


def bucket_index(buckets: BucketCounts, value: float) -> int:
    """Index of the bucket that holds ``value``."""
    return bisect.bisect_left(buckets.bounds, value)


@settings(max_examples=60)
@given(traffic())
def test_lengths_from_a_histogram_keep_its_mean_and_p95_within_the_bucket_resolution(
    case: tuple[list[int], int],
) -> None:
    """The reconstruction keeps the mean, and the p95 within the bucket resolution.

    The mean is the histogram's exact mean to a hundredth of a token, unless rounding each
    bucket's share to whole samples puts it out of reach: then within half the observed span
    over the sample count. The p95 of the samples lies in the bucket that holds the source's p95,
    or (a bucket boundary within half a sample of it) in the one holding its 94.75th percentile.
    """
    values, cap = case
    buckets = bucketed(values, cap)
    samples = 200
    lengths = lengths_from_buckets(buckets, samples, cap=cap)
    true_mean = sum(values) / len(values)
    tolerance = max(0.01, observed_span(buckets, cap) / (2 * samples))
    assert abs(sum(lengths) / samples - true_mean) <= tolerance
    ordered = sorted(values)
    p95 = nearest_rank(list(lengths), 0.95)
    low = bucket_index(buckets, nearest_rank(ordered, 0.95 - 1 / (2 * samples)))
    high = bucket_index(buckets, nearest_rank(ordered, 0.95))
    assert low <= bucket_index(buckets, p95) <= high
    assert all(1 <= n <= cap for n in lengths)


def test_realistic_traffic_keeps_the_exact_mean_and_the_p95_bucket() -> None:
    """Log-normal chat traffic (median 300, long tail) through vLLM's 1-2-5 buckets.

    Every bucket's share rounds to whole samples closely enough that the mean is exact to a
    hundredth of a token, and the p95 lands in the source's p95 bucket, within its width.
    """
    rng = random.Random(7)  # noqa: S311 - reproducible test data
    values = [_clip(rng.lognormvariate(math.log(300), 0.8), 8192) for _ in range(5000)]
    buckets = bucketed(values, 8192)
    lengths = lengths_from_buckets(buckets, 200, cap=8192)
    assert sum(lengths) / 200 == pytest.approx(sum(values) / 5000, abs=0.01)
    true_p95 = nearest_rank(sorted(values), 0.95)
    p95 = nearest_rank(list(lengths), 0.95)
    assert bucket_index(buckets, p95) == bucket_index(buckets, true_p95)
    assert abs(p95 - true_p95) <= bucket_width(buckets, true_p95, 8192)


@settings(max_examples=60)
@given(traffic())
def test_every_length_stays_in_a_bucket_the_source_observed(case: tuple[list[int], int]) -> None:
    """No sample lands in a bucket the histogram has no observation in."""
    values, cap = case
    buckets = bucketed(values, cap)
    for length in lengths_from_buckets(buckets, 200, cap=cap):
        assert buckets.counts[bisect.bisect_left(buckets.bounds, length)] > 0


def test_without_a_sum_the_lengths_spread_evenly_in_each_bucket() -> None:
    """A histogram whose mean is unknown (no sum) is read as PromQL reads it: evenly spread."""
    buckets = BucketCounts((10.0, 20.0, math.inf), (0.0, 4.0, 0.0), 0.0)
    lengths = lengths_from_buckets(buckets, 4, cap=None)
    assert all(11 <= n <= 20 for n in lengths)


def test_observations_above_the_last_bound_spread_up_to_max_model_len() -> None:
    """vLLM's +Inf bucket (lengths between the last 1-2-5 bound and max_model_len) is not lost."""
    buckets = bucketed([505, 510, 512], 512)
    lengths = lengths_from_buckets(buckets, 3, cap=512)
    assert all(500 < n <= 512 for n in lengths)
    assert sum(lengths) / 3 == pytest.approx(509, abs=0.5)


def test_histogram_shape_pairs_prompts_and_outputs_and_keeps_both_means() -> None:
    """Prompt and output marginals both survive the pairing; the context mean is their sum."""
    prompts = bucketed([100] * 50 + [900] * 50, 4096)
    outputs = bucketed([20] * 80 + [400] * 20, 4096)
    shape = shape_from_histograms(prompts, outputs, source="test", max_model_len=4096)
    assert shape.mean_prompt_tokens == pytest.approx(500, abs=0.5)
    assert shape.mean_output_tokens == pytest.approx(96, abs=0.5)
    assert shape.mean_context_tokens == pytest.approx(596, abs=1)
    assert len(shape.requests) == 200
    assert "100 finished requests" in shape.source


def test_histogram_shape_never_exceeds_max_model_len() -> None:
    """A long prompt with a long output is cut to what the target serves."""
    shape = shape_from_histograms(
        bucketed([500] * 10, 512), bucketed([500] * 10, 512), source="t", max_model_len=512
    )
    check_fits(shape, 512)
    assert shape.max_context_tokens <= 512


def test_a_target_that_finished_nothing_asks_for_another_shape_source() -> None:
    """Empty histograms are a one-line error naming the flags that give lengths instead."""
    empty = BucketCounts((1.0, math.inf), (0.0, 0.0), 0.0)
    with pytest.raises(UsageError, match="--prompt-tokens and --output-tokens") as caught:
        shape_from_histograms(empty, empty, source="http://staging:8000")
    assert "\n" not in str(caught.value)


def _histogram(values: list[int]) -> Histogram:
    buckets = bucketed(values, 512)
    cumulative = tuple(float(sum(buckets.counts[: i + 1])) for i in range(len(buckets.counts)))
    return Histogram(buckets.bounds, cumulative, cumulative[-1], buckets.sum)


def _snapshot(prompts: list[int], outputs: list[int]) -> VllmSnapshot:
    engine = EngineMetrics(
        engine="0", prompt_tokens=_histogram(prompts), generation_tokens=_histogram(outputs)
    )
    return VllmSnapshot(engines={"0": engine})


def test_snapshot_buckets_are_since_start_or_over_a_window() -> None:
    """Without an earlier snapshot, everything since start; with one, only what came after."""
    before = _snapshot([10, 10], [5, 5])
    after = _snapshot([10, 10, 300], [5, 5, 200])
    prompt, generation = snapshot_buckets(after)
    assert prompt is not None
    assert prompt.total == 3
    prompt, generation = snapshot_buckets(after, before)
    assert prompt is not None
    assert generation is not None
    assert prompt.total == 1
    assert prompt.mean == 300
    assert generation.mean == 200


def test_explicit_lengths_are_one_request_shape() -> None:
    """--prompt-tokens and --output-tokens give every request the same lengths."""
    shape = fixed_shape(128, 352)
    assert shape.context_quantile(0.95) == 480
    with pytest.raises(UsageError, match="at least 1"):
        fixed_shape(0, 10)


def test_recorded_lengths_are_read_from_csv_spaces_and_json_lines() -> None:
    """Headers, comments and blank lines are skipped; JSON lines may use trace names."""
    text = (
        "prompt_tokens,output_tokens\n# a comment\n\n100,20\n200 40\n"
        '{"prompt_tokens": 300, "output_tokens": 60}\n{"input_length": 400, "output_length": 80}\n'
    )
    shape = parse_lengths(text, where="lengths.csv")
    assert [(r.prompt_tokens, r.output_tokens) for r in shape.requests] == [
        (100, 20),
        (200, 40),
        (300, 60),
        (400, 80),
    ]
    assert shape.source == "lengths.csv: 4 recorded requests"


@pytest.mark.parametrize("line", ["100", "100,abc", "0,5", "1,2,3", '{"prompt_tokens": 5}', "[1]"])
def test_a_bad_lengths_line_is_one_line_naming_the_line_and_the_format(line: str) -> None:
    """The error says which line and how a line must look."""
    with pytest.raises(UsageError) as caught:
        parse_lengths(f"10,10\n{line}\n", where="lengths.csv")
    message = str(caught.value)
    assert "lengths.csv line 2" in message
    assert "PROMPT_TOKENS,OUTPUT_TOKENS" in message
    assert "\n" not in message


def test_an_empty_lengths_file_and_a_too_long_request_are_refused() -> None:
    """Nothing to send, or a request the target cannot take, is a usage error before any load."""
    with pytest.raises(UsageError, match="holds no request lengths"):
        parse_lengths("# nothing\n", where="empty.csv")
    with pytest.raises(UsageError, match="max_model_len is 512"):
        check_fits(fixed_shape(500, 100), 512)


def test_a_json_line_nested_too_deep_is_one_line_naming_it() -> None:
    """100,000 nested brackets overflow the JSON parser's recursion: a UsageError, line 2."""
    deep = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(UsageError, match=r"f\.csv line 2 "):
        parse_lengths(f"10,5\n{deep}\n", where="f.csv")


@pytest.mark.parametrize(
    "line",
    [
        "99999999999999999999,5",
        f"{MAX_CONTEXT_TOKENS},1",
        "5,1000000000",
        '{"prompt_tokens": 1e300, "output_tokens": 5}',
        "9" * 5000 + ",5",
    ],
)
def test_a_recorded_length_past_the_cap_is_refused_naming_its_line(line: str) -> None:
    """No request longer than MAX_CONTEXT_TOKENS is built, whatever the target says."""
    with pytest.raises(UsageError, match=f"f.csv line 1 .*at most {MAX_CONTEXT_TOKENS:,}"):
        parse_lengths(line + "\n", where="f.csv")


def test_the_cap_itself_is_accepted() -> None:
    """A request of exactly MAX_CONTEXT_TOKENS is within it."""
    shape = parse_lengths(f"{MAX_CONTEXT_TOKENS - 1},1\n", where="f.csv")
    assert shape.max_context_tokens == MAX_CONTEXT_TOKENS
    check_fits(shape, None)


@pytest.mark.parametrize(("prompt", "output"), [(MAX_CONTEXT_TOKENS, 1), (10**20, 5)])
def test_explicit_lengths_past_the_cap_are_refused(prompt: int, output: int) -> None:
    """--prompt-tokens and --output-tokens: at most MAX_CONTEXT_TOKENS together."""
    with pytest.raises(UsageError, match="the probe sends at most"):
        fixed_shape(prompt, output)


def test_a_shape_past_the_cap_does_not_fit_a_target_that_gives_no_max_model_len() -> None:
    """check_fits bounds every shape (histograms too) when the target says no max_model_len."""
    shape = TrafficShape((RequestShape(MAX_CONTEXT_TOKENS, 1),), "histograms")
    with pytest.raises(UsageError, match="the probe sends at most"):
        check_fits(shape, None)
