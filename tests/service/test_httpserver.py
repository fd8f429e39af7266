"""Specification of the HTTP endpoints and their server, over real loopback HTTP."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exporter.service import httpserver
from exporter.service.httpserver import (
    MAX_CONNECTIONS,
    CachedExposition,
    ExporterServer,
    HeadroomApp,
    ProbeAnswer,
    landing_page,
    whole_head_waiting,
)
from exporter.testing.processes import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from typing import Any

    from prometheus_client.core import Metric

SCRAPE_TIMEOUT = "X-Prometheus-Scrape-Timeout-Seconds"


def registry_with(name: str, value: float) -> CollectorRegistry:
    """A private registry holding one gauge."""
    registry = CollectorRegistry(auto_describe=False)
    Gauge(name, f"The {name} of the test.", registry=registry).set(value)
    return registry


class Probe:
    """The injected probe callable: records its arguments and gives a fixed answer."""

    def __init__(self, answer: ProbeAnswer) -> None:
        self.answer = answer
        self.calls: list[tuple[str, float | None]] = []
        self.clients: list[str] = []
        self.params: list[Mapping[str, str]] = []

    def __call__(
        self, target: str, scrape_timeout: float | None, client: str, params: Mapping[str, str]
    ) -> ProbeAnswer:
        self.calls.append((target, scrape_timeout))
        self.clients.append(client)
        self.params.append(params)
        return self.answer


def make_app(
    *,
    ready: Callable[[], tuple[bool, str]] = lambda: (True, ""),
    landing: Callable[[], str] = lambda: "<html>landing</html>",
    probe: Probe | None = None,
) -> HeadroomApp:
    """An app over a registry holding ``demo_value 3``."""
    return HeadroomApp(
        registry=registry_with("demo_value", 3.0), ready=ready, landing=landing, probe=probe
    )


@pytest.fixture
def serving() -> Iterator[Callable[..., tuple[ExporterServer, httpx.Client]]]:
    """Start an ExporterServer for an app on a free loopback port; it and a client come back."""
    started: list[tuple[ExporterServer, threading.Thread, httpx.Client]] = []

    def start(
        app: HeadroomApp, *, max_connections: int = MAX_CONNECTIONS
    ) -> tuple[ExporterServer, httpx.Client]:
        server = ExporterServer(("127.0.0.1", 0), app, max_connections=max_connections)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        host, port = server.server_address[:2]
        client = httpx.Client(base_url=f"http://{host!s}:{port}", trust_env=False, timeout=10.0)
        started.append((server, thread, client))
        return server, client

    yield start
    for server, thread, client in started:
        client.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=2)


@pytest.fixture
def serve(
    serving: Callable[..., tuple[ExporterServer, httpx.Client]],
) -> Callable[..., httpx.Client]:
    """Start an ExporterServer for an app on a free loopback port; a client for it comes back."""

    def start(app: HeadroomApp, **options: Any) -> httpx.Client:
        return serving(app, **options)[1]

    return start


def test_metrics_serve_the_registry_in_the_prometheus_text_format(
    serve: Callable[..., httpx.Client],
) -> None:
    """/metrics answers 200, text/plain with a format version, and the registry's families."""
    response = serve(make_app()).get("/metrics")
    assert response.status_code == 200
    content_type = response.headers["content-type"]
    assert content_type.startswith("text/plain")
    assert "version=" in content_type
    assert "# TYPE demo_value gauge" in response.text
    assert "demo_value 3.0" in response.text


def test_metrics_honour_prometheus_client_s_name_filter(
    serve: Callable[..., httpx.Client],
) -> None:
    """/metrics?name[]=x keeps only family x (the filter that comes with client_python's app)."""
    registry = registry_with("demo_value", 3.0)
    Gauge("other_value", "Another gauge.", registry=registry).set(1.0)
    app = HeadroomApp(registry=registry, ready=lambda: (True, ""), landing=lambda: "")
    response = serve(app).get("/metrics", params={"name[]": "other_value"})
    assert "other_value 1.0" in response.text
    assert "demo_value" not in response.text


def test_healthy_always_answers_200(serve: Callable[..., httpx.Client]) -> None:
    """/-/healthy is 200 even while the exporter is not ready."""
    response = serve(make_app(ready=lambda: (False, "no poll yet"))).get("/-/healthy")
    assert response.status_code == 200
    assert response.text == "Healthy.\n"


def test_ready_follows_the_ready_callable_and_says_why_not(
    serve: Callable[..., httpx.Client],
) -> None:
    """/-/ready is 503 with the reason while ready() says no, and 200 once it says yes."""
    state = {"ready": False}
    client = serve(make_app(ready=lambda: (state["ready"], "the first poll has not succeeded")))
    waiting = client.get("/-/ready")
    assert waiting.status_code == 503
    assert waiting.text == "Not ready: the first poll has not succeeded\n"
    state["ready"] = True
    assert client.get("/-/ready").status_code == 200


def test_the_landing_page_is_html_linking_metrics_with_its_values_escaped(
    serve: Callable[..., httpx.Client],
) -> None:
    """/ serves the landing HTML: a link to /metrics, and row values that cannot inject markup."""
    page = landing_page(
        title="vllm-headroom", rows=[("model", "<script>alert(1)</script>")], probe=False
    )
    response = serve(make_app(landing=lambda: page)).get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert '<a href="/metrics">/metrics</a>' in response.text
    assert "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in response.text
    assert "<script>" not in response.text


def test_the_landing_page_lists_probe_only_in_fleet_mode() -> None:
    """landing_page mentions /probe when probing is served, and not otherwise."""
    assert "/probe?target=URL" in landing_page(title="t", rows=[], probe=True)
    assert "/probe" not in landing_page(title="t", rows=[], probe=False)


def test_probe_without_a_probe_callable_is_not_found(serve: Callable[..., httpx.Client]) -> None:
    """In sidecar mode /probe answers 404 and points at fleet mode."""
    response = serve(make_app()).get("/probe", params={"target": "10.0.0.1:8000"})
    assert response.status_code == 404
    assert "fleet mode only" in response.text


@pytest.mark.parametrize(
    "query",
    [{}, {"target": ""}, {"target": ["10.0.0.1:8000", "10.0.0.2:8000"]}],
    ids=["none", "empty", "two"],
)
def test_probe_needs_exactly_one_target(
    serve: Callable[..., httpx.Client], query: dict[str, str | list[str]]
) -> None:
    """No target, an empty one or two answer 400 without calling the probe."""
    probe = Probe(ProbeAnswer(registry=registry_with("probed_value", 1.0)))
    response = serve(make_app(probe=probe)).get("/probe", params=query)
    assert response.status_code == 400
    assert probe.calls == []


def test_probe_passes_the_target_and_the_scrape_timeout_and_renders_its_registry(
    serve: Callable[..., httpx.Client],
) -> None:
    """The decoded target and Prometheus's timeout reach the probe; its registry is served."""
    probe = Probe(ProbeAnswer(registry=registry_with("probed_value", 7.0)))
    response = serve(make_app(probe=probe)).get(
        "/probe", params={"target": "http://10.0.0.1:8000"}, headers={SCRAPE_TIMEOUT: "9.5"}
    )
    assert probe.calls == [("http://10.0.0.1:8000", 9.5)]
    assert response.status_code == 200
    assert "probed_value 7.0" in response.text
    assert "demo_value" not in response.text  # the exporter's own registry stays on /metrics


def test_probe_passes_the_requester_s_address_as_the_client(
    serve: Callable[..., httpx.Client],
) -> None:
    """The probe's third argument is the remote address of the request (here 127.0.0.1)."""
    probe = Probe(ProbeAnswer(registry=registry_with("probed_value", 1.0)))
    serve(make_app(probe=probe)).get("/probe", params={"target": "http://10.0.0.1:8000"})
    assert probe.clients == ["127.0.0.1"]


def test_probe_passes_the_gpu_parameters_on_and_nothing_else(
    serve: Callable[..., httpx.Client],
) -> None:
    """dcgm, pod and namespace reach the probe as given (the fleet checks them); others not."""
    probe = Probe(ProbeAnswer(registry=registry_with("probed_value", 1.0)))
    query = {
        "target": "t:1",
        "dcgm": "http://10.0.0.7:9400/metrics",
        "pod": "llama-0",
        "namespace": "inference",
        "module": "x",
    }
    serve(make_app(probe=probe)).get("/probe", params=query)
    assert probe.params == [
        {"dcgm": "http://10.0.0.7:9400/metrics", "pod": "llama-0", "namespace": "inference"}
    ]


@pytest.mark.parametrize("name", ["dcgm", "pod", "namespace"])
def test_a_gpu_parameter_given_twice_is_refused_without_calling_the_probe(
    serve: Callable[..., httpx.Client], name: str
) -> None:
    """Two values of one parameter would be a guess: 400, naming the parameter."""
    probe = Probe(ProbeAnswer(registry=registry_with("probed_value", 1.0)))
    response = serve(make_app(probe=probe)).get(
        "/probe", params={"target": "t:1", name: ["a", "b"]}
    )
    assert response.status_code == 400
    assert f"?{name}=" in response.text
    assert probe.calls == []


@pytest.mark.parametrize("header", [None, "", "abc", "0", "-3", "3600", "nan"])
def test_a_missing_or_unreasonable_scrape_timeout_reaches_the_probe_as_none(
    serve: Callable[..., httpx.Client], header: str | None
) -> None:
    """Absent, non-numeric, non-positive or hour-long timeouts are ignored (None)."""
    probe = Probe(ProbeAnswer(registry=registry_with("probed_value", 1.0)))
    headers = {SCRAPE_TIMEOUT: header} if header is not None else {}
    serve(make_app(probe=probe)).get("/probe", params={"target": "t:1"}, headers=headers)
    assert probe.calls == [("t:1", None)]


def test_the_target_parameter_is_not_taken_as_a_name_filter(
    serve: Callable[..., httpx.Client],
) -> None:
    """The probe's registry is rendered whole, whatever else the query string says."""
    probe = Probe(ProbeAnswer(registry=registry_with("probed_value", 1.0)))
    response = serve(make_app(probe=probe)).get(
        "/probe", params={"target": "t:1", "name[]": "nothing_such"}
    )
    assert "probed_value 1.0" in response.text


def test_a_probe_error_answer_is_returned_with_its_status_and_message(
    serve: Callable[..., httpx.Client],
) -> None:
    """A ProbeAnswer without a registry is sent as its status line and message."""
    answer = ProbeAnswer(status="403 Forbidden", message="Target not allowed (not in allowlist).")
    response = serve(make_app(probe=Probe(answer))).get("/probe", params={"target": "t:1"})
    assert response.status_code == 403
    assert response.text == "Target not allowed (not in allowlist).\n"


def test_unknown_paths_are_not_found(serve: Callable[..., httpx.Client]) -> None:
    """A path we do not serve answers 404 pointing at the landing page."""
    response = serve(make_app()).get("/metrics/extra")
    assert response.status_code == 404
    assert "See / for the endpoints" in response.text


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
def test_methods_other_than_get_and_head_are_refused_with_405(
    serve: Callable[..., httpx.Client], method: str
) -> None:
    """Anything but GET or HEAD gets 405 with an Allow header, on every path."""
    response = serve(make_app()).request(method, "/metrics")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"


def test_head_is_served_like_get(serve: Callable[..., httpx.Client]) -> None:
    """HEAD is routed like GET: /-/ready answers 200."""
    assert serve(make_app()).head("/-/ready").status_code == 200


@pytest.mark.parametrize("path", ["/-/ready", "/", "/metrics", "/nowhere"])
def test_head_sends_the_headers_of_get_and_no_body(
    serve: Callable[..., httpx.Client], path: str
) -> None:
    """HEAD answers GET's status and Content-Length, and not one byte after the headers."""
    client = serve(make_app())
    got = client.get(path)
    host, port = client.base_url.host, client.base_url.port
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(f"HEAD {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert rest == b""
    status = int(head.split(b" ")[1])
    assert status == got.status_code
    if path != "/metrics":  # the registry's text may change between two answers
        length = next(
            line.split(b":")[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        assert int(length) == len(got.content)


def test_connections_beyond_the_bound_get_503_while_every_slot_is_busy(
    serve: Callable[..., httpx.Client],
) -> None:
    """With the one slot held by a request in progress, a new connection gets an immediate 503."""
    entered, release = threading.Event(), threading.Event()

    def slow_ready() -> tuple[bool, str]:
        entered.set()
        release.wait(timeout=10)
        return True, ""

    client = serve(make_app(ready=slow_ready), max_connections=1)
    first: list[int] = []
    holder = threading.Thread(target=lambda: first.append(client.get("/-/ready").status_code))
    holder.start()
    try:
        assert entered.wait(timeout=10)
        host, port = str(client.base_url.host), int(client.base_url.port or 0)
        with socket.create_connection((host, port), timeout=10) as extra:
            answer = extra.recv(1024)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    finally:
        release.set()
        holder.join(timeout=10)
    assert first == [200]


def test_an_idle_connection_evicted_for_a_new_one_reads_503_not_a_bare_close(
    serve: Callable[..., httpx.Client],
) -> None:
    """One slot: an idle connection gives it up to a new one, and reads 503 when it asks."""
    client = serve(make_app(), max_connections=1)
    address = (client.base_url.host, client.base_url.port)
    with socket.create_connection(address, timeout=5) as idle:
        assert client.get("/-/ready").status_code == 200  # connection-per-request: evicts idle
        idle.sendall(b"GET /-/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        with contextlib.suppress(OSError):  # the server closed: a reset may follow the answer
            while chunk := idle.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 503 ")


@pytest.mark.parametrize(
    ("sent", "whole"),
    [
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET /metrics HTTP/1.0\n\n", True),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", False),
        (b"", False),
    ],
    ids=["whole", "whole-bare-newlines", "partial", "nothing"],
)
def test_a_request_head_waiting_in_a_socket_is_seen_without_reading_or_waiting(
    sent: bytes, whole: bool
) -> None:
    """The eviction check peeks (the bytes stay for the handler) and never waits for data."""
    server_side, client_side = socket.socketpair()
    with server_side, client_side:
        server_side.settimeout(30.0)  # as a handler's socket: a timeout, which recv() waits for
        if sent:
            client_side.sendall(sent)
        started = time.monotonic()
        assert whole_head_waiting(server_side) is whole
        assert time.monotonic() - started < 5.0, "waited for data instead of peeking"
        if sent:
            assert server_side.recv(65536) == sent


@pytest.mark.parametrize("line_bytes", [70_000, 1_000_000])
def test_a_request_line_past_the_head_bound_is_answered_431(
    serve: Callable[..., httpx.Client], line_bytes: int
) -> None:
    """A 70 kB (or 1 MB) request line: 431 as documented, not a bare close or a reset."""
    client = serve(make_app())
    host, port = client.base_url.host, client.base_url.port
    assert port is not None
    with socket.create_connection((host, port), timeout=5) as conn:
        path = "/" + "a" * line_bytes
        with contextlib.suppress(OSError):  # the server stops reading after its bound
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 431") or answer.startswith(b"HTTP/1.1 431"), answer[:80]


def _big_metrics_app(megabytes: int) -> HeadroomApp:
    """An app whose /metrics answer is ``megabytes`` long: more than loopback buffers hold."""
    registry = CollectorRegistry(auto_describe=False)
    Gauge("big_value", "x" * (megabytes * 1_000_000), registry=registry).set(1.0)
    return HeadroomApp(registry=registry, ready=lambda: (True, ""), landing=lambda: "")


def _slow_reader(address: tuple[str, int]) -> socket.socket:
    """A client that asks for /metrics whole, then never reads (a tiny receive buffer)."""
    reader = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.settimeout(10)
    reader.connect(address)
    reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return reader


@contextlib.contextmanager
def _slow_readers(client: httpx.Client, count: int) -> Iterator[None]:
    """``count`` clients of ``client``'s server that ask for /metrics and never read it."""
    address = (str(client.base_url.host), int(client.base_url.port or 0))
    readers = [_slow_reader(address) for _ in range(count)]
    try:
        yield
    finally:
        for reader in readers:
            reader.close()


def test_slow_readers_holding_every_slot_give_way_to_a_scraper(
    serving: Callable[..., tuple[ExporterServer, httpx.Client]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connections stuck writing to clients that do not read are evicted for a new scraper."""
    monkeypatch.setattr(httpserver, "STALLED_WRITE_SECONDS", 0.2)
    server, client = serving(_big_metrics_app(8), max_connections=2)
    with _slow_readers(client, 2):
        # Both answers under way and blocked for longer than the threshold: waited for, not
        # slept on, since on a busy machine rendering 8 MB twice can take longer than any sleep.
        wait_until(lambda: server.stalled_writer_count() == 2)
        started = time.monotonic()
        response = client.get("/-/healthy")
        assert response.status_code == 200
        assert time.monotonic() - started < 2.0
        assert server.stalled_writers_evicted == 1  # one slot was enough


def test_readers_blocked_for_less_than_the_threshold_are_not_evicted(
    serving: Callable[..., tuple[ExporterServer, httpx.Client]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write blocked briefly may be a client reading slowly: the new scraper gets 503 then."""
    monkeypatch.setattr(httpserver, "STALLED_WRITE_SECONDS", 60.0)
    server, client = serving(_big_metrics_app(8), max_connections=2)
    with _slow_readers(client, 2):
        wait_until(lambda: server.blocked_writer_count() == 2)
        assert server.stalled_writer_count() == 0
        assert client.get("/-/healthy").status_code == 503
        assert server.stalled_writers_evicted == 0


def test_an_answer_not_read_within_the_write_deadline_frees_its_slot(
    serving: Callable[..., tuple[ExporterServer, httpx.Client]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that does not read its answer holds its slot only until the write deadline."""
    monkeypatch.setattr(httpserver, "RESPONSE_WRITE_SECONDS", 2.0)
    monkeypatch.setattr(httpserver, "STALLED_WRITE_SECONDS", 100.0)  # no eviction: the deadline
    server, client = serving(_big_metrics_app(8), max_connections=1)
    with _slow_readers(client, 1):
        wait_until(lambda: server.blocked_writer_count() == 1)  # its answer under way
        assert client.get("/-/healthy").status_code == 503  # the slot is taken meanwhile
        wait_until(lambda: client.get("/-/healthy").status_code == 200)  # past the deadline
        assert server.stalled_writers_evicted == 0  # freed by the deadline, not evicted


# --- /metrics rendered once per poll ---------------------------------------------------------


class CountingCollector:
    """A collector with fixed families that counts how often it is collected."""

    def __init__(self) -> None:
        self.collections = 0

    def collect(self) -> Iterator[Metric]:
        """The same families every time, and one more collection counted."""
        self.collections += 1
        gauge = GaugeMetricFamily("demo_value", "A demo gauge.", labels=["engine"])
        gauge.add_metric(["0"], 3.0)
        gauge.add_metric(["1"], 4.5)
        yield gauge
        counter = CounterMetricFamily("demo_requests", "Demo requests.", labels=["outcome"])
        counter.add_metric(["ok"], 12.0)
        yield counter


class Generation:
    """The state a CachedExposition follows: a new object stands for a new poll."""

    def __init__(self) -> None:
        self.current = object()

    def __call__(self) -> object:
        return self.current

    def poll(self) -> None:
        """A new poll: a new view."""
        self.current = object()


def counting_registry() -> tuple[CollectorRegistry, CountingCollector]:
    """A private registry over one CountingCollector."""
    registry = CollectorRegistry(auto_describe=False)
    collector = CountingCollector()
    registry.register(collector)
    return registry, collector


def call(app: Callable[..., Iterable[bytes]], **environ: str) -> tuple[str, list[Any], bytes]:
    """One WSGI request to ``app``: its status, headers and body."""
    got: list[Any] = []
    base = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
    body = b"".join(app({**base, **environ}, lambda status, headers: got.extend([status, headers])))
    return got[0], got[1], body


ACCEPTS = [
    "",
    "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "application/openmetrics-text",
]


@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("encoding", ["", "gzip", "identity, gzip;q=0.5"])
def test_a_cached_answer_is_byte_for_byte_prometheus_client_s(accept: str, encoding: str) -> None:
    """Same status, headers and bytes as client_python's own app, for every format."""
    registry, _ = counting_registry()
    cached = CachedExposition(registry, Generation(), max_age_seconds=60)
    plain = make_wsgi_app(registry)
    environ = {"HTTP_ACCEPT": accept, "HTTP_ACCEPT_ENCODING": encoding}
    for _ in range(2):  # rendered, then from the cache
        status, headers, body = call(cached, **environ)
        want_status, want_headers, want_body = call(plain, **environ)
        assert (status, headers[:-1]) == (want_status, want_headers)
        assert headers[-1] == ("Content-Length", str(len(body)))  # wsgiref adds it to GET
        if encoding:
            assert ("Content-Encoding", "gzip") in headers
            body, want_body = gzip.decompress(body), gzip.decompress(want_body)
        assert body == want_body


def test_many_concurrent_scrapes_of_one_poll_cost_one_render(
    serve: Callable[..., httpx.Client],
) -> None:
    """Thirty scrapers at once, in two formats, compressed or not: two renders, not thirty."""
    registry, collector = counting_registry()
    cached = CachedExposition(registry, Generation(), max_age_seconds=60)
    client = serve(
        HeadroomApp(registry=registry, ready=lambda: (True, ""), landing=str, metrics=cached)
    )
    variants = [
        {},
        {"Accept-Encoding": "gzip"},
        {"Accept": "application/openmetrics-text;version=1.0.0"},
    ]
    bodies: list[bytes] = []

    def scrape(headers: dict[str, str]) -> None:
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 200
        bodies.append(response.content)  # httpx decodes gzip

    threads = [threading.Thread(target=scrape, args=(variants[n % 3],)) for n in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(bodies) == 30
    assert collector.collections == cached.renders == 2  # text (plain and gzip), OpenMetrics
    assert len(set(bodies)) == 2


def test_a_new_poll_or_the_maximum_age_renders_again() -> None:
    """The cache follows the poller's view, and never outlives ``max_age_seconds``."""
    registry, collector = counting_registry()
    generation = Generation()
    now = [100.0]
    cached = CachedExposition(registry, generation, max_age_seconds=5, clock=lambda: now[0])
    call(cached)
    call(cached)
    assert collector.collections == 1
    generation.poll()
    call(cached)
    assert collector.collections == 2
    now[0] += 4.9
    call(cached)
    assert collector.collections == 2
    now[0] += 0.1
    call(cached)
    assert collector.collections == 3


def test_name_filtered_scrapes_go_to_prometheus_client_uncached() -> None:
    """``name[]`` answers exactly as client_python's app does, and is never cached.

    (client_python 0.26 filters only collectors that describe their names: a collector that
    does not, like ours, is left out of a filtered answer, cached or not.)
    """
    registry, _ = counting_registry()
    Gauge("other_value", "Another gauge.", registry=registry).set(1.0)
    cached = CachedExposition(registry, Generation(), max_age_seconds=60)
    plain = make_wsgi_app(registry)
    query = "name[]=other_value&name[]=demo_requests_total"
    for _ in range(2):
        got = call(cached, QUERY_STRING=query)
        assert got == call(plain, QUERY_STRING=query)
        assert b"other_value 1.0" in got[2]
    _, _, whole = call(cached)
    assert b"demo_value" in whole
    assert cached.renders == 1  # the unfiltered one only


def test_the_variants_kept_are_bounded_whatever_the_accept_headers() -> None:
    """Version strings are free text: a client inventing new ones gets answers, not memory."""
    registry, _ = counting_registry()
    cached = CachedExposition(registry, Generation(), max_age_seconds=60)
    for n in range(40):
        version = "1.0." + "0" * (n + 1)
        status, _, body = call(
            cached, HTTP_ACCEPT=f"application/openmetrics-text;version={version}"
        )
        assert status == "200 OK"
        assert body.endswith(b"# EOF\n")
    assert len(cached._variants) <= httpserver.MAX_CACHED_VARIANTS


def test_head_of_cached_metrics_sends_the_content_length_of_get(
    serve: Callable[..., httpx.Client],
) -> None:
    """HEAD and GET of one poll are the same bytes: the lengths agree exactly.

    (Uncached, client_python's app sets no Content-Length and a HEAD answered 0.)
    """
    registry, _ = counting_registry()
    cached = CachedExposition(registry, Generation(), max_age_seconds=60)
    client = serve(
        HeadroomApp(registry=registry, ready=lambda: (True, ""), landing=str, metrics=cached)
    )
    identity = {"Accept-Encoding": "identity"}
    got = client.get("/metrics", headers=identity)
    head = client.head("/metrics", headers=identity)
    assert head.status_code == 200
    assert int(head.headers["content-length"]) == len(got.content)
    assert head.content == b""
