"""The simulated /metrics payload has the shape of a real vLLM 0.32.0 server's, proven on a capture.

Both payloads are parsed with ``prometheus_client.parser.text_string_to_metric_families`` and
compared: family names, types, label names and histogram bucket bounds. A simulation configured
like the captured server (tiny model, 1 MiB KV cache, block size 128, max_model_len 512) must
serve exactly the captured series and, values aside, exactly the captured lines.

The payload also feeds the sidecar's own parser and derivations unchanged: a sharing scenario
shows a ceiling counting shared prefixes once above the unshared one, a flood of short requests
shows ``max_num_seqs`` as the binding limit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.ceiling import RunningLimit
from exporter.core.derive import EngineDerived, Sample, WindowSettings, derive_target, next_sample
from exporter.core.reasons import Limit, MaxNumSeqsSource
from exporter.sim import families
from exporter.sim.engine import Simulation
from exporter.sim.exposition import cache_config_labels, render
from exporter.sim.scenario import (
    Scenario,
    SimEngineConfig,
    SimModel,
    default_scenario,
    kv_cache_max_concurrency,
    kv_cache_size_tokens,
    num_gpu_blocks,
)
from exporter.sim.traffic import (
    Arrival,
    LengthDistribution,
    ScriptedArrivals,
    SharedPrefix,
    TrafficPhase,
    TrafficProfile,
)
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

CAPTURE = paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom"
STARTED_AT = 1_795_952_129.62

#: Histograms whose bounds do not depend on max_model_len.
FIXED_BOUNDS = {
    families.ITERATION_TOKENS,
    families.PARAMS_N,
    families.TIME_TO_FIRST_TOKEN,
    families.INTER_TOKEN_LATENCY,
    families.TIME_PER_OUTPUT_TOKEN,
    families.E2E_LATENCY,
    families.QUEUE_TIME,
    families.INFERENCE_TIME,
    families.PREFILL_TIME,
    families.DECODE_TIME,
    families.NUM_PREEMPTIONS,
}


def capture_scenario() -> Scenario:
    """The captured server: a 1,024-byte-per-token model, 1 MiB of KV cache, blocks of 128."""
    model = SimModel(served_name="tiny", num_layers=2, num_kv_heads=2, head_dim=64)
    engine = SimEngineConfig(block_size=128, max_model_len=512, kv_cache_memory_bytes=1 << 20)
    # The capture's load: 101-token prompts, 380 output tokens, 12 concurrent.
    burst = TrafficPhase(
        name="burst",
        duration_s=5.0,
        arrivals_per_s=3.0,
        prompt_tokens=LengthDistribution(median=101, sigma=0.0, minimum=101, maximum=101),
        output_tokens=LengthDistribution(median=380, sigma=0.0, minimum=380, maximum=380),
        max_tokens=380,
    )
    return Scenario(model=model, engine=engine, traffic=TrafficProfile((burst,), repeat=False))


def parse(payload: str) -> dict[str, Metric]:
    """Families by name, as the client library's parser reads them."""
    return {f.name: f for f in text_string_to_metric_families(payload)}


def served_by_vllm(name: str) -> bool:
    """The families the simulation must reproduce: vLLM's own, and the process start time."""
    return name.startswith("vllm:") or name == "process_start_time_seconds"


def label_names(family: Metric) -> set[str]:
    """Every label name used by a family's samples."""
    return {key for sample in family.samples for key in sample.labels}


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def bucket_bounds(family: Metric) -> list[str]:
    """The ``le`` values of a histogram's first series, in order."""
    return [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]


@pytest.fixture(scope="module")
def capture() -> dict[str, Metric]:
    """The real vLLM 0.32.0 capture, parsed."""
    return parse(CAPTURE.read_text())


@pytest.fixture(scope="module")
def default_run() -> Simulation:
    """The demo scenario after its burst: preemptions, prefix-cache hits, finished requests."""
    sim = Simulation(default_scenario(), seed=0)
    sim.advance_to(270.0)
    return sim


@pytest.fixture(scope="module")
def served(default_run: Simulation) -> dict[str, Metric]:
    """The demo scenario's payload, parsed."""
    payload = render(default_run.metrics(), default_run.scenario, started_at=STARTED_AT)
    return parse(payload.decode())


def test_served_families_are_the_captured_ones(
    served: dict[str, Metric], capture: dict[str, Metric]
) -> None:
    """Every vLLM family of the real capture is served, and nothing else under vllm:."""
    expected = {name for name in capture if served_by_vllm(name)}
    assert set(served) == expected


def test_served_types_and_label_names_are_the_captured_ones(
    served: dict[str, Metric], capture: dict[str, Metric]
) -> None:
    """Each served family has the captured type and exactly the captured label names."""
    for name, family in served.items():
        assert family.type == capture[name].type, name
        assert label_names(family) == label_names(capture[name]), name


def test_served_histogram_bounds_are_the_captured_ones(
    served: dict[str, Metric], capture: dict[str, Metric], default_run: Simulation
) -> None:
    """Fixed buckets equal the capture's; token buckets are vLLM's 1-2-5 up to max_model_len."""
    max_model_len = default_run.scenario.engine.max_model_len
    token_bounds = [repr(b) for b in families.build_1_2_5_buckets(max_model_len)] + ["+Inf"]
    histograms = [name for name, f in capture.items() if f.type == "histogram"]
    assert set(FIXED_BOUNDS) < {n for n in histograms if n.startswith("vllm:")}
    for name in histograms:
        if not name.startswith("vllm:"):
            continue
        if name in FIXED_BOUNDS:
            assert bucket_bounds(served[name]) == bucket_bounds(capture[name]), name
        else:
            assert bucket_bounds(served[name]) == token_bounds, name


def test_capture_replica_serves_exactly_the_captured_series(capture: dict[str, Metric]) -> None:
    """Configured like the captured server, it serves the same series, label values included."""
    sim = Simulation(capture_scenario(), seed=0)
    sim.advance_to(60.0)
    replica = parse(render(sim.metrics(), sim.scenario, started_at=STARTED_AT).decode())

    def series(fams: dict[str, Metric]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {
            (s.name, _key(s.labels))
            for name, f in fams.items()
            if served_by_vllm(name)
            for s in f.samples
        }

    assert series(replica) == series(capture)


def test_capture_replica_payload_matches_the_capture_line_for_line() -> None:
    """Values aside, the served text is the captured text: order, HELP, TYPE, label order, le."""

    def shape(text: str) -> list[str]:
        lines = []
        for line in text.splitlines():
            name = line.split(" ")[2] if line.startswith("# ") else line
            if not served_by_vllm(name.split("{")[0].split(" ")[0]):
                continue
            lines.append(line if line.startswith("#") else line.rsplit(" ", 1)[0])
        return lines

    sim = Simulation(capture_scenario(), seed=0)
    sim.advance_to(60.0)
    payload = render(sim.metrics(), sim.scenario, started_at=STARTED_AT).decode()
    assert shape(payload) == shape(CAPTURE.read_text())


def test_replaying_the_captured_load_reproduces_every_captured_count(
    capture: dict[str, Metric],
) -> None:
    """The captured load (12 x 101 + 380 tokens) yields every non-time count vLLM reported."""
    load = [Arrival(0.0, 101, 380, 380, "length") for _ in range(12)]
    sim = Simulation(capture_scenario(), arrivals=ScriptedArrivals(load))
    while sim.step():
        pass
    replica = parse(render(sim.metrics(), sim.scenario, started_at=STARTED_AT).decode())
    compared = 0
    for name, family in capture.items():
        if not name.startswith("vllm:") or name.endswith(("_created", "_seconds")):
            continue  # timings depend on the hardware; _created on the clock
        served_values = {(s.name, _key(s.labels)): s.value for s in replica[name].samples}
        for s in family.samples:
            assert served_values[(s.name, _key(s.labels))] == s.value, s
            compared += 1
    assert compared > 100
    assert sim.metrics().num_preemptions == 15


def test_capture_replica_cache_config_is_the_captured_one(capture: dict[str, Metric]) -> None:
    """num_gpu_blocks 8, kv_cache_size_tokens 1024, max concurrency 2.0: the capture's labels."""
    (sample,) = capture["vllm:cache_config_info"].samples
    assert cache_config_labels(capture_scenario()) == sample.labels


def test_cache_config_info_describes_the_default_pool(served: dict[str, Metric]) -> None:
    """The default scenario's labels carry its own blocks, block size, size and concurrency."""
    scenario = default_scenario()
    (sample,) = served["vllm:cache_config_info"].samples
    assert sample.value == 1.0
    assert sample.labels["num_gpu_blocks"] == str(num_gpu_blocks(scenario))
    assert sample.labels["block_size"] == "16"
    assert sample.labels["kv_cache_size_tokens"] == str(kv_cache_size_tokens(scenario))
    assert sample.labels["kv_cache_max_concurrency"] == str(kv_cache_max_concurrency(scenario))
    assert sample.labels["gpu_memory_utilization"] == "0.92"
    assert sample.labels["kv_cache_memory_bytes"] == "None"
    assert "model_name" not in sample.labels


def value(fams: dict[str, Metric], name: str, sample_name: str, **labels: str) -> float:
    """The value of one sample, found by name and a subset of its labels."""
    for s in fams[name].samples:
        if s.name == sample_name and labels.items() <= s.labels.items():
            return float(s.value)
    raise AssertionError(f"no sample {sample_name} {labels}")


def test_served_values_are_the_engine_values(
    served: dict[str, Metric], default_run: Simulation
) -> None:
    """Gauges, counters and histograms in the payload are the engine's numbers."""
    m = default_run.metrics()

    def one(name: str, suffix: str = "", **labels: str) -> float:
        return value(served, name, name + suffix, **labels)

    assert one("vllm:num_requests_running") == m.num_requests_running
    assert one("vllm:num_requests_waiting") == m.num_requests_waiting
    by_reason = one("vllm:num_requests_waiting_by_reason", reason="capacity")
    assert by_reason == m.num_requests_waiting
    assert one("vllm:kv_cache_usage_perc") == pytest.approx(m.kv_cache_usage)
    assert one("vllm:num_preemptions", "_total") == m.num_preemptions > 0
    assert one("vllm:prompt_tokens", "_total") == m.prompt_tokens
    assert one("vllm:prefix_cache_hits", "_total") == m.prefix_cache_hits > 0  # the agents'
    assert one("vllm:generation_tokens", "_total") == m.generation_tokens
    for reason in families.FINISHED_REASONS:
        served_count = value(
            served, "vllm:request_success", "vllm:request_success_total", finished_reason=reason
        )
        assert served_count == m.request_success[reason]
    finished = sum(m.request_success.values())
    assert one(families.E2E_LATENCY, "_count") == finished
    assert one(families.E2E_LATENCY, "_bucket", le="+Inf") == finished
    prompt_sum = m.histograms[families.PROMPT_TOKENS].sum
    assert one(families.PROMPT_TOKENS, "_sum") == pytest.approx(prompt_sum)


def test_start_time_and_created_series_are_the_start(served: dict[str, Metric]) -> None:
    """process_start_time_seconds and every _created series carry the simulation's start."""
    assert value(served, "process_start_time_seconds", "process_start_time_seconds") == STARTED_AT
    created = [s.value for f in served.values() for s in f.samples if s.name.endswith("_created")]
    assert len(created) > 20
    assert set(created) == {STARTED_AT}


def test_model_name_label_says_simulation(served: dict[str, Metric]) -> None:
    """Every engine series is labelled with the simulated model's name and engine 0."""
    for name, family in served.items():
        for s in family.samples:
            if "model_name" in s.labels:
                assert s.labels["model_name"] == "simulated/llama-3.1-8b", name
            api_server_family = name.startswith("vllm:admission_rejections")
            if name.startswith("vllm:") and not api_server_family:
                assert s.labels.get("engine") == "0", name


# -- prefix-cache hits and what the sidecar derives from the payload -------------------------


def small_scenario(phase: TrafficPhase, *, max_num_seqs: int, blocks: int = 1024) -> Scenario:
    """A tiny model with ``blocks`` blocks of 16 tokens, receiving one phase of traffic."""
    model = SimModel(served_name="tiny", num_layers=2, num_kv_heads=2, head_dim=64)
    engine = SimEngineConfig(
        max_model_len=2048,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        kv_cache_memory_bytes=blocks * 16 * model.bytes_per_token,
    )
    return Scenario(model=model, engine=engine, traffic=TrafficProfile((phase,)))


def lengths(low: int, high: int) -> LengthDistribution:
    """Log-normal lengths spread over ``[low, high]``."""
    return LengthDistribution(median=math.sqrt(low * high), sigma=0.5, minimum=low, maximum=high)


def derived(scenario: Scenario, *, until: float, poll: float = 1.0) -> EngineDerived:
    """Poll the rendered payload like the sidecar, then derive engine 0 at ``until``."""
    sim = Simulation(scenario, seed=0)
    samples: list[Sample] = []
    t = 0.0
    while t < until:
        t += poll
        sim.advance_to(t)
        payload = render(sim.metrics(), scenario, started_at=STARTED_AT)
        samples.append(
            next_sample(samples[-1] if samples else None, t, parse_vllm_metrics(payload))
        )
    limit = RunningLimit(scenario.engine.max_num_seqs, MaxNumSeqsSource.SETTING)
    windows = WindowSettings(context_seconds=30.0, rate_seconds=30.0)
    result = derive_target(samples, windows=windows, running_limit=limit, max_model_len=2048)
    (engine,) = result.engines
    return engine


def test_prefix_cache_hits_reach_every_family_that_counts_them() -> None:
    """Hits, cached prompt tokens and the split by source are the engine's counts, consistent."""
    sharing = TrafficPhase(
        name="agents",
        duration_s=60.0,
        arrivals_per_s=10.0,
        prompt_tokens=lengths(16, 128),
        output_tokens=lengths(8, 64),
        max_tokens=64,
        shared_prefix=SharedPrefix("system", tokens=512, fraction=0.9),
    )
    scenario = small_scenario(sharing, max_num_seqs=256)
    sim = Simulation(scenario, seed=0)
    sim.advance_to(10.0)
    m = sim.metrics()
    served = parse(render(m, scenario, started_at=STARTED_AT).decode())

    def total(name: str, **labels: str) -> float:
        return value(served, name, name + "_total", **labels)

    assert total("vllm:prefix_cache_hits") == m.prefix_cache_hits > 0.5 * m.prefix_cache_queries
    assert total("vllm:prompt_tokens_cached_by_source", source="device") == m.prefix_cache_hits
    for source in ("host", "p2p", "disk", "external_unspecified"):
        assert total("vllm:prompt_tokens_cached_by_source", source=source) == 0.0
    # Counted when the first token comes out: requests still in prefill are not in yet.
    assert 0 < total("vllm:prompt_tokens_cached") == m.prompt_tokens_cached <= m.prefix_cache_hits
    hit = total("vllm:prompt_tokens_by_source", source="local_cache_hit")
    computed = total("vllm:prompt_tokens_by_source", source="local_compute")
    assert hit == m.prompt_tokens_cached
    assert hit + computed == total("vllm:prompt_tokens") == m.prompt_tokens


def test_sidecar_sees_a_higher_ceiling_when_prefixes_are_shared() -> None:
    """90 % of prompts start with one 512-token prefix: the effective ceiling is well above."""
    sharing = TrafficPhase(
        name="agents",
        duration_s=60.0,
        arrivals_per_s=20.0,
        prompt_tokens=lengths(16, 128),
        output_tokens=lengths(8, 64),
        max_tokens=64,
        shared_prefix=SharedPrefix("system", tokens=512, fraction=0.9),
    )
    engine = derived(small_scenario(sharing, max_num_seqs=256), until=30.0)
    assert engine.p95_ceiling_limit == Limit.KV_CACHE
    assert engine.prefix_cache_hit_ratio is not None
    assert engine.prefix_cache_hit_ratio > 0.6
    assert engine.p95_ceiling_sequences is not None
    assert engine.p95_effective_ceiling_sequences is not None
    assert engine.p95_effective_ceiling_sequences > 1.5 * engine.p95_ceiling_sequences
    # Running sequences hold far fewer KV tokens each than their context: the prefix is shared.
    assert engine.kv_tokens_per_running_sequence is not None
    assert engine.context_mean_tokens is not None
    assert engine.kv_tokens_per_running_sequence < 0.5 * engine.context_mean_tokens


def test_sidecar_names_max_num_seqs_when_short_requests_fill_the_scheduler() -> None:
    """8 running slots, short requests, a queue: max_num_seqs binds the ceiling and the headroom."""
    short = TrafficPhase(
        name="short",
        duration_s=60.0,
        arrivals_per_s=300.0,
        prompt_tokens=lengths(8, 32),
        output_tokens=lengths(4, 32),
        max_tokens=32,
    )
    engine = derived(small_scenario(short, max_num_seqs=8, blocks=256), until=10.0)
    assert engine.p95_ceiling_limit == Limit.MAX_NUM_SEQS
    assert engine.p95_ceiling_sequences == 8
    assert engine.p95_kv_ceiling_sequences is not None
    assert engine.p95_kv_ceiling_sequences > 8  # the pool alone would hold many more
    assert engine.p95_available_limit == Limit.MAX_NUM_SEQS
    assert engine.requests_waiting is not None
    assert engine.requests_waiting > 0
    assert engine.max_num_seqs_by_source == {"setting": 8.0}


def test_sidecar_counts_the_samples_of_n_as_sequences() -> None:
    """With n = 2 the sidecar reads two sequences per request from request_params_n."""
    pairs = TrafficPhase(
        name="pairs",
        duration_s=60.0,
        arrivals_per_s=10.0,
        prompt_tokens=lengths(64, 256),
        output_tokens=lengths(8, 64),
        max_tokens=64,
        n=2,
    )
    engine = derived(small_scenario(pairs, max_num_seqs=256), until=10.0)
    assert engine.sequences_per_request == 2.0
    assert engine.sequences_running is not None
    assert engine.requests_running == engine.sequences_running / 2
    # Every second sample finds its sibling's prompt blocks in the cache.
    assert engine.prefix_cache_hit_ratio is not None
    assert 0.3 < engine.prefix_cache_hit_ratio < 0.5
