"""Specification of reading vLLM's scheduler flags from its command line (exporter.vllm.launch)."""

from __future__ import annotations

import pytest

from exporter.vllm.launch import (
    DEFAULT_PORT,
    config_arguments,
    human_readable_int,
    parse_launch_flags,
)


@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "serve", "/models/llama", "--max-num-seqs", "64"],
        ["vllm", "serve", "/models/llama", "--max-num-seqs=64"],
        ["vllm", "serve", "/models/llama", "--max_num_seqs", "64"],
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--max_num_seqs=64"],
        ["vllm", "serve", "m", "--max-num-seqs", "8", "--max-num-seqs", "64"],  # the last wins
    ],
)
def test_every_spelling_argparse_accepts(argv: list[str]) -> None:
    """--flag N, --flag=N, underscores, and the last occurrence winning, as vLLM's argparse."""
    assert parse_launch_flags(argv).max_num_seqs == 64


def test_the_other_flags_the_defaults_depend_on() -> None:
    """Batched tokens (human-readable), active seqs, TP x PP, throughput mode, the port."""
    flags = parse_launch_flags(
        [
            "vllm", "serve", "m",
            "--max-num-batched-tokens", "16k",
            "--max-num-active-seqs", "32",
            "-tp", "4",
            "--pipeline-parallel-size=2",
            "--performance-mode", "throughput",
            "--port", "9000",
        ]
    )  # fmt: skip
    assert flags.max_num_batched_tokens == 16_000
    assert flags.max_num_active_seqs == 32
    assert (flags.tensor_parallel, flags.pipeline_parallel) == (4, 2)
    assert flags.performance_mode == "throughput"
    assert flags.listen_port == 9000
    assert flags.max_num_seqs is None


def test_nothing_given_means_nothing_known_and_the_default_port() -> None:
    """A bare `vllm serve MODEL`: every flag None, port 8000."""
    flags = parse_launch_flags(["vllm", "serve", "m"])
    assert flags.max_num_seqs is None
    assert flags.listen_port == DEFAULT_PORT
    assert flags.invalid == ()


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5", ""])
def test_values_vllm_would_refuse_are_reported_not_used(value: str) -> None:
    """A bad value is listed under invalid and not taken for the limit."""
    flags = parse_launch_flags(["vllm", "serve", "m", f"--max-num-seqs={value}"])
    assert flags.max_num_seqs is None
    assert flags.invalid == (("--max-num-seqs", value),)


def test_the_admission_caps_are_read_and_zero_is_a_cap() -> None:
    """--max-num-queued-reqs / --max-num-queued-tokens (human-readable); 0 refuses everything."""
    flags = parse_launch_flags(
        ["vllm", "serve", "m", "--max-num-queued-reqs", "0", "--max_num_queued_tokens=8k"]
    )
    assert (flags.max_num_queued_reqs, flags.max_num_queued_tokens) == (0, 8000)
    assert flags.invalid == ()
    bare = parse_launch_flags(["vllm", "serve", "m"])
    assert (bare.max_num_queued_reqs, bare.max_num_queued_tokens) == (None, None)


def test_a_negative_admission_cap_is_invalid() -> None:
    """vLLM's Field(ge=0) refuses -1: reported, not used."""
    flags = parse_launch_flags(["vllm", "serve", "m", "--max-num-queued-reqs", "-1"])
    assert flags.max_num_queued_reqs is None
    assert flags.invalid == (("--max-num-queued-reqs", "-1"),)


def test_a_flag_without_its_value_at_the_end_is_invalid() -> None:
    """`--max-num-seqs` as the last word has no value."""
    flags = parse_launch_flags(["vllm", "serve", "m", "--max-num-seqs"])
    assert flags.max_num_seqs is None
    assert flags.invalid == (("--max-num-seqs", ""),)


def test_a_config_file_is_noted() -> None:
    """--config FILE may set the flags: its path is kept so the caller can say so."""
    assert (
        parse_launch_flags(["vllm", "serve", "--config", "/etc/v.yaml"]).config_file
        == "/etc/v.yaml"
    )


def test_unrelated_flags_and_their_values_are_skipped() -> None:
    """Other flags' values are never taken for ours (--served-model-name --max-num-seqs...)."""
    flags = parse_launch_flags(
        ["vllm", "serve", "m", "--served-model-name", "x", "--enforce-eager", "--max-num-seqs", "5"]
    )
    assert flags.max_num_seqs == 5


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8192", 8192),
        ("8k", 8000),
        ("8K", 8192),
        ("25.6k", 25600),
        ("1M", 2**20),
        ("2g", 2 * 10**9),
    ],
)
def test_human_readable_integers_as_vllm_reads_them(text: str, value: int) -> None:
    """Lower-case suffixes are decimal, upper-case binary."""
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "k", "8x", "٣", "1e3"])
def test_what_vllm_refuses_is_none(text: str) -> None:
    """Fractions of binary units, bare suffixes, other letters, non-ASCII digits: None."""
    assert human_readable_int(text) is None


def test_a_config_document_becomes_flags_as_vllm_makes_them() -> None:
    """key: value -> --key value; true -> --key; false adds nothing; lists and mappings."""
    document = {
        "max-num-seqs": 64,
        "enforce-eager": True,
        "enable-prefix-caching": False,
        "api-key": ["a", "b"],
        "compilation-config": {"level": 3},
    }
    assert config_arguments(document) == [
        "--max-num-seqs", "64",
        "--enforce-eager",
        "--api-key", "a", "b",
        "--compilation-config", '{"level": 3}',
    ]  # fmt: skip
    assert config_arguments(["max-num-seqs", 4]) is None
    assert config_arguments(None) is None


def test_config_flags_come_first_so_the_command_line_wins() -> None:
    """cli > config, and an invalid config value is overridden by a valid command-line one."""
    config = config_arguments({"max_num_seqs": "abc", "tensor-parallel-size": 4}) or []
    flags = parse_launch_flags(["vllm", "serve", "m", "--max-num-seqs", "8"], config=config)
    assert (flags.max_num_seqs, flags.tensor_parallel, flags.invalid) == (8, 4, ())
    only_config = parse_launch_flags(["vllm", "serve", "m"], config=["--max-num-seqs", "16k"])
    assert only_config.max_num_seqs == 16000
