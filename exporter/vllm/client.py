"""HTTP reads from one vLLM server: ``/metrics``, ``/v1/models`` and ``/version``.

Every read is bounded: by an overall deadline (not just httpx's per-operation timeouts, which a
server answering byte by byte would never trip) and by a maximum response size, checked while
streaming so that a 200 MB answer costs at most ``max_bytes``. Answers are read uncompressed:
a compressed body is decoded a network read at a time, and one 64 KiB read of a gzip bomb
expands to up to 64 MB before any size check can run (on loopback, compression only costs vLLM
CPU anyway); a server that compresses though we asked for ``identity`` gets
``invalid_response``. Every failure becomes a :class:`~exporter.errors.SourceError` with a
bounded ``reason`` that is safe as a label value.

Fleet mode's clients are *pinned*: a probe target's host name is resolved and its addresses
checked against the allowlist before any request (``exporter.service.fleet``), and a second
resolution by httpx could answer otherwise (DNS rebinding: an allowed name that then leads to
the cloud metadata service, or to an address the bearer token is not bound to). A pinned client
connects only to the addresses of the :class:`Route` its probe checked (:func:`routed`), keeping
the name in ``Host`` and as the TLS server name (SNI and certificate check), and sends the token
only where that route allows it. Without a route it sends nothing. Redirects are never followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import httpx

from exporter.core.reasons import AnswerRefusal, HttpReason
from exporter.errors import SourceError
from exporter.vllm.metrics import CardinalityLimits

if TYPE_CHECKING:
    import ipaddress
    from collections.abc import Iterator

    from pydantic import SecretStr


@dataclass(frozen=True, slots=True)
class Route:
    """Where a pinned client's requests may go: addresses checked, and whether the token may.

    The addresses are tried in order (the next one only when connecting to one failed, before
    anything was sent); every one of them passed the checks of the probe that made the route.
    """

    addresses: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]
    send_token: bool


_route: ContextVar[Route | None] = ContextVar("vllm_route", default=None)


@contextmanager
def routed(route: Route) -> Iterator[None]:
    """Pinned clients used within this block (this task and the tasks it starts) use ``route``."""
    token = _route.set(route)
    try:
        yield
    finally:
        _route.reset(token)


def current_route() -> Route | None:
    """The route pinned clients use here (:func:`routed`), or None outside any."""
    return _route.get()


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One way to send a request: the URL connected to, its headers and httpx extensions."""

    url: str
    headers: dict[str, str]
    extensions: dict[str, Any]


#: Longest model id, model root or vLLM version kept from ``/v1/models`` and ``/version``: the
#: label values' cap of the ``/metrics`` parser. vLLM's are model names or paths (a few hundred
#: characters at most) and versions like ``0.11.1rc2.dev13+g1234abc.cu128``. A longer value is
#: not vLLM's: it is dropped as absent (never cut short into a false value), for it would be held
#: by every target and exported as a label.
MAX_FACT_CHARS: Final = CardinalityLimits().max_label_value_chars
#: Largest ``max_model_len`` believed (2**31 - 1 tokens; the longest contexts served are about
#: ten million): a larger number, like a 4,000-digit one, is not a context length.
MAX_MODEL_LEN: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ModelsInfo:
    """What ``/v1/models`` says about the first served model."""

    model_id: str
    root: str | None
    max_model_len: int | None
    #: Fields present but not believed (treated as absent), each with why: for the log.
    ignored: tuple[str, ...] = ()


def connection_refused(exc: BaseException) -> bool:
    """Whether a connection error was, underneath, a refused connection (nobody listening)."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain is short; bound it anyway
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or "refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def check_head(response: httpx.Response, path: str, max_bytes: int) -> None:
    """Refuse an answer by its status and headers, before reading its body."""
    if response.status_code != httpx.codes.OK:
        raise SourceError(
            status_reason(response.status_code),
            f"GET {path} answered HTTP {response.status_code}",
        )
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise SourceError(
            "invalid_response",
            f"GET {path} answered Content-Encoding {encoding[:20]!r}, "
            "though only identity was accepted",
        )
    declared = response.headers.get("content-length")
    if (
        declared is not None
        and declared.isascii()
        and declared.isdigit()
        and int(declared) > max_bytes
    ):
        raise SourceError("too_large", f"GET {path} declares {declared} bytes > {max_bytes}")


def status_reason(status: int) -> str:
    """The bounded reason of a status other than 200 (redirects are not followed)."""
    if status in (401, 403, 404):
        return f"http_{status}"
    if status >= 500:
        return HttpReason.HTTP_5XX
    if status >= 400:
        return HttpReason.HTTP_4XX
    if 300 <= status < 400:
        return HttpReason.HTTP_3XX
    return HttpReason.INVALID_RESPONSE  # 1xx, or a 2xx other than 200


_DEFAULT_PORTS = {"http": 80, "https": 443}

#: The message of an answer the shared budget stopped, by reason.
_REFUSED = {
    AnswerRefusal.OVER_SHARE: (
        "GET {path}: the answer is over its fair share of the answers being read at once"
    ),
    AnswerRefusal.CUT: "GET {path}: the answer was cut to make room for smaller answers",
}


class ResponseBudget:
    """Bytes of ``/metrics`` answers being read at once, shared fairly by many targets' clients.

    In fleet mode dozens of answers are read at once, each bounded by ``max_bytes``; their sum
    is bounded here by ``total_bytes`` (derived from ``memory_limit_bytes``). While the budget
    has room any answer may grow; once it is full, each answer being read is entitled to its
    fair share (``total_bytes`` over the answers being read), and the biggest answer over its
    share gives way: refused if it is the one asking for room (``over_share``), else cut
    (``cut``: its bytes are freed at once, even if its target has stalled). So a few targets
    answering megabytes and stalling cannot starve a small healthy one: it is within its
    share, and never the biggest. Used from one event loop only.
    """

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.in_use = 0
        self._readings: set[Reading] = set()
        #: Answers stopped by the budget, by reason (every AnswerRefusal from 0); never reset.
        self.refusals: Counter[str] = Counter(dict.fromkeys(AnswerRefusal, 0))

    @property
    def fair_share(self) -> int:
        """Bytes each answer being read may hold when the budget is full."""
        return self.total_bytes // max(1, len(self._readings))

    def open(self) -> Reading:
        """Start reading an answer within the budget; close the reading when done."""
        reading = Reading(self)
        self._readings.add(reading)
        return reading

    def _make_room(self, reading: Reading, size: int) -> AnswerRefusal | None:
        """Free room for ``size`` more bytes of ``reading``; the refusal if it must give way.

        The biggest answer over its share gives way: cut if it is another, refused if it is
        ``reading``. Answers all within their shares fit in the total, so while the budget is
        over, one of them is over its share.
        """
        while self.in_use + size > self.total_bytes:
            share = self.fair_share

            def wants(r: Reading) -> int:
                return r.held + (size if r is reading else 0)

            over = [r for r in self._readings if wants(r) > share]
            if not over or max(over, key=wants) is reading:
                return AnswerRefusal.OVER_SHARE
            max(over, key=wants).cut()
        return None

    def _close(self, reading: Reading) -> None:
        self._readings.discard(reading)


class Reading:
    """One answer being read within a :class:`ResponseBudget`: its chunks and what they hold."""

    def __init__(self, budget: ResponseBudget) -> None:
        self._budget = budget
        self.chunks: list[bytes] = []
        self.held = 0
        #: Why the reading was stopped, once it was.
        self.refused: AnswerRefusal | None = None

    def add(self, chunk: bytes) -> AnswerRefusal | None:
        """Keep ``chunk`` if the budget allows; else the reason it was stopped (nothing kept)."""
        if self.refused is not None:
            return self.refused  # cut meanwhile (counted then)
        refusal = self._budget._make_room(self, len(chunk))
        if refusal is not None:
            self._budget.refusals[refusal] += 1
            self.release()
            self.refused = refusal
            return refusal
        self.chunks.append(chunk)
        self.held += len(chunk)
        self._budget.in_use += len(chunk)
        return None

    def cut(self) -> None:
        """Give up every byte read so far, to make room for an answer within its share."""
        self._budget.refusals[AnswerRefusal.CUT] += 1
        self.release()
        self.refused = AnswerRefusal.CUT

    def release(self) -> None:
        """Drop the chunks and give their bytes back (the reading may still be closed later)."""
        self._budget.in_use -= self.held
        self.held = 0
        self.chunks = []

    def close(self) -> None:
        """Give back what the reading holds and leave the budget."""
        self.release()
        self._budget._close(self)


class VllmClient:
    """Bounded async reads of one vLLM server's HTTP API."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient,
        timeout_seconds: float,
        max_bytes: int,
        bearer_token: SecretStr | None = None,
        budget: ResponseBudget | None = None,
        pinned: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        #: Connect only to the addresses of the current :class:`Route` (fleet mode).
        self.pinned = pinned
        self._client = client
        self._timeout = timeout_seconds
        self._max_bytes = max_bytes
        self._budget = budget
        self._headers = {
            "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
            "Accept-Encoding": "identity",
        }
        self._authorization = (
            f"Bearer {bearer_token.get_secret_value()}" if bearer_token is not None else None
        )

    def _attempts(self, path: str) -> list[_Attempt]:
        """The requests that may carry ``GET path``: one, or one per address of the route."""
        if not self.pinned:
            headers = dict(self._headers)
            if self._authorization is not None:
                headers["Authorization"] = self._authorization
            return [_Attempt(f"{self.base_url}{path}", headers, {})]
        route = current_route()
        if route is None or not route.addresses:
            raise SourceError(
                HttpReason.CONNECTION_ERROR,
                f"GET {path}: no checked address to connect to (fleet mode connects only to "
                "addresses checked against the allowlist)",
            )
        url = httpx.URL(self.base_url)
        headers = dict(self._headers)
        # The name the target was given by: what vLLM (or a proxy) and its certificate expect.
        shown = f"[{url.host}]" if ":" in url.host else url.host
        headers["Host"] = f"{shown}:{url.port}" if url.port is not None else shown
        if route.send_token and self._authorization is not None:
            headers["Authorization"] = self._authorization
        extensions: dict[str, Any] = {}
        if url.scheme == "https":
            extensions["sni_hostname"] = url.host
            # Connections are pooled by address: one verified for another name must not carry
            # this name's requests.
            headers["Connection"] = "close"
        port = url.port or _DEFAULT_PORTS[url.scheme]
        base_path = url.raw_path.decode("ascii").rstrip("/")
        attempts = []
        for address in route.addresses:
            host = f"[{address}]" if address.version == 6 else str(address)
            attempts.append(
                _Attempt(f"{url.scheme}://{host}:{port}{base_path}{path}", headers, extensions)
            )
        return attempts

    async def _get(self, path: str, *, max_bytes: int) -> tuple[bytes, str]:
        """GET ``path``; return the body and its content type, or raise SourceError."""
        try:
            attempts = self._attempts(path)
            async with asyncio.timeout(self._timeout):
                for attempt in attempts[:-1]:
                    # Nothing was sent when connecting failed: the next checked address may do.
                    with contextlib.suppress(httpx.ConnectError):
                        return await self._send(attempt, path, max_bytes)
                return await self._send(attempts[-1], path, max_bytes)
        except TimeoutError:
            raise SourceError(
                "timeout", f"GET {path} took longer than {self._timeout:g}s"
            ) from None
        except httpx.TimeoutException:
            raise SourceError("timeout", f"GET {path} timed out") from None
        except httpx.ConnectError as exc:
            reason = "connection_refused" if connection_refused(exc) else "connection_error"
            raise SourceError(reason, f"GET {path}: connection failed ({reason})") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise SourceError("connection_error", f"GET {path}: {type(exc).__name__}") from None

    async def _send(self, attempt: _Attempt, path: str, max_bytes: int) -> tuple[bytes, str]:
        """One request as ``attempt`` says; the body and its content type, or raise."""
        async with self._client.stream(
            "GET",
            attempt.url,
            headers=attempt.headers,
            timeout=self._timeout,
            extensions=attempt.extensions,
        ) as response:
            check_head(response, path, max_bytes)
            body = await self._read_body(response, path, max_bytes)
            return body, response.headers.get("content-type", "")

    async def _read_body(self, response: httpx.Response, path: str, max_bytes: int) -> bytes:
        """The body, bounded by ``max_bytes`` and by the shared budget, if any."""
        if self._budget is None:
            chunks: list[bytes] = []
            size = 0
            # Decoded bytes: the bound also holds for a gzip bomb.
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise SourceError("too_large", f"GET {path} is larger than {max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        reading = self._budget.open()
        try:
            async for chunk in response.aiter_bytes():
                if reading.held + len(chunk) > max_bytes:
                    raise SourceError("too_large", f"GET {path} is larger than {max_bytes} bytes")
                refusal = reading.add(chunk)
                if refusal is not None:
                    raise SourceError(HttpReason.TOO_LARGE, _REFUSED[refusal].format(path=path))
            if reading.refused is not None:  # cut after its last chunk
                raise SourceError(HttpReason.TOO_LARGE, _REFUSED[reading.refused].format(path=path))
            return b"".join(reading.chunks)
        finally:
            reading.close()

    async def fetch_metrics(self) -> bytes:
        """The raw ``/metrics`` payload (Prometheus text format)."""
        body, content_type = await self._get("/metrics", max_bytes=self._max_bytes)
        kind = content_type.split(";", 1)[0].strip().lower()
        if kind in ("text/html", "application/json") or body.lstrip()[:1] in (b"<", b"{", b"["):
            raise SourceError(
                "not_metrics", f"/metrics answered {kind or 'something'} instead of metrics"
            )
        return body

    async def fetch_text(self, path: str) -> bytes:
        """``GET path`` within the bounds of ``/metrics`` (fleet mode: a dcgm-exporter's)."""
        body, _ = await self._get(path, max_bytes=self._max_bytes)
        return body

    async def _json(self, path: str) -> Any:
        body, _ = await self._get(path, max_bytes=1024 * 1024)
        try:
            return json.loads(body)
        except ValueError:
            raise SourceError("invalid_response", f"{path} did not answer JSON") from None
        except RecursionError:  # "[[[[...": nested deeper than the decoder recurses
            raise SourceError(
                "invalid_response", f"{path} answered JSON nested too deep to be vLLM's"
            ) from None

    async def fetch_models(self) -> ModelsInfo:
        """The first model ``/v1/models`` lists: its id, root path or hub id, max_model_len."""
        document = await self._json("/v1/models")
        return parse_models(document)

    async def fetch_version(self) -> str:
        """vLLM's version from ``/version``."""
        document = await self._json("/version")
        version = document.get("version") if isinstance(document, dict) else None
        if not isinstance(version, str) or not version:
            raise SourceError("invalid_response", "/version has no 'version' string")
        if len(version) > MAX_FACT_CHARS:
            raise SourceError(
                "invalid_response",
                f"/version's 'version' is {len(version)} characters, more than "
                f"{MAX_FACT_CHARS}: not a vLLM version, ignored",
            )
        return version


def parse_models(document: object) -> ModelsInfo:
    """Read vLLM's ``/v1/models`` answer (pure); SourceError ``invalid_response`` if odd.

    A root longer than :data:`MAX_FACT_CHARS`, or a ``max_model_len`` that is not a whole number
    from 1 to :data:`MAX_MODEL_LEN`, is treated as absent and named in ``ignored``; an id that
    long is no id (``invalid_response``).
    """
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise SourceError("invalid_response", "/v1/models lists no model")
    first = data[0]
    model_id = first.get("id")
    if not isinstance(model_id, str):
        raise SourceError("invalid_response", "/v1/models: the model has no id")
    if len(model_id) > MAX_FACT_CHARS:
        raise SourceError(
            "invalid_response",
            f"/v1/models: the model's id is {len(model_id)} characters, more than "
            f"{MAX_FACT_CHARS}: not a model name, ignored",
        )
    ignored: list[str] = []
    root = first.get("root")
    if isinstance(root, str) and len(root) > MAX_FACT_CHARS:
        ignored.append(f"root ({len(root)} characters, more than {MAX_FACT_CHARS})")
        root = None
    max_len = first.get("max_model_len")
    if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > MAX_MODEL_LEN:
        # Its length, not its digits: a 4,000-digit number is not to be written out.
        ignored.append(f"max_model_len (over {MAX_MODEL_LEN}: {max_len.bit_length()} bits)")
        max_len = None
    return ModelsInfo(
        model_id=model_id,
        root=root if isinstance(root, str) and root else None,
        max_model_len=(
            max_len
            if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0
            else None
        ),
        ignored=tuple(ignored),
    )
