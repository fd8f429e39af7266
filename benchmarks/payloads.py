"""Realistic vLLM ``/metrics`` payloads for benchmarks, built from the real 0.32 capture.

:func:`synthetic_dp_payload` turns the capture of one engine into the exposition of a
data-parallel deployment: every ``vllm:`` series with an ``engine`` label is repeated once per
engine (engine label set, values scaled so that no two engines look alike, histograms kept
cumulative, each family written engine after engine as prometheus_client writes it),
``cache_config_info`` reports the summed ``num_gpu_blocks`` on every engine as vLLM does, and the
served model name is a typical KServe path instead of ``tiny``. Families without an ``engine``
label (process, Python GC, HTTP, ``admission_rejections``) appear once, as in vLLM.

With the defaults (8 engines) the payload is 0.58 MB and 3,125 lines, the large case of the parse
benchmark; 16 engines make 1.14 MB.
Other benchmarks import it: ``from benchmarks.payloads import synthetic_dp_payload`` (run them
from the repository root, as ``python -m benchmarks.<name>`` or with the root on ``sys.path``).
"""

from __future__ import annotations

import re
from pathlib import Path

#: The real vLLM 0.32.0 capture the synthetic payload is built from.
REAL_CAPTURE = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "fixtures"
    / "vllm-metrics"
    / "vllm-0.32.0-cpu-after-load.prom"
)

#: A served model name as KServe writes it when the model is mounted from storage.
LONG_MODEL_NAME = (
    "/mnt/models/hub/models--meta-llama--Llama-3.3-70B-Instruct/snapshots/"
    "6f6073b423013f6a7d4d9f39144961bfbfbc386b"
)

_SAMPLE = re.compile(r"^(?P<name>[^{ ]+)(?P<labels>\{.*\})? (?P<value>\S+)$")
_ENGINE_LABEL = 'engine="0"'
#: Gauges that are ratios or states: scaling them would make them impossible values.
_UNSCALED = ("vllm:kv_cache_usage_perc", "vllm:engine_sleep_state", "vllm:cache_config_info")


def real_capture() -> str:
    """Return the real vLLM 0.32.0 capture (one engine, after a burst with 15 preemptions)."""
    return REAL_CAPTURE.read_text(encoding="utf-8")


def synthetic_dp_payload(
    *, engines: int = 8, model_name: str = LONG_MODEL_NAME, base: str | None = None
) -> str:
    """Build a data-parallel exposition with ``engines`` engines from a one-engine capture."""
    lines = (real_capture() if base is None else base).splitlines()
    out: list[str] = ["# synthetic: benchmarks/payloads.py, from vllm-0.32.0-cpu-after-load.prom"]
    block: list[str] = []  # the engine-labelled samples of one family, as one engine writes them
    for line in [*lines, "# end"]:
        if not line.startswith("#") and _ENGINE_LABEL in line:
            block.append(line)
            continue
        # prometheus_client writes a family child by child: engine 0's series, then engine 1's.
        for engine in range(engines):
            out.extend(
                _for_engine(sample, engine, engines=engines, model_name=model_name)
                for sample in block
            )
        block = []
        if line.startswith(("# SOURCE", "# STATE", "# end")):
            continue
        out.append(line.replace('model_name="tiny"', f'model_name="{model_name}"'))
    return "\n".join(out) + "\n"


def _for_engine(line: str, engine: int, *, engines: int, model_name: str) -> str:
    """The capture's engine-0 sample ``line`` as engine ``engine`` of ``engines`` writes it."""
    match = _SAMPLE.match(line)
    if match is None:
        raise ValueError(f"not a sample line of the capture: {line!r}")
    name, labels, value = match["name"], match["labels"] or "", float(match["value"])
    labels = labels.replace('model_name="tiny"', f'model_name="{model_name}"')
    labels = labels.replace(_ENGINE_LABEL, f'engine="{engine}"')
    if name == "vllm:cache_config_info":
        # vLLM reports the pool summed over engines, repeated on every engine's series.
        blocks = re.search(r'num_gpu_blocks="(\d+)"', labels)
        if blocks is not None:
            summed = int(blocks.group(1)) * engines
            labels = labels.replace(blocks.group(0), f'num_gpu_blocks="{summed}"')
    elif not (name.endswith("_created") or name.startswith(_UNSCALED)):
        # A per-engine factor keeps histograms cumulative and counters distinct per engine.
        value *= 1000 + 37 * engine
    return f"{name}{labels} {value!r}"
