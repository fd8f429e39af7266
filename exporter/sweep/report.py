"""The sweep's answer as text and as the ``--json`` document (stable keys, ``null`` when absent).

Pure: a :class:`~exporter.sweep.runner.SweepResult` and the facts of the target in, a string or
a plain dict out. The HTML and PNG report (:mod:`exporter.sweep.figure`) draws the same dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from exporter.sweep.knee import Binding
from exporter.sweep.plan import Mode

if TYPE_CHECKING:
    from exporter.sweep.evaluate import Limits, StepResult
    from exporter.sweep.runner import SweepResult
    from exporter.sweep.shape import TrafficShape

#: Version of the ``--json`` document; bumped when a key changes meaning or goes away.
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class TargetFacts:
    """What the report says about the target besides the sweep."""

    url: str
    model: str
    vllm_version: str | None = None
    max_model_len: int | None = None


def _num(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:,.0f} ms"
    return f"{value:,.2f} s"


def progress_line(index: int | None, step: StepResult) -> str:
    """One line per finished step while the sweep runs."""
    name = "baseline" if index is None else f"step {index + 1}"
    verdict = "ok" if step.ok else "BROKE: " + "; ".join(step.violations)
    return (
        f"{name} ({step.load.describe()}): {_num(step.achieved_rps, 2)} req/s done, in flight "
        f"{_num(step.in_flight_mean, 1)}, running {_num(step.running_mean, 1)} (max "
        f"{_num(step.running_max)}), waiting "
        f"{_num(step.waiting_mean, 1)}, KV max {_num(_pct(step.kv_usage_max))}%, preemptions "
        f"{_num(step.preemptions)}, TTFT p95 {_seconds(step.ttft_p95_s)} -> {verdict}"
    )


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def step_json(step: StepResult) -> dict[str, Any]:
    """One step as a JSON object."""
    document = asdict(step)
    load = document.pop("load")
    document = {"level": load["level"], "mode": str(load["mode"]), **document}
    document["violations"] = list(step.violations)
    document["ok"] = step.ok
    return document


def shape_json(shape: TrafficShape) -> dict[str, Any]:
    """The traffic shape's summary (not its every request)."""
    return {
        "source": shape.source,
        "requests": len(shape.requests),
        "mean_prompt_tokens": shape.mean_prompt_tokens,
        "mean_output_tokens": shape.mean_output_tokens,
        "mean_context_tokens": shape.mean_context_tokens,
        "p50_context_tokens": shape.context_quantile(0.5),
        "p95_context_tokens": shape.context_quantile(0.95),
        "max_context_tokens": shape.max_context_tokens,
    }


def to_json(
    result: SweepResult, *, target: TargetFacts, shape: TrafficShape, limits: Limits, mode: Mode
) -> dict[str, Any]:
    """The ``--json`` document (``docs/probe.md`` lists every key)."""
    knee = result.knee
    first_failure = (
        result.steps[knee.first_failure].load.level if knee.first_failure is not None else None
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "target": asdict(target),
        "driver": result.driver,
        "mode": str(mode),
        "shape": shape_json(shape),
        "limits": asdict(limits),
        "ceiling": asdict(knee.ceiling),
        "levels": list(result.levels),
        "baseline": step_json(result.baseline) if result.baseline is not None else None,
        "steps": [step_json(s) for s in result.steps],
        "knee": {
            "level": knee.load.level if knee.load is not None else None,
            "step": knee.index,
            "achieved_rps": knee.achieved_rps,
            "in_flight_mean": knee.in_flight_mean,
            "running_mean": knee.running_mean,
            "running_max": knee.running_max,
            "ceiling_sequences": knee.ceiling.sequences,
            "usable_ratio": knee.usable_ratio,
            "binding": str(knee.binding),
            "first_failure_level": first_failure,
            "failure_reasons": list(knee.failure_reasons),
            "saturation_running": knee.saturation_running,
            "note": knee.note,
        },
        "ended": result.ended,
        "interrupted": result.interrupted,
        "idle_after": result.idle_after,
        "elapsed_s": result.elapsed_s,
        "requests_sent": result.requests_sent,
        "single_latency_s": result.single_latency_s,
        "notes": list(result.notes),
    }


_BINDING_WORDS = {
    Binding.KV_CACHE: "the KV cache (vLLM preempted, or queued with the pool full)",
    Binding.MAX_NUM_SEQS: "max_num_seqs (running sat at the scheduler's limit, requests queued)",
    Binding.COMPUTE: "compute (latency or queueing with seats and KV blocks to spare)",
    Binding.ERRORS: "failed requests",
    Binding.NOT_REACHED: "none reached (no step broke a limit)",
}


def _unit(mode: str) -> str:
    return "req/s" if mode == Mode.RATE else "concurrent"


def render(document: dict[str, Any]) -> str:
    """The terminal summary of a ``--json`` document."""
    target = document["target"]
    shape = document["shape"]
    ceiling = document["ceiling"]
    knee = document["knee"]
    mode = document["mode"]
    lines = [
        f"probe of {target['url']} (model {target['model']}, vLLM "
        f"{target['vllm_version'] or 'unknown'}) with {document['driver']}, {mode} steps",
        f"  traffic shape  {shape['source']}",
        f"                 mean {_num(shape['mean_prompt_tokens'])} prompt + "
        f"{_num(shape['mean_output_tokens'])} output tokens; context p50 "
        f"{_num(shape['p50_context_tokens'])}, p95 {_num(shape['p95_context_tokens'])}",
        f"  ceiling        {_num(ceiling['sequences'])} sequences of p95 length "
        f"(limited by {ceiling['limited_by'] or '-'}): KV pool {_num(ceiling['usable_tokens'])} "
        f"usable tokens holds {_num(ceiling['kv_p95_sequences'])} at p95, "
        f"{_num(ceiling['kv_mean_sequences'])} at the mean; max_num_seqs "
        f"{_num(ceiling['max_num_seqs'])} ({ceiling['max_num_seqs_source'] or 'unknown'})",
        "",
        f"  {'load':>14} {'done/s':>7} {'in flight':>9} {'running':>13} {'waiting':>8} "
        f"{'KV max':>7} {'preempt':>8} {'TTFT p95':>9} {'TPOT p95':>9} {'headroom':>8}  verdict",
    ]
    rows = ([document["baseline"]] if document["baseline"] else []) + document["steps"]
    for i, step in enumerate(rows):
        label = f"{step['level']:g} {_unit(step['mode'])}"
        if document["baseline"] and i == 0:
            label = "baseline"
        verdict = "ok" if step["ok"] else "; ".join(step["violations"])
        lines.append(
            f"  {label:>14} {_num(step['achieved_rps'], 2):>7} "
            f"{_num(step['in_flight_mean'], 1):>9} "
            f"{_num(step['running_mean'], 1):>6}/{_num(step['running_max']):<6} "
            f"{_num(step['waiting_mean'], 1):>8} {_num(_pct(step['kv_usage_max'])):>6}% "
            f"{_num(step['preemptions']):>8} {_seconds(step['ttft_p95_s']):>9} "
            f"{_seconds(step['tpot_p95_s']):>9} {_num(step['headroom_min']):>8}  {verdict}"
        )
    lines.append("")
    if knee["level"] is not None:
        share = knee["usable_ratio"]
        lines.append(
            f"knee: {knee['level']:g} {_unit(mode)} ({_num(knee['achieved_rps'], 2)} req/s done), "
            f"{_num(knee['in_flight_mean'], 1)} requests in flight on average"
            + (
                f" = {share:.0%} of the {_num(knee['ceiling_sequences'])}-sequence ceiling"
                if share is not None
                else ""
            )
            + f"; vLLM ran {_num(knee['running_mean'], 1)} on average, "
            f"{_num(knee['running_max'])} at most"
        )
    else:
        lines.append("knee: not found")
    binding = Binding(knee["binding"])
    lines.append(f"binding limit: {_BINDING_WORDS[binding]}")
    if knee["first_failure_level"] is not None:
        lines.append(
            f"  first step past the knee: {knee['first_failure_level']:g} {_unit(mode)}: "
            + "; ".join(knee["failure_reasons"])
        )
    if knee["note"]:
        lines.append(f"note: {knee['note']}")
    for note in document["notes"]:
        lines.append(f"note: {note}")
    idle = document["idle_after"]
    idle_text = {True: "idle", False: "STILL BUSY", None: "unknown"}[idle]
    lines.append(
        f"ended: {document['ended']} after {document['elapsed_s']:.0f} s, "
        f"{document['requests_sent']:,} requests; target {idle_text}"
    )
    return "\n".join(lines) + "\n"
