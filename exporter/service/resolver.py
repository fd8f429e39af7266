"""Host names resolved off the request threads, with a bounded budget and a memory.

Fleet mode checks a probe target's addresses before it connects (a name must not lead to the
cloud metadata service), so names are resolved for every new target. The resolver the
operating system offers blocks, and a name whose DNS never answers blocks for the resolver's
whole timeout. Here:

- lookups run in threads of their own, at most ``max_concurrent`` at once (a lookup that
  outlives its ``timeout_seconds`` keeps its slot until the system resolver gives up: slots
  measure the threads really busy), and a lookup beyond that is refused at once;
- the same name asked twice while a lookup runs shares that lookup;
- answers are remembered for ``ttl_seconds``, failures (no address, timeout) for
  ``negative_ttl_seconds``: a name that never answers costs one lookup per period, however
  many probes ask for it;
- the memory holds at most ``max_entries`` names (oldest forgotten first).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.service.allowlist import IPAddress


def system_resolve(host: str) -> list[IPAddress]:
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


class Lookup(StrEnum):
    """How a lookup ended when it gave no address."""

    #: The name has no address (or the lookup failed).
    NOT_FOUND = "not_found"
    #: The system resolver did not answer within the time allowed.
    TIMEOUT = "timeout"
    #: Every lookup slot is busy: the name was not looked up.
    BUSY = "busy"


@dataclass(frozen=True, slots=True)
class Resolution:
    """The addresses of a name, or why there are none."""

    addresses: tuple[IPAddress, ...] = ()
    failure: Lookup | None = None


class BoundedResolver:
    """Resolves names on its own threads, within a budget, remembering answers for a while."""

    def __init__(
        self,
        *,
        resolve: Callable[[str], list[IPAddress]] = system_resolve,
        max_concurrent: int = 4,
        timeout_seconds: float = 2.0,
        ttl_seconds: float = 30.0,
        negative_ttl_seconds: float = 30.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve = resolve
        self._max_concurrent = max_concurrent
        self._timeout = timeout_seconds
        self._ttl = ttl_seconds
        self._negative_ttl = negative_ttl_seconds
        self._max_entries = max_entries
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_concurrent, thread_name_prefix="resolver")
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._memory: OrderedDict[str, tuple[float, Resolution]] = OrderedDict()
        self._pending: dict[str, asyncio.Task[Resolution]] = {}
        self._closed = False
        #: Lookups made (not answered from memory), for tests and logs.
        self.lookups = 0

    async def resolve(self, host: str) -> Resolution:
        """The addresses of ``host`` (run on the event loop; never raises).

        The lookup runs as a task of its own: a caller that gives up (its probe's time ran
        out) leaves it running for the others asking for the same name, and for the memory.
        """
        now = self._clock()
        remembered = self._memory.get(host)
        if remembered is not None and remembered[0] > now:
            return remembered[1]
        task = self._pending.get(host)
        if task is None:
            if self._closed or not self._reserve():
                return Resolution(failure=Lookup.BUSY)
            task = asyncio.get_running_loop().create_task(self._look_up(host))
            self._pending[host] = task
            task.add_done_callback(lambda _: self._pending.pop(host, None))
            self.lookups += 1
        return await asyncio.shield(task)

    async def _look_up(self, host: str) -> Resolution:
        loop = asyncio.get_running_loop()
        try:
            work = loop.run_in_executor(self._executor, self._lookup, host)
        except RuntimeError:  # closed meanwhile: the slot was taken, give it back
            self._release()
            return Resolution(failure=Lookup.BUSY)
        try:
            addresses = await asyncio.wait_for(asyncio.shield(work), self._timeout)
        except TimeoutError:
            resolution = Resolution(failure=Lookup.TIMEOUT)
        else:
            failure = None if addresses else Lookup.NOT_FOUND
            resolution = Resolution(tuple(addresses), failure)
        self._remember(host, resolution)
        return resolution

    def _reserve(self) -> bool:
        with self._busy_lock:
            if self._busy >= self._max_concurrent:
                return False
            self._busy += 1
            return True

    def _release(self) -> None:
        with self._busy_lock:
            self._busy -= 1

    def _lookup(self, host: str) -> list[IPAddress]:
        # The slot is freed when the system resolver returns, not when the caller gave up.
        try:
            return self._resolve(host)
        finally:
            self._release()

    def _remember(self, host: str, resolution: Resolution) -> None:
        ttl = self._ttl if resolution.failure is None else self._negative_ttl
        self._memory[host] = (self._clock() + ttl, resolution)
        self._memory.move_to_end(host)
        while len(self._memory) > self._max_entries:
            self._memory.popitem(last=False)

    def close(self) -> None:
        """Stop the lookup threads (a lookup still running is abandoned); later lookups: BUSY."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
