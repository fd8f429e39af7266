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
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import structlog
from prometheus_client import CollectorRegistry, ProcessCollector

from exporter import __version__
from exporter.core.derive import WindowSettings
from exporter.errors import UsageError
from exporter.gpu.nvml import NvmlGpuReader
from exporter.gpu.source import NvmlGpuSource
from exporter.service.allowlist import parse_allowlist
from exporter.service.collector import (
    ExporterView,
    GuardedCollector,
    exporter_families,
    target_families,
)
from exporter.service.fleet import Fleet
from exporter.service.httpserver import (
    ExporterServer,
    HeadroomApp,
    ProbeAnswer,
    landing_page,
    tls_context,
)
from exporter.service.poller import PollSettings, TargetPoller
from exporter.service.settings import GpuDiscovery, Mode, Settings, env_name
from exporter.sizing.predictor import ModelPredictor
from exporter.vllm.client import VllmClient
from exporter.vllm.metrics import parse_vllm_metrics

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client.core import Metric

    from exporter.service.poller import GpuSource, Predictor

log = structlog.get_logger(__name__)

#: Seconds left to Prometheus when a probe's timeout comes from its scrape timeout header.
PROBE_TIMEOUT_MARGIN_SECONDS = 0.5


@dataclass(slots=True)
class Components:
    """Seams for tests and the demo: what ``serve`` builds unless given."""

    predictor: Callable[[Settings], Predictor | None] | None = None
    gpu_source: Callable[[Settings], GpuSource | None] | None = None


def default_gpu_source(settings: Settings) -> GpuSource | None:
    """NVML through the real library, watching vLLM's GPUs as the settings say."""
    if settings.gpu_discovery is GpuDiscovery.NONE:
        return None
    return NvmlGpuSource.from_settings(
        NvmlGpuReader(),
        gpus=settings.gpus,
        discovery=settings.gpu_discovery.value,
        proc_root=settings.proc_root,
    )


def default_predictor(settings: Settings) -> Predictor:
    """The sizing model over the model vLLM serves (or the ``model`` setting)."""
    return ModelPredictor(
        model=settings.model,
        hf_home=settings.hf_home,
        overrides=settings.model_overrides,
        tensor_parallel=settings.tensor_parallel_size,
        pipeline_parallel=settings.pipeline_parallel_size,
        gpu_memory_bytes=settings.gpu_memory_bytes,
        weights_bytes=settings.weights_bytes,
        overhead_bytes=settings.overhead_bytes,
    )


#: Polls between two reads of model files that could not be used (30 s at the default 5 s).
MODEL_RETRY_POLLS = 6


def _poll_settings(settings: Settings) -> PollSettings:
    return PollSettings(
        windows=WindowSettings(
            context_seconds=settings.context_window_seconds,
            rate_seconds=settings.rate_window_seconds,
        ),
        model_retry_seconds=settings.poll_interval_seconds * MODEL_RETRY_POLLS,
        gpu_timeout_seconds=settings.poll_timeout_seconds,
    )


def _start_server(settings: Settings, app: HeadroomApp) -> ExporterServer:
    tls = None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
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

    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
    async with httpx.AsyncClient(limits=limits, trust_env=False, follow_redirects=False) as http:
        predictor_for = parts.predictor or default_predictor
        # NVML only beside one vLLM: a fleet exporter sees none of its targets' GPUs.
        gpus = None
        if settings.mode is Mode.SIDECAR:
            gpus = (parts.gpu_source or default_gpu_source)(settings)

        def make_poller(url: str) -> TargetPoller:
            client = VllmClient(
                url,
                client=http,
                timeout_seconds=settings.poll_timeout_seconds,
                max_bytes=settings.max_response_bytes,
                bearer_token=settings.bearer_token,
            )
            return TargetPoller(
                url,
                client=client,
                parse=parse_vllm_metrics,
                predictor=predictor_for(settings),
                gpus=gpus,
                settings=_poll_settings(settings),
            )

        registry = CollectorRegistry(auto_describe=False)
        registry.register(ProcessCollector(registry=None))
        fleet: Fleet | None = None
        poller: TargetPoller | None = None
        if settings.mode is Mode.SIDECAR:
            poller = make_poller(settings.target)
        else:
            fleet = Fleet(
                allowlist=parse_allowlist(settings.probe_allowlist),
                make_poller=make_poller,
                max_targets=settings.probe_max_targets,
                ttl_seconds=settings.probe_target_ttl_seconds,
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
        )
        server = _start_server(settings, app)
        thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        thread.start()
        log.info(
            "listening",
            url=server_url(server),
            mode=settings.mode.value,
            target=settings.target if poller else None,
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
            if gpus is not None:
                gpus.close()
            log.info("stopped")
    return 0


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
) -> Callable[[str, float | None], ProbeAnswer]:
    def probe(target: str, scrape_timeout: float | None) -> ProbeAnswer:
        admission = fleet.admit(target)
        if admission.target is None:
            status = "400 Bad Request" if admission.outcome == "bad_target" else "403 Forbidden"
            return ProbeAnswer(status=status, message=admission.message)
        timeout = settings.poll_timeout_seconds * 2
        if scrape_timeout is not None:
            timeout = max(0.1, min(timeout, scrape_timeout - PROBE_TIMEOUT_MARGIN_SECONDS))
        future = asyncio.run_coroutine_threadsafe(fleet.probe(admission.target, timeout), loop)
        try:
            view = future.result(timeout=timeout + 1.0)
        except TimeoutError:
            future.cancel()
            view = None
        if view is None:
            return ProbeAnswer(status="504 Gateway Timeout", message="The probe timed out.")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GuardedCollector({"target": lambda: target_families(view)}))
        return ProbeAnswer(registry=registry)

    return probe


def server_url(server: ExporterServer) -> str:
    """The base URL a started server answers on (for tests and the demo)."""
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if server.tls else "http"
    return f"{scheme}://{shown}:{port}"
