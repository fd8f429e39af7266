"""One fake vLLM for tests, benchmarks and scripts: real sockets, or an httpx transport.

:class:`FakeVllm` answers ``/metrics``, ``/v1/models`` and ``/version`` like vLLM 0.32. By
default its ``/metrics`` is rendered from a :class:`VllmState` whose counters advance on every
scrape, as under traffic; a ``payload`` (fixed bytes, or a function of the scrape number) serves
real captures instead. A test can switch it to a :class:`Fault`: it is a raw socket server, not
``http.server``, so it can misbehave at the byte level (stop listening, accept and never answer,
answer one byte at a time, declare more than it sends, stream a 200 MB body generated on the fly,
never held in memory). :meth:`FakeVllm.transport` answers the same way through
``httpx.MockTransport``, for tests that drive a poller without sockets. :class:`TokenTraffic`
grows a payload's per-request token histograms, for payloads under traffic of a given shape.

The non-vLLM lines that open every rendered payload (``python_*``, ``process_*``) are copied
from a real vLLM 0.32.0 capture (``tests/fixtures/vllm-metrics/vllm-0.32.0-cpu-after-load.prom``).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import re
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

import httpx

from exporter.vllm.families import family, named

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

#: What the HUGE fault streams: 200 MB (decimal, as the issue says).
HUGE_BYTES = 200_000_000
#: Chunks of streamed bodies.
CHUNK_BYTES = 64 * 1024


class Fault(StrEnum):
    """What the fake vLLM does wrong (``NONE``: nothing)."""

    NONE = "none"
    #: Nothing listens on the port: connections are refused.
    REFUSE = "refuse"
    #: Accepts and reads the request, then never answers (every path).
    HANG = "hang"
    #: Answers /metrics one byte at a time, a few milliseconds apart.
    SLOW = "slow"
    #: HTTP 500 on every path.
    HTTP_500 = "http_500"
    #: A login page (text/html) instead of metrics.
    HTML = "html"
    #: A JSON document instead of metrics.
    JSON = "json"
    #: Content-Length promises the whole payload; half is sent, then the connection closes.
    TRUNCATED = "truncated"
    #: A broken line in a family the sidecar reads.
    MALFORMED = "malformed"
    #: Binary noise declared as text/plain.
    GARBAGE = "garbage"
    #: 200 MB of metric lines, chunked, generated while sending.
    HUGE = "huge"
    #: 200 MB of metric lines gzip-compressed to a few hundred KB (Content-Encoding: gzip).
    GZIP_BOMB = "gzip_bomb"
    #: 2,000 engines of about 34 series each (68,000 series, 5.5 MB): a label explosion.
    EXPLOSION = "explosion"
    #: /v1/models answers 503 (and /version too) while /metrics is fine.
    MODELS_DOWN = "models_down"


@dataclass(frozen=True, slots=True)
class VllmState:
    """What the fake vLLM reports: its model, cache configuration and traffic counters."""

    model: str = "tiny"
    root: str = "/models/tiny"
    max_model_len: int = 512
    version: str = "0.32.0"
    start_time: float = 1_795_952_129.62
    num_gpu_blocks: int = 8
    block_size: int = 128
    gpu_memory_utilization: float = 0.92
    #: Requests finished since start (each: 100 prompt tokens, 380 generated).
    finished: int = 12
    preemptions: int = 15
    running: int = 2
    waiting: int = 0
    engines: int = 1

    @property
    def kv_cache_size_tokens(self) -> int:
        """Capacity as vLLM 0.32 reports it for a full-attention model."""
        return self.num_gpu_blocks * self.block_size

    def advanced(self) -> VllmState:
        """The state one scrape later: two more requests finished, a preemption every third."""
        return replace(
            self,
            finished=self.finished + 2,
            preemptions=self.preemptions + (1 if self.finished % 3 == 0 else 0),
        )


_PREAMBLE = (
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    'python_gc_objects_collected_total{generation="0"} 14844.0\n'
    'python_gc_objects_collected_total{generation="1"} 1913.0\n'
    'python_gc_objects_collected_total{generation="2"} 603.0\n'
    "# HELP python_gc_objects_uncollectable_total Uncollectable objects found during GC\n"
    "# TYPE python_gc_objects_uncollectable_total counter\n"
    'python_gc_objects_uncollectable_total{generation="0"} 0.0\n'
    'python_gc_objects_uncollectable_total{generation="1"} 0.0\n'
    'python_gc_objects_uncollectable_total{generation="2"} 0.0\n'
    "# HELP python_gc_collections_total Number of times this generation was collected\n"
    "# TYPE python_gc_collections_total counter\n"
    'python_gc_collections_total{generation="0"} 1531.0\n'
    'python_gc_collections_total{generation="1"} 139.0\n'
    'python_gc_collections_total{generation="2"} 10.0\n'
    "# HELP python_info Python platform information\n"
    "# TYPE python_info gauge\n"
    'python_info{implementation="CPython",major="3",minor="11",patchlevel="7",'
    'version="3.11.7"} 1.0\n'
    "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
    "# TYPE process_virtual_memory_bytes gauge\n"
    "process_virtual_memory_bytes 2.199523328e+09\n"
    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    "# TYPE process_resident_memory_bytes gauge\n"
    "process_resident_memory_bytes 6.37792256e+08\n"
    "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
    "# TYPE process_cpu_seconds_total counter\n"
    "process_cpu_seconds_total 10.9\n"
    "# HELP process_open_fds Number of open file descriptors.\n"
    "# TYPE process_open_fds gauge\n"
    "process_open_fds 34.0\n"
    "# HELP process_max_fds Maximum number of open file descriptors.\n"
    "# TYPE process_max_fds gauge\n"
    "process_max_fds 20000.0\n"
)

_PROMPT_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500)

# The families rendered, spelled by the table of vLLM's families (exporter.vllm.families).
_RUNNING = named("num_requests_running")
_WAITING = named("num_requests_waiting")
_USAGE = named("kv_cache_usage_perc")
_PREEMPTIONS = family(named("num_preemptions")).type_name
_PROMPT_TOTAL = family(named("prompt_tokens")).type_name
_GENERATION_TOTAL = family(named("generation_tokens")).type_name
_SUCCESS = family(named("request_success")).type_name
_CACHE_CONFIG = named("cache_config_info")
#: The per-request token histograms, by side.
_TOKEN_FAMILIES = {
    "prompt": named("request_prompt_tokens"),
    "generation": named("request_generation_tokens"),
}


def _histogram(name: str, labels: str, bounds: tuple[int, ...], value: int, count: int) -> str:
    lines = [f"# TYPE {name} histogram"]
    for bound in bounds:
        cumulative = count if value <= bound else 0
        lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(cumulative)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(count)}')
    lines.append(f"{name}_count{{{labels}}} {float(count)}")
    lines.append(f"{name}_sum{{{labels}}} {float(count * value)}")
    return "\n".join(lines) + "\n"


def _engine_lines(state: VllmState, engine: int) -> str:
    labels = f'engine="{engine}",model_name="{state.model}"'
    out = [
        f"{_RUNNING}{{{labels}}} {float(state.running)}",
        f"{_WAITING}{{{labels}}} {float(state.waiting)}",
        f"{_USAGE}{{{labels}}} 0.25",
        f"{_PREEMPTIONS}{{{labels}}} {float(state.preemptions)}",
        f"{_PROMPT_TOTAL}{{{labels}}} {float(state.finished * 100)}",
        f"{_GENERATION_TOTAL}{{{labels}}} {float(state.finished * 380)}",
        f'{_SUCCESS}{{engine="{engine}",finished_reason="length",'
        f'model_name="{state.model}"}} {float(state.finished)}',
    ]
    text = "\n".join(out) + "\n"
    for family_name, value in zip(_TOKEN_FAMILIES.values(), (100, 380), strict=True):
        text += _histogram(family_name, labels, _PROMPT_BOUNDS, value, state.finished)
    concurrency = state.kv_cache_size_tokens / state.max_model_len
    text += (
        f'{_CACHE_CONFIG}{{block_size="{state.block_size}",cache_dtype="auto",'
        f'enable_prefix_caching="True",engine="{engine}",'
        f'gpu_memory_utilization="{state.gpu_memory_utilization}",'
        f'kv_cache_max_concurrency="{concurrency}",kv_cache_memory_bytes="None",'
        f'kv_cache_size_tokens="{state.kv_cache_size_tokens}",'
        f'num_gpu_blocks="{state.num_gpu_blocks}",sliding_window="None"}} 1.0\n'
    )
    return text


def render_metrics(state: VllmState) -> bytes:
    """A vLLM 0.32-shaped ``/metrics`` payload for ``state`` (pure)."""
    parts = [_PREAMBLE, f"process_start_time_seconds {state.start_time}\n"]
    parts.extend(_engine_lines(state, engine) for engine in range(state.engines))
    return "".join(parts).encode()


#: A payload's two per-request token histograms (with or without their HELP line).
_TOKEN_NAMES = "|".join(map(re.escape, _TOKEN_FAMILIES.values()))
_TOKEN_HISTOGRAMS = re.compile(
    rf"(?:# HELP (?:{_TOKEN_NAMES}) .*\n)?"
    rf"# TYPE ({_TOKEN_NAMES}) histogram\n(?:\1_\w+\{{.*\n)+"
)


@dataclass
class TokenTraffic:
    """Per-request prompt and output token histograms that grow as requests finish.

    For payloads under traffic (tests, benchmarks): :meth:`add` finishes a request,
    :meth:`replacing` puts the two histograms, as they stand, into a ``/metrics`` payload.
    """

    #: Finite bucket bounds, in order (``+Inf`` is added).
    bounds: tuple[float, ...]
    labels: str = 'engine="0",model_name="tiny"'
    counts: dict[str, list[int]] = field(init=False)
    sums: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.counts = {side: [0] * (len(self.bounds) + 1) for side in ("prompt", "generation")}
        self.sums = dict.fromkeys(self.counts, 0)

    def add(self, prompt: int, output: int) -> None:
        """One more request finished, of ``prompt`` and ``output`` tokens."""
        for side, tokens in (("prompt", prompt), ("generation", output)):
            self.counts[side][bisect.bisect_left(self.bounds, tokens)] += 1  # "<= le"
            self.sums[side] += tokens

    def render(self) -> str:
        """Both histograms in the text format."""
        text = ""
        for side, counts in self.counts.items():
            family, labels = _TOKEN_FAMILIES[side], self.labels
            cumulative = list(itertools.accumulate(counts))
            lines = [f"# TYPE {family} histogram"]
            lines += [
                f'{family}_bucket{{{labels},le="{float(bound)}"}} {total}'
                for bound, total in zip(self.bounds, cumulative, strict=False)
            ]
            lines.append(f'{family}_bucket{{{labels},le="+Inf"}} {cumulative[-1]}')
            lines.append(f"{family}_count{{{labels}}} {cumulative[-1]}")
            lines.append(f"{family}_sum{{{labels}}} {self.sums[side]}")
            text += "\n".join(lines) + "\n"
        return text

    def replacing(self, payload: str) -> bytes:
        """``payload`` with its token histograms replaced by these."""
        return (_TOKEN_HISTOGRAMS.sub("", payload) + self.render()).encode()


def render_models(state: VllmState) -> bytes:
    """vLLM's ``/v1/models`` answer for ``state``."""
    model = {
        "id": state.model,
        "object": "model",
        "root": state.root,
        "max_model_len": state.max_model_len,
    }
    return json.dumps({"object": "list", "data": [model]}).encode()


def _filler_block() -> bytes:
    line = named("lora_requests_info").encode() + (
        b'{max_lora="8",running_lora_adapters="adapter"} 1.0\n'
    )
    return line * (CHUNK_BYTES // len(line))


def stream_lines(total: int) -> Iterator[bytes]:
    """``total`` bytes (rounded to whole chunks) of metric lines, generated chunk by chunk."""
    block = _filler_block()
    sent = 0
    while sent < total:
        yield block
        sent += len(block)


def gzip_bomb(total: int = HUGE_BYTES) -> bytes:
    """``total`` bytes of metric lines, gzip-compressed (computed once per process)."""
    cached = _BOMBS.get(total)
    if cached is None:
        # Level 1: 0.4 s for 200 MB here, still 147:1 (level 9 is 2x smaller and 3x slower).
        compressor = zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: the gzip container
        pieces = [compressor.compress(chunk) for chunk in stream_lines(total)]
        pieces.append(compressor.flush())
        cached = _BOMBS[total] = b"".join(pieces)
    return cached


_BOMBS: dict[int, bytes] = {}


@dataclass(slots=True)
class Counts:
    """What the fake vLLM saw: requests per path, bytes of /metrics bodies sent, connections."""

    requests: dict[str, int]
    metrics_body_bytes: int = 0
    authorizations: set[str] | None = None
    #: Connections accepted (a client that keeps one alive makes one for many requests).
    connections: int = 0


class FakeVllm:
    """The fake vLLM server: ``url``, ``state`` (mutable), ``set_fault()``, ``close()``.

    ``payload`` replaces the rendered ``/metrics``: bytes, or a function of the number of
    ``/metrics`` requests received before (a replay of captures). ``host`` may be ``0.0.0.0``
    to answer on every loopback address (:meth:`url_for` names one of them). With
    ``listen=False`` no socket is opened: only :meth:`transport` answers.
    """

    def __init__(
        self,
        *,
        state: VllmState | None = None,
        token: str | None = None,
        host: str = "127.0.0.1",
        payload: bytes | Callable[[int], bytes] | None = None,
        listen: bool = True,
    ) -> None:
        self.state = state or VllmState()
        #: Replaces the rendered ``/metrics`` (see the class docstring).
        self.payload = payload
        #: When set, requests without ``Authorization: Bearer <token>`` get 401.
        self.token = token
        self.counts = Counts(requests={}, authorizations=set())
        self._fault = Fault.NONE
        self._cond = threading.Condition()
        self._closing = False
        self.host = host
        self._handlers: set[threading.Thread] = set()
        self._connections: set[socket.socket] = set()
        self._rendered: tuple[VllmState, bytes] | None = None
        self._sock: socket.socket | None = None
        self.port = 0
        self._thread: threading.Thread | None = None
        if listen:  # without: only :meth:`transport` answers
            self._sock = self._bind(host, 0)
            self.port = int(self._sock.getsockname()[1])
            self._thread = threading.Thread(target=self._accept_loop, name="fake-vllm", daemon=True)
            self._thread.start()

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return self.url_for("127.0.0.1" if self.host == "0.0.0.0" else self.host)  # noqa: S104

    def url_for(self, address: str) -> str:
        """Base URL of the server on ``address`` (one of the addresses it listens on)."""
        return f"http://{address}:{self.port}"

    def transport(self) -> httpx.MockTransport:
        """The same answers through ``httpx.MockTransport``, without sockets.

        Faults at the HTTP level apply (``REFUSE`` raises a connection error, ``HANG`` a
        timeout, ``HUGE`` streams its 200 MB); those that need a socket (``SLOW``,
        ``TRUNCATED``) answer normally.
        """
        return httpx.MockTransport(self._handle)

    @property
    def fault(self) -> Fault:
        """The fault in force."""
        return self._fault

    def set_fault(self, fault: Fault) -> None:
        """Switch to ``fault``; returns once the listening socket matches it."""
        with self._cond:
            self._fault = fault
            self._cond.notify_all()
        if self._thread is None:
            return  # no socket to switch
        want = fault is not Fault.REFUSE
        deadline = time.monotonic() + 5
        while (self._sock is not None) != want and time.monotonic() < deadline:
            time.sleep(0.005)
        if (self._sock is not None) != want:
            msg = f"the fake vLLM did not switch its listening socket for {fault}"
            raise RuntimeError(msg)

    def restart(self, **changes: object) -> None:
        """A vLLM restart: a new process start time, counters from zero, ``changes`` applied."""
        fresh: dict[str, object] = {
            "start_time": self.state.start_time + 1000.0,
            "finished": 0,
            "preemptions": 0,
        }
        self.state = replace(self.state, **{**fresh, **changes})  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop accepting, end every connection's thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        # Kept-alive connections wait for their next request: end them now.
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5)
        for thread in list(self._handlers):
            thread.join(5)

    def __enter__(self) -> FakeVllm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sockets ----------------------------------------------------------------------------

    def _bind(self, host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.settimeout(0.02)
        return sock

    def _accept_loop(self) -> None:
        while not self._closing:
            if self._fault is Fault.REFUSE and self._sock is not None:
                # A dead vLLM: nothing listens, and established connections are reset.
                self._sock.close()
                self._sock = None
                for conn in list(self._connections):
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
            elif self._fault is not Fault.REFUSE and self._sock is None:
                self._sock = self._bind(self.host, self.port)
            if self._sock is None:
                time.sleep(0.005)
                continue
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._handlers.add(thread)
            thread.start()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @property
    def open_connections(self) -> int:
        """Connections open now (a kept-alive one waits for its next request)."""
        return len(self._connections)

    def _serve(self, conn: socket.socket) -> None:
        self._connections.add(conn)
        self.counts.connections += 1
        try:
            conn.settimeout(30)
            reader = conn.makefile("rb")
            while not self._closing:
                head = _read_head(reader)
                if head is None:
                    break
                path, headers = head
                if not self._answer(conn, path, headers):
                    break
        except OSError:
            pass  # the client went away: nothing to answer
        finally:
            self._connections.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()
            self._handlers.discard(threading.current_thread())

    def _wait_while(self, fault: Fault, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._closing or self._fault is not fault, seconds)

    # -- answers ----------------------------------------------------------------------------

    def _answer(self, conn: socket.socket, path: str, headers: dict[str, str]) -> bool:
        """Answer one request; return whether the connection may carry another."""
        fault = self._fault
        self.counts.requests[path] = self.counts.requests.get(path, 0) + 1
        auth = headers.get("authorization")
        if auth is not None and self.counts.authorizations is not None:
            self.counts.authorizations.add(auth)
        if fault is Fault.HANG:
            self._wait_while(Fault.HANG, 60)
            return False
        if fault is Fault.HTTP_500:
            return _send(conn, 500, b"Internal Server Error", "text/plain")
        if self.token is not None and auth != f"Bearer {self.token}":
            return _send(conn, 401, b'{"error": "Unauthorized"}', "application/json")
        if path in ("/v1/models", "/version"):
            return self._facts(conn, path, fault)
        if path != "/metrics":
            return _send(conn, 404, b"Not Found", "text/plain")
        body = self._metrics_body(fault)
        answer = _METRICS_ANSWERS.get(fault, FakeVllm._plain)
        return answer(self, conn, body)

    def _metrics_body(self, fault: Fault) -> bytes:
        """The ``/metrics`` payload for this request (the state advances under traffic)."""
        served = self.counts.requests.get("/metrics", 1) - 1
        if self.payload is not None:
            return self.payload if isinstance(self.payload, bytes) else self.payload(served)
        if fault is Fault.NONE or fault is Fault.MODELS_DOWN:
            self.state = self.state.advanced()
        explosion = fault is Fault.EXPLOSION
        return self._render(replace(self.state, engines=2000) if explosion else None)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        """One request through :meth:`transport`."""
        path = request.url.path
        fault = self._fault
        self.counts.requests[path] = self.counts.requests.get(path, 0) + 1
        auth = request.headers.get("authorization")
        if auth is not None and self.counts.authorizations is not None:
            self.counts.authorizations.add(auth)
        if fault is Fault.REFUSE:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if fault is Fault.HANG:
            raise httpx.ReadTimeout("the fake vLLM never answered", request=request)
        if fault is Fault.HTTP_500:
            return httpx.Response(500, text="Internal Server Error")
        if self.token is not None and auth != f"Bearer {self.token}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if path in ("/v1/models", "/version"):
            status, body, kind = self._facts_answer(path, fault)
            return httpx.Response(status, content=body, headers={"content-type": kind})
        if path != "/metrics":
            return httpx.Response(404, text="Not Found")
        return _transport_answer(fault, self._metrics_body(fault))

    def _facts(self, conn: socket.socket, path: str, fault: Fault) -> bool:
        """/v1/models or /version over the socket."""
        return _send(conn, *self._facts_answer(path, fault))

    def _facts_answer(self, path: str, fault: Fault) -> tuple[int, bytes, str]:
        """/v1/models or /version (503 while the MODELS_DOWN fault is in force)."""
        if fault is Fault.MODELS_DOWN:
            return 503, b"model loading", "text/plain"
        if path == "/v1/models":
            return 200, render_models(self.state), "application/json"
        return 200, json.dumps({"version": self.state.version}).encode(), "application/json"

    def _render(self, state: VllmState | None) -> bytes:
        """The payload of ``state`` (default: the current state), the last one cached."""
        state = state or self.state
        cached = self._rendered
        if cached is not None and cached[0] == state:
            return cached[1]
        body = render_metrics(state)
        self._rendered = (state, body)
        return body

    # Each /metrics answer takes the connection and the payload; returns keep-alive.

    def _plain(self, conn: socket.socket, body: bytes) -> bool:
        self.counts.metrics_body_bytes += len(body)
        return _send(conn, 200, body, TEXT)

    def _html(self, conn: socket.socket, _body: bytes) -> bool:
        return _send(conn, 200, _LOGIN_PAGE, "text/html")

    def _json(self, conn: socket.socket, _body: bytes) -> bool:
        return _send(conn, 200, b'{"detail": "Not Found"}', "application/json")

    def _malformed(self, conn: socket.socket, body: bytes) -> bool:
        return _send(conn, 200, body + _BROKEN_LINE, TEXT)

    def _garbage(self, conn: socket.socket, _body: bytes) -> bool:
        return _send(conn, 200, bytes(range(256)) * 64, TEXT)

    def _truncated(self, conn: socket.socket, body: bytes) -> bool:
        conn.sendall(_head(200, len(body), TEXT) + body[: len(body) // 2])
        return False

    def _slow(self, conn: socket.socket, body: bytes) -> bool:
        conn.sendall(_head(200, len(body), TEXT))
        for i in range(len(body)):
            if self._fault is not Fault.SLOW or self._closing:
                return False
            conn.sendall(body[i : i + 1])
            time.sleep(0.005)
        return True

    def _huge(self, conn: socket.socket, _body: bytes) -> bool:
        conn.sendall(_head(200, None, TEXT))
        for chunk in stream_lines(HUGE_BYTES):
            if self._closing:
                return False
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.counts.metrics_body_bytes += len(chunk)
        conn.sendall(b"0\r\n\r\n")
        return True

    def _gzip_bomb(self, conn: socket.socket, _body: bytes) -> bool:
        bomb = gzip_bomb()
        conn.sendall(_head(200, len(bomb), TEXT, encoding="gzip") + bomb)
        self.counts.metrics_body_bytes += len(bomb)
        return True


TEXT = "text/plain; version=0.0.4; charset=utf-8"
#: What a proxy in front of vLLM answers when it wants a login.
_LOGIN_PAGE = b"<!DOCTYPE html><html><body>Sign in</body></html>"
#: A sample line without its closing brace, in a family the sidecar reads.
_BROKEN_LINE = _RUNNING.encode() + b'{engine="0",model_name="tiny" 1\n'


def _transport_answer(fault: Fault, body: bytes) -> httpx.Response:
    """``/metrics`` through the transport, as the socket server answers it under ``fault``."""
    headers = {"content-type": TEXT}
    broken: dict[Fault, Callable[[], httpx.Response]] = {
        Fault.HTML: lambda: httpx.Response(
            200, content=_LOGIN_PAGE, headers={"content-type": "text/html"}
        ),
        Fault.JSON: lambda: httpx.Response(200, json={"detail": "Not Found"}),
        Fault.MALFORMED: lambda: httpx.Response(200, content=body + _BROKEN_LINE, headers=headers),
        Fault.GARBAGE: lambda: httpx.Response(200, content=bytes(range(256)) * 64, headers=headers),
        Fault.HUGE: lambda: httpx.Response(200, content=_stream(HUGE_BYTES), headers=headers),
        Fault.GZIP_BOMB: lambda: httpx.Response(
            200, content=gzip_bomb(), headers={**headers, "content-encoding": "gzip"}
        ),
    }
    answer = broken.get(fault)
    return answer() if answer is not None else httpx.Response(200, content=body, headers=headers)


async def _stream(total: int) -> AsyncIterator[bytes]:
    for chunk in stream_lines(total):
        yield chunk


_METRICS_ANSWERS: dict[Fault, Callable[[FakeVllm, socket.socket, bytes], bool]] = {
    Fault.HTML: FakeVllm._html,
    Fault.JSON: FakeVllm._json,
    Fault.MALFORMED: FakeVllm._malformed,
    Fault.GARBAGE: FakeVllm._garbage,
    Fault.TRUNCATED: FakeVllm._truncated,
    Fault.SLOW: FakeVllm._slow,
    Fault.HUGE: FakeVllm._huge,
    Fault.GZIP_BOMB: FakeVllm._gzip_bomb,
}


def _read_head(reader: object) -> tuple[str, dict[str, str]] | None:
    """Read a request line and headers; ``None`` at end of stream."""
    readline = reader.readline  # type: ignore[attr-defined]
    line: bytes = readline(65537)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    path = parts[1] if len(parts) >= 2 else "/"
    headers: dict[str, str] = {}
    while True:
        raw: bytes = readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return path.split("?", 1)[0], headers


def _head(status: int, length: int | None, content_type: str, *, encoding: str = "") -> bytes:
    reasons = {200: "OK", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}
    lines = [f"HTTP/1.1 {status} {reasons.get(status, 'Service Unavailable')}"]
    lines.append(f"Content-Type: {content_type}")
    if length is None:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {length}")
    if encoding:
        lines.append(f"Content-Encoding: {encoding}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _send(conn: socket.socket, status: int, body: bytes, content_type: str) -> bool:
    conn.sendall(_head(status, len(body), content_type) + body)
    return True


__all__ = [
    "HUGE_BYTES",
    "TEXT",
    "Counts",
    "FakeVllm",
    "Fault",
    "VllmState",
    "gzip_bomb",
    "render_metrics",
    "render_models",
    "stream_lines",
]
