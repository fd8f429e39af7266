"""The tiny models started with ``vllm.LLM`` on vLLM 0.32's CPU build, as ``plan`` sizes them.

tests/fixtures/configs/README.md gives each start-up's settings and what vLLM logged: a 1 GiB
KV budget (``VLLM_CPU_KVCACHE_SPACE=1``), ``max_model_len`` and ``max_num_batched_tokens``
1,024.
"""

from __future__ import annotations

from exporter.sizing.model import Deployment, SizingResult, size_deployment
from exporter.sizing.modelconfig import load_model_arch
from exporter.vllm.version import VllmVersion
from tests import paths

GIB = 2**30
#: The deployment every start-up had.
STARTED_AS = Deployment(
    gpu_memory_bytes=8 * GIB,
    device="cpu",
    kv_cache_memory_bytes=GIB,
    max_model_len=1024,
    max_num_batched_tokens=1024,
    vllm_version=VllmVersion(0, 32, 0),
)


def sized_as_started(fixture: str) -> SizingResult:
    """``plan``'s figures for the config under tests/fixtures/configs/``fixture``, as started."""
    result = size_deployment(load_model_arch(paths.CONFIGS / fixture), deployment=STARTED_AS)
    assert isinstance(result, SizingResult), result
    return result
