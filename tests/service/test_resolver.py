"""Specification of fleet mode's name lookups: a bounded budget, shared lookups and a memory."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import time
from typing import TYPE_CHECKING

import pytest

from exporter.service.resolver import BoundedResolver, Lookup, Resolution, system_resolve

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from exporter.service.allowlist import IPAddress

    #: The ``make_resolver`` fixture's factory (keywords of :class:`BoundedResolver`).
    MakeResolver = Callable[..., BoundedResolver]

ADDRESS = ipaddress.ip_address("10.0.0.5")


class Clock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Names:
    """The injected blocking lookup: every name resolves to 10.0.0.5 but those in ``empty``.

    Every call is recorded; a name in ``blocked`` sets ``entered`` and waits for ``gate``.
    """

    def __init__(
        self,
        gate: threading.Event,
        *,
        blocked: tuple[str, ...] = (),
        empty: tuple[str, ...] = (),
    ) -> None:
        self.gate = gate
        self.blocked = blocked
        self.empty = empty
        self.entered = threading.Event()
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[IPAddress]:
        self.asked.append(host)
        if host in self.blocked:
            self.entered.set()
            self.gate.wait(timeout=10.0)
        return [] if host in self.empty else [ADDRESS]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event blocked lookups wait on, set at the end of the test so that no thread stays."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def make_resolver() -> Iterator[MakeResolver]:
    """Make resolvers (keywords as BoundedResolver's); each is closed at the end of the test."""
    made: list[BoundedResolver] = []

    def make(**kwargs: object) -> BoundedResolver:
        resolver = BoundedResolver(**kwargs)  # type: ignore[arg-type]
        made.append(resolver)
        return resolver

    yield make
    for resolver in made:
        resolver.close()


def resolve(resolver: BoundedResolver, host: str) -> Resolution:
    """Resolve ``host`` on an event loop of its own."""
    return asyncio.run(resolver.resolve(host))


async def resolve_once_free(resolver: BoundedResolver, host: str) -> Resolution:
    """Resolve ``host``, retrying for up to 5 s while every lookup slot is busy."""
    deadline = time.monotonic() + 5.0
    while True:
        resolution = await resolver.resolve(host)
        if resolution.failure is not Lookup.BUSY or time.monotonic() > deadline:
            return resolution
        await asyncio.sleep(0.005)


def test_an_answer_is_remembered_for_ttl_seconds(
    make_resolver: MakeResolver, gate: threading.Event
) -> None:
    """A name is looked up once, answered from memory for ttl_seconds, then looked up again."""
    clock, names = Clock(), Names(gate)
    resolver = make_resolver(resolve=names, ttl_seconds=30.0, negative_ttl_seconds=5.0, clock=clock)
    assert resolve(resolver, "vllm.svc") == Resolution((ADDRESS,))
    clock.now += 29.0
    assert resolve(resolver, "vllm.svc") == Resolution((ADDRESS,))
    assert names.asked == ["vllm.svc"]
    clock.now += 1.0
    assert resolve(resolver, "vllm.svc") == Resolution((ADDRESS,))
    assert names.asked == ["vllm.svc", "vllm.svc"]


def test_a_name_without_addresses_is_remembered_for_negative_ttl_seconds(
    make_resolver: MakeResolver, gate: threading.Event
) -> None:
    """A lookup with no address is NOT_FOUND, remembered for negative_ttl_seconds only."""
    clock, names = Clock(), Names(gate, empty=("gone.svc",))
    resolver = make_resolver(resolve=names, ttl_seconds=30.0, negative_ttl_seconds=5.0, clock=clock)
    assert resolve(resolver, "gone.svc") == Resolution(failure=Lookup.NOT_FOUND)
    clock.now += 4.0
    assert resolve(resolver, "gone.svc").failure is Lookup.NOT_FOUND
    assert names.asked == ["gone.svc"]
    clock.now += 1.0
    resolve(resolver, "gone.svc")
    assert names.asked == ["gone.svc", "gone.svc"]


def test_a_lookup_that_never_answers_times_out_and_is_remembered_as_timeout(
    make_resolver: MakeResolver, gate: threading.Event
) -> None:
    """A hanging lookup gives TIMEOUT within timeout_seconds; asking again does not look it up."""
    names = Names(gate, blocked=("slow.svc",))
    resolver = make_resolver(resolve=names, max_concurrent=1, timeout_seconds=0.05)

    async def go() -> tuple[Resolution, float, Resolution]:
        started = time.monotonic()
        first = await resolver.resolve("slow.svc")
        elapsed = time.monotonic() - started
        again = await resolver.resolve("slow.svc")
        gate.set()
        await resolve_once_free(resolver, "other.svc")  # the hanging thread has returned
        return first, elapsed, again

    first, elapsed, again = asyncio.run(go())
    assert first == Resolution(failure=Lookup.TIMEOUT)
    assert elapsed < 1.0
    assert again == Resolution(failure=Lookup.TIMEOUT)
    assert names.asked == ["slow.svc", "other.svc"]


def test_concurrent_resolves_of_one_name_share_one_lookup(
    make_resolver: MakeResolver, gate: threading.Event
) -> None:
    """A second resolve of a name while its lookup runs waits for that lookup, not a new one."""
    names = Names(gate, blocked=("vllm.svc",))
    resolver = make_resolver(resolve=names)

    async def go() -> tuple[Resolution, Resolution]:
        first = asyncio.create_task(resolver.resolve("vllm.svc"))
        second = asyncio.create_task(resolver.resolve("vllm.svc"))
        assert await asyncio.to_thread(names.entered.wait, 5.0)
        gate.set()
        return await asyncio.gather(first, second)

    first, second = asyncio.run(go())
    assert first == second == Resolution((ADDRESS,))
    assert names.asked == ["vllm.svc"]


def test_beyond_max_concurrent_lookups_a_new_name_is_busy_at_once_and_not_remembered(
    make_resolver: MakeResolver, gate: threading.Event
) -> None:
    """With the one slot held, another name gets BUSY without a lookup, and is looked up later."""
    names = Names(gate, blocked=("slow.svc",))
    resolver = make_resolver(resolve=names, max_concurrent=1, timeout_seconds=5.0)

    async def go() -> tuple[Resolution, float, Resolution, Resolution]:
        held = asyncio.create_task(resolver.resolve("slow.svc"))
        assert await asyncio.to_thread(names.entered.wait, 5.0)
        started = time.monotonic()
        busy = await resolver.resolve("vllm.svc")
        elapsed = time.monotonic() - started
        gate.set()
        return busy, elapsed, await held, await resolver.resolve("vllm.svc")

    busy, elapsed, held, later = asyncio.run(go())
    assert busy == Resolution(failure=Lookup.BUSY)
    assert elapsed < 1.0
    assert held == later == Resolution((ADDRESS,))
    assert names.asked == ["slow.svc", "vllm.svc"]


def test_a_timed_out_lookup_holds_its_slot_until_the_lookup_returns(
    make_resolver: MakeResolver, gate: threading.Event
) -> None:
    """After a TIMEOUT the hanging thread still counts: other names are BUSY until it returns."""
    names = Names(gate, blocked=("slow.svc",))
    resolver = make_resolver(resolve=names, max_concurrent=1, timeout_seconds=0.05)

    async def go() -> tuple[Resolution, Resolution, Resolution]:
        timed_out = await resolver.resolve("slow.svc")
        busy = await resolver.resolve("vllm.svc")
        gate.set()
        return timed_out, busy, await resolve_once_free(resolver, "vllm.svc")

    timed_out, busy, freed = asyncio.run(go())
    assert timed_out.failure is Lookup.TIMEOUT
    assert busy.failure is Lookup.BUSY
    assert freed == Resolution((ADDRESS,))
    assert names.asked == ["slow.svc", "vllm.svc"]


def test_beyond_max_entries_the_oldest_answer_is_forgotten(
    make_resolver: MakeResolver, gate: threading.Event
) -> None:
    """With max_entries=2, a third name pushes out the first; the two newest are remembered."""
    names = Names(gate)
    resolver = make_resolver(resolve=names, max_entries=2)
    for host in ("a.svc", "b.svc", "c.svc", "c.svc", "b.svc", "a.svc"):
        resolve(resolver, host)
    assert names.asked == ["a.svc", "b.svc", "c.svc", "a.svc"]


def test_system_resolve_finds_localhost_on_the_loopback() -> None:
    """The system resolver answers localhost with loopback addresses only."""
    addresses = system_resolve("localhost")
    assert addresses
    assert all(a.is_loopback for a in addresses)


def test_system_resolve_gives_no_address_for_a_reserved_invalid_name() -> None:
    """A name under the .invalid TLD (RFC 6761) resolves to nothing, without raising."""
    assert system_resolve("nothing-here.invalid") == []


def test_a_caller_giving_up_leaves_the_lookup_to_the_others_asking() -> None:
    """A probe whose time runs out does not cancel the lookup another probe of the name awaits."""
    release = threading.Event()

    def slow(host: str) -> list[IPAddress]:
        release.wait(5)
        return [ipaddress.ip_address("10.0.0.7")]

    resolver = BoundedResolver(resolve=slow, timeout_seconds=3.0)

    async def go() -> list[object]:
        impatient = asyncio.wait_for(resolver.resolve("x.svc"), 0.1)
        patient = resolver.resolve("x.svc")
        asyncio.get_running_loop().call_later(0.3, release.set)
        return list(await asyncio.gather(impatient, patient, return_exceptions=True))

    try:
        first, second = asyncio.run(go())
    finally:
        release.set()
        resolver.close()
    assert isinstance(first, TimeoutError)
    assert isinstance(second, Resolution)
    assert second.addresses == (ipaddress.ip_address("10.0.0.7"),)
    assert resolver.lookups == 1


def test_a_closed_resolver_answers_busy_without_raising() -> None:
    """After close() a lookup is refused as busy, never an exception."""
    resolver = BoundedResolver(resolve=lambda _host: [])
    resolver.close()
    assert asyncio.run(resolver.resolve("x.svc")).failure is Lookup.BUSY
