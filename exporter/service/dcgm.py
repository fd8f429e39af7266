"""The dcgm-exporter GPU source: one bounded GET of the node's dcgm-exporter per poll.

The answer is parsed by the project's own exposition parser (only the four
``DCGM_FI_DEV_FB_*`` families; every other line costs a dictionary miss), turned into devices and
this pod's GPUs by :mod:`exporter.gpu.dcgm` (the pure core), and into the same views the NVML
source gives (:func:`~exporter.gpu.memory.gpu_views`). docs/kubernetes.md, "Choosing the GPU
source", says what it needs, costs and cannot tell.

Fleet mode reads the same answers per probe: each probe names its target's pod and the
dcgm-exporter of that pod's node (:class:`DcgmRequest`); the answers are shared by the targets
of a node (:class:`SharedDcgmAnswers`) and each target's GPUs picked from them exactly as the
sidecar picks its own (:class:`FleetDcgmSource`, :func:`answer_views`). docs/kubernetes.md,
"GPU memory in fleet mode".
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import httpx
import structlog

from exporter.core.reasons import DcgmReason, VisibilityState
from exporter.errors import ParseError, SourceError
from exporter.gpu.dcgm import (
    FAMILIES,
    FLEET_FIXES,
    MAX_SAMPLES,
    SIDECAR_FIXES,
    DcgmAnswer,
    pick_devices,
    read_dcgm_samples,
)
from exporter.gpu.memory import gpu_views
from exporter.gpu.model import GpuSnapshot
from exporter.gpu.visibility import discover_gpu_visibility
from exporter.service.allowlist import redact_url
from exporter.vllm.client import check_head, connection_refused
from exporter.vllm.promtext import parse_exposition, wanted_families

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection, Sequence

    from exporter.core.views import GpuMemoryView
    from exporter.gpu.dcgm import PickFixes, PodIdentity
    from exporter.gpu.model import GpuSelector
    from exporter.gpu.visibility import GpuVisibility
    from exporter.service.allowlist import ProbeTarget

log = structlog.get_logger(__name__)

# Exact names only: DCGM fields are gauges, and a DCGM_FI_DEV_FB_USED_total is something else.
_WANTED: Final = wanted_families(FAMILIES, suffixes=())

#: Largest answer read: dcgm-exporter's defaults on 8 GPUs are some 60 KB, 8 MiB is room for
#: every profiling field on 64 GPUs.
MAX_ANSWER_BYTES: Final = 8 * 1024 * 1024


def parse_dcgm_metrics(payload: bytes | str) -> DcgmAnswer:
    """The memory fields of every device of a dcgm-exporter answer. Raises :class:`SourceError`."""
    try:
        exposition = parse_exposition(payload, _WANTED, max_samples=MAX_SAMPLES)
    except ParseError as exc:
        raise SourceError(DcgmReason.PARSE_ERROR, str(exc)) from None
    if exposition.overflow:
        msg = f"more than {MAX_SAMPLES} memory series: not one node's dcgm-exporter"
        raise SourceError(DcgmReason.TOO_LARGE, msg)
    return read_dcgm_samples(exposition.samples, too_long=exposition.too_long)


def answer_views(
    answer: DcgmAnswer,
    gpu_memory_utilization: float | None,
    *,
    explicit: Sequence[GpuSelector] = (),
    pod: PodIdentity | None = None,
    discovered: Callable[[], tuple[tuple[GpuSelector, ...], str]] | None = None,
    where: str = "dcgm-exporter",
    fixes: PickFixes = SIDECAR_FIXES,
) -> tuple[tuple[GpuMemoryView, ...], SourceError | None]:
    """Views of the pod's GPUs in a parsed answer (:func:`pick_devices`), and the failure if any.

    The one way from an answer to views, for the sidecar's source and fleet mode's alike.
    """
    picked, failure = pick_devices(
        answer, explicit=explicit, pod=pod, discovered=discovered, where=where, fixes=fixes
    )
    snapshot = GpuSnapshot(gpus=tuple(device.reading() for device in picked))
    return gpu_views(snapshot, None, gpu_memory_utilization), failure


class DcgmFetcher:
    """One bounded GET of dcgm-exporter's ``/metrics``: ``max_bytes``, ``timeout_s`` in all.

    httpx's timeouts bound each operation; the deadline checked between chunks bounds the
    whole answer, so that a server dripping a byte a second cannot hold the thread. Blocking:
    the poller runs it in its GPU thread. No redirect is followed, no proxy from the
    environment used, no compressed answer accepted.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        max_bytes: int = MAX_ANSWER_BYTES,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._url = url
        self._shown = redact_url(url)
        self._timeout = timeout_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._client = httpx.Client(
            timeout=timeout_s,
            follow_redirects=False,
            trust_env=False,
            headers={"Accept": "text/plain", "Accept-Encoding": "identity"},
            transport=transport,
        )

    @property
    def shown(self) -> str:
        """The URL as logs show it (no password)."""
        return self._shown

    def __call__(self) -> bytes:
        """The answer's body, or :class:`SourceError` with a :class:`DcgmReason`."""
        deadline = self._clock() + self._timeout
        where = f"GET {self._shown}"
        try:
            with self._client.stream("GET", self._url) as response:
                check_head(response, self._shown, self._max_bytes)
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self._max_bytes:
                        msg = f"{where} is larger than {self._max_bytes} bytes"
                        raise SourceError(DcgmReason.TOO_LARGE, msg)
                    if self._clock() > deadline:
                        msg = f"{where} took longer than {self._timeout:g}s"
                        raise SourceError(DcgmReason.TIMEOUT, msg)
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.TimeoutException:
            raise SourceError(DcgmReason.TIMEOUT, f"{where} timed out") from None
        except httpx.ConnectError as exc:
            reason = (
                DcgmReason.CONNECTION_REFUSED
                if connection_refused(exc)
                else DcgmReason.CONNECTION_ERROR
            )
            raise SourceError(reason, f"{where}: connection failed ({reason})") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            msg = f"{where}: {type(exc).__name__}"
            raise SourceError(DcgmReason.CONNECTION_ERROR, msg) from None

    def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._client.close()


class DcgmGpuSource:
    """The poller's GPU source over dcgm-exporter: this pod's GPUs, read on every poll."""

    #: The ``source`` label of its health gauges.
    source: Final = "dcgm"

    def __init__(
        self,
        fetch: Callable[[], bytes],
        *,
        where: str = "dcgm-exporter",
        explicit: Sequence[GpuSelector] = (),
        pod: PodIdentity | None = None,
        proc_root: Path = Path("/proc"),
        discover: Callable[..., GpuVisibility] = discover_gpu_visibility,
        from_process: bool = True,
        close: Callable[[], None] | None = None,
    ) -> None:
        self._fetch = fetch
        self._where = where
        self._explicit = tuple(explicit)
        self._pod = pod
        self._proc_root = proc_root
        self._discover = discover
        self._from_process = from_process
        self._close = close

    @classmethod
    def from_settings(
        cls,
        url: str,
        *,
        gpus: Sequence[GpuSelector],
        pod: PodIdentity | None,
        proc_root: Path,
        timeout_s: float,
        from_process: bool = True,
        node: str | None = None,
    ) -> DcgmGpuSource:
        """Read ``url`` within ``timeout_s`` (the settings have checked every value).

        ``from_process``: fall back on the GPU UUIDs of vLLM's environment (``gpu_discovery``
        auto). ``node`` is named in error lines: the exporter read must be that node's.
        """
        fetcher = DcgmFetcher(url, timeout_s=timeout_s)
        on = f" (pod on node {node})" if node else ""
        return cls(
            fetcher,
            where=f"dcgm-exporter {fetcher.shown}{on}",
            explicit=gpus,
            pod=pod,
            proc_root=proc_root,
            from_process=from_process,
            close=fetcher.close,
        )

    def _discovered(self) -> tuple[tuple[GpuSelector, ...], str]:
        visibility = self._discover(explicit=(), proc_root=self._proc_root)
        if visibility.state is not VisibilityState.FROM_PROCESS:
            return (), visibility.detail
        return visibility.selectors, visibility.detail

    def read(
        self, gpu_memory_utilization: float | None
    ) -> tuple[tuple[GpuMemoryView, ...], SourceError | None]:
        """Views of the pod's GPUs, and the failure if any. Never raises a SourceError."""
        try:
            answer = parse_dcgm_metrics(self._fetch())
        except SourceError as exc:
            return (), exc
        return answer_views(
            answer,
            gpu_memory_utilization,
            explicit=self._explicit,
            pod=self._pod,
            discovered=self._discovered if self._from_process else None,
            where=self._where,
        )

    def close(self) -> None:
        """Close the HTTP client."""
        if self._close is not None:
            self._close()


# --------------------------------------------------------------------------------------------
# Fleet mode: one answer per node, shared by its targets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DcgmRequest:
    """What a fleet probe names for its target's GPUs: its node's dcgm-exporter and its pod.

    Part of the target's identity: the same vLLM URL named with another pod is another target,
    whose GPU figures never mix with the first's.
    """

    endpoint: ProbeTarget
    pod: PodIdentity

    @property
    def url(self) -> str:
        """The dcgm-exporter URL, normalised (the shared answers' key)."""
        return self.endpoint.url


#: Bytes one device of a held answer is counted for, besides its strings (a slotted
#: dataclass, its floats, its tuple slot and its pods' set).
DEVICE_BYTES: Final = 512
#: Bytes one pod of a device is counted for, besides its name and namespace.
POD_BYTES: Final = 160


def answer_bytes(answer: DcgmAnswer | SourceError) -> int:
    """What a held answer is counted for: an estimate of its memory, from its devices' strings.

    An answer's devices are bounded by count (:data:`~exporter.gpu.dcgm.MAX_SAMPLES`) but not
    by the length of their labels: the estimate bounds what many answers hold together.
    """
    if isinstance(answer, SourceError):
        return DEVICE_BYTES + len(str(answer))
    total = 0
    for device in answer.devices:
        total += DEVICE_BYTES + len(device.uuid) + len(device.model_name)
        total += len(device.instance or "") + len(device.profile or "")
        total += sum(POD_BYTES + len(p.name) + len(p.namespace) for p in device.pods)
    return total


class SharedDcgmAnswers:
    """dcgm-exporter answers in fleet mode, shared by the targets of one node.

    The vLLM pods of a node name one dcgm-exporter: each URL is read at most once per
    ``max_age_seconds`` (a failure too: a dead exporter costs one read per period, not one
    per target), probes asking while a read runs share it, and at most ``max_entries`` URLs
    and ``max_bytes`` of parsed answers (:func:`answer_bytes`) are held, the oldest read
    forgotten first (the fleet also drops those no remembered target names: :meth:`retain`).
    ``fetch`` does the bounded, pinned read. Used from the event loop; :meth:`latest` also
    from the pollers' GPU threads (one dictionary look-up).
    """

    def __init__(
        self,
        fetch: Callable[[str], Awaitable[bytes]],
        *,
        max_age_seconds: float,
        max_entries: int,
        max_bytes: int = 8 * 2**20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._max_age = max_age_seconds
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._clock = clock
        self._answers: OrderedDict[str, tuple[float, DcgmAnswer | SourceError]] = OrderedDict()
        #: answer_bytes of each held answer, and their sum.
        self._sizes: dict[str, int] = {}
        self.held_bytes = 0
        self._pending: dict[str, asyncio.Task[None]] = {}
        #: Reads made (not answered from what is held), for tests and logs.
        self.reads = 0

    def __len__(self) -> int:
        return len(self._answers)

    async def refresh(self, url: str) -> None:
        """Read ``url`` unless an answer younger than ``max_age_seconds`` is held. Never raises.

        The read is a task of its own, started in the caller's context (the route its probe
        checked): a probe that gives up leaves it running for the others.
        """
        held = self._answers.get(url)
        if held is not None and self._clock() - held[0] < self._max_age:
            return
        task = self._pending.get(url)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read(url))
            self._pending[url] = task
            task.add_done_callback(lambda _: self._pending.pop(url, None))
            self.reads += 1
        await asyncio.shield(task)

    async def _read(self, url: str) -> None:
        shown = f"dcgm-exporter {redact_url(url)}"
        result: DcgmAnswer | SourceError
        try:
            result = parse_dcgm_metrics(await self._fetch(url))
        except SourceError as exc:
            result = SourceError(exc.reason, f"{shown}: {exc}")
        except Exception as exc:  # a bug must not end the probes: one traceback, then data
            log.exception("dcgm_read_crashed", url=redact_url(url))
            result = SourceError(DcgmReason.CALL_FAILED, f"{shown}: {type(exc).__name__}")
        size = answer_bytes(result)
        if size > self._max_bytes:
            result = SourceError(
                DcgmReason.TOO_LARGE,
                f"{shown}: its memory series take more than the {self._max_bytes} bytes all "
                "held answers may: not one node's dcgm-exporter",
            )
            size = answer_bytes(result)
        self._forget(url)
        self._answers[url] = (self._clock(), result)
        self._sizes[url] = size
        self.held_bytes += size
        while len(self._answers) > self._max_entries or self.held_bytes > self._max_bytes:
            self._forget(next(iter(self._answers)))

    def _forget(self, url: str) -> None:
        if self._answers.pop(url, None) is not None:
            self.held_bytes -= self._sizes.pop(url)

    def latest(self, url: str) -> DcgmAnswer | SourceError | None:
        """The latest answer read from ``url`` (or why it failed); None before the first."""
        held = self._answers.get(url)
        return None if held is None else held[1]

    def retain(self, urls: Collection[str]) -> None:
        """Forget the answers of every URL but ``urls`` (those the remembered targets name)."""
        for url in [u for u in self._answers if u not in urls]:
            self._forget(url)


class FleetDcgmSource:
    """A fleet target's GPU source: its pod's GPUs in its node's shared dcgm-exporter answer.

    The fleet refreshes the answer (pinned to the addresses its probe checked) before each
    poll; picking the pod's GPUs here is CPU only. Without a request (the probe named no
    dcgm-exporter), every read fails with ``not_given``.
    """

    #: The ``source`` label of its health gauges.
    source: Final = "dcgm"

    def __init__(self, answers: SharedDcgmAnswers, request: DcgmRequest | None) -> None:
        self._answers = answers
        self._request = request

    def read(
        self, gpu_memory_utilization: float | None
    ) -> tuple[tuple[GpuMemoryView, ...], SourceError | None]:
        """Views of the target's GPUs, and the failure if any. Never raises a SourceError."""
        request = self._request
        if request is None:
            return (), SourceError(
                DcgmReason.NOT_GIVEN,
                "the probe named no dcgm-exporter: give /probe the dcgm=, pod= and namespace= "
                "parameters (the chart's fleet discovery does with gpu.source=dcgm)",
            )
        where = f"dcgm-exporter {redact_url(request.url)} (pod {request.pod})"
        latest = self._answers.latest(request.url)
        if latest is None:
            return (), SourceError(DcgmReason.TIMEOUT, f"{where} has not answered yet")
        if isinstance(latest, SourceError):
            return (), latest
        return answer_views(
            latest, gpu_memory_utilization, pod=request.pod, where=where, fixes=FLEET_FIXES
        )

    def close(self) -> None:
        """Nothing to release: the shared answers are the fleet's."""
