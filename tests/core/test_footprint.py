"""The estimate of a window sample's memory, against what tracemalloc measures."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from exporter.core.derive import Sample, next_sample
from exporter.core.footprint import sample_bytes
from exporter.testing import heavy
from exporter.testing.fakevllm import VllmState, render_metrics
from exporter.vllm.metrics import parse_vllm_metrics

SAMPLES = 8


def _healthy(engines: int) -> heavy.Heavy:
    return heavy.Heavy(
        f"healthy_{engines}",
        lambda scrape: render_metrics(VllmState(engines=engines, finished=12 + 2 * scrape)),
    )


@pytest.mark.parametrize(
    "case", [*heavy.cases(scale=0.05), _healthy(1), _healthy(16)], ids=lambda case: case.name
)
def test_the_estimate_is_near_what_a_window_of_samples_really_holds(case: heavy.Heavy) -> None:
    """Within -20 % and +60 % of the traced memory of a window, heavy or healthy."""
    payloads = [case.payload(scrape) for scrape in range(SAMPLES)]
    window: list[Sample] = []
    estimate = 0
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for t, payload in enumerate(payloads):
            sample = next_sample(
                window[-1] if window else None, float(t), parse_vllm_metrics(payload)
            )
            estimate += sample_bytes(sample.snapshot, window[-1].snapshot if window else None)
            window.append(sample)
            del sample
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.8 * held <= estimate <= 1.6 * held, f"estimated {estimate} bytes, held {held}"


def test_what_a_sample_shares_with_the_one_before_is_counted_once() -> None:
    """An unchanged payload's second sample costs less than its first (bounds, facts shared)."""
    payload = render_metrics(VllmState(engines=4))
    first = next_sample(None, 0.0, parse_vllm_metrics(payload))
    second = next_sample(first, 1.0, parse_vllm_metrics(payload))
    assert sample_bytes(second.snapshot, first.snapshot) < sample_bytes(second.snapshot)
