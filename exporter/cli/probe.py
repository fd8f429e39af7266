"""``vllm-headroom probe``: a load sweep against a (staging) vLLM that finds its knee.

Reads the target's metrics and, unless lengths are given, its own per-request histograms for the
traffic shape; refuses to send anything when the target already serves traffic, unless told
``--i-know-this-sends-load``; then runs the sweep (:mod:`exporter.sweep`) with vLLM's own
benchmark client where it is installed, else the built-in httpx client, printing a line per step
on stderr. The summary goes to stdout (``--json``: one object), the curves to ``--report`` (HTML
or PNG, with the ``report`` extra). Ctrl-C stops it cleanly: requests in flight are cancelled
(vLLM aborts them), the target is left idle, and what was measured is reported (exit 130);
SIGTERM likewise (exit 143), so a Kubernetes Job that is deleted or runs out of time reports. When
none of the baseline's requests completes (a wrong model name, a target that refuses them) the
sweep stops there and says why (exit 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from exporter.boundedread import FileReadError, read_bounded
from exporter.cli.numbers import SEED, Bounded, shown, whole
from exporter.core.ceiling import RunningLimit
from exporter.core.derive import Sample, WindowSettings, derive_target
from exporter.core.reasons import MaxNumSeqsSource
from exporter.errors import ParseError, SourceError, UsageError
from exporter.sizing.limits import LimitInputs, resolve_running_limit
from exporter.sweep.drivers import MAX_IN_FLIGHT, HttpxDriver, VllmBenchDriver, require_tokenizer
from exporter.sweep.evaluate import Limits, busy_unknown, traffic_seen
from exporter.sweep.figure import check_report_path, write_report
from exporter.sweep.knee import check_capacity, shape_ceiling
from exporter.sweep.plan import MAX_TOTAL_REQUESTS, Mode, SweepPlan, parse_levels
from exporter.sweep.report import TargetFacts, progress_line, render, to_json
from exporter.sweep.runner import SweepSetup, run_sweep
from exporter.sweep.shape import (
    DEFAULT_SAMPLES,
    MAX_CONTEXT_TOKENS,
    MAX_LENGTHS,
    check_fits,
    fixed_shape,
    parse_lengths,
    shape_from_histograms,
    snapshot_buckets,
)
from exporter.vllm.client import VllmClient
from exporter.vllm.coverage import unusable_reason
from exporter.vllm.metrics import parse_vllm_metrics

if TYPE_CHECKING:
    import argparse

    from exporter.core.snapshot import VllmSnapshot
    from exporter.sweep.runner import LoadDriver
    from exporter.sweep.shape import TrafficShape

NAME = "probe"
HELP = "load-test a staging vLLM with rising load and report its knee (sends real requests)"
DESCRIPTION = (
    "Send rising load to a vLLM server with the lengths of its real traffic (from its own "
    "histograms, a file of lengths, or given) and find the knee: the highest load that keeps "
    "preemptions and queueing under the limits, the concurrency there against the KV ceiling, "
    "and the limit that binds. Refuses a server that already serves traffic unless "
    "--i-know-this-sends-load. Ctrl-C or SIGTERM stops it cleanly (exit 130 or 143)."
)

#: Largest /metrics payload, capture or lengths file read.
MAX_BYTES = 64 * 1024 * 1024
#: Exit codes after Ctrl-C (SIGINT) and SIGTERM (Kubernetes stopping the probe's Job), as a
#: shell reports them: 128 + the signal's number.
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
#: The signals that stop the sweep cleanly; a second one stops it at once.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Exit code when no request of the baseline completed (nothing could be measured).
EXIT_NOTHING_COMPLETED = 1
CONFIRM_FLAG = "--i-know-this-sends-load"
#: Waits before any request longer than this are announced on stderr (not a silent hang).
ANNOUNCED_WAIT_S = 10.0


#: Every float flag of ``probe`` and its range (docs/probe.md lists them). NaN, infinities and
#: numbers out of range are refused by the parser in one line: a NaN limit would turn its check
#: off (``x >= nan`` is never true), an infinite wait would hang before sending.
FLOAT_FLAGS: dict[str, Bounded] = {
    "step_seconds": Bounded("seconds", 0.0, 86_400.0, "30", above=True),
    "settle_seconds": Bounded("seconds", 0.0, 86_400.0, "5"),
    "max_duration": Bounded("seconds", 0.0, 7 * 86_400.0, "900", above=True),
    "drain_seconds": Bounded("seconds", 0.0, 3_600.0, "60", above=True),
    "shape_window": Bounded("seconds", 0.0, 86_400.0, "3600"),
    "max_preemptions_per_request": Bounded("preemptions per request", 0.0, 1e6, "0.01"),
    "max_waiting": Bounded("requests", 0.0, 1e6, "0.5"),
    "ttft_p95": Bounded("seconds", 0.0, 86_400.0, "2", above=True),
    "tpot_p95": Bounded("seconds", 0.0, 86_400.0, "0.1", above=True),
    "stop_preemptions": Bounded("preemptions", 0.0, 1e6, "20", above=True),
    "stop_waiting": Bounded("requests", 0.0, 1e6, "16", above=True),
    "sample_interval": Bounded("seconds", 0.05, 60.0, "1"),
    "timeout": Bounded("seconds", 0.0, 600.0, "5", above=True),
    "quiet_seconds": Bounded("seconds", 0.1, 3_600.0, "2"),
}

#: Every whole-number flag of ``probe`` and its range (docs/probe.md lists the caps): the sweep's
#: own checks refuse the same, later, in other words; these refuse a typo before any read.
WHOLE_FLAGS: dict[str, Bounded] = {
    "past_knee": whole("steps", 0, "1"),
    "max_requests": whole("requests", 1, "5000", high=MAX_TOTAL_REQUESTS),
    "baseline_requests": whole("requests", 1, "3"),
    "seed": SEED,
    "prompt_tokens": whole("tokens", 1, "1500", high=MAX_CONTEXT_TOKENS),
    "output_tokens": whole("tokens", 1, "300", high=MAX_CONTEXT_TOKENS),
    "shape_samples": whole("samples", 1, str(DEFAULT_SAMPLES), high=MAX_LENGTHS),
    "max_num_seqs": whole("sequences", 1, "256"),
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``probe``."""
    parser.add_argument("--target", required=True, metavar="URL", help="vLLM base URL")
    parser.add_argument(
        CONFIRM_FLAG,
        dest="confirmed",
        action="store_true",
        help="send load even though the target serves traffic now",
    )
    plan = parser.add_argument_group("the sweep")
    plan.add_argument(
        "--mode",
        choices=[str(m) for m in Mode],
        default=str(Mode.RATE),
        help="rate: Poisson arrivals at rising rates (default); concurrency: N clients",
    )
    plan.add_argument(
        "--levels", help="load levels, e.g. 0.5,1,2,4 (default: chosen from the ceiling)"
    )
    plan.add_argument(
        "--step-seconds",
        type=FLOAT_FLAGS["step_seconds"],
        default=30.0,
        help="each step (default 30)",
    )
    plan.add_argument(
        "--settle-seconds",
        type=FLOAT_FLAGS["settle_seconds"],
        help="unmeasured start of each step (default: a third of the step, at most 10)",
    )
    plan.add_argument(
        "--past-knee",
        type=WHOLE_FLAGS["past_knee"],
        default=1,
        help="steps after the first failing one (default 1)",
    )
    plan.add_argument(
        "--max-duration",
        type=FLOAT_FLAGS["max_duration"],
        default=900.0,
        help="seconds for the whole sweep (900)",
    )
    plan.add_argument(
        "--max-requests",
        type=WHOLE_FLAGS["max_requests"],
        default=5000,
        help="requests for the whole sweep (5000)",
    )
    plan.add_argument(
        "--drain-seconds",
        type=FLOAT_FLAGS["drain_seconds"],
        default=60.0,
        help="wait for requests in flight after a step, then cancel (60)",
    )
    plan.add_argument(
        "--baseline-requests",
        type=WHOLE_FLAGS["baseline_requests"],
        default=3,
        help="one-at-a-time requests first (3)",
    )
    plan.add_argument(
        "--seed", type=WHOLE_FLAGS["seed"], default=0, help="arrivals and prompts seed (0)"
    )
    shape = parser.add_argument_group("the traffic shape (default: the target's histograms)")
    shape.add_argument(
        "--prompt-tokens", type=WHOLE_FLAGS["prompt_tokens"], help="every request's prompt length"
    )
    shape.add_argument(
        "--output-tokens", type=WHOLE_FLAGS["output_tokens"], help="every request's output length"
    )
    shape.add_argument("--lengths", metavar="FILE", help="recorded lengths: PROMPT,OUTPUT a line")
    shape.add_argument(
        "--shape-from", metavar="URL|FILE", help="another vLLM (or a /metrics capture) to copy"
    )
    shape.add_argument(
        "--shape-window",
        type=FLOAT_FLAGS["shape_window"],
        default=0.0,
        help="histograms over this many seconds instead of since start (URLs only)",
    )
    shape.add_argument(
        "--shape-samples",
        type=WHOLE_FLAGS["shape_samples"],
        default=DEFAULT_SAMPLES,
        help=f"lengths drawn from histograms ({DEFAULT_SAMPLES})",
    )
    limits = parser.add_argument_group("the limits of a good step")
    limits.add_argument(
        "--max-preemptions-per-request",
        type=FLOAT_FLAGS["max_preemptions_per_request"],
        default=0.01,
        help="(default 0.01)",
    )
    limits.add_argument(
        "--max-waiting",
        type=FLOAT_FLAGS["max_waiting"],
        default=0.5,
        help="mean requests waiting (default 0.5)",
    )
    limits.add_argument(
        "--ttft-p95", type=FLOAT_FLAGS["ttft_p95"], metavar="SECONDS", help="TTFT objective"
    )
    limits.add_argument(
        "--tpot-p95", type=FLOAT_FLAGS["tpot_p95"], metavar="SECONDS", help="TPOT objective"
    )
    limits.add_argument(
        "--stop-preemptions",
        type=FLOAT_FLAGS["stop_preemptions"],
        help="stop a step at this many preemptions (default: 20 or twice the ceiling)",
    )
    limits.add_argument(
        "--stop-waiting",
        type=FLOAT_FLAGS["stop_waiting"],
        help="stop a step at this many requests waiting (default: 16 or the ceiling)",
    )
    target = parser.add_argument_group("the target")
    target.add_argument(
        "--max-num-seqs",
        type=WHOLE_FLAGS["max_num_seqs"],
        help="vLLM --max-num-seqs (default: vLLM's)",
    )
    target.add_argument("--model", help="served model name (default: the first of /v1/models)")
    target.add_argument(
        "--sample-interval",
        type=FLOAT_FLAGS["sample_interval"],
        default=1.0,
        help="seconds between metric reads (1)",
    )
    target.add_argument(
        "--timeout",
        type=FLOAT_FLAGS["timeout"],
        default=5.0,
        help="seconds per metrics or file read (5)",
    )
    target.add_argument(
        "--quiet-seconds",
        type=FLOAT_FLAGS["quiet_seconds"],
        default=2.0,
        help="watch the target this long for traffic before starting (2)",
    )
    client = parser.add_argument_group("the load client")
    client.add_argument(
        "--client",
        choices=["auto", "builtin", "vllm"],
        default="auto",
        help="vllm: vLLM's bench serve (needs --tokenizer); builtin: httpx; auto: vLLM's where "
        "importable and --tokenizer is given",
    )
    client.add_argument(
        "--vllm-python",
        metavar="PYTHON",
        help="the python of vLLM's environment (default: this one)",
    )
    client.add_argument(
        "--tokenizer",
        help="for vLLM's client: a model directory or hub id (never taken from the target)",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON object")
    output.add_argument("--report", metavar="FILE", help="write the curves: .html or .png")


@dataclass(frozen=True, slots=True)
class _Target:
    url: str
    snapshot: VllmSnapshot
    model: str
    model_root: str | None
    max_model_len: int | None
    vllm_version: str | None


def _limits(args: argparse.Namespace, ceiling: float | None) -> Limits:
    """The limits of a good step; :class:`Limits` refuses any that is not finite."""
    size = ceiling if ceiling is not None and math.isfinite(ceiling) else 0.0
    stop_preemptions = args.stop_preemptions
    if stop_preemptions is None:
        stop_preemptions = max(20.0, 2 * size)
    stop_waiting = args.stop_waiting
    if stop_waiting is None:
        stop_waiting = max(16.0, size)
    return Limits(
        max_preemptions_per_request=args.max_preemptions_per_request,
        max_waiting=args.max_waiting,
        ttft_p95_s=args.ttft_p95,
        tpot_p95_s=args.tpot_p95,
        stop_preemptions=stop_preemptions,
        stop_waiting=stop_waiting,
    )


def _plan(args: argparse.Namespace) -> SweepPlan:
    mode = Mode(args.mode)
    levels = parse_levels(args.levels, mode) if args.levels else ()
    settle = args.settle_seconds
    if settle is None:
        settle = min(10.0, args.step_seconds / 3) if args.step_seconds > 0 else 0.0
    return SweepPlan(
        mode=mode,
        levels=levels,
        step_seconds=args.step_seconds,
        settle_seconds=settle,
        past_knee=args.past_knee,
        max_total_seconds=args.max_duration,
        max_total_requests=args.max_requests,
        drain_seconds=args.drain_seconds,
        baseline_requests=args.baseline_requests,
        seed=args.seed,
    )


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse bad flags before touching the target (one line each)."""
    if not args.target.startswith(("http://", "https://")):
        raise UsageError(f"--target {args.target!r} is not a URL; give vLLM's http://HOST:PORT")
    if (args.prompt_tokens is None) != (args.output_tokens is None):
        raise UsageError("give --prompt-tokens and --output-tokens together")
    given = [
        name
        for name, value in (
            ("--prompt-tokens", args.prompt_tokens),
            ("--lengths", args.lengths),
            ("--shape-from", args.shape_from),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} both give the traffic shape; keep one")
    # The parser's types refuse these already; checked again for arguments built otherwise
    # (the same ranges: a NaN or infinite value never reaches a limit or a wait).
    for name, bounded in (FLOAT_FLAGS | WHOLE_FLAGS).items():
        value = getattr(args, name)
        if value is not None and not (isinstance(value, float | int) and bounded.accepts(value)):
            raise UsageError(bounded.refusal(f"{_flag(name)} {shown(value)}"))
    lengths_given = args.prompt_tokens is not None or args.lengths is not None
    source = args.shape_from or args.target
    if args.shape_window > 0 and (lengths_given or not source.startswith(("http://", "https://"))):
        raise UsageError(
            "--shape-window reads a vLLM's histograms twice: use it with the target's own "
            "histograms or --shape-from URL, not with lengths or a capture file"
        )
    if args.report:
        check_report_path(Path(args.report))
    if args.prompt_tokens is not None:
        fixed_shape(args.prompt_tokens, args.output_tokens)


def _read_bytes(path: Path, what: str, timeout: float) -> bytes:
    """A file the flags name: at most MAX_BYTES within ``timeout`` seconds, whatever its kind."""
    try:
        return read_bounded(path, max_bytes=MAX_BYTES, timeout_s=timeout)
    except FileReadError as exc:
        raise UsageError(f"{exc}; give a {what}") from None


def _parse(payload: bytes, where: str) -> VllmSnapshot:
    try:
        snapshot = parse_vllm_metrics(payload)
    except ParseError as exc:
        raise UsageError(f"{where}: {exc}") from None
    unusable = unusable_reason(payload, snapshot.families if snapshot.engines else ())
    if unusable is not None:
        raise UsageError(f"{where} {unusable}")
    return snapshot


async def _read_metrics(client: VllmClient, url: str) -> VllmSnapshot:
    try:
        payload = await client.fetch_metrics()
    except SourceError as exc:
        raise UsageError(
            f"cannot read {url}/metrics ({exc.reason}): is vLLM running there?"
        ) from None
    return _parse(payload, f"{url}/metrics")


class _TargetSource:
    """The runner's metrics source: the target's /metrics through the bounded client."""

    def __init__(self, client: VllmClient) -> None:
        self._client = client

    async def read(self) -> VllmSnapshot:
        return parse_vllm_metrics(await self._client.fetch_metrics())


async def _connect(args: argparse.Namespace, client: VllmClient) -> _Target:
    url = args.target.rstrip("/")
    snapshot = await _read_metrics(client, url)
    model = args.model
    root = max_len = version = None
    try:
        models = await client.fetch_models()
        model = model or models.model_id
        root, max_len = models.root, models.max_model_len
    except SourceError as exc:
        if model is None:
            raise UsageError(f"{url}/v1/models failed ({exc.reason}); give --model") from None
    with contextlib.suppress(SourceError):
        version = await client.fetch_version()
    return _Target(url, snapshot, str(model), root, max_len, version)


async def _pause(seconds: float, interrupt: asyncio.Event, *, doing: str) -> None:
    """Sleep, or raise :class:`_Interrupted` at Ctrl-C (nothing was sent yet).

    A wait longer than :data:`ANNOUNCED_WAIT_S` says what it waits for, so it never looks hung.
    """
    if seconds > ANNOUNCED_WAIT_S:
        _err(f"probe: {doing} for {seconds:g} s before sending anything; Ctrl-C stops")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(interrupt.wait(), timeout=seconds)
    if interrupt.is_set():
        raise _Interrupted


class _Interrupted(Exception):
    """Ctrl-C before the sweep started."""


async def _shape(
    args: argparse.Namespace, target: _Target, http: httpx.AsyncClient, interrupt: asyncio.Event
) -> TrafficShape:
    """The traffic shape the flags ask for (see ``exporter.sweep.shape``)."""
    if args.prompt_tokens is not None:
        return fixed_shape(args.prompt_tokens, args.output_tokens)
    if args.lengths:
        path = Path(args.lengths)
        raw = _read_bytes(path, "file of request lengths", args.timeout)
        text = raw.decode("utf-8", errors="replace")
        return parse_lengths(text, where=str(path))
    source = args.shape_from or target.url
    before: VllmSnapshot | None = None
    if source.startswith(("http://", "https://")):
        client = VllmClient(
            source.rstrip("/"), client=http, timeout_seconds=args.timeout, max_bytes=MAX_BYTES
        )
        after = target.snapshot if source == target.url else await _read_metrics(client, source)
        if args.shape_window > 0:
            before = after
            await _pause(args.shape_window, interrupt, doing=f"reading {source}'s histograms")
            after = await _read_metrics(client, source.rstrip("/"))
    else:
        after = _parse(_read_bytes(Path(source), "/metrics capture", args.timeout), source)
    prompt, generation = snapshot_buckets(after, before)
    return shape_from_histograms(
        prompt,
        generation,
        source=source if before is None else f"{source} over {args.shape_window:g} s",
        samples=args.shape_samples,
        max_model_len=target.max_model_len,
        seed=args.seed,
    )


def _running_limit(args: argparse.Namespace, target: _Target) -> RunningLimit:
    if args.max_num_seqs is not None:
        return RunningLimit(args.max_num_seqs, MaxNumSeqsSource.SETTING)
    cache = next((e.cache_config for e in target.snapshot.engines.values() if e.cache_config), None)
    return resolve_running_limit(
        LimitInputs(
            vllm_version=target.vllm_version,
            max_model_len=target.max_model_len,
            cache_config=cache,
        )
    )


def _has_vllm(python: str) -> bool:
    """Whether ``python`` can import vLLM's benchmark client (found, not imported: fast)."""
    check = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 1)"
    try:
        done = subprocess.run(  # noqa: S603 - the user's own interpreter, no shell
            [python, "-c", check], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _driver(
    args: argparse.Namespace,
    target: _Target,
    http: httpx.AsyncClient,
    workdir: Path,
) -> LoadDriver:
    python = args.vllm_python or sys.executable
    use_vllm = args.client == "vllm"
    if args.client == "auto":
        # vLLM's client needs a tokenizer the operator named (require_tokenizer says why).
        use_vllm = args.tokenizer is not None and _has_vllm(python)
    elif use_vllm and not _has_vllm(python):
        raise UsageError(
            f"vLLM's benchmark client is not importable by {python}; give --vllm-python (the "
            "python of vLLM's environment) or --client builtin"
        )
    if use_vllm:
        return VllmBenchDriver(
            python=python,
            base_url=target.url,
            model=target.model,
            tokenizer=require_tokenizer(args.tokenizer, target.model_root),
            workdir=workdir,
            clock=time.monotonic,
            seed=args.seed,
        )
    return HttpxDriver(target.url, target.model, client=http, clock=time.monotonic, seed=args.seed)


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


async def probe(args: argparse.Namespace) -> int:
    """Run the probe; return the exit code (130 after Ctrl-C, 143 after SIGTERM)."""
    _check_flags(args)
    plan = _plan(args)
    interrupt = asyncio.Event()
    received: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        interrupt.set()
        # A second signal gets the default handling: stop at once.
        for each in STOP_SIGNALS:
            loop.remove_signal_handler(each)

    def exit_code(code: int) -> int:
        if code == EXIT_INTERRUPTED and received and received[0] == signal.SIGTERM:
            return EXIT_TERMINATED
        return code

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        return exit_code(await _probe(args, plan, interrupt))
    except _Interrupted:
        _err("probe: interrupted before sending any load")
        return exit_code(EXIT_INTERRUPTED)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)


async def _probe(args: argparse.Namespace, plan: SweepPlan, interrupt: asyncio.Event) -> int:
    # Idle connections are dropped after 2 s, before vLLM's server drops them (its keep-alive
    # timeout is 5 s): a request sent on a connection the server is closing just then fails
    # with "Server disconnected", which would count as a failed request in the step.
    pool = httpx.Limits(
        max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64, keepalive_expiry=2.0
    )
    async with (
        httpx.AsyncClient(trust_env=False) as http,
        httpx.AsyncClient(trust_env=False, limits=pool) as load_http,
    ):
        client = VllmClient(
            args.target.rstrip("/"), client=http, timeout_seconds=args.timeout, max_bytes=MAX_BYTES
        )
        target = await _connect(args, client)
        if not args.confirmed:
            await _pause(args.quiet_seconds, interrupt, doing=f"watching {target.url} for traffic")
            later = await _read_metrics(client, target.url)
            unknown = busy_unknown(target.snapshot) or busy_unknown(later)
            if unknown:
                raise UsageError(
                    f"cannot tell whether {target.url} is serving traffic ({unknown}); probe a "
                    f"staging instance, or pass {CONFIRM_FLAG}"
                )
            busy = traffic_seen(target.snapshot, later, seconds=args.quiet_seconds)
            if busy:
                raise UsageError(
                    f"{target.url} is serving traffic ({busy}); probe a staging instance, or "
                    f"pass {CONFIRM_FLAG}"
                )
        shape = await _shape(args, target, http, interrupt)
        check_fits(shape, target.max_model_len)
        limit = _running_limit(args, target)
        engines = derive_target(
            [Sample(0.0, target.snapshot)],
            windows=WindowSettings(),
            max_model_len=target.max_model_len,
            running_limit=limit,
        ).engines
        ceiling = shape_ceiling(engines, shape, limit)
        check_capacity(engines, shape, ceiling)
        if plan.mode == Mode.RATE and not plan.levels and ceiling.kv_p95_sequences is None:
            raise UsageError(
                f"{target.url} does not say its KV capacity (no vllm:cache_config_info), so no "
                "request rates can be chosen; give --levels (requests/s, e.g. 0.5,1,2,4)"
            )
        limits = _limits(args, ceiling.sequences)
        setup = SweepSetup(
            plan=plan,
            limits=limits,
            shape=shape,
            ceiling=ceiling,
            running_limit=limit,
            max_model_len=target.max_model_len,
            sample_interval_s=args.sample_interval,
        )
        with tempfile.TemporaryDirectory(prefix="vllm-headroom-probe-") as workdir:
            driver = _driver(args, target, load_http, Path(workdir))
            _err(
                f"probe: {target.url} ({target.model}), {driver.name}, {plan.mode} steps; "
                f"ceiling {ceiling.sequences if ceiling.sequences is not None else '?'} "
                f"sequences of {ceiling.p95_context_tokens} tokens; Ctrl-C stops"
            )
            result = await run_sweep(
                setup,
                driver=driver,
                source=_TargetSource(client),
                clock=time.monotonic,
                pause=asyncio.sleep,
                interrupt=interrupt,
                on_line=lambda line: _err(f"probe: {line}"),
                on_step=lambda index, step: _err(f"probe: {progress_line(index, step)}"),
            )
    document = to_json(
        result,
        target=TargetFacts(target.url, target.model, target.vllm_version, target.max_model_len),
        shape=shape,
        limits=limits,
        mode=plan.mode,
    )
    if args.json:
        json.dump(document, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(document))
    if args.report:
        write_report(Path(args.report), document)
        _err(f"probe: report written to {args.report}")
    if result.interrupted:
        return EXIT_INTERRUPTED
    if result.baseline is not None and not result.baseline.completed:
        return EXIT_NOTHING_COMPLETED
    return 0


def run(args: argparse.Namespace) -> int:
    """Entry point of ``probe``."""
    return asyncio.run(probe(args))
