"""Specification of fleet mode's targets: admission, one poller per target, bounds and timeouts."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import TYPE_CHECKING

import pytest
from structlog.testing import capture_logs

from exporter.core.reasons import ProbeOutcome
from exporter.core.views import TargetView
from exporter.service.allowlist import parse_allowlist
from exporter.service.fleet import Fleet

if TYPE_CHECKING:
    from exporter.service.allowlist import IPAddress


class Clock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class FakePoller:
    """A poller that returns a bare view of its target, or never answers when ``hangs``."""

    def __init__(self, url: str, *, hangs: bool = False) -> None:
        self.url = url
        self.hangs = hangs
        self.polls = 0

    async def poll_once(self) -> TargetView:
        """Count the poll and answer (or wait forever)."""
        self.polls += 1
        if self.hangs:
            await asyncio.Event().wait()
        return TargetView(target=self.url)


class Pollers:
    """The injected ``make_poller``: records every poller it makes, by URL."""

    def __init__(self, *, hangs: bool = False) -> None:
        self.hangs = hangs
        self.made: list[FakePoller] = []

    def __call__(self, url: str) -> FakePoller:
        poller = FakePoller(url, hangs=self.hangs)
        self.made.append(poller)
        return poller

    @property
    def urls(self) -> list[str]:
        """The URLs pollers were made for, in order."""
        return [p.url for p in self.made]


class Resolver:
    """The injected name resolution: fixed answers per host, every lookup recorded."""

    def __init__(self, answers: dict[str, list[str]] | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[IPAddress]:
        self.asked.append(host)
        return [ipaddress.ip_address(a) for a in self.answers.get(host, [])]


def make_fleet(
    *,
    allow: tuple[str, ...] = ("10.0.0.0/8",),
    pollers: Pollers | None = None,
    resolve: Resolver | None = None,
    clock: Clock | None = None,
    max_targets: int = 10,
    ttl_seconds: float = 600.0,
) -> Fleet:
    """A fleet over the fakes (10.0.0.0/8 allowed unless said otherwise)."""
    return Fleet(
        allowlist=parse_allowlist(allow),
        make_poller=pollers or Pollers(),  # type: ignore[arg-type]
        max_targets=max_targets,
        ttl_seconds=ttl_seconds,
        resolve=resolve or Resolver(),
        clock=clock or Clock(),
    )


def probe(fleet: Fleet, target: str, timeout_seconds: float = 5.0) -> TargetView | None:
    """Admit ``target`` (it must be allowed) and probe it once."""
    admitted = fleet.admit(target).target
    assert admitted is not None
    return asyncio.run(fleet.probe(admitted, timeout_seconds))


def test_every_outcome_is_counted_from_zero() -> None:
    """A new fleet counts each ProbeOutcome at 0, so that rate() sees the first one."""
    assert make_fleet().outcome_counts() == dict.fromkeys(ProbeOutcome, 0)


def test_an_allowed_address_is_admitted_without_counting_anything_yet() -> None:
    """A literal address inside an allowed network is admitted with its normalised URL."""
    fleet = make_fleet()
    admission = fleet.admit("10.1.2.3:8000")
    assert admission.outcome is ProbeOutcome.OK
    assert admission.target is not None
    assert admission.target.url == "http://10.1.2.3:8000"
    assert sum(fleet.outcome_counts().values()) == 0


def test_a_bad_url_is_refused_as_bad_target_and_counted() -> None:
    """A target that is no http(s) base URL is bad_target, with a message saying why."""
    fleet = make_fleet()
    admission = fleet.admit("ftp://10.1.2.3:21")
    assert admission.target is None
    assert admission.outcome is ProbeOutcome.BAD_TARGET
    assert admission.message.startswith("Bad target: ")
    assert fleet.outcome_counts()[ProbeOutcome.BAD_TARGET] == 1


def test_an_address_outside_the_allowlist_is_denied_and_logged() -> None:
    """192.168.1.1 outside 10.0.0.0/8 is denied_not_in_allowlist, counted and logged."""
    fleet = make_fleet()
    with capture_logs() as logs:
        admission = fleet.admit("http://192.168.1.1:8000")
    assert admission.target is None
    assert admission.outcome is ProbeOutcome.DENIED_NOT_IN_ALLOWLIST
    assert admission.message == "Target not allowed (not in allowlist)."
    assert fleet.outcome_counts()[ProbeOutcome.DENIED_NOT_IN_ALLOWLIST] == 1
    assert [(e["event"], e["reason"], e["host"]) for e in logs] == [
        ("probe_denied", "not_in_allowlist", "192.168.1.1")
    ]


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "0.0.0.0",  # noqa: S104 (a target to refuse, not an address we bind)
        "[::ffff:169.254.169.254]",
        "224.0.0.1",
    ],
)
def test_forbidden_addresses_are_denied_even_when_the_allowlist_covers_them(address: str) -> None:
    """Metadata, unspecified and multicast addresses are forbidden even under 0.0.0.0/0."""
    fleet = make_fleet(allow=("0.0.0.0/0", "::/0"))
    admission = fleet.admit(f"http://{address}:8000")
    assert admission.outcome is ProbeOutcome.DENIED_FORBIDDEN_ADDRESS
    assert fleet.outcome_counts()[ProbeOutcome.DENIED_FORBIDDEN_ADDRESS] == 1


def test_a_literal_address_is_never_resolved() -> None:
    """Only host names go through the injected resolver."""
    resolve = Resolver()
    make_fleet(resolve=resolve).admit("http://10.1.2.3:8000")
    assert resolve.asked == []


@pytest.mark.parametrize(
    ("addresses", "outcome"),
    [
        (["10.0.0.5", "10.9.9.9"], ProbeOutcome.OK),
        (["10.0.0.5", "192.168.1.1"], ProbeOutcome.DENIED_NOT_IN_ALLOWLIST),
        ([], ProbeOutcome.DENIED_NOT_IN_ALLOWLIST),
        (["10.0.0.5", "169.254.169.254"], ProbeOutcome.DENIED_FORBIDDEN_ADDRESS),
    ],
    ids=["all-inside", "one-outside", "unresolved", "one-forbidden"],
)
def test_a_host_name_is_allowed_only_when_every_address_it_resolves_to_is_inside(
    addresses: list[str], outcome: ProbeOutcome
) -> None:
    """A name is judged by all of its resolved addresses, asked of the injected resolver."""
    resolve = Resolver({"vllm.svc": addresses})
    fleet = make_fleet(resolve=resolve)
    assert fleet.admit("http://vllm.svc:8000").outcome is outcome
    assert resolve.asked == ["vllm.svc"]


def test_a_name_entry_cannot_admit_a_name_resolving_to_a_forbidden_address() -> None:
    """A name matching a name entry is still denied when it resolves to the metadata address."""
    resolve = Resolver({"vllm.svc": ["169.254.169.254"]})
    fleet = make_fleet(allow=("vllm.svc",), resolve=resolve)
    assert fleet.admit("vllm.svc:8000").outcome is ProbeOutcome.DENIED_FORBIDDEN_ADDRESS


def test_a_probe_polls_once_returns_the_view_and_counts_ok() -> None:
    """An admitted target is polled through its poller; the view comes back and ok is counted."""
    pollers = Pollers()
    fleet = make_fleet(pollers=pollers)
    view = probe(fleet, "10.1.2.3:8000")
    assert view is not None
    assert view.target == "http://10.1.2.3:8000"
    assert pollers.urls == ["http://10.1.2.3:8000"]
    assert fleet.outcome_counts()[ProbeOutcome.OK] == 1
    assert fleet.target_count == 1


def test_one_poller_per_target_url_is_made_and_reused() -> None:
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


def test_a_target_not_probed_for_longer_than_the_ttl_is_forgotten_on_the_next_probe() -> None:
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


def test_a_stale_target_stays_remembered_while_no_probe_comes() -> None:
    """Eviction happens on probes, not on a timer: the count holds until the next probe."""
    clock = Clock()
    fleet = make_fleet(clock=clock, ttl_seconds=60.0)
    probe(fleet, "10.0.0.1:8000")
    clock.now += 3_600.0
    assert (fleet.target_count, fleet.evictions) == (1, 0)


def test_the_bound_on_targets_evicts_the_least_recently_probed() -> None:
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


def test_a_probe_that_outlives_its_timeout_counts_timeout_and_returns_none() -> None:
    """A poll still running at timeout_seconds is abandoned: None, timeout counted, not ok."""
    fleet = make_fleet(pollers=Pollers(hangs=True))
    assert probe(fleet, "10.1.2.3:8000", timeout_seconds=0.01) is None
    counts = fleet.outcome_counts()
    assert (counts[ProbeOutcome.TIMEOUT], counts[ProbeOutcome.OK]) == (1, 0)
    assert fleet.target_count == 1  # the target's window is kept for the next probe


def test_outcome_counts_is_a_copy() -> None:
    """Changing the returned counts does not change the fleet's own."""
    fleet = make_fleet()
    fleet.outcome_counts()[ProbeOutcome.OK] = 99
    assert fleet.outcome_counts()[ProbeOutcome.OK] == 0
