"""The simulated vLLM HTTP server: endpoints shaped like vLLM's, real-time stepping, lifecycle."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.errors import UsageError
from exporter.sim.engine import Simulation
from exporter.sim.scenario import default_scenario
from exporter.sim.server import SIM_VERSION, SimServer, SimServerError

if TYPE_CHECKING:
    from collections.abc import Iterator


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class BrokenSimulation(Simulation):
    """A simulation whose stepping fails, as a bug would."""

    def advance_to(self, t: float) -> None:
        raise RuntimeError("boom")


@pytest.fixture
def server() -> Iterator[SimServer]:
    """A started server on a free loopback port, stepped by hand (its thread barely ticks)."""
    sim = Simulation(default_scenario(), seed=0)
    sim.advance_to(120.0)
    srv = SimServer(sim, tick_s=3600.0, wall_clock=lambda: 1_800_000_000.0)
    srv.start("127.0.0.1", 0)
    try:
        yield srv
    finally:
        srv.stop()


def test_metrics_endpoint_serves_the_vllm_exposition(server: SimServer) -> None:
    """GET /metrics returns the text format with the simulated engine's vLLM families."""
    response = httpx.get(server.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    fams = {f.name: f for f in text_string_to_metric_families(response.text)}
    (running,) = fams["vllm:num_requests_running"].samples
    assert running.labels == {"engine": "0", "model_name": "simulated/llama-3.1-8b"}
    assert running.value == server.simulation.metrics().num_requests_running
    assert fams["process_start_time_seconds"].samples[0].value == 1_800_000_000.0


def test_models_endpoint_has_vllm_shape_and_says_simulation(server: SimServer) -> None:
    """GET /v1/models lists the simulated model with vLLM's fields and its config directory."""
    body = httpx.get(server.url + "/v1/models").json()
    assert body["object"] == "list"
    (model,) = body["data"]
    assert set(model) == {
        "id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission",
    }  # fmt: skip
    assert model["id"] == "simulated/llama-3.1-8b"
    assert "simulation" in model["owned_by"]
    assert model["max_model_len"] == default_scenario().engine.max_model_len
    assert model["created"] == 1_800_000_000
    assert (Path(model["root"]) / "config.json").is_file()
    assert model["permission"][0]["object"] == "model_permission"


def test_version_says_simulation(server: SimServer) -> None:
    """GET /version reports vLLM 0.32.0 with a +sim local tag."""
    assert httpx.get(server.url + "/version").json() == {"version": SIM_VERSION}
    assert SIM_VERSION == "0.32.0+sim"


def test_health_is_ok_while_running(server: SimServer) -> None:
    """GET /health answers 200 with an empty body, as vLLM does."""
    response = httpx.get(server.url + "/health")
    assert (response.status_code, response.content) == (200, b"")


def test_unknown_paths_and_posts_are_not_found(server: SimServer) -> None:
    """Unknown paths get FastAPI's 404 body; POSTs (no inference here) get a 404 too."""
    response = httpx.get(server.url + "/nope")
    assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})
    assert httpx.post(server.url + "/v1/completions", json={}).status_code == 404
    assert httpx.get(server.url + "/metrics?name=x").status_code == 200


def test_pump_advances_by_elapsed_clock_time_times_speed() -> None:
    """Each pump runs the simulation forward by the clock's elapsed time times the speed."""
    clock = FakeClock()
    srv = SimServer(Simulation(default_scenario(), seed=0), speed=2.0, clock=clock)
    clock.now += 2.0
    srv.pump()
    assert srv.simulation.now >= 4.0
    assert srv.simulation.now < 4.5  # within one engine step of the target
    assert srv.simulation.metrics().generation_tokens > 0


def test_the_served_figures_carry_the_simulated_time_they_were_taken_at() -> None:
    """simulated_seconds is the last pump's time, behind the wall clock after a capped stall."""
    clock = FakeClock()
    srv = SimServer(
        Simulation(default_scenario(), seed=0), speed=2.0, max_catch_up_s=1.5, clock=clock
    )
    assert srv.simulated_seconds == 0.0
    clock.now += 1.0
    srv.pump()
    assert srv.simulated_seconds == srv.simulation.now
    assert 2.0 <= srv.simulated_seconds < 2.5
    clock.now += 60.0  # a stall: the wall clock says 122 simulated seconds, the figures 5
    srv.pump()
    assert 5.0 <= srv.simulated_seconds < 5.5


def test_pump_caps_the_catch_up_after_a_stall() -> None:
    """After a long stall only max_catch_up_s of it is made up (times speed), not hours at once."""
    clock = FakeClock()
    srv = SimServer(
        Simulation(default_scenario(), seed=0), speed=2.0, max_catch_up_s=1.5, clock=clock
    )
    clock.now += 3600.0
    srv.pump()
    assert 3.0 <= srv.simulation.now < 3.5
    clock.now -= 10.0  # a clock going backwards moves nothing
    srv.pump()
    assert srv.simulation.now < 3.5


def test_background_thread_steps_in_real_time() -> None:
    """Once started, the stepping thread advances the simulation without being asked."""
    with SimServer(Simulation(default_scenario(), seed=0), speed=10.0, tick_s=0.01) as srv:
        srv.start()
        for _ in range(3):
            srv.ticked.clear()
            assert srv.ticked.wait(timeout=5.0)
        assert srv.simulation.now > 0.0
        assert srv.failure is None


def test_health_turns_503_when_the_simulation_fails() -> None:
    """If the stepping thread dies, /health says so instead of serving stale data silently."""
    with SimServer(BrokenSimulation(default_scenario()), tick_s=0.01) as srv:
        srv.start()
        assert srv.ticked.wait(timeout=5.0)
        response = httpx.get(srv.url + "/health")
        assert response.status_code == 503
        assert "boom" in response.json()["error"]
        assert httpx.get(srv.url + "/metrics").status_code == 200


def test_stop_releases_the_port_and_can_be_repeated() -> None:
    """After stop() nothing listens on the port any more; stopping twice is harmless."""
    srv = SimServer(Simulation(default_scenario()), tick_s=3600.0)
    url = srv.start()
    port = int(url.rsplit(":", 1)[1])
    srv.stop()
    srv.stop()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 1):
        pass
    with pytest.raises(SimServerError, match="not running"):
        _ = srv.url


def test_busy_port_is_a_usage_error() -> None:
    """A port already in use gives a one-line UsageError naming it, not a traceback."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        srv = SimServer(Simulation(default_scenario()))
        with pytest.raises(UsageError, match=f"127.0.0.1:{port}"):
            srv.start("127.0.0.1", port)


@pytest.mark.parametrize("speed", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_speed_is_a_usage_error(speed: float) -> None:
    """Speed must be a positive finite number."""
    with pytest.raises(SimServerError, match="speed"):
        SimServer(Simulation(default_scenario()), speed=speed)


def test_concurrent_scrapes_while_stepping_all_succeed() -> None:
    """Scrapes from several clients while the thread steps all get a complete payload."""
    import concurrent.futures

    with SimServer(Simulation(default_scenario(), seed=1), speed=50.0, tick_s=0.01) as srv:
        srv.start()

        def scrape(_: int) -> int:
            response = httpx.get(srv.url + "/metrics")
            assert response.text.rstrip().endswith(" 1.0")  # cache_config_info comes last
            return response.status_code

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert set(pool.map(scrape, range(16))) == {200}
        assert srv.failure is None
