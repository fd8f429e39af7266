"""A real Alertmanager running the shipped example, and a webhook receiver counting notifications.

Shared by the fast routing tests (``tests/test_alertmanager.py``, alerts posted to its API) and the
end-to-end page (``tests/e2e/test_alerting_e2e.py``, alerts sent by a real Prometheus).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from exporter.testing.processes import wait_until
from tests import paths
from tests.e2e.harness import (
    ProcessGroup,
    alertmanager_binary,
    free_port,
    loopback_client,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

EXAMPLE = paths.REPO / "alerts" / "alertmanager" / "vllm-headroom.yml"
RUNBOOKS = paths.REPO / "docs" / "runbooks"
#: Where the receiver takes each of the example's notifying receivers.
PATH_BY_RECEIVER = {"vllm-headroom-page": "/page", "vllm-headroom-ticket": "/ticket"}


@dataclass(frozen=True, slots=True)
class Notification:
    """One POST from Alertmanager: where, when (monotonic) and its JSON body."""

    path: str
    t: float
    body: dict[str, Any]

    def alerts(self, status: str) -> list[dict[str, Any]]:
        """The alerts of the notification with this status (firing or resolved)."""
        return [a for a in self.body["alerts"] if a["status"] == status]


class Receiver:
    """Webhook receiver (``POST /page``, ``POST /ticket``) and the runbooks (``GET /runbooks``)."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with receiver.lock:
                    receiver.notifications.append(Notification(self.path, time.monotonic(), body))
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                name = self.path.removeprefix("/runbooks/")
                page = RUNBOOKS / name
                if self.path.startswith("/runbooks/") and "/" not in name and page.is_file():
                    data = page.read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/markdown")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self.send_response(404)
                    self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def received(self, path: str) -> list[Notification]:
        """The notifications POSTed to ``path`` so far."""
        with self.lock:
            return [n for n in self.notifications if n.path == path]

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def example_config(receiver_url: str, *, group_wait: str | None = None) -> dict[str, Any]:
    """The shipped example with its receivers pointed at ``receiver_url``.

    ``group_wait``, when given, replaces every route's first wait (10 s for pages, 5 minutes for
    tickets) so that a test sees the first notifications in seconds; every other timing and every
    route, grouping and inhibition stays the shipped one.
    """
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    # Relative to the example, not to the copy a test writes elsewhere.
    config["templates"] = [str(EXAMPLE.parent / t) for t in config.get("templates", [])]
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = receiver_url + PATH_BY_RECEIVER[receiver["name"]]
    if group_wait is not None:
        routes = [config["route"]]
        while routes:
            route = routes.pop()
            if "group_wait" in route:
                route["group_wait"] = group_wait
            routes.extend(route.get("routes", []))
    return config


class AlertmanagerServer:
    """Debian's Alertmanager on loopback, no gossip port, with the given configuration."""

    def __init__(self, config: Mapping[str, Any], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config_path = workdir / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.group = ProcessGroup(
            [
                str(alertmanager_binary()),
                f"--config.file={self.config_path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            log_path=workdir / "alertmanager.log",
        )
        self.client = loopback_client(f"http://127.0.0.1:{self.port}")

    def start(self) -> None:
        """Start it and wait until it is ready."""
        self.group.start()
        wait_until(self._ready, timeout_s=30.0, what=f"Alertmanager on port {self.port}")

    def _ready(self) -> bool:
        try:
            return self.client.get("/-/ready", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def post(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Send firing alerts to it as Prometheus does (``POST /api/v2/alerts``), all at once."""
        response = self.client.post("/api/v2/alerts", json=list(alerts), timeout=10.0)
        response.raise_for_status()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert it holds, silenced and inhibited ones included (``/api/v2/alerts``)."""
        response = self.client.get("/api/v2/alerts", timeout=10.0)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts

    def stop(self) -> None:
        """Stop it."""
        self.client.close()
        self.group.stop()
