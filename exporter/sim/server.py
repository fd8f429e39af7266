"""Serve a simulated vLLM engine over HTTP, stepped in real time: the demo's stand-in for vLLM.

:class:`SimServer` is the imperative shell around :class:`exporter.sim.engine.Simulation`: a
threaded stdlib HTTP server with the vLLM endpoints the sidecar reads, and a background thread that
advances the simulation by the wall-clock time elapsed times a speed factor.

Endpoints, shaped like vLLM's OpenAI server:

- ``GET /metrics``: the vLLM 0.32.0 exposition (:func:`exporter.sim.exposition.render`);
- ``GET /v1/models``: one model, id ``simulated/llama-3.1-8b``, ``owned_by`` saying it is a
  simulation, ``root`` the directory holding its ``config.json`` (as ``--model /path`` gives);
- ``GET /version``: ``{"version": "0.32.0+sim"}``;
- ``GET /health``: 200 with an empty body while the simulation runs, 503 if its thread died.

Everything it serves says it is a simulation wherever vLLM has free text. Clocks are injected
(``clock`` for stepping, ``wall_clock`` for timestamps) so tests can drive it without sleeping.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

from exporter.errors import UsageError
from exporter.sim.exposition import render
from exporter.sim.families import VLLM_VERSION
from exporter.sim.scenario import SIM_MODEL_DIR

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.sim.engine import Simulation
    from exporter.sim.scenario import Scenario

log = structlog.get_logger(__name__)

#: What ``/version`` reports: vLLM's version with a local tag that says "simulation".
SIM_VERSION = f"{VLLM_VERSION}+sim"
#: ``owned_by`` of the served model (vLLM says ``vllm``).
SIM_OWNER = "vllm-headroom-simulation"
#: The text format ``prometheus_client.generate_latest`` writes.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_JSON = "application/json"


class SimServerError(UsageError):
    """The simulated server cannot start as asked (bad speed, port in use...)."""


def models_payload(scenario: Scenario, *, root: str, created: int) -> dict[str, Any]:
    """Return the ``/v1/models`` body vLLM would serve for this scenario."""
    name = scenario.model.served_name
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": SIM_OWNER,
                "root": root,
                "parent": None,
                "max_model_len": scenario.engine.max_model_len,
                "permission": [
                    {
                        "id": "modelperm-simulated",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }


class SimServer:
    """A simulated vLLM server: HTTP endpoints plus a thread that steps the simulation.

    ``speed`` is simulated seconds per wall-clock second; the simulation's CPU cost grows with it
    (for the default scenario about half a percent of a core per unit of speed over a traffic
    cycle, twice that while its short requests fill 256 running slots). ``tick_s`` is how often
    the stepping thread wakes. If the process stalls (suspended laptop, debugger), at most
    ``max_catch_up_s`` wall-clock seconds of the stall are made up at the next tick and the rest
    is skipped: the simulation falls behind the clock rather than burn a core catching up.

    ``/metrics`` serves the figures as of the last tick, taken when the tick ends, so a scrape
    never waits for a tick's steps (at high speed one tick can take a tenth of a second or more).
    """

    def __init__(
        self,
        simulation: Simulation,
        *,
        speed: float = 1.0,
        tick_s: float = 0.5,
        max_catch_up_s: float = 5.0,
        model_root: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        for name, value in (("speed", speed), ("tick", tick_s), ("catch-up", max_catch_up_s)):
            if not (value > 0 and math.isfinite(value)):
                raise SimServerError(f"simulation {name} is {value}; give a positive number")
        self.simulation = simulation
        self.speed = speed
        self.tick_s = tick_s
        self.max_catch_up_s = max_catch_up_s
        self.model_root = str(SIM_MODEL_DIR) if model_root is None else model_root
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: Set after every tick of the background thread, whether it stepped or failed (tests
        #: wait on it instead of sleeping).
        self.ticked = threading.Event()
        self._target = simulation.now
        #: What ``/metrics`` serves: replaced (one reference, atomically) after each pump.
        self._published = simulation.metrics()
        self._published_at = simulation.now
        self._last_clock = clock()
        self._started_at = wall_clock()
        self._failure: str | None = None
        self._httpd: _HTTPServer | None = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0: any free port), start stepping; return the base URL."""
        if self._httpd is not None:
            raise SimServerError("the simulated vLLM server is already running")
        try:
            httpd = _HTTPServer((host, port), _Handler, self)
        except OSError as exc:
            raise SimServerError(
                f"cannot listen on {host}:{port} for the simulated vLLM ({exc.strerror or exc}); "
                "choose another port"
            ) from exc
        self._httpd = httpd
        self._stop.clear()
        self._last_clock = self._clock()
        self._started_at = self._wall_clock()
        self._threads = [
            # A short poll interval only so that stop() returns quickly; it costs next to nothing.
            threading.Thread(target=httpd.serve_forever, args=(0.1,), name="sim-http", daemon=True),
            threading.Thread(target=self._step_forever, name="sim-stepper", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        log.info("sim_server_started", url=self.url, speed=self.speed)
        return self.url

    def stop(self) -> None:
        """Stop stepping and serving; safe to call twice."""
        self._stop.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=5.0)
        self._threads = []

    def __enter__(self) -> SimServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The base URL (``http://host:port``); raises if the server is not started."""
        if self._httpd is None:
            raise SimServerError("the simulated vLLM server is not running")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def simulated_seconds(self) -> float:
        """The simulated time of what ``/metrics`` serves (the last pump's).

        It falls behind ``speed`` x the wall-clock time when the stepping thread is starved of
        CPU (or a stall exceeds ``max_catch_up_s``), which is why the demo labels its lines with
        it and not with the wall clock.
        """
        return self._published_at

    @property
    def failure(self) -> str | None:
        """Why the stepping thread stopped, if it failed (``/health`` then answers 503)."""
        return self._failure

    # -- stepping ----------------------------------------------------------------------------

    def pump(self) -> None:
        """Advance the simulation by the clock time elapsed since the last pump, times speed."""
        now = self._clock()
        elapsed = max(0.0, now - self._last_clock)
        self._last_clock = now
        with self._lock:
            self._target += min(elapsed, self.max_catch_up_s) * self.speed
            self.simulation.advance_to(self._target)
            self._published = self.simulation.metrics()
            self._published_at = self.simulation.now

    def _step_forever(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.pump()
            except Exception as exc:
                # A bug in the simulation must not take the demo down silently: /health says so.
                self._failure = f"{type(exc).__name__}: {exc}"
                log.exception("sim_stepper_failed")
                return
            finally:
                self.ticked.set()

    # -- responses ---------------------------------------------------------------------------

    def metrics_body(self) -> bytes:
        """Return the ``/metrics`` payload as of the last pump (or the start)."""
        return render(self._published, self.simulation.scenario, started_at=self._started_at)

    def respond(self, path: str) -> tuple[HTTPStatus, str, bytes]:
        """Return status, content type and body for a GET of ``path`` (query string ignored)."""
        route = urlsplit(path).path
        if route == "/metrics":
            return HTTPStatus.OK, METRICS_CONTENT_TYPE, self.metrics_body()
        if route == "/v1/models":
            created = int(self._wall_clock())
            body = models_payload(self.simulation.scenario, root=self.model_root, created=created)
            return HTTPStatus.OK, _JSON, _json(body)
        if route == "/version":
            return HTTPStatus.OK, _JSON, _json({"version": SIM_VERSION})
        if route == "/health":
            if self._failure is not None:
                return HTTPStatus.SERVICE_UNAVAILABLE, _JSON, _json({"error": self._failure})
            return HTTPStatus.OK, _JSON, b""
        return HTTPStatus.NOT_FOUND, _JSON, _json({"detail": "Not Found"})


def _json(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler], app: SimServer) -> None:
        self.app = app
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "vllm-headroom-sim"
    #: A client that stalls mid-request gives its thread back after this many seconds.
    timeout = 10

    def do_GET(self) -> None:
        try:
            status, content_type, body = self.server.app.respond(self.path)
        except Exception:
            log.exception("sim_request_failed", path=self.path)
            status, content_type, body = (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                _JSON,
                _json({"detail": "simulation error"}),
            )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        # The simulation serves no completions: its traffic is generated inside it.
        body = _json({"detail": "Not Found (simulated vLLM: no inference endpoints)"})
        self.send_response(HTTPStatus.NOT_FOUND)
        self.send_header("Content-Type", _JSON)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # The sidecar polls every few seconds: an access log line per poll is noise.
        return
