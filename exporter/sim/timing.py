"""How long one simulated engine step takes: a two-term roofline, deliberately simple.

One vLLM step runs the whole batch through the model once. On a GPU that costs the larger of

- **memory time**: every weight is read once, plus the KV cache of every scheduled token's
  context (attention reads all earlier tokens of its sequence):
  ``(weights_bytes + context_tokens x kv_bytes_per_token) / (bandwidth x memory_efficiency)``;
- **compute time**: about ``2 x parameters`` FLOPs per scheduled token (the matrix multiplies;
  attention FLOPs are left out): ``2 x params x tokens / (peak_flops x compute_efficiency)``;

plus a fixed per-step overhead (scheduling, sampling, launches). Decode steps are memory-bound and
prefill chunks compute-bound, which is what makes vLLM's throughput look the way it does.

For the default scenario (8.03 B parameters, 14.99 GiB of weights, H100 at 80 % of 3.35 TB/s and
40 % of 989 TFLOP/s) this gives about 8 ms per step for one short sequence (about 125 tokens/s for a
single stream), about 30 ms for a decode batch holding the full 456k-token pool (about 3,000 to
8,000 tokens/s depending on batch size), and about 0.34 s for a full 8,192-token prefill chunk
(about 24,000 prompt tokens/s): in the range published H100 benchmarks report for an 8B model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.sim.scenario import SimGpu, SimModel


def step_duration_s(
    gpu: SimGpu, model: SimModel, *, scheduled_tokens: int, context_tokens: int
) -> float:
    """Return the seconds one engine step takes.

    ``scheduled_tokens`` is the number of tokens the step computes (prefill chunks plus one per
    decoding sequence); ``context_tokens`` is the sum, over scheduled sequences, of the tokens
    whose KV the step attends to (its computed tokens plus the new ones).
    """
    bytes_read = model.weights_bytes + context_tokens * model.bytes_per_token
    memory_s = bytes_read / (gpu.memory_bandwidth_bytes_per_s * gpu.memory_efficiency)
    flops = 2.0 * model.num_parameters * scheduled_tokens
    compute_s = flops / (gpu.peak_flops * gpu.compute_efficiency)
    return gpu.step_overhead_s + max(memory_s, compute_s)
