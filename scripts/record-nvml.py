#!/usr/bin/env python3
"""Record real NVML readings to the JSON format that RecordedGpuReader replays.

Run on a machine with an NVIDIA driver, from the repository root:

    .venv/bin/python scripts/record-nvml.py --samples 3 --interval 5 --out capture.json

It reads every GPU NVML sees (or only ``--gpu`` UUIDs/indices) through ``NvmlGpuReader``, the
same code path the sidecar uses, so a capture holds NVML's numbers verbatim: memory v2 with the
driver reservation (or v1 on old drivers), compute and graphics processes, per-GPU failures.
The file says ``"source": "captured"`` and names the driver version in its description. Run a
vLLM on the GPUs first to capture something worth replaying. Exit code 2 on bad flags, 1 if NVML
was unavailable for every sample (the file is still written: that is a valid recording too).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from exporter.errors import UsageError
from exporter.gpu.model import ALL_GPUS, GpuSelection
from exporter.gpu.nvml import NvmlGpuReader
from exporter.gpu.recording import Recording, recording_to_json, sample_from_snapshot
from exporter.gpu.visibility import parse_gpu_selectors


def _driver_version() -> str:
    """The NVIDIA driver version, or a word saying why it is unknown."""
    try:
        import pynvml  # noqa: PLC0415 - only this helper needs the raw bindings

        pynvml.nvmlInit()
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - a description field, never worth a crash
        return f"unknown ({type(exc).__name__})"


def main(argv: list[str] | None = None) -> int:
    """Record ``--samples`` reads ``--interval`` seconds apart into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--samples", type=int, default=3, help="reads to record (default 3)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between reads")
    parser.add_argument(
        "--gpu",
        action="append",
        default=[],
        help="a GPU UUID or index to record (repeatable; default: every GPU NVML sees)",
    )
    parser.add_argument("--description", default="", help="what was running, for the reader")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.interval < 0:
        parser.error("--samples must be at least 1 and --interval not negative")
    try:
        selection: GpuSelection = parse_gpu_selectors(args.gpu) if args.gpu else ALL_GPUS
    except UsageError as exc:
        if any(entry.strip().lower() == "all" for entry in args.gpu):
            parser.error("--gpu all: leave --gpu out to record every GPU NVML sees")
        parser.error(str(exc))

    reader = NvmlGpuReader()
    samples = []
    start = time.monotonic()
    try:
        for number in range(args.samples):
            if number:
                time.sleep(args.interval)
            snapshot = reader.read(selection)
            samples.append(sample_from_snapshot(snapshot, t=round(time.monotonic() - start, 3)))
            state = (
                f"unavailable ({snapshot.unavailable.reason})"
                if snapshot.unavailable
                else f"{len(snapshot.gpus)} GPU(s), {len(snapshot.errors)} error(s)"
            )
            print(f"sample {number + 1}/{args.samples}: {state}", file=sys.stderr)
    finally:
        reader.close()

    description = (
        f"Captured with NVIDIA driver {_driver_version()} on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}. {args.description}"
    ).strip()
    recording = Recording(source="captured", description=description, samples=tuple(samples))
    args.out.write_text(recording_to_json(recording), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 1 if all(sample.unavailable is not None for sample in samples) else 0


if __name__ == "__main__":
    sys.exit(main())
