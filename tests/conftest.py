"""Shared fixtures: the real captures, and a static vLLM-like HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from hypothesis import settings

# Property tests judge behaviour, not speed: a machine busy with other work (CI, a vLLM on the
# CPU) must not turn a slow example into a failure.
settings.register_profile("headroom", deadline=None)
settings.load_profile("headroom")

if TYPE_CHECKING:
    from collections.abc import Iterator

#: ``../shared`` beside the repository: real captures and calibration data (read-only).
SHARED = Path(__file__).resolve().parents[2] / "shared"
CAPTURES = SHARED / "data" / "vllm-metrics"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the end-to-end tests last: their real vLLM keeps both CPUs busy while it runs."""
    items.sort(key=lambda item: "e2e" in item.keywords)


class StaticVllm(ThreadingHTTPServer):
    """A loopback HTTP server answering like vLLM from fixed (mutable) documents."""

    daemon_threads = True
    metrics: bytes
    models: ClassVar[dict[str, Any]] = {
        "object": "list",
        "data": [
            {"id": "tiny", "object": "model", "root": "/nonexistent/tiny", "max_model_len": 512}
        ],
    }
    version = "0.32.0"

    @property
    def url(self) -> str:
        """Base URL of the server."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: StaticVllm

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, self.server.metrics, "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/v1/models":
            self._send(200, json.dumps(self.server.models).encode(), "application/json")
        elif self.path == "/version":
            body = json.dumps({"version": self.server.version}).encode()
            self._send(200, body, "application/json")
        else:
            self._send(404, b"not found", "text/plain")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet."""


@pytest.fixture
def static_vllm() -> Iterator[StaticVllm]:
    """A vLLM-like server on a free loopback port serving the real 0.32 after-load capture."""
    server = StaticVllm(("127.0.0.1", 0), _Handler)
    server.metrics = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_bytes()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
