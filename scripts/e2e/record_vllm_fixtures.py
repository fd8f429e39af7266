"""Record real vLLM CPU fixtures into tests/fixtures/vllm-cpu/ (described in its README.md).

Run from the project root with the project's venv, after ``make deps``::

    .venv/bin/python scripts/e2e/record_vllm_fixtures.py            # everything (~10 min)
    .venv/bin/python scripts/e2e/record_vllm_fixtures.py api burst  # some parts

Parts:

- ``api``: ``/v1/models`` and ``/version`` of the reference server, verbatim.
- ``architectures``: for each case of :data:`SURVEY` (tiny presets of make_tiny_model.py, all with
  the same ``--kv-cache-memory-bytes``): config.json, the exact vLLM arguments, the full
  ``vllm:cache_config_info`` label set and the start-up log lines about KV cache size and
  concurrency; or, when vLLM refuses to start, its exception lines.
- ``burst``: the raw ``/metrics`` payload every second from idle, through a load that preempts,
  back to idle, with ``index.json`` (timestamps and every request's prompt and output tokens).

Uses the e2e harness (tests/e2e/harness.py); every server it starts is stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "e2e"))

from harness import (  # noqa: E402 - the harness lives with the tests, not in a package
    REFERENCE_KV_CACHE_MEMORY_BYTES,
    REFERENCE_MAX_MODEL_LEN,
    REFERENCE_MODEL_NAME,
    VLLM_VERSION,
    BackgroundBurst,
    Completion,
    ServerStartError,
    VllmServer,
    cache_config_labels,
    error_lines,
    sample_value,
    tiny_model,
)

DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "vllm-cpu"

#: The architecture survey: one KV budget for every case. 4 MiB holds 4,096 tokens of the reference
#: Llama (32 blocks); max_model_len 1,024 is four times the presets' 256-token sliding windows.
SURVEY_KV_CACHE_MEMORY_BYTES = 4 * 1024 * 1024
SURVEY_MAX_MODEL_LEN = 1024


@dataclass(frozen=True)
class SurveyCase:
    """One vLLM start of the survey: a model preset and what differs from the survey defaults."""

    name: str
    arch: str
    max_model_len: int = SURVEY_MAX_MODEL_LEN
    extra_args: tuple[str, ...] = ()
    why: str = ""


#: A sliding window only bounds a request's blocks when window - 1 + in-flight tokens (the
#: scheduler's max_num_batched_tokens per concurrent batch) is below max_model_len, so the
#: windowed presets also run with a 128-token batch budget.
SMALL_BATCH = ("--max-num-batched-tokens", "128")
SURVEY = (
    SurveyCase("llama", "llama", why="reference shape: GQA, 1,024 B/token"),
    SurveyCase("llama-mha", "llama-mha", why="MHA: 4 KV heads, 2,048 B/token"),
    SurveyCase(
        "llama-mha-maxlen2048",
        "llama-mha",
        max_model_len=2048,
        why="2,048 tokens x 2,048 B = exactly the budget: does the null block count?",
    ),
    SurveyCase("mistral-swa", "mistral-swa", why="every layer a 256-token window"),
    SurveyCase(
        "mistral-swa-batch128",
        "mistral-swa",
        extra_args=SMALL_BATCH,
        why="the same with max_num_batched_tokens 128",
    ),
    SurveyCase("gemma2", "gemma2", why="alternating 256-token window / global layers"),
    SurveyCase(
        "gemma2-batch128",
        "gemma2",
        extra_args=SMALL_BATCH,
        why="the same with max_num_batched_tokens 128",
    ),
    SurveyCase("qwen2", "qwen2", why="Qwen2 (QKV bias), same KV shape as the reference"),
    SurveyCase("deepseek-v2", "deepseek-v2", why="MLA: latent 128 + rope 64 per layer"),
    SurveyCase("gpt-oss", "gpt-oss", why="alternating 128-token window / full layers, MoE"),
    SurveyCase(
        "gpt-oss-batch128",
        "gpt-oss",
        extra_args=SMALL_BATCH,
        why="the same with max_num_batched_tokens 128",
    ),
    SurveyCase("llama4", "llama4", why="three 256-token chunked local layers, one global"),
    SurveyCase(
        "llama4-batch128",
        "llama4",
        extra_args=SMALL_BATCH,
        why="the same with max_num_batched_tokens 128",
    ),
    SurveyCase(
        "qwen3-next",
        "qwen3-next",
        why="gated delta net: 67 KiB state (fp32 SSM on AVX512-BF16 CPUs) > a 128-token page",
    ),
    SurveyCase(
        "qwen3-next-ssm-bf16",
        "qwen3-next",
        extra_args=("--mamba-ssm-cache-dtype", "bfloat16"),
        why="the same with a bf16 SSM state (kept by the CPU's accelerated GDN backend)",
    ),
    SurveyCase("granite-4.0-h", "granite-4.0-h", why="Mamba2 + attention: 132 KiB state"),
    SurveyCase("falcon-h1", "falcon-h1", why="attention and Mamba2 in every layer"),
    SurveyCase("lfm2", "lfm2", why="short conv: a 1 KiB state padded to the attention page"),
    SurveyCase("nemotron-h", "nemotron-h", why="Mamba2 + attention, fp32 SSM from config.json"),
    SurveyCase(
        "gemma3n",
        "gemma3n",
        why="KV sharing: the last 5 of 10 layers read earlier layers' KV (window 64)",
    ),
    SurveyCase(
        "nemotron-nas",
        "nemotron-nas",
        # The checkpoints' config class is remote code (here a local stand-in beside config.json).
        extra_args=("--trust-remote-code",),
        why="DeciLM blocks: 3 of 8 no-op attention, 4 KV heads from n_heads_in_group",
    ),
    SurveyCase(
        "gemma4",
        "gemma4",
        why="per-layer head_dim: full pages twice the sliding ones (raised blocks), KV sharing",
    ),
    SurveyCase(
        "gemma4-padded",
        "gemma4-padded",
        why="per-layer head_dim 48 / 32: pages that do not divide, padded; KV sharing",
    ),
)

#: Hybrids: the labels that say how vLLM keeps their state (the API server's copy, see
#: docs/sizing.md: mamba_block_size is the front end's, not the worker's aligned one).
_HYBRID_LABELS = (
    "mamba_cache_mode",
    "mamba_cache_dtype",
    "mamba_ssm_cache_dtype",
    "mamba_block_size",
)
_HYBRID_MODEL_TYPES = {"qwen3_next", "granitemoehybrid", "falcon_h1", "lfm2", "nemotron_h"}
#: Start-up log lines worth keeping: what vLLM says about the KV pool and its groups.
_KV_LOG_LINE = re.compile(
    r"KV cache size|Maximum concurrency|KV cache (memory|spec|groups?)|num_gpu_blocks|"
    r"sliding window|for KV cache|hybrid|attention block size|Padding mamba|Mamba cache mode|"
    r"SSM cache type|SSM state storage",
    re.IGNORECASE,
)
#: The burst: two shapes at once so the context distribution has two modes. 6 clients of 480
#: tokens (128 + 352) overflow the 7 usable blocks and preempt; 2 clients of 128 (32 + 96) add
#: short requests. Different seeds keep their prompts from sharing prefix-cache blocks.
BURST_SHAPES = (
    {"concurrency": 6, "prompt_tokens": 128, "output_tokens": 352, "seed": 1},
    {"concurrency": 2, "prompt_tokens": 32, "output_tokens": 96, "seed": 2},
)
BURST_SECONDS = 20.0
SAMPLE_INTERVAL_S = 1.0
IDLE_SAMPLES = 3


def say(message: str) -> None:
    """One progress line on stderr."""
    print(f"[record {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def reference_server(logs: Path) -> VllmServer:
    """The reference setup: tiny Llama, 1 MiB KV pool, max_model_len 512, served as ``tiny``."""
    (logs / "vllm-reference.log").unlink(missing_ok=True)
    return VllmServer(
        tiny_model("llama"),
        kv_cache_memory_bytes=REFERENCE_KV_CACHE_MEMORY_BYTES,
        max_model_len=REFERENCE_MAX_MODEL_LEN,
        log_path=logs / "vllm-reference.log",
    )


def record_api(server: VllmServer, out: Path) -> None:
    """Write ``/v1/models`` and ``/version`` exactly as the server sent them."""
    import httpx  # noqa: PLC0415 - keep the module's import light for --help

    out.mkdir(parents=True, exist_ok=True)
    for path, name in (("/v1/models", "v1-models.json"), ("/version", "version.json")):
        response = httpx.get(f"{server.base_url}{path}", timeout=10.0)
        response.raise_for_status()
        (out / name).write_bytes(response.content)
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", *server.args]
    (out / "api-vllm-args.json").write_text(json.dumps(argv, indent=2) + "\n")
    say(f"api: wrote v1-models.json, version.json into {out}")


def record_case(case: SurveyCase, out: Path, logs: Path) -> dict[str, Any]:
    """Start vLLM for one survey case and record what it says about its KV pool (or its error)."""
    case_dir = out / case.name
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir(parents=True)
    model_dir = tiny_model(case.arch)
    shutil.copyfile(model_dir / "config.json", case_dir / "config.json")
    log_path = logs / f"vllm-{case.name}.log"
    log_path.unlink(missing_ok=True)  # the server appends; keep only this start in the log
    server = VllmServer(
        model_dir,
        kv_cache_memory_bytes=SURVEY_KV_CACHE_MEMORY_BYTES,
        max_model_len=case.max_model_len,
        extra_args=case.extra_args,
        log_path=log_path,
    )
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", *server.args]
    (case_dir / "vllm-args.json").write_text(json.dumps(argv, indent=2) + "\n")
    summary: dict[str, Any] = {
        "case": case.name,
        "arch": case.arch,
        "model_type": _model_type(model_dir),
        "why": case.why,
        "max_model_len": case.max_model_len,
        "extra_args": list(case.extra_args),
    }
    try:
        with server:
            [labels] = cache_config_labels(server.metrics_text())
    except ServerStartError:
        errors = error_lines(server.log_text())
        (case_dir / "error.txt").write_text("\n".join(errors) + "\n")
        summary["started"] = False
        summary["error"] = errors[0] if errors else "(no exception line in the log)"
        say(f"survey: {case.name} did not start: {summary['error'][:300]}")
        return summary
    (case_dir / "cache_config_info.json").write_text(
        json.dumps(labels, indent=2, sort_keys=True) + "\n"
    )
    kv_lines = [line for line in server.log_text().splitlines() if _KV_LOG_LINE.search(line)]
    (case_dir / "startup-log.txt").write_text("\n".join(kv_lines) + "\n")
    summary["started"] = True
    summary["startup_seconds"] = round(server.startup_seconds or 0.0, 1)
    summary["cache_config_info"] = {
        key: labels.get(key)
        for key in (
            "num_gpu_blocks",
            "block_size",
            "kv_cache_size_tokens",
            "kv_cache_max_concurrency",
            "sliding_window",
            *(_HYBRID_LABELS if summary["model_type"] in _HYBRID_MODEL_TYPES else ()),
        )
    }
    say(f"survey: {case.name}: {summary['cache_config_info']}")
    return summary


def _model_type(model_dir: Path) -> str:
    model_type: str = json.loads((model_dir / "config.json").read_text())["model_type"]
    return model_type


def record_architectures(out: Path, logs: Path, only: set[str] | None = None) -> None:
    """Run the survey (or the ``only`` cases) and rewrite ``architectures/summary.json``."""
    survey = out / "architectures"
    summary_path = survey / "summary.json"
    previous = json.loads(summary_path.read_text())["cases"] if summary_path.exists() else []
    kept = {entry["case"]: entry for entry in previous}
    for case in SURVEY:
        if only is None or case.name in only:
            kept[case.name] = record_case(case, survey, logs)
    summary_path.write_text(
        json.dumps(
            {
                "vllm_version": VLLM_VERSION,
                "kv_cache_memory_bytes": SURVEY_KV_CACHE_MEMORY_BYTES,
                "cases": [kept[case.name] for case in SURVEY if case.name in kept],
            },
            indent=2,
        )
        + "\n"
    )


def _completion_record(done: Completion, shape: int) -> dict[str, Any]:
    return {
        "shape": shape,
        "index": done.index,
        "prompt_tokens": done.prompt_tokens,
        "output_tokens": done.output_tokens,
        "started_monotonic_s": round(done.started_monotonic, 4),
        "finished_monotonic_s": round(done.finished_monotonic, 4),
    }


def record_burst(server: VllmServer, out: Path) -> None:
    """Sample ``/metrics`` every second from idle, through a preempting burst, back to idle."""
    burst_dir = out / "burst"
    shutil.rmtree(burst_dir, ignore_errors=True)
    burst_dir.mkdir(parents=True)
    samples: list[dict[str, Any]] = []
    next_due = time.monotonic()

    def take(phase: str) -> str:
        # Samples are due every SAMPLE_INTERVAL_S; a slot missed by a slow read is skipped, not
        # caught up with a rush of back-to-back reads.
        nonlocal next_due
        time.sleep(max(0.0, next_due - time.monotonic()))
        monotonic, wall = time.monotonic(), time.time()
        text = server.metrics_text()
        fetch_s = time.monotonic() - monotonic
        name = f"{len(samples):03d}.prom"
        (burst_dir / name).write_text(text)
        samples.append(
            {
                "file": name,
                "monotonic_s": round(monotonic, 4),
                "wall_time_s": round(wall, 4),
                "fetch_s": round(fetch_s, 4),
                "phase": phase,
            }
        )
        while next_due <= time.monotonic():
            next_due += SAMPLE_INTERVAL_S
        return text

    def idle(text: str) -> bool:
        running = sample_value(text, "vllm:num_requests_running")
        waiting = sample_value(text, "vllm:num_requests_waiting")
        return running == 0.0 and waiting == 0.0

    for _ in range(IDLE_SAMPLES):
        take("idle-before")
    load_started = time.monotonic()
    with contextlib.ExitStack() as stack:
        loads = [
            stack.enter_context(
                BackgroundBurst(
                    server.base_url, REFERENCE_MODEL_NAME, duration_s=BURST_SECONDS, **shape
                )
            )
            for shape in BURST_SHAPES
        ]
        while not all(load.done() for load in loads):
            take("load")
        results = [load.result() for load in loads]
    load_ended = time.monotonic()
    text = take("drain")
    while not idle(text):
        text = take("drain")
    for _ in range(IDLE_SAMPLES):
        take("idle-after")

    requests = [
        _completion_record(done, shape)
        for shape, completions in enumerate(results)
        for done in completions
    ]
    index = {
        "vllm_version": VLLM_VERSION,
        "vllm_args": ["python", "-m", "vllm.entrypoints.openai.api_server", *server.args],
        "model": "tiny Llama of scripts/e2e/make_tiny_model.py --arch llama (1,024 KV B/token)",
        "sample_interval_s": SAMPLE_INTERVAL_S,
        "samples": samples,
        "load": {
            "driver": "tests/e2e/harness.py BackgroundBurst (ignore_eos, prompts as token ids)",
            "shapes": [dict(shape) for shape in BURST_SHAPES],
            "duration_s": BURST_SECONDS,
            "started_monotonic_s": round(load_started, 4),
            "ended_monotonic_s": round(load_ended, 4),
            "requests": requests,
        },
    }
    (burst_dir / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    size = sum(path.stat().st_size for path in burst_dir.iterdir())
    first = sample_value((burst_dir / samples[0]["file"]).read_text(), "vllm:num_preemptions_total")
    last = sample_value(text, "vllm:num_preemptions_total")
    say(
        f"burst: {len(samples)} samples, {len(requests)} requests, "
        f"preemptions {first} -> {last}, {size / 1e6:.2f} MB in {burst_dir}"
    )


def main(argv: list[str] | None = None) -> int:
    """Record the parts asked for (all by default)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", choices=["api", "architectures", "burst"], default=None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--case",
        dest="cases",
        action="append",
        choices=[case.name for case in SURVEY],
        help="with architectures: only these survey cases (repeatable)",
    )
    parser.add_argument("--logs", type=Path, default=Path("/tmp/vllm-headroom-record-logs"))  # noqa: S108
    args = parser.parse_args(argv)
    parts = set(args.parts or ["api", "architectures", "burst"])
    args.logs.mkdir(parents=True, exist_ok=True)
    say(f"recording {sorted(parts)} into {args.out} (server logs in {args.logs})")
    if parts & {"api", "burst"}:
        with reference_server(args.logs) as server:
            say(f"reference vLLM ready on {server.base_url} in {server.startup_seconds:.1f}s")
            if "api" in parts:
                record_api(server, args.out)
            if "burst" in parts:
                record_burst(server, args.out)
    if "architectures" in parts:
        record_architectures(args.out, args.logs, set(args.cases) if args.cases else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
