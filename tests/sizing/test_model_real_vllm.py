"""The sizing model against real vLLM 0.32 start-ups of nine tiny architectures (CPU build).

``tests/fixtures/vllm-cpu/architectures/`` holds, per case, the model's config.json, the exact
vLLM arguments and the ``cache_config_info`` vLLM reported, all with ``--kv-cache-memory-bytes``
4 MiB (recorded by ``scripts/e2e/record_vllm_fixtures.py``). The model must reproduce vLLM's
blocks, block size, ``kv_cache_size_tokens`` and max concurrency exactly, sliding-window,
Gemma-2 hybrid and MLA models included, and refuse what vLLM refused.
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
    deployment = Deployment(
        gpu_memory_bytes=8 * 2**30,
        device="cpu",
        kv_cache_memory_bytes=SUMMARY["kv_cache_memory_bytes"],
        max_model_len=case["max_model_len"],
        vllm_version=parse_vllm_version(SUMMARY["vllm_version"]),
        max_num_batched_tokens=batched,
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
