"""``vllm-headroom plan``: size a vLLM deployment before starting it.

Shows the whole chain from GPU memory to concurrent sequences, then what-ifs (FP8 KV cache,
utilization up and down a step, TP x2, the next larger GPU, other ``--max-model-len`` values).
``--json`` prints one object whose keys are documented in ``docs/sizing.md``. The arithmetic is
:mod:`exporter.sizing.model`; this module parses flags, resolves names and renders.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from exporter.cli.numbers import NO_CAP, Bounded, whole
from exporter.core.reasons import Limit
from exporter.errors import ModelConfigError, ModelNotFoundError, UsageError
from exporter.sizing.catalog import (
    find_gpu,
    gpus,
    models,
    unknown_model_error,
)
from exporter.sizing.lookup import FoundModel, find_model_arch
from exporter.sizing.lora import LoraSettings
from exporter.sizing.model import (
    Deployment,
    MlaDims,
    ModelArch,
    SizingResult,
    SpeculativeDecoding,
    param_split,
    require_sized,
    size_deployment,
)
from exporter.sizing.overhead import GIB
from exporter.sizing.plan import ceiling_rows, what_ifs, what_it_needs
from exporter.vllm.version import LATEST_KNOWN, parse_vllm_version

if TYPE_CHECKING:
    import argparse

GB = 10**9
DEFAULT_CONTEXTS = (2000, 8000)
_SHAPE_FLAGS = ("layers", "kv_heads", "head_dim", "params_b")


#: Largest amount a GiB/GB flag takes (1 EiB): far past any GPU, small enough to stay exact.
MAX_GIB = 2.0**30


def _amount(unit: str, example: str, *, zero_ok: bool = False) -> Bounded:
    """A size flag: a finite amount above 0 (or 0 too, where 0 means none), at most 1 EiB."""
    return Bounded(unit, 0.0, MAX_GIB, example, above=not zero_ok)


NAME = "plan"
HELP = "size a deployment: KV bytes per token, budget, blocks, sequences, what-ifs"
DESCRIPTION = __doc__.splitlines()[0] if __doc__ else ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``plan``; every number is checked as it is read (one line when bad)."""
    model = parser.add_argument_group("model (a name, hub id or path; or the explicit shape)")
    model.add_argument("--model", help="catalogue name, cached Hugging Face id, or model path")
    model.add_argument("--layers", type=whole("layers", 1, "32"), help="number of decoder layers")
    model.add_argument(
        "--kv-heads", type=whole("heads", 1, "8"), help="KV heads (= attention heads for MHA)"
    )
    model.add_argument("--head-dim", type=whole("", 1, "128"), help="head dimension")
    model.add_argument(
        "--heads", type=whole("heads", 1, "32"), help="attention heads (default: the KV heads)"
    )
    model.add_argument(
        "--hidden-size",
        type=whole("", 1, "4096"),
        help="hidden size (default: heads x head_dim)",
    )
    model.add_argument(
        "--params-b",
        type=_amount("billion parameters", "8"),
        help="parameters in billions (all experts)",
    )
    model.add_argument(
        "--vocab-size",
        type=whole("tokens", 1, "128256"),
        help="vocabulary size (drives the sampler)",
    )
    model.add_argument(
        "--kv-lora-rank", type=whole("", 1, "512"), help="MLA latent rank (DeepSeek: 512)"
    )
    model.add_argument(
        "--qk-rope-head-dim", type=whole("", 1, "64"), help="MLA RoPE dimension (DeepSeek: 64)"
    )
    model.add_argument("--quant", help="weight format: fp8, int8, w8a8, awq, gptq, mxfp4...")
    weights = model.add_mutually_exclusive_group()
    weights.add_argument(
        "--weights-gib", type=_amount("GiB", "15"), help="known checkpoint size, GiB (total)"
    )
    weights.add_argument(
        "--weights-gb", type=_amount("GB", "16"), help="known checkpoint size, GB (total)"
    )
    hardware = parser.add_argument_group("hardware and vLLM settings")
    memory = hardware.add_mutually_exclusive_group()
    memory.add_argument("--gpu", help="catalogue GPU name (vllm-headroom plan --list-gpus)")
    memory.add_argument(
        "--gpu-mem-gib", type=_amount("GiB", "80"), help="CUDA-visible memory per GPU, GiB"
    )
    memory.add_argument(
        "--gpu-mem-gb", type=_amount("GB", "80"), help="memory per GPU in GB (10^9 bytes)"
    )
    hardware.add_argument(
        "--gpu-util", type=Bounded("", 0.0, 1.0, "0.9", above=True), help="--gpu-memory-utilization"
    )
    hardware.add_argument(
        "--tp", type=whole("GPUs", 1, "2"), default=1, help="tensor parallel size"
    )
    hardware.add_argument(
        "--pp", type=whole("GPUs", 1, "2"), default=1, help="pipeline parallel size"
    )
    hardware.add_argument("--dtype", default="auto", help="--dtype (auto, bfloat16, float16...)")
    hardware.add_argument("--kv-dtype", default="auto", help="--kv-cache-dtype (auto, fp8...)")
    hardware.add_argument(
        "--block-size", type=whole("tokens", 1, "16"), help="--block-size (default 16)"
    )
    hardware.add_argument(
        "--max-model-len", type=whole("tokens", 1, "8192"), help="--max-model-len"
    )
    hardware.add_argument(
        "--allow-long-max-model-len",
        action="store_true",
        help="size a --max-model-len past the model's own limit, as vLLM with "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 serves it",
    )
    hardware.add_argument(
        "--kv-cache-memory-bytes",
        type=whole("bytes", 0, "40000000000"),
        help="exact KV budget per GPU",
    )
    hardware.add_argument(
        "--max-num-seqs",
        type=whole("sequences", 1, "256"),
        help="--max-num-seqs (default: vLLM's for that version and GPU)",
    )
    hardware.add_argument(
        "--max-num-queued-reqs",
        type=whole("requests", 0, "1024", otherwise=NO_CAP),
        help="--max-num-queued-reqs, the admission cap (default: none, as vLLM)",
    )
    hardware.add_argument(
        "--max-num-batched-tokens",
        type=whole("tokens", 1, "8192"),
        help="--max-num-batched-tokens (default: vLLM's for that version and GPU)",
    )
    hardware.add_argument(
        "--mamba-cache-dtype",
        default="auto",
        help="hybrids: --mamba-cache-dtype (conv state; auto = the model dtype)",
    )
    hardware.add_argument(
        "--mamba-ssm-cache-dtype",
        default="auto",
        help="hybrids: --mamba-ssm-cache-dtype (SSM state; auto = the conv state's)",
    )
    hardware.add_argument(
        "--no-enable-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="hybrids: vLLM without prefix caching keeps 1 state block per request, not 2-3",
    )
    _add_claimant_arguments(parser)
    overhead = hardware.add_mutually_exclusive_group()
    overhead.add_argument(
        "--overhead-gib",
        type=_amount("GiB", "4", zero_ok=True),
        help="overhead per GPU, GiB (override)",
    )
    overhead.add_argument(
        "--overhead-gb",
        type=_amount("GB", "4", zero_ok=True),
        help="overhead per GPU, GB (override)",
    )
    hardware.add_argument("--vllm-version", help=f"vLLM version (default {LATEST_KNOWN})")
    hardware.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    question = parser.add_argument_group("questions and output")
    question.add_argument(
        "--context-tokens",
        type=whole("tokens", 1, "2000"),
        action="append",
        help=f"context length to count sequences at (repeatable; default {DEFAULT_CONTEXTS})",
    )
    question.add_argument(
        "--sequences",
        type=whole("sequences", 1, "64"),
        help="target sequences: report the utilization and GPU needed",
    )
    question.add_argument("--json", action="store_true", help="print one JSON object")
    question.add_argument("--list-models", action="store_true", help="list catalogue models")
    question.add_argument("--list-gpus", action="store_true", help="list catalogue GPUs")


def _add_claimant_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the memory claimants besides weights, KV cache and overhead."""
    lora = parser.add_argument_group("LoRA adapters (vLLM pre-allocates their GPU buffers)")
    lora.add_argument(
        "--enable-lora", action="store_true", help="--enable-lora: subtract the LoRA buffers"
    )
    lora.add_argument(
        "--max-loras",
        type=whole("adapters", 1, "4"),
        help="--max-loras: adapter slots on the GPU (default 1)",
    )
    lora.add_argument(
        "--max-lora-rank", type=whole("", 1, "16"), help="--max-lora-rank (default 16)"
    )
    lora.add_argument(
        "--max-cpu-loras",
        type=whole("adapters", 1, "8"),
        help="--max-cpu-loras: host-memory cache, not GPU memory",
    )
    lora.add_argument("--lora-dtype", help="--lora-dtype (auto: the model dtype)")
    spec = parser.add_argument_group(
        "speculative decoding (a drafter's weights and KV come out of the budget)"
    )
    drafter = spec.add_mutually_exclusive_group()
    drafter.add_argument(
        "--speculative-draft-model",
        metavar="MODEL",
        help="draft model or EAGLE head: catalogue name, cached HF id or path (its config.json)",
    )
    drafter.add_argument(
        "--mtp-layers",
        type=whole("layers", 1, "1"),
        help="MTP layers of the target's own shape (DeepSeek: num_nextn_predict_layers)",
    )
    spec.add_argument(
        "--num-speculative-tokens",
        type=whole("tokens", 1, "4"),
        help="num_speculative_tokens: lookahead slots per sequence (MTP default: the layers)",
    )


# --- inputs ------------------------------------------------------------------------------------


def _explicit_arch(args: argparse.Namespace) -> ModelArch:
    missing = [
        f"--{flag.replace('_', '-')}" for flag in _SHAPE_FLAGS if getattr(args, flag) is None
    ]
    if missing:
        raise UsageError(f"give --model, or the whole shape: missing {', '.join(missing)}")
    mla = None
    if (args.kv_lora_rank is None) != (args.qk_rope_head_dim is None):
        raise UsageError("MLA needs both --kv-lora-rank and --qk-rope-head-dim")
    if args.kv_lora_rank is not None:
        mla = MlaDims(args.kv_lora_rank, args.qk_rope_head_dim)
    heads = args.heads or args.kv_heads
    if heads % args.kv_heads:
        raise UsageError(f"--heads {heads} is not a multiple of --kv-heads {args.kv_heads}")
    return ModelArch(
        name="custom",
        num_layers=args.layers,
        num_attention_heads=heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_size=args.hidden_size or heads * args.head_dim,
        vocab_size=args.vocab_size,
        params=round(args.params_b * 1e9),
        mla=mla,
    )


def _found_model(name: str, *, weights_given: bool = False) -> FoundModel:
    """``name`` (catalogue name or model directory) found, or the one-line error saying why not.

    An unreadable checkpoint is an error unless the weights were given (``--weights-gib``).
    """
    try:
        found = find_model_arch(name)
    except ModelNotFoundError:
        raise unknown_model_error(name) from None
    if found.weights_error is not None and not weights_given:
        raise ModelConfigError(found.weights_error)
    return found


def resolve_arch(args: argparse.Namespace) -> tuple[ModelArch, int | None]:
    """The architecture from ``--model`` or the explicit flags, and known weights if any."""
    shape_given = [flag for flag in (*_SHAPE_FLAGS, "kv_lora_rank") if getattr(args, flag)]
    if args.model is None:
        arch = _explicit_arch(args)
        _check_params(arch)
        return arch, None
    if any(flag not in {"params_b", "kv_lora_rank"} for flag in shape_given):
        raise UsageError("give --model or the explicit shape (--layers...), not both")
    weights_given = args.weights_gib is not None or args.weights_gb is not None
    found = _found_model(args.model, weights_given=weights_given)
    arch, weights = found.arch, found.weights_bytes
    if args.kv_lora_rank is not None and arch.mla is None:
        raise UsageError(
            f"--kv-lora-rank is an MLA field, but {arch.name} uses {arch.attention_kind}"
        )
    if args.params_b is not None:
        arch = replace(arch, params=round(args.params_b * 1e9))
    if args.vocab_size is not None:
        arch = replace(arch, vocab_size=args.vocab_size)
    _check_params(arch)
    return arch, weights


def _check_params(arch: ModelArch) -> None:
    """Refuse a ``--params-b`` below the model's input embeddings: the weights would be wrong.

    The LM head is left out (it may be tied without the config saying so, as Gemma's).
    """
    split, _ = param_split(arch)
    embeddings = split.embedding
    if arch.params is not None and arch.params < embeddings:
        raise UsageError(
            f"--params-b {arch.params / 1e9:g} is less than {arch.name}'s embeddings alone "
            f"({embeddings / 1e9:.3g}B parameters): give the whole parameter count in billions"
        )


def resolve_deployment(args: argparse.Namespace, *, known_weights: int | None) -> Deployment:
    """The deployment described by the flags."""
    gpu_name = None
    if args.gpu is not None:
        spec = find_gpu(args.gpu)
        memory, gpu_name = spec.memory_bytes, spec.name.lower()
    elif args.gpu_mem_gib is not None:
        memory = int(args.gpu_mem_gib * GIB)
    elif args.gpu_mem_gb is not None:
        memory = int(args.gpu_mem_gb * GB)
    elif args.kv_cache_memory_bytes is not None:
        memory = 0
    else:
        raise UsageError("give --gpu NAME or --gpu-mem-gib (GPU memory per GPU)")
    weights = known_weights
    if args.weights_gib is not None:
        weights = int(args.weights_gib * GIB)
    elif args.weights_gb is not None:
        weights = int(args.weights_gb * GB)
    overhead = None
    if args.overhead_gib is not None:
        overhead = int(args.overhead_gib * GIB)
    elif args.overhead_gb is not None:
        overhead = int(args.overhead_gb * GB)
    if weights is not None and weights < 0:
        raise UsageError("the weights override must not be negative")
    version = parse_vllm_version(args.vllm_version) if args.vllm_version else LATEST_KNOWN
    return Deployment(
        lora=_lora_settings(args),
        speculative=_speculative(args),
        gpu_memory_bytes=memory,
        vllm_version=version,
        gpu_memory_utilization=args.gpu_util,
        tensor_parallel=args.tp,
        pipeline_parallel=args.pp,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_dtype,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_queued_reqs=args.max_num_queued_reqs,
        weights_bytes=weights,
        overhead_bytes=overhead,
        quantization=args.quant,
        gpu_name=gpu_name,
        enforce_eager=args.enforce_eager,
        mamba_cache_dtype=args.mamba_cache_dtype,
        mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype,
        enable_prefix_caching=args.prefix_caching,
    )


def _speculative(args: argparse.Namespace) -> SpeculativeDecoding | None:
    tokens = args.num_speculative_tokens
    if args.speculative_draft_model is None and args.mtp_layers is None:
        if tokens is not None:
            raise UsageError(
                "--num-speculative-tokens without a drafter: add --speculative-draft-model "
                "or --mtp-layers (n-gram and suffix drafting hold no KV: leave them out)"
            )
        return None
    if args.mtp_layers is not None:
        return SpeculativeDecoding(
            num_speculative_tokens=args.mtp_layers if tokens is None else tokens,
            mtp_layers=args.mtp_layers,
        )
    if tokens is None:
        raise UsageError("--speculative-draft-model needs --num-speculative-tokens, as vLLM does")
    found = _found_model(args.speculative_draft_model)
    return SpeculativeDecoding(
        num_speculative_tokens=tokens, draft=found.arch, draft_weights_bytes=found.weights_bytes
    )


def _lora_settings(args: argparse.Namespace) -> LoraSettings | None:
    given = [
        f"--{flag.replace('_', '-')}"
        for flag in ("max_loras", "max_lora_rank", "max_cpu_loras", "lora_dtype")
        if getattr(args, flag) is not None
    ]
    if not args.enable_lora:
        if given:
            raise UsageError(f"{', '.join(given)} without --enable-lora: add --enable-lora")
        return None
    settings = LoraSettings(
        max_loras=1 if args.max_loras is None else args.max_loras,
        max_lora_rank=16 if args.max_lora_rank is None else args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
        lora_dtype=(args.lora_dtype or "auto").strip().lower(),
    )
    settings.validate()
    return settings


def _check_context(arch: ModelArch, args: argparse.Namespace) -> None:
    """Refuse a ``--max-model-len`` past the model's limit, as vLLM does without its override."""
    limit = arch.context_limit
    if args.max_model_len is None or limit is None or args.max_model_len <= limit:
        return
    if args.allow_long_max_model_len:
        return
    raise UsageError(
        f"--max-model-len {args.max_model_len:,} exceeds {arch.name}'s context length "
        f"{limit:,}: vLLM refuses it unless started with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; give "
        f"--max-model-len {limit:,} or less, or add --allow-long-max-model-len if you set that"
    )


def _check_fits(result: SizingResult) -> None:
    if result.fits:
        return
    overhead = result.overhead
    if result.scheduler.max_num_seqs_given and overhead.activation_bytes > result.usable_bytes / 2:
        raise UsageError(
            f"{result.model} does not fit: --max-num-seqs {result.max_num_seqs:,} makes vLLM's "
            f"sampler warm-up alone take {overhead.activation_bytes / GIB:,.2f} GiB of the "
            f"{result.usable_bytes / GIB:,.2f} GiB usable; lower --max-num-seqs"
        )
    exact = result.kv_budget_source == "kv-cache-memory-bytes"
    if exact or result.kv_budget_bytes > 0:
        # The weights and overhead fit (or are not subtracted): the budget holds under 2 blocks.
        fix = (
            "raise --kv-cache-memory-bytes"
            if exact
            else "lower --block-size, or leave the KV cache more memory (--gpu-util, --tp)"
        )
        raise UsageError(
            f"{result.model} has no room to serve: its KV budget of "
            f"{max(result.kv_budget_bytes, 0):,} bytes holds {result.kv_blocks} block(s) of "
            f"{result.block_size:,} tokens ({result.block_bytes:,} bytes each), and vLLM needs "
            f"at least 2 (one is its null block); {fix}"
        )
    raise UsageError(
        f"{result.model} does not fit: weights {result.weights_bytes / GIB:.2f} GiB + "
        + (f"LoRA {result.lora_bytes / GIB:.2f} GiB + " if result.lora is not None else "")
        + f"overhead "
        f"{result.overhead.total_bytes / GIB:.2f} GiB exceed {result.usable_bytes / GIB:.2f} GiB "
        f"at utilization {result.gpu_memory_utilization:g} (raise --tp, use a larger GPU, or a "
        "quantized checkpoint)"
    )


# --- output ------------------------------------------------------------------------------------


def to_json(
    result: SizingResult,
    *,
    contexts: list[int],
    what_if: list[dict[str, Any]],
    needs: dict[str, Any] | None,
) -> dict[str, Any]:
    """The stable ``--json`` object (keys documented in docs/sizing.md)."""
    overhead = result.overhead
    return {
        "model": result.model,
        "attention_kind": result.attention_kind,
        "vllm_version": str(result.vllm_version),
        "gpu_memory_bytes": result.gpu_memory_bytes,
        "gpu_memory_utilization": result.gpu_memory_utilization,
        "tensor_parallel": result.tensor_parallel,
        "pipeline_parallel": result.pipeline_parallel,
        "model_dtype": result.model_dtype,
        "kv_cache_dtype": result.kv_cache_dtype,
        "kv_bytes_per_element": result.kv_bytes_per_element,
        "kv_heads_per_gpu": result.kv_heads_per_gpu,
        "layers_per_gpu": result.layers_per_gpu,
        "bytes_per_token": result.bytes_per_token,
        "block_size": result.block_size,
        "usable_bytes": result.usable_bytes,
        "weights_bytes": result.weights_bytes,
        "lora_bytes": result.lora_bytes,
        "lora": (
            {
                "max_loras": result.lora.max_loras,
                "max_lora_rank": result.lora.max_lora_rank,
                "max_cpu_loras": result.lora.cpu_slots,
                "lora_dtype": result.lora.lora_dtype,
            }
            if result.lora is not None
            else None
        ),
        "speculative": _speculative_json(result),
        "overhead_bytes": overhead.total_bytes,
        "overhead": {
            "activation_bytes": overhead.activation_bytes,
            "non_torch_bytes": overhead.non_torch_bytes,
            "cuda_graph_bytes": overhead.cuda_graph_bytes,
            "source": overhead.source,
        },
        "kv_budget_bytes": result.kv_budget_bytes,
        "kv_budget_source": result.kv_budget_source,
        "block_bytes": result.block_bytes,
        "kv_blocks": result.kv_blocks,
        "usable_blocks": result.usable_blocks,
        "kv_capacity_tokens": result.kv_capacity_tokens,
        "kv_pool_tokens": result.kv_pool_tokens,
        "usable_tokens": result.usable_tokens,
        "max_model_len": result.max_model_len,
        "max_concurrency": result.max_concurrency,
        "kv_cache_size_tokens": result.kv_cache_size_tokens,
        "reported_capacity_tokens": result.reported_capacity_tokens,
        "max_model_len_fits": result.max_model_len_fits,
        "max_num_seqs": result.max_num_seqs,
        "max_num_seqs_source": "flag" if result.scheduler.max_num_seqs_given else "default",
        "max_num_seqs_rule": result.scheduler.rule,
        "max_num_batched_tokens": result.max_num_batched_tokens,
        "max_num_queued_reqs": result.scheduler.max_num_queued_reqs,
        "kv_cache_groups": [
            {
                "kind": group.kind,
                "window": group.window,
                "layers": group.num_layers,
                "block_size": group.block_size or result.block_size,
                "blocks_per_max_len_request": group.blocks_per_max_len_request,
            }
            for group in result.kv_groups
        ],
        "state": (
            {
                "bytes_per_layer": result.state_bytes,
                "dtypes": list(result.state_dtypes),
                "requested_block_size": result.requested_block_size,
                "mamba_cache_mode": result.mamba_cache_mode,
            }
            if result.mamba_cache_mode is not None
            else None
        ),
        "sparse_mla": (
            {
                "latent_bytes_per_layer": result.sparse_latent_bytes,
                "indexer_bytes_per_layer": result.sparse_indexer_bytes,
                "cache_format": result.sparse_cache_format,
            }
            if result.sparse_cache_format is not None
            else None
        ),
        "sequences": ceiling_rows(result, contexts),
        "needs": needs,
        "what_if": what_if,
        "assumptions": list(result.assumptions),
    }


def _speculative_json(result: SizingResult) -> dict[str, Any] | None:
    spec = result.speculative
    if spec is None:
        return None
    return {
        "method": spec.method,
        "draft_model": spec.draft.name if spec.draft is not None else None,
        "draft_layers": spec.draft.num_layers if spec.draft is not None else spec.mtp_layers,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "draft_weights_bytes": result.draft_weights_bytes,
        "draft_bytes_per_token": result.draft_bytes_per_token,
        "lookahead_tokens": result.lookahead_tokens,
    }


def _gib(value: int) -> str:
    return f"{value / GIB:,.2f} GiB"


def render(
    result: SizingResult,
    *,
    contexts: list[int],
    what_if: list[dict[str, Any]],
    needs: dict[str, Any] | None,
) -> str:
    """The human report: the chain, one number per line with its unit, then the what-ifs."""
    overhead = result.overhead
    lines = [
        f"{result.model}: {result.attention_kind}, vLLM {result.vllm_version}, "
        f"TP {result.tensor_parallel} x PP {result.pipeline_parallel}",
        "",
        f"  GPU memory                 {_gib(result.gpu_memory_bytes)} per GPU",
        f"  x utilization {result.gpu_memory_utilization:<12g} {_gib(result.usable_bytes)}",
        f"  - weights                  {_gib(result.weights_bytes)} per GPU"
        + (
            f" (drafter {_gib(result.draft_weights_bytes)} of it)"
            if result.speculative is not None
            else ""
        ),
        *(
            [
                f"  - LoRA buffers             {_gib(result.lora_bytes)}  ({result.lora.max_loras} "
                f"slot(s) at rank {result.lora.max_lora_rank}; {result.lora.cpu_slots} "
                "adapter(s) cached in host memory, not GPU)"
            ]
            if result.lora is not None
            else []
        ),
        f"  - overhead ({overhead.source:<8})      {_gib(overhead.total_bytes)}"
        f"  (activation {_gib(overhead.activation_bytes)}, non-torch "
        f"{_gib(overhead.non_torch_bytes)}, CUDA graphs {_gib(overhead.cuda_graph_bytes)})",
        f"  = KV budget                {_gib(result.kv_budget_bytes)}"
        + ("  (--kv-cache-memory-bytes)" if result.kv_budget_source != "estimate" else ""),
        "",
        f"  KV per token               {result.bytes_per_token:,} bytes "
        f"({result.layers_per_gpu} layers x {result.kv_heads_per_gpu} KV heads/GPU, "
        f"{result.kv_bytes_per_element} byte(s) per value, {result.kv_cache_dtype})"
        + (
            f" + drafter {result.draft_bytes_per_token:,} bytes"
            if result.speculative is not None
            else ""
        ),
        f"  block                      {result.block_size} tokens = {result.block_bytes:,} bytes",
        f"  blocks                     {result.kv_blocks:,} (1 reserved null block)",
        f"  KV capacity                {result.kv_capacity_tokens:,} tokens "
        f"(as vLLM logs it; max concurrency {result.max_concurrency:.2f}x at max-model-len "
        f"{result.max_model_len:,})",
        f"  KV pool                    {result.kv_pool_tokens:,} token slots "
        f"({result.usable_tokens:,} usable)",
        f"  max-num-seqs               {result.max_num_seqs:,} ({result.scheduler.rule})",
    ]
    if len(result.kv_groups) > 1 or result.kv_groups[0].kind != "full":
        kinds = ", ".join(
            f"{g.kind}{'/' + str(g.window) if g.window else ''}"
            + (
                f" ({g.block_size}-token blocks)"
                if g.block_size not in (None, result.block_size)
                else ""
            )
            for g in result.kv_groups
        )
        lines.append(f"  KV-cache groups            {len(result.kv_groups)}: {kinds}")
    if result.mamba_cache_mode is not None:
        raised = (
            f", block raised from {result.requested_block_size} so one page holds it"
            if result.requested_block_size != result.block_size
            else ", padded to the attention page"
        )
        lines.append(
            f"  state per layer            {result.state_bytes:,} bytes "
            f"({'/'.join(result.state_dtypes)}{raised}; mamba cache mode "
            f"{result.mamba_cache_mode})"
        )
    if result.sparse_cache_format is not None:
        lines.append(
            f"  per token per layer        latent {result.sparse_latent_bytes:,} bytes "
            f"({result.sparse_cache_format}) + indexer key {result.sparse_indexer_bytes:,} "
            "bytes (fp8 + scales), one KV-cache group"
        )
    if not result.max_model_len_fits:
        lines.append(
            "  warning: one max-model-len request does not fit; vLLM would refuse to start"
        )
    lines.append("")
    for row in ceiling_rows(result, contexts):
        t = row["context_tokens"]
        lines.append(
            f"  sequences of {t:>7,} tokens  {row['sequences']:>8,} "
            f"({row['blocks_per_sequence']:,} blocks each, "
            f"{result.bytes_per_token * t / 2**20:,.0f} MiB of KV each)"
        )
        if row["limited_by"] == Limit.MAX_NUM_SEQS:
            lines.append(
                f"    limited by max_num_seqs {result.scheduler.running_limit:,}; "
                f"the KV pool would hold {row['kv_sequences']:,}"
            )
        if row["limited_by"] == Limit.QUEUE_CAP:
            lines.append(
                f"    limited by --max-num-queued-reqs {result.scheduler.max_num_queued_reqs:,} "
                f"(past it vLLM answers 503); the KV pool would hold {row['kv_sequences']:,}"
            )
    if needs is not None:
        lines.append("")
        util = needs["utilization"]
        gpu = needs["smallest_gpu"]
        lines.append(
            f"  for {needs['sequences']:,} sequences of {needs['context_tokens']:,} tokens: "
            f"utilization {util if util is not None else 'not reachable'}, "
            f"smallest GPU {gpu or 'none in the catalogue'}"
        )
        if needs["max_num_seqs_too_low"]:
            lines.append(
                f"    and --max-num-seqs of at least {needs['sequences']:,} "
                f"(now {result.max_num_seqs:,})"
            )
    lines += [
        "",
        "  what if                          KV budget   KV capacity   sequences (limited by)",
    ]
    base = [str(row["limited_by"]) for row in ceiling_rows(result, contexts)]
    for row in what_if:
        if "error" in row:
            lines.append(f"  {row['change']:<30} {row['error']}")
            continue
        seqs = " / ".join(
            f"{n:,}"
            + (
                f" ({row['limited_by'][t]})"
                if row["limited_by"][t] in (Limit.MAX_NUM_SEQS, Limit.QUEUE_CAP)
                else ""
            )
            for t, n in row["sequences"].items()
        )
        moved = [b != row["limited_by"][str(t)] for b, t in zip(base, contexts, strict=True)]
        lines.append(
            f"  {row['change']:<30} {_gib(row['kv_budget_bytes']):>12} "
            f"{row['kv_capacity_tokens']:>13,}   {seqs}"
            + ("  <- moves the binding limit" if any(moved) else "")
        )
    for note in result.assumptions:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _listing() -> str:
    lines = ["models:"]
    for entry in models():
        lines.append(f"  {entry.name:<24} {entry.hf_id or '':<48} {entry.params / 1e9:g}B")
    lines.append("GPUs:")
    for gpu in gpus():
        lines.append(f"  {gpu.name:<12} {_gib(gpu.memory_bytes)}  ({gpu.source})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``plan``: print the report (or JSON); bad input raises UsageError."""
    if args.list_models or args.list_gpus:
        print(_listing())
        return 0
    contexts = args.context_tokens or list(DEFAULT_CONTEXTS)
    arch, known_weights = resolve_arch(args)
    _check_context(arch, args)
    deployment = resolve_deployment(args, known_weights=known_weights)
    result = require_sized(size_deployment(arch, deployment=deployment))
    _check_fits(result)
    what_if = what_ifs(arch, deployment, result, contexts)
    needs = None
    if args.sequences is not None:
        needs = what_it_needs(
            arch, deployment, sequences=args.sequences, context_tokens=contexts[0]
        )
    if args.json:
        payload = to_json(result, contexts=contexts, what_if=what_if, needs=needs)
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(result, contexts=contexts, what_if=what_if, needs=needs))
    return 0
