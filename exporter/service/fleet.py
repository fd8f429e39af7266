"""Fleet mode: ``/probe?target=URL`` for many vLLM instances that Prometheus discovers.

Like blackbox_exporter, each probe is one poll of the target, made when Prometheus scrapes;
unlike it, we keep a window of samples per target (rates and context quantiles need history),
in a bounded, age-limited map. Targets must pass the allowlist (``exporter.service.allowlist``): the
exporter is no open proxy. Refusals are counted by outcome and never reach the network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from exporter.core.reasons import ProbeOutcome
from exporter.service.allowlist import AllowlistError, IPAddress, is_allowed, parse_target

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.core.views import TargetView
    from exporter.service.allowlist import AllowEntry, ProbeTarget
    from exporter.service.poller import TargetPoller

log = structlog.get_logger(__name__)


def resolve_host(host: str) -> list[IPAddress]:
    """Addresses a host name resolves to (blocking); empty when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    addresses: list[IPAddress] = []
    for info in infos:
        try:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        except ValueError:
            continue
        if address not in addresses:
            addresses.append(address)
    return addresses


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on a probe target: a parsed target, or an outcome and a message."""

    target: ProbeTarget | None
    outcome: ProbeOutcome
    message: str = ""


@dataclass(slots=True)
class _Entry:
    poller: TargetPoller
    last_probe: float


class Fleet:
    """The targets fleet mode remembers, and the checks every probe passes first."""

    def __init__(
        self,
        *,
        allowlist: Sequence[AllowEntry],
        make_poller: Callable[[str], TargetPoller],
        max_targets: int,
        ttl_seconds: float,
        resolve: Callable[[str], list[IPAddress]] = resolve_host,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allowlist = tuple(allowlist)
        self._make_poller = make_poller
        self._max_targets = max_targets
        self._ttl = ttl_seconds
        self._resolve = resolve
        self._clock = clock
        self._targets: OrderedDict[str, _Entry] = OrderedDict()
        # Every outcome from 0, so that rate() sees the first refusal (a series born at 1 hides
        # it). Counted under a lock: admit() runs in HTTP threads, probe() on the event loop.
        self.outcomes: Counter[str] = Counter(dict.fromkeys(ProbeOutcome, 0))
        self._outcomes_lock = threading.Lock()
        self.evictions = 0

    @property
    def target_count(self) -> int:
        """Targets remembered now."""
        return len(self._targets)

    def outcome_counts(self) -> dict[str, int]:
        """A consistent copy of the probe outcomes counted so far."""
        with self._outcomes_lock:
            return dict(self.outcomes)

    def _count(self, outcome: str) -> None:
        with self._outcomes_lock:
            self.outcomes[outcome] += 1

    def admit(self, target: str) -> Admission:
        """Parse and check a target against the allowlist (resolving its name: blocking I/O)."""
        try:
            parsed = parse_target(target)
        except AllowlistError as exc:
            self._count(ProbeOutcome.BAD_TARGET)
            return Admission(None, ProbeOutcome.BAD_TARGET, f"Bad target: {exc}.")
        resolved = self._resolve(parsed.host) if parsed.address is None else []
        allowed, reason = is_allowed(parsed, self._allowlist, resolved)
        if not allowed:
            outcome = ProbeOutcome(f"denied_{reason}")
            self._count(outcome)
            log.warning("probe_denied", reason=reason, host=parsed.host, port=parsed.port)
            return Admission(None, outcome, f"Target not allowed ({reason.replace('_', ' ')}).")
        return Admission(parsed, ProbeOutcome.OK)

    def _evict(self, now: float) -> None:
        while self._targets:
            url, entry = next(iter(self._targets.items()))
            if len(self._targets) <= self._max_targets and entry.last_probe >= now - self._ttl:
                break
            del self._targets[url]
            self.evictions += 1
            log.info("probe_target_forgotten", target=url)

    async def probe(self, target: ProbeTarget, timeout_seconds: float) -> TargetView | None:
        """Poll an admitted target once; ``None`` if the poll outlived ``timeout_seconds``."""
        now = self._clock()
        entry = self._targets.get(target.url)
        if entry is None:
            entry = _Entry(self._make_poller(target.url), now)
            self._targets[target.url] = entry
        entry.last_probe = now
        self._targets.move_to_end(target.url)
        self._evict(now)
        try:
            view = await asyncio.wait_for(entry.poller.poll_once(), timeout=timeout_seconds)
        except TimeoutError:
            self._count(ProbeOutcome.TIMEOUT)
            return None
        self._count(ProbeOutcome.OK)
        return view
