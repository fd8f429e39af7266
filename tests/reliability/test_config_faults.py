"""Bad configuration: every setting, given a wrong type or value, stops ``serve`` with one line.

The line names the setting and what to do, the exit code is 2, and there is no traceback,
whether the value comes from a ``HEADROOM_*`` variable or a command-line flag. ``CASES`` has at
least one bad value for every field of :class:`~exporter.service.settings.Settings` (a test keeps it
complete when a setting is added); each runs through ``exporter.cli.main`` in this process, and
a sample also through the real ``vllm-headroom serve`` process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

import exporter.cli.serve
from exporter.cli.main import main
from exporter.service.settings import FLAGS, Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
    ("poll_interval_seconds", {"HEADROOM_POLL_INTERVAL_SECONDS": "nan"}, "a finite number"),
    ("poll_timeout_seconds", {"HEADROOM_POLL_TIMEOUT_SECONDS": "-1"}, "greater than or equal"),
    ("poll_timeout_seconds", {"HEADROOM_POLL_TIMEOUT_SECONDS": "1e-9"}, "equal to 0.01"),
    ("poll_timeout_seconds", {"HEADROOM_POLL_TIMEOUT_SECONDS": "60"}, "must not exceed"),
    ("max_response_bytes", {"HEADROOM_MAX_RESPONSE_BYTES": "1"}, "greater than or equal"),
    ("max_response_bytes", {"HEADROOM_MAX_RESPONSE_BYTES": "16MB"}, "valid integer"),
    ("memory_limit_bytes", {"HEADROOM_MEMORY_LIMIT_BYTES": "256Mi"}, "valid integer"),
    ("memory_limit_bytes", {"HEADROOM_MEMORY_LIMIT_BYTES": "1048576"}, "greater than or equal"),
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
    ("context_refresh_seconds", {"HEADROOM_CONTEXT_REFRESH_SECONDS": "nan"}, "a finite number"),
    ("model", {"HEADROOM_MODEL": ""}, "is empty"),
    ("hf_home", {"HEADROOM_HF_HOME": ""}, "is empty"),
    ("hf_home", {"HEADROOM_HF_HOME": "/etc/hostname"}, "is a file, not a directory"),
    ("model_roots", {"HEADROOM_MODEL_ROOTS": "models"}, "is not an absolute path"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": "{not json"}, "JSON expected"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": "[8]"}, "valid dictionary"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": '{"kv_heads": 8}'}, "known fields:"),
    ("model_overrides", {"HEADROOM_MODEL_OVERRIDES": '{"num_kv_heads": 0}'}, "positive integer"),
    ("tensor_parallel_size", {"HEADROOM_TENSOR_PARALLEL_SIZE": "0"}, "greater than or equal"),
    ("pipeline_parallel_size", {"HEADROOM_PIPELINE_PARALLEL_SIZE": "two"}, "valid integer"),
    ("gpu_memory_bytes", {"HEADROOM_GPU_MEMORY_BYTES": "80GB"}, "valid integer"),
    ("max_num_seqs", {"HEADROOM_MAX_NUM_SEQS": "0"}, "greater than or equal to 1"),
    ("max_num_queued_reqs", {"HEADROOM_MAX_NUM_QUEUED_REQS": "-3"}, "greater than or equal to 1"),
    ("max_num_queued_tokens", {"HEADROOM_MAX_NUM_QUEUED_TOKENS": "1e13"}, "max_num_queued_tokens"),
    ("weights_bytes", {"HEADROOM_WEIGHTS_BYTES": "-5"}, "greater than 0"),
    ("overhead_bytes", {"HEADROOM_OVERHEAD_BYTES": "-1"}, "greater than or equal to 0"),
    ("gpu_discovery", {"HEADROOM_GPU_DISCOVERY": "maybe"}, "'auto', 'settings', 'all' or"),
    ("gpu_discovery", {"HEADROOM_GPU_DISCOVERY": "settings"}, "needs the gpus setting"),
    ("gpus", {"HEADROOM_GPU_DISCOVERY": "settings", "HEADROOM_GPUS": "gpu0"}, "GPU UUIDs"),
    ("proc_root", {"HEADROOM_PROC_ROOT": "/nonexistent/proc"}, "point it at /proc"),
    ("gpu_source", {"HEADROOM_GPU_SOURCE": "dcgm-exporter"}, "'nvml', 'dcgm' or 'none'"),
    ("gpu_source", {"HEADROOM_GPU_SOURCE": "dcgm"}, "needs dcgm_url"),
    (
        "dcgm_url",
        {
            "HEADROOM_GPU_SOURCE": "dcgm",
            "HEADROOM_MODE": "fleet",
            "HEADROOM_DCGM_URL": "http://n:9400/metrics",
        },
        "each probe names its target's dcgm-exporter",
    ),
    (
        "dcgm_url",
        {"HEADROOM_GPU_SOURCE": "dcgm", "HEADROOM_DCGM_URL": "http://$(NODE_IP):9400/metrics"},
        "unexpanded",
    ),
    ("dcgm_url", {"HEADROOM_DCGM_URL": "http://10.0.0.1:9400/metrics"}, "set gpu_source=dcgm"),
    ("dcgm_url", {"HEADROOM_GPU_SOURCE": "dcgm", "HEADROOM_DCGM_URL": "ftp://n/metrics"}, "http"),
    (
        "pod_name",
        {"HEADROOM_POD_NAME": "llama 70b!", "HEADROOM_POD_NAMESPACE": "llm"},
        "Kubernetes name",
    ),
    ("pod_namespace", {"HEADROOM_POD_NAMESPACE": "llm"}, "must be set together"),
    ("node_name", {"HEADROOM_NODE_NAME": "gpu_node/1"}, "Kubernetes name"),
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


# ------------------------------------------------------------------ hostile values, every setting

#: Values no setting may hold, each given to EVERY setting (a new setting is covered by itself).
HOSTILE_VALUES: dict[str, str] = {
    "100 kB": "a" * 100_000,
    "70 kB host": "http://" + "a." * 35_000 + "a:8000",
    "nested JSON": "[" * 5_000 + "]" * 5_000,
    "nested JSON object": '{"a":' * 1_000 + "1" + "}" * 1_000,
}
HOSTILE_CASES = [(s, kind) for s in Settings.model_fields for kind in HOSTILE_VALUES]


@pytest.mark.parametrize(
    ("setting", "kind"), HOSTILE_CASES, ids=[f"{s}-{k}" for s, k in HOSTILE_CASES]
)
def test_a_hostile_value_of_any_setting_is_one_line_within_a_second(
    setting: str, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Huge, huge-host or deeply nested: exit 2 in under a second, one short line, every setting."""
    for name, value in BASE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(env_name(setting), HOSTILE_VALUES[kind])
    started = time.monotonic()
    code = run_main(["serve"])
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert_one_line(err, names=(setting,), fragment="")
    assert len(err) < 1_000, f"{len(err)} characters"


def test_a_hostile_value_in_the_dotenv_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same bounds hold for a value read from .env (the working directory's)."""
    (tmp_path / ".env").write_text(f"HEADROOM_MODEL_OVERRIDES={'[' * 5000}\n")
    assert run_main(["serve"]) == 2
    assert_one_line(capsys.readouterr().err, names=("model_overrides",), fragment="nests")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _not_utf8(path: Path) -> None:
    path.write_bytes(b"HEADROOM_PORT=\xff\xfe\n")


def _directory(path: Path) -> None:
    path.mkdir()


def _huge(path: Path) -> None:
    with path.open("wb") as handle:
        handle.truncate(64 * 2**20)


#: Files that cannot be a .env or a secret file, and a fragment of the error line.
BAD_FILES: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "it is a FIFO; give a regular file"),
    "not-utf8": (_not_utf8, "is not UTF-8 text"),
    "directory": (_directory, "it is a directory"),
    "huge": (_huge, "is larger than 1 MiB"),
}


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_dotenv_that_is_no_text_file_is_one_line_within_a_second(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """.env as a FIFO (start-up used to hang), non-UTF-8 (a traceback), a directory, 64 MiB."""
    make, fragment = BAD_FILES[kind]
    make(tmp_path / ".env")
    started = time.monotonic()
    assert run_main(["serve"]) == 2
    assert time.monotonic() - started < 1.0
    assert_one_line(capsys.readouterr().err, names=(".env",), fragment=fragment)


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_secret_file_that_is_no_text_file_is_one_line_within_a_second(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A secret file of a setting that is a FIFO, not UTF-8, a directory or huge: one line."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    make, fragment = BAD_FILES[kind]
    make(secrets / "HEADROOM_BEARER_TOKEN")
    started = time.monotonic()
    assert run_main(["serve", "--secrets-dir", str(secrets)]) == 2
    assert time.monotonic() - started < 1.0
    assert_one_line(capsys.readouterr().err, names=("HEADROOM_BEARER_TOKEN",), fragment=fragment)


def test_an_encrypted_tls_key_is_refused_without_asking_for_a_passphrase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSSL would prompt on the terminal for an encrypted key; the exporter never asks."""
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-keyout", str(key), "-out",
         str(cert), "-days", "1", "-subj", "/CN=x", "-passout", "pass:secret"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    for name, value in BASE_ENV.items():
        monkeypatch.setenv(name, value)
    code = run_main(["serve", "--tls-cert-file", str(cert), "--tls-key-file", str(key)])
    assert code == 2
    assert_one_line(capsys.readouterr().err, names=("tls_key_file",), fragment="encrypted")


def test_a_tls_file_that_is_a_fifo_is_refused_without_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSSL would wait on a FIFO for a writer; the exporter refuses it by its kind."""
    fifo = tmp_path / "k.pem"
    os.mkfifo(fifo)
    for name, value in BASE_ENV.items():
        monkeypatch.setenv(name, value)
    code = run_main(["serve", "--tls-cert-file", str(fifo), "--tls-key-file", str(fifo)])
    assert code == 2
    assert_one_line(capsys.readouterr().err, names=("tls_cert_file",), fragment="regular file")


def _sighup_ignored(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(
        next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
    )
    return bool(ignored & (1 << (signal.SIGHUP - 1)))


def test_sighup_during_start_up_is_ignored_as_after_it(tmp_path: Path) -> None:
    """A SIGHUP while serve is still starting (importing, checking settings) does not kill it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve"],
        env={**clean, **BASE_ENV, "HEADROOM_LOG_FORMAT": "json"},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not _sighup_ignored(process.pid):  # as soon as main() runs, before the loop
            assert time.monotonic() < deadline
            time.sleep(0.005)
        process.send_signal(signal.SIGHUP)
        assert process.stdout is not None
        for line in process.stdout:
            if b'"listening"' in line:
                break
        assert process.poll() is None, "SIGHUP killed serve during start-up"
        process.send_signal(signal.SIGHUP)
        time.sleep(0.2)
        assert process.poll() is None
    finally:
        process.terminate()
        code = process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert code == 0


#: Every number setting, given a value that is no finite number.
FLOAT_SETTINGS = [
    name
    for name, field in Settings.model_fields.items()
    if field.annotation in (float, float | None)
]


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400"])
@pytest.mark.parametrize("setting", FLOAT_SETTINGS)
def test_a_number_setting_that_is_not_finite_says_so(
    setting: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """nan, inf, 1e400: "a finite number", never a bound that nan would seem to break."""
    for name, base in BASE_ENV.items():
        monkeypatch.setenv(name, base)
    monkeypatch.setenv(env_name(setting), value)
    assert run_main(["serve"]) == 2
    assert_one_line(capsys.readouterr().err, names=(setting,), fragment="a finite number")


def test_some_settings_are_numbers() -> None:
    """The table above is not empty: the seconds settings are floats."""
    assert "probe_target_ttl_seconds" in FLOAT_SETTINGS
    assert "poll_interval_seconds" in FLOAT_SETTINGS


# ------------------------------------------------------------- --on-start-error wait (the chart's)


@contextlib.contextmanager
def waiting_serve(
    tmp_path: Path, env: dict[str, str], *flags: str
) -> Iterator[subprocess.Popen[str]]:
    """``vllm-headroom serve --on-start-error wait``, its stderr a pipe; killed if still running.

    A watchdog kills it after 30 s, so that no read of its stderr can wait for ever.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--on-start-error", "wait", *flags],
        env={**clean, **BASE_ENV, **env, "HEADROOM_LOG_FORMAT": "json"},
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(30, process.kill)
    watchdog.start()
    try:
        yield process
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()


#: The process cases that still leave a port to listen on (a bad port falls back to the default).
WAIT_CASES = [c for c in PROCESS_CASES if "HEADROOM_PORT" not in c[1]]


@pytest.mark.parametrize("case", WAIT_CASES, ids=[case_id(c) for c in WAIT_CASES])
def test_a_sidecar_told_to_wait_answers_its_error_instead_of_exiting(
    case: tuple[str, dict[str, str], str], tmp_path: Path
) -> None:
    """--on-start-error wait: the one line, then 503 with it, /-/healthy 200, SIGTERM exits 0.

    Beside vLLM an exiting container backs off, and the pod, vLLM included, is unready meanwhile.
    """
    setting, env, fragment = case
    with waiting_serve(tmp_path, env) as process:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert_one_line(first, names=(setting,), fragment=fragment)
        waiting: dict[str, str] = {}
        for _ in range(3):  # a warning first when the address asked for cannot be had
            waiting = json.loads(process.stderr.readline())
            if waiting["event"] == "start_failed_waiting":
                break
        assert waiting["event"] == "start_failed_waiting", waiting
        assert fragment in waiting["error"]
        port = int(waiting["url"].rsplit(":", 1)[1])
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert metrics.status_code == 503
        assert fragment in metrics.text
        assert metrics.text.startswith("vllm-headroom did not start: ")
        healthy = httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=5)
        assert healthy.status_code == 200
        assert process.poll() is None, "it exited: the pod would lose vLLM's readiness"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


@pytest.mark.parametrize(
    ("given", "port"),
    [("9000", 9000), ("0", 0), ("abc", 8742), ("70000", 8742), ("9" * 5000, 8742), ("", 8742)],
)
def test_waiting_listens_on_the_port_asked_for_when_it_reads_as_one(
    given: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings did not load: the port is read as given, else the default the chart probes."""
    monkeypatch.setenv("HEADROOM_PORT", given)
    args = argparse.Namespace(port=None, listen_address=None)
    assert exporter.cli.serve._raw_port(args) == port


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("localhost", "localhost"),  # a name is bound as asked, not widened to every interface
        ("no such host!", "0.0.0.0"),  # noqa: S104 - the default, as the settings have it
        ("", "0.0.0.0"),  # noqa: S104
    ],
)
def test_waiting_listens_on_the_address_asked_for_when_it_reads_as_one(
    given: str, address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An IP address or a host name as given; anything else the settings' default."""
    monkeypatch.setenv("HEADROOM_LISTEN_ADDRESS", given)
    args = argparse.Namespace(port=None, listen_address=None)
    assert exporter.cli.serve._raw_address(args) == address


def test_a_bad_choice_given_as_a_flag_waits_too(tmp_path: Path) -> None:
    """--mode sidecr with --on-start-error wait: checked with the settings, so it waits."""
    with waiting_serve(tmp_path, {}, "--mode", "sidecr") as process:
        assert process.stderr is not None
        assert_one_line(process.stderr.readline(), names=("mode",), fragment="'sidecar' or 'fleet'")
        waiting = json.loads(process.stderr.readline())
        assert waiting["event"] == "start_failed_waiting"
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
