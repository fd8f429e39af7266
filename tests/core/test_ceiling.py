"""Specification of the concurrency ceiling (exporter.core.ceiling): every limit, one name."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.core.ceiling import QueueCaps, ceiling, headroom, queue_room
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
    assert found.flags == {
        "kv_cache": 1.0,
        "max_num_seqs": 0.0,
        "engine_asleep": 0.0,
        "queue_cap": 0.0,
    }


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


# --- the admission caps (--max-num-queued-reqs, --max-num-queued-tokens) ---------------------


def test_a_queue_cap_under_every_other_limit_binds_the_ceiling() -> None:
    """--max-num-queued-reqs 8 under a pool of 425 and --max-num-seqs 256: 8, the queue cap."""
    found = ceiling(425.0, running_limit=256, queue_cap=8.0)
    assert found is not None
    assert (found.sequences, found.limited_by, found.kv_sequences) == (
        8.0,
        Limit.QUEUE_CAP,
        425.0,
    )


def test_a_queue_cap_above_the_scheduler_leaves_the_scheduler_named() -> None:
    """A cap of 300 over --max-num-seqs 256: requests queue before they are refused."""
    found = ceiling(425.0, running_limit=256, queue_cap=300.0)
    assert found is not None
    assert (found.sequences, found.limited_by) == (256.0, Limit.MAX_NUM_SEQS)


def test_a_tie_with_the_scheduler_names_the_cap_since_past_it_requests_are_refused() -> None:
    """Cap = max_num_seqs: nothing can wait, the next request is answered 503."""
    found = ceiling(425.0, running_limit=256, queue_cap=256.0)
    assert found is not None
    assert found.limited_by == Limit.QUEUE_CAP


def test_a_sleeping_engine_is_named_before_any_cap() -> None:
    """Asleep wins: waking the engine comes before raising a cap."""
    found = ceiling(425.0, running_limit=256, queue_cap=8.0, asleep=True)
    assert found is not None
    assert found.limited_by == Limit.ENGINE_ASLEEP


def test_the_room_under_the_cap_is_the_cap_less_every_unfinished_request() -> None:
    """--max-num-queued-reqs 8 with 6 running and waiting: 2 more are admitted."""
    assert queue_room(QueueCaps(requests=8), in_flight=6.0, rejecting=False) == 2.0


def test_the_room_is_zero_at_the_cap_and_never_negative() -> None:
    """At or over the cap (the scheduler's gauges lag the API server): 0."""
    assert queue_room(QueueCaps(requests=8), in_flight=8.0, rejecting=False) == 0.0
    assert queue_room(QueueCaps(requests=8), in_flight=11.0, rejecting=False) == 0.0


def test_rejections_prove_a_cap_binds_even_when_its_value_is_not_declared() -> None:
    """The token cap (no metric shows its backlog) or an unknown cap: rejecting means 0."""
    assert queue_room(QueueCaps(tokens=4096), in_flight=1.0, rejecting=True) == 0.0
    assert queue_room(None, in_flight=None, rejecting=True) == 0.0


def test_no_cap_is_assumed_where_none_is_declared_and_nothing_is_rejected() -> None:
    """vLLM's default is no cap: no room figure, so the cap never binds."""
    assert queue_room(None, in_flight=6.0, rejecting=False) is None
    assert queue_room(QueueCaps(tokens=4096), in_flight=6.0, rejecting=False) is None
    assert queue_room(QueueCaps(requests=8), in_flight=None, rejecting=False) is None


def test_headroom_at_a_full_queue_cap_is_zero_and_names_it() -> None:
    """Free KV for 40 and 100 free slots, but the cap is reached: 0, limited by the queue cap."""
    found = headroom(40.0, running_limit=256, running=156, queue_room=0.0)
    assert found is not None
    assert (found.sequences, found.limited_by) == (0.0, Limit.QUEUE_CAP)


@given(
    kv=st.one_of(st.none(), st.floats(0, 1e6)),
    limit=st.one_of(st.none(), st.integers(0, 10_000)),
    room=st.one_of(st.none(), st.floats(0, 10_000)),
    running=st.floats(0, 20_000),
)
def test_headroom_never_exceeds_the_room_under_the_cap(
    kv: float | None, limit: int | None, room: float | None, running: float
) -> None:
    """Whatever the inputs, the headroom is under each known limit, the cap's room included."""
    found = headroom(kv, running_limit=limit, running=running, queue_room=room)
    if found is None:
        assert (kv, limit, room) == (None, None, None)
        return
    for bound in (kv, room, None if limit is None else max(0.0, limit - running)):
        if bound is not None:
            assert found.sequences <= bound
