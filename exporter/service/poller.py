"""Polling one vLLM target: the imperative shell around the pure derivations.

A :class:`TargetPoller` owns one target's window of samples and the health of its sources.
Each :meth:`TargetPoller.poll_once` reads ``/metrics`` (and, at start, after a restart or after
an outage, ``/v1/models`` and ``/version``), reads the GPUs, asks the predictor for the sizing
figures, derives, and publishes a new immutable :class:`~exporter.core.views.TargetView`. Failures
are data: they mark a source down with a bounded reason and are logged once per change of
state, not once per poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog

from exporter.core.ceiling import QueueCaps
from exporter.core.derive import (
    RestartBaseline,
    RestartEvidence,
    Sample,
    TargetDerived,
    WindowSettings,
    carried,
    derive_target,
    next_sample,
    restart_baseline,
    restart_evidence,
)
from exporter.core.footprint import state_bytes
from exporter.core.reasons import HttpReason, Source
from exporter.core.views import PredictionView, SourceHealth, TargetInfo, TargetView
from exporter.errors import ParseError, SourceError
from exporter.service.memory import MemoryBudget, Window
from exporter.sizing.limits import LimitInputs, resolve_running_limit

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from concurrent.futures import Executor

    from exporter.core.ceiling import RunningLimit
    from exporter.core.snapshot import VllmSnapshot
    from exporter.core.views import GpuMemoryView
    from exporter.vllm.client import ModelsInfo, VllmClient
    from exporter.vllm.launch import LaunchFlags

log = structlog.get_logger(__name__)


class Predictor(Protocol):
    """The sizing side of a target: loads the model's facts, predicts the capacity."""

    def load(self, info: TargetInfo) -> SourceError | None:
        """Find and read the model's config (blocking I/O; run in a thread).

        Called after ``/v1/models`` was (re)read. Returns the failure, if any, as data.
        """
        ...

    def predict(
        self,
        snapshot: VllmSnapshot,
        info: TargetInfo,
        gpus: Sequence[GpuMemoryView],
        flags: LaunchFlags | None = None,
    ) -> PredictionView:
        """The prediction for the current snapshot (pure, given what ``load`` read).

        ``flags``: what vLLM's command line says of its scheduler, where the sidecar can see it.
        """
        ...


class LaunchSource(Protocol):
    """The flags the vLLM server was started with (blocking ``/proc`` reads; run in a thread)."""

    def read(self) -> LaunchFlags | None:
        """The server's scheduler flags; None when its process cannot be seen."""
        ...


class GpuSource(Protocol):
    """vLLM's GPUs as plain readings (blocking NVML calls or HTTP reads; run in a thread)."""

    #: The ``source`` label of its health gauges (``nvml``, ``dcgm``).
    @property
    def source(self) -> str:
        """Which source this is."""
        ...

    def read(
        self, gpu_memory_utilization: float | None
    ) -> tuple[tuple[GpuMemoryView, ...], SourceError | None]:
        """Read every watched GPU: the views, and the failure if any. Never raises."""
        ...

    def close(self) -> None:
        """Release the GPU library."""
        ...


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Workers:
    """Where a poller's blocking calls run; ``None``: asyncio's default thread pool.

    The sidecar gives each kind one thread of its own: the reads are sequential anyway, and a
    pool that grows a second thread whenever two calls race (the default pool does) would make
    the process's thread count drift for no gain.
    """

    #: vLLM's command line and the model's files.
    files: Executor | None = None
    #: NVML (a hung call keeps its thread; the poller skips GPU reads until it returns).
    gpus: Executor | None = None


async def _in_thread(executor: Executor | None, call: Callable[..., _T], *args: Any) -> _T:
    """Run a blocking call in ``executor``'s thread, with this context's variables."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(executor, lambda: context.run(call, *args))


@dataclass(slots=True)
class _Health:
    """Mutable health of one source, turned into a SourceHealth for each view."""

    up: bool = False
    last_success_time: float | None = None
    duration_seconds: float | None = None
    errors: Counter[str] = field(default_factory=Counter)
    last_error: str | None = None
    last_reason: str | None = None

    def view(self) -> SourceHealth:
        return SourceHealth(
            up=self.up,
            last_success_time=self.last_success_time,
            duration_seconds=self.duration_seconds,
            errors=dict(self.errors),
            last_error=self.last_error,
        )


@dataclass(frozen=True, slots=True)
class PollSettings:
    """What a poller needs from the settings."""

    windows: WindowSettings = field(default_factory=WindowSettings)
    #: While the model's files cannot be used, read them again this often (a volume mounted
    #: late, permissions or a config.json fixed by hand): no vLLM restart is needed to recover.
    model_retry_seconds: float = 30.0
    #: Longest wait for the GPUs; an NVML call that hangs must not stop the polls of vLLM.
    gpu_timeout_seconds: float = 3.0
    #: Most samples the window holds, counted per engine (a sample of 8 engines counts 8):
    #: polls closer together than the window allows replace the latest sample instead of
    #: adding one, so memory is bounded whatever the poll rate (fleet probes come when
    #: Prometheus, or anyone, asks).
    max_engine_samples: int = 64 * 256
    #: Most bytes the window may hold (as :mod:`exporter.core.footprint` estimates them):
    #: heavy samples (long label values, many buckets, many engines) mean fewer of them.
    max_window_bytes: int = 64 * 2**20
    #: Counters that go down twice within this many seconds, without a new process start
    #: time, mark a broken target rather than a restart storm: no figures until they stop.
    counter_reset_seconds: float = 60.0
    #: Whether the latest derived figures are held between polls for scrapes to read (the
    #: sidecar's /metrics). Fleet mode answers each probe with the view its poll returns, and
    #: holds only what the next poll reads: 64 engines' figures, split labels' values and all,
    #: for each of up to ``probe_max_targets`` targets, counted in no window, added up to more
    #: than the windows themselves.
    hold_figures: bool = True
    #: The ``max_num_seqs`` setting: used when vLLM's command line does not say it.
    max_num_seqs: int | None = None
    #: The admission caps (``max_num_queued_reqs``, ``max_num_queued_tokens`` settings): each
    #: used when vLLM's command line does not say it.
    queue_caps: QueueCaps = field(default_factory=QueueCaps)
    #: Settings that also pick vLLM's default ``max_num_seqs`` when NVML cannot say.
    gpu_memory_bytes: int | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None


class TargetPoller:
    """Polls one vLLM server and publishes a :class:`TargetView` after every poll."""

    def __init__(
        self,
        target: str,
        *,
        client: VllmClient,
        parse: Callable[[bytes], VllmSnapshot],
        predictor: Predictor | None = None,
        gpus: GpuSource | None = None,
        launch: LaunchSource | None = None,
        settings: PollSettings | None = None,
        workers: Workers | None = None,
        memory: MemoryBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self._client = client
        self._parse = parse
        self._predictor = predictor
        self._gpus = gpus
        self._launch = launch
        self._workers = workers or Workers()
        #: What the vLLM server's command line says, read at each discovery.
        self._flags: LaunchFlags | None = None
        self._limit: RunningLimit | None = None
        self._settings = settings or PollSettings()
        self._clock = clock
        self._wall = wall_clock
        #: The samples, bounded by ``max_window_bytes`` and by ``memory``, the budget of all
        #: the targets of the process (which also counts what this poller holds besides them).
        self._window = Window(max_bytes=self._settings.max_window_bytes, budget=memory)
        #: The latest payload's counters, even while the target is refused (to compare the next).
        self._last_snapshot: RestartBaseline | None = None
        #: What the next derivation reads of the last one (:func:`carried`).
        self._previous: TargetDerived | None = None
        #: When counters went down without a new start time, within counter_reset_seconds.
        self._counter_resets: deque[float] = deque()
        #: Until when the target is refused for inconsistent counters.
        self._inconsistent_until = -math.inf
        #: Exception types of crashed polls already logged with their traceback.
        self._crashes_logged: set[str] = set()
        self._health: dict[str, _Health] = {}
        self._info = TargetInfo()
        self._needs_discovery = True
        self._restarts = 0
        self._view = TargetView(target=target)
        self._ready = False
        self._lock = asyncio.Lock()
        #: When to read the model's files again after a failure; ``None``: no retry due.
        self._model_retry_at: float | None = None
        #: A GPU read still running in its thread (NVML hung); the next polls skip the GPUs.
        self._gpu_read: (
            asyncio.Future[tuple[tuple[GpuMemoryView, ...], SourceError | None]] | None
        ) = None

    @property
    def view(self) -> TargetView:
        """The view published by the latest poll."""
        return self._view

    @property
    def forgotten(self) -> bool:
        """Whether the memory budget gave up this target whole (its owner is to drop it)."""
        return self._window.forgotten

    @property
    def evictions(self) -> dict[str, int]:
        """Window samples given up for memory, and times forgotten, by reason (a copy)."""
        return dict(self._window.evictions)

    def carry_evictions(self, evictions: Mapping[str, int]) -> None:
        """Start from the eviction counts of the poller this one replaces (fleet mode).

        A target forgotten for memory comes back as a new poller at its next probe: its
        ``headroom_window_evictions_total`` must go on from where it was, not from 0.
        """
        self._window.evictions.update(evictions)

    def _hold(self, view: TargetView) -> TargetView:
        """Publish ``view``: held whole, or without its figures (fleet mode), counted."""
        held = view if self._settings.hold_figures else replace(view, derived=None)
        self._view = held
        self._window.hold_state(
            state_bytes(
                self._last_snapshot,
                self._previous,
                held.derived,
                gpus=len(held.gpus),
                info=self._info,
            )
        )
        return view

    @property
    def ready(self) -> bool:
        """Whether a poll has succeeded and published its figures yet."""
        return self._ready

    def _record(
        self,
        source: str,
        started: float,
        error: SourceError | None,
        *,
        logged: bool = True,
        duration: float | None = None,
    ) -> None:
        """Record a read of ``source``; ``duration``: its seconds, if not since ``started``."""
        health = self._health.setdefault(source, _Health())
        health.duration_seconds = self._clock() - started if duration is None else duration
        if error is None:
            if not health.up and health.last_reason is not None and logged:
                log.info("source_recovered", source=source, target=self.target)
            health.up, health.last_reason = True, None
            health.last_success_time = self._wall()
            return
        health.errors[error.reason] += 1
        health.last_error = str(error)
        if logged and (health.up or health.last_reason != error.reason):
            log.warning(
                "source_failed",
                source=source,
                target=self.target,
                reason=error.reason,
                error=str(error),
            )
        health.up, health.last_reason = False, error.reason

    async def _discover(self) -> None:
        """Re-read ``/v1/models`` and ``/version``, then let the predictor load the model."""
        started = self._clock()
        models: ModelsInfo | None
        try:
            models = await self._client.fetch_models()
        except SourceError as exc:
            self._record("vllm_models", started, exc)
            models = None
        else:
            self._record("vllm_models", started, None)
            if models.ignored:
                log.warning(
                    "models_fields_ignored",
                    target=self.target,
                    ignored=list(models.ignored),
                    hint="values no vLLM gives are treated as absent",
                )
        started = self._clock()
        try:
            version = await self._client.fetch_version()
        except SourceError as exc:
            self._record("vllm_version", started, exc)
            version = None
        else:
            self._record("vllm_version", started, None)
        served_before = self._info.model_id
        self._info = TargetInfo(
            model_id=models.model_id if models else self._info.model_id,
            model_root=models.root if models else self._info.model_root,
            max_model_len=models.max_model_len if models else self._info.max_model_len,
            vllm_version=version or self._info.vllm_version,
        )
        if served_before is not None and self._info.model_id not in (None, served_before):
            self._forget_traffic(served_before)
        await self._read_launch()
        # Retry discovery on the next poll while a part of it is missing.
        self._needs_discovery = models is None or version is None
        if models is not None:
            await self._load_model()

    def _forget_traffic(self, served_before: str) -> None:
        """Another model answers here now: the window's traffic was the other model's.

        Its requests' context lengths and rates say nothing of this model's (an hour of them
        would otherwise set the p95 that the headroom is counted in): the window starts again
        from the latest sample, and the previous poll's context figures do not stand.
        """
        latest = self._window.latest
        self._window.clear()
        if latest is not None:
            self._add(latest)
        self._previous = None
        log.info(
            "target_model_changed",
            target=self.target,
            model=self._info.model_id,
            previous_model=served_before,
        )

    async def _read_launch(self) -> None:
        """Re-read the vLLM server's command line (it may have restarted with other flags)."""
        if self._launch is None:
            return
        try:
            flags = await _in_thread(self._workers.files, self._launch.read)
        except Exception:  # an odd /proc must not stop the polls (logged)
            log.exception("launch_read_crashed", target=self.target)
            flags = None
        if flags is not None and flags.invalid:
            log.warning(
                "launch_flags_invalid",
                target=self.target,
                flags=dict(flags.invalid),
                hint="vLLM would refuse these values; they are ignored here",
            )
        if flags is not None and flags.config_problem and flags.max_num_seqs is None:
            log.info(
                "launch_config_file_not_read",
                target=self.target,
                config=flags.config_file,
                problem=flags.config_problem,
                hint="set max_num_seqs if the config file sets max-num-seqs",
            )
        self._flags = flags

    def _running_limit(self, snapshot: VllmSnapshot, gpus: Sequence[GpuMemoryView]) -> RunningLimit:
        """The engine's ``max_num_seqs``, from what is known now; logs when its origin changes."""
        settings = self._settings
        cache = next((e.cache_config for e in snapshot.engines.values() if e.cache_config), None)
        limit = resolve_running_limit(
            LimitInputs(
                flags=self._flags,
                setting=settings.max_num_seqs,
                vllm_version=self._info.vllm_version,
                gpus=gpus,
                gpu_memory_bytes=settings.gpu_memory_bytes,
                tensor_parallel=settings.tensor_parallel,
                pipeline_parallel=settings.pipeline_parallel,
                max_model_len=self._info.max_model_len,
                cache_config=cache,
                queue_caps=settings.queue_caps,
            )
        )
        if limit != self._limit:
            log.info(
                "max_num_seqs",
                target=self.target,
                max_num_seqs=limit.sequences,
                origin=limit.source,
            )
            self._limit = limit
        return limit

    async def _load_model(self) -> None:
        """Let the predictor read the model's files; schedule a retry if that failed."""
        if self._predictor is None:
            return
        started = self._clock()
        try:
            failure = await _in_thread(self._workers.files, self._predictor.load, self._info)
        except Exception as exc:  # odd model files must not stop the polls (logged)
            log.exception("model_load_crashed", target=self.target)
            failure = SourceError(
                "model_config_invalid", f"reading the model failed: {type(exc).__name__}: {exc}"
            )
        self._record("model_config", started, failure)
        retry = self._settings.model_retry_seconds
        self._model_retry_at = None if failure is None else self._clock() + retry

    def _add(self, sample: Sample) -> None:
        """Add a sample to the window: bounded by age, and by count through a minimum spacing.

        The spacing spreads the kept samples over the context and rate windows; the context
        window's reach for more requests (``context_max_seconds``) goes only as far back as
        the samples that count leaves, so it never costs memory or poll-interval resolution.
        """
        windows = self._settings.windows
        span = max(windows.context_seconds, windows.rate_seconds)
        keep = max(span, windows.context_reach_seconds)
        engines = max(1, len(sample.snapshot.engines))
        capacity = max(2, self._settings.max_engine_samples // engines)
        self._window.add(sample, spacing=span / capacity, keep_seconds=keep, capacity=capacity)

    def _counters_inconsistent(self, now: float, snapshot: VllmSnapshot) -> bool:
        """Whether the target's counters are not one vLLM's, lately (see PollSettings).

        Impossible for one process (its start time going back, its counters going down under
        the same start time), or counters going down twice within the span where no start
        time is exposed.
        """
        previous = self._last_snapshot
        # Its counters only: a whole snapshot may hold every name its payload declared.
        self._last_snapshot = restart_baseline(snapshot)
        evidence = restart_evidence(previous, snapshot) if previous is not None else None
        span = self._settings.counter_reset_seconds
        if evidence is RestartEvidence.COUNTERS:
            self._counter_resets.append(now)
        while self._counter_resets and self._counter_resets[0] < now - span:
            self._counter_resets.popleft()
        if evidence is RestartEvidence.IMPOSSIBLE or len(self._counter_resets) >= 2:
            self._inconsistent_until = now + span
            self._window.clear()  # nothing before this is to be trusted either
        return now < self._inconsistent_until

    async def _read_gpus(self, snapshot: VllmSnapshot | None) -> tuple[GpuMemoryView, ...]:
        if self._gpus is None:
            return ()
        engines = snapshot.engines.values() if snapshot is not None else ()
        utilization = next(
            (e.cache_config.gpu_memory_utilization for e in engines if e.cache_config is not None),
            None,
        )
        started = self._clock()
        if self._gpu_read is not None and not self._gpu_read.done():
            self._record(
                self._gpus.source,
                started,
                SourceError("timeout", f"a {self._gpus.source} read has not returned"),
            )
            return ()
        self._gpu_read = asyncio.ensure_future(
            _in_thread(self._workers.gpus, self._gpus.read, utilization)
        )
        self._gpu_read.add_done_callback(_retrieve)
        try:
            # shield: on timeout the thread cannot be stopped; keep its future to skip on.
            readings, failure = await asyncio.wait_for(
                asyncio.shield(self._gpu_read), timeout=self._settings.gpu_timeout_seconds
            )
        except TimeoutError:
            readings, failure = (
                (),
                SourceError(
                    "timeout",
                    f"{self._gpus.source} did not answer within "
                    f"{self._settings.gpu_timeout_seconds:g}s",
                ),
            )
        except Exception as exc:  # GpuSource.read must not raise; if it does, log it
            log.exception("gpu_read_crashed", target=self.target)
            readings, failure = (), SourceError("call_failed", f"{type(exc).__name__}: {exc}")
        self._record(self._gpus.source, started, failure)
        return readings

    async def poll_once(self) -> TargetView:
        """Poll the target once and publish (and return) the new view. Never raises."""
        async with self._lock:  # fleet probes of one target may overlap
            try:
                return await self._poll()
            except Exception as exc:  # a bug must not end the polls: count, drop the figures
                kind = type(exc).__name__
                if kind not in self._crashes_logged:  # one traceback per kind, not per poll
                    self._crashes_logged.add(kind)
                    log.exception("poll_crashed", target=self.target)
                failure = SourceError(HttpReason.INTERNAL_ERROR, f"{kind}: {exc}"[:200])
                self._record(Source.VLLM_METRICS, self._clock(), failure)
                self._previous = None
                return self._hold(
                    replace(
                        self._view,
                        derived=None,
                        sources={name: h.view() for name, h in self._health.items()},
                    )
                )

    async def _poll(self) -> TargetView:
        started = self._clock()
        try:
            # The answer is not kept past its parse: fleet mode's shared answer budget counts
            # it only while it is read, and discovery below may wait on the network.
            snapshot = self._parse(await self._client.fetch_metrics())
        except SourceError as exc:
            return await self._down(started, exc)
        except ParseError as exc:
            return await self._down(started, SourceError("parse_error", str(exc)))
        if not snapshot.families and not snapshot.engines:
            # No vllm: series at all: not vLLM (or vLLM with --disable-log-stats). Saying "up"
            # with nothing derived would hide it.
            return await self._down(
                started,
                SourceError(
                    "not_metrics",
                    "/metrics has no vllm: series (not vLLM, or vLLM with --disable-log-stats?)",
                ),
            )
        now = self._clock()
        if self._counters_inconsistent(now, snapshot):
            return await self._down(
                started,
                SourceError(
                    HttpReason.INCONSISTENT_COUNTERS,
                    "vLLM's counters or start time went back without a restart: not one vLLM "
                    "behind this URL (a load balancer?) or not vLLM; no figures until they have "
                    f"been consistent for {self._settings.counter_reset_seconds:g}s",
                ),
            )
        # Recorded up only once the whole poll succeeded (below): a poll that crashes later
        # must not log the source recovered, then failed, at every poll.
        read_seconds = self._clock() - started

        sample = next_sample(self._window.latest, now, snapshot, wall=self._wall())
        if sample.restarted:
            self._restarts += 1
            self._needs_discovery = True
            log.info("target_restarted", target=self.target)
        previous_dropped = sum(self._view.dropped.values())
        # Into the window before anything else is awaited: there the snapshot is counted in the
        # process's memory budget, not held uncounted while discovery waits on the network
        # (fleet mode: dozens of polls in flight at once).
        self._add(sample)
        if self._needs_discovery:
            await self._discover()
        elif self._model_retry_at is not None and now >= self._model_retry_at:
            await self._load_model()

        gpus = await self._read_gpus(snapshot)
        prediction = (
            self._predictor.predict(snapshot, self._info, gpus, self._flags)
            if self._predictor is not None
            else PredictionView(state="model_not_found", message="no predictor configured")
        )
        derived = derive_target(
            self._window.samples,
            windows=self._settings.windows,
            predicted_capacity_tokens=prediction.capacity_tokens,
            pool_layout=prediction.layout,
            max_model_len=self._info.max_model_len,
            running_limit=self._running_limit(snapshot, gpus),
            previous=self._previous,
        )
        self._previous = carried(derived)
        self._record("vllm_metrics", started, None, duration=read_seconds)
        view = TargetView(
            target=self.target,
            derived=derived,
            prediction=prediction,
            gpus=gpus,
            sources={name: h.view() for name, h in self._health.items()},
            info=self._info,
            restarts_total=self._restarts,
            window_samples=len(self._window),
            dropped=snapshot.dropped,
            window_evictions=dict(self._window.evictions),
        )
        # Ready once the figures are published, not when /metrics answered: discovery and the
        # GPU read await in between, and a scrape then would find the target without figures.
        self._ready = True
        if snapshot.dropped_samples and not previous_dropped:
            log.warning("target_series_dropped", target=self.target, dropped=dict(snapshot.dropped))
        return self._hold(view)

    async def _down(self, started: float, error: SourceError) -> TargetView:
        """Publish a view without derived figures: stale numbers must not look current.

        The GPUs are still read: what holds their memory while vLLM is away (or after it ran
        out of memory) is exactly what on-call wants to see.
        """
        self._record("vllm_metrics", started, error)
        # After an outage vLLM may come back changed: re-read its facts then.
        self._needs_discovery = True
        gpus = await self._read_gpus(None)
        self._previous = None
        return self._hold(
            replace(
                self._view,
                derived=None,
                gpus=gpus,
                sources={name: h.view() for name, h in self._health.items()},
                window_samples=len(self._window),
                window_evictions=dict(self._window.evictions),
            )
        )

    async def run(self, stop: asyncio.Event, interval_seconds: float) -> None:
        """Poll every ``interval_seconds`` until ``stop`` is set (sidecar mode).

        ``stop`` also cuts a poll short: SIGTERM must not wait for a hung vLLM to time out.
        """
        next_due = self._clock()
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                poll = asyncio.ensure_future(self.poll_once())
                await asyncio.wait({poll, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not poll.done():
                    poll.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await poll
                    return
                next_due = await self._pause(stop, next_due, interval_seconds)
        finally:
            stopping.cancel()

    async def _pause(self, stop: asyncio.Event, next_due: float, interval_seconds: float) -> float:
        """Sleep until the next poll is due (or ``stop``); return when the one after is due."""
        next_due += interval_seconds
        # A slow poll skips the missed beats instead of bursting to catch up.
        now = self._clock()
        if next_due < now:
            next_due = now + interval_seconds
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=next_due - now)
        return next_due


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a GPU read's outcome as seen: one that outlived its poll is not awaited again."""
    if not future.cancelled():
        future.exception()
