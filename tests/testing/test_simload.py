"""Specification of the simulated vLLM under load: pushed arrivals, tracking and completions."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.sim import Scenario, SimEngineConfig
from exporter.sim.traffic import Arrival
from exporter.testing.simload import PushArrivals, SimCompletionsServer, SimTracker

if TYPE_CHECKING:
    from collections.abc import Iterator

MODEL = "simulated/llama-3.1-8b"


def small() -> Scenario:
    """A small pool (128 usable blocks of 16 tokens) so the tests exercise its limits."""
    return Scenario(
        engine=SimEngineConfig(
            block_size=16, max_model_len=1024, kv_cache_memory_bytes=129 * 16 * 131_072
        )
    )


def test_pushed_arrivals_come_out_in_time_order_and_know_their_engine_id() -> None:
    """The engine numbers requests in the order it takes them; the stream remembers which."""
    stream = PushArrivals()
    late = stream.push(Arrival(2.0, 10, 10, 10, "length"))
    early = stream.push(Arrival(1.0, 10, 10, 10, "length"))
    dropped = stream.push(Arrival(3.0, 10, 10, 10, "length"))
    assert stream.withdraw(dropped)
    assert stream.next_time == 1.0
    assert [a.time for a in stream.pop_due(5.0)] == [1.0, 2.0]
    assert (stream.request_id(early), stream.request_id(late)) == (0, 1)
    assert not stream.withdraw(early)
    assert stream.next_time == float("inf")


def test_the_tracker_follows_a_request_through_the_engine() -> None:
    """Tokens appear after the prompt is computed; the request ends with all its tokens."""
    tracker = SimTracker(small())
    handle = tracker.submit(100, 50, at=0.0)
    tracker.simulation.advance_to(0.05)
    tracker.update()
    partial = tracker.progress(handle)
    assert 0 < partial.generated < 50
    assert partial.first_token_s is not None
    assert not partial.finished
    tracker.simulation.advance_to(5.0)
    tracker.update()
    done = tracker.progress(handle)
    assert done.finished
    assert done.generated == 50
    assert not tracker.busy


@pytest.fixture(scope="module")
def server() -> Iterator[SimCompletionsServer]:
    """The simulated vLLM over HTTP at 20 times real time."""
    with SimCompletionsServer(small(), speed=20) as running:
        yield running


def test_a_streamed_completion_ends_with_usage_and_done(server: SimCompletionsServer) -> None:
    """Chunks per token, then the usage chunk vLLM sends with include_usage, then [DONE]."""
    body = {
        "model": MODEL,
        "prompt": list(range(16, 116)),
        "max_tokens": 20,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(trust_env=False, timeout=30) as client:
        response = client.post(f"{server.url}/v1/completions", json=body)
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage == {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    tokens = [json.loads(e) for e in events[:-2] if json.loads(e)["choices"][0]["text"]]
    assert len(tokens) == 20


def test_a_plain_completion_and_the_metrics_answer_like_vllm(server: SimCompletionsServer) -> None:
    """Without streaming, one JSON answer; /metrics counts the finished request."""
    with httpx.Client(trust_env=False, timeout=30) as client:
        answer = client.post(
            f"{server.url}/v1/completions",
            json={"model": MODEL, "prompt": "a b c", "max_tokens": 5},
        )
        metrics = client.get(f"{server.url}/metrics").text
    assert answer.json()["usage"]["completion_tokens"] == 5
    assert "vllm:request_success_total" in metrics


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "other", "prompt": [1], "max_tokens": 5}, 404),
        ({"model": MODEL, "prompt": [1] * 1000, "max_tokens": 100}, 400),
        ({"model": MODEL, "prompt": {"a": 1}, "max_tokens": 5}, 400),
    ],
)
def test_requests_vllm_would_refuse_are_refused(
    server: SimCompletionsServer, body: dict[str, object], status: int
) -> None:
    """An unknown model, a request past max_model_len or an odd prompt get vLLM's statuses."""
    with httpx.Client(trust_env=False, timeout=30) as client:
        assert client.post(f"{server.url}/v1/completions", json=body).status_code == status
