"""Accuracy of the sizing model on real vLLM start-ups, side by side with the naive method.

Reads ``benchmarks/data/kv-calibration/observations.csv`` and predicts each row's KV-cache tokens
from what a user knows before deploying: the architecture (the built-in catalogue, by the row's
``arch_model``), parameters, quantization, GPU memory, TP/PP, utilization, dtypes, block size,
max_model_len and vLLM version. Never the logged weights, activation or non-torch memory.

Truth: the "GPU KV cache size" tokens vLLM logged; where a row has none (vLLM 0.11 rows), the
tokens vLLM's own block arithmetic gives for the logged "Available KV cache memory".

Naive method: weights = parameters x bytes per parameter of the weight format / TP, a constant
4 GB overhead, and ``budget / (2 x layers x kv_heads/tp x head_dim x B)`` tokens.

Run: ``.venv/bin/python benchmarks/calibration.py`` (add ``--rows`` for the per-row table).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from exporter.sizing.catalog import find_model
from exporter.sizing.model import (
    Declined,
    Deployment,
    SizingResult,
    kv_bytes_per_element,
    resolve_model_dtype,
    size_deployment,
)
from exporter.sizing.overhead import GIB
from exporter.sizing.weights import dtype_bytes, weight_format
from exporter.vllm.version import parse_vllm_version

DATA = Path(__file__).resolve().parent / "data" / "kv-calibration"
NAIVE_OVERHEAD_BYTES = 4 * 10**9


@dataclass(frozen=True)
class Outcome:
    """One row's truth and both predictions, in tokens and GiB of KV budget."""

    row_id: str
    model: str
    truth_tokens: int
    ours_tokens: int
    naive_tokens: int
    truth_gib: float
    ours_gib: float
    naive_gib: float

    @property
    def ours_error(self) -> float:
        """Relative error of our token prediction."""
        return abs(self.ours_tokens - self.truth_tokens) / self.truth_tokens

    @property
    def naive_error(self) -> float:
        """Relative error of the naive token prediction."""
        return abs(self.naive_tokens - self.truth_tokens) / self.truth_tokens


def _quant(text: str) -> str | None:
    text = text.lower()
    for key in ("mxfp4", "gptq", "awq", "w8a8", "fp8"):
        if key in text:
            return key
    return None


def _pipeline(notes: str) -> int:
    marker = "pipeline_parallel="
    return int(notes.split(marker, 1)[1][0]) if marker in notes else 1


def deployment_for(row: dict[str, str]) -> Deployment:
    """The deployment a user would describe for this row (no logged memory figures)."""
    dtype = row["dtype"].split("(")[0].strip() or "auto"
    return Deployment(
        gpu_memory_bytes=int(float(row["gpu_mem_gib"]) * GIB),
        vllm_version=parse_vllm_version(row["vllm_version"]),
        gpu_memory_utilization=float(row["gpu_mem_util"]),
        tensor_parallel=int(row["tp"]),
        pipeline_parallel=_pipeline(row["notes"]),
        dtype=dtype,
        kv_cache_dtype=row["kv_cache_dtype"] or "auto",
        block_size=int(row["block_size"]),
        max_model_len=int(row["max_model_len"]),
        quantization=_quant(row["quant"]) or "none",
        gpu_name=row["gpu"].lower(),
        enforce_eager=row["enforce_eager"] == "True",
    )


def truth_tokens(row: dict[str, str], sized: SizingResult) -> int:
    """vLLM's logged tokens, or the tokens its block arithmetic gives for the logged memory."""
    if row["kv_tokens"]:
        return int(row["kv_tokens"])
    observed = replace(sized, kv_blocks=int(float(row["kv_mem_gib"]) * GIB) // sized.block_bytes)
    return observed.reported_capacity_tokens


def naive_tokens(row: dict[str, str], deployment: Deployment) -> tuple[int, int]:
    """The naive method's (tokens, budget bytes)."""
    tp = deployment.tensor_parallel * deployment.pipeline_parallel
    model_dtype = resolve_model_dtype(deployment.dtype, checkpoint_dtype="bfloat16")
    fmt = weight_format(deployment.quantization)
    per_param = fmt.bytes_per_param or dtype_bytes(model_dtype)
    weights = float(row["params_b"]) * 1e9 * per_param / tp
    usable = deployment.gpu_memory_bytes * (deployment.gpu_memory_utilization or 0.9)
    budget = int(usable - weights - NAIVE_OVERHEAD_BYTES)
    kv_b = kv_bytes_per_element(deployment.kv_cache_dtype, model_dtype=model_dtype)
    per_token = 2 * int(row["layers"]) * int(row["kv_heads"]) * int(row["head_dim"]) * kv_b / tp
    return max(0, int(budget / per_token)), budget


def evaluate(rows: list[dict[str, str]]) -> tuple[list[Outcome], list[tuple[str, str]]]:
    """Predict every row; return outcomes and (row id, reason) for the rows declined."""
    outcomes: list[Outcome] = []
    declined: list[tuple[str, str]] = []
    for row in rows:
        entry = find_model(row["arch_model"])
        if entry is None:
            declined.append((row["id"], f"{row['arch_model']} is not in the model catalogue"))
            continue
        deployment = deployment_for(row)
        sized = size_deployment(entry.arch(), deployment=deployment)
        if isinstance(sized, Declined):
            declined.append((row["id"], sized.reason))
            continue
        truth = truth_tokens(row, sized)
        naive, naive_budget = naive_tokens(row, deployment)
        outcomes.append(
            Outcome(
                row_id=row["id"],
                model=row["model"],
                truth_tokens=truth,
                ours_tokens=sized.reported_capacity_tokens,
                naive_tokens=naive,
                truth_gib=float(row["kv_mem_gib"]),
                ours_gib=sized.kv_budget_bytes / GIB,
                naive_gib=naive_budget / GIB,
            )
        )
    return outcomes, declined


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def report(outcomes: list[Outcome], declined: list[tuple[str, str]], *, rows: bool) -> str:
    """The side-by-side summary (and optionally the per-row table) as text."""
    lines = []
    if rows:
        lines.append(f"{'row':<5} {'model':<48} {'truth':>9} {'ours':>9} {'err':>7} {'naive':>9}")
        for o in outcomes:
            lines.append(
                f"{o.row_id:<5} {o.model[:48]:<48} {o.truth_tokens:>9} {o.ours_tokens:>9} "
                f"{o.ours_error:>7.1%} {o.naive_tokens:>9} ({o.naive_error:.1%})"
            )
        lines.append("")
    ours = [o.ours_error for o in outcomes]
    naive = [o.naive_error for o in outcomes]
    ours_gib = [abs(o.ours_gib - o.truth_gib) for o in outcomes]
    naive_gib = [abs(o.naive_gib - o.truth_gib) for o in outcomes]
    total = len(outcomes) + len(declined)
    lines.append(f"rows: {total}, predicted: {len(outcomes)}, declined: {len(declined)}")
    lines.append(f"{'KV tokens, relative error':<36} {'ours':>8} {'naive':>8}")
    median_ours, median_naive = statistics.median(ours), statistics.median(naive)
    lines.append(f"{'  median':<36} {median_ours:>8.1%} {median_naive:>8.1%}")
    lines.append(f"{'  p90':<36} {_p90(ours):>8.1%} {_p90(naive):>8.1%}")
    within = sum(e <= 0.10 for e in ours) / len(ours)
    within_naive = sum(e <= 0.10 for e in naive) / len(naive)
    lines.append(f"{'  rows within 10%':<36} {within:>8.1%} {within_naive:>8.1%}")
    lines.append(
        f"{'KV budget, median absolute error':<36} {statistics.median(ours_gib):>6.2f} G "
        f"{statistics.median(naive_gib):>6.2f} G"
    )
    for row_id, reason in declined:
        lines.append(f"declined {row_id}: {reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="also print every row")
    parser.add_argument("--csv", type=Path, default=DATA / "observations.csv")
    args = parser.parse_args(argv)
    with args.csv.open(encoding="utf-8") as handle:
        data = list(csv.DictReader(handle))
    outcomes, declined = evaluate(data)
    print(report(outcomes, declined, rows=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
