"""The exporter's HTTP endpoints and the server that carries them.

Endpoints: ``/metrics`` (prometheus_client's WSGI app over our private registry: content
negotiation, gzip and ``name[]`` filters come with it), ``/probe?target=URL`` in fleet mode,
``/-/healthy``, ``/-/ready`` and a landing page at ``/``.

The server is the standard library's threaded WSGI server with three guards that a sidecar next
to production inference needs: a socket timeout per connection (a slow or silent client cannot
hold a thread for long), a bound on connections handled at once (a flood gets ``503`` instead of
exhausting threads), and TLS handshakes done in the connection's own thread (a client that
stalls its handshake cannot block ``accept()`` for everyone else).
"""

from __future__ import annotations

import html
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from prometheus_client.registry import Collector

    StartResponse = Callable[..., Any]
    Environ = dict[str, Any]

#: Seconds a connection may stay silent (reading the request or writing the answer).
CONNECTION_TIMEOUT_SECONDS = 10.0
#: Connections handled at once; more get an immediate 503.
MAX_CONNECTIONS = 64


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What a ``/probe`` request produced: a registry to render, or an HTTP error."""

    registry: Collector | None = None
    status: str = "200 OK"
    message: str = ""


class HeadroomApp:
    """The WSGI application routing our endpoints."""

    def __init__(
        self,
        *,
        registry: Collector,
        ready: Callable[[], tuple[bool, str]],
        landing: Callable[[], str],
        probe: Callable[[str, float | None], ProbeAnswer] | None = None,
    ) -> None:
        self._metrics = make_wsgi_app(registry)
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
        if handler is None:
            return _text(start_response, "404 Not Found", "Not found. See / for the endpoints.\n")
        return handler(environ, start_response)

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
        scrape_timeout = _scrape_timeout(environ.get("HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS"))
        answer = self._probe(targets[0], scrape_timeout)
        if answer.registry is None:
            return _text(start_response, answer.status, f"{answer.message}\n")
        inner = dict(environ)
        inner["QUERY_STRING"] = ""  # our target= is not a name[] filter
        return make_wsgi_app(answer.registry)(inner, start_response)  # type: ignore[no-any-return]


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


class _QuietHandler(WSGIRequestHandler):
    """Request handler with a socket timeout and no per-request log lines."""

    timeout = CONNECTION_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: Prometheus scrapes every few seconds."""


class ExporterServer(ThreadingWSGIServer):
    """Threaded WSGI server with a connection bound and per-connection TLS handshakes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        app: HeadroomApp,
        *,
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _QuietHandler)
        self.set_app(app)
        self.tls = tls
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hand the connection to a thread, or answer 503 at once when all slots are busy."""
        if not self._slots.acquire(blocking=False):
            _refuse(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection in its own thread, then free its slot."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Do the TLS handshake here, in the connection's thread, under the timeout."""
        if self.tls is not None:
            request.settimeout(CONNECTION_TIMEOUT_SECONDS)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
        super().finish_request(request, client_address)


def _refuse(connection: socket.socket) -> None:
    try:
        connection.settimeout(1.0)
        connection.sendall(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    except OSError:
        pass


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2+) from PEM files, with the standard library's defaults."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    return context


__all__ = [
    "ExporterServer",
    "HeadroomApp",
    "ProbeAnswer",
    "landing_page",
    "tls_context",
]
