"""The simulated vLLM under load: completions sent to the demo's engine, in real or virtual time.

The simulated engine (:mod:`exporter.sim`) normally draws its own traffic. Here its requests come
from outside instead, one :class:`~exporter.sim.traffic.Arrival` per completion, through
:class:`PushArrivals`, and :class:`SimTracker` follows each one through the engine (waiting,
running, tokens generated, finished), so a load driver can be given the answer. Two targets:

- :class:`SimCompletionsServer`: a real HTTP server, the simulation stepped in real time times a
  speed factor (as ``vllm-headroom demo`` runs it), with ``/metrics``, ``/v1/models``, ``/version``
  and ``/health`` from :class:`~exporter.sim.server.SimServer` and a vLLM-like
  ``POST /v1/completions`` (token-id prompts, ``max_tokens``, ``stream`` with usage). For the
  probe command's tests over sockets, with the built-in httpx client.
- :class:`VirtualSimTarget`: no sockets and no wall clock. The probe's seams (metrics source, load
  driver, clock, pause) are backed by the simulation directly, and pausing advances simulated
  time, so a whole sweep of several simulated minutes runs in a second or two, deterministically.

Both run vLLM V1's scheduler as the simulation models it (paged blocks, ``max_num_seqs``,
recompute preemption). The simulation has no abort: a request whose client goes away keeps running
in the engine until it finishes, where vLLM would abort it
(:attr:`SimCompletionsServer.disconnected` counts those clients). Times the HTTP server shows are
simulated seconds divided by the speed.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from exporter.sim.engine import Simulation
from exporter.sim.exposition import render
from exporter.sim.server import SimServer
from exporter.sim.traffic import Arrival
from exporter.sweep.evaluate import RequestResult
from exporter.sweep.plan import Load, Mode
from exporter.vllm.metrics import parse_vllm_metrics

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Iterator, Sequence

    from exporter.core.snapshot import VllmSnapshot
    from exporter.sim.scenario import Scenario
    from exporter.sweep.shape import RequestShape


class PushArrivals:
    """An arrival stream that requests are pushed into from outside (thread-safe).

    The engine numbers requests in the order this stream hands them out, so the stream keeps
    that order: :meth:`request_id` says which engine request a pushed arrival became.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, Arrival]] = []
        self._handles = itertools.count()
        self._withdrawn: set[int] = set()
        #: Engine request id -> handle, in the order the engine took them.
        self._popped: list[int] = []
        self._ids: dict[int, int] = {}

    def push(self, arrival: Arrival) -> int:
        """Queue ``arrival``; return its handle."""
        with self._lock:
            handle = next(self._handles)
            heapq.heappush(self._heap, (arrival.time, handle, arrival))
            return handle

    def withdraw(self, handle: int) -> bool:
        """Take back an arrival the engine has not taken yet; False if it already has."""
        with self._lock:
            if handle in self._ids or handle in self._withdrawn:
                return False
            self._withdrawn.add(handle)
            return True

    def request_id(self, handle: int) -> int | None:
        """The engine's id of a pushed arrival, once the engine has taken it."""
        with self._lock:
            return self._ids.get(handle)

    @property
    def next_time(self) -> float:
        """Time of the next arrival (``inf`` when none is queued)."""
        with self._lock:
            self._drop_withdrawn()
            return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> list[Arrival]:
        """Remove and return every arrival at or before ``now``, in order."""
        due: list[Arrival] = []
        with self._lock:
            self._drop_withdrawn()
            while self._heap and self._heap[0][0] <= now:
                _, handle, arrival = heapq.heappop(self._heap)
                self._ids[handle] = len(self._popped)
                self._popped.append(handle)
                due.append(arrival)
                self._drop_withdrawn()
        return due

    def _drop_withdrawn(self) -> None:
        while self._heap and self._heap[0][1] in self._withdrawn:
            heapq.heappop(self._heap)


@dataclass(slots=True)
class Progress:
    """One pushed request's progress through the engine (simulated seconds)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    generated: int = 0
    first_token_s: float | None = None
    finished_s: float | None = None
    withdrawn: bool = False

    @property
    def finished(self) -> bool:
        """The engine finished it (or it was withdrawn before the engine took it)."""
        return self.finished_s is not None or self.withdrawn


class SimTracker:
    """A simulation fed from outside, and every pushed request's progress through it."""

    def __init__(self, scenario: Scenario) -> None:
        self.arrivals = PushArrivals()
        self.simulation = Simulation(scenario, arrivals=self.arrivals)
        self._progress: dict[int, Progress] = {}
        self._open: set[int] = set()
        self._lock = threading.Lock()

    def submit(self, prompt_tokens: int, output_tokens: int, *, at: float) -> int:
        """Push a request arriving at simulated time ``at``; return its handle."""
        arrival = Arrival(at, prompt_tokens, output_tokens, output_tokens, "length")
        with self._lock:
            handle = self.arrivals.push(arrival)
            self._progress[handle] = Progress(at, prompt_tokens, output_tokens)
            self._open.add(handle)
        return handle

    def withdraw(self, handle: int) -> None:
        """Drop a request the engine has not taken yet (a scheduled arrival not sent)."""
        if self.arrivals.withdraw(handle):
            with self._lock:
                self._progress[handle].withdrawn = True
                self._open.discard(handle)

    def progress(self, handle: int) -> Progress:
        """A copy of one request's progress."""
        with self._lock:
            p = self._progress[handle]
            return Progress(
                p.arrival_s,
                p.prompt_tokens,
                p.output_tokens,
                p.generated,
                p.first_token_s,
                p.finished_s,
                p.withdrawn,
            )

    def update(self) -> None:
        """Read the engine's queues and record what every open request has done since."""
        state = self.simulation.state()
        views = {v.request_id: v for v in (*state.running, *state.waiting)}
        now = state.now_s
        with self._lock:
            for handle in list(self._open):
                rid = self.arrivals.request_id(handle)
                if rid is None:
                    continue
                p = self._progress[handle]
                view = views.get(rid)
                generated = view.generated_tokens if view is not None else p.output_tokens
                if generated > p.generated:
                    p.generated = generated
                    if p.first_token_s is None:
                        p.first_token_s = now
                if view is None:
                    p.finished_s = now
                    self._open.discard(handle)

    @property
    def busy(self) -> bool:
        """Requests pushed and not finished."""
        with self._lock:
            return bool(self._open)


# -- virtual time -------------------------------------------------------------------------------


class VirtualSimTarget:
    """The probe's seams over a simulation in simulated time: source, driver, clock and pause."""

    def __init__(self, scenario: Scenario, *, resolution_s: float = 0.01) -> None:
        self.tracker = SimTracker(scenario)
        self.scenario = scenario
        self.resolution_s = resolution_s
        self._t = 0.0
        self.driver = _VirtualDriver(self)

    def clock(self) -> float:
        """Simulated seconds."""
        return self._t

    async def pause(self, seconds: float) -> None:
        """Advance the simulation by ``seconds``, following requests at the resolution."""
        end = self._t + max(seconds, 0.0)
        while self._t < end:
            self._t = min(end, self._t + self.resolution_s)
            self.tracker.simulation.advance_to(self._t)
            self.tracker.update()
            self.driver.refill()

    async def read(self) -> VllmSnapshot:
        """The engine's ``/metrics``, rendered and parsed as the probe reads vLLM's."""
        payload = render(self.tracker.simulation.metrics(), self.scenario, started_at=0.0)
        return parse_vllm_metrics(payload)


class _VirtualDriver:
    """A load driver that pushes requests straight into the simulated engine."""

    name = "simulated engine (virtual time)"

    def __init__(self, target: VirtualSimTarget) -> None:
        self._target = target
        self._handles: list[int] = []
        self._queue: Iterator[RequestShape] = iter(())
        self._clients = 0
        self._closed_loop = False
        self._stopped = False
        self._last_arrival = 0.0

    async def start(
        self, load: Load, requests: Sequence[RequestShape], *, offsets: Sequence[float] | None
    ) -> None:
        """Push the step's arrivals (rate mode) or its first ``concurrency`` requests."""
        tracker = self._target.tracker
        now = self._target.clock()
        self._handles = []
        self._stopped = False
        self._closed_loop = load.mode != Mode.RATE or offsets is None
        if not self._closed_loop and offsets is not None:
            for shape, offset in zip(requests, offsets, strict=False):
                self._handles.append(
                    tracker.submit(shape.prompt_tokens, shape.output_tokens, at=now + offset)
                )
            self._last_arrival = now + (offsets[-1] if offsets else 0.0)
            return
        self._queue = iter(requests)
        self._clients = load.concurrency
        self.refill()

    def refill(self) -> None:
        """Closed loop: keep ``concurrency`` requests in flight while requests are left."""
        if not self._closed_loop or self._stopped:
            return
        tracker = self._target.tracker
        in_flight = sum(not tracker.progress(h).finished for h in self._handles)
        while in_flight < self._clients:
            shape = next(self._queue, None)
            if shape is None:
                return
            at = self._target.clock()
            self._handles.append(tracker.submit(shape.prompt_tokens, shape.output_tokens, at=at))
            in_flight += 1

    @property
    def sending_done(self) -> bool:
        """Every request was sent: the schedule passed, or the closed loop's list is spent."""
        if self._stopped:
            return True
        if not self._closed_loop:
            return self._target.clock() >= self._last_arrival
        tracker = self._target.tracker
        spent = next(self._peek(), None) is None
        return spent and all(tracker.progress(h).finished for h in self._handles)

    def _peek(self) -> Iterator[RequestShape]:
        first = next(self._queue, None)
        if first is None:
            return iter(())
        self._queue = itertools.chain([first], self._queue)
        return iter([first])

    def stop_sending(self) -> None:
        """Withdraw arrivals not yet due and send no more."""
        self._stopped = True
        for handle in self._handles:
            self._target.tracker.withdraw(handle)

    async def finish(self, *, drain_s: float, abort: asyncio.Event) -> list[RequestResult]:
        """Advance until the requests finish (up to ``drain_s``); return them.

        With ``abort`` set, those unfinished are marked cancelled (the simulation runs them on).
        """
        self.stop_sending()
        tracker = self._target.tracker
        deadline = self._target.clock() + drain_s
        while not abort.is_set() and self._target.clock() < deadline:
            if all(tracker.progress(h).finished for h in self._handles):
                break
            await self._target.pause(self._target.resolution_s * 10)
        results = []
        for handle in self._handles:
            p = tracker.progress(handle)
            if p.withdrawn:
                continue
            done = p.finished_s is not None
            results.append(
                RequestResult(
                    prompt_tokens=p.prompt_tokens,
                    output_tokens=p.output_tokens,
                    start_s=p.arrival_s,
                    end_s=p.finished_s
                    if done and p.finished_s is not None
                    else self._target.clock(),
                    first_token_s=p.first_token_s,
                    generated_tokens=p.generated,
                    error=None if done else "cancelled",
                )
            )
        return results


# -- real time over HTTP ------------------------------------------------------------------------


class SimCompletionsServer:
    """The simulated vLLM over HTTP with ``POST /v1/completions``, stepped in real time x speed.

    ``with SimCompletionsServer(scenario, speed=20) as server: server.url``. Completions take
    simulated time divided by ``speed`` of wall-clock time.
    """

    def __init__(self, scenario: Scenario, *, speed: float = 1.0, tick_s: float = 0.02) -> None:
        self.tracker = SimTracker(scenario)
        self.scenario = scenario
        self.sim = SimServer(self.tracker.simulation, speed=speed, tick_s=tick_s)
        self.tick_s = tick_s
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._httpd: _CompletionsHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        #: Streaming clients that went away before their completion ended.
        self.disconnected = 0
        #: Completions received.
        self.received = 0
        self._count_lock = threading.Lock()

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen (0: any free port) and start stepping; return the base URL."""
        httpd = _CompletionsHTTPServer((host, port), _CompletionsHandler, self)
        self._httpd = httpd
        self._threads = [
            threading.Thread(target=httpd.serve_forever, args=(0.1,), daemon=True),
            threading.Thread(target=self._step_forever, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self.url

    @property
    def url(self) -> str:
        """``http://host:port``."""
        if self._httpd is None:
            raise RuntimeError("not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        """Stop serving and stepping; safe to call twice."""
        self._stop.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        with self._changed:
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=5.0)
        self._threads = []

    def __enter__(self) -> SimCompletionsServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _step_forever(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.sim.pump()
            self.tracker.update()
            with self._changed:
                self._changed.notify_all()

    def running_and_waiting(self) -> tuple[int, int]:
        """The engine's running and waiting requests now."""
        state = self.tracker.simulation.state()
        return len(state.running), len(state.waiting)

    def _count(self, *, received: int = 0, disconnected: int = 0) -> None:
        with self._count_lock:
            self.received += received
            self.disconnected += disconnected

    def complete(self, body: dict[str, Any], handler: _CompletionsHandler) -> None:
        """Serve one ``POST /v1/completions``: stream tokens as the engine generates them."""
        prompt = body.get("prompt")
        max_tokens = body.get("max_tokens", 16)
        served = self.scenario.model.served_name
        if body.get("model") != served:
            handler.reply(HTTPStatus.NOT_FOUND, {"error": {"message": f"model is {served}"}})
            return
        if isinstance(prompt, str):
            prompt_tokens = max(1, len(prompt.split()))
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt_tokens = len(prompt)
        else:
            handler.reply(HTTPStatus.BAD_REQUEST, {"error": {"message": "prompt"}})
            return
        limit = self.scenario.engine.max_model_len
        if not isinstance(max_tokens, int) or max_tokens < 1 or prompt_tokens + max_tokens > limit:
            handler.reply(HTTPStatus.BAD_REQUEST, {"error": {"message": "max_model_len"}})
            return
        self._count(received=1)
        handle = self.tracker.submit(prompt_tokens, max_tokens, at=self.tracker.simulation.now)
        stream = bool(body.get("stream"))
        if not stream:
            while not self.tracker.progress(handle).finished and not self._stop.is_set():
                with self._changed:
                    self._changed.wait(timeout=1.0)
            handler.reply(HTTPStatus.OK, _completion(served, "", max_tokens, prompt_tokens))
            return
        handler.start_stream()
        sent = 0
        try:
            while not self._stop.is_set():
                progress = self.tracker.progress(handle)
                chunks = [
                    _chunk(served, {"text": " t", "index": 0, "finish_reason": None})
                    for _ in range(progress.generated - sent)
                ]
                sent = progress.generated
                if progress.finished:
                    chunks.append(
                        _chunk(served, {"text": "", "index": 0, "finish_reason": "length"})
                    )
                    usage = _usage(prompt_tokens, max_tokens)
                    chunks.append(_chunk(served, None, usage=usage))
                    chunks.append(b"data: [DONE]\n\n")
                handler.write(b"".join(chunks))
                if progress.finished:
                    return
                with self._changed:
                    self._changed.wait(timeout=1.0)
        except (BrokenPipeError, ConnectionResetError):
            self._count(disconnected=1)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _completion(model: str, text: str, tokens: int, prompt_tokens: int) -> dict[str, Any]:
    return {
        "id": "cmpl-simulated",
        "object": "text_completion",
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
        "usage": _usage(prompt_tokens, tokens),
    }


def _chunk(
    model: str, choice: dict[str, Any] | None, *, usage: dict[str, int] | None = None
) -> bytes:
    document: dict[str, Any] = {
        "id": "cmpl-simulated",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [] if choice is None else [choice],
    }
    if usage is not None:
        document["usage"] = usage
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


class _CompletionsHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[_CompletionsHandler],
        app: SimCompletionsServer,
    ) -> None:
        self.app = app
        super().__init__(address, handler)


class _CompletionsHandler(BaseHTTPRequestHandler):
    server: _CompletionsHTTPServer
    server_version = "vllm-headroom-sim"

    def do_GET(self) -> None:
        status, content_type, body = self.server.app.sim.respond(self.path)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self.reply(HTTPStatus.BAD_REQUEST, {"error": {"message": "invalid JSON"}})
            return
        if self.path.split("?", 1)[0] != "/v1/completions" or not isinstance(body, dict):
            self.reply(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
            return
        self.server.app.complete(body, self)

    def reply(self, status: HTTPStatus, document: dict[str, Any]) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        # HTTP/1.0 without a length: the stream ends when the connection closes.
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.flush()

    def write(self, data: bytes) -> None:
        if data:
            self.wfile.write(data)
            self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        return
