"""The memory vLLM's profiler takes besides weights and KV cache, per GPU.

vLLM sizes the KV cache as ``total x utilization - weights - activation peak - non-torch memory``
(and, from 0.21 on, minus the CUDA-graph pool). This module estimates those three terms from a
few interpretable constants, fitted once on the real start-up logs in
``benchmarks/data/kv-calibration/observations.csv`` (vLLM 0.11 to 0.19, H100) and explained in
``docs/sizing.md``. What drives each term:

- Activation peak: vLLM's start-up profile ends with a sampler warm-up over ``max_num_seqs``
  dummy requests, which materialises fp32 logits of shape ``[max_num_seqs, vocab]`` a few times
  over. That term dominates: it explains the measured peaks to within about 0.1 GiB for dense
  models. MoE models add a fused-MoE workspace. Only the last pipeline stage samples.
- Non-torch memory: CUDA context and allocator slack on one GPU; with tensor parallelism NCCL
  and custom all-reduce buffers add about 1.85 GiB per GPU in recent releases.
- CUDA graphs: a pool that grows with the number of layers; subtracted before sizing the KV
  cache only from vLLM 0.21 on (before, it came out of the ``1 - utilization`` slack).

Pure functions over plain values: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exporter.vllm.version import VllmVersion

GIB = 1024**3

#: fp32 copies of the ``[max_num_seqs, vocab]`` logits alive at the sampler warm-up peak.
#: Measured: 9.4 on vLLM 0.11 to 0.16, 3.6 from 0.17 on (Qwen3-14B drops 5.64 -> 2.23 GiB).
LOGITS_COPIES_BEFORE_0_17 = 9.4
LOGITS_COPIES = 3.6
#: Activation memory that does not scale with the vocabulary (forward pass residue).
ACTIVATION_BASE_BYTES = int(0.14 * GIB)
#: Extra activation peak of mixture-of-experts models (fused-MoE workspace), per GPU.
MOE_ACTIVATION_BYTES = int(0.35 * GIB)
#: Non-torch memory on one GPU: 0.13 GiB measured up to 0.17, 0.25 GiB from 0.18.
NON_TORCH_BYTES_BEFORE_0_18 = int(0.13 * GIB)
NON_TORCH_BYTES = int(0.25 * GIB)
#: Communication buffers per GPU with tensor parallelism: 0.42 GiB on 0.11, 1.85 GiB on 0.19.
#: Where between 0.12 and 0.18 the jump happened is not measured; we assume 0.12 (conservative:
#: it predicts fewer tokens, never more, for those versions).
TP_BUFFERS_BYTES_UP_TO_0_11 = int(0.42 * GIB)
TP_BUFFERS_BYTES = int(1.85 * GIB)
#: CUDA-graph pool: a fixed part plus a part per layer on the GPU, more for MoE models.
CUDA_GRAPH_BASE_BYTES = int(0.50 * GIB)
CUDA_GRAPH_PER_LAYER_BYTES = int(0.014 * GIB)
CUDA_GRAPH_MOE_BYTES = int(0.45 * GIB)
#: First vLLM release whose profiler subtracts the CUDA-graph pool before sizing the KV cache.
CUDA_GRAPHS_SUBTRACTED_SINCE = VllmVersion(0, 21, 0)
#: Vocabulary assumed when the model's is unknown (a Llama 3 sized one).
DEFAULT_VOCAB_SIZE = 128_256

OverheadSource = Literal["estimate", "override", "not used"]


@dataclass(frozen=True, slots=True)
class OverheadEstimate:
    """Per-GPU memory outside weights and KV cache, in bytes, with where it came from."""

    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    source: OverheadSource = "estimate"

    @property
    def total_bytes(self) -> int:
        """Everything the profiler subtracts besides the weights."""
        return self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes


def logits_copies(version: VllmVersion) -> float:
    """How many fp32 logits tensors the sampler warm-up holds at its peak in this version."""
    return LOGITS_COPIES if version.at_least(0, 17) else LOGITS_COPIES_BEFORE_0_17


def estimate_activation_bytes(
    vocab_size: int,
    *,
    max_num_seqs: int,
    is_moe: bool,
    samples: bool,
    version: VllmVersion,
) -> int:
    """Peak activation memory of vLLM's profile run on one GPU.

    ``samples`` is false on pipeline stages other than the last, which never compute logits.
    """
    logits = logits_copies(version) * max_num_seqs * vocab_size * 4 if samples else 0
    moe = MOE_ACTIVATION_BYTES if is_moe else 0
    return int(ACTIVATION_BASE_BYTES + logits + moe)


def estimate_non_torch_bytes(*, tensor_parallel: int, version: VllmVersion) -> int:
    """CUDA context, allocator slack and (with TP) communication buffers on one GPU."""
    base = NON_TORCH_BYTES if version.at_least(0, 18) else NON_TORCH_BYTES_BEFORE_0_18
    if tensor_parallel <= 1:
        return base
    buffers = TP_BUFFERS_BYTES if version.at_least(0, 12) else TP_BUFFERS_BYTES_UP_TO_0_11
    return base + buffers


def estimate_cuda_graph_bytes(
    *, layers_on_gpu: int, is_moe: bool, version: VllmVersion, enforce_eager: bool
) -> int:
    """CUDA-graph pool the profiler subtracts (0 before vLLM 0.21 or with ``--enforce-eager``)."""
    if enforce_eager or version < CUDA_GRAPHS_SUBTRACTED_SINCE:
        return 0
    moe = CUDA_GRAPH_MOE_BYTES if is_moe else 0
    return CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_LAYER_BYTES * layers_on_gpu + moe


def estimate_overhead(
    *,
    vocab_size: int,
    max_num_seqs: int,
    is_moe: bool,
    samples: bool,
    tensor_parallel: int,
    layers_on_gpu: int,
    version: VllmVersion,
    enforce_eager: bool = False,
) -> OverheadEstimate:
    """Estimate the overhead of one GPU (one pipeline stage) from what drives it."""
    return OverheadEstimate(
        activation_bytes=estimate_activation_bytes(
            vocab_size, max_num_seqs=max_num_seqs, is_moe=is_moe, samples=samples, version=version
        ),
        non_torch_bytes=estimate_non_torch_bytes(tensor_parallel=tensor_parallel, version=version),
        cuda_graph_bytes=estimate_cuda_graph_bytes(
            layers_on_gpu=layers_on_gpu, is_moe=is_moe, version=version, enforce_eager=enforce_eager
        ),
    )
