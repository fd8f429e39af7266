"""Abuse: /probe as a proxy, slow and oversized clients, floods, TLS, secrets in the output.

While each abuse runs, a well-behaved scraper (one GET /metrics every 100 ms, as Prometheus
does on a fresh connection) must get every answer, in time; the worst latency it saw is a figure
of docs/reliability.md. After each abuse the exporter holds no more threads or descriptors
than before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
from ipaddress import IPv4Address, IPv6Address
from typing import TYPE_CHECKING

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.service.allowlist import never_probed
from exporter.testing.fakevllm import FakeVllm, Fault
from exporter.testing.processes import (
    ExporterProcess,
    Stats,
    quiet_stats,
    reset_peak_rss,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from .conftest import Figures

#: Longest a well-behaved scrape may take under abuse (Prometheus's default timeout is 10 s).
SCRAPE_LIMIT_SECONDS = 3.0
MIB = 1024 * 1024


# ------------------------------------------------------------------------------ the scraper


@dataclasses.dataclass
class ScrapeLog:
    """What the well-behaved scraper saw: status codes (or errors) and latencies."""

    outcomes: list[str] = dataclasses.field(default_factory=list)
    latencies: list[float] = dataclasses.field(default_factory=list)

    @property
    def worst(self) -> float:
        """The slowest scrape, in seconds."""
        return max(self.latencies)


def scrape_during(
    url: str, abuse: Callable[[threading.Event], None], *, seconds: float = 3.0, **client: object
) -> ScrapeLog:
    """Run ``abuse(stop)`` in a thread for ``seconds`` while scraping ``url``/metrics."""
    stop = threading.Event()
    attacker = threading.Thread(target=abuse, args=(stop,), daemon=True)
    attacker.start()
    time.sleep(0.5)  # let the abuse reach its full strength first
    log = ScrapeLog()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                # A fresh client each time: a new connection, like a scraper after a timeout.
                with httpx.Client(timeout=10.0, **client) as http:  # type: ignore[arg-type]
                    response = http.get(f"{url}/metrics")
                ok = response.status_code == 200 and "headroom_build_info" in response.text
                log.outcomes.append("200" if ok else str(response.status_code))
            except httpx.HTTPError as exc:
                log.outcomes.append(type(exc).__name__)
            log.latencies.append(time.perf_counter() - started)
            time.sleep(0.1)
    finally:
        stop.set()
        attacker.join(30)
    return log


def assert_served(log: ScrapeLog) -> None:
    """Every scrape answered 200 with a whole exposition, each within the limit."""
    assert log.outcomes, "no scrape was made"
    assert set(log.outcomes) == {"200"}, f"scrapes failed: {log.outcomes}"
    assert log.worst < SCRAPE_LIMIT_SECONDS, f"worst scrape took {log.worst:.2f}s"


def address(url: str) -> tuple[str, int]:
    """Host and port of an http(s) URL."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host.strip("[]"), int(port)


# ------------------------------------------------------------------------------ attackers


def slowloris(url: str, connections: int) -> Callable[[threading.Event], None]:
    """Keep ``connections`` open, each sending its request head one byte every 0.5 s."""
    head = b"GET /metrics HTTP/1.1\r\nHost: exporter\r\nUser-Agent: slow" + b"w" * 4000

    def attack(stop: threading.Event) -> None:
        open_: list[tuple[socket.socket, int]] = []
        while not stop.is_set():
            while len(open_) < connections and not stop.is_set():
                try:
                    sock = socket.create_connection(address(url), timeout=2)
                except OSError:
                    break
                sock.setblocking(False)
                open_.append((sock, 0))
            kept = []
            for sock, sent in open_:
                try:
                    sock.send(head[sent : sent + 1])
                    kept.append((sock, sent + 1))
                except OSError:  # evicted or refused: open another one
                    sock.close()
            open_ = kept
            stop.wait(0.5)
        for sock, _ in open_:
            sock.close()

    return attack


def oversized(url: str) -> Callable[[threading.Event], None]:
    """Requests with a 70 KB request line, 200 headers of 1 KB, or one 1 MB header."""
    host, port = address(url)
    requests = [
        b"GET /metrics?" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n"
        + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(200))
        + b"\r\n",
        b"GET /metrics HTTP/1.1\r\nX-Big: " + b"v" * 1_000_000 + b"\r\n\r\n",
    ]

    def one(stop: threading.Event, request: bytes) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError), socket.create_connection((host, port), 2) as sock:
                sock.sendall(request)
                sock.recv(1024)

    def attack(stop: threading.Event) -> None:
        workers = [threading.Thread(target=one, args=(stop, r)) for r in requests for _ in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)

    return attack


def flood(url: str, workers: int) -> Callable[[threading.Event], None]:
    """``workers`` clients sending complete requests back to back, a new connection each."""
    paths = ["/metrics", "/-/healthy", "/", "/nope", "/probe?target=x"]

    def one(stop: threading.Event, path: str) -> None:
        with httpx.Client(timeout=10.0) as http:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    http.get(f"{url}{path}", headers={"Connection": "close"})

    def attack(stop: threading.Event) -> None:
        threads = [
            threading.Thread(target=one, args=(stop, paths[i % len(paths)])) for i in range(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    return attack


def connect_flood(url: str) -> Callable[[threading.Event], None]:
    """Connections opened and closed at once, or opened and left silent, as fast as possible."""

    def attack(stop: threading.Event) -> None:
        silent: list[socket.socket] = []
        while not stop.is_set():
            with contextlib.suppress(OSError):
                socket.create_connection(address(url), timeout=2).close()
                silent.append(socket.create_connection(address(url), timeout=2))
            if len(silent) > 300:
                silent.pop(0).close()
        for sock in silent:
            sock.close()

    return attack


# ------------------------------------------------------------------------------ the sidecar


@dataclasses.dataclass
class Rig:
    """The fake vLLM and the exporter polling it."""

    vllm: FakeVllm
    exporter: ExporterProcess
    baseline: Stats


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    """One sidecar (0.5 s polls) watching one fake vLLM, for the HTTP abuse tests."""
    vllm = FakeVllm()
    exporter = ExporterProcess(
        {
            "HEADROOM_TARGET": vllm.url,
            "HEADROOM_POLL_INTERVAL_SECONDS": "0.5",
            "HEADROOM_POLL_TIMEOUT_SECONDS": "0.5",
        }
    )
    try:
        exporter.wait_for(lambda s: s.value("headroom_target_up") == 1.0)
        yield Rig(vllm, exporter, quiet_stats(exporter.pid))
    finally:
        exporter.close()
        vllm.close()


ABUSES: dict[str, Callable[[str], Callable[[threading.Event], None]]] = {
    "slowloris_200_connections": lambda url: slowloris(url, 200),
    "oversized_request_lines_and_headers": oversized,
    "flood_24_clients": lambda url: flood(url, 24),
    "connect_flood": connect_flood,
}


@pytest.mark.parametrize("abuse", list(ABUSES))
def test_abusive_clients_do_not_keep_prometheus_out(rig: Rig, abuse: str, figures: Figures) -> None:
    """Under each abuse every well-behaved scrape is answered in time; nothing is left behind."""
    exporter = rig.exporter
    reset_peak_rss(exporter.pid)
    rss_before = exporter.stats().rss_bytes
    log = scrape_during(exporter.url, ABUSES[abuse](exporter.url))
    peak = exporter.stats().peak_rss_bytes
    assert_served(log)
    assert exporter.proc.poll() is None
    stats = exporter.settled_stats(rig.baseline, timeout=15)
    assert stats.threads <= rig.baseline.threads, f"threads left: {stats} vs {rig.baseline}"
    assert stats.fds <= rig.baseline.fds, f"descriptors left: {stats} vs {rig.baseline}"
    # 64 connections x a 64 KiB head bound, not 64 x 6.5 MB.
    assert peak - rss_before < 64 * MIB
    figures.record(
        "abuse",
        abuse,
        {
            "scrapes": len(log.latencies),
            "worst_metrics_latency_seconds": round(log.worst, 4),
            "peak_rss_growth_mib": round((peak - rss_before) / MIB, 1),
        },
    )


def test_oversized_heads_are_refused_with_431(rig: Rig) -> None:
    """A request head over 64 KiB gets 431 (or a closed connection), never a 200."""
    headers = {f"X-{i}": "v" * 1000 for i in range(80)}
    response = httpx.get(f"{rig.exporter.url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 431
    small = httpx.get(f"{rig.exporter.url}/metrics", headers={"X-Ok": "v" * 1000}, timeout=10)
    assert small.status_code == 200


def test_abused_exporter_logged_only_json(rig: Rig) -> None:
    """Timeouts, resets and refused heads are logged as JSON events, never as tracebacks."""
    assert rig.exporter.non_json_lines() == []


# ------------------------------------------------------------------------------ /probe


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[ExporterProcess, FakeVllm]]:
    """A fleet exporter allowing loopback and, deliberately broad, every IPv6 address."""
    vllm = FakeVllm()
    exporter = ExporterProcess(
        {
            "HEADROOM_MODE": "fleet",
            "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8,::/0",
            "HEADROOM_PROBE_MAX_TARGETS": "5",
            "HEADROOM_POLL_TIMEOUT_SECONDS": "1",
        }
    )
    try:
        yield exporter, vllm
    finally:
        exporter.close()
        vllm.close()


#: Targets /probe must refuse, and the outcome each is counted under.
REFUSED = [
    ("169.254.169.254", "denied_forbidden_address"),
    ("http://169.254.169.254:80", "denied_forbidden_address"),
    ("http://[::ffff:169.254.169.254]:80", "denied_forbidden_address"),
    ("http://[::ffff:a9fe:a9fe]", "denied_forbidden_address"),
    ("http://[64:ff9b::a9fe:a9fe]:80", "denied_forbidden_address"),
    ("http://[fe80::1]:8000", "denied_forbidden_address"),
    ("0.0.0.0:8000", "denied_forbidden_address"),
    ("http://[::]:8000", "denied_forbidden_address"),
    ("http://[ff02::1]:8000", "denied_forbidden_address"),
    # IPv4 addresses in other spellings: refused as such, before any name lookup.
    ("http://2852039166:80", "bad_target"),  # 169.254.169.254 in decimal
    ("http://0:8000", "bad_target"),  # 0.0.0.0 in shorthand
    ("http://0177.0.0.1:8000", "bad_target"),  # 127.0.0.1 in octal
    ("http://0x7f.1:8000", "bad_target"),
    ("http://127.0.0.1:0", "bad_target"),  # not "the default port"
    ("http://10.1.2.3:8000", "denied_not_in_allowlist"),
    ("file:///etc/passwd", "bad_target"),
    ("gopher://127.0.0.1:70/", "bad_target"),
    ("ftp://127.0.0.1/", "bad_target"),
    ("http://user:password@127.0.0.1:8000", "bad_target"),
    ("http://127.0.0.1:8000/admin?x=1", "bad_target"),
    ("http://127.0.0.1:99999", "bad_target"),
    ("http://" + "a" * 5000 + ":80", "bad_target"),  # no host name is that long
]


def probe_counts(exporter: ExporterProcess) -> dict[str, float]:
    """headroom_probe_requests_total by outcome."""
    return {
        dict(labels)["outcome"]: value
        for labels, value in exporter.scrape().series("headroom_probe_requests_total").items()
    }


def test_probe_targets_outside_the_allowlist_are_refused_and_counted(
    fleet: tuple[ExporterProcess, FakeVllm],
) -> None:
    """Metadata addresses in every spelling, other schemes, credentials: refused, each counted."""
    exporter, _ = fleet
    before = probe_counts(exporter)
    assert before.get("denied_forbidden_address") == 0.0, "outcomes must start at 0"
    expected: dict[str, int] = {}
    for target, outcome in REFUSED:
        response = exporter.get("/probe", params={"target": target})
        assert response.status_code in (400, 403), f"{target}: {response.status_code}"
        assert response.status_code == (400 if outcome == "bad_target" else 403), target
        expected[outcome] = expected.get(outcome, 0) + 1
    after = probe_counts(exporter)
    for outcome, count in expected.items():
        assert after[outcome] - before.get(outcome, 0.0) == count, outcome
    assert after.get("ok", 0.0) == before.get("ok", 0.0)
    assert exporter.non_json_lines() == []


def test_concurrent_refusals_are_counted_exactly(
    fleet: tuple[ExporterProcess, FakeVllm],
) -> None:
    """8 threads x 25 refused probes: the counters say 200 more, not fewer.

    More than 4 probes of one target at once are throttled before the address is checked.
    """
    exporter, _ = fleet
    counts = probe_counts(exporter)
    before = counts.get("denied_forbidden_address", 0.0) + counts.get("throttled", 0.0)

    def hammer() -> None:
        with httpx.Client(timeout=10) as http:
            for _ in range(25):
                http.get(f"{exporter.url}/probe", params={"target": "169.254.169.254"})

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    after = probe_counts(exporter)
    assert after["denied_forbidden_address"] + after["throttled"] - before == 200


def test_remembered_probe_targets_are_bounded(
    fleet: tuple[ExporterProcess, FakeVllm], figures: Figures
) -> None:
    """60 distinct allowed targets with probe_max_targets=5: 5 remembered, 55 evicted."""
    exporter, vllm = fleet
    # A first probe creates what lives as long as the process (the pool of blocking reads).
    assert exporter.get("/probe", params={"target": vllm.url}).status_code == 200
    first = exporter.scrape()
    evicted_before = first.value("headroom_probe_evictions_total") or 0.0
    baseline = quiet_stats(exporter.pid)
    targets = [vllm.url] + [f"http://127.0.0.{i}:{vllm.port}" for i in range(2, 61)]
    for target in targets:
        response = exporter.get("/probe", params={"target": target})
        assert response.status_code == 200, target
    after = exporter.scrape()
    assert after.value("headroom_probe_targets") == 5.0
    assert (after.value("headroom_probe_evictions_total") or 0) - evicted_before == 55
    stats = exporter.settled_stats(baseline)
    assert stats.threads <= baseline.threads
    assert stats.fds <= baseline.fds + 5  # at most one pooled connection per remembered target
    figures.record(
        "abuse",
        "probe_targets_bound",
        {"probed": len(targets), "remembered": 5, "rss_mib": round(stats.rss_bytes / MIB, 1)},
    )


# ------------------------------------------------------------------------------ TLS


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cryptography if installed, else openssl)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        import datetime

        from cryptography import x509  # type: ignore[import-not-found,unused-ignore]
        from cryptography.hazmat.primitives import (  # type: ignore[import-not-found,unused-ignore]
            hashes,
            serialization,
        )
        from cryptography.hazmat.primitives.asymmetric import (  # type: ignore[import-not-found,unused-ignore]
            ec,
        )
        from cryptography.x509.oid import NameOID  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def test_tls_serves_and_a_stalled_handshake_blocks_no_one(
    fake_vllm: FakeVllm, tmp_path: Path, figures: Figures
) -> None:
    """HTTPS with a self-signed cert works; 200 clients stalling their handshake block no one."""
    cert, key = self_signed(tmp_path)
    with ExporterProcess(
        {
            "HEADROOM_TARGET": fake_vllm.url,
            "HEADROOM_TLS_CERT_FILE": str(cert),
            "HEADROOM_TLS_KEY_FILE": str(key),
        }
    ) as exporter:
        assert exporter.url.startswith("https://")
        verify = ssl.create_default_context(cafile=str(cert))
        response = httpx.get(f"{exporter.url}/metrics", verify=verify, timeout=10)
        assert response.status_code == 200
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port: no answer, no harm
            httpx.get(exporter.url.replace("https://", "http://") + "/metrics", timeout=5)
        # The first poll starts the thread of its blocking reads, there for the process's life:
        # in the baseline, or a slow first poll counts it as the abuse's (a non-root run did).
        wait_until(
            lambda: (
                httpx.get(f"{exporter.url}/-/ready", verify=verify, timeout=10).status_code == 200
            )
        )
        baseline = quiet_stats(exporter.pid)

        def stall(stop: threading.Event) -> None:
            held: list[socket.socket] = []
            while not stop.is_set():
                while len(held) < 200:
                    with contextlib.suppress(OSError):
                        held.append(socket.create_connection(address(exporter.url), timeout=2))
                stop.wait(0.2)
                alive = []
                for sock in held:  # an evicted one is closed by the server: replace it
                    sock.setblocking(False)
                    try:
                        gone = sock.recv(1) == b""
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    (sock.close() if gone else alive.append(sock))
                held = alive
            for sock in held:
                sock.close()

        log = scrape_during(exporter.url, stall, verify=verify)
        assert_served(log)
        stats = exporter.settled_stats(baseline, timeout=15)
        assert stats.threads <= baseline.threads
        assert exporter.non_json_lines() == []
    figures.record(
        "abuse",
        "tls_stalled_handshakes_200",
        {"scrapes": len(log.latencies), "worst_metrics_latency_seconds": round(log.worst, 4)},
    )


# ------------------------------------------------------------------------------ secrets


def test_the_bearer_token_never_appears_in_logs_or_answers(tmp_path: Path) -> None:
    """Through successes, 401s, 5xx, refusals and hangs, at debug level: the token is nowhere."""
    token = "tok-" + secrets.token_hex(16)
    seen: list[str] = []
    with (
        FakeVllm(token=token) as vllm,
        ExporterProcess(
            {
                "HEADROOM_TARGET": vllm.url,
                "HEADROOM_BEARER_TOKEN": token,
                "HEADROOM_LOG_LEVEL": "debug",
                "HEADROOM_POLL_INTERVAL_SECONDS": "0.3",
                "HEADROOM_POLL_TIMEOUT_SECONDS": "0.3",
            }
        ) as exporter,
    ):
        exporter.wait_for(lambda s: s.value("headroom_target_up") == 1.0)
        assert vllm.counts.authorizations == {f"Bearer {token}"}, "the token was not sent"
        for fault in (Fault.HTTP_500, Fault.REFUSE, Fault.HANG):
            vllm.set_fault(fault)
            exporter.wait_for(lambda s: s.value("headroom_target_up") == 0.0)
            seen.append(exporter.scrape().text)
            vllm.set_fault(Fault.NONE)
            exporter.wait_for(lambda s: s.value("headroom_target_up") == 1.0)
        vllm.token = "another-" + token[::-1]  # vLLM restarted with a new --api-key
        down, _ = exporter.wait_for(lambda s: s.errors("vllm_metrics", "http_401") > 0)
        seen.append(down.text)
        for path in ("/", "/-/ready", "/-/healthy", "/nope", "/probe?target=x"):
            seen.append(exporter.get(path).text)
        code, _ = exporter.terminate()
        assert code == 0
        seen.append(exporter.log_text())
        assert "source_failed" in seen[-1]
    # A bad setting next to the token: the error line does not echo it either.
    bad = subprocess.run(
        [sys.executable, "-m", "exporter", "serve"],
        env=clean_env(HEADROOM_BEARER_TOKEN=token, HEADROOM_PORT="99999"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bad.returncode == 2
    seen.append(bad.stderr + bad.stdout)
    for text in seen:
        assert token not in text
        assert token[4:] not in text


def test_credentials_in_a_probe_target_are_refused_and_not_logged(
    fleet: tuple[ExporterProcess, FakeVllm],
) -> None:
    """/probe?target=http://user:SECRET@host: 400, and the secret appears in no log line."""
    exporter, vllm = fleet
    secret = secrets.token_hex(12)
    response = exporter.get(
        "/probe", params={"target": f"http://admin:{secret}@127.0.0.1:{vllm.port}"}
    )
    assert response.status_code == 400
    assert secret not in response.text
    assert secret not in exporter.log_text()
    assert secret not in exporter.scrape().text


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without HEADROOM_* variables, plus local defaults and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_")}
    local = {"HEADROOM_LISTEN_ADDRESS": "127.0.0.1", "HEADROOM_GPU_DISCOVERY": "none"}
    return {**env, **local, **extra}


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_and_its_ipv6_spellings_are_judged_alike(address: IPv4Address) -> None:
    """never_probed(a) holds exactly when it holds for ::ffff:a and the NAT64 64:ff9b::a."""
    mapped = IPv6Address(f"::ffff:{address}")
    nat64 = IPv6Address(int(IPv6Address("64:ff9b::")) | int(address))
    assert never_probed(mapped) == never_probed(address)
    assert never_probed(nat64) == never_probed(address)
