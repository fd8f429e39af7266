"""Helpers of the reliability suite beyond the shared ones in ``exporter.testing``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx

from exporter.service.poller import TargetPoller
from exporter.testing.fakevllm import FakeVllm
from exporter.vllm.client import VllmClient
from exporter.vllm.metrics import parse_vllm_metrics

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.core.views import TargetView


def mock_vllm_poller(**kwargs: object) -> tuple[TargetPoller, Callable[[], TargetView]]:
    """A TargetPoller over the fake vLLM's httpx transport (its healthy payload).

    Returns the poller and ``poll()``, which polls once (in a fresh event loop) and returns the
    view. For faults injected through the poller's seams (predictor, GPU source).
    """
    http = httpx.AsyncClient(transport=FakeVllm(listen=False).transport())
    client = VllmClient("http://vllm:8000", client=http, timeout_seconds=2, max_bytes=1 << 24)
    poller = TargetPoller(
        "http://vllm:8000",
        client=client,
        parse=parse_vllm_metrics,
        **kwargs,  # type: ignore[arg-type]
    )

    def poll() -> TargetView:
        return asyncio.run(poller.poll_once())

    return poller, poll
