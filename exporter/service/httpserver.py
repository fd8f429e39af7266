"""The exporter's HTTP endpoints and the server that carries them.

Endpoints: ``/metrics`` (prometheus_client's WSGI app over our private registry: content
negotiation, gzip and ``name[]`` filters come with it; in sidecar mode rendered once per poll
and served from :class:`CachedExposition`), ``/probe?target=URL`` in fleet mode,
``/-/healthy``, ``/-/ready`` and a landing page at ``/``.

The server is the standard library's threaded WSGI server with the guards that a sidecar next
to production inference needs:

- a socket timeout per connection (a slow or silent client cannot hold a thread for long);
- a bound on connections handled at once (a flood gets ``503`` instead of exhausting threads);
- when every slot is taken, the connection that has waited longest without sending a complete
  request head is dropped to make room (slowloris clients and stalled TLS handshakes hold slots
  without ever asking for anything; Prometheus sends its request as soon as it connects, so it
  always gets a slot back from them); failing that, the one longest stuck writing its answer to
  a client that does not read it (:data:`STALLED_WRITE_SECONDS`), so slow readers cannot hold
  every slot either;
- a deadline for writing a whole answer (:data:`RESPONSE_WRITE_SECONDS`), not only per write;
- a bound on the request head (request line and headers: :data:`MAX_HEAD_BYTES`), so that
  oversized headers cost kilobytes, not megabytes, per connection;
- TLS handshakes done in the connection's own thread (a client that stalls its handshake cannot
  block ``accept()`` for everyone else), and a listen backlog deep enough for a burst of
  connections not to leave a scraper waiting on SYN retries;
- a client that misbehaves is one debug log line, never a traceback on stderr.
"""

from __future__ import annotations

import contextlib
import gzip
import html
import http.client
import io
import os
import queue
import select
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler

import structlog
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted

from exporter.service import openmetrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from pathlib import Path

    from prometheus_client.registry import Collector

    StartResponse = Callable[..., Any]
    Environ = dict[str, Any]

#: Seconds a connection may stay silent (reading the request or writing the answer).
CONNECTION_TIMEOUT_SECONDS = 10.0
#: Seconds a whole answer may take to be written: a client reading it slower is dropped.
RESPONSE_WRITE_SECONDS = CONNECTION_TIMEOUT_SECONDS
#: A write blocked this long is stalled (the client does not read what it asked for; on a
#: network Prometheus reads a megabyte in milliseconds): when every slot is taken, the
#: connection stalled longest is dropped to make room for a new one.
STALLED_WRITE_SECONDS = 1.0
#: Connections handled at once; more get an immediate 503.
MAX_CONNECTIONS = 64
#: Largest request head (request line and headers) read; Prometheus sends a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Connections the kernel queues while the accept loop is busy (capped by net.core.somaxconn):
#: a burst must wait in the queue, not lose its SYN and retry a second or more later.
LISTEN_BACKLOG = 1024

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What a ``/probe`` request produced: a registry to render, or an HTTP error."""

    registry: Collector | None = None
    status: str = "200 OK"
    message: str = ""
    #: The registry's OpenMetrics text (underscore escaping) without client_python's objects,
    #: or None where it cannot; the registry's own rendering is used then, and for the rest.
    render_openmetrics: Callable[[], bytes | None] | None = None


#: The gzip level of a probe's answer, rendered for one scrape: the fastest. Of the real
#: capture's 21 kB of probe text, level 1 writes 4.7 kB in 0.05 ms, client_python's 9 writes
#: 4.1 kB in 0.18 ms, 2 % of a fleet exporter's CPU a probe (benchmarks/README.md).
PROBE_GZIP_LEVEL = 1
#: Variants (format and compression) of one rendering kept at most: a client picks the format
#: by its Accept header, whose version strings are free text.
MAX_CACHED_VARIANTS = 8
#: The ``/probe`` parameters passed on besides ``target``, each at most once: the target's pod
#: and its node's dcgm-exporter (fleet mode with gpu_source=dcgm; checked by the fleet).
PROBE_PARAMS = ("dcgm", "pod", "namespace")


class CachedExposition:
    """``/metrics`` as prometheus_client serves it, each variant rendered once per state.

    Rendering the exposition of a 64-engine target costs milliseconds of CPU under the GIL;
    rendered for every scraper, fifty of them at once (or a few beside slow readers) queue up
    for it. Here each variant (format, and gzip or not) is rendered once while
    ``generation()`` returns the same object (one per poll: the poller's view) and is younger
    than ``max_age_seconds``, then served to every scraper as the same bytes; scrapers that
    arrive during the render wait for it instead of rendering too. Requests other than a plain
    GET and ``name[]``-filtered ones go to prometheus_client's app, uncached. The answers are
    client_python's, byte for byte, with a Content-Length (so that HEAD has the GET's).
    """

    def __init__(
        self,
        registry: Collector,
        generation: Callable[[], object],
        *,
        max_age_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._uncached = make_wsgi_app(registry)
        self._generation = generation
        self._max_age = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._token: object = None
        self._rendered_at = -float("inf")
        self._variants: dict[tuple[str, bool], bytes] = {}
        #: Renderings made (for tests and the benchmark).
        self.renders = 0

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Serve one ``/metrics`` request."""
        if environ.get("REQUEST_METHOD") != "GET" or "name[]" in parse_qs(
            environ.get("QUERY_STRING", "")
        ):
            return self._uncached(environ, start_response)  # type: ignore[no-any-return]
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        gzipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        body = self._body(encoder, content_type, gzipped=gzipped)
        headers = [("Content-Type", content_type)]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        # Said here, not left to wsgiref: a HEAD (answered as a GET, body dropped) gets it too.
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    def _body(
        self, encoder: Callable[[Collector], bytes], content_type: str, *, gzipped: bool
    ) -> bytes:
        with self._lock:
            token, now = self._generation(), self._clock()
            if token is not self._token or now - self._rendered_at >= self._max_age:
                self._token, self._rendered_at, self._variants = token, now, {}
            found = self._variants.get((content_type, gzipped))
            if found is not None:
                return found
            plain = self._variants.get((content_type, False))
            if plain is None:
                plain = encoder(self._registry)
                self.renders += 1
                self._keep((content_type, False), plain)
            if not gzipped:
                return plain
            packed = gzip.compress(plain)
            self._keep((content_type, True), packed)
            return packed

    def _keep(self, key: tuple[str, bool], body: bytes) -> None:
        if len(self._variants) < MAX_CACHED_VARIANTS:
            self._variants[key] = body


class HeadroomApp:
    """The WSGI application routing our endpoints."""

    def __init__(
        self,
        *,
        registry: Collector,
        ready: Callable[[], tuple[bool, str]],
        landing: Callable[[], str],
        probe: Callable[[str, float | None, str, Mapping[str, str]], ProbeAnswer] | None = None,
        metrics: Callable[[Environ, StartResponse], Iterable[bytes]] | None = None,
    ) -> None:
        #: ``/metrics``: prometheus_client's app over ``registry`` unless given (cached).
        self._metrics = metrics or make_wsgi_app(registry)
        self._ready = ready
        self._landing = landing
        self._probe = probe

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Route one request."""
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _text(start_response, "405 Method Not Allowed", "Use GET.\n", allow=True)
        routes = {
            "/metrics": self._metrics,
            "/probe": self._serve_probe,
            "/-/healthy": self._serve_healthy,
            "/-/ready": self._serve_ready,
            "/": self._serve_landing,
        }
        handler = routes.get(environ.get("PATH_INFO", "/"))
        body: Iterable[bytes]
        if handler is None:
            body = _text(start_response, "404 Not Found", "Not found. See / for the endpoints.\n")
        elif environ.get("REQUEST_METHOD") == "HEAD":
            # Answered as a GET (prometheus_client's app refuses HEAD with 405), body dropped.
            body = handler({**environ, "REQUEST_METHOD": "GET"}, start_response)
        else:
            body = handler(environ, start_response)
        if environ.get("REQUEST_METHOD") == "HEAD":
            # The headers of the GET (Content-Length included), never its body (RFC 9110 9.3.2).
            close = getattr(body, "close", None)
            if close is not None:
                close()
            return []
        return body

    def _serve_healthy(self, _environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        return _text(start_response, "200 OK", "Healthy.\n")

    def _serve_ready(self, _environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        ready, why = self._ready()
        if ready:
            return _text(start_response, "200 OK", "Ready.\n")
        return _text(start_response, "503 Service Unavailable", f"Not ready: {why}\n")

    def _serve_landing(self, _environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        body = self._landing().encode()
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))]
        start_response("200 OK", headers)
        return [body]

    def _serve_probe(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if self._probe is None:
            return _text(
                start_response,
                "404 Not Found",
                "/probe is served in fleet mode only (--mode fleet).\n",
            )
        params = parse_qs(environ.get("QUERY_STRING", ""))
        targets = params.get("target", [])
        if len(targets) != 1 or not targets[0]:
            return _text(start_response, "400 Bad Request", "Give exactly one ?target=URL.\n")
        extra: dict[str, str] = {}
        for name in PROBE_PARAMS:
            given = params.get(name, [])
            if len(given) > 1:
                return _text(start_response, "400 Bad Request", f"Give at most one ?{name}=.\n")
            if given:
                extra[name] = given[0]
        scrape_timeout = _scrape_timeout(environ.get("HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS"))
        client = str(environ.get("REMOTE_ADDR", ""))
        answer = self._probe(targets[0], scrape_timeout, client, extra)
        if answer.registry is None:
            return _text(start_response, answer.status, f"{answer.message}\n")
        return _exposition(answer.registry, environ, start_response, answer.render_openmetrics)


class StartErrorApp:
    """What ``serve --on-start-error wait`` answers after a start-up error, until it is stopped.

    Beside vLLM in its pod, an exporter that exits is restarted with a growing back-off, and a
    container in back-off makes the whole pod unready: vLLM leaves its Service for a typo in a
    monitoring setting. Waiting keeps the pod ready and shows the error where an operator looks:
    every path but ``/-/healthy`` answers 503 with it (Prometheus's ``up`` for the exporter is 0,
    so VllmHeadroomTargetDown or VllmHeadroomExporterAbsent fires), and ``/-/healthy`` answers
    200, as a liveness probe restarting the container would not mend a setting.
    """

    def __init__(self, message: str) -> None:
        self._text = f"vllm-headroom did not start: {message}\n"

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Answer one request: 200 on ``/-/healthy``, else 503 naming the error."""
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _text(start_response, "405 Method Not Allowed", "Use GET.\n", allow=True)
        if environ.get("PATH_INFO") == "/-/healthy":
            body = _text(start_response, "200 OK", "Alive, not started: see /metrics.\n")
        else:
            body = _text(start_response, "503 Service Unavailable", self._text)
        return [] if method == "HEAD" else body


def _exposition(
    registry: Collector,
    environ: Environ,
    start_response: StartResponse,
    fast: Callable[[], bytes | None] | None = None,
) -> Iterable[bytes]:
    """A probe's answer as prometheus_client's app gives it (format by Accept, gzip), faster.

    OpenMetrics, what Prometheus asks for, is written by ``fast`` (the probe's families with no
    client_python objects), else rendered by :mod:`exporter.service.openmetrics`: the same
    bytes either way; other formats by prometheus_client's encoder. Never ``name[]``-filtered:
    the probe's query string is its parameters.
    """
    encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
    body = None
    if openmetrics.is_fast(encoder):
        body = fast() if fast is not None else None
        if body is None:
            body = openmetrics.render(registry)
    if body is None:
        body = encoder(registry)
    headers = [("Content-Type", content_type)]
    if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
        body = gzip.compress(body, compresslevel=PROBE_GZIP_LEVEL)
        headers.append(("Content-Encoding", "gzip"))
    headers.append(("Content-Length", str(len(body))))
    start_response("200 OK", headers)
    return [body]


def _scrape_timeout(header: str | None) -> float | None:
    try:
        value = float(header) if header else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < 3600 else None


def _text(
    start_response: StartResponse, status: str, text: str, *, allow: bool = False
) -> list[bytes]:
    body = text.encode()
    headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    if allow:
        headers.append(("Allow", "GET, HEAD"))
    start_response(status, headers)
    return [body]


def landing_page(*, title: str, rows: Iterable[tuple[str, str]], probe: bool) -> str:
    """The HTML of ``/``: links to the endpoints and a table of facts (escaped)."""
    links = ['<li><a href="/metrics">/metrics</a>: derived gauges and exporter health</li>']
    if probe:
        links.append("<li>/probe?target=URL: derived gauges of an allowed vLLM target</li>")
    links += [
        '<li><a href="/-/healthy">/-/healthy</a>: the process answers</li>',
        '<li><a href="/-/ready">/-/ready</a>: the first poll of the target succeeded</li>',
    ]
    table = "".join(
        f"<tr><th>{html.escape(key)}</th><td>{html.escape(value)}</td></tr>" for key, value in rows
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1><ul>{''.join(links)}</ul>"
        f"<table>{table}</table></body></html>\n"
    )


class _HeadLimit:
    """A connection's input stream that refuses request heads over ``limit`` bytes.

    ``http.server`` reads the request line and up to 100 header lines of 64 KiB each: 6.5 MB a
    connection. Past ``limit`` this raises ``LineTooLong``, which ``parse_request`` answers
    with 431. The body is never read (every endpoint is GET).
    """

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._left = limit

    def readline(self, size: int = -1) -> bytes:
        """A line, counted against the head's budget."""
        budget = self._left + 1
        line: bytes = self._stream.readline(budget if size < 0 else min(size, budget))
        self._left -= len(line)
        if self._left < 0:
            msg = f"request head larger than {MAX_HEAD_BYTES} bytes"
            raise http.client.LineTooLong(msg)
        return line

    def read(self, size: int = -1) -> bytes:
        """Body bytes (not counted: only the head is bounded here)."""
        data: bytes = self._stream.read(size)
        return data

    def close(self) -> None:
        """Close the underlying stream."""
        self._stream.close()


class _BoundedWriter(io.BufferedIOBase):
    """A connection's output stream: the whole answer is written within a deadline.

    Each write tells the server when it started blocking, so that a connection stuck writing
    to a client that does not read can be evicted (:meth:`ExporterServer.write_started`).
    """

    def __init__(self, connection: socket.socket, server: ExporterServer) -> None:
        self._connection = connection
        self._server = server
        self._deadline: float | None = None

    def writable(self) -> bool:
        """Always."""
        return True

    def write(self, data: Any) -> int:
        """Send ``data`` whole before the answer's deadline, or raise ``TimeoutError``."""
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + RESPONSE_WRITE_SECONDS
        left = self._deadline - now
        if left <= 0:
            msg = f"answer not read within {RESPONSE_WRITE_SECONDS:g} s"
            raise TimeoutError(msg)
        self._connection.settimeout(left)
        self._server.write_started(self._connection, now)
        try:
            self._connection.sendall(data)
        finally:
            self._server.write_ended()
        with memoryview(data) as view:
            return view.nbytes

    def fileno(self) -> int:
        """The socket's descriptor."""
        return self._connection.fileno()


class _NullStream:
    """``wsgi.errors``: wsgiref writes tracebacks there (a client that left mid-answer)."""

    def write(self, text: str) -> int:
        """Discard (the connection is logged once by the server)."""
        return len(text)

    def flush(self) -> None:
        """Nothing to flush."""


class _QuietHandler(WSGIRequestHandler):
    """Request handler with a socket timeout, a bounded head and no per-request log lines."""

    timeout = CONNECTION_TIMEOUT_SECONDS
    server: ExporterServer

    def setup(self) -> None:
        """Wrap the streams: the request head is bounded, the answer's writing too."""
        super().setup()
        self.rfile = _HeadLimit(self.rfile, MAX_HEAD_BYTES)  # type: ignore[assignment]
        self.wfile = _BoundedWriter(self.connection, self.server)

    def handle(self) -> None:
        """One request; a request line past the head's bound is answered 431, as headers are.

        ``parse_request`` answers headers that are too long itself; the request line is read
        before it, and its ``LineTooLong`` used to end in a bare close.
        """
        try:
            super().handle()
        except http.client.LineTooLong:
            self.requestline = self.request_version = self.command = ""
            self.close_connection = True
            self.send_error(431, "Request Header Fields Too Large")
            _drain(self.connection)

    def parse_request(self) -> bool:
        """Parse the head; once it is complete, the connection can no longer be evicted.

        A connection evicted while its thread was parsing a whole head (its slot already went
        to another, and the evicting thread answered it 503) is not served.
        """
        parsed: bool = super().parse_request()
        if not self.server.request_received():
            self.close_connection = True
            return False
        return parsed

    def get_stderr(self) -> Any:
        """Where wsgiref writes tracebacks: nowhere (see :meth:`ExporterServer.handle_error`)."""
        return _NullStream()

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: Prometheus scrapes every few seconds."""


class ExporterServer(ThreadingWSGIServer):
    """Threaded WSGI server: bounded connections, eviction when full, TLS in each thread."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        app: HeadroomApp | StartErrorApp,
        *,
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        # Before binding: a failed bind calls server_close(), which stops it.
        self._refuser = _Refuser()
        super().__init__(address, _QuietHandler)
        self.set_app(app)
        self.tls = tls
        self._slots = threading.BoundedSemaphore(max_connections)
        # Connections holding a slot without a complete request head yet: thread id -> when
        # accepted, and the socket (to shut down if evicted).
        self._waiting: dict[int, tuple[float, socket.socket]] = {}
        # Connections blocked writing their answer: thread id -> since when, and the socket.
        self._writing: dict[int, tuple[float, socket.socket]] = {}
        # Threads of evicted connections: their slot went to the connection that evicted them.
        self._evicted: set[int] = set()
        self._waiting_lock = threading.Lock()
        #: Connections dropped to make room (slowloris, stalled handshakes, slow readers); for
        #: tests and logs.
        self.evictions = 0
        #: Of which connections stuck writing their answer to a client that did not read it.
        self.stalled_writers_evicted = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hand the connection to a thread; when all slots are busy, evict or answer 503."""
        # An evicted connection hands its slot over at once: the accept loop never waits for
        # its thread to wind down (a queue of stalled clients would add up those waits).
        if not self._slots.acquire(blocking=False) and not self._evict_one():
            self._refuser.refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection in its own thread, then free its slot."""
        ident = threading.get_ident()
        with self._waiting_lock:
            self._waiting[ident] = (time.monotonic(), request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._waiting_lock:
                self._waiting.pop(ident, None)
                self._writing.pop(ident, None)
                handed_over = ident in self._evicted
                self._evicted.discard(ident)
            if not handed_over:
                self._slots.release()

    def request_received(self) -> bool:
        """The calling connection sent its whole request head: it is no longer evictable.

        False when it was evicted before (its slot went to another connection).
        """
        ident = threading.get_ident()
        with self._waiting_lock:
            self._waiting.pop(ident, None)
            return ident not in self._evicted

    def write_started(self, connection: socket.socket, since: float) -> None:
        """The calling connection blocks writing its answer from ``since`` (see eviction)."""
        with self._waiting_lock:
            self._writing[threading.get_ident()] = (since, connection)

    def write_ended(self) -> None:
        """The calling connection's write returned (whole, or failed)."""
        with self._waiting_lock:
            self._writing.pop(threading.get_ident(), None)

    def _evict_one(self) -> bool:
        """Evict a connection waiting for its head, else one stalled writing; True if done.

        On True, the caller holds the victim's slot.
        """
        return self._evict_oldest_waiting() or self._evict_stalled_writer()

    def _evict_stalled_writer(self) -> bool:
        """Shut down the connection blocked longest writing its answer, if it is stalled.

        Only a write blocked for :data:`STALLED_WRITE_SECONDS` or more counts: an answer being
        computed, or written to a client that reads, is never cut short. The client gets no
        503 (its answer was under way): its connection is closed.
        """
        with self._waiting_lock:
            stalled = self._stalled_writers()
            if not stalled:
                return False
            ident, victim = stalled[0]
            del self._writing[ident]
            self._evicted.add(ident)
            self.evictions += 1
            self.stalled_writers_evicted += 1
        # Its thread wakes from sendall() at once, fails, and ends without freeing the slot.
        with contextlib.suppress(OSError):
            victim.shutdown(socket.SHUT_RDWR)
        if self.stalled_writers_evicted in (1, 10, 100) or self.stalled_writers_evicted % 1000 == 0:
            log.warning("http_stalled_readers_evicted", total=self.stalled_writers_evicted)
        return True

    def blocked_writer_count(self) -> int:
        """How many connections are in a write now, blocked or not yet returned."""
        with self._waiting_lock:
            return len(self._writing)

    def stalled_writer_count(self) -> int:
        """How many connections are stalled writing now: those a new connection may evict."""
        with self._waiting_lock:
            return len(self._stalled_writers())

    def _stalled_writers(self) -> list[tuple[int, socket.socket]]:
        """Connections blocked writing for :data:`STALLED_WRITE_SECONDS` or more, oldest first.

        The caller holds the lock. A writable connection is not stalled: the client reads, or
        the write is done and its thread only waits for the CPU to say so.
        """
        stalled_before = time.monotonic() - STALLED_WRITE_SECONDS
        return [
            (ident, victim)
            for ident, (since, victim) in sorted(self._writing.items(), key=lambda item: item[1][0])
            if since <= stalled_before and not _writable(victim)
        ]

    def _evict_oldest_waiting(self) -> bool:
        """Shut down the connection that has waited longest for its request head, if any.

        A connection whose whole head already sits in its socket is not idle (its thread has
        not had the CPU yet) and is passed over: the new connection gets 503 rather than a
        client that sent its request whole getting nothing. On True, the caller holds the
        victim's slot.
        """
        with self._waiting_lock:
            candidates = sorted(self._waiting.items(), key=lambda item: item[1][0])
            for ident, (_, victim) in candidates:
                if self.tls is None and whole_head_waiting(victim):
                    continue
                del self._waiting[ident]
                self._evicted.add(ident)
                self.evictions += 1
                # The victim gets a 503 (a client that connected first and sends its request
                # later reads it, not a bare close; over TLS the bytes would be garbage, so
                # none). Sent under the lock: a victim whose thread has just read its head
                # learns it was evicted (request_received) only after the 503 is on its way,
                # so the thread cannot close the connection first, leaving a bare close.
                if self.tls is None:
                    with contextlib.suppress(OSError):
                        victim.send(_BUSY)
                break
            else:
                return False
        # Its thread wakes from recv() (or the TLS handshake) at once and ends. If the socket
        # closed by itself meanwhile, the thread is ending anyway.
        with contextlib.suppress(OSError):
            victim.shutdown(socket.SHUT_RDWR)
        if self.evictions in (1, 10, 100) or self.evictions % 1000 == 0:
            log.warning("http_idle_connections_evicted", total=self.evictions)
        return True

    def server_close(self) -> None:
        """Close the listening socket and stop answering refused connections."""
        super().server_close()
        self._refuser.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection failed (timeout, reset, bad TLS): one debug line, not a traceback."""
        exc = sys.exc_info()[1]
        log.debug("http_connection_failed", error=type(exc).__name__ if exc else None)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Do the TLS handshake here, in the connection's thread, under the timeout."""
        if self.tls is not None:
            request.settimeout(CONNECTION_TIMEOUT_SECONDS)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
        super().finish_request(request, client_address)


_MAX_HEAD = MAX_HEAD_BYTES
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Refuser:
    """Answers 503 to connections past the limit, on a thread of its own, and closes gently.

    Closing a socket whose request was not read makes the kernel send a reset, which can reach
    the client before the 503 does: the client then sees no answer at all. So the refused
    connection is half-closed after the answer and its request read before
    it is closed (a client that sends nothing costs 50 ms). The accept loop only queues the
    connection; when the queue is full (a flood) the connection gets the 503 and a plain close.
    """

    def __init__(self, backlog: int = 1024) -> None:
        self._queue: queue.Queue[socket.socket | None] = queue.Queue(backlog)
        self._thread = threading.Thread(target=self._run, name="http-refuser", daemon=True)
        self._thread.start()

    def refuse(self, connection: socket.socket) -> None:
        """Answer 503 to ``connection`` and close it (does not block the caller)."""
        try:
            self._queue.put_nowait(connection)
        except queue.Full:
            with contextlib.suppress(OSError):
                connection.settimeout(0.1)
                connection.sendall(_BUSY)
            _close(connection)

    def close(self) -> None:
        """End the thread once the connections queued before are answered."""
        self._queue.put(None)
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            connection = self._queue.get()
            if connection is None:
                return
            try:
                connection.settimeout(0.05)  # a silent client costs this much, no more
                connection.sendall(_BUSY)
                connection.shutdown(socket.SHUT_WR)
                connection.recv(_MAX_HEAD)  # the unread request: read, so no reset is sent
            except OSError:
                pass
            finally:
                _close(connection)


def whole_head_waiting(connection: socket.socket) -> bool:
    """Whether the bytes waiting in ``connection`` (unread, peeked) end a request head.

    Peeked through a non-blocking duplicate: the connection's own socket has a timeout, and a
    socket with a timeout waits for data (up to that timeout) even when asked not to.
    """
    try:
        with socket.socket(fileno=os.dup(connection.fileno())) as peek:
            peek.setblocking(False)
            waiting = peek.recv(_MAX_HEAD, socket.MSG_PEEK)
    except OSError:  # nothing waiting (EAGAIN), or the connection is gone
        return False
    return b"\r\n\r\n" in waiting or b"\n\n" in waiting


#: What is read of a refused request's rest, and for how long, so that closing sends no reset
#: (a client reads the answer only if the connection is not reset under it).
DRAIN_BYTES = 1024 * 1024
DRAIN_SECONDS = 1.0


def _drain(connection: socket.socket) -> None:
    """Send what was written, then read and drop a bounded rest of the request."""
    deadline = time.monotonic() + DRAIN_SECONDS
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_WR)
        left = DRAIN_BYTES
        while left > 0 and (wait := deadline - time.monotonic()) > 0:
            connection.settimeout(wait)
            chunk = connection.recv(min(65536, left))
            if not chunk:
                return
            left -= len(chunk)


def _writable(connection: socket.socket) -> bool:
    """Whether ``connection`` has room to send (poll, not select: any descriptor number)."""
    poller = select.poll()
    try:
        poller.register(connection, select.POLLOUT)
    except (OSError, ValueError):  # closed meanwhile
        return False
    return bool(poller.poll(0))


def _close(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.close()


class EncryptedKeyError(ValueError):
    """The TLS key is encrypted: the exporter never asks for a passphrase."""


def _no_passphrase() -> bytes:
    # Called by OpenSSL only for an encrypted key; without a callback it prompts on the terminal.
    msg = "the key is encrypted; give an unencrypted key (the exporter never asks for a passphrase)"
    raise EncryptedKeyError(msg)


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2+) from PEM files, with the standard library's defaults."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file), password=_no_passphrase)
    return context


__all__ = [
    "CachedExposition",
    "ExporterServer",
    "HeadroomApp",
    "ProbeAnswer",
    "landing_page",
    "tls_context",
]
