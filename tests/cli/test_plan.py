"""Specification of `vllm-headroom plan` (exporter.cli.plan) through the real CLI entry point."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from exporter.cli.main import build_parser, main
from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

CONFIGS = paths.CONFIGS
WORKED = [
    "plan",
    "--model",
    "llama-3.1-8b",
    "--gpu-mem-gb",
    "80",
    "--gpu-util",
    "0.9",
    "--weights-gb",
    "16",
    "--overhead-gb",
    "4",
    "--dtype",
    "float16",
    "--max-model-len",
    "8192",
]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """Run the CLI with --json and return the parsed object."""
    assert main([*argv, "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_worked_example_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """The DESIGN worked example comes out of the CLI: 128 KiB/token, 52 GB, 198 and 49."""
    out = run_json(capsys, *WORKED)
    assert out["bytes_per_token"] == 131_072
    assert out["kv_budget_bytes"] == 52 * 10**9
    assert [s["sequences"] for s in out["sequences"]] == [198, 49]
    fp8 = next(row for row in out["what_if"] if row["change"] == "FP8 KV cache")
    assert fp8["sequences"] == {"2000": 396, "8000": 99}


def test_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object with at least the keys the issue requires."""
    out = run_json(capsys, "plan", "--model", "qwen2.5-7b", "--gpu", "L40S")
    for key in (
        "bytes_per_token",
        "weights_bytes",
        "overhead_bytes",
        "kv_budget_bytes",
        "kv_blocks",
        "kv_capacity_tokens",
        "sequences",
    ):
        assert key in out


def test_human_output_shows_the_chain(capsys: pytest.CaptureFixture[str]) -> None:
    """The human report names each step with its unit, and the what-if table."""
    assert main([*WORKED]) == 0
    text = capsys.readouterr().out
    for needle in ("GiB per GPU", "KV budget", "bytes", "blocks", "tokens", "what if", "TP 2"):
        assert needle in text


def test_explicit_shape_and_model_directory(capsys: pytest.CaptureFixture[str]) -> None:
    """The shape can come from flags or from a model directory, with the same per-token cost."""
    flags = run_json(
        capsys,
        "plan",
        "--layers",
        "32",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--params-b",
        "8",
        "--gpu",
        "H100",
        "--max-model-len",
        "8192",
    )
    directory = run_json(
        capsys,
        "plan",
        "--model",
        str(CONFIGS / "llama-3.1-8b-instruct"),
        "--params-b",
        "8",
        "--gpu",
        "H100",
    )
    assert flags["bytes_per_token"] == directory["bytes_per_token"] == 131_072


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--model", "lama-3.1-8b", "--gpu", "H100"], "did you mean llama-3.1-8b"),
        (["plan", "--model", "llama-3.1-8b", "--gpu", "H1OO"], "unknown GPU"),
        (["plan", "--model", "llama-3.3-70b", "--gpu", "L4"], "exceed"),
        (["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--kv-lora-rank", "512"], "MLA"),
        (["plan", "--layers", "32", "--gpu", "H100"], "missing --kv-heads"),
        (["plan", "--model", "llama-3.1-8b"], "--gpu"),
        (["plan", "--model", "qwen2.5-7b", "--gpu", "H100", "--tp", "3"], "does not divide"),
        (["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--tp", "64"], "32 attention heads"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Bad input prints one line naming the problem and exits with code 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("value", ["1.5", "0", "nan", "-0.5"])
def test_gpu_util_is_a_share_above_0_and_at_most_1(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--gpu-util is refused as it is read, as vLLM refuses it at start."""
    err = _refused(capsys, "--model", "llama-3.1-8b", "--gpu", "H100", f"--gpu-util={value}")
    assert f"argument --gpu-util: {value!r} is not a finite number above 0 and at most 1;" in err


def test_inverse_questions(capsys: pytest.CaptureFixture[str]) -> None:
    """--sequences answers the utilization and the smallest GPU needed for the first context."""
    out = run_json(
        capsys,
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "H100",
        "--context-tokens",
        "4000",
        "--sequences",
        "50",
    )
    needs = out["needs"]
    assert isinstance(needs, dict)
    assert 0 < needs["utilization"] <= 1
    assert needs["smallest_gpu"] is not None


# --- every limit of the scheduler, not only the KV pool ----------------------------------------

SMALL_CONTEXT = ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--kv-dtype", "fp8"]


def test_max_num_seqs_binds_and_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """An 8B model with FP8 KV on an H100 at 1.5k tokens: --max-num-seqs 256 binds, not the pool."""
    out = run_json(capsys, *SMALL_CONTEXT, "--context-tokens", "1500", "--max-num-seqs", "256")
    (row,) = out["sequences"]
    assert row["sequences"] == 256
    assert row["limited_by"] == "max_num_seqs"
    assert row["kv_sequences"] > 256
    assert out["max_num_seqs"] == 256
    assert out["max_num_seqs_source"] == "flag"


def test_the_text_report_says_which_limit_binds(capsys: pytest.CaptureFixture[str]) -> None:
    """The human output names the binding limit and what the pool would hold."""
    assert main([*SMALL_CONTEXT, "--context-tokens", "1500", "--max-num-seqs", "256"]) == 0
    text = capsys.readouterr().out
    assert "limited by max_num_seqs 256; the KV pool would hold" in text


def test_default_max_num_seqs_follows_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """Without the flag, vLLM's default for the version and GPU: 1,024 on an H100, 256 on A100."""
    h100 = run_json(capsys, *SMALL_CONTEXT)
    assert (h100["max_num_seqs"], h100["max_num_seqs_source"]) == (1024, "default")
    a100 = run_json(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "A100-80GB")
    assert a100["max_num_seqs"] == 256
    old = run_json(
        capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--vllm-version", "0.8.5"
    )
    assert old["max_num_seqs"] == 1024  # 0.8.5 judged by memory alone


def test_kv_pool_binds_at_long_contexts(capsys: pytest.CaptureFixture[str]) -> None:
    """At 8k tokens the same deployment is limited by the KV cache, and says so."""
    out = run_json(capsys, *SMALL_CONTEXT, "--context-tokens", "8000", "--max-num-seqs", "256")
    (row,) = out["sequences"]
    assert row["limited_by"] == "kv_cache"
    assert row["sequences"] == row["kv_sequences"] < 256


def test_what_ifs_show_when_a_change_moves_the_binding_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Raising --max-num-seqs past the pool hands the limit to the KV cache, and the row says so."""
    out = run_json(capsys, *SMALL_CONTEXT, "--context-tokens", "1500", "--max-num-seqs", "256")
    rows = {row["change"]: row for row in out["what_if"]}
    raised = [row for name, row in rows.items() if name.startswith("max-num-seqs")]
    assert raised, "a binding max_num_seqs gets what-ifs that raise it"
    assert any(row["moves_limit"] and row["limited_by"]["1500"] == "kv_cache" for row in raised)
    assert rows["utilization 0.87"]["moves_limit"] is False
    # A larger --max-num-seqs costs sampler warm-up memory: its KV budget is smaller.
    assert all(row["kv_budget_bytes"] < out["kv_budget_bytes"] for row in raised)


def test_what_ifs_never_offer_a_context_longer_than_the_model_allows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """At the model's own context length there is no "double" row: vLLM refuses a longer one."""
    longest = run_json(capsys, *WORKED[:-2])  # llama-3.1-8b at its 131,072 positions
    changes = [row["change"] for row in longest["what_if"]]
    assert "max-model-len 65,536 (half)" in changes
    assert not any(change.startswith("max-model-len 262,144") for change in changes)
    shorter = run_json(capsys, *WORKED)
    assert "max-model-len 16,384 (double)" in [row["change"] for row in shorter["what_if"]]


def test_needs_says_when_max_num_seqs_must_rise_too(capsys: pytest.CaptureFixture[str]) -> None:
    """Asking for more sequences than --max-num-seqs allows says the flag must rise too."""
    out = run_json(capsys, *SMALL_CONTEXT, "--max-num-seqs", "256", "--sequences", "400")
    assert out["needs"]["max_num_seqs_too_low"] is True
    within = run_json(capsys, *SMALL_CONTEXT, "--max-num-seqs", "256", "--sequences", "100")
    assert within["needs"]["max_num_seqs_too_low"] is False


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run plan with a flag its parser refuses: exit 2 and one line on stderr, returned."""
    with pytest.raises(SystemExit) as exited:
        main(["plan", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--max-num-batched-tokens"])
def test_scheduler_flags_must_be_positive(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """A zero limit is refused with one line naming the flag."""
    err = _refused(capsys, *SMALL_CONTEXT[1:], flag, "0")
    assert f"argument {flag}: '0' is not a whole number of " in err
    assert " from 1 to 2**53; give e.g. " in err


COUNT_FLAGS = [
    "--layers",
    "--kv-heads",
    "--head-dim",
    "--heads",
    "--hidden-size",
    "--vocab-size",
    "--kv-lora-rank",
    "--qk-rope-head-dim",
    "--tp",
    "--pp",
    "--block-size",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--context-tokens",
    "--sequences",
    "--max-loras",
    "--max-lora-rank",
    "--max-cpu-loras",
    "--mtp-layers",
    "--num-speculative-tokens",
]


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "1e3", "0x10", "nan", "9007199254740993"])
@pytest.mark.parametrize("flag", COUNT_FLAGS)
def test_every_count_flag_is_a_whole_number_from_1(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    """Each count is refused as it is read, before any model is looked up: one line, exit 2."""
    err = _refused(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", f"{flag}={value}")
    assert f"argument {flag}: {value!r} is not a whole number" in err
    assert " from 1 to 2**53; give e.g. " in err


@pytest.mark.parametrize("flag", ["--max-num-queued-reqs", "--kv-cache-memory-bytes"])
def test_the_counts_that_may_be_0_take_0_and_refuse_less(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """A queue cap of 0 (refuse every request past the running ones) and a KV budget of 0."""
    args = build_parser().parse_args(["plan", f"{flag}=0"])
    assert getattr(args, flag[2:].replace("-", "_")) == 0
    err = _refused(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", f"{flag}=-1")
    assert " from 0 to 2**53; give e.g. " in err


@pytest.mark.parametrize(
    ("flags", "fix"),
    [
        (("--kv-cache-memory-bytes=0",), "raise --kv-cache-memory-bytes"),
        (("--kv-cache-memory-bytes=8000",), "raise --kv-cache-memory-bytes"),
        (("--block-size=100000000",), "lower --block-size"),
    ],
)
def test_a_kv_budget_of_under_two_blocks_is_named_not_blamed_on_the_weights(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], fix: str
) -> None:
    """Where the weights and overhead fit but the KV budget holds under 2 blocks, plan says so.

    vLLM keeps one block as its null block and needs another to serve anything. The weights
    and overhead are not what failed: "0.00 GiB + overhead 0.00 GiB exceed 72.85 GiB" is false.
    """
    assert main(["plan", "--model", "tiny-llama-2l", "--gpu", "H100", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "exceed" not in err
    assert "vLLM needs at least 2 (one is its null block)" in err
    assert fix in err


def test_the_largest_count_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """2**53 itself is in range (the sizing may then refuse it, in its own words)."""
    args = build_parser().parse_args(["plan", "--layers", str(2**53), "--tp", "1_000"])
    assert (args.layers, args.tp) == (2**53, 1000)
    capsys.readouterr()


def test_kv_capacity_tokens_means_what_vllm_logs_on_hybrid_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Gemma 2 (sliding + full): kv_capacity_tokens is the log line's figure; the pool is apart."""
    out = run_json(
        capsys, "plan", "--model", "gemma-2-9b-it", "--gpu", "H100", "--max-model-len", "8192"
    )
    assert out["kv_capacity_tokens"] == out["kv_cache_size_tokens"]
    assert out["kv_pool_tokens"] == out["kv_blocks"] * out["block_size"]
    assert out["kv_capacity_tokens"] != out["kv_pool_tokens"]


# --- hybrid state-space models --------------------------------------------------------------------

GRANITE_H = paths.VLLM_CPU / "architectures" / "granite-4.0-h"
HYBRID = [
    "plan",
    "--model",
    str(GRANITE_H),
    "--kv-cache-memory-bytes",
    str(4 * 2**20),
    "--max-model-len",
    "1024",
]


def test_plan_sizes_a_hybrid_from_its_model_directory(capsys: pytest.CaptureFixture[str]) -> None:
    """The tiny Granite-4.0-H on a GPU: its 69,376-byte Mamba2 state raises the block to 144.

    conv 3 x (512 + 2 x 64) x 2 B + SSM 8 x 64 x 64 x 2 B = 69,376 B; one attention token is
    2 x 2 x 64 x 2 = 512 B: block = 16 x cdiv(69,376, 16 x 512) = 144.
    """
    out = run_json(capsys, *HYBRID)
    assert out["state"] == {
        "bytes_per_layer": 69_376,
        "dtypes": ["bfloat16", "bfloat16"],
        "requested_block_size": 16,
        "mamba_cache_mode": "align",
    }
    assert out["block_size"] == 144
    assert [g["kind"] for g in out["kv_cache_groups"]] == ["full", "state"]


def test_plan_passes_the_mamba_dtype_and_prefix_caching_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--mamba-ssm-cache-dtype float32 doubles the SSM state; no prefix caching: mode none."""
    out = run_json(
        capsys, *HYBRID, "--mamba-ssm-cache-dtype", "float32", "--no-enable-prefix-caching"
    )
    assert out["state"]["bytes_per_layer"] == 3 * 640 * 2 + 8 * 64 * 64 * 4
    assert out["state"]["mamba_cache_mode"] == "none"
    assert out["block_size"] == 16 * 17


def test_plan_text_names_the_state(capsys: pytest.CaptureFixture[str]) -> None:
    """The text report says the state's size, dtypes and why the block grew."""
    assert main(HYBRID) == 0
    text = capsys.readouterr().out
    assert (
        "state per layer            69,376 bytes (bfloat16/bfloat16, block raised from 16" in text
    )


def test_lora_flags_take_their_buffers_from_the_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--enable-lora: the ``lora_bytes`` key, taken from the budget (4 x rank 64: 16 x default).

    --max-cpu-loras is host memory: it is reported, never subtracted.
    """
    plain = run_json(capsys, *WORKED)
    lora = run_json(
        capsys,
        *WORKED,
        "--enable-lora",
        "--max-loras",
        "4",
        "--max-lora-rank",
        "64",
        "--max-cpu-loras",
        "8",
    )
    assert plain["lora_bytes"] == 0
    assert plain["lora"] is None
    assert lora["lora_bytes"] == 16 * 92_356_608
    assert lora["lora"] == {
        "max_loras": 4,
        "max_lora_rank": 64,
        "max_cpu_loras": 8,
        "lora_dtype": "auto",
    }
    assert plain["kv_budget_bytes"] - lora["kv_budget_bytes"] == lora["lora_bytes"]


def test_lora_line_in_the_human_report(capsys: pytest.CaptureFixture[str]) -> None:
    """The report shows the LoRA buffers as their own line of the chain."""
    assert main([*WORKED, "--enable-lora"]) == 0
    text = capsys.readouterr().out
    assert "- LoRA buffers             0.09 GiB  (1 slot(s) at rank 16" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-loras", "2"], "--max-loras without --enable-lora"),
        (["--enable-lora", "--max-lora-rank", "12"], "not one of vLLM's"),
        (["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], "must be >= --max-loras"),
        (["--enable-lora", "--lora-dtype", "float32"], "--lora-dtype 'float32' is not"),
    ],
)
def test_bad_lora_flags_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """Each LoRA flag vLLM would refuse is refused in one line naming it."""
    assert main([*WORKED, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_speculative_flags_add_the_drafter(capsys: pytest.CaptureFixture[str]) -> None:
    """A draft model: its KV per token joins the target's; the ``speculative`` key says how."""
    base = ["plan", "--model", "qwen3-32b", "--gpu", "H100", "--max-model-len", "8192"]
    plain = run_json(capsys, *base)
    spec = run_json(
        capsys,
        *base,
        "--speculative-draft-model",
        "qwen3-0.6b",
        "--num-speculative-tokens",
        "4",
    )
    assert plain["speculative"] is None
    assert spec["speculative"]["method"] == "draft"
    assert spec["speculative"]["draft_layers"] == 28
    assert spec["speculative"]["draft_bytes_per_token"] == 114_688
    assert spec["speculative"]["lookahead_tokens"] == 4
    assert spec["bytes_per_token"] == plain["bytes_per_token"] + 114_688
    assert spec["kv_budget_bytes"] < plain["kv_budget_bytes"]


def test_mtp_layers_default_their_speculative_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    """--mtp-layers N drafts N tokens unless --num-speculative-tokens says otherwise."""
    out = run_json(
        capsys, "plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--mtp-layers", "1"
    )
    assert out["speculative"]["method"] == "mtp"
    assert out["speculative"]["num_speculative_tokens"] == 1
    assert out["bytes_per_token"] == 62 * 576 * 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-speculative-tokens", "3"], "without a drafter"),
        (["--speculative-draft-model", "qwen3-0.6b"], "needs --num-speculative-tokens"),
        (["--speculative-draft-model", "qwen-0.6", "--num-speculative-tokens", "2"], "unknown"),
    ],
)
def test_bad_speculative_flags_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """Each speculative-decoding flag vLLM would refuse is refused in one line naming it."""
    assert main(["plan", "--model", "qwen3-8b", "--gpu", "H100", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_queue_cap_under_max_num_seqs_is_the_ceiling_and_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--max-num-queued-reqs 8 under --max-num-seqs 256: 8 sequences, limited by queue_cap."""
    out = run_json(
        capsys, "plan", "--model", "qwen2.5-7b", "--gpu", "L40S", "--max-num-queued-reqs", "8"
    )
    assert out["max_num_queued_reqs"] == 8
    for row in out["sequences"]:
        assert row["sequences"] == min(8, row["kv_sequences"])
        if row["kv_sequences"] >= 8:
            assert row["limited_by"] == "queue_cap"
    plain = run_json(capsys, "plan", "--model", "qwen2.5-7b", "--gpu", "L40S")
    assert plain["max_num_queued_reqs"] is None
    assert all(row["limited_by"] != "queue_cap" for row in plain["sequences"])


def test_a_negative_queue_cap_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """--max-num-queued-reqs -1: one line naming the flag and both ways out, exit 2."""
    err = _refused(capsys, "--model", "qwen2.5-7b", "--gpu", "L40S", "--max-num-queued-reqs", "-1")
    assert err == (
        "vllm-headroom plan: error: argument --max-num-queued-reqs: '-1' is not a whole number of "
        "requests from 0 to 2**53; give e.g. 1024, or leave it out for no cap "
        "(see vllm-headroom plan --help)\n"
    )


def test_a_zero_layer_count_is_the_documented_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The line docs/cli.md shows for ``plan --layers 0``, word for word."""
    err = _refused(capsys, "--layers", "0")
    assert err == (
        "vllm-headroom plan: error: argument --layers: '0' is not a whole number of layers from 1 "
        "to 2**53; give e.g. 32 (see vllm-headroom plan --help)\n"
    )
    assert err.removesuffix("\n") in (paths.DOCS / "cli.md").read_text()


def test_plan_sizes_a_nemotron_h_catalogue_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --model nemotron-nano-9b-v2`: 4 attention layers, 27 Mamba2 layers in 7 groups.

    State 3 x (128 x 80 + 2 x 8 x 128) x 2 B + 128 x 80 x 128 x 4 B (float32 SSM) = 5,316,608 B;
    one attention token 2 x 8 x 128 x 2 = 4,096 B per layer: block 16 x cdiv(5,316,608, 65,536)
    = 1,312. Its context is the cited 131,072 positions.
    """
    out = run_json(capsys, "plan", "--model", "nemotron-nano-9b-v2", "--gpu", "H100")
    assert out["bytes_per_token"] == 4 * 4_096
    assert out["state"]["bytes_per_layer"] == 5_316_608
    assert out["state"]["dtypes"] == ["bfloat16", "float32"]
    assert out["block_size"] == 1_312
    assert [g["kind"] for g in out["kv_cache_groups"]] == ["full"] + ["state"] * 7
    assert out["max_model_len"] == 131_072
    assert out["kv_capacity_tokens"] == out["kv_cache_size_tokens"]


def test_plan_sizes_a_falcon_h1_catalogue_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --model falcon-h1-7b`: every layer attends and keeps a Mamba2 state (two groups).

    State 3 x (3,072 + 2 x 256) x 2 B + 24 x 128 x 256 x 2 B = 1,594,368 B; one attention token
    2 x 2 x 128 x 2 = 1,024 B per layer: block 16 x cdiv(1,594,368, 16,384) = 1,568.
    """
    assert (
        main(["plan", "--model", "falcon-h1-7b", "--gpu", "H100", "--max-model-len", "32768"]) == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("falcon-h1-7b: GQA + 44 Mamba2 layers")
    assert "KV per token               45,056 bytes (44 layers x 2 KV heads/GPU" in text
    assert "state per layer            1,594,368 bytes (bfloat16/bfloat16" in text
    assert "block                      1568 tokens" in text


def test_plan_sizes_a_granite_4_0_h_catalogue_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --model granite-4.0-h-tiny`: 4 attention layers, 36 Mamba2 layers in 9 groups.

    State 3 x (2 x 1,536 + 2 x 1 x 128) x 2 B + 48 x 64 x 128 x 2 B (bfloat16 SSM) = 806,400 B;
    one attention token 2 x 4 x 128 x 2 = 2,048 B per layer: block 16 x cdiv(806,400, 32,768)
    = 400. Its context is the card's 128K, 131,072 positions.
    """
    out = run_json(capsys, "plan", "--model", "granite-4.0-h-tiny", "--gpu", "H100")
    assert out["bytes_per_token"] == 4 * 2_048
    assert out["state"]["bytes_per_layer"] == 806_400
    assert out["state"]["dtypes"] == ["bfloat16", "bfloat16"]
    assert out["block_size"] == 400
    assert [g["kind"] for g in out["kv_cache_groups"]] == ["full"] + ["state"] * 9
    assert out["max_model_len"] == 131_072


def test_plan_sizes_an_lfm2_catalogue_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --model lfm2-1.2b`: 6 attention layers, 10 short-conv layers in 2 groups.

    State (conv_L_cache 3 - 1) x 2,048 x 2 B = 8,192 B, no SSM state; one attention token
    2 x 8 x 64 x 2 = 2,048 B per layer: block 16 x cdiv(8,192, 32,768) = 16. Its context is the
    config's 128,000 positions.
    """
    out = run_json(capsys, "plan", "--model", "lfm2-1.2b", "--gpu", "L4")
    assert out["bytes_per_token"] == 6 * 2_048
    assert out["state"]["bytes_per_layer"] == 8_192
    assert out["block_size"] == 16
    assert [g["kind"] for g in out["kv_cache_groups"]] == ["full", "state", "state"]
    assert out["max_model_len"] == 128_000


def test_plan_sizes_a_jamba_catalogue_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --model jamba-v0.1 --tp 2`: 4 attention layers, 28 Mamba1 layers in 7 groups.

    At TP 2 each GPU keeps 8,192 / 2 = 4,096 Mamba channels: conv 3 x 4,096 x 2 B + SSM
    4,096 x 16 x 2 B = 155,648 B; one attention token 2 x 4 x 128 x 2 = 2,048 B per layer:
    block 16 x cdiv(155,648, 32,768) = 80. Its context is the config's 262,144 positions.
    """
    out = run_json(capsys, "plan", "--model", "jamba-v0.1", "--gpu", "H200", "--tp", "2")
    assert out["bytes_per_token"] == 4 * 2_048
    assert out["state"]["bytes_per_layer"] == 155_648
    assert out["state"]["dtypes"] == ["bfloat16", "bfloat16"]
    assert out["block_size"] == 80
    assert [g["kind"] for g in out["kv_cache_groups"]] == ["full"] + ["state"] * 7
    assert out["max_model_len"] == 262_144


@pytest.mark.parametrize("name", ["lfm2-8b-a1b", "jamba-mini-1.5", "jamba-large-1.7"])
def test_a_declined_hybrid_is_an_unknown_model_in_one_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hybrids left out of the catalogue (see docs/sizing.md) fail in one line, exit 2."""
    assert main(["plan", "--model", name, "--gpu", "H100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"unknown model {name!r}" in err
    assert "Traceback" not in err


def test_a_catalogue_entry_naming_its_class_sizes_lora_without_the_guess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """qwen2.5-7b carries Qwen2ForCausalLM, whose class has no embedding LoRA modules.

    Rank 16, bfloat16, per layer: qkv 3 x 16 x 3,584 + (3,584 + 512 + 512) x 16, o 16 x 3,584 +
    3,584 x 16, gate_up 2 x 16 x 3,584 + 2 x 18,944 x 16, down 16 x 18,944 + 3,584 x 16 =
    1,441,792 values; 28 layers x 2 B = 80,740,352 B, and no note that the class is unknown. An
    entry without ``architectures`` (qwen3-8b) still says it counted the embedding buffers.
    """
    named = run_json(capsys, "plan", "--model", "qwen2.5-7b", "--gpu", "H100", "--enable-lora")
    assert named["lora_bytes"] == 1_441_792 * 28 * 2
    assert not any("model class unknown" in line for line in named["assumptions"])
    unnamed = run_json(capsys, "plan", "--model", "qwen3-8b", "--gpu", "H100", "--enable-lora")
    assert any("model class unknown" in line for line in unnamed["assumptions"])


def _deepseek_v32_dir(tmp_path: Any, **changes: Any) -> str:
    """A model directory holding DeepSeek-V3's config.json with V3.2's class and indexer."""
    config = json.loads((CONFIGS / "deepseek-v3" / "config.json").read_text())
    config.update(
        architectures=["DeepseekV32ForCausalLM"],
        model_type="deepseek_v32",
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
        **changes,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_plan_sizes_deepseek_v32_sparse_mla(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeepSeek V3.2 on an H200, 10 GiB of KV, max-model-len 32,768, as vLLM 0.32 lays it out.

    Per token per layer: bf16 latent 576 x 2 = 1,152 B + indexer key 128 + 4 = 132 B; x 61
    layers = 78,324 B. Block 64 (the indexer's), 64 x 78,324 = 5,012,736 B; 10 GiB // that =
    2,142 blocks; one group, cdiv(32,768, 64) = 512 blocks a request: 2,142 x 64 = 137,088
    tokens. With --kv-cache-dtype fp8 Hopper's FLASHMLA_SPARSE stores fp8_ds_mla, 656 B:
    (656 + 132) x 61 = 48,068 B per token.
    """
    model = _deepseek_v32_dir(tmp_path)
    argv = ["plan", "--model", model, "--gpu", "H200", "--tp", "8"]
    argv += ["--kv-cache-memory-bytes", str(10 * 2**30), "--max-model-len", "32768"]
    out = run_json(capsys, *argv)
    assert out["attention_kind"] == "sparse MLA + indexer"
    assert out["bytes_per_token"] == 78_324
    assert out["block_size"] == 64
    assert out["kv_blocks"] == 2_142
    assert out["kv_capacity_tokens"] == 137_088
    assert out["sparse_mla"] == {
        "latent_bytes_per_layer": 1_152,
        "indexer_bytes_per_layer": 132,
        "cache_format": "bfloat16",
    }
    fp8 = next(row for row in out["what_if"] if row["change"] == "FP8 KV cache")
    assert fp8["bytes_per_token"] == 48_068
    assert main(argv) == 0
    assert "indexer key 132 bytes" in capsys.readouterr().out


def test_plan_declines_a_v4_style_config_in_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """compress_ratios (DeepSeek V4's compressed layers) stays declined, exit 2, one line."""
    model = _deepseek_v32_dir(tmp_path, compress_ratios=[0, 0, 4, 128])
    assert main(["plan", "--model", model, "--gpu", "H200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "compress_ratios" in err
    assert "Traceback" not in err


_NOT_AMOUNTS = ["nan", "inf", "-inf", "1e400", "-5", "x", "1e30"]


@pytest.mark.parametrize("value", [*_NOT_AMOUNTS, "0"])
@pytest.mark.parametrize(
    ("flag", "rest"),
    [
        ("--gpu-mem-gib", ["--model", "llama-3.1-8b"]),
        ("--gpu-mem-gb", ["--model", "llama-3.1-8b"]),
        ("--weights-gib", ["--model", "llama-3.1-8b", "--gpu", "h100"]),
        ("--weights-gb", ["--model", "llama-3.1-8b", "--gpu", "h100"]),
        ("--params-b", ["--model", "llama-3.1-8b", "--gpu", "h100"]),
        ("--params-b", ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--gpu", "h100"]),
    ],
)
def test_amount_flags_take_finite_positive_numbers(
    capsys: pytest.CaptureFixture[str], flag: str, rest: list[str], value: str
) -> None:
    """NaN, infinities, 1e400, negatives, 0 and absurd sizes: one line naming the flag, exit 2."""
    with pytest.raises(SystemExit) as caught:
        main(["plan", *rest, f"{flag}={value}"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {value!r} is not a finite number of " in err
    assert "above 0 and at most 1,073,741,824; give e.g. " in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("value", _NOT_AMOUNTS)
@pytest.mark.parametrize("flag", ["--overhead-gib", "--overhead-gb"])
def test_overhead_flags_take_finite_non_negative_numbers(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    """The overhead override may be 0, never NaN, infinite or negative."""
    with pytest.raises(SystemExit):
        main(["plan", "--model", "llama-3.1-8b", "--gpu", "h100", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert f"argument {flag}: {value!r} is not a finite number of " in err
    assert " from 0 to 1,073,741,824; give e.g. 4 " in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weights-gib", "0.5"], "smaller than the model's embeddings alone"),
        (["--params-b", "0.1"], "less than llama-3.1-8b's embeddings alone"),
        (["--max-model-len", "1000000"], "exceeds llama-3.1-8b's context length 131,072"),
        (["--max-num-seqs", str(2**53)], "lower --max-num-seqs"),
        (["--max-num-seqs", "10000000"], "lower --max-num-seqs"),
    ],
)
def test_impossible_plans_are_one_true_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Weights or params below the embeddings, a context past the model's, a huge max-num-seqs."""
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "h100", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert "raise --tp" not in err


def test_a_long_context_needs_the_opt_in(capsys: pytest.CaptureFixture[str]) -> None:
    """Past the model's length the plan says VLLM_ALLOW_LONG_MAX_MODEL_LEN; the flag sizes it."""
    argv = ["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "262144"]
    assert main(argv) == 2
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in capsys.readouterr().err
    out = run_json(capsys, *argv, "--allow-long-max-model-len")
    assert out["max_model_len"] == 262144


def test_a_git_lfs_pointer_checkout_is_refused_unless_weights_are_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Pointer files instead of weights: `git lfs pull` or --weights-gib, never 1.96 GiB."""
    (tmp_path / "config.json").write_text(
        (CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text()
    )
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 4976698672\n"
    (tmp_path / "model-00001-of-00004.safetensors").write_text(pointer)
    argv = ["plan", "--model", str(tmp_path), "--gpu", "h100"]
    assert main(argv) == 2
    assert "git lfs pull" in capsys.readouterr().err
    out = run_json(capsys, *argv, "--weights-gib", "15")
    assert out["weights_bytes"] == 15 * 2**30
