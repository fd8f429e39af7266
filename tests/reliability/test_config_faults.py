"""Bad configuration: every setting, given a wrong type or value, stops ``serve`` with one line.

The line names the setting and what to do, the exit code is 2, and there is no traceback,
whether the value comes from a ``HEADROOM_*`` variable or a command-line flag. ``CASES`` has at
least one bad value for every field of :class:`~exporter.service.settings.Settings` (a test keeps it
complete when a setting is added); each runs through ``exporter.cli.main`` in this process, and
a sample also through the real ``vllm-headroom serve`` process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

import pytest

import exporter.cli.serve
from exporter.cli.main import main
from exporter.service.settings import FLAGS, Settings, env_name

if TYPE_CHECKING:
    from pathlib import Path

#: What every case starts from: valid, local, no GPU (a case overrides its own setting).
BASE_ENV = {
    "HEADROOM_LISTEN_ADDRESS": "127.0.0.1",
    "HEADROOM_PORT": "0",
    "HEADROOM_GPU_DISCOVERY": "none",
    "HEADROOM_TARGET": "http://127.0.0.1:9",
}

#: (setting, the variables that make it bad, a fragment the error line must contain).
CASES: list[tuple[str, dict[str, str], str]] = [
    ("listen_address", {"HEADROOM_LISTEN_ADDRESS": ""}, "must be an IP address or host name"),
    ("listen_address", {"HEADROOM_LISTEN_ADDRESS": "no such host.invalid"}, "IP address"),
    ("listen_address", {"HEADROOM_LISTEN_ADDRESS": "999.1.1.1"}, "check listen_address"),
    ("port", {"HEADROOM_PORT": "abc"}, "valid integer"),
    ("port", {"HEADROOM_PORT": "70000"}, "less than or equal to 65535"),
    ("tls_cert_file", {"HEADROOM_TLS_CERT_FILE": "/x.pem"}, "must be set together"),
    (
        "tls_cert_file",
        {"HEADROOM_TLS_CERT_FILE": "/nonexistent/c.pem", "HEADROOM_TLS_KEY_FILE": "/x/k.pem"},
        "cannot load the TLS certificate or key",
    ),
    ("tls_key_file", {"HEADROOM_TLS_KEY_FILE": "/x.pem"}, "must be set together"),
    ("mode", {"HEADROOM_MODE": "cluster"}, "'sidecar' or 'fleet'"),
    ("target", {"HEADROOM_TARGET": "ftp://vllm:8000"}, "must be an http:// or https:// URL"),
    ("target", {"HEADROOM_TARGET": "vllm:8000"}, "must be an http:// or https:// URL"),
    ("target", {"HEADROOM_TARGET": "http://127.0.0.1:99999"}, "port must be a number"),
    ("target", {"HEADROOM_TARGET": "http://127.0.0.1:abc"}, "port must be a number"),
    ("target", {"HEADROOM_TARGET": "http://127.0.0.1:0"}, "port must be a number"),
    ("target", {"HEADROOM_TARGET": "http://0177.0.0.1:8000"}, "non-standard form"),
    ("target", {"HEADROOM_TARGET": "http://v:8000/?x=1"}, "without a query"),
    ("bearer_token", {"HEADROOM_BEARER_TOKEN": " "}, "is empty"),
    ("bearer_token", {"HEADROOM_BEARER_TOKEN": "two words"}, "cannot carry"),
    (
        "bearer_token_targets",
        {"HEADROOM_MODE": "fleet", "HEADROOM_BEARER_TOKEN": "t"},
        "lists none",
    ),
    ("bearer_token_targets", {"HEADROOM_BEARER_TOKEN_TARGETS": "http://x"}, "without a scheme"),
    ("poll_interval_seconds", {"HEADROOM_POLL_INTERVAL_SECONDS": "abc"}, "valid number"),
    ("poll_interval_seconds", {"HEADROOM_POLL_INTERVAL_SECONDS": "0"}, "greater than or equal"),
    ("poll_interval_seconds", {"HEADROOM_POLL_INTERVAL_SECONDS": "1e-9"}, "equal to 0.05"),
    ("poll_interval_seconds", {"HEADROOM_POLL_INTERVAL_SECONDS": "nan"}, "less than or equal"),
    ("poll_timeout_seconds", {"HEADROOM_POLL_TIMEOUT_SECONDS": "-1"}, "greater than or equal"),
    ("poll_timeout_seconds", {"HEADROOM_POLL_TIMEOUT_SECONDS": "1e-9"}, "equal to 0.01"),
    ("poll_timeout_seconds", {"HEADROOM_POLL_TIMEOUT_SECONDS": "60"}, "must not exceed"),
    ("max_response_bytes", {"HEADROOM_MAX_RESPONSE_BYTES": "1"}, "greater than or equal"),
    ("max_response_bytes", {"HEADROOM_MAX_RESPONSE_BYTES": "16MB"}, "valid integer"),
    ("context_window_seconds", {"HEADROOM_CONTEXT_WINDOW_SECONDS": "0"}, "greater than or equal"),
    ("context_min_requests", {"HEADROOM_CONTEXT_MIN_REQUESTS": "-1"}, "greater than or equal"),
    ("context_min_requests", {"HEADROOM_CONTEXT_MIN_REQUESTS": "many"}, "valid integer"),
    (
        "context_max_window_seconds",
        {"HEADROOM_CONTEXT_MAX_WINDOW_SECONDS": "60"},
        "must not be shorter than context_window_seconds",
    ),
    ("rate_window_seconds", {"HEADROOM_RATE_WINDOW_SECONDS": "1m"}, "valid number"),
    ("context_refresh_seconds", {"HEADROOM_CONTEXT_REFRESH_SECONDS": "-1"}, "greater than or"),
    ("context_refresh_seconds", {"HEADROOM_CONTEXT_REFRESH_SECONDS": "30s"}, "valid number"),
    ("context_refresh_seconds", {"HEADROOM_CONTEXT_REFRESH_SECONDS": "nan"}, "less than or equal"),
    ("model", {"HEADROOM_MODEL": ""}, "is empty"),
    ("hf_home", {"HEADROOM_HF_HOME": ""}, "is empty"),
    ("hf_home", {"HEADROOM_HF_HOME": "/etc/hostname"}, "is a file, not a directory"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": "{not json"}, "JSON expected"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": "[8]"}, "valid dictionary"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": '{"kv_heads": 8}'}, "known fields:"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": '{"num_kv_heads": 0}'}, "positive integer"),
    ("tensor_parallel_size", {"HEADROOM_TENSOR_PARALLEL_SIZE": "0"}, "greater than or equal"),
    ("pipeline_parallel_size", {"HEADROOM_PIPELINE_PARALLEL_SIZE": "two"}, "valid integer"),
    ("gpu_memory_bytes", {"HEADROOM_GPU_MEMORY_BYTES": "80GB"}, "valid integer"),
    ("max_num_seqs", {"HEADROOM_MAX_NUM_SEQS": "0"}, "greater than or equal to 1"),
    ("weights_bytes", {"HEADROOM_WEIGHTS_BYTES": "-5"}, "greater than 0"),
    ("overhead_bytes", {"HEADROOM_OVERHEAD_BYTES": "-1"}, "greater than or equal to 0"),
    ("gpu_discovery", {"HEADROOM_GPU_DISCOVERY": "maybe"}, "'auto', 'settings', 'all' or"),
    ("gpu_discovery", {"HEADROOM_GPU_DISCOVERY": "settings"}, "needs the gpus setting"),
    ("gpus", {"HEADROOM_GPU_DISCOVERY": "settings", "HEADROOM_GPUS": "gpu0"}, "GPU UUIDs"),
    ("proc_root", {"HEADROOM_PROC_ROOT": "/nonexistent/proc"}, "point it at /proc"),
    ("probe_allowlist", {"HEADROOM_PROBE_ALLOWLIST": "http://vllm"}, "without a scheme"),
    ("probe_allowlist", {"HEADROOM_PROBE_ALLOWLIST": "10.0.0.0/33"}, "not a valid CIDR"),
    ("probe_max_targets", {"HEADROOM_PROBE_MAX_TARGETS": "0"}, "greater than or equal to 1"),
    ("probe_target_ttl_seconds", {"HEADROOM_PROBE_TARGET_TTL_SECONDS": "1h"}, "valid number"),
    ("log_level", {"HEADROOM_LOG_LEVEL": "loud"}, "'debug', 'info', 'warning' or 'error'"),
    ("log_format", {"HEADROOM_LOG_FORMAT": "xml"}, "'auto', 'json' or 'console'"),
]


def case_id(case: tuple[str, dict[str, str], str]) -> str:
    """A readable test id: the variables and their values."""
    return ",".join(f"{k.removeprefix('HEADROOM_')}={v!r}" for k, v in case[1].items())


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No HEADROOM_* variable or .env file from the developer; logging left as pytest set it."""
    for name in list(os.environ):
        if name.startswith("HEADROOM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    # serve's run() configures structlog for the process; here the process is pytest's.
    monkeypatch.setattr(exporter.cli.serve, "configure_logging", lambda **_: None)


def run_main(argv: list[str]) -> int:
    """``main(argv)`` in a thread: a configuration that wrongly starts serving cannot hang us."""
    outcome: list[int] = []

    def target() -> None:
        try:
            outcome.append(main(argv))
        except SystemExit as exc:  # argparse errors exit
            outcome.append(int(exc.code or 0))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(20)
    assert outcome, f"vllm-headroom {' '.join(argv)} did not stop: it accepted the bad value"
    return outcome[0]


def assert_one_line(err: str, *, names: tuple[str, ...], fragment: str) -> None:
    """The error is one line, mentions one of ``names`` and ``fragment``, no traceback."""
    assert err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("vllm-headroom"), err
    assert "Traceback" not in err
    assert any(name in err for name in names), f"{names} not named in {err!r}"
    assert fragment in err, f"{fragment!r} not in {err!r}"


def test_every_setting_has_a_bad_value_case() -> None:
    """The table covers every setting: a new one cannot be added without its bad-input case."""
    assert {setting for setting, _, _ in CASES} == set(Settings.model_fields)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_a_bad_variable_stops_serve_with_one_line_naming_it(
    case: tuple[str, dict[str, str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """HEADROOM_<SETTING>=bad: exit 2 and one line naming the setting, with the problem."""
    setting, env, fragment = case
    for name, value in {**BASE_ENV, **env}.items():
        monkeypatch.setenv(name, value)
    code = run_main(["serve"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert_one_line(captured.err, names=(setting,), fragment=fragment)


#: The cases of settings that have a flag, given by the flag (other variables stay variables).
FLAG_CASES = [
    (
        setting,
        FLAGS[setting],
        env[env_name(setting)],
        fragment,
        {k: v for k, v in env.items() if k != env_name(setting)},
    )
    for setting, env, fragment in CASES
    if setting in FLAGS and env_name(setting) in env
]


def test_every_flag_has_a_bad_value_case() -> None:
    """Every setting with a flag is also given a bad value through that flag."""
    assert {case[0] for case in FLAG_CASES} == set(FLAGS)


@pytest.mark.parametrize("case", FLAG_CASES, ids=[f"{c[1]}={c[2]!r}" for c in FLAG_CASES])
def test_a_bad_flag_stops_serve_with_one_line_naming_it(
    case: tuple[str, str, str, str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """serve --flag bad: exit 2 and one line naming the flag or setting (argparse or ours)."""
    setting, flag, value, fragment, env = case
    for name, base in {**BASE_ENV, **env}.items():
        monkeypatch.setenv(name, base)
    code = run_main(["serve", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert code == 2
    choices = "invalid choice" in err
    assert_one_line(
        err,
        names=(setting, flag),
        fragment="invalid choice" if choices else fragment,
    )


def test_a_missing_secrets_directory_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """--secrets-dir pointing nowhere is refused, not silently ignored."""
    assert run_main(["serve", "--secrets-dir", "/nonexistent/secrets"]) == 2
    assert_one_line(capsys.readouterr().err, names=("--secrets-dir",), fragment="does not exist")


def test_a_secret_file_with_a_trailing_newline_is_trimmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`echo token > HEADROOM_BEARER_TOKEN` works: the newline is not part of the header."""
    from exporter.service.settings import load_settings

    monkeypatch.setenv("HEADROOM_BEARER_TOKEN", "s3cret\n")
    token = load_settings().bearer_token
    assert token is not None
    assert token.get_secret_value() == "s3cret"


#: Cases also run through the real process (one per kind of failure: validation, JSON
#: decoding, our own checks in serve, binding, TLS loading).
PROCESS_CASES = [
    c
    for c in CASES
    if c[1]
    in (
        {"HEADROOM_PORT": "abc"},
        {"HEADROOM_BEARER_TOKEN": " "},
        {"HEADROOM_MODEL_OVERRIDES": "{not json"},
        {"HEADROOM_MODEL_OVERRIDES": '{"kv_heads": 8}'},
        {"HEADROOM_LISTEN_ADDRESS": "999.1.1.1"},
        {"HEADROOM_TLS_CERT_FILE": "/nonexistent/c.pem", "HEADROOM_TLS_KEY_FILE": "/x/k.pem"},
    )
]


@pytest.mark.parametrize("case", PROCESS_CASES, ids=[case_id(c) for c in PROCESS_CASES])
def test_the_real_process_exits_2_with_one_line(
    case: tuple[str, dict[str, str], str], tmp_path: Path
) -> None:
    """`vllm-headroom serve` with a bad variable: exit 2, one line on stderr, nothing else."""
    setting, env, fragment = case
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_")}
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve"],
        env={**clean, **BASE_ENV, **env, "HEADROOM_LOG_FORMAT": "json"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert_one_line(result.stderr, names=(setting,), fragment=fragment)
