"""GPU memory vLLM pre-allocates for LoRA adapters (``--enable-lora``), per GPU.

vLLM wraps every LoRA-capable layer at model load and gives it zeroed A and B buffers for
``max_loras`` adapter slots at ``max_lora_rank``, in the LoRA dtype (the model dtype unless
``--lora-dtype``). They are allocated before the profile run, so they count as model memory and
come out of the KV budget. Read from vLLM 0.32.0's source:

- ``vllm/lora/layers/base_linear.py`` ``BaseLinearLayerWithLoRA.create_lora_weights``: per slot,
  A is ``rank x input_size`` and B ``output_size x rank``; column-parallel layers keep the whole
  input and their output shard, row-parallel ones their input shard and the whole output.
- ``vllm/lora/layers/column_parallel_linear.py``: ``qkv_proj`` has three slices (q shard, k and v
  shards: ``heads / tp x head_dim``, ``kv_heads_per_gpu x head_dim``), ``gate_up_proj`` two
  (``intermediate / tp`` each), each with its own A of ``rank x hidden``.
- ``vllm/lora/layers/vocab_parallel_embedding.py`` ``create_lora_weights``: the input embedding,
  A ``vocab x rank`` and B ``hidden x rank``, not split by TP; ``logits_processor.py``
  ``LogitsProcessorWithLoRA.create_lora_weights``: the LM head, A ``rank x hidden`` and B ``vocab
  x rank``, not split by TP (vLLM refuses LoRA with a vocabulary over 258,048).
- ``vllm/lora/utils.py`` ``get_supported_lora_modules``: every linear layer, plus the model's
  ``embedding_modules`` (``embed_tokens``, ``lm_head`` for Llama, Qwen3, Granite...; none for
  Qwen2, Gemma, Mistral: :data:`EMBEDDING_LORA_ARCHITECTURES`).
- ``vllm/config/lora.py`` ``LoRAConfig``: ``max_loras`` 1, ``max_lora_rank`` 16 (one of 1, 8, 16,
  32, 64, 128, 256, 320, 512), ``max_cpu_loras`` = ``max_loras`` when not given and never below
  it. ``max_cpu_loras`` is host memory (the LRU cache of loaded adapters), not GPU memory.

Not counted (each under a few MiB at default batch sizes): Punica's int64 index buffers
(``punica_wrapper/punica_base.py``) and the profile run's fp32 ``[tokens, rank]`` shrink buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.errors import UsageError
from exporter.sizing.weights import dtype_bytes

#: The ranks vLLM 0.32 accepts for ``--max-lora-rank`` (``MaxLoRARanks`` in vllm/config/lora.py).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Architectures whose vLLM 0.32 model class declares ``embedding_modules`` (``embed_tokens``,
#: ``lm_head``), inherited or its own: only these get embedding and LM-head LoRA buffers. Read
#: from the 0.32.0 package: each ``model_executor/models/registry.py`` entry's class, resolved
#: through its bases to a non-empty ``embedding_modules`` dict (Qwen2, Gemma, Mistral, DeepSeek
#: and the ``...ForConditionalGeneration`` wrappers declare none or an empty one).
EMBEDDING_LORA_ARCHITECTURES = frozenset(
    (
        "ApertusForCausalLM",
        "Cohere2ForCausalLM",
        "CohereForCausalLM",
        "DeciLMForCausalLM",
        "Eagle3Qwen3ForCausalLM",
        "EagleCohereForCausalLM",
        "EagleMiniCPMForCausalLM",
        "Ernie4_5ForCausalLM",
        "Exaone4ForCausalLM",
        "ExaoneForCausalLM",
        "ExaoneMoEForCausalLM",
        "ExaoneMoeForCausalLM",
        "FalconH1ForCausalLM",
        "GraniteForCausalLM",
        "GraniteMoeForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "GraniteMoeSharedForCausalLM",
        "GraniteSWAForCausalLM",
        "HyperCLOVAXForCausalLM",
        "IQuestCoderForCausalLM",
        "InternLM3ForCausalLM",
        "JambaForCausalLM",
        "K2HorizonForCausalLM",
        "LLaMAForCausalLM",
        "Lfm2ForCausalLM",
        "Lfm2MoeForCausalLM",
        "Llama4ForCausalLM",
        "LlamaForCausalLM",
        "MiniCPM3ForCausalLM",
        "MiniCPMForCausalLM",
        "MixtralForCausalLM",
        "NemotronForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "Param2MoEForCausalLM",
        "PeagleQwen3ForCausalLM",
        "Phi3ForCausalLM",
        "PhiMoEForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "SolarForCausalLM",
        "TeleChat2ForCausalLM",
        "TeleChat3ForCausalLM",
        "TeleFLMForCausalLM",
    )
)
#: The dtypes ``--lora-dtype`` takes (``LoRADType`` in vllm/config/lora.py).
LORA_DTYPES = ("auto", "float16", "bfloat16")
#: ``LogitsProcessorWithLoRA`` refuses larger vocabularies.
LORA_MAX_VOCAB = 258_048


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """``--enable-lora`` and its sizes, as vLLM's ``LoRAConfig`` takes them."""

    max_loras: int = 1
    max_lora_rank: int = 16
    #: Host-memory adapter cache; None means ``max_loras``. Never GPU memory.
    max_cpu_loras: int | None = None
    #: ``--lora-dtype``: ``auto`` (the model dtype), ``float16`` or ``bfloat16``.
    lora_dtype: str = "auto"

    def validate(self) -> None:
        """Refuse what vLLM refuses, with the fix."""
        if self.max_loras < 1:
            raise UsageError(f"--max-loras must be at least 1, got {self.max_loras}")
        if self.max_lora_rank not in LORA_RANKS:
            ranks = ", ".join(str(r) for r in LORA_RANKS)
            raise UsageError(f"--max-lora-rank {self.max_lora_rank} is not one of vLLM's: {ranks}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise UsageError(
                f"--max-cpu-loras ({self.max_cpu_loras}) must be >= --max-loras "
                f"({self.max_loras}), as vLLM requires"
            )
        if self.lora_dtype not in LORA_DTYPES:
            raise UsageError(
                f"--lora-dtype {self.lora_dtype!r} is not one of vLLM's: {', '.join(LORA_DTYPES)}"
            )

    @property
    def cpu_slots(self) -> int:
        """Adapters vLLM keeps loaded in host memory (``max_cpu_loras``, default ``max_loras``)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


@dataclass(frozen=True, slots=True)
class LoraShape:
    """The layer sizes LoRA buffers follow: a dense attention + gated-MLP decoder."""

    hidden_size: int
    num_attention_heads: int
    head_dim: int
    #: KV heads on one GPU (replicated once TP exceeds the KV heads).
    kv_heads_per_gpu: int
    intermediate_size: int
    vocab_size: int
    #: Whether the model class has embedding and LM-head LoRA buffers.
    embedding_lora: bool = True


def layer_lora_elements(shape: LoraShape, *, rank: int, tensor_parallel: int) -> int:
    """A and B values of one adapter slot in one decoder layer on one GPU.

    ``qkv_proj`` (3 slices), ``o_proj`` (row-parallel), ``gate_up_proj`` (2 slices), ``down_proj``
    (row-parallel).
    """
    tp = tensor_parallel
    hidden = shape.hidden_size
    q_shard = shape.num_attention_heads // tp * shape.head_dim
    kv_shard = shape.kv_heads_per_gpu * shape.head_dim
    inter_shard = shape.intermediate_size // tp
    qkv = 3 * rank * hidden + (q_shard + 2 * kv_shard) * rank
    o_proj = rank * q_shard + hidden * rank
    gate_up = 2 * rank * hidden + 2 * inter_shard * rank
    down = rank * inter_shard + hidden * rank
    return qkv + o_proj + gate_up + down


def embedding_lora_elements(shape: LoraShape, *, rank: int) -> int:
    """A and B values of one slot of the input embedding, or of the LM head (the same count)."""
    return rank * (shape.vocab_size + shape.hidden_size)


def lora_bytes(
    shape: LoraShape,
    settings: LoraSettings,
    *,
    tensor_parallel: int,
    layers: int,
    first_stage: bool,
    last_stage: bool,
    model_dtype: str,
) -> int:
    """LoRA buffers on one GPU of a pipeline stage holding ``layers`` decoder layers."""
    rank = settings.max_lora_rank
    elements = layers * layer_lora_elements(shape, rank=rank, tensor_parallel=tensor_parallel)
    if shape.embedding_lora:
        elements += (first_stage + last_stage) * embedding_lora_elements(shape, rank=rank)
    dtype = model_dtype if settings.lora_dtype == "auto" else settings.lora_dtype
    return settings.max_loras * elements * dtype_bytes(dtype)
