"""vLLM /metrics payloads into VllmSnapshots: real captures, version differences, data parallelism.

Golden files: ``tests/golden/vllm-metrics/<capture>.json`` hold every capture's snapshot (or its
parse error) as stable JSON. After a deliberate change, regenerate them with
``HEADROOM_UPDATE_GOLDEN=1 .venv/bin/pytest tests/vllm/test_metrics.py`` and review the diff.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.snapshot import Histogram
from exporter.errors import ParseError
from exporter.vllm.metrics import CardinalityLimits, parse_vllm_metrics
from exporter.vllm.version import guess_vllm_version
from tests import paths

CAPTURES = paths.CAPTURES
GOLDEN = paths.GOLDEN / "vllm-metrics"
UPDATE_GOLDEN = os.environ.get("HEADROOM_UPDATE_GOLDEN") == "1"

ALL_CAPTURES = sorted(path.name for path in CAPTURES.glob("*.prom"))
DOCS_CAPTURE = "14_v0.33.0-docs_V1_vllm-docs-examples.prom"
HELP_TYPE_ONLY = "05_v0.5.4-0.6.x_V0_meetkai-functionary-pr263_help-type-only.prom"
AFTER_LOAD = "vllm-0.32.0-cpu-after-load.prom"
PARSEABLE = [name for name in ALL_CAPTURES if name != DOCS_CAPTURE]


def _capture(name: str) -> str:
    return (CAPTURES / name).read_text(encoding="utf-8")


# --- golden files ----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """Plain JSON for a snapshot: sorted keys and sets, infinities and NaN as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in sorted(value.items())}
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    return value


def _render(name: str) -> str:
    try:
        snapshot = parse_vllm_metrics((CAPTURES / name).read_bytes())
    except ParseError as error:
        document: dict[str, Any] = {"capture": name, "parse_error": str(error)}
    else:
        document = {
            "capture": name,
            "vllm_version_guess": guess_vllm_version(snapshot),
            "snapshot": _jsonable(snapshot),
        }
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_every_capture_matches_its_golden_file(name: str) -> None:
    """Each real capture parses to exactly its reviewed golden snapshot (or golden error)."""
    golden = GOLDEN / f"{Path(name).stem}.json"
    rendered = _render(name)
    if UPDATE_GOLDEN:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered, encoding="utf-8")
    assert golden.exists(), f"no golden file: run with HEADROOM_UPDATE_GOLDEN=1 to create {golden}"
    assert rendered == golden.read_text(encoding="utf-8")


def test_every_golden_file_has_a_capture() -> None:
    """No golden file outlives its capture (a renamed capture would leave a stale one)."""
    stems = {Path(name).stem for name in ALL_CAPTURES}
    assert {path.stem for path in GOLDEN.glob("*.json")} == stems


# --- the real captures -----------------------------------------------------------------------


def test_the_docs_capture_fails_on_its_elided_cache_config_line() -> None:
    """vLLM's docs example (with "..." elisions) raises ParseError naming the cache_config line."""
    text = _capture(DOCS_CAPTURE)
    lines = text.split("\n")
    broken = next(i for i, line in enumerate(lines, 1) if line.startswith("vllm:cache_config_info"))
    with pytest.raises(ParseError, match=rf"^line {broken}: .*vllm:cache_config_info"):
        parse_vllm_metrics(text)


def test_the_help_type_only_capture_gives_one_engine_without_samples() -> None:
    """Families declared with metrics disabled yield engine "0" with every value absent."""
    snapshot = parse_vllm_metrics(_capture(HELP_TYPE_ONLY))
    (engine,) = snapshot.engines.values()
    assert engine.engine == "0"
    values = {f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)}
    assert values.pop("engine") == "0"
    for split in (
        "requests_waiting_by_reason",
        "sleep_state",
        "prompt_tokens_cached_by_source",
        "prompt_tokens_by_source",
        "requests_kv_fetch_by_stage",
    ):
        assert values.pop(split) == {}
    assert set(values.values()) == {None}
    assert "vllm:num_preemptions_total" in snapshot.families


def test_the_032_capture_reports_the_documented_pool_and_preemptions() -> None:
    """The 0.32 capture shows the 1,024-token pool of 8 blocks of 128 and its 15 preemptions."""
    snapshot = parse_vllm_metrics(_capture(AFTER_LOAD))
    engine = snapshot.engines["0"]
    assert snapshot.engine_labelled
    assert engine.model_name == "tiny"
    assert engine.preemptions_total == 15
    assert engine.requests_finished_total == 12  # 12 completions, summed over finished_reason
    config = engine.cache_config
    assert config is not None
    assert (config.num_gpu_blocks, config.block_size, config.kv_cache_size_tokens) == (8, 128, 1024)
    assert config.kv_cache_memory_bytes == 1_048_576
    assert config.enable_prefix_caching is True
    assert config.sliding_window is None
    assert "engine" not in config.labels
    assert engine.requests_waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
    assert snapshot.admission_rejections_total == 0.0
    assert snapshot.process_start_time_seconds == pytest.approx(1.79595212962e9)


def test_v0_names_are_normalised() -> None:
    """A V0 payload: gpu_cache_usage_perc is the usage ratio; swapped requests are kept."""
    text = _capture("02_v0.6.0_V0_korean-doc.prom").replace(
        'gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0',
        'gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25',
    )
    snapshot = parse_vllm_metrics(text)
    engine = snapshot.engines["0"]
    assert not snapshot.engine_labelled
    assert engine.kv_cache_usage_ratio == 0.25
    assert engine.requests_swapped == 0.0
    assert engine.cache_config is not None
    assert engine.cache_config.num_gpu_blocks == 2375


def test_time_per_output_token_stands_in_for_inter_token_latency() -> None:
    """Before 0.11 the inter-token latency histogram is time_per_output_token_seconds."""
    engine = parse_vllm_metrics(_capture("07_v0.9.2-0.10.x_V0engine-cpu_full.prom")).engines["0"]
    assert engine.inter_token_latency is not None
    assert engine.inter_token_latency.count == 4805


def test_created_series_are_never_read_as_values() -> None:
    """`_created` timestamps (1.7e9) never leak into counters."""
    engine = parse_vllm_metrics(_capture("10_v0.11+_V1_rhoai-lab-doc.prom")).engines["0"]
    assert engine.preemptions_total == 0.0
    assert engine.prompt_tokens_total == 0.0


def _peer_view(text: str) -> dict[str, dict[str, Any]]:
    """Per engine, what prometheus_client's own parse says, aggregated the simple way."""
    engines: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(float))
    histograms: dict[tuple[str, str], dict[str, Any]] = {}
    counters = {
        "vllm:num_preemptions_total": "preemptions_total",
        "vllm:request_success_total": "requests_finished_total",
        "vllm:prompt_tokens_total": "prompt_tokens_total",
        "vllm:generation_tokens_total": "generation_tokens_total",
    }
    gauges = {
        "vllm:num_requests_running": "requests_running",
        "vllm:num_requests_waiting": "requests_waiting",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            engine = sample.labels.get("engine", "0")
            name = counters.get(sample.name) or gauges.get(sample.name)
            if name is not None:
                engines[engine][name] += sample.value
            elif family.type == "histogram" and family.name in (
                "vllm:request_prompt_tokens",
                "vllm:request_generation_tokens",
                "vllm:time_to_first_token_seconds",
            ):
                parts = histograms.setdefault((engine, family.name), {"buckets": {}})
                if sample.name.endswith("_bucket"):
                    parts["buckets"][float(sample.labels["le"])] = float(sample.value)
                else:
                    parts[sample.name.rsplit("_", 1)[1]] = float(sample.value)
    for (engine, name), parts in histograms.items():
        bounds = tuple(sorted(parts["buckets"]))
        cumulative = tuple(parts["buckets"][bound] for bound in bounds)
        engines[engine][name] = Histogram(bounds, cumulative, parts["count"], parts["sum"])
    return engines


# 05 has no sample at all, 08 none of these families: nothing to compare there.
@pytest.mark.parametrize("name", [n for n in PARSEABLE if not n.startswith(("05", "08"))])
def test_counters_gauges_and_histograms_match_prometheus_client(name: str) -> None:
    """Per engine, our sums and histograms equal those read from prometheus_client's parse."""
    text = _capture(name)
    snapshot = parse_vllm_metrics(text)
    attributes = {
        "vllm:request_prompt_tokens": "prompt_tokens",
        "vllm:request_generation_tokens": "generation_tokens",
        "vllm:time_to_first_token_seconds": "time_to_first_token",
    }
    expected = _peer_view(text)
    assert expected
    assert set(expected) <= set(snapshot.engines)
    for engine, values in expected.items():
        for key, value in values.items():
            assert getattr(snapshot.engines[engine], attributes.get(key, key)) == value, key


# --- synthetic payloads: data parallelism, renames, malformed histograms, caps ------------------


def _engine_block(engine: str, *, blocks: int, tokens: int, model: str = "m") -> str:
    labels = f'engine="{engine}",model_name="{model}"'
    return (
        f"vllm:num_requests_running{{{labels}}} {int(engine) + 1}\n"
        f'vllm:request_success_total{{engine="{engine}",finished_reason="stop",'
        f'model_name="{model}"}} 4\n'
        f'vllm:request_success_total{{engine="{engine}",finished_reason="length",'
        f'model_name="{model}"}} 1\n'
        f'vllm:cache_config_info{{block_size="16",engine="{engine}",enable_prefix_caching="False",'
        f'gpu_memory_utilization="0.9",kv_cache_size_tokens="{tokens}",'
        f'num_gpu_blocks="{blocks}",sliding_window="None"}} 1.0\n'
    )


def test_data_parallel_engines_are_kept_apart_and_sorted_numerically() -> None:
    """Eleven engines give eleven EngineMetrics, "10" after "9", each with its own values."""
    text = "".join(
        _engine_block(str(engine), blocks=11 * 100, tokens=1600) for engine in range(10, -1, -1)
    )
    snapshot = parse_vllm_metrics(text)
    assert list(snapshot.engines) == [str(engine) for engine in range(11)]
    for name, engine in snapshot.engines.items():
        assert engine.requests_running == int(name) + 1
        assert engine.requests_finished_total == 5


def test_num_gpu_blocks_is_kept_as_vllm_reports_it_under_data_parallelism() -> None:
    """num_gpu_blocks stays the summed figure vLLM repeats per engine; tokens stay per engine."""
    text = _engine_block("0", blocks=200, tokens=1600) + _engine_block("1", blocks=200, tokens=1600)
    for engine in parse_vllm_metrics(text).engines.values():
        assert engine.cache_config is not None
        assert engine.cache_config.num_gpu_blocks == 200
        assert engine.cache_config.kv_cache_size_tokens == 1600


def test_model_name_comes_from_another_family_when_cache_config_comes_first() -> None:
    """cache_config_info has no model_name: the engine's name comes from its other series."""
    block = _engine_block("0", blocks=10, tokens=160)
    lines = block.strip().split("\n")
    engine = parse_vllm_metrics("\n".join([lines[-1], *lines[:-1]]) + "\n").engines["0"]
    assert engine.model_name == "m"


def test_the_newer_name_wins_when_both_are_exposed() -> None:
    """kv_cache_usage_perc beats gpu_cache_usage_perc; inter_token_latency beats TPOT."""
    text = (
        'vllm:gpu_cache_usage_perc{engine="0"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
        'vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf"} 9\n'
        'vllm:time_per_output_token_seconds_sum{engine="0"} 1\n'
        'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf"} 3\n'
        'vllm:inter_token_latency_seconds_sum{engine="0"} 1\n'
    )
    engine = parse_vllm_metrics(text).engines["0"]
    assert engine.kv_cache_usage_ratio == 0.25
    assert engine.inter_token_latency == Histogram((math.inf,), (3.0,), 3.0, 1.0)


def test_a_second_series_of_a_histogram_for_one_engine_is_dropped_not_added() -> None:
    """Two series of one engine (an unexpected extra label): the histogram is absent, counted."""
    text = "".join(
        f'vllm:request_prompt_tokens_bucket{{engine="0",le="{le}",x="{x}"}} {n}\n'
        for x in ("a", "b")
        for le, n in (("10", 1), ("+Inf", 2))
    ) + "".join(f'vllm:request_prompt_tokens_sum{{engine="0",x="{x}"}} 10\n' for x in "ab")
    snapshot = parse_vllm_metrics(text)
    assert snapshot.engines["0"].prompt_tokens is None
    assert snapshot.dropped == {"unexpected_series": 6}


def test_request_success_is_summed_over_finished_reason_and_nothing_else() -> None:
    """vLLM splits finished requests by reason: their sum is the engine's total."""
    text = "".join(
        f'vllm:request_success_total{{engine="0",finished_reason="{r}",model_name="m"}} {n}\n'
        for r, n in (("stop", 3), ("length", 4), ("abort", 1))
    )
    snapshot = parse_vllm_metrics(text)
    assert snapshot.engines["0"].requests_finished_total == 8
    assert snapshot.dropped == {}


def test_another_model_name_for_the_same_engine_is_dropped_not_summed() -> None:
    """200,000 model names on one engine read as one series, not 200,000 running requests."""
    text = "".join(
        f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n' for i in range(200_000)
    )
    snapshot = parse_vllm_metrics(text)
    assert snapshot.engines["0"].requests_running == 1
    assert snapshot.engines["0"].model_name == "m0"
    # Past 32,768 samples the rest are counted without being kept at all.
    assert snapshot.dropped == {"unexpected_series": 32_767, "too_many_series": 167_232}


@pytest.mark.parametrize(
    "line",
    [
        # llm-d's inference simulator writes its counters without `_total` (kthena issue 1129).
        'vllm:prefix_cache_hits{model_name="m"} 8',
        'vllm:num_preemptions{engine="0"} 7',
        'vllm:num_requests_running_count{engine="0"} 3',
        'vllm:kv_cache_usage_perc_total{engine="0"} 0.5',
        'vllm:cache_config_info_sum{engine="0",block_size="16"} 1',
    ],
)
def test_a_sample_of_another_shape_than_vllm_writes_is_dropped_and_counted(line: str) -> None:
    """A counter without `_total`, a gauge's `_count`: never read, never silently lost."""
    snapshot = parse_vllm_metrics('vllm:num_requests_waiting{engine="0"} 0\n' + line + "\n")
    assert snapshot.dropped == {"unexpected_series": 1}
    engine = snapshot.engines["0"]
    assert engine.requests_waiting == 0
    assert (engine.prefix_cache_hits_total, engine.preemptions_total) == (None, None)
    assert (engine.requests_running, engine.kv_cache_usage_ratio) == (None, None)
    assert engine.cache_config is None


def test_a_series_written_twice_is_refused_as_prometheus_refuses_it() -> None:
    """Duplicate series (3 + 3 running) are a ParseError naming the line, never a sum of 6."""
    line = 'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
    with pytest.raises(ParseError, match=r"^line 2: .*written twice"):
        parse_vllm_metrics(line + line)
    histogram = 'vllm:request_prompt_tokens_count{engine="0"} 1\n'
    with pytest.raises(ParseError, match="written twice"):
        parse_vllm_metrics(histogram + histogram)
    spelt_otherwise = histogram.replace('"0"}', '"0",}')  # the same labels, another text
    with pytest.raises(ParseError, match=r"^line 2: .*written twice"):
        parse_vllm_metrics(histogram + spelt_otherwise)


@pytest.mark.parametrize(
    ("family", "value", "reason"),
    [
        ("vllm:num_requests_running", "NaN", "not_finite"),
        ("vllm:num_requests_waiting", "-5", "out_of_range"),
        ("vllm:num_requests_waiting", "+Inf", "not_finite"),
        ("vllm:kv_cache_usage_perc", "NaN", "not_finite"),
        ("vllm:kv_cache_usage_perc", "-3", "out_of_range"),
        ("vllm:kv_cache_usage_perc", "1.5", "out_of_range"),
        ("vllm:num_preemptions_total", "-1", "out_of_range"),
        ("vllm:num_preemptions_total", "Inf", "not_finite"),
        # past 2**53 no count is exact, and no vLLM's comes near: two such readings, a reset
        # apart, would add up to an infinite rate
        ("vllm:num_preemptions_total", "1.7e308", "out_of_range"),
        ("vllm:num_preemptions_total", "9007199254740994", "out_of_range"),
        # requests running or waiting are counts too: past 2**53 none is exact
        ("vllm:num_requests_running", "1e16", "out_of_range"),
        ("vllm:num_requests_waiting", "1e308", "out_of_range"),
    ],
)
def test_an_impossible_value_leaves_its_figure_absent_and_is_counted(
    family: str, value: str, reason: str
) -> None:
    """NaN, infinities, negative counts and a usage outside 0 to 1 are refused, not exported."""
    snapshot = parse_vllm_metrics(f'{family}{{engine="0",model_name="m"}} {value}\n')
    engine = snapshot.engines["0"]
    assert (
        engine.requests_running,
        engine.requests_waiting,
        engine.kv_cache_usage_ratio,
        engine.preemptions_total,
    ) == (None, None, None, None)
    assert snapshot.dropped == {reason: 1}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('vllm:request_prompt_tokens_bucket{le="1"} NaN', "not_finite"),
        ('vllm:request_prompt_tokens_count{le="1"} +Inf', "not_finite"),
        ("vllm:request_prompt_tokens_sum -1", "out_of_range"),
    ],
)
def test_a_histogram_with_an_impossible_value_is_absent_and_counted(line: str, reason: str) -> None:
    """An infinite count or a NaN bucket drops the histogram (never a derivation's NaN)."""
    whole = {
        "bucket": 'vllm:request_prompt_tokens_bucket{le="+Inf"} 4',
        "count": "vllm:request_prompt_tokens_count 4",
        "sum": "vllm:request_prompt_tokens_sum 9",
    }
    kind = line.split("_tokens_", 1)[1].split("{", maxsplit=1)[0].split(" ", maxsplit=1)[0]
    lines = [line if name == kind else text for name, text in whole.items()]
    if kind == "bucket":
        lines.append(line)
    snapshot = parse_vllm_metrics("\n".join(lines) + "\n")
    assert snapshot.engines["0"].prompt_tokens is None
    assert list(snapshot.dropped) == [reason]


@pytest.mark.parametrize(
    ("below", "total"), [("0.5", "4"), ("1e-320", "4"), ("1", "4.5"), ("5e-324", "5e-324")]
)
def test_a_histogram_counting_part_of_an_observation_is_absent(below: str, total: str) -> None:
    """Observations are counted by ones: a fraction of one (1e-320 too) is no vLLM's."""
    lines = [
        f'vllm:request_prompt_tokens_bucket{{le="1"}} {below}',
        f'vllm:request_prompt_tokens_bucket{{le="+Inf"}} {total}',
        f"vllm:request_prompt_tokens_count {total}",
        "vllm:request_prompt_tokens_sum 9",
    ]
    snapshot = parse_vllm_metrics("\n".join(lines) + "\n")
    assert snapshot.engines["0"].prompt_tokens is None
    assert snapshot.dropped == {"out_of_range": 4}  # the histogram's samples, each counted


def test_a_label_value_longer_than_vllm_writes_is_dropped_and_counted() -> None:
    """A 1,000-character model name is not kept: the sample is dropped, and counted."""
    long = "x" * 1000
    text = (
        f'vllm:num_requests_running{{engine="0",model_name="{long}"}} 1\n'
        f'vllm:cache_config_info{{block_size="16",engine="0",note="{long}"}} 1\n'
    )
    snapshot = parse_vllm_metrics(text)
    engine = snapshot.engines["0"]
    assert engine.requests_running is None
    assert engine.cache_config is not None
    assert engine.cache_config.block_size == 16
    assert "note" not in engine.cache_config.labels
    assert snapshot.dropped == {"label_too_long": 2}


def test_a_line_longer_than_any_vllm_writes_is_skipped_unparsed() -> None:
    """A 15 MB label value is never even copied into a label: its line is counted and skipped."""
    huge = "x" * 15_000_000
    text = (
        f'vllm:num_requests_running{{engine="0",model_name="{huge}"}} 1\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
    )
    snapshot = parse_vllm_metrics(text)
    assert snapshot.engines["0"].requests_running is None
    assert snapshot.engines["0"].requests_waiting == 2
    assert snapshot.dropped == {"label_too_long": 1}


def test_a_missing_inf_bucket_is_the_count() -> None:
    """Without a +Inf bucket, `_count` supplies it (the docs' examples elide it)."""
    text = (
        'vllm:request_queue_time_seconds_bucket{le="0.1"} 2\n'
        "vllm:request_queue_time_seconds_count 5\n"
        "vllm:request_queue_time_seconds_sum 1.5\n"
    )
    histogram = parse_vllm_metrics(text).engines["0"].request_queue_time
    assert histogram == Histogram((0.1, math.inf), (2.0, 5.0), 5.0, 1.5)


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (['h_bucket{le="1"} 1', "h_sum 1"], "no +Inf bucket and no _count"),
        (['h_bucket{le="+Inf"} 1', "h_count 1"], "no _sum"),
        (['h_bucket{le="1"} 5', 'h_bucket{le="+Inf"} 4', "h_sum 1"], "le=inf counts fewer"),
    ],
)
def test_a_broken_histogram_raises_naming_its_first_line(lines: list[str], problem: str) -> None:
    """A histogram that is not whole or not cumulative is a ParseError, not a silent guess."""
    text = "# padding\n" + "\n".join(lines).replace("h_", "vllm:e2e_request_latency_seconds_")
    with pytest.raises(ParseError, match=r"^line 2: .*e2e_request_latency_seconds") as caught:
        parse_vllm_metrics(text)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('vllm:request_prompt_tokens_bucket{engine="0"} 1', "without an 'le' label"),
        ('vllm:request_prompt_tokens_bucket{le="ten"} 1', "le='ten' is not a number"),
        ('vllm:request_prompt_tokens_bucket{le="1\x0c"} 1', "le='1\\x0c' is not a number"),
        ('vllm:cache_config_info{num_gpu_blocks="8\x0b"} 1', "is not a number"),
        ('vllm:cache_config_info{num_gpu_blocks="many"} 1', "num_gpu_blocks='many'"),
        ('vllm:cache_config_info{block_size="16.5"} 1', "is not an integer"),
        ('vllm:cache_config_info{gpu_memory_utilization="inf"} 1', "is not a number"),
        ('vllm:cache_config_info{enable_prefix_caching="yes"} 1', "not True, False or None"),
        ('vllm:simple_kv_offload_info{capacity_blocks="4096.5"} 1', "is not an integer"),
    ],
)
def test_a_malformed_series_we_read_raises_naming_its_line(line: str, problem: str) -> None:
    """Bad `le` bounds and cache_config_info values are ParseErrors that point at the line."""
    with pytest.raises(ParseError, match=r"^line 2: ") as caught:
        parse_vllm_metrics(f"vllm:num_requests_running 1\n{line}\n")
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    "line",
    [
        b' vllm:num_requests_running{engine="0",model_name="\xff"} 1',
        b'vllm:num_requests_running {engine="0",model_name="\xff"} 1',
        b'vllm:num_requests_running{engine="\xfe",model_name="m"} 1',
    ],
)
def test_a_label_that_is_not_utf8_is_refused_in_one_line(line: bytes) -> None:
    """An invalid byte in a series we read is a one-line ParseError, never a label we export."""
    with pytest.raises(ParseError, match=r"^line 1: .*not valid UTF-8") as caught:
        parse_vllm_metrics(line + b"\n")
    assert "\n" not in str(caught.value)
    str(caught.value).encode("utf-8")  # the message itself can be logged


def test_cache_config_values_are_python_str_of_their_fields() -> None:
    """Label value "None" is None, "True" and "False" are booleans, "2340.0" is 2340."""
    config = (
        parse_vllm_metrics(
            'vllm:cache_config_info{cache_dtype="fp8_e5m2",enable_prefix_caching="None",'
            'kv_cache_memory_bytes="2340.0",num_gpu_blocks="None",sliding_window="4096"} 1\n'
        )
        .engines["0"]
        .cache_config
    )
    assert config is not None
    assert config.cache_dtype == "fp8_e5m2"
    assert config.enable_prefix_caching is None
    assert config.kv_cache_memory_bytes == 2340
    assert config.num_gpu_blocks is None
    assert config.sliding_window == 4096


def test_admission_rejections_are_summed_per_server() -> None:
    """admission_rejections_total has no engine label: its reasons add up for the server."""
    text = (
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 2\n'
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"} 3\n'
        'vllm:admission_rejections_created{model_name="m",reason="max_num_queued_reqs"} 1.7e9\n'
    )
    assert parse_vllm_metrics(text).admission_rejections_total == 5


def test_a_rejection_count_past_2_53_is_left_out_as_any_counters() -> None:
    """A reason's count of 1e308 is no vLLM's: out of the total and the split, counted."""
    text = (
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 1e308\n'
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"} 3\n'
    )
    snapshot = parse_vllm_metrics(text)
    assert snapshot.admission_rejections_total == 3
    assert snapshot.admission_rejections_by_reason == {"max_num_queued_tokens": 3.0}
    assert snapshot.dropped == {"out_of_range": 1}


def test_the_033_capture_keeps_the_rejections_by_the_cap_that_refused() -> None:
    """0.33 with --max-num-queued-reqs 8: the 4 refusals are the request cap's, none the tokens'."""
    snapshot = parse_vllm_metrics(_capture("vllm-0.33.0-reconstructed.prom"))
    assert snapshot.admission_rejections_by_reason == {
        "max_num_queued_reqs": 4.0,
        "max_num_queued_tokens": 0.0,
    }
    assert snapshot.admission_rejections_total == 4
    assert snapshot.dropped == {}


def test_before_032_there_are_no_rejections_by_reason() -> None:
    """No admission_rejections family: no reasons, and the total is absent too."""
    snapshot = parse_vllm_metrics(_capture("10_v0.11+_V1_rhoai-lab-doc.prom"))
    assert snapshot.admission_rejections_by_reason == {}
    assert snapshot.admission_rejections_total is None


def _rejections(*reasons: tuple[str, float]) -> str:
    return "".join(
        f'vllm:admission_rejections_total{{model_name="m",reason="{reason}"}} {count}\n'
        for reason, count in reasons
    )


def test_a_reason_vllm_does_not_write_yet_is_kept_beside_its_own() -> None:
    """A cap a later vLLM adds is its own figure, and counts in the total as before."""
    text = _rejections(("max_num_queued_reqs", 2), ("max_num_waiting_loras", 7))
    snapshot = parse_vllm_metrics(text)
    assert snapshot.admission_rejections_by_reason == {
        "max_num_queued_reqs": 2.0,
        "max_num_waiting_loras": 7.0,
    }
    assert snapshot.admission_rejections_total == 9
    assert snapshot.dropped == {}


def test_made_up_reasons_past_the_cap_are_counted_but_vllm_s_own_are_always_kept() -> None:
    """Ten made-up reasons before vLLM's: four kept, six dropped; the total counts them all."""
    made_up = [(f"made_up_{i}", 1.0) for i in range(10)]
    text = _rejections(*made_up, ("max_num_queued_reqs", 5), ("max_num_queued_tokens", 6))
    snapshot = parse_vllm_metrics(text)
    assert snapshot.admission_rejections_by_reason == {
        "made_up_0": 1.0,
        "made_up_1": 1.0,
        "made_up_2": 1.0,
        "made_up_3": 1.0,
        "max_num_queued_reqs": 5.0,
        "max_num_queued_tokens": 6.0,
    }
    assert snapshot.dropped == {"too_many_series": 6}
    assert snapshot.admission_rejections_total == 21


def test_long_made_up_reasons_are_kept_up_to_the_character_budget() -> None:
    """Past 512 characters a reason is too long; 1,024 characters of reasons in all are kept."""
    long = [f"{i}".ljust(500, "r") for i in range(3)]
    text = _rejections(("x" * 513, 1.0), *((reason, 1.0) for reason in long))
    snapshot = parse_vllm_metrics(text)
    assert list(snapshot.admission_rejections_by_reason) == long[:2]
    assert snapshot.dropped == {"label_too_long": 1, "too_many_series": 1}
    assert snapshot.admission_rejections_total == 4


def test_a_rejection_without_a_reason_counts_in_the_total_only() -> None:
    """vLLM labels every refusal with its reason: one without is no cap's."""
    snapshot = parse_vllm_metrics('vllm:admission_rejections_total{model_name="m"} 3\n')
    assert snapshot.admission_rejections_total == 3
    assert snapshot.admission_rejections_by_reason == {}
    assert snapshot.dropped == {"unexpected_series": 1}


def test_an_impossible_rejection_count_is_left_out_of_both_figures() -> None:
    """A negative count of one reason: that reason absent, the total the others' sum."""
    text = _rejections(("max_num_queued_reqs", -1), ("max_num_queued_tokens", 2))
    snapshot = parse_vllm_metrics(text)
    assert snapshot.admission_rejections_by_reason == {"max_num_queued_tokens": 2.0}
    assert snapshot.admission_rejections_total == 2
    assert snapshot.dropped == {"out_of_range": 1}


def test_a_payload_without_vllm_families_gives_no_engine() -> None:
    """Another exporter's /metrics gives an empty snapshot, for the caller to report."""
    snapshot = parse_vllm_metrics("# TYPE up gauge\nup 1\nprocess_start_time_seconds 12\n")
    assert snapshot.engines == {}
    assert snapshot.families == frozenset()
    assert snapshot.process_start_time_seconds == 12


def test_families_are_named_as_type_lines_name_them_without_created() -> None:
    """Counters keep `_total`, `_created` companions are left out, samples alone count too."""
    snapshot = parse_vllm_metrics(_capture(AFTER_LOAD))
    assert {"vllm:num_preemptions_total", "vllm:request_prompt_tokens"} <= snapshot.families
    assert not any(name.endswith("_created") for name in snapshot.families)
    bare = parse_vllm_metrics('vllm:num_preemptions_total{engine="0"} 1\n')
    assert bare.families == frozenset({"vllm:num_preemptions_total"})


# --- cardinality caps ------------------------------------------------------------------------

SMALL = CardinalityLimits(
    max_engines=3, max_split_values=2, max_histogram_buckets=4, max_cache_config_labels=2
)


def test_engines_past_the_cap_are_dropped_and_counted() -> None:
    """With room for 3 engines, the 4th and 5th engines' samples are counted, not kept."""
    text = "".join(f'vllm:num_requests_running{{engine="{e}"}} 1\n' for e in range(5))
    snapshot = parse_vllm_metrics(text, limits=SMALL)
    assert list(snapshot.engines) == ["0", "1", "2"]
    assert snapshot.dropped_samples == 2


def test_waiting_reasons_past_the_cap_are_dropped_and_counted() -> None:
    """Only the first waiting reasons are kept; the others are counted."""
    text = "".join(f'vllm:num_requests_waiting_by_reason{{reason="r{i}"}} 1\n' for i in range(4))
    snapshot = parse_vllm_metrics(text, limits=SMALL)
    assert snapshot.engines["0"].requests_waiting_by_reason == {"r0": 1.0, "r1": 1.0}
    assert snapshot.dropped_samples == 2


def test_a_histogram_with_too_many_buckets_is_dropped_whole() -> None:
    """Past the bucket cap the histogram is absent (a partial one would lie) and counted."""
    text = "".join(f'vllm:request_prompt_tokens_bucket{{le="{le}"}} 1\n' for le in range(6))
    snapshot = parse_vllm_metrics(text + "vllm:request_prompt_tokens_sum 1\n", limits=SMALL)
    assert snapshot.engines["0"].prompt_tokens is None
    assert snapshot.dropped_samples == 7


def test_cache_config_labels_past_the_cap_are_dropped_but_still_read() -> None:
    """The info labels kept are capped; the capacity fields are read from all of them."""
    text = 'vllm:cache_config_info{a="1",b="2",c="3",num_gpu_blocks="9"} 1\n'
    snapshot = parse_vllm_metrics(text, limits=SMALL)
    config = snapshot.engines["0"].cache_config
    assert config is not None
    assert config.labels == {"a": "1", "b": "2"}
    assert config.num_gpu_blocks == 9
    assert snapshot.dropped_samples == 2


def test_long_split_values_are_kept_up_to_a_total_per_engine() -> None:
    """500-character waiting reasons and cache sources: two fit an engine's 1,024, the rest go."""
    long = [f"{i}".ljust(500, "x") for i in range(8)]
    text = "".join(
        f'vllm:num_requests_waiting_by_reason{{engine="0",reason="{r}"}} 1\n' for r in long[:4]
    ) + "".join(
        f'vllm:prompt_tokens_cached_by_source_total{{engine="0",source="{r}"}} 1\n'
        for r in long[4:]
    )
    snapshot = parse_vllm_metrics(text)
    engine = snapshot.engines["0"]
    assert list(engine.requests_waiting_by_reason) == long[:2]
    assert engine.prompt_tokens_cached_by_source == {}
    assert snapshot.dropped == {"too_many_series": 6}


def test_thousands_of_engines_stay_bounded_by_default() -> None:
    """A hostile payload with 5,000 engines keeps 64 of them and counts the rest."""
    text = "".join(f'vllm:num_requests_running{{engine="{e}"}} 1\n' for e in range(5000))
    snapshot = parse_vllm_metrics(text)
    assert len(snapshot.engines) == 64
    assert snapshot.dropped == {"too_many_series": 5000 - 64}


# --- property: any generated data-parallel payload reads back as its model -------------------

_BOUNDS = ("1", "5", "20", "100", "+Inf")


@st.composite
def _deployments(draw: st.DrawFn) -> tuple[str, dict[str, dict[str, Any]]]:
    """A vLLM-like payload for a few engines, and per engine what it must read back as."""
    engines = draw(st.lists(st.integers(0, 40).map(str), min_size=1, max_size=5, unique=True))
    counts = st.integers(0, 10**6)
    blocks: list[list[str]] = []
    model: dict[str, dict[str, Any]] = {}
    for engine in engines:
        labels = f'engine="{engine}",model_name="m"'
        running, preemptions = draw(counts), draw(counts)
        reasons = draw(st.lists(counts, min_size=1, max_size=4))
        steps = draw(st.lists(counts, min_size=len(_BOUNDS), max_size=len(_BOUNDS)))
        cumulative = [float(sum(steps[: i + 1])) for i in range(len(steps))]
        # A sum its buckets allow: each observation above its bucket's lower bound, and at
        # most 100 each unless the +Inf bucket holds some (a sum outside is dropped).
        lowest = sum(n * lower for n, lower in zip(steps, (0, 1, 5, 20, 100), strict=True))
        span = 10**6 if steps[-1] else cumulative[-1] * 100 - lowest
        total = lowest + draw(st.integers(0, int(span)))
        lines = [f"vllm:num_requests_running{{{labels}}} {running}"]
        lines.append(f"vllm:num_preemptions_total{{{labels}}} {preemptions}")
        lines += [
            f'vllm:request_success_total{{{labels},finished_reason="r{i}"}} {n}'
            for i, n in enumerate(reasons)
        ]
        lines += [
            f'vllm:request_prompt_tokens_bucket{{{labels},le="{le}"}} {n}'
            for le, n in zip(_BOUNDS, cumulative, strict=True)
        ]
        lines.append(f"vllm:request_prompt_tokens_count{{{labels}}} {cumulative[-1]}")
        lines.append(f"vllm:request_prompt_tokens_sum{{{labels}}} {total}")
        blocks.append(lines)
        model[engine] = {
            "requests_running": running,
            "preemptions_total": preemptions,
            "requests_finished_total": sum(reasons),
            "prompt_tokens": Histogram(
                tuple(float(le) for le in _BOUNDS), tuple(cumulative), cumulative[-1], total
            ),
        }
    # vLLM writes family by family; interleave the engines' lines family-wise, or not at all.
    if draw(st.booleans()):
        lines = [line for block in blocks for line in block]
    else:
        width = max(len(block) for block in blocks)
        lines = [block[i] for i in range(width) for block in blocks if i < len(block)]
    return "\n".join(lines) + "\n", model


@settings(max_examples=60, deadline=None)
@given(_deployments())
def test_generated_deployments_read_back_as_their_model(
    case: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    """Per engine, gauges, counters summed over reasons and histograms come back exactly."""
    text, model = case
    snapshot = parse_vllm_metrics(text.encode())
    assert set(snapshot.engines) == set(model)
    for engine, expected in model.items():
        for field, value in expected.items():
            assert getattr(snapshot.engines[engine], field) == value, field
    assert snapshot.dropped_samples == 0


_CORRUPTIONS = st.sampled_from([*'{}",=\\ \n\t#x0.+-e_', "\x00", "é", "\ufeff", "\r"])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_corrupted_real_capture_parses_or_raises_parse_error(data: st.DataObject) -> None:
    """Any single corrupted or inserted character gives a snapshot or a ParseError, no crash."""
    text = _capture(AFTER_LOAD)
    position = data.draw(st.integers(0, len(text) - 1))
    character = data.draw(_CORRUPTIONS)
    keep = data.draw(st.booleans())  # insert the character, or overwrite one
    corrupted = text[:position] + character + text[position + (0 if keep else 1) :]
    with contextlib.suppress(ParseError):
        parse_vllm_metrics(corrupted)


# --- the families every limit needs (issue 16) -------------------------------------------------


def test_the_032_capture_reports_sleep_prefix_cache_and_n() -> None:
    """The real 0.32 capture: awake, 1,212 prompt tokens looked up, none hit, 12 requests of n=1."""
    engine = parse_vllm_metrics(_capture(AFTER_LOAD)).engines["0"]
    assert engine.sleep_state == {"awake": 1.0, "discard_all": 0.0, "weights_offloaded": 0.0}
    assert (engine.prefix_cache_queries_total, engine.prefix_cache_hits_total) == (1212.0, 0.0)
    assert engine.prompt_tokens_cached_by_source == {
        "device": 0.0,
        "disk": 0.0,
        "external_unspecified": 0.0,
        "host": 0.0,
        "p2p": 0.0,
    }
    assert engine.request_params_n is not None
    assert (engine.request_params_n.count, engine.request_params_n.sum) == (12.0, 12.0)


def test_prefix_cache_counters_before_0_9_2_have_the_gpu_prefix() -> None:
    """vllm:gpu_prefix_cache_* stand in when the newer names are absent; the newer win."""
    old = parse_vllm_metrics(
        'vllm:gpu_prefix_cache_queries_total{engine="0"} 10\n'
        'vllm:gpu_prefix_cache_hits_total{engine="0"} 4\n'
    ).engines["0"]
    assert (old.prefix_cache_queries_total, old.prefix_cache_hits_total) == (10.0, 4.0)
    both = parse_vllm_metrics(
        'vllm:gpu_prefix_cache_queries_total{engine="0"} 10\n'
        'vllm:prefix_cache_queries_total{engine="0"} 30\n'
        'vllm:prefix_cache_hits_total{engine="0"} 9\n'
    ).engines["0"]
    assert (both.prefix_cache_queries_total, both.prefix_cache_hits_total) == (30.0, 9.0)


def test_a_cache_source_written_twice_is_refused() -> None:
    """Two samples of one source of one engine: the series is written twice."""
    line = 'vllm:prompt_tokens_cached_by_source_total{engine="0",source="host"} 1\n'
    with pytest.raises(ParseError, match="written twice"):
        parse_vllm_metrics(line * 2)


def test_cache_sources_past_the_cap_are_dropped_and_counted() -> None:
    """Only the first sources are kept; the others are counted, never summed in silently."""
    text = "".join(
        f'vllm:prompt_tokens_cached_by_source_total{{engine="0",source="s{i}"}} 1\n'
        for i in range(4)
    )
    snapshot = parse_vllm_metrics(text, limits=SMALL)
    assert snapshot.engines["0"].prompt_tokens_cached_by_source == {"s0": 1.0, "s1": 1.0}
    assert snapshot.dropped_samples == 2


def test_an_impossible_sleep_state_is_dropped_and_counted() -> None:
    """A NaN sleep state is left out and counted, the others kept."""
    text = (
        'vllm:engine_sleep_state{engine="0",sleep_state="awake"} NaN\n'
        'vllm:engine_sleep_state{engine="0",sleep_state="discard_all"} 0\n'
    )
    snapshot = parse_vllm_metrics(text)
    assert snapshot.engines["0"].sleep_state == {"discard_all": 0.0}
    assert snapshot.dropped == {"not_finite": 1}


# --- KV offload and KV fetch stages (written only with a KV connector) ------------------------

#: What a vLLM 0.32.0 engine writes of them with SimpleCPUOffloadConnector, written from its
#: source (the file's header names where each line comes from).
OFFLOAD = paths.FIXTURES / "vllm-offload" / "kv-offload-0.32.0-written-from-source.prom"


def test_kv_fetch_stages_and_the_offload_pool_are_read() -> None:
    """Each stage is kept by its name; the offload pool is the info gauge's capacity_blocks."""
    engine = parse_vllm_metrics(OFFLOAD.read_bytes()).engines["0"]
    assert engine.requests_kv_fetch_by_stage == {
        "completed_waiting": 0.0,
        "in_progress": 1.0,
        "waiting_to_start": 2.0,
    }
    assert engine.kv_offload_capacity_blocks == 32
    assert engine.model_name == "tiny"
    read_by_the_client = text_string_to_metric_families(OFFLOAD.read_text(encoding="utf-8"))
    assert len([family.name for family in read_by_the_client]) == 2  # valid exposition


def test_033_names_the_offload_pool_in_cache_config_too() -> None:
    """0.33's CacheConfig adds simple_cpu_offload_num_blocks (vllm/config/cache.py)."""
    text = (
        'vllm:cache_config_info{engine="0",simple_cpu_offload_num_blocks="4096"} 1\n'
        'vllm:cache_config_info{engine="1",simple_cpu_offload_num_blocks="None"} 1\n'
    )
    engines = parse_vllm_metrics(text).engines
    configs = [engine.cache_config for engine in engines.values()]
    assert [c.simple_cpu_offload_num_blocks if c else "?" for c in configs] == [4096, None]


def test_a_negative_offload_pool_is_dropped_and_counted() -> None:
    """A pool of -1 blocks is not vLLM's (str() of a block count): absent, counted."""
    snapshot = parse_vllm_metrics('vllm:simple_kv_offload_info{capacity_blocks="-1"} 1\n')
    assert snapshot.engines["0"].kv_offload_capacity_blocks is None
    assert snapshot.dropped == {"out_of_range": 1}


def test_a_second_offload_info_series_for_one_engine_is_dropped() -> None:
    """vLLM writes one info series per engine: another label set for it is not summed in."""
    text = (
        'vllm:simple_kv_offload_info{capacity_blocks="32",engine="0"} 1\n'
        'vllm:simple_kv_offload_info{capacity_blocks="64",engine="0"} 1\n'
    )
    snapshot = parse_vllm_metrics(text)
    assert snapshot.engines["0"].kv_offload_capacity_blocks == 32
    assert snapshot.dropped == {"unexpected_series": 1}


def _after_load_with(pattern: str, replacement: str) -> str:
    """The 0.32 after-load capture with one line changed (the pattern must match once)."""
    text = _capture(AFTER_LOAD)
    changed, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, pattern
    return changed


@pytest.mark.parametrize(
    ("label", "value", "field"),
    [
        ("num_gpu_blocks", "-1", "num_gpu_blocks"),
        ("num_gpu_blocks", "0", "num_gpu_blocks"),
        ("num_gpu_blocks", "1e18", "num_gpu_blocks"),
        ("block_size", "0", "block_size"),
        ("block_size", "-16", "block_size"),
        ("block_size", "1e18", "block_size"),
        ("kv_cache_size_tokens", "-1", "kv_cache_size_tokens"),
        ("kv_cache_size_tokens", "0", "kv_cache_size_tokens"),
        ("kv_cache_size_tokens", "1e300", "kv_cache_size_tokens"),
        ("gpu_memory_utilization", "2", "gpu_memory_utilization"),
        ("gpu_memory_utilization", "0", "gpu_memory_utilization"),
        ("gpu_memory_utilization", "-0.5", "gpu_memory_utilization"),
        ("kv_cache_memory_bytes", "-1", "kv_cache_memory_bytes"),
        ("kv_cache_max_concurrency", "-2.0", "kv_cache_max_concurrency"),
        ("sliding_window", "-5", "sliding_window"),
    ],
)
def test_an_impossible_cache_config_value_is_absent_and_counted(
    label: str, value: str, field: str
) -> None:
    """A cache_config_info value vLLM cannot write is None, counted out_of_range; not a figure."""
    text = _after_load_with(
        rf'(vllm:cache_config_info\{{[^}}]*\b{label}=")[^"]*"', rf'\g<1>{value}"'
    )
    snapshot = parse_vllm_metrics(text)
    config = snapshot.engines["0"].cache_config
    assert config is not None
    assert getattr(config, field) is None
    assert snapshot.dropped == {"out_of_range": 1}
    clean = parse_vllm_metrics(_capture(AFTER_LOAD)).engines["0"].cache_config
    assert clean is not None
    assert getattr(clean, field) is not None or field == "sliding_window"


_PROMPT_SUM = r'^(vllm:request_prompt_tokens_sum\{engine="0",model_name="tiny"\}) .*$'
_PROMPT_COUNT = r'^(vllm:request_prompt_tokens_count\{engine="0",model_name="tiny"\}) .*$'


@pytest.mark.parametrize(
    ("pattern", "value"),
    [
        pytest.param(_PROMPT_SUM, "1e200", id="sum-far-above-count-x-largest-bound"),
        pytest.param(_PROMPT_SUM, "1e6", id="sum-above-count-x-largest-bound"),
        pytest.param(_PROMPT_SUM, "6001", id="sum-just-above-12-x-500"),
        pytest.param(_PROMPT_SUM, "1199", id="sum-below-12-x-lower-bound-100"),
        pytest.param(_PROMPT_SUM, "0", id="sum-zero-with-observations-over-100"),
    ],
)
def test_a_histogram_sum_its_buckets_contradict_is_dropped_and_counted(
    pattern: str, value: str
) -> None:
    """12 prompts, all in (100, 200]: a sum outside 1,200 to 6,000 (12 x 500) cannot be true."""
    snapshot = parse_vllm_metrics(_after_load_with(pattern, rf"\g<1> {value}"))
    engine = snapshot.engines["0"]
    assert engine.prompt_tokens is None
    assert engine.generation_tokens is not None
    assert snapshot.dropped == {"out_of_range": 12}  # 10 buckets, _count and _sum


@pytest.mark.parametrize("value", ["1200", "1212", "6000"])
def test_a_histogram_sum_within_what_its_buckets_allow_is_kept(value: str) -> None:
    """At the bounds the buckets allow (12 x 100 to 12 x 500), the sum is read as it is."""
    snapshot = parse_vllm_metrics(_after_load_with(_PROMPT_SUM, rf"\g<1> {value}"))
    prompt = snapshot.engines["0"].prompt_tokens
    assert prompt is not None
    assert prompt.sum == float(value)
    assert snapshot.dropped == {}


def test_a_histogram_count_past_what_a_float_counts_is_dropped() -> None:
    """A count above 2**53 is no vLLM's (a float no longer counts by ones there)."""
    text = _capture(AFTER_LOAD).replace(
        'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="tiny"} 12.0',
        'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="tiny"} 1e300',
    )
    text = re.sub(_PROMPT_COUNT, r"\g<1> 1e300", text, flags=re.MULTILINE)
    text = re.sub(_PROMPT_SUM, r"\g<1> 1e303", text, flags=re.MULTILINE)
    snapshot = parse_vllm_metrics(text)
    assert snapshot.engines["0"].prompt_tokens is None
    assert snapshot.dropped == {"out_of_range": 12}
