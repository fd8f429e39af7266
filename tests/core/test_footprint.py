"""The estimates of a window sample's memory and a target's state, against tracemalloc."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from exporter.core.derive import (
    RestartBaseline,
    Sample,
    TargetDerived,
    WindowSettings,
    carried,
    derive_target,
    next_sample,
    restart_baseline,
)
from exporter.core.footprint import sample_bytes, state_bytes
from exporter.core.reasons import AdmissionReason
from exporter.core.views import TargetInfo
from exporter.testing import heavy
from exporter.testing.fakevllm import VllmState, render_metrics
from exporter.vllm import families as vllm_families
from exporter.vllm.families import named
from exporter.vllm.metrics import parse_vllm_metrics

SAMPLES = 8


def _healthy(engines: int) -> heavy.Heavy:
    return heavy.Heavy(
        f"healthy_{engines}",
        lambda scrape: render_metrics(VllmState(engines=engines, finished=12 + 2 * scrape)),
    )


def _refusing(made_up: int) -> heavy.Heavy:
    """vLLM's two admission reasons and ``made_up`` new ones every scrape (the parser keeps 4)."""
    family = vllm_families.family(named("admission_rejections")).type_name

    def payload(scrape: int) -> bytes:
        reasons = [*AdmissionReason, *(f"{scrape}-{i}-".ljust(200, "r") for i in range(made_up))]
        lines = "".join(
            f'{family}{{model_name="tiny",reason="{reason}"}} {float(scrape)}\n'
            for reason in reasons
        )
        return render_metrics(VllmState(engines=1, finished=12 + 2 * scrape)) + lines.encode()

    return heavy.Heavy(f"refusing_{made_up}", payload)


@pytest.mark.parametrize(
    "case",
    [*heavy.cases(scale=0.05), _healthy(1), _healthy(16), _refusing(0), _refusing(40)],
    ids=lambda case: case.name,
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


def _busy(engines: int) -> heavy.Heavy:
    """Over 400 requests a poll: context figures that stand, and are carried to the next."""
    return heavy.Heavy(
        f"busy_{engines}",
        lambda scrape: render_metrics(VllmState(engines=engines, finished=12 + 500 * scrape)),
    )


@pytest.mark.parametrize(
    ("case", "count"),
    [(heavy.long_split_labels(engines=8), 8), (_healthy(16), 8), (_busy(4), 24)],
    ids=lambda value: getattr(value, "name", f"{value}_targets"),
)
@pytest.mark.parametrize("hold", [False, True], ids=["fleet", "sidecar"])
def test_the_state_estimate_is_near_what_a_target_holds_between_polls(
    case: heavy.Heavy, count: int, hold: bool
) -> None:
    """Baseline, carried figures and (sidecar) held figures: within -20 % and +50 % of traced.

    What stays of three polls of each of ``count`` targets (enough that the interpreter's free
    lists, which tracemalloc does not see, weigh little: 8 busy targets of 4 engines read 0.8 x
    one run in ten) once the window's samples are gone;
    the poller's own objects (a constant in the estimate) are measured in
    tests/service/test_poller.py.
    """
    targets = [[case.payload(3 * k + scrape) for scrape in range(3)] for k in range(count + 1)]
    # Made before tracing: only what a target keeps is traced.
    baselines: list[RestartBaseline | None] = [None] * len(targets)
    carries: list[TargetDerived | None] = [None] * len(targets)
    held: list[TargetDerived | None] = [None] * len(targets)

    def poll(k: int) -> None:
        samples: list[Sample] = []
        for t, payload in enumerate(targets[k]):
            previous = samples[-1] if samples else None
            samples.append(next_sample(previous, 5.0 * t, parse_vllm_metrics(payload)))
        derived = derive_target(samples, windows=WindowSettings())
        baselines[k] = restart_baseline(samples[-1].snapshot)
        carries[k] = carried(derived)
        held[k] = derived if hold else None

    poll(0)  # first calls' caches are no target's
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(1, len(targets)):
            poll(k)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    kept = list(zip(baselines, carries, held, strict=True))[1:]
    estimate = sum(state_bytes(*state) - state_bytes(None, None) for state in kept)
    assert 0.8 * traced <= estimate <= 1.5 * traced, f"estimated {estimate} bytes, held {traced}"


@pytest.mark.parametrize(
    "info",
    [
        TargetInfo(model_id="m" * 512),
        TargetInfo(model_root="/r" * 256),
        TargetInfo(vllm_version="v" * 512),
        TargetInfo("m" * 512, "/r" * 256, 4096, "v" * 512),
    ],
    ids=["id", "root", "version", "all"],
)
def test_what_a_target_says_of_itself_is_counted_in_its_state(info: TargetInfo) -> None:
    """/v1/models's and /version's strings are the target's, counted in what it holds."""
    texts = [t for t in (info.model_id, info.model_root, info.vllm_version) if t is not None]
    grown = state_bytes(None, None, info=info) - state_bytes(None, None)
    assert grown >= sum(len(t) for t in texts)
