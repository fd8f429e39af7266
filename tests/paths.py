"""Where the tests' data lives: everything inside the repository, nothing beside it."""

from __future__ import annotations

from pathlib import Path

#: The repository.
REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
#: Real vLLM ``/metrics`` captures from vLLM 0.6 to 0.32 (``fixtures/vllm-metrics/README.md``).
CAPTURES = FIXTURES / "vllm-metrics"
#: Model ``config.json`` files of real architectures and the tiny test model.
CONFIGS = FIXTURES / "configs"
#: NVML recordings (synthetic, in the real format).
NVML = FIXTURES / "nvml"
#: Fake ``/proc`` trees for GPU visibility.
PROC = FIXTURES / "proc"
#: What a real vLLM 0.32 on this project's CPU machine reported (``fixtures/vllm-cpu/README.md``).
VLLM_CPU = FIXTURES / "vllm-cpu"
#: Traffic windows the context benchmark found hard (``benchmarks/context.py``), per request.
CONTEXT = FIXTURES / "context"
GOLDEN = TESTS / "golden"
DOCS = REPO / "docs"
