"""Specification of `vllm-headroom check` over captures and a live server."""

from __future__ import annotations

import json
import os
import re
import time
from typing import TYPE_CHECKING, Any

import pytest

from exporter.cli.main import main
from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.testing.fakevllm import FakeVllm

CAPTURES = paths.CAPTURES
TINY = paths.CONFIGS / "tiny-llama"
STABLE_KEYS = {
    "kv_capacity_tokens",
    "kv_tokens_used",
    "num_requests_running",
    "num_requests_waiting",
    "num_preemptions",
    "vllm_version_guess",
    "engines",
    "prediction",
}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """Run check with --json and parse its output."""
    assert main(["check", *argv, "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_json_of_the_real_capture_has_the_stable_keys_and_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The 0.32 after-load capture: 1,024 tokens, 15 preemptions, a >=0.32 guess."""
    result = run_json(capsys, str(CAPTURES / "vllm-0.32.0-cpu-after-load.prom"))
    assert result.keys() >= STABLE_KEYS
    assert result["kv_capacity_tokens"] == 1024
    assert result["num_preemptions"] == 15
    assert result["vllm_version_guess"] == ">=0.32"
    engines = result["engines"]
    assert isinstance(engines, list)
    assert engines[0]["engine"] == "0"


def test_a_model_flag_adds_the_prediction_and_its_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With --model the prediction is compared with vLLM's own capacity (exact here)."""
    result = run_json(capsys, str(CAPTURES / "vllm-0.32.0-cpu-idle.prom"), "--model", str(TINY))
    prediction = result["prediction"]
    assert isinstance(prediction, dict)
    assert prediction["state"] == "ok"
    assert prediction["kv_capacity_tokens"] == 1024
    engines = result["engines"]
    assert isinstance(engines, list)
    assert engines[0]["kv_capacity_error_ratio"] == 0.0


@pytest.mark.parametrize("capture", sorted(p.name for p in CAPTURES.glob("*.prom")))
def test_every_real_capture_is_either_analysed_or_refused_in_one_line(
    capture: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each real capture gives a report, or (the docs' elided text) one error line, exit 2."""
    code = main(["check", str(CAPTURES / capture)])
    out, err = capsys.readouterr()
    if code == 0:
        assert "engine 0" in out
    else:
        assert code == 2
        assert err.count("\n") == 1
        assert "line " in err


def test_a_malformed_file_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken sample of a family we read is reported with its line number, exit 2."""
    bad = tmp_path / "bad.prom"
    bad.write_text('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{x="1" 2\n')
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err
    assert "Traceback" not in err


def test_a_file_without_vllm_metrics_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A /metrics payload of something else is not silently reported as empty."""
    other = tmp_path / "node.prom"
    other.write_text("# TYPE node_load1 gauge\nnode_load1 0.5\n")
    assert main(["check", str(other)]) == 2
    assert "no vLLM metrics" in capsys.readouterr().err


def test_a_capture_of_vllm_series_none_of_which_check_reads_says_what_it_has_and_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A partial capture: the families found and those needed, never "no vllm: series"."""
    partial = tmp_path / "partial.prom"
    partial.write_text(
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf"} 3\n'
        'vllm:iteration_tokens_total_count{engine="0"} 3\n'
        'vllm:iteration_tokens_total_sum{engine="0"} 3\n'
        'vllm:lora_requests_info{engine="0"} 1\n'
    )
    assert main(["check", str(partial)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no vllm: series" not in err
    assert "has vllm: families (vllm:iteration_tokens_total, vllm:lora_requests_info)" in err
    assert "vllm:cache_config_info, vllm:kv_cache_usage_perc" in err


@pytest.mark.parametrize(
    ("kind", "timeout", "message"),
    [
        ("/dev/zero", "30", "/dev/zero (a character device) is larger than 64 MiB"),
        ("/dev/urandom", "30", "/dev/urandom (a character device) is larger than 64 MiB"),
        ("fifo", "0.3", "is a FIFO with no writer for 0.3 s"),
        ("directory", "0.3", "it is a directory"),
    ],
)
def test_a_file_of_any_kind_is_read_within_the_cap_and_the_timeout(
    kind: str, timeout: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Devices stop at 64 MiB, a FIFO with no writer at --timeout: one line, exit 2, no hang."""
    path = tmp_path / "fifo"
    if kind == "fifo":
        os.mkfifo(path)
    source = str(path) if kind == "fifo" else str(tmp_path) if kind == "directory" else kind
    started = time.monotonic()
    assert main(["check", source, "--timeout", timeout]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - started < float(timeout) + 2
    assert err.count("\n") == 1, err
    assert message in err


def test_a_live_server_is_read_with_its_models_and_version(
    static_vllm: FakeVllm, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against a URL, check reads /metrics, /v1/models and /version."""
    result = run_json(capsys, static_vllm.url)
    assert result["model"] == "tiny"
    assert result["vllm_version"] == "0.32.0"
    assert result["max_model_len"] == 512


def test_an_unreachable_url_is_one_line_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """Nobody listening: one line naming the reason, exit 2."""
    assert main(["check", "http://127.0.0.1:9"]) == 2
    assert "connection_refused" in capsys.readouterr().err


def _documented_keys(section: str) -> set[str]:
    """The keys of one table of docs/cli.md, by the line that precedes the table."""
    lines = (paths.DOCS / "cli.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(section))
    keys: set[str] = set()
    for line in lines[start + 1 :]:
        if keys and not line.startswith("|"):
            break
        if line.startswith("| `"):
            keys.add(line.split("`")[1])
    return keys


def test_the_json_keys_are_the_documented_ones(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/cli.md lists exactly the keys check --json prints, at every level."""
    result = run_json(
        capsys, str(CAPTURES / "vllm-0.32.0-cpu-after-load.prom"), "--model", str(TINY)
    )
    engines = result["engines"]
    prediction = result["prediction"]
    assert isinstance(engines, list)
    assert isinstance(prediction, dict)
    assert set(result) == _documented_keys("One object;")
    assert set(engines[0]) == _documented_keys("Per engine")
    assert set(prediction) == _documented_keys("The prediction")


# --- partial captures and the scheduler's limit ----------------------------------------------


def _histograms_only(tmp_path: Path) -> Path:
    """The real 0.32 capture cut down to its token histograms (what some people save)."""
    text = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text()
    kept = [
        line
        for line in text.splitlines()
        if "request_prompt_tokens" in line or "request_generation_tokens" in line
    ]
    path = tmp_path / "partial.prom"
    path.write_text("\n".join(kept) + "\n")
    return path


def test_a_partial_capture_reports_what_it_can_and_names_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Histograms without cache_config_info: the context figures, and a line per missing family."""
    path = _histograms_only(tmp_path)
    assert main(["check", str(path)]) == 0
    text = capsys.readouterr().out
    assert "no vllm: series" not in text
    assert "context since start    p50" in text
    assert "missing: vllm:cache_config_info (needed for KV capacity" in text
    result = run_json(capsys, str(path))
    missing = {m["family"] for m in result["missing_families"]}
    assert "vllm:cache_config_info" in missing
    assert "vllm:request_prompt_tokens" not in missing
    engines = result["engines"]
    assert isinstance(engines, list)
    assert engines[0]["context_tokens"] is not None


def _written(tmp_path: Path, text: str) -> str:
    path = tmp_path / "capture.prom"
    path.write_text(text)
    return str(path)


def test_without_token_histograms_the_context_line_says_so_not_that_nothing_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Requests finished but no prompt/output histograms saved (aibrix's docs paste this)."""
    capture = _written(
        tmp_path,
        'vllm:num_requests_running{model_name="m"} 0.0\n'
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 4.0\n',
    )
    assert main(["check", capture]) == 0
    text = capsys.readouterr().out
    assert "4 requests finished" in text
    assert "no finished requests yet" not in text
    assert "context since start    n/a: no prompt and no output token histogram" in text


def test_with_empty_token_histograms_nothing_has_finished_yet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The idle capture: both histograms there, with no observation."""
    assert main(["check", str(CAPTURES / "vllm-0.32.0-cpu-idle.prom")]) == 0
    assert "context since start    no finished requests yet" in capsys.readouterr().out


def test_values_the_parser_dropped_are_counted_by_reason_not_hidden(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative KV usage (vllm-ascend reported one): n/a, and a line that says why."""
    capture = _written(
        tmp_path,
        'vllm:num_requests_running{engine="3",model_name="m"} 0.0\n'
        'vllm:kv_cache_usage_perc{engine="3",model_name="m"} -0.3875\n',
    )
    assert main(["check", capture]) == 0
    text = capsys.readouterr().out
    assert "in use                 n/a (n/a)" in text
    assert "dropped: 1 sample of the payload (1 out_of_range); what it feeds is n/a" in text
    assert run_json(capsys, capture)["dropped_samples"] == {"out_of_range": 1}
    clean = run_json(capsys, str(CAPTURES / "vllm-0.32.0-cpu-after-load.prom"))
    assert clean["dropped_samples"] == {}


def test_a_missing_family_is_named_with_its_older_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A V0 payload without its usage gauge: the name it would have had is named too."""
    capture = _written(tmp_path, 'vllm:num_requests_waiting{model_name="m"} 0.0\n')
    assert main(["check", capture]) == 0
    text = capsys.readouterr().out
    assert "missing: vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc (needed for" in text
    assert "(its metrics do not tell the version)" in text
    missing = run_json(capsys, capture)["missing_families"]
    usage = next(m for m in missing if m["family"] == "vllm:kv_cache_usage_perc")
    assert usage["names"] == ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]


def test_an_assumed_max_num_seqs_is_marked_as_vllms_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Read from nowhere, the limit is said to be assumed; given, it is not."""
    capture = str(CAPTURES / "vllm-0.32.0-cpu-after-load.prom")
    assert main(["check", capture]) == 0
    assert "max_num_seqs 128 assumed: vLLM's default)" in capsys.readouterr().out
    assert main(["check", capture, "--max-num-seqs", "64"]) == 0
    text = capsys.readouterr().out
    assert "max_num_seqs 64)" in text
    assert "assumed" not in text


PASTED = paths.FIXTURES / "vllm-pasted"


@pytest.mark.parametrize(
    ("name", "lines"),
    [
        (
            "v0.7_V0_aibrix-runtime-docs.prom",
            [
                "KV capacity            1,308,272 tokens (81,767 blocks of 16",
                "preemptions            0 since start, 4 requests finished",
                "context since start    n/a: no prompt and no output token histogram",
            ],
        ),
        (
            "v0.20_V1_vllm-ascend-issue10048_negative-usage.prom",
            [
                "engine 3 (DeepSeek-V4-Flash)",
                "in use                 n/a (n/a)",
                "dropped: 1 sample of the payload (1 out_of_range)",
            ],
        ),
        (
            "llm-d-inference-sim_kthena-issue1129.prom",
            [
                "requests               0 running (0 sequences",
                "dropped: 1 sample of the payload (1 unexpected_series)",
            ],
        ),
        (
            "v0.8_V1_production-stack-issue318_cut.prom",
            [
                "requests               0 running (0 sequences",
                "in use                 n/a (0.0%)",
                "missing: vllm:cache_config_info (needed for KV capacity",
            ],
        ),
    ],
)
def test_real_pasted_payloads_are_reported_truly(
    name: str, lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Dumps people pasted in public (tests/fixtures/vllm-pasted, sources in each file)."""
    assert main(["check", str(PASTED / name)]) == 0
    text = capsys.readouterr().out
    for line in lines:
        assert line in text
    assert "no finished requests yet" not in text


def test_max_num_seqs_flag_caps_the_ceiling_and_names_the_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--max-num-seqs 1 on the real capture: the ceiling is 1, limited by max_num_seqs."""
    capture = str(CAPTURES / "vllm-0.32.0-cpu-after-load.prom")
    result = run_json(capsys, capture, "--max-num-seqs", "1")
    (engine,) = result["engines"]
    assert engine["max_num_seqs"] == {"setting": 1.0}
    assert engine["p95_ceiling_sequences"] <= 1
    default = run_json(capsys, capture)
    (engine,) = default["engines"]
    # The CPU backend's default for vLLM 0.33 rules (no --vllm-version): 128 x 1.
    assert engine["max_num_seqs"] == {"default": 128.0}
    assert engine["p95_ceiling_limited_by"] == "kv_cache"


def test_the_033_reconstruction_is_read_with_its_rejections_and_caps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """vLLM 0.33's exposition: 4 refusals counted; --max-num-queued-reqs 1 binds the ceiling."""
    capture = str(CAPTURES / "vllm-0.33.0-reconstructed.prom")
    result = run_json(capsys, capture)
    assert result["num_admission_rejections"] == 4
    assert result["num_admission_rejections_by_reason"] == {
        "max_num_queued_reqs": 4.0,
        "max_num_queued_tokens": 0.0,
    }
    assert result["missing_families"] == []
    (engine,) = result["engines"]
    assert engine["num_requests_waiting_by_reason"] == {"capacity": 0.0, "deferred": 0.0}
    assert engine["p95_ceiling_limited_by"] == "kv_cache"
    capped = run_json(capsys, capture, "--max-num-queued-reqs", "1")
    (engine,) = capped["engines"]
    assert (engine["p95_ceiling_sequences"], engine["p95_ceiling_limited_by"]) == (1, "queue_cap")
    assert main(["check", capture]) == 0
    refused = "4 requests refused at a queue cap since start, 4 at max_num_queued_reqs"
    assert f"{refused} (--max-num-queued-reqs): raise its flag" in capsys.readouterr().out


def test_a_refusal_reason_of_a_later_vllm_is_shown_without_a_guessed_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reason vLLM 0.33 does not write: its count, no flag, control characters escaped."""
    text = (CAPTURES / "vllm-0.33.0-reconstructed.prom").read_text()
    known = 'vllm:admission_rejections_total{model_name="tiny",reason="max_num_queued_tokens"} 0.0'
    assert known in text
    later = known.replace("max_num_queued_tokens", "tenant\x1b[2Jquota").replace(" 0.0", " 3.0")
    capture = tmp_path / "later.prom"
    capture.write_text(text.replace(known, f"{known}\n{later}"))
    assert main(["check", str(capture)]) == 0
    out = capsys.readouterr().out
    assert "4 at max_num_queued_reqs (--max-num-queued-reqs), 3 at tenant\\x1b[2Jquota:" in out
    assert "\x1b" not in out
    assert "--tenant" not in out


def _refused_flag(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run check with a bad flag: exit 2 and one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as exited:
        main(["check", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    return err


AFTER_LOAD = str(CAPTURES / "vllm-0.32.0-cpu-after-load.prom")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-model-len", "-5"),
        ("--max-model-len", "0"),
        ("--max-model-len", "1.5"),
        ("--max-model-len", "1e400"),
        ("--gpu-mem-gib", "nan"),
        ("--gpu-mem-gib", "inf"),
        ("--gpu-mem-gib", "-80"),
        ("--gpu-mem-gib", "0"),
        ("--gpu-mem-gib", "1e300"),
        ("--timeout", "nan"),
        ("--timeout", "inf"),
        ("--timeout", "-1"),
        ("--timeout", "0"),
        ("--timeout", "1e300"),
        ("--max-num-seqs", "0"),
        ("--max-num-seqs", "-3"),
        ("--max-num-queued-reqs", "-1"),
        ("--max-num-queued-tokens", "-1"),
        ("--max-num-queued-tokens", "1e3"),
        ("--max-num-queued-tokens", "0x10"),
        ("--max-model-len", "9007199254740993"),
        ("--max-model-len", "8192.0"),
        ("--max-model-len", ""),
        ("--timeout", "1e400"),
        ("--timeout", "-0"),
        ("--gpu-mem-gib", "1048577"),
        ("--tp", "-1"),
        ("--tp", "0"),
        ("--pp", "0"),
        ("--pp", "two"),
        ("--vllm-version", "banana"),
        ("--vllm-version", "latest"),
    ],
)
@pytest.mark.parametrize("source", ["file", "url"])
def test_a_bad_number_flag_is_one_line_naming_the_flag(
    flag: str, value: str, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every number check takes is checked as read: one line naming the flag, exit 2.

    Whether the source is a file or a URL: never the target blamed for the flag, never a figure.
    """
    target = AFTER_LOAD if source == "file" else "http://127.0.0.1:9"
    err = _refused_flag(capsys, target, "--model", str(TINY), "--gpu", "h100", flag, value)
    assert f"argument {flag}: " in err
    assert repr(value) in err
    assert "is vLLM running" not in err


def test_a_negative_queue_cap_says_how_to_have_none(capsys: pytest.CaptureFixture[str]) -> None:
    """--max-num-queued-reqs -1: the fix is a cap of 0 or more, or the flag left out."""
    err = _refused_flag(capsys, AFTER_LOAD, "--max-num-queued-reqs", "-1")
    assert err == (
        "vllm-headroom check: error: argument --max-num-queued-reqs: '-1' is not a whole number "
        "of requests from 0 to 2**53; give e.g. 1024, or leave it out for no cap "
        "(see vllm-headroom check --help)\n"
    )


def test_a_bad_timeout_is_the_documented_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The line docs/cli.md shows for ``--timeout nan``, word for word."""
    err = _refused_flag(capsys, AFTER_LOAD, "--timeout", "nan")
    assert err == (
        "vllm-headroom check: error: argument --timeout: 'nan' is not a finite number of seconds "
        "above 0 and at most 86,400; give e.g. 5 (see vllm-headroom check --help)\n"
    )
    assert err.removesuffix("\n") in (paths.DOCS / "cli.md").read_text()


def test_a_huge_number_is_one_short_line(capsys: pytest.CaptureFixture[str]) -> None:
    """5,000 digits (past int()'s own limit): one line quoting 40 of them, no traceback."""
    err = _refused_flag(capsys, AFTER_LOAD, "--max-model-len", "9" * 5000)
    assert f"{'9' * 40!r} (the first 40 of 5,000 characters) is not a whole number" in err
    assert "9" * 41 not in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-model-len", "512"),
        ("--max-model-len", " 1_024 "),
        ("--gpu-mem-gib", "80"),
        ("--gpu-mem-gib", "1048576"),
        ("--timeout", "0.5"),
        ("--timeout", "86400"),
        ("--tp", "1"),
        ("--max-num-queued-reqs", "0"),
    ],
)
def test_good_number_flags_are_taken(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same flags with sane values run as before."""
    assert main(["check", AFTER_LOAD, flag, value]) == 0
    capsys.readouterr()


def test_max_model_len_caps_the_context_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """--max-model-len is used (not read as a truth value): the context caps at it."""
    result = run_json(capsys, AFTER_LOAD, "--max-model-len", "300")
    assert result["max_model_len"] == 300
    assert result["engines"][0]["context_tokens"]["p95"] <= 300


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:99999", "the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:-1", "the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:80x", "the port must be a number from 1 to 65535"),
        ("http://:8000", "has no host"),
        ("http://", "has no host"),
        ("http://[::1", "cannot be read"),
        ("http://127.0.0.1:8000/?x=1", "must be a base URL"),
    ],
)
def test_a_bad_url_is_refused_up_front_in_one_line(
    url: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL no request can be sent to: one line naming the URL and what is wrong, exit 2."""
    assert main(["check", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vllm-headroom: error: URL {url!r}")
    assert problem in err
    assert err.count("\n") == 1


def test_without_gpu_memory_check_names_its_own_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --gpu and no exact KV budget: the fix is check's flags, not NVML or a setting."""
    text = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text()
    capture = _written(
        tmp_path, text.replace('kv_cache_memory_bytes="1048576"', 'kv_cache_memory_bytes="None"')
    )
    prediction = run_json(capsys, capture, "--model", str(TINY))["prediction"]
    assert prediction["state"] == "no_gpu_memory"
    assert "--gpu" in prediction["message"]
    assert "NVML" not in prediction["message"]
    assert "gpu_memory_bytes" not in prediction["message"]
    assert main(["check", capture, "--model", str(TINY)]) == 0
    assert "prediction: unavailable (no_gpu_memory) give --gpu" in capsys.readouterr().out


@pytest.mark.parametrize("total", ["1e200", "1e6", "0"])
def test_a_token_sum_its_buckets_contradict_is_dropped_not_shown(
    total: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """12 prompts in (100, 200] summing to 1e200, 1e6 or 0: dropped, counted, context n/a.

    Before: a NaN traceback (1e200), a mean of 83,713 tokens (1e6).
    """
    text = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text()
    line = 'vllm:request_prompt_tokens_sum{engine="0",model_name="tiny"} 1212.0'
    capture = _written(tmp_path, text.replace(line, line.replace("1212.0", total)))
    result = run_json(capsys, capture)
    assert result["engines"][0]["context_tokens"] is None
    assert result["dropped_samples"] == {"out_of_range": 12}
    assert main(["check", capture]) == 0
    out = capsys.readouterr().out
    assert "context since start    n/a: no prompt token histogram in the payload" in out
    assert "dropped: 12 samples of the payload (12 out_of_range)" in out


@pytest.mark.parametrize(
    ("label", "value", "shown"),
    [
        ("num_gpu_blocks", "-1", "(n/a of 128"),
        ("block_size", "0", "(8 blocks of n/a"),
        ("block_size", "-16", "(8 blocks of n/a"),
        ("kv_cache_size_tokens", "-1", "KV capacity            1,024 tokens"),
    ],
)
def test_an_impossible_cache_config_value_is_na_and_counted(
    label: str, value: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache_config_info value vLLM cannot write is n/a and on the dropped line.

    The figures built on it are never negative.
    """
    text = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text()
    capture = _written(tmp_path, re.sub(rf'\b{label}="[^"]*"', f'{label}="{value}"', text))
    assert main(["check", capture]) == 0
    out = capsys.readouterr().out
    assert shown in out
    assert "dropped: 1 sample of the payload (1 out_of_range)" in out
    engine = run_json(capsys, capture)["engines"][0]
    assert all(v is None or v >= 0 for v in engine.values() if isinstance(v, int | float))


def test_an_impossible_gpu_memory_utilization_never_blames_an_unused_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpu_memory_utilization="2": dropped, and the prediction's words name no flag not given."""
    text = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_text()
    text = text.replace('gpu_memory_utilization="0.92"', 'gpu_memory_utilization="2"')
    capture = _written(
        tmp_path, text.replace('kv_cache_memory_bytes="1048576"', 'kv_cache_memory_bytes="None"')
    )
    result = run_json(capsys, capture, "--model", str(TINY), "--gpu", "h100")
    assert result["dropped_samples"] == {"out_of_range": 1}
    assert "--block-size" not in result["prediction"]["message"]
    assert result["prediction"]["state"] == "ok"


def test_kv_capacity_tokens_is_vllms_and_the_pool_is_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """kv_capacity_tokens is vLLM's kv_cache_size_tokens; kv_pool_tokens blocks x block size."""
    result = run_json(capsys, str(CAPTURES / "vllm-0.32.0-cpu-after-load.prom"))
    (engine,) = result["engines"]
    assert engine["kv_capacity_tokens"] == 1024
    assert engine["kv_pool_tokens"] == 8 * 128
