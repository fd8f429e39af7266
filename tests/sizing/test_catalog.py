"""Specification of the built-in GPU and model catalogues (exporter.sizing.catalog)."""

from __future__ import annotations

import json

import pytest

from exporter.errors import UsageError
from exporter.sizing.catalog import find_gpu, find_model, gpus, models, smallest_gpu
from exporter.sizing.model import Deployment
from exporter.sizing.overhead import GIB
from tests import paths

REQUIRED_GPUS = [
    "H100 80GB",
    "H200",
    "A100 40GB",
    "A100 80GB",
    "L40S",
    "L4",
    "A10G",
    "T4",
    "RTX 4090",
    "RTX 3090",
    "B200",
    "MI300X",
]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpus_present_with_source(name: str) -> None:
    """Every GPU the issue lists is in the catalogue, with a source and a plausible size."""
    spec = find_gpu(name)
    assert spec.source
    assert 14 * GIB < spec.memory_bytes < 200 * GIB


def test_gpu_lookup_forgives_spelling() -> None:
    """Case, dashes and aliases do not matter: 'h100-80gb' is the H100 80GB."""
    assert find_gpu("h100-80gb").name == "H100 80GB"
    assert find_gpu("NVIDIA A100-SXM4-40GB").name == "A100 40GB"


def test_unknown_gpu_suggests_close_matches() -> None:
    """An unknown GPU name fails with close matches in the message."""
    with pytest.raises(UsageError, match="H100"):
        find_gpu("H10")


def test_every_model_entry_parses_and_cites() -> None:
    """Every catalogue model parses into an architecture and cites its source."""
    for entry in models():
        arch = entry.arch()
        assert entry.source
        assert arch.num_layers > 0
        assert arch.params


#: Catalogue entries whose published config.json is also copied under tests/fixtures/configs.
FIXTURE_OF = {
    "tiny-llama-2l": "tiny-llama",
    "llama-3.1-8b": "llama-3.1-8b-instruct",
    "qwen2.5-7b": "qwen2.5-7b-instruct",
    "mistral-7b-v0.1": "mistral-7b-v0.1",
    "gemma-2-9b": "gemma-2-9b-it",
    "gemma-3-12b": "gemma-3-12b-it",
    "deepseek-v3": "deepseek-v3",
}


@pytest.mark.parametrize(("name", "fixture"), sorted(FIXTURE_OF.items()))
def test_entries_name_the_model_class_their_config_declares(name: str, fixture: str) -> None:
    """An entry's ``architectures`` is its config.json's: the class vLLM loads (LoRA reads it)."""
    entry = find_model(name)
    assert entry is not None
    declared = json.loads((paths.CONFIGS / fixture / "config.json").read_text())["architectures"]
    assert entry.config["architectures"] == declared
    assert entry.arch().architecture == declared[0]


def test_model_lookup_by_hub_id_and_alias() -> None:
    """A model is found by name, hub id or alias."""
    llama, qwen = find_model("meta-llama/Llama-3.1-8B-Instruct"), find_model("Qwen/Qwen2.5-7B")
    assert llama is not None
    assert llama.name == "llama-3.1-8b"
    assert qwen is not None
    assert qwen.name == "qwen2.5-7b"
    assert find_model("no-such-model") is None


def test_smallest_gpu_is_the_first_that_fits() -> None:
    """The smallest catalogue GPU holding the target fits it; the one below it does not."""
    llama = find_model("llama-3.1-8b")
    assert llama is not None
    arch = llama.arch()
    deployment = Deployment(gpu_memory_bytes=0, max_model_len=8192)
    spec = smallest_gpu(arch, deployment=deployment, sequences=100, context_tokens=4000)
    assert spec is not None
    ordered = list(gpus())
    assert ordered.index(spec) > 0


def test_qwen3_next_is_a_hybrid_of_12_attention_and_36_gated_delta_net_layers() -> None:
    """Qwen3-Next (one full-attention layer in four) is sized as a hybrid, not declined."""
    entry = find_model("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert entry is not None
    arch = entry.arch()
    assert arch.declined is None
    assert arch.num_layers == 48
    assert arch.attention_layers == 12
    assert arch.state is not None
    assert arch.state.num_layers == 36
    assert (arch.state.num_heads, arch.state.num_k_heads) == (32, 16)
