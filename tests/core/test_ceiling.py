"""Specification of the concurrency ceiling (exporter.core.ceiling): every limit, one name."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.core.ceiling import ceiling, headroom
from exporter.core.reasons import Limit


def test_the_kv_pool_binds_when_it_holds_fewer_than_the_scheduler_runs() -> None:
    """425 sequences in the pool under a 1,024 limit: 425, limited by the KV cache."""
    found = ceiling(425.0, running_limit=1024)
    assert found is not None
    assert (found.sequences, found.limited_by, found.kv_sequences) == (425.0, Limit.KV_CACHE, 425.0)


def test_max_num_seqs_binds_when_the_pool_holds_more() -> None:
    """A pool of 425 under --max-num-seqs 256: 256, and the pool's figure is kept."""
    found = ceiling(425.0, running_limit=256)
    assert found is not None
    assert (found.sequences, found.limited_by, found.kv_sequences) == (
        256.0,
        Limit.MAX_NUM_SEQS,
        425.0,
    )


def test_a_tie_names_the_scheduler() -> None:
    """Equal limits: raising the pool alone would not help, so the scheduler is named."""
    found = ceiling(256.0, running_limit=256)
    assert found is not None
    assert found.limited_by == Limit.MAX_NUM_SEQS


def test_a_sleeping_engine_holds_nothing_and_says_why() -> None:
    """Asleep: 0 sequences, limited by the sleep; no division by a pool that is not there."""
    found = ceiling(None, running_limit=256, asleep=True)
    assert found is not None
    assert (found.sequences, found.limited_by) == (0.0, Limit.ENGINE_ASLEEP)
    assert headroom(10.0, running_limit=256, running=0, asleep=True).sequences == 0.0  # type: ignore[union-attr]


def test_unknown_pool_with_known_limit_and_nothing_known() -> None:
    """Only the scheduler known: its limit; nothing known: no ceiling at all."""
    only = ceiling(None, running_limit=8)
    assert only is not None
    assert only.limited_by == Limit.MAX_NUM_SEQS
    assert ceiling(None, running_limit=None) is None


def test_headroom_is_free_slots_when_the_scheduler_is_full() -> None:
    """2 of 2 running while the KV pool has room for 40 more: 0 more, limited by max_num_seqs."""
    found = headroom(40.0, running_limit=2, running=2)
    assert found is not None
    assert (found.sequences, found.limited_by) == (0.0, Limit.MAX_NUM_SEQS)


def test_headroom_never_goes_negative_when_running_exceeds_a_lowered_limit() -> None:
    """A limit learnt late can sit under the running count: 0 slots, not negative."""
    found = headroom(5.0, running_limit=4, running=6)
    assert found is not None
    assert found.sequences == 0.0


def test_flags_are_one_hot_over_every_limit() -> None:
    """The one-hot gauge: exactly one limit at 1, every limit present."""
    found = ceiling(3.0, running_limit=10)
    assert found is not None
    assert found.flags == {"kv_cache": 1.0, "max_num_seqs": 0.0, "engine_asleep": 0.0}


@given(
    kv=st.one_of(st.none(), st.floats(0, 1e6)),
    limit=st.one_of(st.none(), st.integers(0, 10_000)),
    running=st.floats(0, 20_000),
)
def test_headroom_never_exceeds_either_limit(
    kv: float | None, limit: int | None, running: float
) -> None:
    """Whatever the inputs, the headroom is under the free KV and the free slots."""
    found = headroom(kv, running_limit=limit, running=running)
    if found is None:
        assert kv is None
        assert limit is None
        return
    assert found.sequences >= 0
    if kv is not None:
        assert found.sequences <= kv
    if limit is not None:
        assert found.sequences <= max(0.0, limit - running)
