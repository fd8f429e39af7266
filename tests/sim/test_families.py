"""vLLM 0.32.0's histogram families and bucket rules, as the simulation reproduces them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.sim.families import build_1_2_5_buckets, histogram_families


def test_1_2_5_buckets_for_max_model_len_512_match_the_capture() -> None:
    """The real 0.32 capture (max_model_len 512) shows token buckets 1, 2, 5, ..., 200, 500."""
    expected = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
    assert build_1_2_5_buckets(512) == expected


@given(max_value=st.integers(1, 10**7))
def test_1_2_5_buckets_are_every_1_2_5_value_up_to_the_maximum(max_value: int) -> None:
    """Bounds ascend, are 1, 2 or 5 x 10^k, stay within the maximum, and the next one would not."""
    bounds = build_1_2_5_buckets(max_value)
    assert list(bounds) == sorted(set(bounds))
    assert bounds[-1] <= max_value
    for b in bounds:
        mantissa = b / 10 ** (len(str(int(b))) - 1)
        assert mantissa in {1.0, 2.0, 5.0}
    last = int(bounds[-1])
    following = {1: 2, 2: 5, 5: 10}[int(str(last)[0])] * 10 ** (len(str(last)) - 1)
    assert following > max_value


def test_histogram_families_are_unique_and_sorted() -> None:
    """Each histogram family appears once with strictly ascending finite bounds."""
    fams = histogram_families(16384)
    names = [f.name for f in fams]
    assert len(names) == len(set(names)) == 16
    for family in fams:
        assert list(family.bounds) == sorted(set(family.bounds)), family.name
        assert all(b < float("inf") for b in family.bounds), family.name
