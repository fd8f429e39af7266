"""Specification of the load drivers: the built-in httpx client and vLLM's own client's files."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.errors import UsageError
from exporter.sim import Scenario, SimEngineConfig
from exporter.sweep import drivers
from exporter.sweep.drivers import (
    BENCH_SNIPPET,
    BENCH_START_MARKER,
    TRACE_CHUNK,
    HttpxDriver,
    ResponseBound,
    VllmBenchDriver,
    bench_arguments,
    bounded_lines,
    completion_body,
    prompt_token_ids,
    require_tokenizer,
    response_bytes_limit,
    results_from_bench,
    trace_lines,
)
from exporter.sweep.plan import Load, Mode
from exporter.sweep.shape import RequestShape
from exporter.testing.simload import SimCompletionsServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Sequence

    from exporter.sweep.evaluate import RequestResult

MODEL = "simulated/llama-3.1-8b"
SHAPE = RequestShape(100, 60)


@pytest.fixture(scope="module")
def server() -> Iterator[SimCompletionsServer]:
    """The simulated vLLM over HTTP at 20 times real time (a request takes about 30 ms)."""
    scenario = Scenario(
        engine=SimEngineConfig(
            block_size=16, max_model_len=1024, kv_cache_memory_bytes=129 * 16 * 131_072
        )
    )
    with SimCompletionsServer(scenario, speed=20) as running:
        yield running


def drive(
    url: str,
    load: Load,
    requests: Sequence[RequestShape],
    *,
    offsets: Sequence[float] | None = None,
    seconds: float = 10.0,
    abort_after: float | None = None,
) -> list[RequestResult]:
    """Run one step of the built-in driver and return its results."""

    async def go() -> list[RequestResult]:
        async with httpx.AsyncClient(trust_env=False) as http:
            driver = HttpxDriver(url, MODEL, client=http, clock=time.monotonic)
            await driver.start(load, requests, offsets=offsets)
            abort = asyncio.Event()
            deadline = time.monotonic() + (abort_after if abort_after is not None else seconds)
            while not driver.sending_done and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if abort_after is not None:
                abort.set()
            driver.stop_sending()
            return await driver.finish(drain_s=30.0, abort=abort)

    return asyncio.run(go())


def test_prompts_are_token_ids_distinct_per_request_and_reproducible() -> None:
    """Distinct prompts share no prefix-cache blocks; the same seed gives the same prompt."""
    first = prompt_token_ids(0, 300, seed=1)
    assert len(first) == 300
    assert first == prompt_token_ids(0, 300, seed=1)
    assert first[:16] != prompt_token_ids(1, 300, seed=1)[:16]
    assert all(16 <= t < 256 for t in first)


def test_a_completion_asks_for_exactly_its_output_length() -> None:
    """max_tokens with ignore_eos, streamed with usage so the driver can count tokens."""
    body = completion_body("m", SHAPE, index=0, seed=0)
    assert (body["max_tokens"], body["ignore_eos"], body["stream"]) == (60, True, True)
    assert body["stream_options"] == {"include_usage": True}
    assert len(body["prompt"]) == 100


def test_a_rate_step_sends_every_arrival_and_times_it(server: SimCompletionsServer) -> None:
    """Open loop: one request per offset, first token before the end, every token received."""
    offsets = [0.05 * i for i in range(20)]
    results = drive(server.url, Load(Mode.RATE, 20), [SHAPE] * 20, offsets=offsets)
    assert len(results) == 20
    assert all(r.ok and r.generated_tokens == 60 for r in results)
    for r in results:
        assert r.first_token_s is not None
        assert r.start_s <= r.first_token_s <= r.end_s
    starts = [r.start_s - results[0].start_s for r in results]
    assert starts[-1] == pytest.approx(offsets[-1], abs=0.2)


def test_a_concurrency_step_keeps_that_many_requests_in_flight(
    server: SimCompletionsServer,
) -> None:
    """Closed loop: never more than N requests at once, and N most of the time."""
    results = drive(server.url, Load(Mode.CONCURRENCY, 3), [SHAPE] * 15)
    assert len(results) == 15
    assert all(r.ok for r in results)
    events = sorted([(r.start_s, 1) for r in results] + [(r.end_s, -1) for r in results])
    in_flight = peak = 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    assert peak == 3


def test_an_aborted_step_cancels_requests_in_flight(server: SimCompletionsServer) -> None:
    """Abort closes the connections of requests in flight (vLLM then aborts them)."""
    before = server.disconnected
    long = RequestShape(100, 900)  # about 0.4 s of real time each at speed 20
    results = drive(server.url, Load(Mode.CONCURRENCY, 4), [long] * 8, abort_after=0.15)
    assert [r.error for r in results] == ["cancelled"] * 4
    deadline = time.monotonic() + 5
    while server.disconnected < before + 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.disconnected == before + 4


def test_failed_requests_say_why(server: SimCompletionsServer) -> None:
    """A request the server refuses is a failure with its status, not a crash."""
    too_long = RequestShape(1000, 100)
    (result,) = drive(server.url, Load(Mode.CONCURRENCY, 1), [too_long])
    assert result.error == "http_400"


def test_the_trace_for_vllms_client_holds_each_request_once() -> None:
    """timed_trace lines: arrival, exact lengths, and hash ids of its own (no shared prefix)."""
    lines = [
        json.loads(x) for x in trace_lines([SHAPE, RequestShape(17, 5)], [0.5, 1.25], first_index=3)
    ]
    assert lines[0]["timestamp"] == 0.5
    assert (lines[1]["input_length"], lines[1]["output_length"]) == (17, 5)
    assert len(lines[0]["hash_ids"]) == -(-100 // TRACE_CHUNK)
    assert not set(lines[0]["hash_ids"]) & set(lines[1]["hash_ids"])
    assert {x["timestamp"] for x in map(json.loads, trace_lines([SHAPE], None, first_index=0))} == {
        0.0
    }


def test_vllms_client_is_run_as_its_module_with_a_timed_trace() -> None:
    """The arguments name the trace, the result file and (closed loop) the concurrency."""
    argv = bench_arguments(
        base_url="http://h:1",
        model="m",
        tokenizer="/t",
        dataset=Path("/d.jsonl"),
        count=7,
        result_dir=Path("/r"),
        result_name="s.json",
        concurrency=4,
        seed=0,
    )
    joined = " ".join(argv)
    assert "--dataset-name timed_trace --dataset-path /d.jsonl" in joined
    assert "--num-prompts 7" in joined
    assert "--max-concurrency 4" in joined
    assert "--save-detailed" in argv
    assert "from vllm.benchmarks.serve import add_cli_args, main" in BENCH_SNIPPET


def test_vllms_results_are_placed_on_our_clock() -> None:
    """Its perf_counter times start at our t0; failures and token counts carry over."""
    document = {
        "start_times": [100.0, 100.5],
        "latencies": [1.0, 0.0],
        "ttfts": [0.2, 0.0],
        "output_lens": [60, 0],
        "input_lens": [100, 100],
        "errors": ["", "Connection reset"],
    }
    ok, failed = results_from_bench(document, [SHAPE, SHAPE], t0=10.0)
    assert (ok.start_s, ok.first_token_s, ok.end_s, ok.generated_tokens) == (10.0, 10.2, 11.0, 60)
    assert ok.ok
    assert failed.start_s == 10.5
    assert failed.error == "bench_error"


class EndlessServer:
    """A loopback server that answers every request with an endless body of one kind.

    ``kind``: ``429`` (an error status whose body never ends), ``lines`` (valid SSE data lines
    for ever), ``blank`` (empty lines for ever), ``one_line`` (a line that never ends),
    ``trickle`` (a byte a while, for ever).
    ``sent`` counts the body bytes the client accepted before it hung up.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.sent = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            status = "429 Too Many Requests" if self.kind == "429" else "200 OK"
            conn.sendall(
                f"HTTP/1.1 {status}\r\ncontent-type: text/event-stream\r\n"
                "transfer-encoding: chunked\r\n\r\n".encode()
            )
            piece = {
                "429": b"slow down " * 1000,
                "lines": b'data: {"choices": [{"text": "x"}]}\n\n' * 100,
                "one_line": b"x" * 8192,
                "blank": b"\n" * 8192,
                "trickle": b"\n",
            }[self.kind]
            chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
            try:
                while not self._stop.is_set():
                    conn.sendall(chunk)
                    self.sent += len(piece)
                    if self.kind == "trickle":
                        time.sleep(0.05)
            except OSError:
                return  # the client hung up: what we want

    def __enter__(self) -> EndlessServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=5)


def one_request(url: str, *, timeout_s: float = 30.0) -> tuple[RequestResult, HttpxDriver]:
    """One request of SHAPE through the built-in driver (request timeout ``timeout_s``)."""

    async def go() -> tuple[RequestResult, HttpxDriver]:
        async with httpx.AsyncClient(trust_env=False) as http:
            driver = HttpxDriver(
                url, MODEL, client=http, clock=time.monotonic, request_timeout_s=timeout_s
            )
            await driver.start(Load(Mode.CONCURRENCY, 1), [SHAPE], offsets=None)
            while not driver.sending_done:
                await asyncio.sleep(0.01)
            [result] = await driver.finish(drain_s=timeout_s + 5, abort=asyncio.Event())
            return result, driver

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("429", "http_429"),
        ("lines", "response_too_many_lines"),
        ("blank", "response_too_large"),
        ("one_line", "response_line_too_long"),
    ],
)
def test_an_endless_response_is_cut_at_its_bound_and_counted(kind: str, error: str) -> None:
    """A 429 that never ends, endless lines, an endless line: read up to a bound, then dropped."""
    started = time.monotonic()
    with EndlessServer(kind) as server:
        result, driver = one_request(server.url)
    assert time.monotonic() - started < 10
    assert result.error == error
    # What the server got into the socket: the bound plus the kernel's buffers, not gigabytes.
    assert server.sent < response_bytes_limit(SHAPE.output_tokens) + 16 * 2**20
    if error != "http_429":
        assert driver.cut == {ResponseBound(error): 1}


def test_arrivals_past_the_in_flight_cap_are_returned_as_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An open loop against a target that never finishes: past the cap, arrivals are not sent.

    Each is a result of the step (``not_sent``), so the report says the load was not delivered.
    """
    monkeypatch.setattr(drivers, "MAX_IN_FLIGHT", 2)
    with EndlessServer("trickle") as server:

        async def go() -> list[RequestResult]:
            async with httpx.AsyncClient(trust_env=False) as http:
                driver = HttpxDriver(
                    server.url, MODEL, client=http, clock=time.monotonic, request_timeout_s=30
                )
                await driver.start(
                    Load(Mode.RATE, 50), [SHAPE] * 5, offsets=[0.0, 0.05, 0.1, 0.15, 0.2]
                )
                while not driver.sending_done:
                    await asyncio.sleep(0.02)
                return await driver.finish(drain_s=0.2, abort=asyncio.Event())

        results = asyncio.run(go())
    errors = sorted(str(r.error) for r in results)
    assert errors == ["cancelled", "cancelled", "not_sent", "not_sent", "not_sent"]


def test_vllms_client_loads_only_the_tokenizer_the_operator_named() -> None:
    """The root a target reports is never loaded unasked; the error names it, on one line."""
    assert require_tokenizer("/models/mine", "/models/theirs") == "/models/mine"
    with pytest.raises(UsageError) as refused:
        require_tokenizer(None, "/etc/\nsecret" + "x" * 1000)
    message = str(refused.value)
    assert "--tokenizer" in message
    assert "'/etc/\\nsecret" in message  # quoted: the target's text cannot break the line
    assert "\n" not in message
    assert len(message) < 400
    with pytest.raises(UsageError, match="needs --tokenizer"):
        require_tokenizer(None, None)


def test_a_response_that_trickles_for_ever_ends_at_the_request_timeout() -> None:
    """A byte every 50 ms never trips a per-read timeout: the request's own deadline ends it."""
    started = time.monotonic()
    with EndlessServer("trickle") as server:
        result, _ = one_request(server.url, timeout_s=0.5)
    assert result.error == "timeout"
    assert time.monotonic() - started < 5


def test_bounded_lines_splits_a_stream_into_lines_across_chunks() -> None:
    """Lines come out whole, whatever the chunks, when the stream is within its bounds."""

    async def lines() -> list[str]:
        async def chunks() -> AsyncIterator[bytes]:
            for piece in (b"a\nb", b"c\r\n", b"d"):
                yield piece

        return [line async for line in bounded_lines(chunks(), max_bytes=1024)]

    assert asyncio.run(lines()) == ["a", "bc", "d"]


def test_vllm_clients_output_line_past_the_stream_limit_is_dropped_not_fatal(
    tmp_path: Path,
) -> None:
    """A 200 kB line from vLLM's client (past asyncio's 64 KiB): dropped, later lines still read."""
    script = f"import sys; sys.stdout.write('x' * 200_000 + '\\n{BENCH_START_MARKER}\\n')"

    async def go() -> VllmBenchDriver:
        driver = VllmBenchDriver(
            python=sys.executable,
            base_url="http://127.0.0.1:9",
            model=MODEL,
            tokenizer="t",
            workdir=tmp_path,
            clock=time.monotonic,
        )
        driver._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
        )
        await driver._read_output()
        await driver._proc.wait()
        return driver

    driver = asyncio.run(go())
    assert driver.tail[-1] == BENCH_START_MARKER
    assert set(driver.tail[:-1]) == {"[a line over 64 KiB, dropped]"}
