"""What is simulated: the model, the GPU, the engine settings, and how vLLM sizes its KV pool.

All plain frozen data and pure functions. The default scenario is the demo's: a Llama-3.1-8B-like
model (32 layers, 8 KV heads, head_dim 128, bf16: 131,072 KV bytes per token) on one simulated
H100 80GB at ``--gpu-memory-utilization 0.92`` with block size 16 and ``--max-num-seqs 256``,
receiving the demo's traffic (:func:`exporter.sim.traffic.default_profile`).

The KV pool is sized the way vLLM does it (DESIGN section 3)::

    kv_budget = gpu_memory x utilization - weights - activation_peak - non_torch
    num_gpu_blocks = floor(kv_budget / (block_size x bytes_per_token))

with the memory figures that a real vLLM 0.19 logged for exactly this model on an H100 80GB
(``benchmarks/data/kv-calibration/observations.csv``, rows S18 and S24: 79.19 GiB visible, weights
14.99 GiB, activation peak 1.89 GiB, non-torch 0.25 GiB). At 0.92 that is a 55.72 GiB (59.8 GB)
budget, 28,531 blocks, 456,496 tokens: a realistic pool, not a toy one. ``kv_cache_memory_bytes``
replaces the budget with an exact number, as vLLM's ``--kv-cache-memory-bytes`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from exporter.errors import UsageError
from exporter.sim.traffic import TrafficPhase, TrafficProfile, default_profile

_GIB = 1024**3

#: The directory holding the simulated model's ``config.json`` (what the sidecar sizes from).
SIM_MODEL_DIR = Path(__file__).resolve().parents[1] / "data" / "sim-model"


class ScenarioError(UsageError):
    """A simulation scenario that vLLM itself would refuse to start with."""


@dataclass(frozen=True, slots=True)
class SimModel:
    """The served model, as far as KV sizing and step cost need it."""

    #: ``--served-model-name``: the ``model_name`` label and the ``/v1/models`` id.
    served_name: str = "simulated/llama-3.1-8b"
    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    #: Bytes per KV value: 2 for bf16/fp16 (``--kv-cache-dtype auto``), 1 for fp8.
    kv_dtype_bytes: int = 2
    #: Parameter count, for the compute (prefill) side of the step cost model.
    num_parameters: float = 8.03e9
    #: Weight memory per GPU as vLLM logs it ("Model loading took 14.99 GiB").
    weights_bytes: int = round(14.99 * _GIB)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes per token of context: ``2 x layers x kv_heads x head_dim x dtype bytes``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes


@dataclass(frozen=True, slots=True)
class SimGpu:
    """The simulated GPU: its memory, and the roofline figures of the step cost model."""

    name: str = "NVIDIA H100 80GB HBM3"
    #: Memory visible to CUDA (``torch.cuda.mem_get_info`` total): 79.19 GiB on an H100 80GB.
    memory_bytes: int = round(79.19 * _GIB)
    #: HBM3 peak bandwidth of an H100 SXM.
    memory_bandwidth_bytes_per_s: float = 3.35e12
    #: Dense bf16 tensor-core peak of an H100 SXM.
    peak_flops: float = 989e12
    #: Fraction of peak bandwidth a decode step achieves (weights and KV streamed once).
    memory_efficiency: float = 0.8
    #: Model FLOPs utilisation of a prefill chunk.
    compute_efficiency: float = 0.4
    #: Fixed cost of one engine step: scheduling, sampling, kernel launches (CUDA graphs).
    step_overhead_s: float = 0.002


@dataclass(frozen=True, slots=True)
class SimEngineConfig:
    """The vLLM engine arguments that shape the KV pool and the scheduler."""

    block_size: int = 16
    max_model_len: int = 16384
    #: ``--max-num-seqs 256``, as many deployments set it (vLLM's default on GPUs under 70 GiB;
    #: 1,024 on this H100): low enough that short requests fill the scheduler before the pool.
    max_num_seqs: int = 256
    #: vLLM V1's default for the OpenAI server on a GPU with at least 70 GiB.
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.92
    #: ``--kv-cache-memory-bytes``: replaces the computed budget when set.
    kv_cache_memory_bytes: int | None = None
    #: Peak activation memory of the profiling run (from the calibration set, see module doc).
    activation_peak_bytes: int = round(1.89 * _GIB)
    #: Memory outside torch's allocator: CUDA context, NCCL, CUDA graphs (calibration set).
    non_torch_bytes: int = round(0.25 * _GIB)
    #: ``True`` when ``--block-size`` was given explicitly (a ``cache_config_info`` label).
    user_specified_block_size: bool = False
    enable_prefix_caching: bool = True
    #: The ``engine`` label value (data-parallel rank).
    engine: str = "0"


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything that defines one simulated vLLM server; the traffic it receives included."""

    model: SimModel = field(default_factory=SimModel)
    gpu: SimGpu = field(default_factory=SimGpu)
    engine: SimEngineConfig = field(default_factory=SimEngineConfig)
    traffic: TrafficProfile = field(default_factory=default_profile)


def default_scenario() -> Scenario:
    """Return the demo scenario: Llama-3.1-8B-like on one H100 80GB, the demo's traffic phases."""
    return Scenario()


def kv_budget_bytes(scenario: Scenario) -> int:
    """Return the bytes vLLM gives the KV cache (per GPU), as in DESIGN section 3."""
    engine = scenario.engine
    if engine.kv_cache_memory_bytes is not None:
        return engine.kv_cache_memory_bytes
    budget = (
        scenario.gpu.memory_bytes * engine.gpu_memory_utilization
        - scenario.model.weights_bytes
        - engine.activation_peak_bytes
        - engine.non_torch_bytes
    )
    return max(0, math.floor(budget))


def num_gpu_blocks(scenario: Scenario) -> int:
    """Return ``num_gpu_blocks`` as vLLM reports it: every block, the reserved null one included."""
    block_bytes = scenario.engine.block_size * scenario.model.bytes_per_token
    return kv_budget_bytes(scenario) // block_bytes


def kv_cache_max_concurrency(scenario: Scenario) -> float:
    """Return vLLM's "maximum concurrency": blocks over the blocks one max-length request needs."""
    engine = scenario.engine
    blocks_per_request = math.ceil(engine.max_model_len / engine.block_size)
    return num_gpu_blocks(scenario) / blocks_per_request


def kv_cache_size_tokens(scenario: Scenario) -> int:
    """Return vLLM's "KV cache size" in tokens: ``max_concurrency x max_model_len``.

    For a full-attention model this is ``num_gpu_blocks x block_size`` (the null block counted),
    which is how it is computed here, exactly and without float rounding.
    """
    return num_gpu_blocks(scenario) * scenario.engine.block_size


def validate(scenario: Scenario) -> None:
    """Raise :class:`ScenarioError` if vLLM would refuse this configuration, or it cannot run."""
    engine = scenario.engine
    model = scenario.model
    for name, value in (
        ("block_size", engine.block_size),
        ("max_model_len", engine.max_model_len),
        ("max_num_seqs", engine.max_num_seqs),
        ("max_num_batched_tokens", engine.max_num_batched_tokens),
        ("num_layers", model.num_layers),
        ("num_kv_heads", model.num_kv_heads),
        ("head_dim", model.head_dim),
        ("kv_dtype_bytes", model.kv_dtype_bytes),
    ):
        if value < 1:
            raise ScenarioError(f"simulation {name} is {value}; it must be at least 1")
    if not 0.0 < engine.gpu_memory_utilization <= 1.0:
        raise ScenarioError(
            f"simulation gpu_memory_utilization is {engine.gpu_memory_utilization}; "
            "use a value in (0, 1]"
        )
    usable_blocks = num_gpu_blocks(scenario) - 1
    needed = math.ceil(engine.max_model_len / engine.block_size)
    if usable_blocks < needed:
        # vLLM refuses to start when one max_model_len request cannot fit in the pool.
        raise ScenarioError(
            f"simulated KV pool has {max(usable_blocks, 0)} usable blocks but one "
            f"{engine.max_model_len}-token request needs {needed}; lower max_model_len or "
            "give the KV cache more memory"
        )
    _validate_traffic(scenario.traffic)


def _validate_traffic(profile: TrafficProfile) -> None:
    if not profile.phases:
        raise ScenarioError("simulation traffic profile has no phases; give it at least one")
    for phase in profile.phases:
        _validate_phase(phase)


def _validate_phase(phase: TrafficPhase) -> None:
    where = f"simulation traffic phase {phase.name!r}"
    if not (phase.duration_s > 0 and math.isfinite(phase.duration_s)):
        raise ScenarioError(f"{where} lasts {phase.duration_s} s; give it a positive duration")
    if not (phase.arrivals_per_s >= 0 and math.isfinite(phase.arrivals_per_s)):
        raise ScenarioError(f"{where} has arrival rate {phase.arrivals_per_s}/s; use a rate >= 0")
    if phase.max_tokens < 1:
        raise ScenarioError(f"{where} has max_tokens {phase.max_tokens}; it must be at least 1")
    if phase.n < 1:
        raise ScenarioError(f"{where} has n {phase.n}; it must be at least 1")
    prefix = phase.shared_prefix
    if prefix is not None and not (
        prefix.name and prefix.tokens >= 1 and 0.0 <= prefix.fraction <= 1.0
    ):
        raise ScenarioError(
            f"{where} shared prefix needs a name, at least 1 token and a fraction in [0, 1]"
        )
    for label, dist in (("prompt", phase.prompt_tokens), ("output", phase.output_tokens)):
        if not (1 <= dist.minimum <= dist.maximum) or dist.median <= 0 or dist.sigma < 0:
            raise ScenarioError(
                f"{where} {label} lengths need 1 <= minimum <= maximum, median > 0, sigma >= 0"
            )
