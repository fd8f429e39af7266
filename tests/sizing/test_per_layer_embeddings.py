"""Specification of Gemma 3n's and Gemma 4's per-layer input embeddings (PLE) in the weights.

What vLLM 0.32 builds (model_executor/models/gemma3n.py ``Gemma3nSelfDecoder``, gemma4.py
``Gemma4Model``), on the GPU like every other parameter (no CPU placement in either file):

- ``embed_tokens_per_layer``: a ``VocabParallelEmbedding`` of ``vocab_size_per_layer_input`` x
  (``num_hidden_layers`` x ``hidden_size_per_layer_input``); Gemma 4 builds it only when
  ``hidden_size_per_layer_input`` is above 0, and reads ``vocab_size_per_layer_input`` with
  ``vocab_size`` as fallback;
- ``per_layer_model_projection``: hidden -> layers x width, and in every layer
  ``per_layer_input_gate`` (hidden -> width) and ``per_layer_projection`` (width -> hidden);
- a KV-sharing layer builds ``q_proj`` and ``o_proj`` only (no K or V weights), and Gemma 4's
  full-attention layers their own head size (``per_layer_config``).

The model cards call Gemma 3n E4B an 8B-parameter model run "with a memory footprint comparable
to a traditional 4B model by offloading low-utilization matrices from the accelerator"
(huggingface.co/google/gemma-3n-E4B-it, read through a mirror: b-61j.pages.dev/google/
gemma-3n-E4B-it); vLLM 0.32 offloads nothing, so the 4B "effective" size is not what it loads.

Real counts, measured (never from the code under test):

- the tiny checkpoints of scripts/e2e/make_tiny_model.py ``--arch gemma3n`` / ``--arch gemma4``
  (architecture fields as tests/fixtures/configs/gemma3n-tiny-kv-sharing and
  gemma4-tiny-kv-sharing), summing the safetensors' tensor shapes: 578,376 and 592,690
  parameters, of which ``embed_tokens`` 512 x 64 = 32,768 and ``embed_tokens_per_layer``
  512 x 80 = 40,960;
- the full-size text configs (tests/fixtures/configs/gemma3n-transformers-default, E4B's shape,
  and gemma4-transformers-default), built by transformers 5.19's ``AutoModelForCausalLM`` on the
  meta device: 6,835,235,568 and 5,077,177,856 parameters, of which the per-layer table is
  262,144 x 35 x 256 = 2,348,810,240 and 262,144 x 30 x 256 = 2,013,265,920.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.sizing.model import ModelArch, param_split, stage_weights_bytes
from exporter.sizing.modelconfig import parse_model_config
from tests import paths

CONFIGS = paths.CONFIGS


def _config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / name / "config.json").read_text())
    return config


def _arch(name: str, **changes: Any) -> ModelArch:
    config = _config(name)
    text = config.get("text_config", config)
    for key, value in changes.items():
        if value is _ABSENT:
            text.pop(key, None)
        else:
            text[key] = value
    return parse_model_config(config, name=name)


_ABSENT = object()


# --- the tiny checkpoints: counted exactly --------------------------------------------------


@pytest.mark.parametrize("name", ["gemma3n-tiny-kv-sharing", "gemma4-tiny-kv-sharing"])
def test_the_per_layer_table_is_counted_with_the_input_embedding(name: str) -> None:
    """The embedding share is both tables: 32,768 + 40,960 = 73,728, as in the checkpoint."""
    split, estimated = param_split(_arch(name))
    assert estimated
    assert split.embedding == 512 * 64 + 512 * 10 * 8 == 73_728
    assert split.lm_head == 0  # tied


def test_tiny_gemma3n_estimate_worked_by_hand() -> None:
    """64 hidden, 4 heads x 32, 2 KV heads, MLP 128, 10 layers of which 5 share KV, PLE 8 wide.

    Embedding 512 x 64 = 32,768; PLE table 512 x 10 x 8 = 40,960; projections 3 x 64 x 10 x 8 =
    15,360; 5 KV layers x (q, o: 2 x 64 x 128 + k, v: 2 x 64 x 64) = 122,880; 5 sharing layers x
    q, o 16,384 = 81,920; MLP 10 x 3 x 64 x 128 = 245,760. Sum 539,648: 38,728 (6.7 %) under the
    checkpoint's 578,376, the AltUp projections (6 x 64 x 64), AltUp and LAuReL per layer and
    the norms, which the shape estimate leaves out. Before the table: 524,288 (9.4 % under).
    """
    split, _ = param_split(_arch("gemma3n-tiny-kv-sharing"))
    assert split.total == 539_648
    assert 578_376 - split.total == 6 * 64 * 64 + 10 * (464 + 512 + 6 * 64 + 48) + 64 + 8


def test_tiny_gemma4_estimate_worked_by_hand() -> None:
    """As Gemma 3n's, with 4 sharing layers and the full layer 4's head_dim 64 (q, o, k, v x 2).

    KV layers: 5 x 24,576 + 49,152 = 172,032; 4 sharing layers x 16,384 = 65,536. Sum 572,416:
    20,274 (3.4 %) under the checkpoint's 592,690: the sharing full layer 9's wider q and o
    (16,384 more; its head size is not kept for a layer without KV), the norms (3,880) and the
    layer scalars (10). Before: 524,288 (11.5 % under).
    """
    split, _ = param_split(_arch("gemma4-tiny-kv-sharing"))
    assert split.total == 572_416
    assert 592_690 - split.total == 16_384 + 3_880 + 10


# --- the full-size configs: within the norms and Gemma 3n's AltUp / LAuReL ----------------------


@pytest.mark.parametrize(
    ("name", "real", "table"),
    [
        ("gemma3n-transformers-default", 6_835_235_568, 262_144 * 35 * 256),
        ("gemma4-transformers-default", 5_077_177_856, 262_144 * 30 * 256),
    ],
)
def test_full_size_estimate_is_within_one_percent_of_the_built_model(
    name: str, real: int, table: int
) -> None:
    """Before, the estimates were 4,427,612,160 (35 % under) and 2,939,682,816 (42 % under).

    Gemma 3n E4B's 2,348,810,240-parameter table alone is 4.4 GiB in bf16 that the KV cache was
    given; what is left (0.5 %) is the AltUp and LAuReL weights and the norms.
    """
    arch = _arch(name)
    split, _ = param_split(arch)
    assert split.embedding == (arch.vocab_size or 0) * arch.hidden_size + table
    assert abs(split.total - real) / real < 0.01


def test_gemma4_estimate_with_its_full_layers_head_size_is_exact_but_for_the_norms() -> None:
    """Gemma 4 (no sharing, head_dim 512 on 5 of 30 layers): 5,076,811,776, the norms 366,080.

    Norms: 5 per layer x 2,304 + q and k norms (25 x 256 + 5 x 512 each) + the final 2,304 and
    the PLE norm 256 = 345,600 + 17,920 + 2,560 = 366,080.
    """
    split, _ = param_split(_arch("gemma4-transformers-default"))
    assert 5_077_177_856 - split.total == 5 * 30 * 2_304 + 2 * (25 * 256 + 5 * 512) + 2_304 + 256


# --- where the table goes ------------------------------------------------------------------


def test_a_weight_format_leaves_the_table_in_the_model_dtype() -> None:
    """fp8: the two tables stay 2 bytes a parameter (embeddings are not quantized), the rest 1.

    Gemma 4 default: embedding 262,144 x 2,304 = 603,979,776, table 2,013,265,920: 2,617,245,696
    parameters x 2; the other 2,459,566,080 x 1 = 7,694,057,472 bytes.
    """
    stages, estimated = stage_weights_bytes(
        _arch("gemma4-transformers-default"),
        layers=(30,),
        model_dtype="bfloat16",
        quantization="fp8",
        known_total_bytes=None,
        tensor_parallel=1,
    )
    assert estimated
    assert stages == (2_617_245_696 * 2 + 2_459_566_080,)


@pytest.mark.parametrize("width", [None, 0])
def test_gemma4_without_a_per_layer_width_has_no_table(width: int | None) -> None:
    """Gemma 4 builds the table only for a ``hidden_size_per_layer_input`` above 0."""
    split, _ = param_split(_arch("gemma4-transformers-default", hidden_size_per_layer_input=width))
    assert split.embedding == 262_144 * 2_304


def test_a_config_that_leaves_the_fields_out_takes_transformers_defaults() -> None:
    """vLLM's hf_config is transformers' class: absent fields are its 262,144 x 256 defaults."""
    split, _ = param_split(
        _arch(
            "gemma3n-tiny-kv-sharing",
            hidden_size_per_layer_input=_ABSENT,
            vocab_size_per_layer_input=_ABSENT,
        )
    )
    assert split.embedding == 512 * 64 + 262_144 * 10 * 256


def test_gemma4_without_a_per_layer_vocabulary_reads_vocab_size() -> None:
    """A null ``vocab_size_per_layer_input`` falls back to ``vocab_size`` as gemma4.py does."""
    split, _ = param_split(_arch("gemma4-tiny-kv-sharing", vocab_size_per_layer_input=None))
    assert split.embedding == 512 * 64 + 512 * 10 * 8


def test_models_without_per_layer_inputs_are_unchanged() -> None:
    """Gemma 3 has no per-layer table: its estimate is the shape's alone, as before."""
    split, _ = param_split(_arch("gemma-3-12b-it"))
    assert split.embedding == 262_208 * 3_840
    assert split.total == 11_765_268_480
