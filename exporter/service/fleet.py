"""Fleet mode: ``/probe?target=URL`` for many vLLM instances that Prometheus discovers.

Like blackbox_exporter, each probe is one poll of the target, made when Prometheus scrapes;
unlike it, we keep a window of samples per target (rates and context quantiles need history),
in a bounded, age-limited map. Targets must pass the allowlist (``exporter.service.allowlist``):
the exporter is no open proxy. Refusals are counted by outcome and never reach the network.

Probes hold an HTTP thread while they run, and no client may hold them all: :meth:`Fleet.enter`
(on the HTTP thread, without I/O) admits a probe only while fewer than ``max_in_flight`` probes
run in all, fewer than ``max_per_client`` for the same client and fewer than ``max_per_target``
for the same target, so that the HTTP server always keeps slots for ``/metrics``. Everything
that waits on the network, name resolution included, runs on the event loop within the probe's
time limit (:meth:`Fleet.probe`), through a resolver with a budget of its own.

A probe connects only to the addresses it checked: the poll runs within a
:class:`~exporter.vllm.client.Route` of exactly those addresses (the pollers' clients are
pinned), so a name that resolves otherwise by the time of the connection (DNS rebinding) cannot
lead a request elsewhere. Whether the bearer token goes with the requests is decided by the same
probe, for the same addresses (``bearer_token_targets``), never once for a target's lifetime.

With ``gpu_source=dcgm`` a probe may also name its target's pod and the dcgm-exporter of that
pod's node (``dcgm``, ``pod`` and ``namespace`` parameters, which Prometheus's relabelling
knows). That URL is checked exactly as a target is (allowlist, forbidden addresses, the same
resolver, a pinned route), is never sent the bearer token, and its answer is read within the
fleet's answer budget, once per poll interval for all the targets of its node
(:class:`~exporter.service.dcgm.SharedDcgmAnswers`). The parameters are part of the target's
identity: the same URL named with another pod is another target.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from exporter.core.reasons import ProbeOutcome
from exporter.gpu.dcgm import PodIdentity, check_kubernetes_name
from exporter.service.allowlist import (
    AllowlistError,
    canonical_address,
    is_allowed,
    parse_endpoint,
    parse_target,
)
from exporter.service.dcgm import DcgmRequest, FleetDcgmSource
from exporter.service.resolver import BoundedResolver, Lookup
from exporter.vllm.client import Route, routed

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from exporter.core.views import TargetView
    from exporter.service.allowlist import AllowEntry, IPAddress, ProbeTarget
    from exporter.service.dcgm import SharedDcgmAnswers
    from exporter.service.memory import MemoryBudget
    from exporter.service.poller import GpuSource, TargetPoller

log = structlog.get_logger(__name__)

#: The HTTP status of each refusal.
STATUS: dict[ProbeOutcome, str] = {
    ProbeOutcome.BAD_TARGET: "400 Bad Request",
    ProbeOutcome.DENIED_NOT_IN_ALLOWLIST: "403 Forbidden",
    ProbeOutcome.DENIED_FORBIDDEN_ADDRESS: "403 Forbidden",
    ProbeOutcome.THROTTLED: "503 Service Unavailable",
    ProbeOutcome.TIMEOUT: "504 Gateway Timeout",
}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a probe got no figures: its outcome and a message for the HTTP answer."""

    outcome: ProbeOutcome
    message: str

    @property
    def status(self) -> str:
        """The HTTP status line of the answer."""
        return STATUS[self.outcome]


@dataclass(frozen=True, slots=True, eq=False)
class Ticket:
    """An admitted probe's place in the limits; give it back with :meth:`Fleet.leave`.

    Compared by identity: two probes of one target from one client hold two places.
    """

    target: ProbeTarget
    client: str
    #: The target's pod and its node's dcgm-exporter, when the probe named them.
    gpu: DcgmRequest | None = None


#: The probe parameters that name a target's GPUs (``gpu_source=dcgm``), given together.
GPU_PARAMS = ("dcgm", "pod", "namespace")


def parse_gpu_params(params: Mapping[str, str]) -> DcgmRequest | None:
    """The ``dcgm``, ``pod`` and ``namespace`` parameters of a probe; AllowlistError if bad.

    None when none is given. All three or none: a dcgm-exporter lists every GPU of its node,
    and only the pod tells which are the target's.
    """
    given = {name: params[name] for name in GPU_PARAMS if params.get(name)}
    if not given:
        return None
    missing = [name for name in GPU_PARAMS if name not in given]
    if missing:
        msg = f"give dcgm=, pod= and namespace= together (missing {', '.join(missing)})"
        raise AllowlistError(msg)
    try:
        endpoint = parse_endpoint(given["dcgm"])
    except AllowlistError as exc:
        raise AllowlistError(f"dcgm {exc}") from None
    names = []
    for name in ("pod", "namespace"):
        try:
            names.append(check_kubernetes_name(given[name]))
        except ValueError as exc:
            raise AllowlistError(f"{name} {exc}") from None
    return DcgmRequest(endpoint, PodIdentity(names[0], names[1]))


@dataclass(slots=True)
class _Entry:
    poller: TargetPoller
    last_probe: float
    gpu: DcgmRequest | None = None


class Fleet:
    """The targets fleet mode remembers, and the checks and limits every probe passes first."""

    def __init__(
        self,
        *,
        allowlist: Sequence[AllowEntry],
        make_poller: Callable[[ProbeTarget, GpuSource | None], TargetPoller],
        max_targets: int,
        ttl_seconds: float,
        resolver: BoundedResolver | None = None,
        token_targets: Sequence[AllowEntry] = (),
        max_in_flight: int = 48,
        max_per_client: int = 32,
        max_per_target: int = 4,
        dcgm: SharedDcgmAnswers | None = None,
        clock: Callable[[], float] = time.monotonic,
        memory: MemoryBudget | None = None,
    ) -> None:
        """``dcgm``: the shared dcgm-exporter answers (``gpu_source=dcgm``); None: no GPUs.

        ``memory``: the pollers' budget; given, a probe looks for targets it forgot only when
        it has forgotten one since (else every remembered target, on every probe).
        """
        self._allowlist = tuple(allowlist)
        self._make_poller = make_poller
        self._max_targets = max_targets
        self._ttl = ttl_seconds
        self._resolver = resolver or BoundedResolver()
        self._token_targets = tuple(token_targets)
        self._max_in_flight = max_in_flight
        self._max_per_client = max_per_client
        self._max_per_target = max_per_target
        self._dcgm = dcgm
        self._clock = clock
        self._memory = memory
        #: The budget's count of forgotten windows when the targets were last looked through.
        self._forgotten_seen = 0
        #: By target URL and what the probe named for its GPUs (part of its identity).
        self._targets: OrderedDict[tuple[str, DcgmRequest | None], _Entry] = OrderedDict()
        #: The window evictions of targets the memory budget forgot, until their next probe
        #: (their counters go on from there); as many as targets at most, the oldest dropped.
        self._forgotten: OrderedDict[tuple[str, DcgmRequest | None], dict[str, int]] = OrderedDict()
        # enter() and leave() run on HTTP threads, probe() on the event loop: one lock for the
        # counts they share.
        self._lock = threading.Lock()
        # Every outcome from 0, so that rate() sees the first refusal (a series born at 1 hides
        # it).
        self._outcomes: Counter[str] = Counter(dict.fromkeys(ProbeOutcome, 0))
        self._per_client: Counter[str] = Counter()
        self._per_target: Counter[str] = Counter()
        self._in_flight = 0
        #: Tickets admitted and not yet given back.
        self._admitted: set[Ticket] = set()
        self._evictions = 0

    @property
    def target_count(self) -> int:
        """Targets remembered now."""
        return len(self._targets)

    @property
    def evictions(self) -> int:
        """Targets forgotten since start (bound, age or memory)."""
        with self._lock:
            return self._evictions

    def outcome_counts(self) -> dict[str, int]:
        """A consistent copy of the probe outcomes counted so far."""
        with self._lock:
            return dict(self._outcomes)

    def _count(self, outcome: ProbeOutcome) -> None:
        with self._lock:
            self._outcomes[outcome] += 1

    def enter(
        self, target: str, client: str, params: Mapping[str, str] | None = None
    ) -> Ticket | Refusal:
        """Admit a probe into the limits (no I/O: on the HTTP thread), or refuse it.

        ``params``: the probe's other parameters (:data:`GPU_PARAMS`).
        """
        try:
            parsed = parse_target(target)
        except AllowlistError as exc:
            self._count(ProbeOutcome.BAD_TARGET)
            return Refusal(ProbeOutcome.BAD_TARGET, f"Bad target: {exc}.")
        try:
            gpu = parse_gpu_params(params or {})
        except AllowlistError as exc:
            self._count(ProbeOutcome.BAD_TARGET)
            return Refusal(ProbeOutcome.BAD_TARGET, f"Bad GPU parameters: {exc}.")
        if gpu is not None and self._dcgm is None:
            self._count(ProbeOutcome.BAD_TARGET)
            return Refusal(
                ProbeOutcome.BAD_TARGET,
                "Bad GPU parameters: dcgm=, pod= and namespace= are read only with "
                "gpu_source=dcgm; set it, or stop sending them.",
            )
        with self._lock:
            full = (
                self._in_flight >= self._max_in_flight
                or self._per_client[client] >= self._max_per_client
                or self._per_target[parsed.url] >= self._max_per_target
            )
            if full:
                self._outcomes[ProbeOutcome.THROTTLED] += 1
                return Refusal(
                    ProbeOutcome.THROTTLED,
                    "Too many probes in flight (in all, from this client, or of this target); "
                    "retry at the next scrape.",
                )
            self._in_flight += 1
            self._per_client[client] += 1
            self._per_target[parsed.url] += 1
            admitted = Ticket(parsed, client, gpu)
            self._admitted.add(admitted)
        return admitted

    def leave(self, ticket: Ticket) -> None:
        """Give an admitted probe's place back (once: leaving again changes nothing)."""
        with self._lock:
            if ticket not in self._admitted:
                return  # a second leave must not free a place another probe holds
            self._admitted.discard(ticket)
            self._in_flight -= 1
            for counts, key in (
                (self._per_client, ticket.client),
                (self._per_target, ticket.target.url),
            ):
                counts[key] -= 1
                if counts[key] <= 0:
                    del counts[key]

    async def probe(self, ticket: Ticket, timeout_seconds: float) -> TargetView | Refusal:
        """Check an admitted target's addresses, then poll it once, within ``timeout_seconds``."""
        try:
            return await asyncio.wait_for(self._probe(ticket), timeout=timeout_seconds)
        except TimeoutError:
            self._count(ProbeOutcome.TIMEOUT)
            return Refusal(ProbeOutcome.TIMEOUT, "The probe timed out.")

    async def _check(self, target: ProbeTarget, what: str) -> tuple[IPAddress, ...] | Refusal:
        """The addresses ``target`` may be reached at (resolved, allowed), or the refusal."""
        addresses: Sequence[IPAddress] = ()
        literal = target.address
        if literal is None:
            resolution = await self._resolver.resolve(target.host)
            if resolution.failure is Lookup.BUSY:
                self._count(ProbeOutcome.THROTTLED)
                return Refusal(
                    ProbeOutcome.THROTTLED, "Every name lookup is busy; retry at the next scrape."
                )
            addresses = tuple(canonical_address(a) for a in resolution.addresses)
        allowed, reason = is_allowed(target, self._allowlist, addresses)
        if not allowed:
            outcome = ProbeOutcome(f"denied_{reason}")
            self._count(outcome)
            log.warning(
                "probe_denied", reason=reason, host=target.host, port=target.port, what=what
            )
            return Refusal(outcome, f"{what} not allowed ({reason.replace('_', ' ')}).")
        return (literal,) if literal is not None else tuple(addresses)

    async def _probe(self, ticket: Ticket) -> TargetView | Refusal:
        target, gpu = ticket.target, ticket.gpu
        addresses = await self._check(target, "Target")
        if isinstance(addresses, Refusal):
            return addresses
        dcgm_route: Route | None = None
        if gpu is not None:
            checked = await self._check(gpu.endpoint, "The dcgm URL")
            if isinstance(checked, Refusal):
                return checked
            # Never the token: the dcgm URL is chosen by whoever can reach /probe.
            dcgm_route = Route(addresses=checked, send_token=False)
        # A probe target is chosen by whoever can reach /probe: it must not harvest vLLM's API
        # key unless a setting binds the token to it, for the addresses this probe checked.
        route = Route(
            addresses=addresses,
            send_token=is_allowed(target, self._token_targets, addresses)[0],
        )
        entry = self._entry(target, gpu)
        if self._dcgm is not None and gpu is not None and dcgm_route is not None:
            with routed(dcgm_route):
                await self._dcgm.refresh(gpu.url)
        with routed(route):
            view = await entry.poller.poll_once()
        self._drop_forgotten()
        self._count(ProbeOutcome.OK)
        return view

    def _drop_forgotten(self) -> None:
        """Drop the targets the memory budget forgot (their samples are gone already).

        Their pollers go with them, and so does what they held; their window evictions wait
        for their next probe, which starts them again. With the budget known, the targets are
        looked through only when it forgot one since the last look: a probe costs O(1), not
        O(targets).
        """
        if self._memory is not None:
            if self._memory.forgotten_count == self._forgotten_seen:
                return
            self._forgotten_seen = self._memory.forgotten_count
        gone = [key for key, entry in self._targets.items() if entry.poller.forgotten]
        for key in gone:
            entry = self._targets.pop(key)
            self._forgotten[key] = entry.poller.evictions
            while len(self._forgotten) > self._max_targets:
                self._forgotten.popitem(last=False)
            with self._lock:
                self._evictions += 1
            log.info("probe_target_forgotten", target=key[0], reason="memory")
        if gone and self._dcgm is not None:
            self._dcgm.retain({e.gpu.url for e in self._targets.values() if e.gpu is not None})

    def _entry(self, target: ProbeTarget, gpu: DcgmRequest | None) -> _Entry:
        """The target's poller (made on its first probe); forget the stale and the excess."""
        now = self._clock()
        key = (target.url, gpu)
        entry = self._targets.get(key)
        if entry is None:
            gpus = FleetDcgmSource(self._dcgm, gpu) if self._dcgm is not None else None
            entry = _Entry(self._make_poller(target, gpus), now, gpu)
            evictions = self._forgotten.pop(key, None)
            if evictions:
                entry.poller.carry_evictions(evictions)
            self._targets[key] = entry
        entry.last_probe = now
        self._targets.move_to_end(key)
        forgot = False
        while self._targets:
            (url, _), oldest = next(iter(self._targets.items()))
            if len(self._targets) <= self._max_targets and oldest.last_probe >= now - self._ttl:
                break
            self._targets.popitem(last=False)
            forgot = True
            with self._lock:
                self._evictions += 1
            log.info("probe_target_forgotten", target=url)
        if forgot and self._dcgm is not None:
            self._dcgm.retain({e.gpu.url for e in self._targets.values() if e.gpu is not None})
        return entry

    def close(self) -> None:
        """Stop the resolver's threads."""
        self._resolver.close()
