"""Specification of reading one vLLM over HTTP: bounded reads, failures as bounded reasons."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from pydantic import SecretStr

from exporter.core.reasons import AnswerRefusal, HttpReason
from exporter.errors import SourceError
from exporter.testing.fakevllm import CHUNK_BYTES, FakeVllm, Fault, VllmState, render_models
from exporter.vllm.client import (
    ModelsInfo,
    ResponseBudget,
    Route,
    VllmClient,
    parse_models,
    routed,
)
from tests import paths

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

AFTER_LOAD = (paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_bytes()
HTTP_REASONS = {reason.value for reason in HttpReason}
TEXT = {"content-type": "text/plain; version=0.0.4; charset=utf-8"}


def transport(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    """A server of our own making, for answers the fake vLLM never gives."""
    return httpx.MockTransport(handler)


def answering(
    status: int = 200, content: bytes = b"", headers: dict[str, str] | None = None
) -> httpx.MockTransport:
    """A server that answers every request the same way."""
    return transport(lambda _request: httpx.Response(status, content=content, headers=headers))


def fetch(
    source: httpx.AsyncBaseTransport | str,
    what: str = "fetch_metrics",
    *,
    max_bytes: int = 1 << 20,
    timeout_seconds: float = 2.0,
    token: str | None = None,
    base_url: str = "http://vllm:8000",
) -> Any:
    """Call ``VllmClient.<what>`` once, over a transport or a real URL, and return its answer."""

    async def go() -> Any:
        if isinstance(source, str):
            base_url_used, http = source, httpx.AsyncClient()
        else:
            base_url_used, http = base_url, httpx.AsyncClient(transport=source)
        async with http:
            client = VllmClient(
                base_url_used,
                client=http,
                timeout_seconds=timeout_seconds,
                max_bytes=max_bytes,
                bearer_token=SecretStr(token) if token is not None else None,
            )
            return await getattr(client, what)()

    return asyncio.run(go())


def failure(source: httpx.AsyncBaseTransport | str, what: str = "fetch_metrics", **kw: Any) -> str:
    """The reason the call fails with; it must be a SourceError with a bounded HttpReason."""
    with pytest.raises(SourceError) as caught:
        fetch(source, what, **kw)
    assert caught.value.reason in HTTP_REASONS
    return caught.value.reason


# --- /metrics --------------------------------------------------------------------------------


def test_fetch_metrics_returns_the_body_as_served() -> None:
    """The /metrics payload comes back byte for byte, from one request."""
    fake = FakeVllm(payload=AFTER_LOAD, listen=False)
    assert fetch(fake.transport()) == AFTER_LOAD
    assert fake.counts.requests == {"/metrics": 1}


def test_fetch_metrics_reads_a_real_socket() -> None:
    """Over loopback, the fake vLLM's rendered payload arrives whole."""
    with FakeVllm() as fake:
        body = fetch(fake.url)
    assert body.startswith(b"# HELP python_gc_objects_collected_total")
    assert b'vllm:cache_config_info{block_size="128"' in body


def test_a_trailing_slash_in_the_base_url_is_not_doubled() -> None:
    """A base URL of "http://vllm:8000/" reads /metrics, not //metrics."""
    paths_seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths_seen.append(request.url.path)
        return httpx.Response(200, content=AFTER_LOAD, headers=TEXT)

    fetch(transport(handler), base_url="http://vllm:8000/")
    assert paths_seen == ["/metrics"]


def test_every_request_asks_for_an_uncompressed_answer() -> None:
    """Accept-Encoding is identity: a compressed body could expand before any size check."""
    seen: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, content=AFTER_LOAD, headers=TEXT)

    fetch(transport(handler))
    assert seen[0]["accept-encoding"] == "identity"
    assert seen[0]["accept"].startswith("text/plain")


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (401, "http_401"),
        (403, "http_403"),
        (404, "http_404"),
        (400, "http_4xx"),
        (429, "http_4xx"),
        (500, "http_5xx"),
        (502, "http_5xx"),
        (503, "http_5xx"),
        (301, "http_3xx"),
        (302, "http_3xx"),
        (307, "http_3xx"),
        (204, "invalid_response"),
    ],
)
def test_a_status_other_than_200_maps_to_its_reason(status: int, reason: str) -> None:
    """401, 403, 404 keep their code; 4xx, 5xx and redirects (not followed) have their own."""
    assert failure(answering(status, AFTER_LOAD, TEXT)) == reason


@pytest.mark.parametrize("status", [201, 204, 301, 302, 304, 418, 599])
def test_any_unexpected_status_still_fails_with_a_bounded_reason(status: int) -> None:
    """Whatever the status, a non-200 answer is a SourceError with an HttpReason, never a body."""
    failure(answering(status, AFTER_LOAD, TEXT))


def test_the_fake_vllms_500_is_http_5xx() -> None:
    """The fake vLLM's HTTP_500 fault reads as http_5xx."""
    fake = FakeVllm(listen=False)
    fake.set_fault(Fault.HTTP_500)
    assert failure(fake.transport()) == "http_5xx"


@pytest.mark.parametrize("fault", [Fault.HTML, Fault.JSON])
def test_a_page_or_document_instead_of_metrics_is_not_metrics(fault: Fault) -> None:
    """A login page (text/html) or a JSON answer on /metrics is not_metrics."""
    fake = FakeVllm(listen=False)
    fake.set_fault(fault)
    assert failure(fake.transport()) == "not_metrics"


@pytest.mark.parametrize(
    "body", [b"<!DOCTYPE html><html></html>", b'  {"detail": "x"}', b"\n[1, 2]", b"<html>"]
)
def test_html_or_json_labelled_as_text_is_still_not_metrics(body: bytes) -> None:
    """The body's first character gives HTML and JSON away even under a text/plain type."""
    assert failure(answering(200, body, TEXT)) == "not_metrics"


def test_a_declared_length_over_the_limit_is_too_large_before_reading() -> None:
    """A Content-Length above max_bytes fails at once; the body is never read."""
    started: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        yield AFTER_LOAD

    def handler(_request: httpx.Request) -> httpx.Response:
        headers = {**TEXT, "content-length": str(10**9)}
        return httpx.Response(200, content=body(), headers=headers)

    assert failure(transport(handler), max_bytes=1 << 20) == "too_large"
    assert started == []


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_of_exactly_the_limit_is_read(declared: bool) -> None:
    """max_bytes is the largest body accepted, declared or streamed; one byte more is too_large."""

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(AFTER_LOAD), 1000):
            yield AFTER_LOAD[start : start + 1000]

    def handler(_request: httpx.Request) -> httpx.Response:
        if declared:
            return httpx.Response(200, content=AFTER_LOAD, headers=TEXT)
        return httpx.Response(200, content=chunks(), headers=TEXT)

    size = len(AFTER_LOAD)
    assert fetch(transport(handler), max_bytes=size) == AFTER_LOAD
    assert failure(transport(handler), max_bytes=size - 1) == "too_large"


def test_a_streamed_body_over_the_limit_stops_being_read() -> None:
    """A chunked body without a length is too_large once max_bytes is passed, not at its end."""
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        for _ in range(1000):  # 64 MiB if read to the end
            sent.append(CHUNK_BYTES)
            yield b"#" * CHUNK_BYTES

    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless(), headers=TEXT)

    assert failure(transport(handler), max_bytes=3 * CHUNK_BYTES) == "too_large"
    assert sum(sent) <= 4 * CHUNK_BYTES


def test_the_fake_vllms_200_mb_answer_is_too_large() -> None:
    """The HUGE fault (200 MB of metric lines) fails at max_bytes."""
    fake = FakeVllm(listen=False)
    fake.set_fault(Fault.HUGE)
    started = time.monotonic()
    assert failure(fake.transport(), max_bytes=1 << 20) == "too_large"
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP "])
def test_a_compressed_answer_is_an_invalid_response_and_never_decoded(encoding: str) -> None:
    """We ask for identity: a server that compresses anyway gets invalid_response, unread."""
    started: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        yield gzip.compress(AFTER_LOAD)

    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body(), headers={**TEXT, "content-encoding": encoding})

    assert failure(transport(handler)) == "invalid_response"
    assert started == []


def test_an_identity_content_encoding_is_accepted() -> None:
    """Content-Encoding: identity is what we asked for: the body is returned."""
    headers = {**TEXT, "content-encoding": "identity"}
    assert fetch(answering(200, AFTER_LOAD, headers)) == AFTER_LOAD


# --- deadlines and connections ---------------------------------------------------------------


def test_a_server_that_never_answers_times_out_within_the_deadline() -> None:
    """A server that accepts and then says nothing is a timeout, soon after timeout_seconds."""
    with FakeVllm() as fake:
        fake.set_fault(Fault.HANG)
        started = time.monotonic()
        assert failure(fake.url, timeout_seconds=0.3) == "timeout"
        elapsed = time.monotonic() - started
        fake.set_fault(Fault.NONE)
    assert 0.25 <= elapsed < 2.0


def test_a_server_answering_byte_by_byte_times_out_on_the_overall_deadline() -> None:
    """Each byte arrives in time for httpx, but the whole read is bounded by timeout_seconds."""
    with FakeVllm(payload=AFTER_LOAD) as fake:
        fake.set_fault(Fault.SLOW)  # 5 ms a byte: the capture would take minutes
        started = time.monotonic()
        assert failure(fake.url, timeout_seconds=0.3) == "timeout"
        elapsed = time.monotonic() - started
        fake.set_fault(Fault.NONE)
    assert elapsed < 2.0


def test_the_transports_timeout_is_a_timeout() -> None:
    """httpx's own timeout (the fake vLLM's HANG through the transport) reads as timeout."""
    fake = FakeVllm(listen=False)
    fake.set_fault(Fault.HANG)
    assert failure(fake.transport()) == "timeout"


def test_nobody_listening_is_connection_refused() -> None:
    """A stopped vLLM (nothing listens on its port) is connection_refused."""
    with FakeVllm() as fake:
        fake.set_fault(Fault.REFUSE)
        assert failure(fake.url) == "connection_refused"
        fake.set_fault(Fault.NONE)


def test_a_closed_port_is_connection_refused() -> None:
    """A loopback port that was just freed refuses the connection."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert failure(f"http://127.0.0.1:{port}") == "connection_refused"


def test_another_connection_failure_is_connection_error() -> None:
    """A connection that fails for another reason (no such host) is connection_error."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno -2] Name or service not known", request=request)

    assert failure(transport(handler)) == "connection_error"


def test_a_body_cut_short_is_a_connection_error_not_half_a_payload() -> None:
    """A server that closes before sending the promised Content-Length is connection_error."""
    with FakeVllm(payload=AFTER_LOAD) as fake:
        fake.set_fault(Fault.TRUNCATED)
        assert failure(fake.url) == "connection_error"
        fake.set_fault(Fault.NONE)


# --- the bearer token ------------------------------------------------------------------------


def test_the_bearer_token_is_sent_as_the_authorization_header() -> None:
    """The configured token goes in the Authorization header of every request."""
    fake = FakeVllm(token="tok", listen=False)  # noqa: S106 - a test token

    async def go() -> None:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = VllmClient(
                "http://v:1",
                client=http,
                timeout_seconds=1,
                max_bytes=1 << 20,
                bearer_token=SecretStr("tok"),
            )
            await client.fetch_metrics()

    asyncio.run(go())
    assert fake.counts.authorizations == {"Bearer tok"}


def test_without_a_token_no_authorization_header_is_sent_and_401_says_so() -> None:
    """No token configured sends no Authorization header; a vLLM that wants one gives http_401."""
    fake = FakeVllm(token="tok", listen=False)  # noqa: S106 - a test token
    assert failure(fake.transport()) == "http_401"
    assert fake.counts.authorizations == set()


@pytest.mark.parametrize("status", [401, 403, 500])
def test_the_bearer_token_never_appears_in_an_error_message(status: int) -> None:
    """A failure's message, which is logged, names the path and status but never the token."""
    token = "s3cret-token-value"  # noqa: S105 - a test token
    with pytest.raises(SourceError) as caught:
        fetch(answering(status), token=token)
    assert token not in str(caught.value)
    assert str(status) in str(caught.value)


# --- /v1/models and /version -----------------------------------------------------------------


def test_fetch_models_reads_the_id_root_and_max_model_len() -> None:
    """The fake vLLM's /v1/models gives its model id, root path and context length."""
    state = VllmState(model="llama", root="/models/llama-3.1-8b", max_model_len=8192)
    fake = FakeVllm(state=state, listen=False)
    assert fetch(fake.transport(), "fetch_models") == ModelsInfo(
        "llama", "/models/llama-3.1-8b", 8192
    )
    assert fake.counts.requests == {"/v1/models": 1}


def _models(**model: object) -> dict[str, object]:
    return {"object": "list", "data": [{"id": "m", "object": "model", **model}]}


@pytest.mark.parametrize("value", [0, -1, "4096", 4096.0, None])
def test_a_max_model_len_that_is_not_a_positive_integer_is_none(value: object) -> None:
    """0, negative, text, float or null max_model_len is unknown (None), not an error."""
    document = json.dumps(_models(root="/m", max_model_len=value)).encode()
    info = fetch(answering(200, document), "fetch_models")
    assert info == ModelsInfo("m", "/m", None)


@pytest.mark.parametrize("model", [{}, {"root": ""}, {"root": 7}, {"root": None}])
def test_a_missing_or_empty_root_is_none(model: dict[str, object]) -> None:
    """A model without a usable root (absent, empty, not text) has root None; the rest stays."""
    info = parse_models(_models(max_model_len=512, **model))
    assert info == ModelsInfo("m", None, 512)


def test_only_the_first_listed_model_is_read() -> None:
    """/v1/models may list LoRA adapters after the served model: the first entry counts."""
    document = {
        "data": [
            {"id": "m", "root": "/base", "max_model_len": 512},
            {"id": "adapter", "root": "/lora", "max_model_len": 99},
        ]
    }
    assert parse_models(document) == ModelsInfo("m", "/base", 512)


def test_models_document_shapes_are_checked() -> None:
    """A /v1/models answer without a model is an invalid response, not a crash."""
    with pytest.raises(SourceError) as caught:
        parse_models(json.loads('{"data": []}'))
    assert caught.value.reason == "invalid_response"
    assert parse_models(json.loads(render_models(VllmState()))).max_model_len == 512


@pytest.mark.parametrize(
    "document",
    [
        None,
        [],
        "models",
        {},
        {"data": {"id": "m"}},
        {"data": ["m"]},
        {"data": [{"object": "model"}]},
        {"data": [{"id": 7}]},
    ],
)
def test_a_models_document_of_another_shape_is_an_invalid_response(document: object) -> None:
    """No list under "data", no object first in it, or no text id: invalid_response."""
    with pytest.raises(SourceError) as caught:
        parse_models(document)
    assert caught.value.reason == "invalid_response"


@pytest.mark.parametrize("what", ["fetch_models", "fetch_version"])
def test_an_answer_that_is_not_json_is_an_invalid_response(what: str) -> None:
    """An HTML page or broken JSON on /v1/models or /version is invalid_response."""
    assert failure(answering(200, b"<html>Sign in</html>"), what) == "invalid_response"
    assert failure(answering(200, b'{"data": ['), what) == "invalid_response"


@pytest.mark.parametrize("what", ["fetch_models", "fetch_version"])
def test_the_facts_endpoints_map_http_failures_too(what: str) -> None:
    """While vLLM loads its model, /v1/models and /version answer 503: http_5xx."""
    fake = FakeVllm(listen=False)
    fake.set_fault(Fault.MODELS_DOWN)
    assert failure(fake.transport(), what) == "http_5xx"


def test_a_models_answer_over_a_mebibyte_is_too_large() -> None:
    """/v1/models is bounded too: an answer over 1 MiB is too_large."""
    document = json.dumps(_models(padding="x" * (1 << 20))).encode()
    assert failure(answering(200, document), "fetch_models", max_bytes=1 << 30) == "too_large"


def test_fetch_version_reads_the_version_string() -> None:
    """/version's "version" comes back as vLLM wrote it."""
    fake = FakeVllm(state=VllmState(version="0.11.0 (V1)"), listen=False)
    assert fetch(fake.transport(), "fetch_version") == "0.11.0 (V1)"
    assert fake.counts.requests == {"/version": 1}


@pytest.mark.parametrize(
    "document", [{}, {"version": ""}, {"version": 32}, {"version": None}, ["0.32.0"], "0.32.0"]
)
def test_a_version_answer_without_a_version_string_is_an_invalid_response(
    document: object,
) -> None:
    """No "version", an empty one, a number, or no object at all: invalid_response."""
    body = json.dumps(document).encode()
    assert failure(answering(200, body), "fetch_version") == "invalid_response"


# --- pinned clients (fleet mode) -------------------------------------------------------------


def pinned_fetch(
    source: httpx.AsyncBaseTransport | None,
    route: Route | None,
    *,
    base_url: str = "http://vllm.svc:8000",
    token: str | None = "tok",  # noqa: S107 - a test token
) -> Any:
    """``fetch_metrics`` through a pinned client within ``route`` (none: outside any route)."""

    async def go() -> Any:
        async with httpx.AsyncClient(transport=source) as http:
            client = VllmClient(
                base_url,
                client=http,
                timeout_seconds=2,
                max_bytes=1 << 20,
                bearer_token=SecretStr(token) if token is not None else None,
                pinned=True,
            )
            if route is None:
                return await client.fetch_metrics()
            with routed(route):
                return await client.fetch_metrics()

    return asyncio.run(go())


def recording(seen: list[httpx.Request]) -> httpx.MockTransport:
    """A server that records every request and answers vLLM's metrics."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=AFTER_LOAD, headers=TEXT)

    return transport(handle)


def address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address from its text."""
    return ipaddress.ip_address(text)


def test_a_pinned_client_connects_to_the_routes_address_and_keeps_the_name_as_host() -> None:
    """The request goes to 10.0.0.5, its Host header still says vllm.svc:8000."""
    seen: list[httpx.Request] = []
    pinned_fetch(recording(seen), Route((address("10.0.0.5"),), send_token=False))
    (request,) = seen
    assert str(request.url) == "http://10.0.0.5:8000/metrics"
    assert request.headers["host"] == "vllm.svc:8000"


def test_a_pinned_client_outside_any_route_sends_nothing() -> None:
    """Without a checked address there is nowhere it may connect: connection_error, no request."""
    seen: list[httpx.Request] = []
    with pytest.raises(SourceError, match="no checked address") as caught:
        pinned_fetch(recording(seen), None)
    assert caught.value.reason == HttpReason.CONNECTION_ERROR
    assert seen == []


@pytest.mark.parametrize("send_token", [True, False])
def test_a_pinned_client_sends_the_token_only_where_the_route_allows(send_token: bool) -> None:
    """The token configured goes with the request only when the route says the address may."""
    seen: list[httpx.Request] = []
    pinned_fetch(recording(seen), Route((address("10.0.0.5"),), send_token=send_token))
    sent = seen[0].headers.get("authorization")
    assert sent == ("Bearer tok" if send_token else None)


def test_https_keeps_the_name_for_tls_and_never_reuses_a_connection_across_names() -> None:
    """SNI and the certificate check use the name; the connection closes after the answer."""
    seen: list[httpx.Request] = []
    route = Route((address("fd00::5"),), send_token=True)
    pinned_fetch(recording(seen), route, base_url="https://vllm.svc:8443")
    (request,) = seen
    assert str(request.url) == "https://[fd00::5]:8443/metrics"
    assert request.extensions["sni_hostname"] == "vllm.svc"
    assert request.headers["host"] == "vllm.svc:8443"
    assert request.headers["connection"] == "close"


def test_when_connecting_to_one_checked_address_fails_the_next_one_is_tried() -> None:
    """A refused first address (nothing sent) falls back to the second; never to another."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "10.0.0.1":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, content=AFTER_LOAD, headers=TEXT)

    route = Route((address("10.0.0.1"), address("10.0.0.2")), send_token=False)
    assert pinned_fetch(transport(handle), route) == AFTER_LOAD
    assert [r.url.host for r in seen] == ["10.0.0.1", "10.0.0.2"]


def test_a_pinned_client_reaches_a_real_server_by_an_unresolvable_name() -> None:
    """Over a socket: ``rebind.invalid`` is never resolved; the route's 127.0.0.1 answers."""
    with FakeVllm() as vllm:
        route = Route((address("127.0.0.1"),), send_token=False)
        body = pinned_fetch(None, route, base_url=f"http://rebind.invalid:{vllm.port}")
    assert b"vllm:" in body


def test_a_redirect_is_never_followed_even_when_pinned() -> None:
    """A 302 to the metadata address is http_3xx: no second request is made."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(302, headers={"location": "http://169.254.169.254/metrics"})

    with pytest.raises(SourceError) as caught:
        pinned_fetch(transport(handle), Route((address("10.0.0.5"),), send_token=True))
    assert caught.value.reason == HttpReason.HTTP_3XX
    assert len(seen) == 1


@pytest.fixture(scope="module")
def tls_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, ssl.SSLContext]]:
    """A TLS server on 127.0.0.1 certified for vllm.test only: (port, a context trusting it)."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=vllm.test",
            "-addext", "subjectAltName=DNS:vllm.test", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", TEXT["content-type"])
            self.send_header("Content-Length", str(len(AFTER_LOAD)))
            self.end_headers()
            self.wfile.write(AFTER_LOAD)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(cert, key)
    server.socket = serving.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    trusting = ssl.create_default_context(cafile=str(cert))
    try:
        yield int(server.server_address[1]), trusting
    finally:
        server.shutdown()
        server.server_close()


def tls_fetch(port: int, context: ssl.SSLContext, name: str) -> bytes:
    """``fetch_metrics`` of ``https://<name>:<port>`` pinned to 127.0.0.1, trusting ``context``."""

    async def go() -> bytes:
        async with httpx.AsyncClient(verify=context) as http:
            client = VllmClient(
                f"https://{name}:{port}",
                client=http,
                timeout_seconds=5,
                max_bytes=1 << 20,
                pinned=True,
            )
            with routed(Route((address("127.0.0.1"),), send_token=False)):
                return await client.fetch_metrics()

    return asyncio.run(go())


def test_a_pinned_https_client_verifies_the_certificate_against_the_name(
    tls_vllm: tuple[int, ssl.SSLContext],
) -> None:
    """Pinned to 127.0.0.1, the certificate is checked against the name, not the address.

    It passes for vllm.test, and fails for another name pinned to the same address.
    """
    port, context = tls_vllm
    assert tls_fetch(port, context, "vllm.test") == AFTER_LOAD
    with pytest.raises(SourceError) as caught:
        tls_fetch(port, context, "other.test")
    assert caught.value.reason == HttpReason.CONNECTION_ERROR


# --- The budget of the answers read at once (fleet mode) ------------------------------------

KIB = 1024


def test_answers_grow_freely_while_the_budget_has_room() -> None:
    """Under the total, an answer may hold more than its fair share: nobody else needs it."""
    budget = ResponseBudget(100 * KIB)
    big, small = budget.open(), budget.open()
    assert big.add(b"x" * 90 * KIB) is None
    assert small.add(b"y" * 10 * KIB) is None
    assert budget.in_use == 100 * KIB
    assert budget.refusals == dict.fromkeys(AnswerRefusal, 0)


def test_the_fair_share_is_the_total_over_the_answers_being_read() -> None:
    """The share follows the answers being read now, not those read before."""
    budget = ResponseBudget(90 * KIB)
    readings = [budget.open() for _ in range(3)]
    assert budget.fair_share == 30 * KIB
    readings[0].close()
    assert budget.fair_share == 45 * KIB


def test_an_answer_within_its_share_cuts_the_biggest_one_over_its_share() -> None:
    """The budget is full of two big answers; a small one makes room by cutting the biggest."""
    budget = ResponseBudget(100 * KIB)
    biggest, big, small = budget.open(), budget.open(), budget.open()
    assert biggest.add(b"a" * 60 * KIB) is None
    assert big.add(b"b" * 40 * KIB) is None
    assert small.add(b"c" * 10 * KIB) is None  # share: 33 KiB; 60 > 40 > share
    assert biggest.refused is AnswerRefusal.CUT
    assert (biggest.held, biggest.chunks) == (0, [])  # its bytes are freed at once
    assert big.refused is None
    assert budget.in_use == 50 * KIB
    assert budget.refusals[AnswerRefusal.CUT] == 1
    assert biggest.add(b"a") is AnswerRefusal.CUT  # a cut answer stays cut
    assert budget.refusals[AnswerRefusal.CUT] == 1  # counted once


def test_an_answer_over_its_share_of_a_full_budget_is_refused_not_another() -> None:
    """The answer that needs more than its share gives way; the small one keeps its bytes."""
    budget = ResponseBudget(100 * KIB)
    small, big = budget.open(), budget.open()
    assert small.add(b"s" * 10 * KIB) is None
    assert big.add(b"b" * 85 * KIB) is None
    assert big.add(b"b" * 10 * KIB) is AnswerRefusal.OVER_SHARE  # 95 KiB > 50 KiB share
    assert (big.held, budget.in_use) == (0, 10 * KIB)
    assert small.refused is None
    assert budget.refusals[AnswerRefusal.OVER_SHARE] == 1


def test_an_answer_over_its_share_cuts_a_bigger_one_before_giving_way() -> None:
    """Over its share but not the biggest: the biggest goes, and this one goes on."""
    budget = ResponseBudget(100 * KIB)
    biggest, middle = budget.open(), budget.open()
    assert biggest.add(b"a" * 60 * KIB) is None
    assert middle.add(b"b" * 35 * KIB) is None
    budget.open()  # a third answer: the share is 33 KiB
    assert middle.add(b"b" * 10 * KIB) is None  # 45 KiB, over its share: the 60 KiB one goes
    assert biggest.refused is AnswerRefusal.CUT
    assert budget.in_use == 45 * KIB
    hog = budget.open()  # share 25 KiB
    assert hog.add(b"d" * 60 * KIB) is AnswerRefusal.OVER_SHARE  # it would be the biggest
    assert middle.refused is None
    assert budget.refusals == {AnswerRefusal.CUT: 1, AnswerRefusal.OVER_SHARE: 1}


def test_a_newcomer_within_its_share_always_finds_room() -> None:
    """Everyone at most at their share sums to at most the total: cutting always makes room."""
    budget = ResponseBudget(90 * KIB)
    held = [budget.open() for _ in range(2)]
    for reading in held:
        assert reading.add(b"z" * 45 * KIB) is None
    newcomer = budget.open()  # share 30 KiB: both over it, the biggest (first found) gives way
    assert newcomer.add(b"n" * 30 * KIB) is None
    assert sum(r.refused is AnswerRefusal.CUT for r in held) == 1
    assert budget.in_use == 75 * KIB
    budget = ResponseBudget(90 * KIB)
    readings = [budget.open() for _ in range(3)]
    for reading in readings:
        assert reading.add(b"z" * 30 * KIB) is None  # everyone exactly at the share
    assert readings[0].add(b"z") is AnswerRefusal.OVER_SHARE


def test_a_closed_reading_gives_its_bytes_back_and_leaves_the_share() -> None:
    """A finished answer no longer counts, neither in bytes nor in the number sharing."""
    budget = ResponseBudget(100 * KIB)
    reading = budget.open()
    reading.add(b"x" * 70 * KIB)
    reading.close()
    assert (budget.in_use, budget.fair_share) == (0, 100 * KIB)


def test_small_healthy_answers_are_never_starved_by_big_stalled_ones() -> None:
    """Issue 30: five targets answering 16 MiB and stalling starved a healthy one (26 of 50).

    Scaled down: five big answers stall half-way inside a budget they fill; fifty small
    answers, read one after another beside them, all succeed, and the big ones give way.
    """
    budget = ResponseBudget(4 * 1024 * KIB)
    stalled = [budget.open() for _ in range(5)]
    for reading in stalled:
        assert reading.add(b"s" * 819 * KIB) is None  # 4,095 of 4,096 KiB
    healthy_ok = 0
    for _ in range(50):
        healthy = budget.open()
        if all(healthy.add(b"h" * 16 * KIB) is None for _ in range(4)):
            healthy_ok += 1
        healthy.close()
    assert healthy_ok == 50
    assert budget.refusals[AnswerRefusal.CUT] >= 1
    assert budget.in_use <= budget.total_bytes


def stalling_then(body: bytes, stall: asyncio.Event) -> httpx.MockTransport:
    """A server that sends ``body`` and then waits on ``stall`` before ending its answer."""

    async def stream() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 64 * KIB):
            yield body[start : start + 64 * KIB]
            await asyncio.sleep(0)
        await stall.wait()

    async def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=TEXT, content=stream())

    return httpx.MockTransport(handler)


def test_clients_sharing_a_budget_cut_a_stalled_big_answer_for_a_healthy_one() -> None:
    """Through the client: the healthy target reads its payload; the big one fails too_large."""

    async def go() -> tuple[BaseException | bytes, ...]:
        stall = asyncio.Event()
        budget = ResponseBudget(820 * KIB)  # the big answer (800 KiB) and 50 KB do not fit
        big = VllmClient(
            "http://big:8000",
            client=httpx.AsyncClient(transport=stalling_then(b"# x\n" * 200 * KIB, stall)),
            timeout_seconds=5,
            max_bytes=16 << 20,
            budget=budget,
        )
        healthy = VllmClient(
            "http://healthy:8000",
            client=httpx.AsyncClient(transport=answering(content=AFTER_LOAD, headers=TEXT)),
            timeout_seconds=5,
            max_bytes=16 << 20,
            budget=budget,
        )
        stalled = asyncio.ensure_future(big.fetch_metrics())
        while budget.in_use < 800 * KIB:  # the big answer whole, its end stalled
            await asyncio.sleep(0)
        answer = await healthy.fetch_metrics()
        stall.set()
        results = await asyncio.gather(stalled, return_exceptions=True)
        return answer, *results

    answer, big_result = asyncio.run(go())
    assert answer == AFTER_LOAD
    assert isinstance(big_result, SourceError)
    assert big_result.reason == HttpReason.TOO_LARGE
    assert "cut to make room" in str(big_result)


# --- hostile /v1/models and /version answers -------------------------------------------------


LONG = "x" * 513  # one past the cap of every fact (CardinalityLimits.max_label_value_chars)


@pytest.mark.parametrize(
    ("model", "root", "max_len", "ignored"),
    [
        ({"root": LONG}, None, 512, "root (513 characters, more than 512)"),
        ({"root": "r" * 512}, "r" * 512, 512, None),
        ({"max_model_len": 10**4000}, "/m", None, "max_model_len (over 2147483647: 13288 bits)"),
        ({"max_model_len": 2**31}, "/m", None, "max_model_len (over 2147483647: 32 bits)"),
        ({"max_model_len": 2**31 - 1}, "/m", 2**31 - 1, None),
        ({"max_model_len": True}, "/m", None, None),
    ],
    ids=["root-too-long", "root-at-cap", "len-4000-digits", "len-2**31", "len-at-cap", "len-bool"],
)
def test_a_models_field_no_vllm_gives_is_absent_never_cut_short(
    model: dict[str, object], root: str | None, max_len: int | None, ignored: str | None
) -> None:
    """A root past the cap, or a max_model_len that is no context length, is absent (named)."""
    document = {"data": [{"id": "m", "root": "/m", "max_model_len": 512, **model}]}
    info = parse_models(document)
    assert (info.model_id, info.root, info.max_model_len) == ("m", root, max_len)
    assert info.ignored == ((ignored,) if ignored else ())


@pytest.mark.parametrize(
    ("what", "body"),
    [
        ("fetch_models", {"data": [{"id": LONG, "root": "/m"}]}),
        ("fetch_version", {"version": LONG}),
        ("fetch_version", {"version": "0." * 450_000}),
    ],
    ids=["model-id", "version", "version-900kB"],
)
def test_an_id_or_version_past_the_cap_is_an_invalid_response(what: str, body: object) -> None:
    """A 513-character id or version is not vLLM's: invalid_response, saying its length."""
    with pytest.raises(SourceError) as caught:
        fetch(answering(200, json.dumps(body).encode()), what)
    assert caught.value.reason == "invalid_response"
    assert "characters, more than 512" in str(caught.value)
    assert len(str(caught.value)) < 200


def test_a_version_at_the_cap_is_kept() -> None:
    """512 characters is within the cap: kept whole."""
    body = json.dumps({"version": "v" * 512}).encode()
    assert fetch(answering(200, body), "fetch_version") == "v" * 512


@pytest.mark.parametrize("what", ["fetch_models", "fetch_version"])
@pytest.mark.parametrize("body", [b"[" * 5000, b'{"a":' * 5000, b"[" * 100_000])
def test_json_nested_past_the_decoder_is_an_invalid_response(what: str, body: bytes) -> None:
    """`[[[[...`: the decoder's RecursionError is invalid_response, not a crashed poll."""
    with pytest.raises(SourceError) as caught:
        fetch(answering(200, body), what)
    assert caught.value.reason == "invalid_response"
    assert "nested too deep" in str(caught.value)
