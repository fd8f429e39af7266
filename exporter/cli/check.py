"""``vllm-headroom check``: one-shot analysis of a live vLLM or a saved ``/metrics`` capture.

The same parsing, derivation and prediction as the sidecar, over a single sample: capacity,
tokens in use, queue, preemptions and context quantiles since vLLM started, and what the
sizing model predicts. ``--json`` prints one object with stable keys (``docs/cli.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from exporter.boundedread import FileReadError, read_bounded
from exporter.cli.numbers import NO_CAP, positive, whole
from exporter.core.ceiling import QueueCaps, RunningLimit
from exporter.core.derive import Sample, WindowSettings, derive_target
from exporter.core.reasons import AdmissionReason, Limit, MaxNumSeqsSource, PredictionState
from exporter.core.views import PredictionView, TargetInfo
from exporter.errors import ParseError, SourceError, UsageError
from exporter.service.allowlist import AllowlistError, check_url
from exporter.service.metricdefs import Row, check_values
from exporter.sizing.catalog import find_gpu
from exporter.sizing.limits import LimitInputs, resolve_running_limit
from exporter.sizing.overhead import GIB
from exporter.sizing.predictor import ModelPredictor
from exporter.vllm.client import VllmClient
from exporter.vllm.coverage import missing_families, unusable_reason
from exporter.vllm.metrics import parse_vllm_metrics
from exporter.vllm.version import guess_vllm_version, parse_vllm_version

if TYPE_CHECKING:
    from exporter.core.derive import EngineDerived
    from exporter.core.snapshot import EngineMetrics, VllmSnapshot

#: Largest capture or payload ``check`` reads.
MAX_BYTES = 64 * 1024 * 1024


NAME = "check"
HELP = "analyse a running vLLM (URL) or a saved /metrics capture (FILE) once"
DESCRIPTION = (
    "Read one vLLM /metrics payload, from a running server or a saved file, and report "
    "capacity, usage, queue, preemptions, context lengths since vLLM started, and what "
    "the sizing model predicts."
)


#: The largest ``--gpu-mem-gib`` taken: no GPU holds a PiB (nor may a byte count overflow).
MAX_GPU_MEM_GIB = 1024.0 * 1024.0
#: The longest ``--timeout``: a day (a longer wait is a typo, and timers refuse huge values).
MAX_TIMEOUT_S = 86_400.0


def _version(text: str) -> str:
    """An argparse type: a vLLM version ``plan`` would read (MAJOR.MINOR[.PATCH])."""
    try:
        parse_vllm_version(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``check``; every number is checked as it is read (one line when bad)."""
    parser.add_argument("source", metavar="URL|FILE", help="vLLM base URL, or a /metrics file")
    parser.add_argument("--model", help="model directory, config.json, cached HF id or name")
    parser.add_argument("--hf-home", help="Hugging Face cache root")
    parser.add_argument("--gpu", help="GPU name from the catalogue (e.g. H100), for the prediction")
    parser.add_argument(
        "--gpu-mem-gib",
        type=positive("GiB", MAX_GPU_MEM_GIB, "80"),
        help="CUDA-visible memory of one GPU in GiB",
    )
    parser.add_argument(
        "--tp", type=whole("GPUs", 1, "2"), help="vLLM --tensor-parallel-size (default 1)"
    )
    parser.add_argument(
        "--pp", type=whole("GPUs", 1, "2"), help="vLLM --pipeline-parallel-size (default 1)"
    )
    parser.add_argument(
        "--max-model-len",
        type=whole("tokens", 1, "8192"),
        help="vLLM --max-model-len (URLs: overrides /v1/models)",
    )
    parser.add_argument(
        "--vllm-version", type=_version, help="vLLM version (files only; URLs ask /version)"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=whole("sequences", 1, "256"),
        help="vLLM --max-num-seqs (default: vLLM's default for its version and GPU)",
    )
    parser.add_argument(
        "--max-num-queued-reqs",
        type=whole("requests", 0, "1024", otherwise=NO_CAP),
        help="vLLM --max-num-queued-reqs (0.32+; default: no cap)",
    )
    parser.add_argument(
        "--max-num-queued-tokens",
        type=whole("tokens", 0, "131072", otherwise=NO_CAP),
        help="vLLM --max-num-queued-tokens (0.32+; default: no cap)",
    )
    parser.add_argument(
        "--timeout",
        type=positive("seconds", MAX_TIMEOUT_S, "5"),
        default=5.0,
        help="seconds per HTTP request, or to read FILE (5)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@dataclass(frozen=True, slots=True)
class CheckReport:
    """Everything ``check`` found, as plain data."""

    source: str
    snapshot: VllmSnapshot
    info: TargetInfo
    engines: tuple[EngineDerived, ...]
    prediction: PredictionView


def analyse(
    snapshot: VllmSnapshot,
    *,
    source: str,
    info: TargetInfo,
    prediction: PredictionView,
    running_limit: RunningLimit | None = None,
) -> CheckReport:
    """Derive the one-sample figures of a snapshot (pure)."""
    derived = derive_target(
        [Sample(0.0, snapshot)],
        windows=WindowSettings(),
        predicted_capacity_tokens=prediction.capacity_tokens,
        pool_layout=prediction.layout,
        max_model_len=info.max_model_len,
        running_limit=running_limit,
    )
    return CheckReport(source, snapshot, info, derived.engines, prediction)


def _total(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def to_json(report: CheckReport) -> dict[str, Any]:
    """The ``--json`` object (stable keys; absent figures are ``null``).

    The derived figures take their keys from the metric table (``check_key``), the same table
    the exporter's gauges come from; the rest are vLLM's own counters and the target's facts.
    """
    engines = report.engines
    metrics = report.snapshot.engines
    engine_objects = []
    for e in engines:
        raw = metrics[e.engine]
        engine_objects.append(
            {
                "engine": e.engine,
                "model_name": e.model_name,
                **check_values(Row.ENGINE, e),
                "kv_pool_tokens": (
                    e.kv_blocks * e.kv_block_size_tokens
                    if e.kv_blocks is not None and e.kv_block_size_tokens is not None
                    else None
                ),
                "p95_ceiling_limited_by": e.p95_ceiling_limit,
                "p95_available_limited_by": e.p95_available_limit,
                "num_preemptions": raw.preemptions_total,
                "num_requests_finished": raw.requests_finished_total,
                "context_tokens": (
                    {
                        "p50": e.context_p50_tokens,
                        "p95": e.context_p95_tokens,
                        "p99": e.context_p99_tokens,
                        "mean": e.context_mean_tokens,
                    }
                    if e.context is not None
                    else None
                ),
            }
        )
    p = report.prediction
    return {
        "source": report.source,
        "vllm_version": report.info.vllm_version,
        "vllm_version_guess": guess_vllm_version(report.snapshot),
        "model": report.info.model_id,
        "max_model_len": report.info.max_model_len,
        "kv_capacity_tokens": _total([e.kv_capacity_tokens for e in engines]),
        "kv_tokens_used": _total([e.kv_used_tokens for e in engines]),
        "num_requests_running": _total([e.requests_running for e in engines]),
        "num_requests_waiting": _total([e.requests_waiting for e in engines]),
        "num_preemptions": _total([metrics[e.engine].preemptions_total for e in engines]),
        "num_admission_rejections": report.snapshot.admission_rejections_total,
        "num_admission_rejections_by_reason": dict(report.snapshot.admission_rejections_by_reason),
        "engines": engine_objects,
        "missing_families": [
            {"family": needed.family, "names": list(needed.names), "needed_for": needed.needed_for}
            for needed in missing_families(report.snapshot.families)
        ],
        "dropped_samples": dict(report.snapshot.dropped),
        "prediction": {
            "state": p.state,
            "message": p.message,
            **check_values(Row.PREDICTION, p),
            "kv_capacity_tokens": p.capacity_tokens,
            "inputs": dict(p.info),
        },
    }


def _fmt(value: float | None, unit: str = "", *, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".rstrip()


def _limit_value(by_origin: dict[str, float]) -> float | None:
    return next(iter(by_origin.values()), None)


def _max_num_seqs(by_origin: dict[str, float]) -> str:
    """The limit, marked where it is vLLM's default assumed, not read from the server."""
    value = _fmt(_limit_value(by_origin))
    if MaxNumSeqsSource.DEFAULT in by_origin:
        return f"{value} assumed: vLLM's default"
    return value


def _version_clue(data: dict[str, Any]) -> str:
    guess = data["vllm_version_guess"]
    if guess == "unknown":
        return "its metrics do not tell the version"
    return f"metrics look like {guess}"


def _no_context(raw: EngineMetrics) -> str:
    """Why an engine has no context figures, in words that are true of its payload."""
    absent = [
        name
        for name, histogram in (("prompt", raw.prompt_tokens), ("output", raw.generation_tokens))
        if histogram is None
    ]
    if absent:
        return f"n/a: no {' and no '.join(absent)} token histogram in the payload"
    if not raw.prompt_tokens or not raw.prompt_tokens.count:
        return "no finished requests yet"
    return "n/a: the token histograms give no estimate"


def _dropped(by_reason: dict[str, int]) -> str:
    """The samples the parser left out, by reason (``headroom_dropped_samples``'s reasons)."""
    total = sum(by_reason.values())
    counts = ", ".join(f"{count:,} {reason}" for reason, count in by_reason.items())
    samples, feed = ("sample", "it feeds") if total == 1 else ("samples", "they feed")
    return f"dropped: {total:,} {samples} of the payload ({counts}); what {feed} is n/a"


def _gib(value: float | None) -> str:
    return _fmt((value or 0) / GIB, "GiB", digits=2)


def shown(text: str) -> str:
    """Text a target sent, safe on a terminal: what would not print (escapes, NUL) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _refusals(data: dict[str, Any]) -> str:
    """The admission line: the refusals, and the cap each reason names (the flag to raise)."""
    caps = [
        f"{_fmt(count)} at {reason} (--{reason.replace('_', '-')})"  # named after its setting
        if reason in set(AdmissionReason)
        else f"{_fmt(count)} at {shown(reason)}"  # a reason of a later vLLM: no flag guessed
        for reason, count in data["num_admission_rejections_by_reason"].items()
        if count
    ]
    refused = f"admission: {_fmt(data['num_admission_rejections'])} requests refused at a queue cap"
    if not caps:
        flags = "--max-num-queued-reqs/--max-num-queued-tokens"
        return f"{refused} since start (raise {flags} or add replicas)"
    flags = "its flag" if len(caps) == 1 else "their flags"
    return f"{refused} since start, {', '.join(caps)}: raise {flags} or add replicas"


def _context_lines(e: dict[str, Any], raw: EngineMetrics) -> list[str]:
    """An engine's context figures and the sequences they fit, or why it has none."""
    context = e["context_tokens"]
    if context is None:
        return [f"  context since start    {_no_context(raw)}"]
    lines = [
        f"  context since start    p50 {_fmt(context['p50'])}, p95 {_fmt(context['p95'])},"
        f" p99 {_fmt(context['p99'])}, mean {_fmt(context['mean'])} tokens",
        f"  sequences that fit     {_fmt(e['p95_ceiling_sequences'])} at p95"
        f" (limited by {e['p95_ceiling_limited_by'] or 'n/a'}),"
        f" {_fmt(e['mean_ceiling_sequences'])} at mean;"
        f" {_fmt(e['p95_available_sequences'])} more p95 sequences fit now",
    ]
    if e["p95_ceiling_limited_by"] == Limit.MAX_NUM_SEQS:
        lines.append(
            f"                         the KV cache alone would hold "
            f"{_fmt(e['p95_kv_ceiling_sequences'])}"
        )
    if e["p95_effective_ceiling_sequences"] is not None:
        lines.append(
            f"  with shared prefixes   {_fmt(e['p95_effective_ceiling_sequences'])} at p95"
            f" (prefix cache hits {_fmt((e['prefix_cache_hit_ratio'] or 0) * 100)}%)"
        )
    return lines


def render(report: CheckReport) -> str:
    """The human report, one block per engine, then the prediction: the ``--json`` figures."""
    data = to_json(report)
    model, version = data["model"], data["vllm_version"]
    lines = [
        f"{report.source}",
        f"  model {shown(model) if model else 'unknown'}, "
        f"vLLM {shown(version) if version else 'unknown'} ({_version_clue(data)})",
        "",
    ]
    for e in data["engines"]:
        named = shown(e["model_name"]) if e["model_name"] else "unnamed"
        lines.append(f"engine {shown(e['engine'])} ({named})")
        ratio = e["kv_usage_ratio"]
        usage = f"{ratio:.1%}" if ratio is not None else "n/a"
        lines += [
            f"  KV capacity            {_fmt(e['kv_capacity_tokens'], 'tokens')}"
            f" ({_fmt(e['kv_blocks'], 'blocks')} of {_fmt(e['kv_block_size_tokens'])}, usable "
            f"{_fmt(e['kv_usable_tokens'])})",
            f"  in use                 {_fmt(e['kv_tokens_used'], 'tokens')} ({usage}),"
            f" free {_fmt(e['kv_tokens_free'], 'tokens')}",
            f"  requests               {_fmt(e['num_requests_running'])} running"
            f" ({_fmt(e['num_sequences_running'])} sequences, max_num_seqs"
            f" {_max_num_seqs(e['max_num_seqs'])}),"
            f" {_fmt(e['num_requests_waiting'])} waiting",
            f"  preemptions            {_fmt(e['num_preemptions'])} since start,"
            f" {_fmt(e['num_requests_finished'])} requests finished",
        ]
        lines += _context_lines(e, report.snapshot.engines[e["engine"]])
        if e["kv_capacity_error_ratio"] is not None:
            lines.append(
                f"  predicted capacity     {_fmt(e['kv_capacity_predicted_tokens'], 'tokens')}"
                f" ({e['kv_capacity_error_ratio']:+.1%} against vLLM's)"
            )
        lines.append("")
    if data["num_admission_rejections"]:
        lines += [_refusals(data), ""]
    if data["dropped_samples"]:
        lines += [_dropped(data["dropped_samples"]), ""]
    for missing in data["missing_families"]:
        names = " or ".join(missing["names"])
        lines.append(f"missing: {names} (needed for {missing['needed_for']})")
    if data["missing_families"]:
        lines.append("")
    p = data["prediction"]
    if p["state"] == PredictionState.OK:
        lines.append(
            f"prediction: {_fmt(p['bytes_per_token'], 'bytes')} per token per GPU, weights "
            f"{_gib(p['weights_bytes'])}, overhead {_gib(p['overhead_bytes'])}, KV budget "
            f"{_gib(p['kv_budget_bytes'])}"
        )
        if p["message"]:
            lines.append(f"  note: {p['message']}")
    else:
        lines.append(f"prediction: unavailable ({p['state']}) {p['message']}".rstrip())
    return "\n".join(lines) + "\n"


_LIKE = "http://127.0.0.1:8000"


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


async def _fetch(url: str, timeout: float) -> tuple[bytes, TargetInfo, list[str]]:
    """Read /metrics, /v1/models and /version; the last two may fail (noted, not fatal)."""
    notes: list[str] = []
    async with httpx.AsyncClient(trust_env=False) as http:
        client = VllmClient(url, client=http, timeout_seconds=timeout, max_bytes=MAX_BYTES)
        try:
            payload = await client.fetch_metrics()
        except SourceError as exc:
            msg = f"cannot read {url}/metrics ({exc.reason}): is vLLM running there?"
            raise UsageError(msg) from None
        model_id = root = version = None
        max_len = None
        try:
            models = await client.fetch_models()
            model_id, root, max_len = models.model_id, models.root, models.max_model_len
        except SourceError as exc:
            notes.append(f"/v1/models: {exc}")
        try:
            version = await client.fetch_version()
        except SourceError as exc:
            notes.append(f"/version: {exc}")
    return payload, TargetInfo(model_id, root, max_len, version), notes


def _read_file(path: Path, timeout: float) -> bytes:
    """The capture: at most MAX_BYTES, within ``timeout`` seconds, whatever kind of file it is."""
    try:
        return read_bounded(path, max_bytes=MAX_BYTES, timeout_s=timeout)
    except FileReadError as exc:
        raise UsageError(f"{exc}; give a vLLM URL or a /metrics file") from None


def _read_source(args: argparse.Namespace) -> tuple[VllmSnapshot, TargetInfo, list[str]]:
    """The parsed payload and target facts of a URL or a file (UsageError when unusable)."""
    source: str = args.source
    notes: list[str] = []
    if _is_url(source):
        try:
            url = check_url(source)
        except AllowlistError as exc:
            raise UsageError(f"URL {shown(source[:200])!r}: {exc}") from None
        except ValueError as exc:  # urlsplit's own: "Invalid IPv6 URL"
            msg = f"URL {shown(source[:200])!r} cannot be read ({exc}): give one like {_LIKE}"
            raise UsageError(msg) from None
        payload, info, notes = asyncio.run(_fetch(url, args.timeout))
        if args.max_model_len is not None:
            info = TargetInfo(info.model_id, info.model_root, args.max_model_len, info.vllm_version)
    else:
        payload = _read_file(Path(source), args.timeout)
        info = TargetInfo(args.model, args.model, args.max_model_len, args.vllm_version)
    try:
        snapshot = parse_vllm_metrics(payload)
    except ParseError as exc:
        raise UsageError(f"{source}: {exc}") from None
    unusable = unusable_reason(payload, snapshot.families if snapshot.engines else ())
    if unusable is not None:
        raise UsageError(f"{source} {unusable}")
    return snapshot, info, notes


def _predict(
    args: argparse.Namespace, snapshot: VllmSnapshot, info: TargetInfo, notes: list[str]
) -> PredictionView:
    """The sizing model's view of the target, from the flags and what vLLM said."""
    if not (args.model or info.model_root or info.model_id):
        return PredictionView(
            state="model_not_found", message="give --model to compare with a prediction"
        )
    gpu_bytes = find_gpu(args.gpu).memory_bytes if args.gpu else _gpu_mem_bytes(args)
    predictor = ModelPredictor(
        model=args.model,
        hf_home=Path(args.hf_home) if args.hf_home else None,
        tensor_parallel=args.tp,
        pipeline_parallel=args.pp,
        gpu_memory_bytes=gpu_bytes,
    )
    failure = predictor.load(info)
    if failure is not None:
        notes.append(f"model: {failure}")
    view = predictor.predict(snapshot, info, ())
    if view.state == PredictionState.NO_GPU_MEMORY:
        # The predictor's words are the sidecar's (NVML, its setting): check reads flags.
        return replace(view, message=NO_GPU_MEMORY)
    return view


#: ``check``'s own words for a prediction without GPU memory (it reads no NVML).
NO_GPU_MEMORY = "give --gpu NAME (the catalogue) or --gpu-mem-gib to size the KV cache"


def _gpu_mem_bytes(args: argparse.Namespace) -> int | None:
    """``--gpu-mem-gib`` in bytes (finite and in range: checked as the flag was read)."""
    return None if args.gpu_mem_gib is None else int(args.gpu_mem_gib * GIB)


def _running_limit(
    args: argparse.Namespace, snapshot: VllmSnapshot, info: TargetInfo
) -> RunningLimit:
    """``--max-num-seqs``, else vLLM's default for the version and GPU the flags give."""
    gpu = find_gpu(args.gpu) if args.gpu else None
    memory = gpu.memory_bytes if gpu else _gpu_mem_bytes(args)
    cache = next((e.cache_config for e in snapshot.engines.values() if e.cache_config), None)
    return resolve_running_limit(
        LimitInputs(
            setting=args.max_num_seqs,
            vllm_version=info.vllm_version,
            gpu_memory_bytes=memory,
            gpu_name=gpu.name if gpu else None,
            tensor_parallel=args.tp,
            pipeline_parallel=args.pp,
            max_model_len=info.max_model_len,
            cache_config=cache,
            queue_caps=QueueCaps(args.max_num_queued_reqs, args.max_num_queued_tokens),
        )
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``check``."""
    snapshot, info, notes = _read_source(args)
    limit = _running_limit(args, snapshot, info)
    prediction = _predict(args, snapshot, info, notes)
    report = analyse(
        snapshot, source=args.source, info=info, prediction=prediction, running_limit=limit
    )
    if args.json:
        json.dump(to_json(report), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(report))
        for note in notes:
            sys.stdout.write(f"note: {note}\n")
    return 0
