"""Specification of `vllm-headroom plan` (exporter.cli.plan) through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from exporter.cli.main import main
from tests import paths

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


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    """Run the CLI with --json and return the parsed object."""
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_worked_example_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """The DESIGN worked example comes out of the CLI: 128 KiB/token, 52 GB, 198 and 49."""
    out = run_json(capsys, *WORKED)
    assert out["bytes_per_token"] == 131_072
    assert out["kv_budget_bytes"] == 52 * 10**9
    assert [s["sequences"] for s in out["sequences"]] == [198, 49]  # type: ignore[index, union-attr]
    fp8 = next(row for row in out["what_if"] if row["change"] == "FP8 KV cache")  # type: ignore[union-attr]
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
        (["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--gpu-util", "1.5"], "(0, 1]"),
        (["plan", "--model", "llama-3.3-70b", "--gpu", "L4"], "exceed"),
        (["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--kv-lora-rank", "512"], "MLA"),
        (["plan", "--layers", "32", "--gpu", "H100"], "missing --kv-heads"),
        (["plan", "--model", "llama-3.1-8b"], "--gpu"),
        (["plan", "--model", "qwen2.5-7b", "--gpu", "H100", "--tp", "3"], "do not divide"),
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
