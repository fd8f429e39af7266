"""Specification of fleet mode's probes: limits, address checks, pollers, bounds and timeouts.

And, with gpu_source=dcgm, the GPU parameters a probe names its target's GPUs by.
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from typing import TYPE_CHECKING, Any

import pytest
from structlog.testing import capture_logs

from exporter.core.reasons import DcgmReason, EvictionReason, ProbeOutcome
from exporter.core.views import TargetView
from exporter.service.allowlist import parse_allowlist
from exporter.service.dcgm import SharedDcgmAnswers
from exporter.service.fleet import Fleet, Refusal, Ticket
from exporter.service.memory import MemoryBudget
from exporter.service.resolver import BoundedResolver
from exporter.vllm.client import Route, current_route
from tests.dcgm import DCGM, EMBED_POD, GPU0, GPU2, GPU5, V4_MAPPED, VLLM_POD
from tests.service.test_allowlist import LOOPBACK_V6_SPELLINGS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from exporter.service.allowlist import IPAddress, ProbeTarget
    from exporter.service.poller import GpuSource

    #: The ``make_fleet`` fixture's factory (keywords of :class:`Fleet` and the fakes).
    MakeFleet = Callable[..., Fleet]

CLIENT = "192.0.2.1"


class Clock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class FakePoller:
    """A poller that returns a bare view of its target, or never answers when ``hangs``.

    It records the route each poll ran within: where a pinned client would have connected.
    """

    def __init__(self, target: ProbeTarget, gpus: GpuSource | None, *, hangs: bool) -> None:
        self.target = target
        self.gpus = gpus
        self.hangs = hangs
        self.polls = 0
        self.routes: list[Route | None] = []
        #: Set by a test as the memory budget would: the fleet is to drop this poller.
        self.forgotten = False
        self.evictions: dict[str, int] = {}

    def carry_evictions(self, evictions: Mapping[str, int]) -> None:
        """Go on from the counts of the poller this one replaces."""
        self.evictions = dict(evictions)

    async def poll_once(self) -> TargetView:
        """Count the poll, note its route and answer (or wait forever)."""
        self.polls += 1
        self.routes.append(current_route())
        if self.hangs:
            await asyncio.Event().wait()
        return TargetView(target=self.target.url)


class Pollers:
    """The injected ``make_poller``: records every poller it makes."""

    def __init__(self, *, hangs: bool = False) -> None:
        self.hangs = hangs
        self.made: list[FakePoller] = []

    def __call__(self, target: ProbeTarget, gpus: GpuSource | None) -> FakePoller:
        poller = FakePoller(target, gpus, hangs=self.hangs)
        self.made.append(poller)
        return poller

    @property
    def urls(self) -> list[str]:
        """The URLs pollers were made for, in order."""
        return [p.target.url for p in self.made]


class Resolve:
    """The injected blocking lookup: fixed answers per name, every call recorded.

    A name in ``blocked`` waits for ``gate`` (and sets ``entered`` first).
    """

    def __init__(
        self,
        answers: dict[str, list[str]] | None = None,
        *,
        blocked: tuple[str, ...] = (),
        gate: threading.Event | None = None,
    ) -> None:
        self.answers = answers or {}
        self.blocked = blocked
        self.gate = gate or threading.Event()
        self.entered = threading.Event()
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[IPAddress]:
        self.asked.append(host)
        if host in self.blocked:
            self.entered.set()
            self.gate.wait(timeout=10.0)
        return [ipaddress.ip_address(a) for a in self.answers.get(host, [])]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event blocked lookups wait on, set at the end of the test so that no thread stays."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def make_fleet() -> Iterator[MakeFleet]:
    """Make fleets over the fakes (10.0.0.0/8 allowed unless said otherwise); closed at the end."""
    fleets: list[Fleet] = []

    def make(
        *,
        allow: tuple[str, ...] = ("10.0.0.0/8",),
        pollers: Pollers | None = None,
        resolve: Resolve | None = None,
        resolver: BoundedResolver | None = None,
        clock: Clock | None = None,
        max_targets: int = 10,
        ttl_seconds: float = 600.0,
        token_targets: tuple[str, ...] = (),
        dcgm: SharedDcgmAnswers | None = None,
        memory: MemoryBudget | None = None,
        **limits: int,
    ) -> Fleet:
        fleet = Fleet(
            allowlist=parse_allowlist(allow),
            make_poller=pollers or Pollers(),  # type: ignore[arg-type]
            max_targets=max_targets,
            ttl_seconds=ttl_seconds,
            resolver=resolver or BoundedResolver(resolve=resolve or Resolve()),
            token_targets=parse_allowlist(token_targets),
            clock=clock or Clock(),
            dcgm=dcgm,
            memory=memory,
            **limits,
        )
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


def ticket(fleet: Fleet, target: str, client: str = CLIENT) -> Ticket:
    """Enter ``target`` for ``client``; it must be admitted."""
    entered = fleet.enter(target, client)
    assert isinstance(entered, Ticket), entered
    return entered


def probe(
    fleet: Fleet, target: str, *, client: str = CLIENT, timeout_seconds: float = 5.0
) -> TargetView | Refusal:
    """Enter ``target`` (it must be admitted), probe it once and leave."""
    admitted = ticket(fleet, target, client)
    try:
        return asyncio.run(fleet.probe(admitted, timeout_seconds))
    finally:
        fleet.leave(admitted)


def outcome(result: TargetView | Refusal) -> ProbeOutcome:
    """The outcome a probe's result stands for."""
    return result.outcome if isinstance(result, Refusal) else ProbeOutcome.OK


def refusal(result: TargetView | Ticket | Refusal) -> Refusal:
    """``result``, which must be a refusal."""
    assert isinstance(result, Refusal), result
    return result


def test_every_outcome_is_counted_from_zero(make_fleet: MakeFleet) -> None:
    """A new fleet counts each ProbeOutcome at 0, throttled included, so rate() sees the first."""
    counts = make_fleet().outcome_counts()
    assert counts == dict.fromkeys(ProbeOutcome, 0)
    assert ProbeOutcome.THROTTLED in counts


def test_an_allowed_address_is_entered_without_counting_anything_yet(
    make_fleet: MakeFleet,
) -> None:
    """enter() gives a ticket with the normalised URL and the client; outcomes wait for probe()."""
    fleet = make_fleet()
    entered = ticket(fleet, "10.1.2.3:8000", "192.0.2.7")
    assert entered.target.url == "http://10.1.2.3:8000"
    assert entered.client == "192.0.2.7"
    assert sum(fleet.outcome_counts().values()) == 0


def test_entering_a_host_name_does_no_lookup(make_fleet: MakeFleet) -> None:
    """enter() runs on the HTTP thread without I/O: a name is resolved only when probed."""
    resolve = Resolve({"vllm.svc": ["10.0.0.5"]})
    fleet = make_fleet(resolve=resolve)
    assert ticket(fleet, "vllm.svc:8000").target.host == "vllm.svc"
    assert resolve.asked == []


def test_a_bad_url_is_refused_at_entry_as_bad_target_and_counted(make_fleet: MakeFleet) -> None:
    """A target that is no http(s) base URL is bad_target (400), with a message saying why."""
    fleet = make_fleet()
    refused = refusal(fleet.enter("ftp://10.1.2.3:21", CLIENT))
    assert refused.outcome is ProbeOutcome.BAD_TARGET
    assert refused.status == "400 Bad Request"
    assert refused.message.startswith("Bad target: ")
    assert fleet.outcome_counts()[ProbeOutcome.BAD_TARGET] == 1


@pytest.mark.parametrize(
    "target",
    [
        "http://2852039166:8000",
        "http://0177.0.0.1:8000",
        "http://0:8000",
        "http://127.1:8000",
        "http://0x7f.1:8000",
        "http://10.1.2.3:0",
        "http://10.1.2.3:65536",
    ],
    ids=["decimal", "octal", "zero", "shorthand", "hex", "port-0", "port-65536"],
)
def test_odd_ipv4_spellings_and_ports_are_bad_targets_never_resolved(
    make_fleet: MakeFleet, target: str
) -> None:
    """Names a resolver reads as IPv4 in another spelling, and ports 0 and 65536, are refused."""
    resolve = Resolve()
    fleet = make_fleet(allow=("0.0.0.0/0",), resolve=resolve)
    assert refusal(fleet.enter(target, CLIENT)).outcome is ProbeOutcome.BAD_TARGET
    assert fleet.outcome_counts()[ProbeOutcome.BAD_TARGET] == 1
    assert resolve.asked == []


def test_a_refused_target_takes_no_place_in_the_limits(make_fleet: MakeFleet) -> None:
    """With room for one probe, a bad target refused at entry leaves that room to the next."""
    fleet = make_fleet(max_in_flight=1)
    refusal(fleet.enter("ftp://10.1.2.3:21", CLIENT))
    ticket(fleet, "10.1.2.3:8000")


def test_an_address_outside_the_allowlist_is_denied_logged_and_never_polled(
    make_fleet: MakeFleet,
) -> None:
    """192.168.1.1 outside 10.0.0.0/8 is denied_not_in_allowlist (403), counted and logged."""
    pollers = Pollers()
    fleet = make_fleet(pollers=pollers)
    with capture_logs() as logs:
        refused = refusal(probe(fleet, "http://192.168.1.1:8000"))
    assert refused.outcome is ProbeOutcome.DENIED_NOT_IN_ALLOWLIST
    assert refused.status == "403 Forbidden"
    assert refused.message == "Target not allowed (not in allowlist)."
    assert fleet.outcome_counts()[ProbeOutcome.DENIED_NOT_IN_ALLOWLIST] == 1
    assert [(e["event"], e["reason"], e["host"]) for e in logs] == [
        ("probe_denied", "not_in_allowlist", "192.168.1.1")
    ]
    assert pollers.made == []


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "0.0.0.0",  # noqa: S104 (a target to refuse, not an address we bind)
        "[::ffff:169.254.169.254]",
        "224.0.0.1",
    ],
)
def test_forbidden_addresses_are_denied_even_when_the_allowlist_covers_them(
    make_fleet: MakeFleet, address: str
) -> None:
    """Metadata, unspecified and multicast addresses are forbidden even under 0.0.0.0/0."""
    fleet = make_fleet(allow=("0.0.0.0/0", "::/0"))
    refused = refusal(probe(fleet, f"http://{address}:8000"))
    assert refused.outcome is ProbeOutcome.DENIED_FORBIDDEN_ADDRESS
    assert refused.status == "403 Forbidden"
    assert fleet.outcome_counts()[ProbeOutcome.DENIED_FORBIDDEN_ADDRESS] == 1


def test_a_literal_address_is_never_resolved(make_fleet: MakeFleet) -> None:
    """Only host names go through the injected resolver."""
    resolve = Resolve()
    assert isinstance(probe(make_fleet(resolve=resolve), "http://10.1.2.3:8000"), TargetView)
    assert resolve.asked == []


@pytest.mark.parametrize(
    ("addresses", "expected"),
    [
        (["10.0.0.5", "10.9.9.9"], ProbeOutcome.OK),
        (["10.0.0.5", "192.168.1.1"], ProbeOutcome.DENIED_NOT_IN_ALLOWLIST),
        ([], ProbeOutcome.DENIED_NOT_IN_ALLOWLIST),
        (["10.0.0.5", "169.254.169.254"], ProbeOutcome.DENIED_FORBIDDEN_ADDRESS),
    ],
    ids=["all-inside", "one-outside", "unresolved", "one-forbidden"],
)
def test_a_host_name_is_allowed_only_when_every_address_it_resolves_to_is_inside(
    make_fleet: MakeFleet, addresses: list[str], expected: ProbeOutcome
) -> None:
    """A name is judged by all of its resolved addresses, asked of the injected resolver."""
    resolve = Resolve({"vllm.svc": addresses})
    fleet = make_fleet(resolve=resolve)
    assert outcome(probe(fleet, "http://vllm.svc:8000")) is expected
    assert fleet.outcome_counts()[expected] == 1
    assert resolve.asked == ["vllm.svc"]


def test_a_name_entry_cannot_admit_a_name_resolving_to_a_forbidden_address(
    make_fleet: MakeFleet,
) -> None:
    """A name matching a name entry is still denied when it resolves to the metadata address."""
    resolve = Resolve({"vllm.svc": ["169.254.169.254"]})
    fleet = make_fleet(allow=("vllm.svc",), resolve=resolve)
    assert outcome(probe(fleet, "vllm.svc:8000")) is ProbeOutcome.DENIED_FORBIDDEN_ADDRESS


def test_the_poll_runs_within_a_route_of_exactly_the_addresses_checked(
    make_fleet: MakeFleet,
) -> None:
    """A name's poll is pinned to the addresses it resolved to; a literal's to itself."""
    pollers = Pollers()
    resolve = Resolve({"vllm.svc": ["10.0.0.5", "10.9.9.9"]})
    fleet = make_fleet(pollers=pollers, resolve=resolve)
    probe(fleet, "vllm.svc:8000")
    probe(fleet, "10.1.2.3:8000")
    named, literal = pollers.made
    assert named.target.url == "http://vllm.svc:8000"
    assert named.routes == [Route(addresses=(ip("10.0.0.5"), ip("10.9.9.9")), send_token=False)]
    assert literal.routes == [Route(addresses=(ip("10.1.2.3"),), send_token=False)]
    assert current_route() is None, "the route leaked out of the probe"


def ip(text: str) -> IPAddress:
    """An address from its text."""
    return ipaddress.ip_address(text)


def rebinding(answers: list[list[str]]) -> Callable[[str], list[IPAddress]]:
    """A blocking lookup whose answer changes at each call (the last one stays)."""
    calls = iter(answers)
    last: list[str] = []

    def resolve(_host: str) -> list[IPAddress]:
        nonlocal last
        last = next(calls, last)
        return [ip(a) for a in last]

    return resolve


def test_each_probe_checks_and_pins_the_answer_of_its_own_lookup(make_fleet: MakeFleet) -> None:
    """When the name's answer changes between probes, each probe's route is its own answer.

    The second answer leads to the metadata address: that probe is denied and never polled.
    """
    pollers = Pollers()
    lookups = rebinding([["10.0.0.1"], ["10.0.0.2"], ["169.254.169.254"]])
    resolver = BoundedResolver(resolve=lookups, ttl_seconds=0.0)
    fleet = make_fleet(pollers=pollers, resolver=resolver)
    probe(fleet, "vllm.svc:8000")
    probe(fleet, "vllm.svc:8000")
    denied = probe(fleet, "vllm.svc:8000")
    assert outcome(denied) is ProbeOutcome.DENIED_FORBIDDEN_ADDRESS
    (made,) = pollers.made
    assert [r.addresses if r else None for r in made.routes] == [
        (ip("10.0.0.1"),),
        (ip("10.0.0.2"),),
    ]


def test_the_token_goes_only_with_probes_whose_checked_addresses_are_bound_to_it(
    make_fleet: MakeFleet,
) -> None:
    """Bound to 10.0.0.1: the first probe may send it; after the name moves to 10.0.0.2, not.

    The decision is the probe's, for its addresses, never the target's first one.
    """
    pollers = Pollers()
    lookups = rebinding([["10.0.0.1"], ["10.0.0.2"], ["10.0.0.1", "10.0.0.2"]])
    resolver = BoundedResolver(resolve=lookups, ttl_seconds=0.0)
    fleet = make_fleet(pollers=pollers, resolver=resolver, token_targets=("10.0.0.1",))
    for _ in range(3):
        probe(fleet, "vllm.svc:8000")
    (made,) = pollers.made
    assert [r.send_token if r else None for r in made.routes] == [True, False, False]


def test_a_name_bound_to_the_token_sends_it_to_the_addresses_it_was_checked_at(
    make_fleet: MakeFleet,
) -> None:
    """A name entry binds the token to what the name resolves to when probed, pinned there."""
    pollers = Pollers()
    fleet = make_fleet(
        pollers=pollers,
        resolve=Resolve({"vllm.svc": ["10.0.0.7"]}),
        token_targets=("vllm.svc",),
    )
    probe(fleet, "vllm.svc:8000")
    assert pollers.made[0].routes == [Route(addresses=(ip("10.0.0.7"),), send_token=True)]


def test_an_ipv4_mapped_answer_is_checked_and_pinned_as_its_ipv4_address(
    make_fleet: MakeFleet,
) -> None:
    """A lookup answering ``::ffff:10.0.0.3`` is the IPv4 address 10.0.0.3, allowed by 10/8."""
    pollers = Pollers()
    fleet = make_fleet(pollers=pollers, resolve=Resolve({"vllm.svc": ["::ffff:10.0.0.3"]}))
    assert outcome(probe(fleet, "vllm.svc:8000")) is ProbeOutcome.OK
    assert pollers.made[0].routes[0] == Route(addresses=(ip("10.0.0.3"),), send_token=False)


def test_a_probe_is_throttled_when_every_name_lookup_is_busy(
    make_fleet: MakeFleet, gate: threading.Event
) -> None:
    """With the resolver's one slot held by a name still resolving, another name is throttled."""
    resolve = Resolve({"a.svc": ["10.0.0.5"], "b.svc": ["10.0.0.6"]}, blocked=("a.svc",), gate=gate)
    fleet = make_fleet(resolver=BoundedResolver(resolve=resolve, max_concurrent=1))
    first = ticket(fleet, "a.svc:8000", "192.0.2.1")
    second = ticket(fleet, "b.svc:8000", "192.0.2.2")

    async def go() -> tuple[TargetView | Refusal, TargetView | Refusal]:
        held = asyncio.create_task(fleet.probe(first, 5.0))
        assert await asyncio.to_thread(resolve.entered.wait, 5.0)
        refused = await fleet.probe(second, 5.0)
        gate.set()
        return refused, await held

    refused, answered = asyncio.run(go())
    assert refusal(refused).outcome is ProbeOutcome.THROTTLED
    assert refusal(refused).status == "503 Service Unavailable"
    assert isinstance(answered, TargetView)
    assert resolve.asked == ["a.svc"]
    counts = fleet.outcome_counts()
    assert (counts[ProbeOutcome.THROTTLED], counts[ProbeOutcome.OK]) == (1, 1)


def test_beyond_max_in_flight_a_probe_is_throttled_until_one_leaves(
    make_fleet: MakeFleet,
) -> None:
    """With max_in_flight=2, a third probe (other client, other target) is throttled and counted."""
    fleet = make_fleet(max_in_flight=2)
    first = ticket(fleet, "10.0.0.1:8000", "192.0.2.1")
    asyncio.run(fleet.probe(first, 5.0))  # a finished probe keeps its place until it leaves
    ticket(fleet, "10.0.0.2:8000", "192.0.2.2")
    refused = refusal(fleet.enter("10.0.0.3:8000", "192.0.2.3"))
    assert (refused.outcome, refused.status) == (ProbeOutcome.THROTTLED, "503 Service Unavailable")
    assert fleet.outcome_counts()[ProbeOutcome.THROTTLED] == 1
    fleet.leave(first)
    ticket(fleet, "10.0.0.3:8000", "192.0.2.3")


def test_beyond_max_per_client_that_client_is_throttled_until_one_of_its_probes_leaves(
    make_fleet: MakeFleet,
) -> None:
    """With max_per_client=2, a client's third probe is throttled while another client's is not."""
    fleet = make_fleet(max_per_client=2)
    first = ticket(fleet, "10.0.0.1:8000", "192.0.2.1")
    ticket(fleet, "10.0.0.2:8000", "192.0.2.1")
    refused = refusal(fleet.enter("10.0.0.3:8000", "192.0.2.1"))
    assert refused.outcome is ProbeOutcome.THROTTLED
    assert fleet.outcome_counts()[ProbeOutcome.THROTTLED] == 1
    ticket(fleet, "10.0.0.3:8000", "192.0.2.2")
    fleet.leave(first)
    ticket(fleet, "10.0.0.3:8000", "192.0.2.1")


def test_beyond_max_per_target_that_target_is_throttled_however_spelled_until_one_leaves(
    make_fleet: MakeFleet,
) -> None:
    """With max_per_target=2, a third probe of one normalised URL is throttled; others are not."""
    fleet = make_fleet(max_per_target=2)
    first = ticket(fleet, "10.0.0.1:8000", "192.0.2.1")
    ticket(fleet, "http://10.0.0.1:8000/", "192.0.2.2")
    refused = refusal(fleet.enter("http://10.0.0.1:8000", "192.0.2.3"))
    assert refused.outcome is ProbeOutcome.THROTTLED
    assert fleet.outcome_counts()[ProbeOutcome.THROTTLED] == 1
    ticket(fleet, "10.0.0.2:8000", "192.0.2.3")
    fleet.leave(first)
    ticket(fleet, "http://10.0.0.1:8000", "192.0.2.3")


def test_a_probe_polls_once_returns_the_view_and_counts_ok(make_fleet: MakeFleet) -> None:
    """An admitted target is polled through its poller; the view comes back and ok is counted."""
    pollers = Pollers()
    fleet = make_fleet(pollers=pollers)
    view = probe(fleet, "10.1.2.3:8000")
    assert isinstance(view, TargetView)
    assert view.target == "http://10.1.2.3:8000"
    assert pollers.urls == ["http://10.1.2.3:8000"]
    assert fleet.outcome_counts()[ProbeOutcome.OK] == 1
    assert fleet.target_count == 1


def test_one_poller_per_target_url_is_made_and_reused(make_fleet: MakeFleet) -> None:
    """Probes of one target, however spelled, share one poller; another target gets its own."""
    pollers = Pollers()
    fleet = make_fleet(pollers=pollers)
    probe(fleet, "10.1.2.3:8000")
    probe(fleet, "http://10.1.2.3:8000/")
    probe(fleet, "10.1.2.4:8000")
    assert pollers.urls == ["http://10.1.2.3:8000", "http://10.1.2.4:8000"]
    assert [p.polls for p in pollers.made] == [2, 1]
    assert fleet.target_count == 2
    assert fleet.outcome_counts()[ProbeOutcome.OK] == 3


def test_a_target_not_probed_for_longer_than_the_ttl_is_forgotten_on_the_next_probe(
    make_fleet: MakeFleet,
) -> None:
    """Past ttl_seconds a target is evicted (counted) when another probe comes, and starts anew."""
    clock, pollers = Clock(), Pollers()
    fleet = make_fleet(clock=clock, pollers=pollers, ttl_seconds=60.0)
    probe(fleet, "10.0.0.1:8000")
    clock.now += 60.0
    probe(fleet, "10.0.0.2:8000")
    assert (fleet.target_count, fleet.evictions) == (2, 0)  # exactly the TTL old: kept
    clock.now += 0.5
    probe(fleet, "10.0.0.2:8000")
    assert (fleet.target_count, fleet.evictions) == (1, 1)
    probe(fleet, "10.0.0.1:8000")
    assert pollers.urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.1:8000"]


def test_a_stale_target_stays_remembered_while_no_probe_comes(make_fleet: MakeFleet) -> None:
    """Eviction happens on probes, not on a timer: the count holds until the next probe."""
    clock = Clock()
    fleet = make_fleet(clock=clock, ttl_seconds=60.0)
    probe(fleet, "10.0.0.1:8000")
    clock.now += 3_600.0
    assert (fleet.target_count, fleet.evictions) == (1, 0)


def test_the_bound_on_targets_evicts_the_least_recently_probed(make_fleet: MakeFleet) -> None:
    """With max_targets=2, a third target evicts the one probed longest ago, not the first made."""
    clock, pollers = Clock(), Pollers()
    fleet = make_fleet(clock=clock, pollers=pollers, max_targets=2)
    for url in ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.1:8000", "10.0.0.3:8000"):
        clock.now += 1.0
        probe(fleet, url)
    assert (fleet.target_count, fleet.evictions) == (2, 1)
    probe(fleet, "10.0.0.1:8000")  # still remembered: no new poller
    assert pollers.urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    probe(fleet, "10.0.0.2:8000")  # forgotten: a new poller, and 10.0.0.3 goes
    assert pollers.urls[-1] == "http://10.0.0.2:8000"
    assert (fleet.target_count, fleet.evictions) == (2, 2)


def test_a_target_the_memory_budget_forgot_is_dropped_and_comes_back_with_its_evictions(
    make_fleet: MakeFleet,
) -> None:
    """The budget forgets a target during another's poll: that probe drops it, counted.

    Its next probe makes a new poller, whose eviction counts go on from the forgotten one's;
    the other targets are kept.
    """
    pollers = Pollers()
    fleet = make_fleet(pollers=pollers)
    probe(fleet, "10.0.0.1:8000")
    probe(fleet, "10.0.0.2:8000")
    forgotten = pollers.made[0]
    forgotten.forgotten = True
    forgotten.evictions = {EvictionReason.PROCESS_BUDGET: 3, EvictionReason.FORGOTTEN: 1}
    probe(fleet, "10.0.0.2:8000")
    assert (fleet.target_count, fleet.evictions) == (1, 1)
    probe(fleet, "10.0.0.1:8000")
    assert pollers.urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.1:8000"]
    assert pollers.made[-1].evictions == forgotten.evictions
    assert [p.polls for p in pollers.made] == [1, 2, 1]


def test_with_the_budget_known_a_probe_looks_for_forgotten_targets_only_when_it_forgot_one(
    make_fleet: MakeFleet,
) -> None:
    """A probe does not walk every target: only the budget's count of forgotten ones moving."""
    pollers = Pollers()
    memory = MemoryBudget(limit_bytes=2**30)
    fleet = make_fleet(pollers=pollers, memory=memory)
    probe(fleet, "10.0.0.1:8000")
    probe(fleet, "10.0.0.2:8000")
    pollers.made[0].forgotten = True
    probe(fleet, "10.0.0.2:8000")
    assert (fleet.target_count, fleet.evictions) == (2, 0)  # the budget forgot nothing
    memory.forgotten_count += 1
    probe(fleet, "10.0.0.2:8000")
    assert (fleet.target_count, fleet.evictions) == (1, 1)


def test_a_probe_that_outlives_its_timeout_is_refused_as_timeout_and_its_target_kept(
    make_fleet: MakeFleet,
) -> None:
    """A poll still running at timeout_seconds is abandoned: a 504 refusal, timeout counted."""
    fleet = make_fleet(pollers=Pollers(hangs=True))
    refused = refusal(probe(fleet, "10.1.2.3:8000", timeout_seconds=0.01))
    assert (refused.outcome, refused.status) == (ProbeOutcome.TIMEOUT, "504 Gateway Timeout")
    counts = fleet.outcome_counts()
    assert (counts[ProbeOutcome.TIMEOUT], counts[ProbeOutcome.OK]) == (1, 0)
    assert fleet.target_count == 1  # the target's window is kept for the next probe


def test_outcome_counts_is_a_copy(make_fleet: MakeFleet) -> None:
    """Changing the returned counts does not change the fleet's own."""
    fleet = make_fleet()
    fleet.outcome_counts()[ProbeOutcome.OK] = 99
    assert fleet.outcome_counts()[ProbeOutcome.OK] == 0


def test_leaving_twice_gives_back_one_place_only(make_fleet: MakeFleet) -> None:
    """A ticket given back twice frees its place once: the limit still holds for the others."""
    fleet = make_fleet(max_in_flight=2)
    first = ticket(fleet, "10.0.0.1:8000", "192.0.2.1")
    ticket(fleet, "10.0.0.1:8000", "192.0.2.1")  # the same target and client: a second place
    fleet.leave(first)
    fleet.leave(first)
    ticket(fleet, "10.0.0.2:8000", "192.0.2.2")
    refused = refusal(fleet.enter("10.0.0.3:8000", "192.0.2.3"))
    assert refused.outcome is ProbeOutcome.THROTTLED


def test_twelve_spellings_of_one_address_share_its_limit_and_its_poller(
    make_fleet: MakeFleet,
) -> None:
    """With max_per_target=4, the 12 spellings of [::1] get 4 places, then one poller."""
    pollers = Pollers()
    fleet = make_fleet(allow=("::1",), pollers=pollers, max_per_target=4)
    entered = [fleet.enter(spelling, CLIENT) for spelling in LOOPBACK_V6_SPELLINGS]
    assert sum(isinstance(e, Ticket) for e in entered) == 4
    for admitted in entered:
        if isinstance(admitted, Ticket):
            fleet.leave(admitted)
    for spelling in LOOPBACK_V6_SPELLINGS:
        probe(fleet, spelling)
    assert pollers.urls == ["http://[::1]:80"]
    assert pollers.made[0].polls == len(LOOPBACK_V6_SPELLINGS)


# --- the target's GPUs: dcgm=, pod=, namespace= (gpu_source=dcgm) -------------------------------

NODE = "http://10.0.3.7:9400/metrics"
GPU_PARAMS = {"dcgm": NODE, "pod": VLLM_POD.name, "namespace": VLLM_POD.namespace}


class DcgmReads:
    """The injected dcgm-exporter read: the fixture's answer; every URL and its route noted."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, Route | None]] = []

    async def __call__(self, url: str) -> bytes:
        self.reads.append((url, current_route()))
        return (DCGM / V4_MAPPED).read_bytes()

    @property
    def urls(self) -> list[str]:
        """The URLs read, in order."""
        return [url for url, _ in self.reads]


def dcgm_fleet(
    make_fleet: MakeFleet, reads: DcgmReads, *, clock: Clock | None = None, **kw: Any
) -> Fleet:
    """A fleet with gpu_source=dcgm over ``reads`` (answers held 5 s on ``clock``)."""
    clock = clock or Clock()
    answers = SharedDcgmAnswers(reads, max_age_seconds=5.0, max_entries=10, clock=clock)
    return make_fleet(dcgm=answers, clock=clock, **kw)


def gpu_probe(fleet: Fleet, target: str, params: dict[str, str]) -> TargetView | Refusal:
    """Probe ``target`` with GPU parameters (it must be admitted)."""
    admitted = fleet.enter(target, CLIENT, params)
    assert isinstance(admitted, Ticket), admitted
    try:
        return asyncio.run(fleet.probe(admitted, 5.0))
    finally:
        fleet.leave(admitted)


def read_gpus(poller: FakePoller) -> tuple[list[str], str | None]:
    """The UUIDs of the GPUs its source reads now, and the failure's reason."""
    assert poller.gpus is not None
    views, failure = poller.gpus.read(0.9)
    return sorted(v.uuid for v in views), failure.reason if failure else None


def test_a_probe_with_gpu_parameters_gets_its_pods_gpus_from_its_nodes_exporter(
    make_fleet: MakeFleet,
) -> None:
    """The node's answer is read (pinned to its address, never the token), the pod's GPUs picked."""
    pollers, reads = Pollers(), DcgmReads()
    fleet = dcgm_fleet(
        make_fleet, reads, pollers=pollers, clock=Clock(), token_targets=("10.0.0.0/8",)
    )
    assert isinstance(gpu_probe(fleet, "10.1.2.3:8000", GPU_PARAMS), TargetView)
    assert reads.reads == [(NODE, Route(addresses=(ip("10.0.3.7"),), send_token=False))]
    (poller,) = pollers.made
    assert poller.routes == [Route(addresses=(ip("10.1.2.3"),), send_token=True)]
    assert read_gpus(poller) == (sorted([GPU2, GPU5]), None)


def test_targets_of_one_node_share_one_read_per_interval(make_fleet: MakeFleet) -> None:
    """Two pods on one node, probed in turn: one read; after the poll interval, one more."""
    clock, pollers, reads = Clock(), Pollers(), DcgmReads()
    fleet = dcgm_fleet(make_fleet, reads, pollers=pollers, clock=clock)
    embed = {**GPU_PARAMS, "pod": EMBED_POD.name}
    gpu_probe(fleet, "10.1.2.3:8000", GPU_PARAMS)
    gpu_probe(fleet, "10.1.2.4:8000", embed)
    assert reads.urls == [NODE]
    clock.now += 5.0
    gpu_probe(fleet, "10.1.2.3:8000", GPU_PARAMS)
    assert reads.urls == [NODE, NODE]
    assert [read_gpus(p)[0] for p in pollers.made] == [sorted([GPU2, GPU5]), [GPU0]]


def test_the_same_url_named_with_another_pod_is_another_target(make_fleet: MakeFleet) -> None:
    """Pod and dcgm URL are part of the identity: each gets its own poller and GPUs, never mixed.

    A probe without the parameters is a third target, whose GPUs read as not_given.
    """
    pollers = Pollers()
    fleet = dcgm_fleet(make_fleet, DcgmReads(), pollers=pollers, clock=Clock())
    gpu_probe(fleet, "10.1.2.3:8000", GPU_PARAMS)
    gpu_probe(fleet, "10.1.2.3:8000", {**GPU_PARAMS, "pod": EMBED_POD.name})
    gpu_probe(fleet, "10.1.2.3:8000", {})
    gpu_probe(fleet, "10.1.2.3:8000", GPU_PARAMS)
    assert fleet.target_count == 3
    assert [p.polls for p in pollers.made] == [2, 1, 1]
    assert [read_gpus(p) for p in pollers.made] == [
        (sorted([GPU2, GPU5]), None),
        ([GPU0], None),
        ([], DcgmReason.NOT_GIVEN),
    ]


def test_a_forgotten_targets_node_answer_is_forgotten_with_it(make_fleet: MakeFleet) -> None:
    """max_targets=1: the second node's target evicts the first, and the first node's answer."""
    reads = DcgmReads()
    answers = SharedDcgmAnswers(reads, max_age_seconds=5.0, max_entries=10)
    fleet = make_fleet(dcgm=answers, max_targets=1)
    gpu_probe(fleet, "10.1.2.3:8000", GPU_PARAMS)
    gpu_probe(fleet, "10.1.2.4:8000", {**GPU_PARAMS, "dcgm": "http://10.0.3.8:9400/metrics"})
    assert fleet.evictions == 1
    assert answers.latest(NODE) is None
    assert answers.latest("http://10.0.3.8:9400/metrics") is not None


@pytest.mark.parametrize(
    ("dcgm", "expected"),
    [
        ("http://192.168.7.7:9400/metrics", ProbeOutcome.DENIED_NOT_IN_ALLOWLIST),
        ("http://169.254.169.254/latest/meta-data", ProbeOutcome.DENIED_FORBIDDEN_ADDRESS),
        ("http://dcgm.node:9400/metrics", ProbeOutcome.DENIED_FORBIDDEN_ADDRESS),
    ],
    ids=["outside", "metadata", "name-to-metadata"],
)
def test_a_dcgm_url_the_allowlist_refuses_denies_the_probe_before_any_read(
    make_fleet: MakeFleet, dcgm: str, expected: ProbeOutcome
) -> None:
    """The dcgm URL passes the targets' checks: 403, counted, logged, nothing read.

    A name goes through the same resolver; the target itself is not polled either.
    """
    pollers, reads = Pollers(), DcgmReads()
    resolve = Resolve({"dcgm.node": ["169.254.169.254"]})
    fleet = dcgm_fleet(make_fleet, reads, pollers=pollers, resolve=resolve, clock=Clock())
    admitted = ticket_with(fleet, "10.1.2.3:8000", {**GPU_PARAMS, "dcgm": dcgm})
    with capture_logs() as logs:
        refused = refusal(asyncio.run(fleet.probe(admitted, 5.0)))
    assert (refused.outcome, refused.status) == (expected, "403 Forbidden")
    assert refused.message.startswith("The dcgm URL not allowed")
    assert fleet.outcome_counts()[expected] == 1
    assert [(e["event"], e["what"]) for e in logs] == [("probe_denied", "The dcgm URL")]
    assert (pollers.made, reads.reads) == ([], [])


def ticket_with(fleet: Fleet, target: str, params: dict[str, str]) -> Ticket:
    """Enter ``target`` with ``params``; it must be admitted."""
    admitted = fleet.enter(target, CLIENT, params)
    assert isinstance(admitted, Ticket), admitted
    return admitted


def test_a_dcgm_host_name_is_read_at_the_addresses_it_was_checked_at(
    make_fleet: MakeFleet,
) -> None:
    """A name is resolved once per probe, checked, and the read pinned there (no rebinding)."""
    reads = DcgmReads()
    resolve = Resolve({"dcgm.node": ["10.0.3.9"]})
    fleet = dcgm_fleet(make_fleet, reads, resolve=resolve, clock=Clock())
    gpu_probe(fleet, "10.1.2.3:8000", {**GPU_PARAMS, "dcgm": "http://dcgm.node:9400/metrics"})
    assert resolve.asked == ["dcgm.node"]
    assert reads.reads == [
        ("http://dcgm.node:9400/metrics", Route(addresses=(ip("10.0.3.9"),), send_token=False))
    ]


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"dcgm": NODE}, "missing pod, namespace"),
        ({"pod": "llama-0", "namespace": "inference"}, "missing dcgm"),
        ({**GPU_PARAMS, "dcgm": "ftp://10.0.3.7/metrics"}, "dcgm must be an http://"),
        ({**GPU_PARAMS, "dcgm": "http://u:p@10.0.3.7:9400/metrics"}, "dcgm credentials"),
        ({**GPU_PARAMS, "dcgm": "http://10.0.3.7:9400/metrics?x=y"}, "dcgm must have no query"),
        ({**GPU_PARAMS, "dcgm": "http://127.1:9400/metrics"}, "non-standard form"),
        ({**GPU_PARAMS, "dcgm": "http://[::1/metrics"}, "dcgm is not a URL"),
        ({**GPU_PARAMS, "pod": "Llama 70b!"}, "pod is not a Kubernetes name"),
        ({**GPU_PARAMS, "namespace": "x" * 254}, "namespace is not a Kubernetes name"),
    ],
    ids=[
        "no-pod",
        "no-dcgm",
        "scheme",
        "credentials",
        "query",
        "odd-ipv4",
        "unclosed-ipv6",
        "pod-name",
        "namespace-length",
    ],
)
def test_bad_gpu_parameters_are_a_bad_target_in_one_line(
    make_fleet: MakeFleet, params: dict[str, str], said: str
) -> None:
    """400 at entry (no I/O), counted as bad_target, the line naming the parameter and why."""
    reads = DcgmReads()
    fleet = dcgm_fleet(make_fleet, reads, clock=Clock())
    refused = refusal(fleet.enter("10.1.2.3:8000", CLIENT, params))
    assert (refused.outcome, refused.status) == (ProbeOutcome.BAD_TARGET, "400 Bad Request")
    assert refused.message.startswith("Bad GPU parameters: ")
    assert said in refused.message
    assert "\n" not in refused.message
    assert fleet.outcome_counts()[ProbeOutcome.BAD_TARGET] == 1
    assert reads.reads == []


def test_gpu_parameters_without_gpu_source_dcgm_are_refused_not_ignored(
    make_fleet: MakeFleet,
) -> None:
    """A fleet without the dcgm source says so rather than answer without the GPUs asked for."""
    refused = refusal(make_fleet().enter("10.1.2.3:8000", CLIENT, GPU_PARAMS))
    assert refused.outcome is ProbeOutcome.BAD_TARGET
    assert "gpu_source=dcgm" in refused.message


def test_without_the_dcgm_source_a_target_has_no_gpu_source(make_fleet: MakeFleet) -> None:
    """gpu_source none (no shared answers): pollers are made without GPUs, as before."""
    pollers = Pollers()
    probe(make_fleet(pollers=pollers), "10.1.2.3:8000")
    assert pollers.made[0].gpus is None
