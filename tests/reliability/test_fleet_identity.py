"""Hostile inputs, round three: DNS rebinding and aliases of one target in fleet mode.

An attacker who controls a name's DNS answers "an allowed address" to the allowlist check,
then another one when the exporter connects; or spells one target a dozen ways to multiply its
limits. Everything runs on loopback: the genuine vLLM on 127.0.0.1, the attacker's server on
127.0.0.2, the name server a seam in this process (``socket.getaddrinfo``, which both the
exporter's check and, before the fix, httpx's own connection went through). Figures go to the
``fleet_identity`` section.
"""

from __future__ import annotations

import functools
import http.server
import socket
import threading
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from exporter.service import app
from exporter.service.resolver import BoundedResolver
from exporter.testing.fakevllm import FakeVllm
from exporter.testing.processes import ExporterThread

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .conftest import Figures

#: The name whose answers change (``.invalid`` never resolves for real).
NAME = "rebind.invalid"
GENUINE, ATTACKER = "127.0.0.1", "127.0.0.2"
TOKEN = "s3cret-token"  # noqa: S105 - a test token


class Attacker(http.server.ThreadingHTTPServer):
    """A server on 127.0.0.2 that records every request it gets (path, Authorization)."""

    def __init__(self, port: int) -> None:
        self.seen: list[tuple[str, str | None]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__((ATTACKER, port), Handler)
        self.daemon_threads = True
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self.shutdown()
        self.server_close()


class RebindingDns:
    """``socket.getaddrinfo`` for :data:`NAME`: the genuine address ``honest`` times, then not."""

    def __init__(self, honest: int) -> None:
        self.honest = honest
        self.answers: list[str] = []
        self._lock = threading.Lock()

    def answer(self) -> str:
        """The next answer for the name (thread-safe: lookups run on threads)."""
        with self._lock:
            address = GENUINE if len(self.answers) < self.honest else ATTACKER
            self.answers.append(address)
            return address


@pytest.fixture
def servers() -> Iterator[tuple[FakeVllm, Attacker]]:
    """The genuine vLLM on 127.0.0.1 and the attacker on 127.0.0.2, on the same port."""
    with FakeVllm(token=TOKEN) as genuine:
        attacker = Attacker(genuine.port)
        try:
            yield genuine, attacker
        finally:
            attacker.close()


def rebinding(monkeypatch: pytest.MonkeyPatch, honest: int) -> RebindingDns:
    """Answer lookups of :data:`NAME` through :class:`RebindingDns`; other names as usual."""
    dns = RebindingDns(honest)
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if (host.decode() if isinstance(host, bytes) else host) != NAME:  # anyio sends bytes
            return real(host, port, *args, **kwargs)
        address = dns.answer()
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return dns


def probe_five_times(target: str) -> list[int]:
    """Five probes of ``target`` through an in-process fleet exporter: their statuses."""
    running = ExporterThread(
        {
            "mode": "fleet",
            "probe_allowlist": "127.0.0.0/8",
            "bearer_token": TOKEN,
            "bearer_token_targets": GENUINE,
        }
    )
    try:
        return [
            httpx.get(f"{running.url}/probe", params={"target": target}).status_code
            for _ in range(5)
        ]
    finally:
        running.stop()


def test_a_name_rebound_between_check_and_connect_reaches_only_the_checked_address(
    servers: tuple[FakeVllm, Attacker],
    monkeypatch: pytest.MonkeyPatch,
    figures: Figures,
) -> None:
    """The check sees 127.0.0.1, every later lookup 127.0.0.2: all five probes reach .1 only.

    The name's answer is remembered for the resolver's TTL (30 s), so each probe is checked and
    pinned to 127.0.0.1, and the token, bound to 127.0.0.1, goes only there.
    """
    genuine, attacker = servers
    dns = rebinding(monkeypatch, honest=1)
    statuses = probe_five_times(f"http://{NAME}:{genuine.port}")
    figures.record(
        "fleet_identity",
        "rebound_between_check_and_connect",
        {"attacker_requests": len(attacker.seen), "lookups": len(dns.answers)},
    )
    assert attacker.seen == [], "a request reached an address that was never checked"
    assert statuses == [200] * 5
    assert genuine.counts.requests.get("/metrics", 0) == 5
    assert genuine.counts.authorizations == {f"Bearer {TOKEN}"}


def test_after_a_first_probe_a_rebound_name_is_probed_at_its_new_address_without_the_token(
    servers: tuple[FakeVllm, Attacker],
    monkeypatch: pytest.MonkeyPatch,
    figures: Figures,
) -> None:
    """Once the answer changes, each probe goes where it was checked, the token only to .1.

    Answers are remembered for no time here: the first probe reaches 127.0.0.1 with the token;
    the next ones are checked at 127.0.0.2 (allowed, but not bound to the token).
    """
    monkeypatch.setattr(app, "BoundedResolver", functools.partial(BoundedResolver, ttl_seconds=0))
    genuine, attacker = servers
    dns = rebinding(monkeypatch, honest=1)
    probe_five_times(f"http://{NAME}:{genuine.port}")
    tokens_sent = [auth for _path, auth in attacker.seen if auth is not None]
    figures.record(
        "fleet_identity",
        "rebound_after_a_first_probe",
        {
            "attacker_requests": len(attacker.seen),
            "tokens_to_attacker": len(tokens_sent),
            "lookups": len(dns.answers),
        },
    )
    assert tokens_sent == [], "the token went to an address it is not bound to"
    assert dns.answers == [GENUINE] + [ATTACKER] * 4, "one lookup per probe, none to connect"
    assert genuine.counts.requests.get("/metrics", 0) == 1
    assert genuine.counts.authorizations == {f"Bearer {TOKEN}"}
    assert attacker.seen, "the probes after the change were not checked at the new address"


#: Six spellings of 127.0.0.1, the IPv4-mapped IPv6 forms among them (the same socket).
LOOPBACK_V4_FORMS = (
    "127.0.0.1",
    "[::ffff:127.0.0.1]",
    "[::FFFF:7f00:1]",
    "[0:0:0:0:0:ffff:7f00:1]",
    "[0::ffff:127.0.0.1]",
    "[::ffff:7F00:0001]",
)


def test_twelve_spellings_of_one_target_are_one_target(figures: Figures) -> None:
    """Probing 127.0.0.1 spelt 12 ways (forms, case, scheme, slash) makes one target."""
    with FakeVllm() as vllm:
        spelt = [f"http://{form}:{vllm.port}" for form in LOOPBACK_V4_FORMS] + [
            f"HTTP://{form}:{vllm.port}/" for form in LOOPBACK_V4_FORMS
        ]
        running = ExporterThread({"mode": "fleet", "probe_allowlist": "127.0.0.1"})
        try:
            statuses = [
                httpx.get(f"{running.url}/probe", params={"target": s}).status_code for s in spelt
            ]
            own = httpx.get(f"{running.url}/metrics").text
        finally:
            running.stop()
    targets = [line for line in own.splitlines() if line.startswith("headroom_probe_targets ")]
    figures.record("fleet_identity", "targets_for_12_spellings", targets)
    assert statuses == [200] * 12
    assert targets == ["headroom_probe_targets 1.0"]
