"""Specification of the fake vLLM: vLLM 0.32's answers, replayed captures, restarts and faults."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.errors import ParseError
from exporter.testing.fakevllm import TEXT, FakeVllm, Fault, TokenTraffic, VllmState, render_metrics
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from exporter.core.snapshot import EngineMetrics

AFTER_LOAD = (paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_bytes()
#: The three paths vLLM answers that the exporter reads.
PATHS = ("/metrics", "/v1/models", "/version")


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    """A fake vLLM on a free loopback port, rendering its default state."""
    with FakeVllm() as server:
        yield server


def get(fake: FakeVllm, path: str, *, timeout: float = 5.0, **headers: str) -> httpx.Response:
    """One GET on the fake's socket, over a connection closed afterwards."""
    with httpx.Client(timeout=timeout) as client:
        return client.get(f"{fake.url}{path}", headers=headers)


def through(fake: FakeVllm, path: str) -> httpx.Response:
    """One GET through the fake's httpx transport, without sockets."""
    with httpx.Client(transport=fake.transport(), timeout=5.0) as client:
        return client.get(f"http://vllm:8000{path}")


def engine_of(payload: bytes) -> EngineMetrics:
    """The single engine of a ``/metrics`` payload."""
    (engine,) = parse_vllm_metrics(payload).engines.values()
    return engine


# --------------------------------------------------------------------------------------------
# vLLM 0.32's answers
# --------------------------------------------------------------------------------------------


def test_metrics_parse_into_one_engine_with_the_states_capacity() -> None:
    """/metrics is vLLM 0.32's text format: one engine, the state's model, blocks and start."""
    state = VllmState(model="m", num_gpu_blocks=100, block_size=16)
    with FakeVllm(state=state) as fake:
        response = get(fake, "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == TEXT
    snapshot = parse_vllm_metrics(response.content)
    (engine,) = snapshot.engines.values()
    assert engine.model_name == "m"
    assert engine.cache_config is not None
    assert (engine.cache_config.num_gpu_blocks, engine.cache_config.block_size) == (100, 16)
    assert engine.cache_config.kv_cache_size_tokens == 1600
    assert snapshot.process_start_time_seconds == state.start_time


def test_models_and_version_answer_as_vllms_openai_server_does() -> None:
    """/v1/models lists the state's model with root and length; /version gives the version."""
    state = VllmState(model="m", root="/models/m", max_model_len=2048, version="0.32.1")
    with FakeVllm(state=state) as fake:
        models, version, other = (get(fake, p) for p in ("/v1/models", "/version", "/nope"))
    assert models.json() == {
        "object": "list",
        "data": [{"id": "m", "object": "model", "root": "/models/m", "max_model_len": 2048}],
    }
    assert version.json() == {"version": "0.32.1"}
    assert other.status_code == 404


def test_counters_advance_on_every_scrape_as_under_traffic(fake: FakeVllm) -> None:
    """Each scrape finishes two more requests of 100 prompt and 380 generated tokens."""
    first, second = (engine_of(get(fake, "/metrics").content) for _ in range(2))
    assert first.requests_finished_total is not None
    assert second.requests_finished_total == first.requests_finished_total + 2
    assert first.prompt_tokens_total is not None
    assert second.prompt_tokens_total == first.prompt_tokens_total + 200
    assert first.generation_tokens_total is not None
    assert second.generation_tokens_total == first.generation_tokens_total + 760
    assert fake.counts.requests["/metrics"] == 2


def test_a_fixed_payload_is_served_verbatim_on_every_scrape() -> None:
    """A bytes payload (here the real 0.32 capture) replaces the rendered /metrics."""
    with FakeVllm(payload=AFTER_LOAD) as fake:
        bodies = [get(fake, "/metrics").content for _ in range(2)]
    assert bodies == [AFTER_LOAD, AFTER_LOAD]


def test_a_replayed_payload_is_chosen_by_the_scrape_number() -> None:
    """A payload function gets the number of /metrics scrapes before; other paths do not count."""
    with FakeVllm(payload=lambda n: f"# scrape {n}\n".encode()) as fake:
        bodies = [get(fake, "/metrics").content]
        get(fake, "/v1/models")
        bodies += [get(fake, "/metrics").content for _ in range(2)]
    assert bodies == [b"# scrape 0\n", b"# scrape 1\n", b"# scrape 2\n"]


def test_restart_changes_the_start_time_and_counters_start_over(fake: FakeVllm) -> None:
    """After restart() the process start time differs and the counters begin again from zero."""
    before = parse_vllm_metrics(get(fake, "/metrics").content)
    fake.restart()
    assert (fake.state.finished, fake.state.preemptions) == (0, 0)
    after = parse_vllm_metrics(get(fake, "/metrics").content)
    assert after.process_start_time_seconds != before.process_start_time_seconds
    assert after.engines["0"].requests_finished_total == 2
    assert before.engines["0"].requests_finished_total is not None
    assert before.engines["0"].requests_finished_total > 2


def test_restart_applies_the_changes_it_is_given(fake: FakeVllm) -> None:
    """A restart may come back with another model, as a redeployed vLLM does."""
    fake.restart(model="other", max_model_len=4096)
    [model] = get(fake, "/v1/models").json()["data"]
    assert (model["id"], model["max_model_len"]) == ("other", 4096)


def test_restart_may_set_the_preemption_count() -> None:
    """restart(preemptions=n) comes back with n preemptions, like any other change."""
    fake = FakeVllm(listen=False)
    fake.restart(preemptions=3)
    assert fake.state.preemptions == 3


def test_a_token_makes_requests_without_the_bearer_header_unauthorized() -> None:
    """With a token, a missing or wrong bearer header is 401 on every path; the right one is not."""
    token = "tok-" + secrets.token_hex(8)
    with FakeVllm(token=token) as fake:
        missing = [get(fake, p).status_code for p in PATHS]
        wrong = [get(fake, p, authorization="Bearer other").status_code for p in PATHS]
        right = [get(fake, p, authorization=f"Bearer {token}").status_code for p in PATHS]
    assert missing == wrong == [401, 401, 401]
    assert right == [200, 200, 200]
    assert fake.counts.authorizations == {"Bearer other", f"Bearer {token}"}


# --------------------------------------------------------------------------------------------
# Faults over real sockets
# --------------------------------------------------------------------------------------------


def test_refuse_refuses_connections_until_the_fault_is_cleared(fake: FakeVllm) -> None:
    """REFUSE closes the listening socket; Fault.NONE listens again on the same port."""
    fake.set_fault(Fault.REFUSE)
    assert fake.fault is Fault.REFUSE
    with pytest.raises(httpx.ConnectError):
        get(fake, "/metrics")
    fake.set_fault(Fault.NONE)
    assert get(fake, "/metrics").status_code == 200


def test_hang_accepts_and_never_answers_until_the_fault_is_cleared(fake: FakeVllm) -> None:
    """HANG reads the request and sends nothing: the client times out; Fault.NONE answers."""
    fake.set_fault(Fault.HANG)
    with pytest.raises(httpx.ReadTimeout):
        get(fake, "/metrics", timeout=0.2)
    fake.set_fault(Fault.NONE)
    assert get(fake, "/metrics").status_code == 200


def test_http_500_answers_500_on_every_path(fake: FakeVllm) -> None:
    """HTTP_500 fails /metrics, /v1/models and /version alike."""
    fake.set_fault(Fault.HTTP_500)
    assert [get(fake, p).status_code for p in PATHS] == [500, 500, 500]


@pytest.mark.parametrize(
    ("fault", "content_type", "start"),
    [
        (Fault.HTML, "text/html", b"<!DOCTYPE html>"),
        (Fault.JSON, "application/json", b"{"),
        (Fault.GARBAGE, TEXT, bytes(range(16))),
    ],
)
def test_wrong_bodies_come_with_200_and_their_declared_type(
    fake: FakeVllm, fault: Fault, content_type: str, start: bytes
) -> None:
    """HTML (a login page), JSON and GARBAGE answer /metrics 200 with a body that is no metrics."""
    fake.set_fault(fault)
    response = get(fake, "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert response.content.startswith(start)


def test_malformed_metrics_make_the_parser_raise(fake: FakeVllm) -> None:
    """MALFORMED appends a broken vllm:num_requests_running line: ParseError names it."""
    fake.set_fault(Fault.MALFORMED)
    response = get(fake, "/metrics")
    assert response.status_code == 200
    with pytest.raises(ParseError, match="vllm:num_requests_running"):
        parse_vllm_metrics(response.content)


def test_truncated_closes_the_connection_before_the_declared_length(fake: FakeVllm) -> None:
    """TRUNCATED sends half the body it declares, then closes: the client sees a protocol error."""
    fake.set_fault(Fault.TRUNCATED)
    with pytest.raises(httpx.RemoteProtocolError):
        get(fake, "/metrics")
    fake.set_fault(Fault.NONE)
    assert get(fake, "/metrics").status_code == 200


def test_slow_sends_metrics_a_byte_at_a_time(fake: FakeVllm) -> None:
    """SLOW declares the whole body but sends so slowly that 0.3 s brings a tenth of it at most."""
    fake.set_fault(Fault.SLOW)
    received = 0
    with (
        httpx.Client(timeout=5.0) as client,
        client.stream("GET", f"{fake.url}/metrics") as response,
    ):
        declared = int(response.headers["content-length"])
        deadline = time.monotonic() + 0.3
        for chunk in response.iter_raw():
            received += len(chunk)
            if time.monotonic() > deadline:
                break
        fake.set_fault(Fault.NONE)  # the server stops dribbling and drops the connection
    assert 0 < received < declared / 10


def test_models_down_fails_models_and_version_but_not_metrics(fake: FakeVllm) -> None:
    """MODELS_DOWN answers 503 on /v1/models and /version while /metrics still parses."""
    fake.set_fault(Fault.MODELS_DOWN)
    metrics, models, version = (get(fake, p) for p in PATHS)
    assert (metrics.status_code, models.status_code, version.status_code) == (200, 503, 503)
    assert engine_of(metrics.content).model_name == "tiny"


# --------------------------------------------------------------------------------------------
# The httpx transport
# --------------------------------------------------------------------------------------------


def test_the_transport_answers_without_opening_a_socket() -> None:
    """FakeVllm(listen=False) has no port, and its transport serves vLLM's three paths."""
    fake = FakeVllm(state=VllmState(num_gpu_blocks=100, block_size=16), listen=False)
    assert fake.port == 0
    metrics, models, version = (through(fake, p) for p in PATHS)
    cache = engine_of(metrics.content).cache_config
    assert cache is not None
    assert cache.kv_cache_size_tokens == 1600
    assert models.json()["data"][0]["id"] == "tiny"
    assert version.json() == {"version": "0.32.0"}


@pytest.mark.parametrize(
    "fault",
    [
        Fault.NONE,
        Fault.HTTP_500,
        Fault.HTML,
        Fault.JSON,
        Fault.MALFORMED,
        Fault.GARBAGE,
        Fault.MODELS_DOWN,
    ],
)
def test_the_transport_answers_http_level_faults_as_the_socket_does(fault: Fault) -> None:
    """Per path, the transport gives the socket server's status and kind of body (first byte)."""

    def answers(get_path: Callable[[str], httpx.Response]) -> list[tuple[int, bytes]]:
        return [(r.status_code, r.content[:1]) for r in map(get_path, PATHS)]

    with FakeVllm() as served:
        served.set_fault(fault)
        over_sockets = answers(lambda path: get(served, path))
    direct = FakeVllm(listen=False)
    direct.set_fault(fault)
    assert answers(lambda path: through(direct, path)) == over_sockets


def test_malformed_metrics_through_the_transport_make_the_parser_raise() -> None:
    """The transport's MALFORMED payload carries the same broken line as the socket's."""
    fake = FakeVllm(listen=False)
    fake.set_fault(Fault.MALFORMED)
    with pytest.raises(ParseError, match="vllm:num_requests_running"):
        parse_vllm_metrics(through(fake, "/metrics").content)


def test_the_transports_login_page_is_declared_html() -> None:
    """HTML through the transport is declared text/html, as the socket server declares it."""
    fake = FakeVllm(listen=False)
    fake.set_fault(Fault.HTML)
    assert through(fake, "/metrics").headers["content-type"] == "text/html"


@pytest.mark.parametrize(
    ("fault", "error"), [(Fault.REFUSE, httpx.ConnectError), (Fault.HANG, httpx.ReadTimeout)]
)
def test_the_transport_raises_what_a_client_meets_when_vllm_is_down_or_hangs(
    fault: Fault, error: type[httpx.HTTPError]
) -> None:
    """REFUSE raises a connection error and HANG a read timeout, at once, without waiting."""
    fake = FakeVllm(listen=False)
    fake.set_fault(fault)
    with pytest.raises(error):
        through(fake, "/metrics")


def test_token_traffic_replaces_a_payloads_token_histograms_with_its_requests() -> None:
    """Requests added to TokenTraffic parse back as vLLM's two histograms, "<= le" buckets."""
    traffic = TokenTraffic((10.0, 100.0, 1000.0))
    for prompt, output in ((10, 11), (100, 5), (5000, 1000)):
        traffic.add(prompt, output)
    for payload in (
        render_metrics(VllmState()).decode(),
        (paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text(),
    ):
        (engine,) = parse_vllm_metrics(traffic.replacing(payload)).engines.values()
        assert engine.prompt_tokens is not None
        assert engine.generation_tokens is not None
        assert engine.prompt_tokens.cumulative == (1.0, 2.0, 2.0, 3.0)
        assert engine.prompt_tokens.sum == 5110
        assert engine.generation_tokens.cumulative == (1.0, 2.0, 3.0, 3.0)
        assert engine.generation_tokens.sum == 1016
