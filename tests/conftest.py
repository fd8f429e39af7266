"""Shared fixtures: the real captures served by the fake vLLM on loopback, and the real tools."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from exporter.testing.fakevllm import FakeVllm, VllmState
from tests import paths
from tests.e2e.harness import checkov_binary, helm_binary, kubectl_binary, promtool_binary
from tests.tools import require

# Property tests judge behaviour, not speed: a machine busy with other work (CI, a vLLM on the
# CPU) must not turn a slow example into a failure.
settings.register_profile("headroom", deadline=None)
settings.load_profile("headroom")

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

CAPTURES = paths.CAPTURES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the end-to-end tests last: their real vLLM keeps both CPUs busy while it runs."""
    items.sort(key=lambda item: "e2e" in item.keywords)


@pytest.fixture
def static_vllm() -> Iterator[FakeVllm]:
    """The fake vLLM on a free loopback port serving the real 0.32 after-load capture."""
    capture = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_bytes()
    state = VllmState(model="tiny", root="/nonexistent/tiny", max_model_len=512)
    with FakeVllm(state=state, payload=capture) as server:
        yield server


@pytest.fixture
def busy_vllm() -> Iterator[FakeVllm]:
    """The fake vLLM serving a real 0.32 payload taken mid-burst: requests running, KV in use.

    Every figure that needs something running (tokens per running sequence) is defined on it.
    The lines a KV offload connector adds (written from vLLM's source: no GPU here) follow, so
    that the offload and KV fetch figures are defined too. Its first answer is the burst's
    sample 005, every later one the next sample, 006: between the two, requests finished (and
    were preempted), so the figures over finished requests are defined from the second poll.
    """
    burst = paths.FIXTURES / "vllm-cpu" / "burst"
    offload = (
        paths.FIXTURES / "vllm-offload" / "kv-offload-0.32.0-written-from-source.prom"
    ).read_bytes()
    first, later = ((burst / name).read_bytes() + offload for name in ("005.prom", "006.prom"))
    state = VllmState(model="tiny", root="/nonexistent/tiny", max_model_len=512)
    with FakeVllm(state=state, payload=lambda served: first if served == 0 else later) as server:
        yield server


# The real tools: each fails in CI and skips elsewhere when not installed (tests/tools.py).


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned Helm 3 binary (``scripts/e2e/install-helm.sh``)."""
    return require(helm_binary)


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool from Debian's prometheus package (unpacked into the cache, else on PATH)."""
    return require(promtool_binary)


@pytest.fixture(scope="session")
def kubectl() -> Path:
    """kubectl (its built-in kustomize), installed beside Helm."""
    return require(kubectl_binary)


@pytest.fixture(scope="session")
def checkov() -> Path:
    """checkov in its own cached virtual environment."""
    return require(checkov_binary)
