"""The sweep's curves, drawn with matplotlib: a PNG, or a self-contained HTML page holding it.

Six panels against the load level (rate steps on a log axis): latency (TTFT and TPOT), requests
done per second, preemptions and waiting requests, KV usage, running requests against the
ceiling (and ``max_num_seqs``), and the sidecar's headroom. The knee is a green dashed line on
every panel, the first step past it a red dotted one, the ceiling a grey horizontal line.

matplotlib is an optional dependency (the ``report`` extra): it is imported only when a report is
asked for, and its absence is a one-line :class:`~exporter.errors.UsageError`. It is driven
through ``matplotlib.figure.Figure`` and the Agg canvas, never ``pyplot``, so nothing global (a
GUI backend, open figures) is touched; Pillow (a dependency of matplotlib) stores the picture in
64 colours, a third of the bytes.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import TYPE_CHECKING, Any

from exporter.errors import UsageError
from exporter.sweep.plan import Mode
from exporter.sweep.report import render

if TYPE_CHECKING:
    from pathlib import Path

    from matplotlib.axes import Axes

#: The pip extra that brings matplotlib.
EXTRA = "report"
_INSTALL = f"pip install 'vllm-headroom[{EXTRA}]'"
#: Report file kinds, by suffix.
SUFFIXES = (".html", ".htm", ".png")


def check_report_path(path: Path) -> None:
    """Raise :class:`UsageError` unless ``path`` is an HTML or PNG file and matplotlib is here."""
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(f"--report {path}: name an .html or .png file")
    try:
        import matplotlib  # noqa: F401, PLC0415 - optional dependency, imported on demand
    except ImportError:
        raise UsageError(f"--report needs matplotlib, which is not installed: {_INSTALL}") from None


def _rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    return list(document["steps"])


def _series(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
    return [float("nan") if r[key] is None else r[key] * scale for r in rows]


def _mark(ax: Axes, document: dict[str, Any], x: list[float], *, labelled: bool) -> None:
    """The knee and the first failure on a panel; the load levels as its ticks."""
    knee = document["knee"]
    if knee["level"] is not None:
        ax.axvline(
            knee["level"], color="tab:green", linestyle="--", linewidth=1.5,
            label="knee" if labelled else None,
        )  # fmt: skip
    if knee["first_failure_level"] is not None:
        ax.axvline(
            knee["first_failure_level"], color="tab:red", linestyle=":", linewidth=1.5,
            label="first step past the knee" if labelled else None,
        )  # fmt: skip
    if document["mode"] == Mode.RATE:
        ax.set_xscale("log")
    ax.set_xticks(x, [f"{level:g}" for level in x])
    ax.minorticks_off()
    ax.grid(visible=True, alpha=0.3)


def _running_panel(
    running: Axes, document: dict[str, Any], rows: list[dict[str, Any]], x: list[float]
) -> None:
    """Requests in flight and running against the ceiling (and ``max_num_seqs`` when near)."""
    ceiling = document["ceiling"]
    running.plot(x, _series(rows, "in_flight_mean"), "^-", label="in flight (client, mean)")
    running.plot(x, _series(rows, "running_mean"), "o-", label="running (mean)")
    running.plot(x, _series(rows, "running_max"), "s-", label="running (max)")
    if ceiling["sequences"] is not None:
        running.axhline(
            ceiling["sequences"], color="grey", linewidth=2, label="ceiling (p95 length)"
        )
    if ceiling["max_num_seqs"] is not None and ceiling["max_num_seqs"] != ceiling["sequences"]:
        top = max([r["running_max"] for r in rows if r["running_max"] is not None] or [0.0])
        if ceiling["max_num_seqs"] <= 2 * max(top, ceiling["sequences"] or 0):
            running.axhline(
                ceiling["max_num_seqs"], color="black", linestyle="-.", label="max_num_seqs"
            )
    running.set_ylabel("sequences")
    running.set_title("concurrency against the ceiling")


def draw_png(document: dict[str, Any], *, dpi: int = 80) -> bytes:
    """The six panels of a ``--json`` document as PNG bytes."""
    from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency

    rows = _rows(document)
    x = [r["level"] for r in rows]
    unit = "request rate (requests/s)" if document["mode"] == Mode.RATE else "concurrent requests"
    figure = Figure(figsize=(11, 10), dpi=dpi, layout="constrained")
    axes = figure.subplots(3, 2)
    target = document["target"]
    figure.suptitle(
        f"vllm-headroom probe: {target['model']} at {target['url']} "
        f"(vLLM {target['vllm_version'] or 'unknown'}), {document['driver']}"
    )
    latency, done = axes[0]
    pressure, usage = axes[1]
    running, headroom = axes[2]

    latency.plot(x, _series(rows, "ttft_p50_s", 1000), "o-", label="TTFT p50")
    latency.plot(x, _series(rows, "ttft_p95_s", 1000), "o-", label="TTFT p95")
    latency.plot(x, _series(rows, "tpot_p95_s", 1000), "s-", label="TPOT p95")
    latency.set_ylabel("milliseconds")
    latency.set_title("latency (client)")

    done.plot(x, _series(rows, "achieved_rps"), "o-", label="requests done/s")
    if document["mode"] == Mode.RATE:
        done.plot(x, x, color="grey", linewidth=1, label="offered")
    done.set_ylabel("requests/s")
    done.set_title("throughput")

    pressure.plot(
        x, _series(rows, "preemptions_per_s"), "o-", color="tab:red", label="preemptions/s"
    )
    pressure.plot(
        x, _series(rows, "waiting_mean"), "s-", color="tab:orange", label="waiting (mean)"
    )
    pressure.set_title("preemptions and queueing")

    usage.plot(x, _series(rows, "kv_usage_mean", 100), "o-", label="KV usage mean")
    usage.plot(x, _series(rows, "kv_usage_max", 100), "s-", label="KV usage max")
    usage.set_ylim(0, 105)
    usage.set_ylabel("% of usable blocks")
    usage.set_title("KV cache")

    _running_panel(running, document, rows, x)

    headroom.plot(x, _series(rows, "headroom_min"), "o-", label="headroom (lowest)")
    headroom.plot(x, _series(rows, "headroom_mean"), "s-", label="headroom (mean)")
    headroom.set_ylabel("more p95 sequences that fit")
    headroom.set_title("the sidecar's headroom")

    for ax in (latency, done, pressure, usage, running, headroom):
        _mark(ax, document, x, labelled=ax is latency)
        ax.set_xlabel(unit)
        ax.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return _compact(buffer.getvalue())


def _compact(png: bytes) -> bytes:
    """The picture in 64 colours (a third of the bytes; lines and text look the same)."""
    from PIL import Image  # noqa: PLC0415 - Pillow comes with matplotlib

    with Image.open(io.BytesIO(png)) as image:
        palette = image.convert("RGB").quantize(colors=64)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def html_page(document: dict[str, Any], png: bytes) -> str:
    """A self-contained page: the summary, the picture (inline) and the JSON document."""
    image = base64.b64encode(png).decode("ascii")
    target = document["target"]
    title = f"vllm-headroom probe: {target['model']} at {target['url']}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:1100px}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>"
        f"<pre>{html.escape(render(document))}</pre>"
        f'<img alt="the sweep\'s curves" style="max-width:100%" '
        f'src="data:image/png;base64,{image}">'
        "<details><summary>the --json document</summary>"
        f"<pre>{html.escape(json.dumps(document, indent=2, sort_keys=True))}</pre></details>"
        "</body></html>\n"
    )


def write_report(path: Path, document: dict[str, Any]) -> None:
    """Write the HTML page or the PNG, by ``path``'s suffix."""
    check_report_path(path)
    png = draw_png(document)
    try:
        if path.suffix.lower() == ".png":
            path.write_bytes(png)
        else:
            path.write_text(html_page(document, png), encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"cannot write {path}: {exc.strerror or exc}; choose another path"
        ) from None
