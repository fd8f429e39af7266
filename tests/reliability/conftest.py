"""Fixtures of the reliability suite: the fake vLLM, the exporter as a process, the figures.

The suite runs the real exporter (``python -m exporter serve``) against :class:`FakeVllm`
on loopback and judges it from outside: ``/metrics`` and ``/-/healthy`` over HTTP, its file
descriptors, threads and memory through ``/proc``, every line it logs. Faults that only a seam
can inject (a fake NVML library) run the same ``serve()`` in-process.

Figures: with ``HEADROOM_RELIABILITY_REPORT=path.json`` set, the measured numbers (time to
detect and to recover from each fault, worst ``/metrics`` latency under each abuse, memory) are
written there at the end of the session; ``docs/reliability.md`` quotes such a run.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exporter.testing.fakevllm import FakeVllm

if TYPE_CHECKING:
    from collections.abc import Iterator


class Figures:
    """Numbers measured by the tests, by section and name (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.data: dict[str, dict[str, Any]] = {}

    def record(self, section: str, name: str, value: Any) -> None:
        """Remember ``value`` as ``section/name`` (the last value wins)."""
        with self._lock:
            self.data.setdefault(section, {})[name] = value


@pytest.fixture(scope="session")
def figures() -> Iterator[Figures]:
    """The session's figures, written to $HEADROOM_RELIABILITY_REPORT at the end if set."""
    recorded = Figures()
    yield recorded
    target = os.environ.get("HEADROOM_RELIABILITY_REPORT")
    if target:
        Path(target).write_text(json.dumps(recorded.data, indent=2, sort_keys=True) + "\n")


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    """A fake vLLM 0.32 on a free loopback port, healthy until told otherwise."""
    with FakeVllm() as server:
        yield server
