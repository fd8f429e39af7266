"""The KV-cache sizing model: architecture + deployment -> blocks, tokens, sequences.

This is the project's pure core (DESIGN section 3). Everything here is plain data in, plain data
out: no I/O, no clock, no logging. The chain, per GPU:

1. KV bytes per token: ``2 x layers x kv_heads_per_gpu x head_dim x B_kv`` for MHA/GQA, with
   ``kv_heads_per_gpu = max(1, kv_heads // tp)`` (replicated when TP exceeds the KV heads);
   ``layers x (kv_lora_rank + qk_rope_head_dim) x B_kv`` for MLA, not split by TP. Pipeline
   parallelism gives each stage only its layers.
2. KV budget: ``total x utilization - weights - overhead`` (see :mod:`exporter.sizing.overhead`), or
   exactly ``--kv-cache-memory-bytes``; LoRA buffers (:mod:`exporter.sizing.lora`) and a
   speculative drafter's weights come out of it too, and a drafter's KV adds to step 1.
3. Blocks: ``floor(budget / bytes per block)``, where a block holds ``block_size`` tokens for
   every layer that shares the pool (all layers, or one layer of each KV-cache group on hybrid
   models). The smallest stage decides. One block is vLLM's null block.
4. Capacity as vLLM states it (``kv_capacity_tokens``, the "KV cache size: N tokens" log line):
   ``int(max_concurrency x max_model_len)`` with ``max_concurrency = blocks / blocks one
   max_model_len request needs over all groups`` (vLLM >= 0.21; ``kv_cache_size_tokens`` in
   ``cache_config_info`` from 0.24), or ``blocks // groups x block_size`` before 0.21. The pool's
   raw token slots, ``blocks x block_size``, are ``kv_pool_tokens``.
5. Sequences at context T: usable blocks ``// blocks one T-token sequence holds``, capped by the
   scheduler's ``max_num_seqs`` (:mod:`exporter.sizing.scheduler`): the smaller one binds.

Sliding-window and chunked-local layers (Mistral v0.1, Gemma 2/3, gpt-oss, Llama 4) are modelled
the way vLLM's hybrid allocator groups them, and so are the Mamba / linear-attention layers of
state-space hybrids (vLLM 0.32's arithmetic: see "hybrid state layers" below), and so are
DeepSeek V3.2's sparse-attention indexer caches ("sparse-attention MLA" below), and so are
layers whose KV pages differ in size (Gemma 4: raised block sizes per group or padded pages,
"layers of different page sizes" below); what is not modelled is :class:`Declined` with the
reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from exporter.core.ceiling import Ceiling, ceiling
from exporter.core.pool import GroupBlocks, GroupKind, PoolLayout
from exporter.core.reasons import Limit
from exporter.errors import UnsupportedModelError, UsageError
from exporter.sizing.lora import (
    EMBEDDING_LORA_ARCHITECTURES,
    LORA_MAX_VOCAB,
    LoraSettings,
    LoraShape,
    lora_bytes,
)
from exporter.sizing.overhead import (
    DEFAULT_VOCAB_SIZE,
    OverheadEstimate,
    estimate_overhead,
)
from exporter.sizing.scheduler import SchedulerInputs, SchedulerLimits, scheduler_limits
from exporter.sizing.weights import (
    ParamSplit,
    PerLayerInputs,
    dtype_bytes,
    weight_format,
    weights_bytes_total,
)
from exporter.vllm.version import LATEST_KNOWN, VllmVersion

LayerKind = Literal["full", "sliding", "chunked"]
StateKind = Literal["mamba1", "mamba2", "gated_delta_net", "short_conv"]
Device = Literal["cuda", "cpu"]

#: vLLM's default ``--block-size`` on GPUs, and on the CPU backend (16 there for MLA).
GPU_BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128
#: Default ``--gpu-memory-utilization``: 0.9 before vLLM 0.20, 0.92 from 0.20 on.
UTILIZATION_BEFORE_0_20 = 0.9
UTILIZATION = 0.92
#: From this release vLLM's "KV cache size: N tokens" log line is group-aware
#: (``int(max_concurrency x max_model_len)``); before, it was ``num_blocks // groups x block_size``
#: (0.21 ``vllm/v1/core/kv_cache_utils.py``).
GROUP_AWARE_CAPACITY_SINCE = VllmVersion(0, 21, 0)
#: From this release ``cache_config_info`` carries ``kv_cache_size_tokens`` (0.24
#: ``vllm/config/cache.py``); before, a running vLLM's metrics show only the pool's blocks.
CAPACITY_LABEL_SINCE = VllmVersion(0, 24, 0)
#: From this release the hybrid allocator gives sliding-window layers their own block tables;
#: before, every layer was allocated as full attention.
HYBRID_ALLOCATOR_SINCE = VllmVersion(0, 10, 0)
#: The release whose state-layer arithmetic (state pages, raised block size, align-mode blocks)
#: the hybrid sizing follows, read from its source; older releases are declined.
STATE_ARITHMETIC_OF = VllmVersion(0, 32, 0)
#: From this release (the source read) a window's admission cap counts every batch in flight,
#: ``max_concurrent_batches x max_num_batched_tokens`` (``VllmConfig.max_in_flight_tokens``);
#: earlier releases are modelled with one batch, as their recordings agree.
IN_FLIGHT_BATCHES_SINCE = VllmVersion(0, 32, 0)

_FP8_KV = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "fp8_per_token_head"}

#: DeepSeek V3.2's indexer key: one float32 scale per this many fp8 values (``Indexer``,
#: vllm/models/deepseek_v32/attention.py, ``quant_block_size = 128``).
INDEXER_QUANT_BLOCK = 128
INDEXER_SCALE_BYTES = 4
#: The block size every sparse-MLA and indexer backend of vLLM 0.32 takes on CUDA (a multiple of):
#: FlashAttention/FlashMLA/FlashInfer sparse MLA declare ``MultipleOf(64)`` (or 32), the
#: DeepSeek V3.2 indexer exactly 64 (vllm/v1/attention/backends/mla/indexer.py).
SPARSE_MLA_BLOCK_SIZE = 64
#: One token of the ``fp8_ds_mla`` latent: 512 fp8 NoPE values, 4 float32 scales, 64 bf16 RoPE
#: values (vllm/v1/attention/backends/mla/flashmla_sparse.py; ``MLAAttention.get_kv_cache_spec``).
FP8_DS_MLA_BYTES = 656


@dataclass(frozen=True, slots=True)
class MlaDims:
    """Multi-head latent attention: one compressed latent per token per layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def values_per_token(self) -> int:
        """Cached values per token per layer (576 for DeepSeek-V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class SparseIndexer:
    """DeepSeek V3.2's lightning indexer: one quantized key per token per layer, beside the latent.

    vLLM 0.32 keeps it in ``DeepseekV32IndexerCache`` (vllm/model_executor/models/deepseek_v2.py,
    built by ``DeepseekV32Indexer.__init__`` in vllm/models/deepseek_v32/attention.py): a uint8
    row of ``index_head_dim + index_head_dim // 128 x 4`` bytes, the fp8 key plus one float32
    scale per 128 values (``quant_block_size = 128``), whatever ``--kv-cache-dtype`` says.
    """

    head_dim: int

    @property
    def bytes_per_token(self) -> int:
        """Indexer-cache bytes per token per layer (132 for DeepSeek V3.2's 128-wide key)."""
        return self.head_dim + self.head_dim // INDEXER_QUANT_BLOCK * INDEXER_SCALE_BYTES


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """Mixture of experts: every expert is resident in memory."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    moe_layers: int


@dataclass(frozen=True, slots=True)
class StateLayers:
    """The recurrent-state layers of a hybrid model: how many, and one layer's state shape.

    The fields follow vLLM 0.32's ``MambaStateShapeCalculator``
    (``vllm/model_executor/layers/mamba/mamba_utils.py``): ``mamba1`` (Jamba) uses
    ``intermediate_size`` and ``state_size``; ``mamba2`` uses ``intermediate_size``,
    ``n_groups``, ``num_heads``, ``head_dim``, ``state_size``; ``gated_delta_net`` (Qwen3-Next)
    uses ``num_heads`` / ``num_k_heads`` (value / key heads), ``head_dim`` / ``head_k_dim``;
    ``short_conv`` (LFM2) only ``intermediate_size`` (its ``conv_dim``). All have a causal
    convolution of ``conv_kernel`` taps, of which ``conv_kernel - 1`` are kept.
    """

    kind: StateKind
    num_layers: int
    conv_kernel: int
    intermediate_size: int = 0
    n_groups: int = 0
    num_heads: int = 0
    head_dim: int = 0
    state_size: int = 0
    num_k_heads: int = 0
    head_k_dim: int = 0
    #: The SSM state dtype ``--mamba-ssm-cache-dtype auto`` means for this model, if it is not
    #: the conv state's (Nemotron-H: its config's ``mamba_ssm_cache_dtype``, else float32).
    ssm_dtype_default: str | None = None
    #: Whether the config lists ``linear_attention`` layers: vLLM's CPU backend then keeps a
    #: 16-bit SSM state that was asked for (its accelerated GDN path); otherwise it uses float32.
    lists_linear_attention: bool = False

    def element_counts(self, tensor_parallel: int) -> tuple[int, int]:
        """Values of (conv state, temporal state) one layer keeps per sequence on one GPU."""
        tp = tensor_parallel
        taps = self.conv_kernel - 1
        if self.kind == "mamba1":
            channels = _divide(self.intermediate_size, tp)
            return channels * taps, channels * self.state_size
        if self.kind == "mamba2":
            # Groups are replicated so that every head shard has its group (extra_groups...).
            groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
            conv_dim = self.intermediate_size + 2 * groups * self.state_size
            temporal = _divide(self.num_heads, tp) * self.head_dim * self.state_size
            return _divide(conv_dim, tp) * taps, temporal
        if self.kind == "gated_delta_net":
            conv_dim = self.head_k_dim * self.num_k_heads * 2 + self.head_dim * self.num_heads
            temporal = _divide(self.num_heads, tp) * self.head_dim * self.head_k_dim
            return _divide(conv_dim, tp) * taps, temporal
        return _divide(self.intermediate_size, tp) * taps, 0


def _divide(value: int, tensor_parallel: int) -> int:
    if value % tensor_parallel:
        raise UsageError(
            f"--tp {tensor_parallel} does not divide the state layers' {value} channels/heads; "
            "vLLM refuses this: pick a TP that divides them"
        )
    return value // tensor_parallel


@dataclass(frozen=True, slots=True)
class ModelArch:
    """What the sizing model needs to know about a model, normalised from its ``config.json``.

    ``layer_kinds`` is empty for models whose layers are all full attention; otherwise it has one
    entry per layer. ``declined`` says why the model cannot be sized (state-space hybrids...).
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int | None = None
    intermediate_size: int | None = None
    #: Total parameter count (all experts), if known.
    params: int | None = None
    #: The checkpoint's torch dtype (``torch_dtype`` / ``dtype`` in config.json).
    dtype: str = "bfloat16"
    mla: MlaDims | None = None
    layer_kinds: tuple[LayerKind, ...] = ()
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    tie_word_embeddings: bool = False
    moe: MoeSpec | None = None
    #: Weight format from ``quantization_config`` (``fp8``, ``awq``...), None if unquantized.
    quantization: str | None = None
    #: The model's own length: the smallest of the config's length fields vLLM reads
    #: (``max_position_embeddings``, ``seq_length``, ``n_positions``...).
    max_position_embeddings: int | None = None
    #: A longer context vLLM accepts (rope scaling's, or the config's ``model_max_length``).
    derived_max_len: int | None = None
    #: The ``max_model_len`` vLLM serves without ``--max-model-len``, where it is not
    #: ``max_position_embeddings`` (a linear/dynamic rope factor, ``model_max_length``, LongRoPE's
    #: ``original_max_position_embeddings``).
    default_max_len: int | None = None
    declined: str | None = None
    #: The Mamba / linear-attention layers of a hybrid model (None for pure attention models).
    #: ``layer_kinds`` then lists only the attention layers' kinds (``attention_layers`` of them).
    state: StateLayers | None = None
    #: Attention layers of a hybrid model (``num_layers`` counts every decoder layer), or the
    #: layers holding KV of a model where some hold none (``kv_shared_layers`` +
    #: ``attention_free_layers`` of them); ``layer_kinds`` then lists the KV-holding layers' kinds.
    attention_layers: int | None = None
    #: Layers that read an earlier layer's KV and hold none (Gemma 3n's ``num_kv_shared_layers``).
    kv_shared_layers: int = 0
    #: Layers without attention (Nemotron-NAS's ``no_op`` attention blocks).
    attention_free_layers: int = 0
    #: The config has a vision or audio encoder (``vision_config``, ``audio_config``).
    multimodal: bool = False
    #: The config's first ``architectures`` entry (vLLM's model class), if known.
    architecture: str | None = None
    #: MTP layers the checkpoint ships (``num_nextn_predict_layers``), if the config says.
    mtp_layers: int | None = None
    #: DeepSeek V3.2's sparse-attention indexer, on every layer (None: dense attention).
    indexer: SparseIndexer | None = None
    #: (KV heads, head_dim) of every KV-holding layer, parallel to :attr:`kinds`, where layers
    #: differ (Gemma 4's full-attention layers); empty when all have ``num_kv_heads`` x
    #: ``head_dim``.
    layer_shapes: tuple[tuple[int, int], ...] = ()
    #: Gemma 3n's and Gemma 4's per-layer input embeddings (None: the model has none).
    per_layer_inputs: PerLayerInputs | None = None

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        """The attention kind of every layer (all ``full`` when ``layer_kinds`` is empty)."""
        if self.layer_kinds:
            return self.layer_kinds
        return all_full(self.num_layers)

    @property
    def context_limit(self) -> int | None:
        """The longest ``--max-model-len`` vLLM takes without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
        if self.max_position_embeddings is None:
            return None
        return max(self.max_position_embeddings, self.derived_max_len or 0)

    @property
    def default_max_model_len(self) -> int | None:
        """The ``max_model_len`` vLLM 0.32 serves when ``--max-model-len`` is not given."""
        return self.default_max_len or self.max_position_embeddings

    @property
    def attention_kind(self) -> str:
        """A short label: MHA, GQA, MQA or MLA, plus the windowed layers if any."""
        if self.mla is not None:
            base = "MLA" if self.indexer is None else "sparse MLA + indexer"
        elif self.num_kv_heads == self.num_attention_heads:
            base = "MHA"
        elif self.num_kv_heads == 1:
            base = "MQA"
        else:
            base = "GQA"
        kinds = set(self.kinds)
        if "sliding" in kinds:
            base += " + sliding window" if "full" in kinds else " (sliding window)"
        if "chunked" in kinds:
            base += " + chunked local"
        if self.state is not None:
            count = self.state.num_layers
            label = _STATE_LABEL[self.state.kind]
            base += f" + {count} {label} layer{'s' if count != 1 else ''}"
        if self.kv_shared_layers:
            base += f" + {self.kv_shared_layers} KV-sharing layers"
        if self.attention_free_layers:
            base += f" + {self.attention_free_layers} layers without attention"
        if self.layer_shapes:
            shapes = sorted(set(self.layer_shapes))
            base += " + per-layer KV heads x head_dim " + "/".join(f"{h}x{d}" for h, d in shapes)
        return base

    @property
    def kv_free_layers(self) -> int:
        """Decoder layers that hold no KV of their own (KV sharing, no attention)."""
        return self.kv_shared_layers + self.attention_free_layers


_STATE_LABEL: dict[StateKind, str] = {
    "mamba1": "Mamba1",
    "mamba2": "Mamba2",
    "gated_delta_net": "gated-delta-net",
    "short_conv": "short-conv",
}


@dataclass(frozen=True, slots=True)
class SpeculativeDecoding:
    """Speculative decoding with a drafter that holds KV: a draft model / EAGLE head, or MTP.

    vLLM loads the drafter into the same runner, and its attention layers join the target's in
    the KV-cache spec (``vllm/v1/worker/gpu_model_runner.py`` ``get_kv_cache_spec`` walks every
    attention layer); with all layers full attention they form one group
    (``vllm/v1/core/kv_cache_utils.py`` ``get_kv_cache_groups``: uniform spec, or
    ``UniformTypeKVCacheSpecs`` for other head shapes), so a token costs the target's bytes plus
    the drafter's. The scheduler reserves ``num_speculative_tokens`` lookahead slots per request
    (``VllmConfig.num_lookahead_tokens``, vllm/config/vllm.py).
    """

    num_speculative_tokens: int
    #: A separate draft model or EAGLE head (its own config.json), if any.
    draft: ModelArch | None = None
    #: The draft's checkpoint size (all GPUs), if known.
    draft_weights_bytes: int | None = None
    #: MTP layers of the target's own shape (DeepSeek-style ``num_nextn_predict_layers``).
    mtp_layers: int = 0

    @property
    def method(self) -> str:
        """``mtp`` or ``draft`` (a draft model or an EAGLE head)."""
        return "mtp" if self.mtp_layers else "draft"


@dataclass(frozen=True, slots=True)
class Deployment:
    """How vLLM is (or would be) started, and on what hardware. Sizes are per GPU."""

    gpu_memory_bytes: int
    vllm_version: VllmVersion = LATEST_KNOWN
    #: ``--gpu-memory-utilization``; None means the version's default.
    gpu_memory_utilization: float | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    #: ``--dtype``: ``auto`` (the checkpoint's, float32 downcast to bfloat16) or a dtype name.
    dtype: str = "auto"
    #: ``--kv-cache-dtype``: ``auto`` (the model dtype), a 16/32-bit dtype or an fp8 variant.
    kv_cache_dtype: str = "auto"
    #: ``--block-size``; None means 16 on GPUs, 128 on the CPU backend (16 for MLA).
    block_size: int | None = None
    #: ``--max-model-len``; None means the model's (:attr:`ModelArch.default_max_model_len`).
    max_model_len: int | None = None
    #: ``--kv-cache-memory-bytes``: replaces the whole budget computation when set.
    kv_cache_memory_bytes: int | None = None
    #: Known total checkpoint size (all GPUs), e.g. from the safetensors index.
    weights_bytes: int | None = None
    #: Per-GPU overhead override (activation + non-torch + CUDA graphs).
    overhead_bytes: int | None = None
    #: ``--quantization``; None means the checkpoint's own ``quantization_config``.
    quantization: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    #: ``--max-num-queued-reqs``: the API server's admission cap (None: no cap, vLLM's default).
    max_num_queued_reqs: int | None = None
    #: Lower-cased GPU product name, if known (vLLM keeps A100s on the small batch defaults).
    gpu_name: str | None = None
    device: Device = "cuda"
    enforce_eager: bool = False
    #: ``--mamba-cache-dtype`` (conv state, and SSM state unless the next one is given).
    mamba_cache_dtype: str = "auto"
    #: ``--mamba-ssm-cache-dtype`` (the SSM / recurrent state of Mamba2 and gated-delta-net).
    mamba_ssm_cache_dtype: str = "auto"
    #: ``--enable-prefix-caching`` (vLLM's default): hybrids then run ``--mamba-cache-mode align``.
    enable_prefix_caching: bool = True
    #: ``--enable-lora`` and its sizes; None means LoRA off.
    lora: LoraSettings | None = None
    #: Speculative decoding with a drafter holding KV; None means off.
    speculative: SpeculativeDecoding | None = None


@dataclass(frozen=True, slots=True)
class Declined:
    """The model cannot be sized honestly; ``reason`` says why, for a user."""

    model: str
    reason: str


@dataclass(frozen=True, slots=True)
class KvCacheGroup:
    """One of vLLM's KV-cache groups: layers of one attention kind sharing a block table."""

    kind: GroupKind
    window: int | None
    #: Layers of the whole model in this group.
    num_layers: int
    #: Blocks one request of ``max_model_len`` tokens needs in this group (vLLM's admission).
    blocks_per_max_len_request: int
    #: Tokens per block of this group where vLLM raised it to unify page sizes (Gemma 4's
    #: smaller pages); None: the result's ``block_size``.
    block_size: int | None = None


@dataclass(frozen=True, slots=True)
class StageSizing:
    """The budget of one pipeline stage (one GPU of it); the smallest stage decides."""

    index: int
    num_layers: int
    weights_bytes: int
    overhead: OverheadEstimate
    kv_budget_bytes: int
    #: Bytes of one block on this GPU (``block_size`` tokens for every pool-sharing layer).
    block_bytes: int
    kv_blocks: int
    #: LoRA adapter buffers on this GPU (``--enable-lora``), taken from the budget.
    lora_bytes: int = 0


@dataclass(frozen=True, slots=True)
class SizingResult:
    """The whole chain from hardware to concurrent sequences, per GPU, in bytes and tokens."""

    model: str
    attention_kind: str
    vllm_version: VllmVersion
    device: Device
    tensor_parallel: int
    pipeline_parallel: int
    model_dtype: str
    kv_cache_dtype: str
    kv_bytes_per_element: int
    kv_heads_per_gpu: int
    #: Layers holding KV on the limiting GPU (all layers without pipeline parallelism; a
    #: hybrid's attention layers only).
    layers_per_gpu: int
    #: KV bytes one token costs on the limiting GPU, over all its layers.
    bytes_per_token: int
    block_size: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    #: ``total x utilization``.
    usable_bytes: int
    weights_bytes: int
    overhead: OverheadEstimate
    kv_budget_bytes: int
    #: ``estimate`` (profiler model) or ``kv-cache-memory-bytes`` (exact).
    kv_budget_source: str
    #: Memory of one block on the limiting GPU.
    block_bytes: int
    #: Blocks in the pool, null block included (vLLM's ``num_gpu_blocks``).
    kv_blocks: int
    #: Token slots in the pool: ``kv_blocks x block_size`` (null block included).
    kv_pool_tokens: int
    kv_groups: tuple[KvCacheGroup, ...]
    max_model_len: int
    #: ``max_num_seqs`` and ``max_num_batched_tokens``, given or vLLM's defaults.
    scheduler: SchedulerLimits
    stages: tuple[StageSizing, ...]
    #: Things the model had to assume, worded for a user.
    assumptions: tuple[str, ...] = ()
    #: Hybrids: the state one state layer keeps per sequence (conv + SSM), before padding.
    state_bytes: int = 0
    #: Hybrids: the state dtypes (conv, SSM), and the block size asked for before vLLM raised it.
    state_dtypes: tuple[str, ...] = ()
    requested_block_size: int | None = None
    #: LoRA adapter buffers on the limiting GPU, and the settings (None: LoRA off).
    lora_bytes: int = 0
    lora: LoraSettings | None = None
    #: Speculative decoding: the drafter's weights on the limiting GPU and its share of
    #: ``bytes_per_token``; ``lookahead_tokens`` slots every running sequence reserves.
    speculative: SpeculativeDecoding | None = None
    draft_weights_bytes: int = 0
    draft_bytes_per_token: int = 0
    lookahead_tokens: int = 0
    #: Hybrids: ``align`` (prefix caching on) or ``none``.
    mamba_cache_mode: str | None = None
    #: Sparse MLA (DeepSeek V3.2): the latent's and the indexer key's bytes per token per layer,
    #: and the latent's cache format (``bfloat16``, ``fp8_ds_mla`` or ``fp8``); None otherwise.
    sparse_latent_bytes: int = 0
    sparse_indexer_bytes: int = 0
    sparse_cache_format: str | None = None

    @property
    def usable_blocks(self) -> int:
        """Blocks running requests can hold: all but vLLM's reserved null block."""
        return max(0, self.kv_blocks - 1)

    @property
    def usable_tokens(self) -> int:
        """Token slots running requests can hold: ``(kv_blocks - 1) x block_size``."""
        return self.usable_blocks * self.block_size

    @property
    def blocks_per_max_len_request(self) -> int:
        """Blocks one ``max_model_len`` request needs, summed over KV-cache groups."""
        return sum(group.blocks_per_max_len_request for group in self.kv_groups)

    @property
    def max_concurrency(self) -> float:
        """vLLM's ``kv_cache_max_concurrency``: blocks over blocks per max-length request."""
        return self.kv_blocks / self.blocks_per_max_len_request

    @property
    def kv_cache_size_tokens(self) -> int:
        """vLLM's group-aware ``kv_cache_size_tokens`` (``cache_config_info``, vLLM >= 0.24)."""
        return int(self.max_concurrency * self.max_model_len)

    @property
    def legacy_log_tokens(self) -> int:
        """The older "GPU KV cache size: N tokens" line: ``blocks // groups x block_size``."""
        return self.kv_blocks // len(self.kv_groups) * self.block_size

    @property
    def reported_capacity_tokens(self) -> int:
        """The "KV cache size: N tokens" of this vLLM version's start-up log line."""
        if self.vllm_version >= GROUP_AWARE_CAPACITY_SINCE:
            return self.kv_cache_size_tokens
        return self.legacy_log_tokens

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity as vLLM states it: its log line's "KV cache size: N tokens".

        The one meaning of ``kv_capacity_tokens`` in ``plan``, ``check`` and the gauges; the
        pool's raw token slots are :attr:`kv_pool_tokens` (they differ on hybrid models).
        """
        return self.reported_capacity_tokens

    @property
    def comparable_capacity_tokens(self) -> int:
        """The capacity a running vLLM's metrics show: what the live gauges are checked against.

        ``kv_cache_size_tokens`` where ``cache_config_info`` carries it (0.24+); before, the
        metrics have only ``num_gpu_blocks x block_size``, the pool's token slots.
        """
        if self.vllm_version >= CAPACITY_LABEL_SINCE:
            return self.kv_cache_size_tokens
        return self.kv_pool_tokens

    @property
    def max_num_seqs(self) -> int:
        """The scheduler's ``max_num_seqs`` (given or vLLM's default)."""
        return self.scheduler.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        """The scheduler's ``max_num_batched_tokens`` (given or vLLM's default)."""
        return self.scheduler.max_num_batched_tokens

    @property
    def fits(self) -> bool:
        """Whether there is any KV budget left after weights and overhead."""
        return self.kv_blocks > 1

    @property
    def max_model_len_fits(self) -> bool:
        """Whether one ``max_model_len`` request fits (vLLM refuses to start otherwise).

        vLLM checks against the blocks a request can hold, which excludes the null block: a
        real 0.32 refused 2,048 tokens in exactly 16 blocks of 128 ("estimated maximum model
        length is 1920", tests/fixtures/vllm-cpu/architectures/llama-mha-maxlen2048).
        """
        return self.usable_blocks >= self.blocks_per_max_len_request

    @property
    def pool_layout(self) -> PoolLayout:
        """The KV-cache groups as one sequence takes blocks in them (what the sidecar is given)."""
        return PoolLayout(
            groups=tuple(
                GroupBlocks(
                    kind=group.kind,
                    window=group.window,
                    block_size=group.block_size or self.block_size,
                    max_blocks=(None if group.kind == "full" else group.blocks_per_max_len_request),
                )
                for group in self.kv_groups
            ),
            max_model_len=self.max_model_len,
            max_len_blocks=self.blocks_per_max_len_request,
            lookahead_tokens=self.lookahead_tokens,
        )

    def blocks_per_sequence(self, context_tokens: int) -> int:
        """Blocks one sequence of ``context_tokens`` holds, over all KV-cache groups.

        Each group rounds up to whole blocks; a sliding-window or chunked-local group at most
        what vLLM's admission reserves for a request there (its window's blocks and the batch
        budget's), a state group the same blocks whatever the length
        (:class:`exporter.core.pool.GroupBlocks`): at ``max_model_len`` the blocks behind
        vLLM's "Maximum concurrency" figure.
        """
        if context_tokens < 1:
            raise UsageError(f"context length must be at least 1 token, got {context_tokens}")
        return self.pool_layout.blocks_per_sequence(context_tokens)

    def sequences_at(self, context_tokens: int) -> int:
        """How many sequences of ``context_tokens`` the KV pool holds at once (usable blocks)."""
        return self.usable_blocks // self.blocks_per_sequence(context_tokens)

    def ceiling_at(self, context_tokens: int) -> Ceiling:
        """Sequences of ``context_tokens`` vLLM runs at once: KV pool, scheduler, admission cap."""
        kv = float(self.sequences_at(context_tokens))
        cap = self.scheduler.max_num_queued_reqs
        found = ceiling(
            kv,
            running_limit=self.scheduler.running_limit,
            queue_cap=float(cap) if cap is not None else None,
        )
        return found or Ceiling(kv, Limit.KV_CACHE, kv)


def all_full(num_layers: int) -> tuple[LayerKind, ...]:
    """``num_layers`` full-attention layers' kinds (a model, or a group, with no window)."""
    full: LayerKind = "full"
    return tuple(full for _ in range(num_layers))


# --- dtypes ------------------------------------------------------------------------------------


def resolve_model_dtype(requested: str, *, checkpoint_dtype: str) -> str:
    """The dtype vLLM runs the model in: ``auto`` takes the checkpoint's, fp32 -> bfloat16."""
    if requested.strip().lower() != "auto":
        dtype_bytes(requested)  # validates
        return requested.strip().lower()
    dtype = checkpoint_dtype.strip().lower().removeprefix("torch.")
    if dtype_bytes(dtype) == 4:
        # vLLM serves float32 checkpoints in 16-bit unless --dtype float32 is given.
        return "bfloat16"
    return dtype


def kv_bytes_per_element(kv_cache_dtype: str, *, model_dtype: str) -> int:
    """``B_kv``: ``auto`` means the model dtype; every fp8 variant is one byte."""
    key = kv_cache_dtype.strip().lower()
    if key == "auto":
        return dtype_bytes(model_dtype)
    if key in _FP8_KV or key.startswith("fp8"):
        return 1
    if key in {"int8", "int8_per_token_head"}:
        return 1
    try:
        return dtype_bytes(key)
    except UsageError:
        raise UsageError(
            f"unknown KV cache dtype {kv_cache_dtype!r}: use auto, bfloat16, float16, float32, "
            "fp8, fp8_e4m3 or fp8_e5m2"
        ) from None


# --- per-token bytes ---------------------------------------------------------------------------


def kv_heads_per_gpu(num_kv_heads: int, tensor_parallel: int) -> int:
    """KV heads each GPU stores: split by TP, replicated once TP exceeds the KV heads."""
    return max(1, num_kv_heads // tensor_parallel)


def layer_bytes_per_token(arch: ModelArch, *, tensor_parallel: int, kv_element_bytes: int) -> int:
    """KV bytes one token costs in one layer on one GPU."""
    if arch.mla is not None:
        # One latent per token, replicated on every TP rank.
        return arch.mla.values_per_token * kv_element_bytes
    heads = kv_heads_per_gpu(arch.num_kv_heads, tensor_parallel)
    return 2 * heads * arch.head_dim * kv_element_bytes


def pipeline_partition(num_layers: int, pipeline_parallel: int) -> tuple[int, ...]:
    """Layers per pipeline stage as vLLM splits them (extra layers go to the middle stages)."""
    per_stage = num_layers // pipeline_parallel
    stages = [per_stage] * pipeline_parallel
    # vLLM adds the remainder from the second-to-last stage backwards, sparing the last one,
    # which also holds the LM head and the sampler.
    for i in range(2, num_layers % pipeline_parallel + 2):
        stages[-i] += 1
    return tuple(stages)


# --- KV-cache groups ---------------------------------------------------------------------------


def kv_cache_groups(
    arch: ModelArch,
    *,
    max_model_len: int,
    block_size: int,
    max_num_batched_tokens: int,
    hybrid_allocator: bool,
) -> tuple[tuple[KvCacheGroup, ...], int]:
    """vLLM's KV-cache groups and the number of layers that share one block (group size).

    One attention kind: one group of all layers. Several kinds: layers of each kind are split
    into groups of ``group_size`` layers (the smaller kind's count, or the larger one's when they
    are within 1.5x), each group with its own block table over one shared pool.
    """
    window_of: dict[LayerKind, int | None] = {
        "full": None,
        "sliding": arch.sliding_window,
        "chunked": arch.attention_chunk_size,
    }
    # Only the layers that hold KV join a group (a KV-sharing or attention-free layer has no
    # spec: GPUModelRunner.get_kv_cache_spec skips it).
    kinds = arch.kinds if hybrid_allocator else all_full(len(arch.kinds))
    counts: dict[LayerKind, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1

    def group(kind: LayerKind, layers: int) -> KvCacheGroup:
        window = window_of[kind]
        return KvCacheGroup(
            kind=kind,
            window=window,
            num_layers=layers,
            blocks_per_max_len_request=_admission_blocks(
                kind, window, max_model_len, block_size, max_num_batched_tokens
            ),
        )

    if len(counts) == 1:
        ((kind, layers),) = counts.items()
        return (group(kind, layers),), layers
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups: list[KvCacheGroup] = []
    for kind, layers in counts.items():
        groups.extend(group(kind, group_size) for _ in range(math.ceil(layers / group_size)))
    return tuple(groups), group_size


def in_flight_tokens(deployment: Deployment, batched: int) -> int:
    """Tokens scheduled but not yet settled, which a window's admission cap reserves beyond it.

    vLLM 0.32's ``max_in_flight_tokens``: every concurrent batch may hold ``batched`` tokens.
    Async scheduling, on by default except on the CPU backend (``platforms/cpu.py`` turns it
    off), keeps one batch more in flight than the pipeline has stages (the V2 model runner,
    CUDA's default: ``max_concurrent_batches`` in vllm/config/vllm.py); without it, one a stage.
    """
    if deployment.vllm_version < IN_FLIGHT_BATCHES_SINCE:
        return batched
    stages = deployment.pipeline_parallel
    batches = stages if deployment.device == "cpu" else stages + 1
    return batches * batched


def _admission_blocks(
    kind: LayerKind, window: int | None, max_model_len: int, block_size: int, batched: int
) -> int:
    # vLLM's KVCacheSpec.max_memory_usage_bytes / page_size_bytes for one max-length request.
    if kind == "sliding" and window is not None:
        return math.ceil(min(window - 1 + batched, max_model_len) / block_size) + 1
    if kind == "chunked" and window is not None:
        return math.ceil(min(window + batched, max_model_len) / block_size)
    return math.ceil(max_model_len / block_size)


# --- hybrid state layers -----------------------------------------------------------------------
#
# vLLM 0.32's arithmetic, read from its source (file:line of the installed 0.32.0 package):
# - state shapes: model_executor/layers/mamba/mamba_utils.py:161-350 (MambaStateShapeCalculator);
#   dtypes: mamba_utils.py:53-158 (conv = --mamba-cache-dtype or the model dtype, SSM =
#   --mamba-ssm-cache-dtype or the conv dtype); Nemotron-H's SSM default is its config's
#   mamba_ssm_cache_dtype, else float32 (model_executor/models/config.py:712-739); the CPU
#   backend on AVX512-BF16 CPUs resets any SSM dtype but float32 to float32 unless the
#   accelerated GDN path takes a 16-bit one (platforms/cpu.py:39-91, 301-321).
# - one state page = sum of the state tensors' bytes (v1/kv_cache_interface.py:1035-1070).
# - block size: platforms/interface.py:939-1126 (_align_hybrid_block_size): with the attention
#   page of one token P1 and the state page S, align = max(smallest kernel block, block_size),
#   block = align x cdiv(S, align x P1), rounded up to the kernel block; the block size is raised
#   to it when smaller (even over a user's --block-size), and the state page is padded to the
#   attention page block x P1, so every layer's page is the same.
# - groups: v1/core/kv_cache_utils.py:1362-1502: one bucket per spec (attention kinds, state),
#   group size = the smallest bucket (the largest when within 1.5x), buckets split into
#   cdiv(layers, group size) groups; num_blocks = budget // (page x group size)
#   (kv_cache_utils.py:1520-1552, 1588-1623).
# - a request's blocks (kv_cache_interface.py:1076-1094): attention as usual; a state group 1
#   block (mamba cache mode none) or 2 + checkpoint blocks (align, the default with prefix
#   caching: model_executor/models/config.py:672-709); MambaMixer2 layers keep one prefill
#   checkpoint block (mamba_mixer2.py:1098-1108), gated-delta-net and short-conv layers none.
# - max concurrency = num_blocks / sum of the groups' blocks per request; kv_cache_size_tokens
#   = int(concurrency x max_model_len) (kv_cache_utils.py:1195-1228, 2300-2335).
# - kernel blocks: v1/attention/backends/flash_attn.py:355-365 (a multiple of 16, except FA4's
#   head-dim-256 and SM90 FP8 head-dim-512 kernels), cpu_attn.py:65-66 (a multiple of 32).

#: The smallest kernel block of the attention backend vLLM pairs with state layers: FlashAttention
#: on CUDA (a multiple of 16), CPU_ATTN on the CPU backend (a multiple of 32).
_KERNEL_BLOCK: dict[Device, int] = {"cuda": 16, "cpu": 32}


def _state_dtypes(
    state: StateLayers, deployment: Deployment, *, model_dtype: str
) -> tuple[str, str]:
    """The (conv, SSM) state dtypes vLLM 0.32 picks for this deployment."""
    conv = deployment.mamba_cache_dtype.strip().lower()
    conv = model_dtype if conv == "auto" else conv
    ssm = deployment.mamba_ssm_cache_dtype.strip().lower()
    if ssm == "auto" and state.ssm_dtype_default is not None:
        ssm = state.ssm_dtype_default
    ssm = conv if ssm == "auto" else ssm
    if deployment.device == "cpu" and ssm != "float32" and state.kind != "short_conv":
        kept = (
            deployment.mamba_ssm_cache_dtype in {"float16", "bfloat16"}
            and state.lists_linear_attention
        )
        ssm = ssm if kept else "float32"
    for dtype in (conv, ssm):
        dtype_bytes(dtype)  # validates
    return conv, ssm


def state_page_bytes(
    state: StateLayers, *, tensor_parallel: int, conv_dtype: str, ssm_dtype: str
) -> int:
    """Bytes one state layer keeps per sequence on one GPU (vLLM's unpadded MambaSpec page)."""
    conv, temporal = state.element_counts(tensor_parallel)
    return conv * dtype_bytes(conv_dtype) + temporal * dtype_bytes(ssm_dtype)


def hybrid_block_size(
    *, block_size: int, attention_token_bytes: int, state_bytes: int, device: Device
) -> int:
    """The attention block size vLLM uses so that one attention page holds a whole state."""
    kernel = _KERNEL_BLOCK[device]
    align = max(kernel, block_size)
    needed = align * math.ceil(state_bytes / (align * attention_token_bytes))
    needed = kernel * math.ceil(needed / kernel)
    return max(block_size, needed)


def _state_admission_blocks(state: StateLayers, mode: str) -> int:
    if mode == "none":
        return 1
    checkpoint = 1 if state.kind == "mamba2" else 0
    return 2 + checkpoint


def hybrid_groups(
    arch: ModelArch,
    state: StateLayers,
    *,
    max_model_len: int,
    block_size: int,
    batched: int,
    mode: str,
) -> tuple[tuple[KvCacheGroup, ...], int]:
    """vLLM's KV-cache groups of a hybrid model and its group size (layers per page)."""
    window_of: dict[LayerKind, int | None] = {
        "full": None,
        "sliding": arch.sliding_window,
        "chunked": arch.attention_chunk_size,
    }
    buckets: list[tuple[GroupKind, int | None, int, int]] = []
    counts: dict[LayerKind, int] = {}
    for kind in arch.kinds:
        counts[kind] = counts.get(kind, 0) + 1
    for attention, layers in counts.items():
        window = window_of[attention]
        need = _admission_blocks(attention, window, max_model_len, block_size, batched)
        buckets.append((attention, window, layers, need))
    buckets.append(("state", None, state.num_layers, _state_admission_blocks(state, mode)))
    sizes = [layers for _, _, layers, _ in buckets]
    smallest, largest = min(sizes), max(sizes)
    group_size = largest if largest < smallest * 1.5 else smallest
    groups: list[KvCacheGroup] = []
    for group_kind, window, layers, need in buckets:
        groups.extend(
            KvCacheGroup(
                kind=group_kind,
                window=window,
                num_layers=group_size,
                blocks_per_max_len_request=need,
            )
            for _ in range(math.ceil(layers / group_size))
        )
    return tuple(groups), group_size


# --- sparse-attention MLA (DeepSeek V3.2) ------------------------------------------------------
#
# vLLM 0.32's layout, read from its source (CUDA; the CPU build has no sparse-MLA backend):
# - every decoder layer holds two caches (vllm/models/deepseek_v32/attention.py,
#   DeepseekV32Attention.__init__; with no index_topk_freq / index_topk_pattern each layer builds
#   an indexer): the MLA latent, MLAAttention.get_kv_cache_spec
#   (model_executor/layers/attention/mla_attention.py): MLAAttentionSpec, one head of
#   kv_lora_rank + qk_rope_head_dim values in the KV dtype, or the packed 656-byte fp8_ds_mla row;
#   and the indexer key, DeepseekV32IndexerCache.get_kv_cache_spec
#   (model_executor/models/deepseek_v2.py): MLAAttentionSpec of head_size 132, uint8.
# - both are replicated on every TP rank (num_kv_heads=1, max_tp_shards=1).
# - backend and cache format (platforms/cuda.py _get_backend_priorities; the backends'
#   supported_kv_cache_dtypes and supports_combination; mla_attention.py
#   _canonicalize_sparse_mla_kv_cache_dtype): a 16-bit cache is the latent in bf16/fp16 on every
#   sparse backend of SM90 and SM100; --kv-cache-dtype fp8 is served on SM90 by FLASHMLA_SPARSE,
#   which turns it into fp8_ds_mla (656 B), and on SM100 by FLASHINFER_MLA_SPARSE as plain fp8
#   (576 B; qk_nope_head_dim 128 or 192, else FLASHMLA_SPARSE's fp8_ds_mla); SM120 forces
#   fp8_ds_mla even for auto, and other GPUs have no sparse-MLA backend.
# - block size (platforms/interface.py _preferred_block_size_for_backends): 16 is taken by no
#   backend, so the smallest common one, 64; a --block-size must be a multiple of 64.
# - grouping (v1/core/kv_cache_utils.py get_kv_cache_groups): both specs are MLAAttentionSpec,
#   whose uniform-type base is FullAttentionSpec (v1/core/single_type_kv_cache_manager.py
#   register_all_kvcache_specs), with one block size, so UniformTypeKVCacheSpecs.from_specs
#   makes ONE group whose page is the sum of every layer's pages
#   (v1/kv_cache_interface.py UniformTypeKVCacheSpecs.page_size_bytes); num_blocks =
#   budget // that page (get_kv_cache_config_from_groups; the layer-outer layout's per-layer
#   alignment, sparse_utils.align_blocks_to_rows, divides a 64-token page, so nothing is padded).
# - capacity (get_max_concurrency_for_kv_cache_config): one group, cdiv(max_model_len, block)
#   blocks per max-length request, so kv_cache_size_tokens = int(blocks / that x max_model_len).

GpuFamily = Literal["sm90", "sm100", "other", "unknown"]
#: Product-name fragments of the CUDA GPUs whose sparse-MLA backends were read: Hopper (SM90) and
#: data-centre Blackwell (SM100). Other named GPUs are declined.
_SM90_NAMES = ("h100", "h200", "h800", "h20", "gh200")
_SM100_NAMES = ("b100", "b200", "b300")


def sparse_gpu_family(gpu_name: str | None) -> GpuFamily:
    """Which of vLLM 0.32's sparse-MLA backend lists a GPU gets, from its product name."""
    if gpu_name is None:
        return "unknown"
    name = gpu_name.lower()
    if any(part in name for part in _SM90_NAMES):
        return "sm90"
    if any(part in name for part in _SM100_NAMES):
        return "sm100"
    return "other"


@dataclass(frozen=True, slots=True)
class SparseLayout:
    """A sparse-MLA model's cache as vLLM lays it out: bytes per token per layer, block size."""

    latent_bytes: int
    indexer_bytes: int
    cache_format: str
    block_size: int
    assumptions: tuple[str, ...] = ()

    @property
    def layer_bytes(self) -> int:
        """Latent plus indexer key: one layer's share of a token in the single group's page."""
        return self.latent_bytes + self.indexer_bytes


def _sparse_unsupported(arch: ModelArch, deployment: Deployment) -> str | None:
    """What about this deployment of a sparse-MLA model was not read from vLLM's source."""
    mla, version = arch.mla, deployment.vllm_version
    if mla is None or (mla.kv_lora_rank, mla.qk_rope_head_dim) != (512, 64):
        return "a latent other than 512 + 64 values, for which no sparse-MLA kernel was read"
    if deployment.device != "cuda":
        return "the CPU backend: vLLM's CPU build has no sparse-MLA attention"
    if version < STATE_ARITHMETIC_OF:
        return (
            f"vLLM {version}: the indexer cache is sized the way vLLM {STATE_ARITHMETIC_OF} "
            f"lays it out; give --vllm-version {STATE_ARITHMETIC_OF} or later"
        )
    if deployment.pipeline_parallel > 1 or deployment.speculative is not None:
        return (
            "pipeline parallelism: per-stage indexer caches are not modelled; use --pp 1"
            if deployment.pipeline_parallel > 1
            else "speculative decoding: the MTP drafter's indexer cache is not modelled"
        )
    if sparse_gpu_family(deployment.gpu_name) == "other":
        return (
            f"{deployment.gpu_name}: vLLM 0.32 serves it on Hopper (SM90) and Blackwell "
            "(SM100) with the layouts modelled here; SM120 forces fp8_ds_mla and older GPUs "
            "have no sparse-MLA backend"
        )
    return None


def sparse_mla_layout(
    arch: ModelArch, deployment: Deployment, *, model_dtype: str
) -> SparseLayout | Declined | None:
    """The latent's and indexer's bytes per token, the format and block size (None: not sparse).

    Raises :class:`UsageError` for what vLLM itself refuses (a block size that is not a multiple
    of 64, a float32 cache).
    """
    if arch.indexer is None or arch.mla is None:
        return None
    why = _sparse_unsupported(arch, deployment)
    if why is not None:
        return Declined(arch.name, f"sparse-attention MLA (DeepSeek V3.2 indexer) with {why}")
    block = deployment.block_size or SPARSE_MLA_BLOCK_SIZE
    if block % SPARSE_MLA_BLOCK_SIZE:
        raise UsageError(
            f"--block-size {block}: vLLM's sparse-MLA and indexer kernels take blocks of a "
            f"multiple of {SPARSE_MLA_BLOCK_SIZE} tokens and refuse it; drop --block-size"
        )
    notes = []
    if deployment.vllm_version > STATE_ARITHMETIC_OF:
        notes.append(
            f"sparse-MLA layout of vLLM {STATE_ARITHMETIC_OF} (read from its source), assumed "
            f"unchanged in {deployment.vllm_version}"
        )
    latent = _sparse_latent(arch, arch.mla, deployment, model_dtype=model_dtype, notes=notes)
    if isinstance(latent, Declined):
        return latent
    return SparseLayout(
        latent[0], arch.indexer.bytes_per_token, latent[1], block, assumptions=tuple(notes)
    )


def _sparse_latent(
    arch: ModelArch, mla: MlaDims, deployment: Deployment, *, model_dtype: str, notes: list[str]
) -> tuple[int, str] | Declined:
    """The latent's bytes per token per layer and its cache format, for the GPU's backend."""
    family = sparse_gpu_family(deployment.gpu_name)
    key = deployment.kv_cache_dtype.strip().lower()
    if key in {"fp8", "fp8_ds_mla"} and model_dtype != "bfloat16":
        # FLASHMLA_SPARSE runs bf16 models only; which backend takes an fp16 one was not read.
        return Declined(
            arch.name,
            f"sparse-attention MLA with an fp8 cache on a {model_dtype} model: the backend "
            "vLLM picks for it was not pinned down from its source; use --dtype bfloat16",
        )
    if key in {"fp8", "fp8_ds_mla"}:
        if key == "fp8" and family == "unknown":
            return Declined(
                arch.name,
                "sparse-attention MLA with --kv-cache-dtype fp8 on an unnamed GPU: vLLM stores "
                f"{FP8_DS_MLA_BYTES} bytes per token (fp8_ds_mla) on Hopper and "
                f"{mla.values_per_token} (plain fp8) on Blackwell; give --gpu",
            )
        if family == "unknown":
            notes.append("GPU assumed Hopper or Blackwell (SM90/SM100): fp8_ds_mla on both")
        if key == "fp8" and family == "sm100" and arch.head_dim in (128, 192):
            return mla.values_per_token, "fp8"
        return FP8_DS_MLA_BYTES, "fp8_ds_mla"
    if key != "auto" and (key in _FP8_KV or key.startswith(("fp8", "int8", "nvfp4"))):
        return Declined(
            arch.name,
            f"sparse-attention MLA with --kv-cache-dtype {deployment.kv_cache_dtype}: which "
            "backend serves it and in what layout was not pinned down from vLLM's source; "
            "use auto, bfloat16, fp8 or fp8_ds_mla",
        )
    element = kv_bytes_per_element(key, model_dtype=model_dtype)
    if element != 2:
        raise UsageError(
            f"sparse-attention MLA keeps its cache in bf16/fp16 or fp8; vLLM refuses a "
            f"{element}-byte cache: use --kv-cache-dtype auto or fp8 (and --dtype bfloat16)"
        )
    if family == "unknown":
        notes.append(
            "GPU assumed Hopper or data-centre Blackwell (SM90/SM100); an SM120 GPU stores "
            f"fp8_ds_mla ({FP8_DS_MLA_BYTES} bytes) even with auto"
        )
    return mla.values_per_token * element, model_dtype if key == "auto" else key


# --- weights -----------------------------------------------------------------------------------


def param_split(arch: ModelArch) -> tuple[ParamSplit, bool]:
    """Split the parameter count; the flag says whether it was estimated from the shape."""
    vocab = arch.vocab_size or 0
    embedding = vocab * arch.hidden_size
    lm_head = 0 if arch.tie_word_embeddings else embedding
    if arch.per_layer_inputs is not None:
        embedding += arch.per_layer_inputs.table_params(arch.num_layers)
    experts = 0
    if arch.moe is not None:
        moe = arch.moe
        experts = moe.moe_layers * moe.num_experts * 3 * arch.hidden_size
        experts *= moe.expert_intermediate_size
    if arch.params is not None:
        return ParamSplit(arch.params, embedding, lm_head, min(experts, arch.params)), False
    return ParamSplit(estimate_params(arch), embedding, lm_head, experts), True


def estimate_params(arch: ModelArch) -> int:
    """Parameters implied by the shape alone (gated MLP, no biases, no norms): for planning.

    Gemma 3n's and 4's per-layer input embeddings and their projections count.
    """
    hidden = arch.hidden_size
    embedding = (arch.vocab_size or DEFAULT_VOCAB_SIZE) * hidden
    mlp = 3 * hidden * (arch.intermediate_size or 4 * hidden)
    dense = _attention_params(arch) + arch.num_layers * mlp
    experts = 0
    if arch.moe is not None:
        moe = arch.moe
        experts = moe.moe_layers * (moe.num_experts * 3 * hidden * moe.expert_intermediate_size)
        dense -= moe.moe_layers * mlp
    heads_out = 0 if arch.tie_word_embeddings else embedding
    ple = arch.per_layer_inputs
    if ple is not None:
        dense += ple.table_params(arch.num_layers) + ple.projection_params(arch.num_layers, hidden)
    return embedding + heads_out + dense + experts


def _attention_params(arch: ModelArch) -> int:
    """The attention weights of every layer: Q, K, V and O at each KV layer's own shape.

    A KV-sharing layer (Gemma 3n, Gemma 4) builds Q and O only (gemma3n.py, gemma4.py: no K or V
    weights when ``is_kv_shared_layer``), at the model's ``head_dim``: its own is not kept.
    """
    hidden, heads = arch.hidden_size, arch.num_attention_heads
    if arch.mla is not None:
        return arch.num_layers * hidden * (arch.mla.values_per_token + 3 * heads * arch.head_dim)
    shapes = arch.layer_shapes or ((arch.num_kv_heads, arch.head_dim),)
    kv_layers = len(arch.layer_shapes) or arch.num_layers - arch.kv_shared_layers
    per_shape = [2 * hidden * (heads + kv_heads) * head_dim for kv_heads, head_dim in shapes]
    kv_attention = sum(per_shape) if arch.layer_shapes else kv_layers * per_shape[0]
    shared = (arch.num_layers - kv_layers) * 2 * hidden * heads * arch.head_dim
    return kv_attention + shared


def _check_weights_cover_embeddings(
    arch: ModelArch, split: ParamSplit, known_total_bytes: int | None, *, dtype_size: int
) -> None:
    """Refuse a weights figure smaller than the model's input embeddings: it cannot be right.

    Every format keeps the embeddings in 16 bits (or the checkpoint's dtype, if that is smaller),
    so a checkpoint below them is a truncated download, git-lfs pointer files, or a mistyped
    override; sizing on it would put the freed gigabytes into the KV cache. The LM head is left
    out: a config may not say that it is tied (Gemma's leave ``tie_word_embeddings`` to their
    class, whose default is tied), and a floor counting it twice refused real checkpoints.
    """
    vocab_params = split.embedding
    try:
        size = min(dtype_size, dtype_bytes(arch.dtype))
    except UsageError:
        size = dtype_size
    floor = vocab_params * size
    if known_total_bytes is not None and known_total_bytes < floor:
        raise UsageError(
            f"{arch.name}: a weights figure of {known_total_bytes:,} bytes is smaller than the "
            f"model's embeddings alone ({floor / 2**30:,.2f} GiB): a checkpoint cloned without "
            "git-lfs or downloaded in part (run `git lfs pull`), or a wrong weights override"
        )


def stage_weights_bytes(
    arch: ModelArch,
    *,
    layers: tuple[int, ...],
    model_dtype: str,
    quantization: str | None,
    known_total_bytes: int | None,
    tensor_parallel: int,
) -> tuple[tuple[int, ...], bool]:
    """Weights on one GPU of each pipeline stage; the flag says whether params were estimated.

    The first stage holds the embedding, the last the LM head (a copy of the embedding when
    tied and pipelined); decoder layers are split evenly. TP splits every stage evenly.
    """
    split, estimated = param_split(arch)
    size = dtype_bytes(model_dtype)
    embedding = split.embedding * size
    lm_head = split.lm_head * size
    _check_weights_cover_embeddings(arch, split, known_total_bytes, dtype_size=size)
    if known_total_bytes is not None:
        total, estimated = float(known_total_bytes), False
    else:
        fmt = weight_format(quantization if quantization is not None else arch.quantization)
        total = weights_bytes_total(split, fmt=fmt, dtype_size=size)
    decoder = max(0.0, total - embedding - lm_head)
    stages = []
    for i, stage_layers in enumerate(layers):
        stage = decoder * stage_layers / arch.num_layers
        if i == 0:
            stage += embedding
        if i == len(layers) - 1:
            stage += lm_head if lm_head or len(layers) == 1 else embedding
        stages.append(int(stage / tensor_parallel))
    return tuple(stages), estimated


# --- the model ---------------------------------------------------------------------------------


def default_utilization(version: VllmVersion) -> float:
    """vLLM's default ``--gpu-memory-utilization`` for this version."""
    return UTILIZATION if version.at_least(0, 20) else UTILIZATION_BEFORE_0_20


def batch_limits(deployment: Deployment, *, max_model_len: int | None = None) -> SchedulerLimits:
    """The scheduler limits vLLM's API server runs ``deployment`` with (given or defaulted)."""
    return scheduler_limits(
        SchedulerInputs(
            version=deployment.vllm_version,
            device=deployment.device,
            gpu_memory_bytes=deployment.gpu_memory_bytes,
            gpu_name=deployment.gpu_name,
            world_size=deployment.tensor_parallel * deployment.pipeline_parallel,
            max_model_len=max_model_len,
            max_num_seqs=deployment.max_num_seqs,
            max_num_batched_tokens=deployment.max_num_batched_tokens,
            max_num_queued_reqs=deployment.max_num_queued_reqs,
        )
    )


def _validate(arch: ModelArch, deployment: Deployment) -> None:
    util = deployment.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise UsageError(f"GPU memory utilization must be in (0, 1], got {util}")
    tp, pp = deployment.tensor_parallel, deployment.pipeline_parallel
    if tp < 1 or pp < 1:
        raise UsageError(f"--tp and --pp must be at least 1, got tp={tp} pp={pp}")
    if pp > arch.num_layers:
        raise UsageError(f"--pp {pp} exceeds the model's {arch.num_layers} layers")
    heads = arch.num_attention_heads
    if heads % tp:
        raise UsageError(
            f"--tp {tp} does not divide the model's {heads} attention heads; vLLM refuses this "
            "(verify_with_parallel_config): pick a TP that divides them"
        )
    kv = arch.num_kv_heads
    if arch.mla is None and (tp % kv if tp > kv else kv % tp):
        raise UsageError(
            f"--tp {tp} and the model's {kv} KV heads do not divide each other; vLLM refuses "
            "this: pick a TP that divides the KV heads or is a multiple of them"
        )
    if deployment.gpu_memory_bytes <= 0 and deployment.kv_cache_memory_bytes is None:
        raise UsageError("GPU memory must be positive: give --gpu NAME or --gpu-mem-gib")
    if deployment.block_size is not None and deployment.block_size < 1:
        raise UsageError(f"--block-size must be positive, got {deployment.block_size}")
    if deployment.max_model_len is not None and deployment.max_model_len < 1:
        raise UsageError(f"--max-model-len must be positive, got {deployment.max_model_len}")
    if deployment.kv_cache_memory_bytes is not None and deployment.kv_cache_memory_bytes < 0:
        raise UsageError("--kv-cache-memory-bytes must not be negative")
    if deployment.device == "cpu" and deployment.kv_cache_memory_bytes is None:
        raise UsageError("the CPU backend sizes its KV cache from --kv-cache-memory-bytes; give it")


def _block_size(arch: ModelArch, deployment: Deployment) -> int:
    if deployment.block_size is not None:
        return deployment.block_size
    if deployment.device == "cpu":
        return GPU_BLOCK_SIZE if arch.mla is not None else CPU_BLOCK_SIZE
    return GPU_BLOCK_SIZE


def _stage(
    arch: ModelArch,
    deployment: Deployment,
    *,
    index: int,
    layers: int,
    last: bool,
    weights: int,
    usable: int,
    block_bytes: int,
    vocab: int,
    max_num_seqs: int,
    lora: int = 0,
) -> StageSizing:
    """Budget and blocks of one GPU of one pipeline stage."""
    if deployment.kv_cache_memory_bytes is not None:
        overhead = OverheadEstimate(0, 0, 0, source="not used")
        budget = deployment.kv_cache_memory_bytes
    else:
        if deployment.overhead_bytes is not None:
            overhead = OverheadEstimate(deployment.overhead_bytes, 0, 0, source="override")
        else:
            overhead = estimate_overhead(
                vocab_size=vocab,
                max_num_seqs=max_num_seqs,
                is_moe=arch.moe is not None,
                samples=last,
                tensor_parallel=deployment.tensor_parallel,
                layers_on_gpu=layers,
                version=deployment.vllm_version,
                enforce_eager=deployment.enforce_eager,
            )
        # LoRA buffers are allocated at model load, before the profile run measures it.
        budget = usable - weights - lora - overhead.total_bytes
    blocks = max(0, budget // block_bytes)
    return StageSizing(index, layers, weights, overhead, budget, block_bytes, blocks, lora)


@dataclass(slots=True)
class _Layout:
    """KV-cache groups, group size and block size; for hybrids also the state's facts."""

    groups: tuple[KvCacheGroup, ...]
    group_size: int
    block_size: int
    state_bytes: int = 0
    state_dtypes: tuple[str, ...] = ()
    requested_block_size: int | None = None
    mamba_cache_mode: str | None = None
    assumptions: list[str] = field(default_factory=list)
    #: Bytes of one block and KV bytes per token where layers' pages differ (None: uniform).
    block_bytes: int | None = None
    bytes_per_token: int | None = None


def _hybrid_layout(
    arch: ModelArch,
    state: StateLayers,
    deployment: Deployment,
    *,
    model_dtype: str,
    attention_token_bytes: int,
    block_size: int,
    max_model_len: int,
    batched: int,
) -> _Layout | Declined:
    """Groups and block size of a hybrid as vLLM 0.32 lays them out, or why not."""
    version = deployment.vllm_version
    if version < STATE_ARITHMETIC_OF:
        return Declined(
            arch.name,
            f"hybrid state-space model on vLLM {version}: its state pages are sized the way "
            f"vLLM {STATE_ARITHMETIC_OF} sizes them, and older releases differ; give "
            f"--vllm-version {STATE_ARITHMETIC_OF} or later",
        )
    if deployment.pipeline_parallel > 1 or arch.mla is not None:
        return Declined(
            arch.name,
            "hybrid state-space model with "
            + ("pipeline parallelism" if deployment.pipeline_parallel > 1 else "MLA attention")
            + ": vLLM's per-stage state pages are not modelled; size it with --pp 1",
        )
    conv_dtype, ssm_dtype = _state_dtypes(state, deployment, model_dtype=model_dtype)
    state_bytes = state_page_bytes(
        state,
        tensor_parallel=deployment.tensor_parallel,
        conv_dtype=conv_dtype,
        ssm_dtype=ssm_dtype,
    )
    raised = hybrid_block_size(
        block_size=block_size,
        attention_token_bytes=attention_token_bytes,
        state_bytes=state_bytes,
        device=deployment.device,
    )
    mode = "align" if deployment.enable_prefix_caching else "none"
    groups, group_size = hybrid_groups(
        arch, state, max_model_len=max_model_len, block_size=raised, batched=batched, mode=mode
    )
    assumptions = []
    if version > STATE_ARITHMETIC_OF:
        assumptions.append(
            f"hybrid state sized with vLLM {STATE_ARITHMETIC_OF}'s arithmetic (read from its "
            f"source), assumed unchanged in {version}"
        )
    if deployment.device == "cuda":
        assumptions.append(
            "attention backend assumed FlashAttention 2/3 (kernel blocks of 16 tokens); "
            "FA4's head-dim-256 kernel on Blackwell picks other block sizes"
        )
    elif state.kind != "short_conv":
        assumptions.append(
            "the CPU is assumed to have AVX512-BF16 (vLLM then keeps the SSM state in "
            "float32 unless --mamba-ssm-cache-dtype picks its 16-bit GDN path)"
        )
    return _Layout(
        groups,
        group_size,
        raised,
        state_bytes=state_bytes,
        state_dtypes=(conv_dtype, ssm_dtype),
        requested_block_size=block_size,
        mamba_cache_mode=mode,
        assumptions=assumptions,
    )


# --- layers of different page sizes (Gemma 4) ---------------------------------------------------
#
# vLLM 0.32's arithmetic, read from its source (v1/core/kv_cache_utils.py of the 0.32.0 package):
# - each KV-holding layer's spec is its own AttentionSpec: KV heads on this rank x head_dim, K and
#   V both stored (Gemma 4's attention_k_eq_v only loads K's weights into V: gemma4.py
#   Gemma4Attention passes k and v to Attention), page = 2 x heads x head_dim x B_kv x block.
# - layout: specs of mixed (heads, head size, page) shapes narrow vLLM's layout choice to
#   block-compact ones (v1/attention/backends/utils.py resolve_kv_cache_layout); CPU_ATTN takes
#   LBHNC only, FlashAttention / Triton none in particular (LBNHC first): layer-outermost either
#   way, so _get_packed_kv_cache_groups (block-outermost only) returns None.
# - all layers of one attention type (UniformTypeKVCacheSpecs.from_specs, same block size): one
#   group whose page is the sum of every layer's page (get_kv_cache_groups).
# - else unify_kv_cache_spec_page_size: a layer whose page divides the largest gets block_size x
#   (largest / its page) tokens per block; any other non-MLA attention page is padded to the
#   largest (page_size_padded). Then _get_kv_cache_groups_uniform_page_size: one bucket per
#   distinct spec, group size = the smallest bucket (the largest when within 1.5x), each bucket in
#   cdiv(layers, group size) groups; num_blocks = budget // (group size x largest page)
#   (_get_kv_cache_bytes_per_block; layer-outer strides need no extra alignment here).
# - a group's blocks per max-length request use its own block size
#   (get_max_concurrency_for_kv_cache_config: cdiv(max_memory_usage_bytes, page_size_bytes)); the
#   log's "kv cache group sizes" lists each group's block size.
# Verified on real vLLM 0.32.0 (CPU) with tiny Gemma 4 models (tests/fixtures/configs/README.md).


def _mixed_shape_layout(
    arch: ModelArch,
    deployment: Deployment,
    *,
    kv_element: int,
    block_size: int,
    max_model_len: int,
    batched: int,
) -> _Layout | Declined:
    """Groups, per-group block sizes and block bytes when layers' KV pages differ, or why not."""
    version, tp = deployment.vllm_version, deployment.tensor_parallel
    if version < STATE_ARITHMETIC_OF:
        return Declined(
            arch.name,
            f"layers of different KV head shapes on vLLM {version}: their pages are unified the "
            f"way vLLM {STATE_ARITHMETIC_OF} does it (read from its source); give --vllm-version "
            f"{STATE_ARITHMETIC_OF} or later",
        )
    if deployment.pipeline_parallel > 1:
        return Declined(
            arch.name,
            "pipeline parallelism with layers of different KV head shapes: each stage's page "
            "unification is not modelled; size it with --pp 1",
        )
    for heads in sorted({heads for heads, _ in arch.layer_shapes}):
        if tp % heads if tp > heads else heads % tp:
            raise UsageError(
                f"--tp {tp} and the {heads} KV heads of some of the model's layers do not divide "
                "each other; vLLM refuses this: pick a TP that divides every layer's KV heads"
            )
    window_of: dict[LayerKind, int | None] = {
        "full": None,
        "sliding": arch.sliding_window,
        "chunked": arch.attention_chunk_size,
    }
    # One spec per KV-holding layer: (kind, KV heads on this rank, head_dim).
    specs = [
        (kind, kv_heads_per_gpu(heads, tp), head_dim)
        for kind, (heads, head_dim) in zip(arch.kinds, arch.layer_shapes, strict=True)
    ]
    token_bytes = {spec: 2 * spec[1] * spec[2] * kv_element for spec in specs}
    total_token_bytes = sum(token_bytes[spec] for spec in specs)
    notes: list[str] = []
    if version > STATE_ARITHMETIC_OF:
        notes.append(
            f"pages of different sizes unified as vLLM {STATE_ARITHMETIC_OF} does (read from its "
            f"source), assumed unchanged in {version}"
        )
    if deployment.device == "cuda" and deployment.block_size is None:
        notes.append(
            "block size assumed 16 (vLLM's default with its Triton or FlashAttention kernels); "
            "on Blackwell its FA4 head-dim-256 kernel takes 128-token blocks, and with an FP8 "
            "cache on Hopper its head-dim-512 kernel 64-token pages: give --block-size to match"
        )
    if len({kind for kind, _, _ in specs}) == 1:
        # UniformTypeKVCacheSpecs: one group, one block holds every layer's page.
        kind = specs[0][0]
        window = window_of[kind]
        group = KvCacheGroup(
            kind=kind,
            window=window,
            num_layers=len(specs),
            blocks_per_max_len_request=_admission_blocks(
                kind, window, max_model_len, block_size, batched
            ),
        )
        return _Layout(
            (group,),
            len(specs),
            block_size,
            assumptions=notes,
            block_bytes=block_size * total_token_bytes,
            bytes_per_token=total_token_bytes,
        )
    pages = {spec: block_size * token_bytes[spec] for spec in specs}
    largest = max(pages.values())
    # spec -> (its block size, whether its page is padded to the largest)
    unified = {
        spec: (block_size * (largest // page), False) if largest % page == 0 else (block_size, True)
        for spec, page in pages.items()
    }
    buckets: dict[tuple[tuple[LayerKind, int, int], int, bool], int] = {}
    for spec in specs:
        key = (spec, *unified[spec])
        buckets[key] = buckets.get(key, 0) + 1
    smallest_bucket, largest_bucket = min(buckets.values()), max(buckets.values())
    group_size = largest_bucket if largest_bucket < smallest_bucket * 1.5 else smallest_bucket
    groups: list[KvCacheGroup] = []
    for ((kind, _, _), group_block, _), layers in buckets.items():
        window = window_of[kind]
        need = _admission_blocks(kind, window, max_model_len, group_block, batched)
        groups.extend(
            KvCacheGroup(
                kind=kind,
                window=window,
                num_layers=group_size,
                blocks_per_max_len_request=need,
                block_size=group_block,
            )
            for _ in range(math.ceil(layers / group_size))
        )
    raised = sorted({b for (_, b, padded) in buckets if b != block_size and not padded})
    padded_layers = sum(layers for (_, _, padded), layers in buckets.items() if padded)
    if raised:
        notes.append(
            f"pages of different sizes: vLLM raises the smaller pages' blocks to "
            f"{'/'.join(map(str, raised))} tokens so every page is {largest:,} bytes"
        )
    if padded_layers:
        notes.append(
            f"pages of different sizes: {padded_layers} layers' pages are padded to the largest "
            f"({largest:,} bytes), the padding holding no KV"
        )
    return _Layout(
        tuple(groups),
        group_size,
        block_size,
        assumptions=notes,
        block_bytes=group_size * largest,
        bytes_per_token=total_token_bytes,
    )


def _declined_for(arch: ModelArch, deployment: Deployment) -> Declined | None:
    """Why this model, or this model under this deployment, is not sized; None when it is."""
    if arch.declined is not None:
        return Declined(arch.name, arch.declined)
    if arch.kv_free_layers and deployment.pipeline_parallel > 1:
        return Declined(
            arch.name,
            f"pipeline parallelism with {arch.kv_free_layers} layers that hold no KV (KV sharing "
            "or no attention): how many KV layers each stage gets is not modelled; size it with "
            "--pp 1",
        )
    return None


def _layout_for(
    arch: ModelArch,
    deployment: Deployment,
    *,
    model_dtype: str,
    kv_element: int,
    layer_bytes: int,
    block_size: int,
    max_model_len: int,
    batched: int,
) -> _Layout | Declined:
    """KV-cache groups, group size and block size: hybrid, per-layer shapes, or uniform pages."""
    if arch.state is not None:
        return _hybrid_layout(
            arch,
            arch.state,
            deployment,
            model_dtype=model_dtype,
            attention_token_bytes=layer_bytes,
            block_size=block_size,
            max_model_len=max_model_len,
            batched=batched,
        )
    if arch.layer_shapes:
        return _mixed_shape_layout(
            arch,
            deployment,
            kv_element=kv_element,
            block_size=block_size,
            max_model_len=max_model_len,
            batched=batched,
        )
    groups, group_size = kv_cache_groups(
        arch,
        max_model_len=max_model_len,
        block_size=block_size,
        max_num_batched_tokens=batched,
        hybrid_allocator=deployment.vllm_version >= HYBRID_ALLOCATOR_SINCE,
    )
    return _Layout(groups, group_size, block_size)


def size_deployment(arch: ModelArch, *, deployment: Deployment) -> SizingResult | Declined:
    """Size the KV cache of ``arch`` under ``deployment``; :class:`Declined` if it cannot be.

    Raises :class:`~exporter.errors.UsageError` for contradictory inputs (utilization outside
    (0, 1], a TP that does not divide the KV heads, ...).
    """
    declined = _declined_for(arch, deployment)
    if declined is not None:
        return declined
    _validate(arch, deployment)
    version = deployment.vllm_version
    tp, pp = deployment.tensor_parallel, deployment.pipeline_parallel

    model_dtype = resolve_model_dtype(deployment.dtype, checkpoint_dtype=arch.dtype)
    kv_element = kv_bytes_per_element(deployment.kv_cache_dtype, model_dtype=model_dtype)
    sparse = sparse_mla_layout(arch, deployment, model_dtype=model_dtype)
    if isinstance(sparse, Declined):
        return sparse
    # A sparse-MLA model's latent and indexer pages of every layer make one block (one group).
    layer_bytes = (
        sparse.layer_bytes
        if sparse is not None
        else layer_bytes_per_token(arch, tensor_parallel=tp, kv_element_bytes=kv_element)
    )
    block_size = sparse.block_size if sparse is not None else _block_size(arch, deployment)
    assumptions: list[str] = list(sparse.assumptions) if sparse is not None else []
    max_model_len = deployment.max_model_len or arch.default_max_model_len
    if max_model_len is None:
        raise UsageError(
            f"{arch.name}: the model does not say its context length: give --max-model-len"
        )
    scheduler = batch_limits(deployment, max_model_len=max_model_len)
    max_num_seqs, batched = scheduler.max_num_seqs, scheduler.max_num_batched_tokens
    layout = _layout_for(
        arch,
        deployment,
        model_dtype=model_dtype,
        kv_element=kv_element,
        layer_bytes=layer_bytes,
        block_size=block_size,
        max_model_len=max_model_len,
        batched=in_flight_tokens(deployment, batched),
    )
    if isinstance(layout, Declined):
        return layout
    assumptions.extend(layout.assumptions)
    groups, group_size, block_size = layout.groups, layout.group_size, layout.block_size
    claimants = _claimants(
        arch, deployment, model_dtype=model_dtype, kv_element=kv_element, assumptions=assumptions
    )
    if isinstance(claimants, Declined):
        return claimants
    draft, lora_shape = claimants

    util = deployment.gpu_memory_utilization
    if util is None:
        util = default_utilization(version)
    usable = int(deployment.gpu_memory_bytes * util)
    layers = pipeline_partition(arch.num_layers, pp)
    weights, params_estimated = stage_weights_bytes(
        arch,
        layers=layers,
        model_dtype=model_dtype,
        quantization=deployment.quantization,
        known_total_bytes=deployment.weights_bytes,
        tensor_parallel=tp,
    )
    if params_estimated:
        assumptions.append("parameter count estimated from the architecture (give --params-b)")
    if arch.multimodal and deployment.overhead_bytes is None:
        assumptions.append(_encoder_cache_note(arch, batched=batched, model_dtype=model_dtype))
    vocab = arch.vocab_size
    if vocab is None:
        vocab = DEFAULT_VOCAB_SIZE
        if deployment.kv_cache_memory_bytes is None and deployment.overhead_bytes is None:
            assumptions.append(f"vocabulary unknown: assumed {vocab:,} for the sampler warm-up")

    stages = tuple(
        _stage(
            arch,
            deployment,
            index=index,
            layers=stage_layers,
            last=index == len(layers) - 1,
            weights=weights[index] + draft.weights_bytes,
            usable=usable,
            block_bytes=(
                layout.block_bytes
                if layout.block_bytes is not None
                else block_size
                * layer_bytes
                * max(1, math.ceil(group_size * stage_layers / arch.num_layers))
                + block_size * draft.bytes_per_token
            ),
            vocab=vocab,
            max_num_seqs=max_num_seqs,
            lora=(
                0
                if lora_shape is None or deployment.lora is None
                else lora_bytes(
                    lora_shape,
                    deployment.lora,
                    tensor_parallel=tp,
                    layers=stage_layers,
                    first_stage=index == 0,
                    last_stage=index == len(layers) - 1,
                    model_dtype=model_dtype,
                )
            ),
        )
        for index, stage_layers in enumerate(layers)
    )

    # vLLM gives every stage the block count of the smallest one.
    limiting = min(stages, key=lambda stage: (stage.kv_blocks, stage.kv_budget_bytes))
    return SizingResult(
        model=arch.name,
        attention_kind=arch.attention_kind,
        vllm_version=version,
        device=deployment.device,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        model_dtype=model_dtype,
        kv_cache_dtype=deployment.kv_cache_dtype,
        kv_bytes_per_element=kv_element,
        kv_heads_per_gpu=1 if arch.mla is not None else kv_heads_per_gpu(arch.num_kv_heads, tp),
        # A hybrid's KV per token is its attention layers'; the state is per sequence.
        layers_per_gpu=arch.attention_layers or max(layers),
        bytes_per_token=(
            layout.bytes_per_token
            if layout.bytes_per_token is not None
            else layer_bytes * (arch.attention_layers or max(layers)) + draft.bytes_per_token
        ),
        block_size=block_size,
        gpu_memory_bytes=deployment.gpu_memory_bytes,
        gpu_memory_utilization=util,
        usable_bytes=usable,
        weights_bytes=limiting.weights_bytes,
        overhead=limiting.overhead,
        kv_budget_bytes=limiting.kv_budget_bytes,
        kv_budget_source=(
            "estimate" if deployment.kv_cache_memory_bytes is None else "kv-cache-memory-bytes"
        ),
        block_bytes=limiting.block_bytes,
        kv_blocks=limiting.kv_blocks,
        kv_pool_tokens=limiting.kv_blocks * block_size,
        kv_groups=groups,
        max_model_len=max_model_len,
        scheduler=scheduler,
        stages=stages,
        assumptions=tuple(assumptions),
        state_bytes=layout.state_bytes,
        state_dtypes=layout.state_dtypes,
        requested_block_size=layout.requested_block_size,
        mamba_cache_mode=layout.mamba_cache_mode,
        lora_bytes=limiting.lora_bytes,
        lora=deployment.lora,
        speculative=deployment.speculative,
        draft_weights_bytes=draft.weights_bytes,
        draft_bytes_per_token=draft.bytes_per_token,
        lookahead_tokens=draft.lookahead_tokens,
        sparse_latent_bytes=sparse.latent_bytes if sparse is not None else 0,
        sparse_indexer_bytes=sparse.indexer_bytes if sparse is not None else 0,
        sparse_cache_format=sparse.cache_format if sparse is not None else None,
    )


def _encoder_cache_note(arch: ModelArch, *, batched: int, model_dtype: str) -> str:
    """Why a multimodal model's encoder cache is not subtracted, with its lower bound.

    vLLM 0.32's profile run (``GPUModelRunner.profile_run``, vllm/v1/worker/gpu_model_runner.py)
    first encodes a batch of dummy items of the largest size and keeps their outputs in the
    encoder cache, whose budget is ``max(max_num_batched_tokens, tokens of the largest item)``
    (``compute_mm_encoder_budget``, vllm/v1/core/encoder_cache_manager.py). The item's tokens
    come from the model's processor, not its config, and the encoder's own activation peak from
    its implementation: neither can be sized from config.json.
    """
    floor = batched * arch.hidden_size * dtype_bytes(model_dtype)
    return (
        f"multimodal model: vLLM's profile run also holds the encoder cache (at least "
        f"{batched:,} tokens x {arch.hidden_size:,} x {dtype_bytes(model_dtype)} bytes = "
        f"{floor / 2**20:,.0f} MiB) and the encoder's activation peak; they depend on the "
        "model's processor, not its config, and are not modelled separately"
    )


def _claimants(
    arch: ModelArch,
    deployment: Deployment,
    *,
    model_dtype: str,
    kv_element: int,
    assumptions: list[str],
) -> tuple[_Draft, LoraShape | None] | Declined:
    """What a drafter and LoRA add, or why either cannot be sized."""
    draft = _Draft()
    if deployment.speculative is not None:
        found_draft = _draft_costs(
            arch,
            deployment.speculative,
            deployment,
            model_dtype=model_dtype,
            kv_element=kv_element,
            assumptions=assumptions,
        )
        if isinstance(found_draft, Declined):
            return found_draft
        draft = found_draft
    if deployment.lora is None:
        return draft, None
    found_shape = _lora_shape(arch, deployment.lora, deployment, assumptions)
    if isinstance(found_shape, Declined):
        return found_shape
    return draft, found_shape


@dataclass(frozen=True, slots=True)
class _Draft:
    """What a drafter adds on each GPU: weights, KV bytes per token, lookahead slots."""

    weights_bytes: int = 0
    bytes_per_token: int = 0
    lookahead_tokens: int = 0


def _only_full_attention(model: ModelArch) -> bool:
    return model.state is None and set(model.kinds) == {"full"} and not model.layer_shapes


def _draft_costs(
    arch: ModelArch,
    spec: SpeculativeDecoding,
    deployment: Deployment,
    *,
    model_dtype: str,
    kv_element: int,
    assumptions: list[str],
) -> _Draft | Declined:
    """The drafter's weights and KV per token on one GPU, or why they cannot be sized."""
    tp = deployment.tensor_parallel
    if spec.num_speculative_tokens < 1:
        raise UsageError(
            f"--num-speculative-tokens must be at least 1, got {spec.num_speculative_tokens}"
        )
    if (spec.draft is None) == (spec.mtp_layers == 0):
        raise UsageError("speculative decoding needs one drafter: a draft model or MTP layers")
    if spec.mtp_layers < 0:
        raise UsageError(f"--mtp-layers must be at least 1, got {spec.mtp_layers}")
    if spec.mtp_layers and arch.mtp_layers is not None and spec.mtp_layers > arch.mtp_layers:
        raise UsageError(
            f"--mtp-layers {spec.mtp_layers}: {arch.name}'s config has "
            f"num_nextn_predict_layers {arch.mtp_layers}; give at most that"
        )
    if deployment.pipeline_parallel > 1:
        return Declined(
            arch.name,
            "speculative decoding with pipeline parallelism: where vLLM places the drafter's "
            "layers is not modelled; size it with --pp 1",
        )
    drafter = spec.draft or arch
    for model in {arch.name: arch, drafter.name: drafter}.values():
        if not _only_full_attention(model):
            return Declined(
                arch.name,
                f"speculative decoding with {model.name}'s {model.attention_kind} layers: only "
                "all-full-attention target and drafter share one KV-cache group the way "
                "plan models it; size it without the drafter",
            )
    if (drafter.mla is None) != (arch.mla is None):
        return Declined(
            arch.name,
            "a draft model with a different attention kind (MLA next to MHA/GQA) than the "
            "target: vLLM's page unification for that pair is not modelled",
        )
    kv_per_layer = layer_bytes_per_token(drafter, tensor_parallel=tp, kv_element_bytes=kv_element)
    if spec.draft is not None:
        draft = spec.draft
        if draft.mla is None and (
            tp % draft.num_kv_heads if tp > draft.num_kv_heads else draft.num_kv_heads % tp
        ):
            raise UsageError(
                f"--tp {tp} and the draft's {draft.num_kv_heads} KV heads do not divide each "
                "other; vLLM runs the draft at the target's TP: pick a draft that fits it"
            )
        (weights,), estimated = stage_weights_bytes(
            draft,
            layers=(draft.num_layers,),
            model_dtype=model_dtype,
            quantization=None,
            known_total_bytes=spec.draft_weights_bytes,
            tensor_parallel=tp,
        )
        if estimated:
            assumptions.append(
                f"draft {draft.name}: parameter count estimated from its shape (its checkpoint "
                "size was not found)"
            )
        return _Draft(weights, kv_per_layer * draft.num_layers, spec.num_speculative_tokens)
    # MTP layers: the target's decoder-layer shape, embedding and LM head shared with the
    # target (llm_base_proposer.py _maybe_share_embeddings / _maybe_share_lm_head), plus an
    # eh_proj of 2 x hidden x hidden, a plain nn.Linear replicated on every rank
    # (deepseek_mtp.py DeepSeekMultiTokenPredictorLayer).
    (total,), _ = stage_weights_bytes(
        arch,
        layers=(arch.num_layers,),
        model_dtype=model_dtype,
        quantization=deployment.quantization,
        known_total_bytes=deployment.weights_bytes,
        tensor_parallel=tp,
    )
    split, _ = param_split(arch)
    shared = (split.embedding + split.lm_head) * dtype_bytes(model_dtype) // tp
    per_layer = max(0, total - shared) // arch.num_layers
    eh_proj = 2 * arch.hidden_size * arch.hidden_size * dtype_bytes(model_dtype)
    assumptions.append("MTP layers' weights assumed those of an average decoder layer plus eh_proj")
    return _Draft(
        spec.mtp_layers * (per_layer + eh_proj),
        kv_per_layer * spec.mtp_layers,
        spec.num_speculative_tokens,
    )


def _lora_shape(
    arch: ModelArch, settings: LoraSettings, deployment: Deployment, assumptions: list[str]
) -> LoraShape | Declined:
    """The layer sizes vLLM's LoRA buffers follow, or why they cannot be sized."""
    settings.validate()
    unmodelled = arch.moe is not None or arch.mla is not None or arch.state is not None
    if unmodelled or arch.kv_free_layers or arch.layer_shapes:
        what = (
            "MoE experts"
            if arch.moe
            else "MLA projections"
            if arch.mla
            else "state layers"
            if arch.state
            else "layers of different head shapes"
            if arch.layer_shapes and not arch.kv_free_layers
            else "layers without their own attention or KV"
        )
        return Declined(
            arch.name,
            f"--enable-lora on a model with {what}: vLLM's LoRA buffers for those layers are not "
            "modelled (only dense attention + gated-MLP decoders); size without --enable-lora "
            "and subtract them with --overhead-gib",
        )
    vocab = arch.vocab_size or DEFAULT_VOCAB_SIZE
    embedding_lora = arch.architecture is None or arch.architecture in EMBEDDING_LORA_ARCHITECTURES
    if embedding_lora and vocab > LORA_MAX_VOCAB:
        raise UsageError(
            f"{arch.name}: vLLM refuses LoRA with a vocabulary of {vocab:,} (over "
            f"{LORA_MAX_VOCAB:,}); drop --enable-lora"
        )
    intermediate = arch.intermediate_size
    if intermediate is None:
        intermediate = 4 * arch.hidden_size
        assumptions.append(f"intermediate size unknown: assumed {intermediate:,} for LoRA")
    if deployment.vllm_version != STATE_ARITHMETIC_OF:
        assumptions.append(
            f"LoRA buffers sized with vLLM {STATE_ARITHMETIC_OF}'s layers (read from its source), "
            f"assumed the same in {deployment.vllm_version}"
        )
    if arch.architecture is None:
        assumptions.append(
            "model class unknown: embedding and LM-head LoRA buffers counted (Llama, Qwen3 have "
            "them; Qwen2, Gemma, Mistral do not): give the model's config.json"
        )
    return LoraShape(
        embedding_lora=embedding_lora,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        head_dim=arch.head_dim,
        kv_heads_per_gpu=kv_heads_per_gpu(arch.num_kv_heads, deployment.tensor_parallel),
        intermediate_size=intermediate,
        vocab_size=vocab,
    )


def require_sized(outcome: SizingResult | Declined) -> SizingResult:
    """Return the result, or raise :class:`UnsupportedModelError` with the decline reason."""
    if isinstance(outcome, Declined):
        raise UnsupportedModelError(f"{outcome.model}: {outcome.reason}")
    return outcome


# --- the inverse questions ---------------------------------------------------------------------


def utilization_needed(
    arch: ModelArch, *, deployment: Deployment, sequences: int, context_tokens: int
) -> float | None:
    """Smallest ``--gpu-memory-utilization`` (to 0.001) for ``sequences`` of ``context_tokens``.

    None if even 1.0 is not enough, or if ``--kv-cache-memory-bytes`` fixes the budget.
    """
    if sequences < 1:
        raise UsageError(f"number of sequences must be at least 1, got {sequences}")
    if deployment.kv_cache_memory_bytes is not None:
        return None

    def holds(util: float) -> bool:
        outcome = size_deployment(arch, deployment=replace(deployment, gpu_memory_utilization=util))
        result = require_sized(outcome)
        return result.sequences_at(context_tokens) >= sequences

    if not holds(1.0):
        return None
    low, high = 0, 1000  # in thousandths; holds(high / 1000) is always true here
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle / 1000):
            high = middle
        else:
            low = middle
    return high / 1000
