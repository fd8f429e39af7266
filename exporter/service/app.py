"""The exporter application: sidecar or fleet mode, built from the settings and run.

The main thread runs the asyncio loop that polls (sidecar) or serves probes (fleet); the HTTP
server runs in a thread of its own and reads only immutable views, so a slow target never
blocks a scrape. SIGTERM and SIGINT stop both within a second. :class:`Components` are the
seams that tests and the demo replace (the predictor, the GPU source).
"""

from __future__ import annotations

import asyncio
import errno
import signal
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import structlog
from prometheus_client import CollectorRegistry, ProcessCollector

from exporter import __version__
from exporter.core.ceiling import QueueCaps
from exporter.core.derive import WindowSettings
from exporter.core.reasons import ProbeOutcome
from exporter.errors import UsageError
from exporter.gpu.dcgm import PodIdentity
from exporter.gpu.nvml import NvmlGpuReader
from exporter.gpu.source import NvmlGpuSource
from exporter.gpu.visibility import parse_gpu_selectors
from exporter.service.allowlist import parse_allowlist, redact_url
from exporter.service.collector import (
    ExporterView,
    GuardedCollector,
    exporter_families,
    target_families,
    target_rows,
)
from exporter.service.dcgm import MAX_ANSWER_BYTES, DcgmGpuSource, SharedDcgmAnswers
from exporter.service.fleet import Fleet, Refusal
from exporter.service.httpserver import (
    MAX_CONNECTIONS,
    CachedExposition,
    ExporterServer,
    HeadroomApp,
    ProbeAnswer,
    StartErrorApp,
    landing_page,
    tls_context,
)
from exporter.service.launch import ProcessLaunchSource
from exporter.service.memory import MemoryBudget
from exporter.service.poller import PollSettings, TargetPoller, Workers
from exporter.service.resolver import BoundedResolver, system_resolve
from exporter.service.settings import GpuDiscovery, GpuSourceKind, Mode, Settings, env_name
from exporter.sizing.predictor import ModelPredictor
from exporter.vllm.client import ResponseBudget, VllmClient
from exporter.vllm.metrics import parse_vllm_metrics

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from prometheus_client.core import Metric
    from pydantic import SecretStr

    from exporter.service.allowlist import IPAddress
    from exporter.service.poller import GpuSource, LaunchSource, Predictor

log = structlog.get_logger(__name__)

#: Seconds left to Prometheus when a probe's timeout comes from its scrape timeout header.
PROBE_TIMEOUT_MARGIN_SECONDS = 0.5
#: Probes running at once: the HTTP server's other connection slots stay free for /metrics
#: and the health checks, whatever a client sends to /probe.
PROBE_SLOTS = MAX_CONNECTIONS - 16


def client_limits(mode: Mode) -> httpx.Limits:
    """The connection pool of the client that reads the targets (and dcgm-exporter).

    A sidecar keeps its few connections alive. Fleet mode keeps none, as a blackbox prober
    does: a target's next probe comes a scrape interval later, past the pool's 5 s expiry at the
    usual 15 s or more, and with more targets than idle slots a kept connection is seldom the
    one the next probe needs; meanwhile httpcore's pool looks through every idle connection on
    every request (a readiness check of each socket and a count of the idle ones for each).
    Without them a probe cost 12 to 22 % less of the exporter's CPU at 200 targets
    (benchmarks/README.md, fleet_cost.py).
    """
    keep_alive = 20 if mode is Mode.SIDECAR else 0
    return httpx.Limits(max_connections=100, max_keepalive_connections=keep_alive)


@dataclass(slots=True)
class Components:
    """Seams for tests and the demo: what ``serve`` builds unless given."""

    predictor: Callable[[Settings], Predictor | None] | None = None
    gpu_source: Callable[[Settings], GpuSource | None] | None = None
    #: Fleet mode's blocking name lookup (default: the system resolver).
    resolve: Callable[[str], list[IPAddress]] | None = None
    #: The vLLM server's command line for a target URL (default: /proc, sidecar mode only).
    launch: Callable[[Settings, str], LaunchSource | None] | None = None


def default_launch_source(settings: Settings, url: str) -> LaunchSource | None:
    """The sidecar's vLLM command line from the shared process table; none in fleet mode."""
    if settings.mode is Mode.FLEET:
        return None
    return ProcessLaunchSource(settings.proc_root, url)


#: Share of poll_timeout_seconds a dcgm-exporter read may take: it fails with its own reason
#: before the poller's limit on the GPU read (which would only say "timeout") is reached.
DCGM_TIMEOUT_SHARE = 0.9


def default_gpu_source(settings: Settings) -> GpuSource | None:
    """vLLM's GPUs as the settings say: NVML through the real library, dcgm-exporter, or none."""
    if settings.gpu_source is GpuSourceKind.NONE:
        return None
    if settings.gpu_source is GpuSourceKind.DCGM and settings.dcgm_url is not None:
        pod = (
            PodIdentity(settings.pod_name, settings.pod_namespace)
            if settings.pod_name is not None and settings.pod_namespace is not None
            else None
        )
        return DcgmGpuSource.from_settings(
            settings.dcgm_url,
            gpus=parse_gpu_selectors(settings.gpus) if settings.gpus else (),
            pod=pod,
            proc_root=settings.proc_root,
            timeout_s=settings.poll_timeout_seconds * DCGM_TIMEOUT_SHARE,
            from_process=settings.gpu_discovery is GpuDiscovery.AUTO,
            node=settings.node_name,
        )
    if settings.gpu_discovery is GpuDiscovery.NONE:
        return None
    return NvmlGpuSource.from_settings(
        NvmlGpuReader(),
        gpus=settings.gpus,
        discovery=settings.gpu_discovery.value,
        proc_root=settings.proc_root,
    )


def fleet_dcgm_answers(
    settings: Settings, http: httpx.AsyncClient, answers: ResponseBudget | None
) -> SharedDcgmAnswers | None:
    """Fleet mode's dcgm-exporter answers (gpu_source=dcgm): read as targets are.

    Each read is a pinned client's (only the addresses its probe checked), never with the
    bearer token, within DCGM_TIMEOUT_SHARE of poll_timeout_seconds and 8 MiB, its bytes
    counted in the fleet's answer budget; each URL at most once per poll_interval_seconds.
    """
    if settings.mode is not Mode.FLEET or settings.gpu_source is not GpuSourceKind.DCGM:
        return None

    async def fetch(url: str) -> bytes:
        parts = httpx.URL(url)
        client = VllmClient(
            str(parts.copy_with(path="/")),
            client=http,
            timeout_seconds=settings.poll_timeout_seconds * DCGM_TIMEOUT_SHARE,
            max_bytes=MAX_ANSWER_BYTES,
            bearer_token=None,
            budget=answers,
            pinned=True,
        )
        return await client.fetch_text(parts.path)

    return SharedDcgmAnswers(
        fetch,
        max_age_seconds=settings.poll_interval_seconds,
        max_entries=settings.probe_max_targets,
        max_bytes=settings.memory_limit_bytes // DCGM_MEMORY_SHARE,
    )


def default_predictor(settings: Settings) -> Predictor:
    """The sizing model over the model vLLM serves (or the ``model`` setting)."""
    return ModelPredictor(
        model=settings.model,
        hf_home=settings.hf_home,
        model_roots=settings.model_roots,
        overrides=settings.model_overrides,
        tensor_parallel=settings.tensor_parallel_size,
        pipeline_parallel=settings.pipeline_parallel_size,
        gpu_memory_bytes=settings.gpu_memory_bytes,
        weights_bytes=settings.weights_bytes,
        overhead_bytes=settings.overhead_bytes,
    )


#: Polls between two reads of model files that could not be used (30 s at the default 5 s).
MODEL_RETRY_POLLS = 6


#: Window samples (per engine) a sidecar keeps at most: 64 engines of 256 samples.
SIDECAR_ENGINE_SAMPLES = 64 * 256
#: Window samples (per engine) fleet mode keeps for all its targets together, shared out
#: evenly over probe_max_targets (at least 16 each); whatever each weighs, all the windows
#: together hold at most window_memory_bytes (docs/derivations.md, "What the window holds").
FLEET_ENGINE_SAMPLES = 48 * 1024
#: Share of ``memory_limit_bytes`` all the windows' samples may hold together: the rest is
#: the interpreter and its libraries (about 50 MiB), the /metrics answers being read and the
#: one being parsed (docs/reliability.md).
WINDOW_MEMORY_SHARE = 4
#: Share of ``memory_limit_bytes`` the /metrics answers fleet mode reads at once may hold
#: together, whatever the number of probes (shared fairly: ResponseBudget).
RESPONSE_MEMORY_SHARE = 4
#: Share of ``memory_limit_bytes`` the parsed dcgm-exporter answers fleet mode holds may take
#: (8 MiB of 256: some 1,300 answers of 8 GPUs, each mapped to one pod; the oldest goes first).
DCGM_MEMORY_SHARE = 32


def window_memory_bytes(settings: Settings) -> int:
    """Bytes all the windows of the process may hold together (and one window alone)."""
    return settings.memory_limit_bytes // WINDOW_MEMORY_SHARE


def response_memory_bytes(settings: Settings) -> int:
    """Bytes of /metrics answers fleet mode may hold while reading them, all probes together."""
    return settings.memory_limit_bytes // RESPONSE_MEMORY_SHARE


def _poll_settings(settings: Settings) -> PollSettings:
    engine_samples = SIDECAR_ENGINE_SAMPLES
    if settings.mode is Mode.FLEET:
        engine_samples = max(16, FLEET_ENGINE_SAMPLES // settings.probe_max_targets)
    return PollSettings(
        windows=WindowSettings(
            context_seconds=settings.context_window_seconds,
            context_min_requests=settings.context_min_requests,
            context_max_seconds=max(
                settings.context_max_window_seconds, settings.context_window_seconds
            ),
            rate_seconds=settings.rate_window_seconds,
            context_refresh_seconds=settings.context_refresh_seconds,
        ),
        model_retry_seconds=settings.poll_interval_seconds * MODEL_RETRY_POLLS,
        gpu_timeout_seconds=settings.poll_timeout_seconds,
        max_engine_samples=engine_samples,
        max_window_bytes=window_memory_bytes(settings),
        # A probe's answer is rendered from the view its poll returns: nothing reads it later.
        hold_figures=settings.mode is Mode.SIDECAR,
        max_num_seqs=settings.max_num_seqs,
        queue_caps=QueueCaps(settings.max_num_queued_reqs, settings.max_num_queued_tokens),
        gpu_memory_bytes=settings.gpu_memory_bytes,
        tensor_parallel=settings.tensor_parallel_size,
        pipeline_parallel=settings.pipeline_parallel_size,
    )


def _start_server(settings: Settings, app: HeadroomApp) -> ExporterServer:
    tls = None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        for path in (settings.tls_cert_file, settings.tls_key_file):
            _check_pem_file(path)
        try:
            tls = tls_context(settings.tls_cert_file, settings.tls_key_file)
        except (OSError, ValueError) as exc:
            msg = (
                f"cannot load the TLS certificate or key ({exc}); check tls_cert_file/tls_key_file"
            )
            raise UsageError(msg) from None
    try:
        return ExporterServer((settings.listen_address, settings.port), app, tls=tls)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            msg = (
                f"port {settings.port} on {settings.listen_address} is in use; "
                "choose another with --port"
            )
        else:
            msg = (
                f"cannot listen on {settings.listen_address}:{settings.port}: {exc.strerror}; "
                f"check listen_address ({env_name('listen_address')})"
            )
        raise UsageError(msg) from None


#: Largest certificate or key file loaded (a chain of a few certificates is some kilobytes).
MAX_PEM_BYTES = 1024 * 1024


def _check_pem_file(path: Path) -> None:
    """A TLS file must be a regular file of sane size: OpenSSL would wait on a FIFO for ever."""
    try:
        info = path.stat()
    except OSError as exc:
        msg = (
            f"cannot load the TLS certificate or key ({path}: {exc.strerror}); "
            "check tls_cert_file/tls_key_file"
        )
        raise UsageError(msg) from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_PEM_BYTES:
        msg = (
            f"cannot load the TLS certificate or key ({path} is not a regular file of at most "
            f"{MAX_PEM_BYTES // 1024} KiB); check tls_cert_file/tls_key_file"
        )
        raise UsageError(msg)


async def serve(
    settings: Settings,
    *,
    components: Components | None = None,
    started: Callable[[ExporterServer], None] | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run the exporter until SIGTERM/SIGINT (or ``stop``); return the exit code."""
    parts = components or Components()
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP conventionally means "reload": there is nothing to reload (settings are read
        # once), and it must not kill the process the way its default action does.
        loop.add_signal_handler(signal.SIGHUP, _ignore_sighup)

    limits = client_limits(settings.mode)
    async with httpx.AsyncClient(limits=limits, trust_env=False, follow_redirects=False) as http:
        gpus, workers = _sidecar_sources(settings, parts)
        answers = (
            ResponseBudget(response_memory_bytes(settings)) if settings.mode is Mode.FLEET else None
        )

        memory = MemoryBudget(window_memory_bytes(settings))
        make_poller = _poller_factory(
            settings,
            http,
            parts.predictor or default_predictor,
            gpus,
            parts.launch or default_launch_source,
            workers=workers,
            answers=answers,
            memory=memory,
        )
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ProcessCollector(registry=None))
        fleet: Fleet | None = None
        poller: TargetPoller | None = None
        if settings.mode is Mode.SIDECAR:
            poller = make_poller(settings.target, settings.bearer_token, None)
        else:
            fleet = _fleet(
                settings,
                make_poller,
                BoundedResolver(resolve=parts.resolve or system_resolve),
                dcgm=fleet_dcgm_answers(settings, http, answers),
                memory=memory,
            )

        def exporter_view() -> ExporterView:
            return ExporterView(
                version=__version__,
                mode=settings.mode.value,
                poll_interval_seconds=(
                    settings.poll_interval_seconds if settings.mode is Mode.SIDECAR else None
                ),
                probe_requests=fleet.outcome_counts() if fleet else {},
                probe_targets=fleet.target_count if fleet else None,
                probe_evictions=fleet.evictions if fleet else None,
                # Read on the HTTP thread while the loop counts: a copy of a small dict.
                probe_response_refusals=dict(answers.refusals) if answers else {},
            )

        builders: dict[str, Callable[[], list[Metric]]] = {
            "exporter": lambda: exporter_families(exporter_view())
        }
        if poller is not None:
            sidecar = poller
            builders["target"] = lambda: target_families(sidecar.view)
        registry.register(GuardedCollector(builders))

        app = HeadroomApp(
            registry=registry,
            ready=_readiness(poller),
            landing=lambda: _landing(settings, poller),
            probe=_prober(settings, fleet, loop) if fleet is not None else None,
            # Sidecar: rendered once per poll (a new view), however many scrape it. Fleet
            # mode's own /metrics is small and its counters move with every probe.
            metrics=(
                CachedExposition(
                    registry,
                    lambda: sidecar.view,
                    max_age_seconds=settings.poll_interval_seconds,
                )
                if poller is not None
                else None
            ),
        )
        server = _start_server(settings, app)
        thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        thread.start()
        log.info(
            "listening",
            url=server_url(server),
            mode=settings.mode.value,
            target=redact_url(settings.target) if poller else None,
            tls=settings.tls_cert_file is not None,
        )
        if started is not None:
            started(server)
        try:
            if poller is not None:
                await poller.run(stop, settings.poll_interval_seconds)
            else:
                await stop.wait()
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=2)
            _release(gpus, workers)
            if fleet is not None:
                fleet.close()
            log.info("stopped")
    return 0


#: Seconds between the repeats of the error while ``serve --on-start-error wait`` waits: a log
#: tail shows it however long ago the container started.
START_ERROR_REPEAT_SECONDS = 600.0


def wait_after_start_error(
    message: str,
    *,
    addresses: Sequence[tuple[str, int]],
    stop: threading.Event | None = None,
) -> int:
    """Answer with the start-up error (:class:`StartErrorApp`) until SIGTERM/SIGINT; return 0.

    For a sidecar: exiting would take vLLM's pod out of its Service while the container backs
    off. It listens on the first of ``addresses`` it can have (the error may be the address
    asked for); with none, it waits without listening (the liveness probe then decides).
    ``stop`` ends the wait (tests; signals set it in the main thread).
    """
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
        signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    server: ExporterServer | None = None
    for address in addresses:
        try:
            server = ExporterServer(address, StartErrorApp(message))
        except OSError as exc:
            log.warning("start_failed_cannot_listen", address=address[0], port=address[1], why=exc)
        else:
            break
    thread = None
    if server is not None:
        thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        thread.start()
    url = server_url(server) if server is not None else None
    log.error("start_failed_waiting", error=message, url=url, fix="correct the setting, restart")
    try:
        while not stop.wait(START_ERROR_REPEAT_SECONDS):
            log.error("start_failed_waiting", error=message, url=url)
    finally:
        if server is not None and thread is not None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=2)
    return 0


def _sidecar_sources(settings: Settings, parts: Components) -> tuple[GpuSource | None, Workers]:
    """The GPUs (only beside one vLLM) and the threads for the sidecar's blocking reads."""
    if settings.mode is not Mode.SIDECAR:
        return None, Workers()  # a fleet exporter sees none of its targets' GPUs
    gpus = (parts.gpu_source or default_gpu_source)(settings)
    workers = Workers(
        files=ThreadPoolExecutor(1, thread_name_prefix="files"),
        gpus=ThreadPoolExecutor(1, thread_name_prefix="gpus"),
    )
    return gpus, workers


def _release(gpus: GpuSource | None, workers: Workers) -> None:
    for executor in (workers.files, workers.gpus):
        if executor is not None:  # a hung NVML call must not hold the exit
            executor.shutdown(wait=False, cancel_futures=True)
    if gpus is not None:
        gpus.close()


def _ignore_sighup() -> None:
    log.info("sighup_ignored", why="settings are read at start; restart to change them")


def _poller_factory(
    settings: Settings,
    http: httpx.AsyncClient,
    predictor_for: Callable[[Settings], Predictor | None],
    gpus: GpuSource | None,
    launch_for: Callable[[Settings, str], LaunchSource | None] = default_launch_source,
    *,
    workers: Workers | None = None,
    answers: ResponseBudget | None = None,
    memory: MemoryBudget,
) -> Callable[[str, SecretStr | None, GpuSource | None], TargetPoller]:
    """How a target's poller is made: its client, the predictor, the GPUs, the settings.

    ``answers`` bounds the /metrics answers all the pollers read at once (fleet mode), and
    ``memory`` what their windows hold (one budget per process, shared with the fleet). A
    poller's own GPU source (a fleet target's) replaces ``gpus``.
    """

    def make_poller(
        url: str, token: SecretStr | None, target_gpus: GpuSource | None = None
    ) -> TargetPoller:
        client = VllmClient(
            url,
            client=http,
            timeout_seconds=settings.poll_timeout_seconds,
            max_bytes=settings.max_response_bytes,
            bearer_token=token,
            budget=answers,
            pinned=settings.mode is Mode.FLEET,
        )
        return TargetPoller(
            redact_url(url),  # what logs and the landing page show
            client=client,
            parse=parse_vllm_metrics,
            predictor=predictor_for(settings),
            gpus=target_gpus or gpus,
            launch=launch_for(settings, url),
            settings=_poll_settings(settings),
            workers=workers,
            memory=memory,
        )

    return make_poller


def _fleet(
    settings: Settings,
    make_poller: Callable[[str, SecretStr | None, GpuSource | None], TargetPoller],
    resolver: BoundedResolver,
    dcgm: SharedDcgmAnswers | None = None,
    memory: MemoryBudget | None = None,
) -> Fleet:
    """Fleet mode's targets, with the bearer token only for the targets bound to it."""
    return Fleet(
        allowlist=parse_allowlist(settings.probe_allowlist),
        # The token goes with a probe's requests only where its route allows (see Fleet).
        make_poller=lambda target, gpus: make_poller(target.url, settings.bearer_token, gpus),
        dcgm=dcgm,
        max_targets=settings.probe_max_targets,
        ttl_seconds=settings.probe_target_ttl_seconds,
        resolver=resolver,
        token_targets=parse_allowlist(settings.bearer_token_targets),
        max_in_flight=PROBE_SLOTS,
        memory=memory,
    )


def _readiness(poller: TargetPoller | None) -> Callable[[], tuple[bool, str]]:
    def ready() -> tuple[bool, str]:
        if poller is None:
            return True, ""
        if poller.ready:
            return True, ""
        return False, f"the first poll of {poller.target}/metrics has not succeeded yet"

    return ready


def _landing(settings: Settings, poller: TargetPoller | None) -> str:
    rows = [("version", __version__), ("mode", settings.mode.value)]
    if poller is not None:
        view = poller.view
        rows.append(("target", poller.target))
        rows.append(("model", view.info.model_id or "unknown yet"))
        rows.append(("vLLM version", view.info.vllm_version or "unknown yet"))
        rows.append(("prediction", f"{view.prediction.state}: {view.prediction.message}"))
        for source, health in sorted(view.sources.items()):
            state = "up" if health.up else f"down ({health.last_error or 'no data yet'})"
            rows.append((f"source {source}", state))
    return landing_page(title="vllm-headroom", rows=rows, probe=poller is None)


def _prober(
    settings: Settings, fleet: Fleet, loop: asyncio.AbstractEventLoop
) -> Callable[[str, float | None, str, Mapping[str, str]], ProbeAnswer]:
    def probe(
        target: str, scrape_timeout: float | None, client: str, params: Mapping[str, str]
    ) -> ProbeAnswer:
        ticket = fleet.enter(target, client, params)
        if isinstance(ticket, Refusal):
            return ProbeAnswer(status=ticket.status, message=ticket.message)
        try:
            timeout = settings.poll_timeout_seconds * 2
            if scrape_timeout is not None:
                timeout = max(0.1, min(timeout, scrape_timeout - PROBE_TIMEOUT_MARGIN_SECONDS))
            future = asyncio.run_coroutine_threadsafe(fleet.probe(ticket, timeout), loop)
            try:
                view = future.result(timeout=timeout + 1.0)
            except TimeoutError:
                future.cancel()
                view = Refusal(ProbeOutcome.TIMEOUT, "The probe timed out.")
        finally:
            fleet.leave(ticket)
        if isinstance(view, Refusal):
            return ProbeAnswer(status=view.status, message=view.message)
        guarded = GuardedCollector({"target": lambda: target_rows(view)})
        registry = CollectorRegistry(auto_describe=False)
        registry.register(guarded)
        return ProbeAnswer(registry=registry, render_openmetrics=guarded.openmetrics)

    return probe


def server_url(server: ExporterServer) -> str:
    """The base URL a started server answers on (for tests and the demo)."""
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if server.tls else "http"
    return f"{scheme}://{shown}:{port}"
