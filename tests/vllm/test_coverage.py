"""Specification of what a partial payload lacks (exporter.vllm.coverage)."""

from __future__ import annotations

from exporter.vllm.coverage import NEEDED, missing_families, unusable_reason
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths


def test_a_full_032_payload_misses_nothing() -> None:
    """The real 0.32 capture has every family the figures need."""
    payload = (paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_bytes()
    assert missing_families(parse_vllm_metrics(payload).families) == []


def test_histograms_only_name_everything_else() -> None:
    """A capture of the token histograms alone lacks the cache config, usage, queue, counters."""
    payload = (paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text()
    kept = "\n".join(
        line
        for line in payload.splitlines()
        if "request_prompt_tokens" in line or "request_generation_tokens" in line
    )
    missing = [m.family for m in missing_families(parse_vllm_metrics(kept).families)]
    assert "vllm:cache_config_info" in missing
    assert "vllm:kv_cache_usage_perc" in missing
    assert "vllm:request_prompt_tokens" not in missing


def test_an_old_name_counts_as_present() -> None:
    """vllm:gpu_cache_usage_perc (before 0.9.2) is the usage family."""
    missing = missing_families({"vllm:gpu_cache_usage_perc"})
    assert "vllm:kv_cache_usage_perc" not in [m.family for m in missing]


def test_every_need_says_what_it_is_for() -> None:
    """Each entry names a vllm: family and the figures that depend on it."""
    for needed in NEEDED:
        assert needed.family.startswith("vllm:")
        assert needed.needed_for


def test_a_payload_without_vllm_series_is_said_to_have_none() -> None:
    """Another exporter's payload: no vllm: series at all."""
    reason = unusable_reason(b"node_load1 0.5\n", ())
    assert reason is not None
    assert "no vllm: series" in reason


def test_vllm_series_none_of_them_needed_are_listed_with_the_needed_families() -> None:
    """Sample lines the parser skips are still named, histogram samples under their family."""
    payload = b'vllm:lora_requests_info{engine="0"} 1\nvllm:x_bucket{le="1"} 1\n'
    reason = unusable_reason(payload, {"vllm:x"})
    assert reason is not None
    assert reason.startswith("has vllm: families (vllm:lora_requests_info, vllm:x) but none")
    assert "vllm:request_success_total" in reason


def test_a_family_named_only_by_a_comment_is_listed_as_a_family() -> None:
    """A capture cut after a `# HELP` line: that family is named, not called a series."""
    payload = b"# HELP vllm:time_per_output_toke\n"
    reason = unusable_reason(payload, set())
    assert reason is not None
    assert reason.startswith("has vllm: families (vllm:time_per_output_toke) but none")
    assert "series" not in reason


def test_a_payload_with_one_needed_family_is_usable() -> None:
    """One needed family is enough for some figures: no refusal."""
    assert unusable_reason(b"", {"vllm:num_requests_running"}) is None
