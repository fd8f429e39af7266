"""Specification of `vllm-headroom probe` against the simulated vLLM over HTTP.

The simulated engine (129 blocks of 16 tokens: 128 usable) serves completions at several times
real time; requests of 100 + 156 tokens hold 16 blocks each, so the pool holds 8 of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.cli import probe
from exporter.cli.main import build_parser, main
from exporter.errors import UsageError
from exporter.sim import Scenario, SimEngineConfig
from exporter.testing.fakevllm import FakeVllm, VllmState, render_metrics
from exporter.testing.processes import free_port
from exporter.testing.simload import SimCompletionsServer
from tests import paths

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from exporter.cli.numbers import Bounded

MODEL = "simulated/llama-3.1-8b"
#: Quick steps: the simulation runs at SPEED times real time.
SPEED = 4.0
QUICK = [
    "--step-seconds",
    "2",
    "--settle-seconds",
    "0.5",
    "--sample-interval",
    "0.2",
    "--quiet-seconds",
    "0.3",
    "--prompt-tokens",
    "100",
    "--output-tokens",
    "156",
]


def scenario(max_num_seqs: int = 1024) -> Scenario:
    """The small pool: 8 requests of 256 tokens fit."""
    return Scenario(
        engine=SimEngineConfig(
            block_size=16,
            max_model_len=1024,
            max_num_seqs=max_num_seqs,
            kv_cache_memory_bytes=129 * 16 * 131_072,
        )
    )


@pytest.fixture
def sim() -> Iterator[SimCompletionsServer]:
    """A fresh simulated vLLM (idle, counters at zero)."""
    with SimCompletionsServer(scenario(), speed=SPEED) as server:
        yield server


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    """Run probe with --json; return its document."""
    assert main(["probe", *argv, "--json"]) == 0
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return document


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run probe expecting a usage error; return stderr, checked to be one line.

    The parser's own refusals (a flag's type) exit through SystemExit(2); the command's return 2.
    """
    code: int | str | None
    try:
        code = main(["probe", *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "localhost:8000"], "is not a URL"),
        (["--target", "http://h", "--prompt-tokens", "10"], "--output-tokens together"),
        (
            [
                "--target",
                "http://h",
                "--prompt-tokens",
                "1",
                "--output-tokens",
                "1",
                "--lengths",
                "f.csv",
            ],
            "keep one",
        ),
        (["--target", "http://h", "--levels", "1,fast"], "e.g. 1,2,4"),
        (["--target", "http://h", "--mode", "concurrency", "--levels", "2.5"], "whole numbers"),
        (["--target", "http://h", "--report", "out.pdf"], "name an .html or .png file"),
        (["--target", "http://h", "--step-seconds", "0"], "--step-seconds"),
        (["--target", "http://h", "--max-num-seqs", "0"], "--max-num-seqs"),
        (
            ["--target", "http://h", "--shape-samples", "0"],
            "argument --shape-samples: '0' is not a whole number of samples from 1 to 100,000; "
            "give e.g. 200",
        ),
        (["--target", "http://h", "--shape-samples", "100001"], "from 1 to 100,000"),
        (["--target", "http://h", "--max-requests", "1000001"], "from 1 to 1,000,000"),
        (
            ["--target", "http://h", "--prompt-tokens", "0", "--output-tokens", "5"],
            "argument --prompt-tokens: '0' is not a whole number of tokens from 1 to 4,194,304",
        ),
        (["--target", "http://h", "--past-knee=-1"], "of steps from 0 to 2**53"),
        (["--target", "http://h", "--baseline-requests", "0"], "of requests from 1 to 2**53"),
        (["--target", "http://h", "--seed", "1.5"], "from -2**53 to 2**53; give e.g. 0"),
        (
            ["--target", "http://h", "--shape-from", "capture.prom", "--shape-window", "60"],
            "--shape-window reads a vLLM's histograms twice",
        ),
        (
            ["--target", "http://h", "--lengths", "f.csv", "--shape-window", "60"],
            "not with lengths or a capture file",
        ),
    ],
)
def test_bad_flags_are_one_line_before_any_request(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Flags are checked before the target is touched: one line, exit 2, no traceback."""
    assert message in one_line_error(capsys, *argv)


def test_rates_without_a_kv_capacity_are_refused_before_any_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A vLLM that does not publish its pool gives no ceiling to choose rates from: --levels."""
    capture = (paths.CAPTURES / "10_v0.11+_V1_rhoai-lab-doc.prom").read_bytes()
    with FakeVllm(payload=capture) as fake:
        err = one_line_error(capsys, "--target", fake.url, *QUICK)
    assert "does not say its KV capacity (no vllm:cache_config_info)" in err
    assert "give --levels" in err


@pytest.mark.parametrize(
    "case",
    [
        ("--lengths", "/dev/zero", "/dev/zero (a character device) is larger than 64 MiB"),
        ("--shape-from", "fifo", "is a FIFO with no writer for 0.5 s"),
        ("--lengths", "directory", "it is a directory"),
    ],
)
def test_a_lengths_or_capture_file_of_any_kind_is_read_within_its_bounds(
    case: tuple[str, str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sim: SimCompletionsServer,
) -> None:
    """--lengths and --shape-from FILE: at most 64 MiB within --timeout, one line, no load."""
    flag, kind, message = case
    source = {"/dev/zero": "/dev/zero", "directory": str(tmp_path)}.get(kind, str(tmp_path / "f"))
    if kind == "fifo":
        os.mkfifo(source)
    argv = [a for a in QUICK if a not in ("--prompt-tokens", "100", "--output-tokens", "156")]
    err = one_line_error(capsys, "--target", sim.url, *argv, "--timeout", "0.5", flag, source)
    assert message in err


@pytest.mark.parametrize("value", ["NaN", "-1"])
def test_a_target_whose_busy_gauges_cannot_be_read_gets_no_load(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Running-requests gauge NaN or negative: busy or not is unknown, so nothing is sent."""
    payload = render_metrics(VllmState()).replace(
        b'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0',
        b'vllm:num_requests_running{engine="0",model_name="tiny"} ' + value.encode(),
    )
    with FakeVllm(payload=payload) as fake:
        err = one_line_error(capsys, "--target", fake.url, *QUICK, "--levels", "1")
        assert "/v1/completions" not in fake.counts.requests
    assert "cannot tell whether" in err
    assert "engine 0 reports no usable vllm:num_requests_running" in err
    assert "--i-know-this-sends-load" in err


def test_a_target_that_completes_no_request_ends_the_sweep_after_the_baseline(
    capsys: pytest.CaptureFixture[str], sim: SimCompletionsServer
) -> None:
    """A wrong model name: the baseline fails with vLLM's 404, no step runs, exit code 1."""
    assert (
        main(["probe", "--target", sim.url, *QUICK, "--model", "other", "--levels", "1", "--json"])
        == 1
    )
    document = json.loads(capsys.readouterr().out)
    assert document["steps"] == []
    assert document["ended"] == (
        "no baseline request completed (3 requests failed (http_404); no request completed)"
    )
    assert document["idle_after"] is True


def test_an_unreachable_target_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Nobody listening: the error says so and suggests checking vLLM."""
    err = one_line_error(capsys, "--target", f"http://127.0.0.1:{free_port()}", *QUICK)
    assert "cannot read" in err
    assert "is vLLM running there?" in err


def test_a_target_serving_traffic_is_refused_without_the_confirmation_flag(
    capsys: pytest.CaptureFixture[str], sim: SimCompletionsServer
) -> None:
    """A request in flight (or finishing) means production traffic: no load is sent."""
    body = {"model": MODEL, "prompt": [16] * 100, "max_tokens": 800}
    thread = threading.Thread(
        target=lambda: httpx.post(
            f"{sim.url}/v1/completions", json=body, timeout=60, trust_env=False
        ),
        daemon=True,
    )
    thread.start()
    while sim.received < 1:
        time.sleep(0.02)
    received = sim.received
    err = one_line_error(capsys, "--target", sim.url, *QUICK)
    assert "is serving traffic (1 requests running" in err
    assert "--i-know-this-sends-load" in err
    assert sim.received == received  # nothing was sent
    thread.join(timeout=30)


def test_the_knee_of_a_kv_bound_server_is_its_capacity(
    capsys: pytest.CaptureFixture[str], sim: SimCompletionsServer, tmp_path: Path
) -> None:
    """Concurrency 8 fits the pool, 16 preempts: knee 8 = the ceiling, bound by the KV cache.

    16 rather than 10 past it: over HTTP on a loaded machine the clients fall out of step, and
    10 requests at different points of their output hold about 115 blocks on average, which
    fits; 12 hold about 138 of the 128, which a loaded run once read as fitting (knee 12: gaps
    between a client's requests lower what is held); 16 hold about 184 whatever their phase (the
    simulated-time sweep of tests/sweep/test_runner.py, whose clients stay in step, shows 10
    preempting).
    """
    report = tmp_path / "probe.html"
    document = run_json(
        capsys,
        "--target",
        sim.url,
        *QUICK,
        "--mode",
        "concurrency",
        "--levels",
        "6,8,16",
        "--max-num-seqs",
        "1024",
        "--report",
        str(report),
    )
    knee = document["knee"]
    assert isinstance(knee, dict)
    assert knee["level"] == 8
    assert knee["ceiling_sequences"] == 8
    assert knee["binding"] == "kv_cache"
    assert document["idle_after"] is True
    assert document["driver"] == "built-in (httpx)"
    assert report.read_text().count("data:image/png;base64,") == 1


def test_the_knee_of_a_max_num_seqs_bound_server_is_that_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With max_num_seqs 4, clients past the fourth wait with KV to spare: knee 4, bound by it.

    6 rather than 5 past it, so that requests wait even when a loaded machine slows the clients'
    turnaround (the simulated-time sweep shows 5 waiting).
    """
    with SimCompletionsServer(scenario(max_num_seqs=4), speed=SPEED) as sim:
        document = run_json(
            capsys,
            "--target",
            sim.url,
            *QUICK,
            "--mode",
            "concurrency",
            "--levels",
            "3,4,6",
            "--max-num-seqs",
            "4",
        )
    knee = document["knee"]
    assert isinstance(knee, dict)
    assert (knee["level"], knee["binding"]) == (4, "max_num_seqs")
    ceiling = document["ceiling"]
    assert isinstance(ceiling, dict)
    assert (ceiling["sequences"], ceiling["limited_by"], ceiling["kv_p95_sequences"]) == (
        4,
        "max_num_seqs",
        8,
    )


def test_the_shape_can_come_from_a_capture_of_another_server(
    capsys: pytest.CaptureFixture[str], sim: SimCompletionsServer
) -> None:
    """--shape-from a /metrics file: the lengths of the requests that server finished."""
    capture = paths.CAPTURES / "vllm-0.32.0-cpu-after-load.prom"
    argv = [a for a in QUICK if a not in ("--prompt-tokens", "100", "--output-tokens", "156")]
    document = run_json(
        capsys,
        "--target",
        sim.url,
        *argv,
        "--shape-from",
        str(capture),
        "--mode",
        "concurrency",
        "--levels",
        "2",
        "--shape-samples",
        "50",
    )
    shape = document["shape"]
    assert isinstance(shape, dict)
    assert str(shape["source"]).startswith(str(capture))
    assert shape["requests"] == 50
    assert shape["max_context_tokens"] <= 1024


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_cleanly_reports_and_leaves_the_target_idle(
    sim: SimCompletionsServer, sig: signal.Signals, code: int
) -> None:
    """A stop signal mid-step: requests in flight cancelled, summary printed, the shell's code.

    SIGINT is Ctrl-C; SIGTERM is Kubernetes deleting the probe's Job or ending it at its deadline.
    """
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "probe",
            "--target",
            sim.url,
            "--mode",
            "concurrency",
            "--levels",
            "4",
            "--step-seconds",
            "60",
            "--sample-interval",
            "0.2",
            "--quiet-seconds",
            "0.3",
            "--prompt-tokens",
            "100",
            "--output-tokens",
            "600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=paths.REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    for line in process.stderr:
        if line.startswith("probe: step 1/1"):
            break
    # Until the step's four requests are in flight: on two busy cores a CI run had one of them
    # after a fixed second.
    deadline = time.monotonic() + 30.0
    while sim.received - sim.disconnected < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    in_flight = sim.received - sim.disconnected
    process.send_signal(sig)
    out, err = process.communicate(timeout=60)
    assert process.returncode == code, err
    assert "ended: interrupted" in out
    assert "target idle" in out
    assert sim.disconnected >= 4
    assert in_flight >= 4
    assert sim.running_and_waiting() == (0, 0)


#: A vLLM whose /v1/models gives no max_model_len (the fake's field is typed int; None omits it).
NO_MAX_MODEL_LEN = VllmState(max_model_len=None, running=0)  # type: ignore[arg-type]


def idle_capture() -> bytes:
    """An idle vLLM's /metrics (the fake's own rendering needs a max_model_len)."""
    return (paths.CAPTURES / "vllm-0.32.0-cpu-idle.prom").read_bytes()


def _bad_values(bounded: Bounded) -> list[str]:
    """Every kind of bad value for one float flag: not finite, negative, 0 or under, too high."""
    values = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "-1", "many", f"{bounded.high * 2:g}"]
    if bounded.above or bounded.low > 0:
        values.append("0")
    if bounded.low > 0:
        values.append(f"{bounded.low / 2:g}")
    return values


FLOAT_CASES = [
    (name, value) for name, bounded in probe.FLOAT_FLAGS.items() for value in _bad_values(bounded)
]


@pytest.mark.parametrize(("name", "value"), FLOAT_CASES)
def test_every_float_flag_refuses_every_bad_value_in_one_line_before_any_request(
    name: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN would turn a limit or a stop off, inf would hang: the parser refuses, naming the flag.

    The target is a live fake vLLM: nothing at all is read from it.
    """
    flag = "--" + name.replace("_", "-")

    def hung(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"{flag}={value} was not refused: probe waited 20 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        with FakeVllm(state=VllmState(running=0)) as fake:
            err = one_line_error(
                capsys,
                "--target",
                fake.url,
                "--prompt-tokens",
                "10",
                "--output-tokens",
                "5",
                "--levels",
                "1",
                f"{flag}={value}",
            )
            assert fake.counts.requests == {}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert f"argument {flag}: {value!r} is not a finite number of" in err
    assert "give e.g." in err


@pytest.mark.parametrize("name", list(probe.FLOAT_FLAGS))
def test_every_float_flag_accepts_its_bounds(name: str) -> None:
    """The range's ends themselves are accepted (the lower one where it is included)."""
    bounded = probe.FLOAT_FLAGS[name]
    flag = "--" + name.replace("_", "-")
    ends = [bounded.high] if bounded.above else [bounded.low, bounded.high]
    for end in ends:
        args = build_parser().parse_args(["probe", "--target", "http://h", f"{flag}={end!r}"])
        assert getattr(args, name) == end


@pytest.mark.parametrize("name", list(probe.FLOAT_FLAGS))
def test_a_float_flag_set_past_the_parser_is_refused_too(name: str) -> None:
    """Arguments built without the parser (a NaN in the namespace) are checked again."""
    args = build_parser().parse_args(
        ["probe", "--target", "http://127.0.0.1:9", "--prompt-tokens", "1", "--output-tokens", "1"]
    )
    setattr(args, name, float("nan"))
    flag = "--" + name.replace("_", "-")
    refusal = f"^{flag} 'nan' is not a finite number of .*; give e.g. "
    with pytest.raises(UsageError, match=refusal):
        probe.run(args)


@pytest.mark.parametrize("name", list(probe.WHOLE_FLAGS))
def test_a_whole_flag_set_past_the_parser_to_a_huge_number_is_refused_in_one_line(
    name: str,
) -> None:
    """A 5,000-digit int in the namespace is refused as any other, never a ValueError.

    ``str()`` of an int past 4,300 digits raises: the refusal names its size instead.
    """
    args = build_parser().parse_args(
        ["probe", "--target", "http://127.0.0.1:9", "--prompt-tokens", "1", "--output-tokens", "1"]
    )
    setattr(args, name, 10**5000)
    flag = "--" + name.replace("_", "-")
    with pytest.raises(UsageError, match=f"^{flag} an integer of 16,610 bits is not a whole"):
        probe.run(args)


def _bad_whole_values(bounded: Bounded) -> list[str]:
    """Every kind of bad value for one whole-number flag: a fraction, a float, past each end."""
    values = ["1.5", "1e3", "0x10", "nan", "many", "", str(int(bounded.high) + 1)]
    values.append(str(int(bounded.low) - 1))
    return values


WHOLE_CASES = [
    (name, value)
    for name, bounded in probe.WHOLE_FLAGS.items()
    for value in _bad_whole_values(bounded)
]


@pytest.mark.parametrize(("name", "value"), WHOLE_CASES)
def test_every_whole_flag_refuses_every_bad_value_in_one_line(
    name: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser refuses, naming the flag, the range and an example (no target is read)."""
    flag = "--" + name.replace("_", "-")
    err = one_line_error(capsys, "--target", "http://127.0.0.1:9", f"{flag}={value}")
    assert f"argument {flag}: {value!r} is not {probe.WHOLE_FLAGS[name].describe()}; " in err


@pytest.mark.parametrize("name", list(probe.WHOLE_FLAGS))
def test_every_whole_flag_accepts_its_bounds(name: str) -> None:
    """Both ends of a whole-number range are taken, as ints."""
    bounded = probe.WHOLE_FLAGS[name]
    flag = "--" + name.replace("_", "-")
    for end in (int(bounded.low), int(bounded.high)):
        args = build_parser().parse_args(["probe", "--target", "http://h", f"{flag}={end}"])
        assert getattr(args, name) == end
        assert type(getattr(args, name)) is int


@pytest.mark.parametrize("name", list(probe.WHOLE_FLAGS))
def test_a_whole_flag_set_past_the_parser_is_refused_too(name: str) -> None:
    """A fraction in the namespace, where a count belongs, is checked again."""
    args = build_parser().parse_args(
        ["probe", "--target", "http://127.0.0.1:9", "--prompt-tokens", "1", "--output-tokens", "1"]
    )
    setattr(args, name, 1.5)
    flag = "--" + name.replace("_", "-")
    with pytest.raises(UsageError, match=f"^{flag} '1.5' is not a whole number"):
        probe.run(args)


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ("99999999999999999999,5\n", "line 1 ('99999999999999999999,5')"),
        ("20000000,5\n", "line 1 ('20000000,5')"),
        ("10,5\n" + '{"a":' + "[" * 100_000 + "]" * 100_000 + "}\n", "line 2 "),
    ],
)
def test_lengths_that_cannot_be_sent_are_one_line_and_send_nothing(
    lengths: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target without max_model_len: lengths past the cap, or a line nested too deep."""
    source = tmp_path / "lengths.csv"
    source.write_text(lengths)
    with FakeVllm(state=NO_MAX_MODEL_LEN, payload=idle_capture()) as fake:
        err = one_line_error(
            capsys,
            "--target",
            fake.url,
            "--quiet-seconds",
            "0.1",
            "--levels",
            "1",
            "--lengths",
            str(source),
        )
        assert "/v1/completions" not in fake.counts.requests
    assert message in err


def test_lengths_longer_than_the_kv_pool_send_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """No max_model_len: a 2M-token request (under the cap) that no engine's pool holds."""
    with FakeVllm(state=NO_MAX_MODEL_LEN, payload=idle_capture()) as fake:
        err = one_line_error(
            capsys,
            "--target",
            fake.url,
            "--quiet-seconds",
            "0.1",
            "--levels",
            "1",
            "--prompt-tokens",
            "2000000",
            "--output-tokens",
            "5",
        )
        assert "/v1/completions" not in fake.counts.requests
    assert "2,000,005-token request but the target's KV pool holds" in err


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("100000000000", "'100000000000' is not a whole number of tokens from 1 to 4,194,304"),
        ("4194304", "the probe sends at most 4,194,304 tokens a request"),
    ],
)
def test_lengths_past_the_cap_are_refused_before_the_target_is_read(
    prompt: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past MAX_CONTEXT_TOKENS, one length (the parser) or the two together (the flag check)."""
    with FakeVllm(state=VllmState(running=0)) as fake:
        err = one_line_error(
            capsys,
            "--target",
            fake.url,
            "--prompt-tokens",
            prompt,
            "--output-tokens",
            "5",
        )
        assert fake.counts.requests == {}
    assert message in err
