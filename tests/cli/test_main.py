"""Specification of the command line frame: subcommands, one-line errors, exit codes."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import pytest

from exporter import __version__
from exporter.cli.main import build_parser, main
from exporter.cli.numbers import Bounded


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the name and version and exits 0."""
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"vllm-headroom {__version__}"


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a subcommand the usage goes to stderr and the exit code is 2."""
    assert main([]) == 2
    assert "plan" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "check", "serve", "demo", "probe"])
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each documented subcommand is registered and answers --help."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert command in capsys.readouterr().out


def test_a_bad_flag_is_one_line_pointing_at_help(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse errors are one line with the fix, exit code 2, no usage dump."""
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--port", "1", "--nope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--help" in err


def _number_actions() -> list[tuple[str, argparse.Action]]:
    """Every flag of every command whose value is read as a number, by its command."""
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return [
        (name, action)
        for name, parser in commands.choices.items()
        for action in parser._actions
        if action.type in (int, float) or isinstance(action.type, Bounded)
    ]


def test_every_number_flag_is_bounded() -> None:
    """No command reads a number with bare int() or float(): each has a range and one-line error."""
    actions = _number_actions()
    assert {name for name, _ in actions} == {"plan", "check", "probe", "demo"}
    bare = [
        f"{name} {action.option_strings[0]}"
        for name, action in actions
        if action.type in (int, float)
    ]
    assert not bare


@pytest.mark.parametrize(
    ("command", "flag"),
    [(name, action.option_strings[0]) for name, action in _number_actions()],
)
def test_every_number_flag_refuses_nan_and_junk_in_one_line(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN and 5,000 characters of junk: exit 2, one short line naming the flag, no traceback."""
    required = {"check": ["capture.prom"], "probe": ["--target", "http://127.0.0.1:9"]}
    for value in ("nan", "x" * 5000):
        with pytest.raises(SystemExit) as exited:
            main([command, *required.get(command, []), f"{flag}={value}"])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.startswith(f"vllm-headroom {command}: error: argument {flag}: ")
        assert len(err) < 300
        assert "Traceback" not in err


def test_a_bad_setting_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """serve --port abc fails before starting anything: one line naming the setting."""
    assert main(["serve", "--port", "abc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "HEADROOM_PORT" in err


def test_serve_puts_back_the_signal_handlers_it_held_during_start_up() -> None:
    """serve holds the signals from its first instant; in this process it puts ours back."""
    sigs = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
    before = {sig: signal.getsignal(sig) for sig in sigs}
    assert main(["serve", "--port", "abc"]) == 2
    assert {sig: signal.getsignal(sig) for sig in sigs} == before


def test_a_closed_pipe_is_not_a_traceback() -> None:
    """`vllm-headroom plan --json | head -1` ends quietly when head stops reading."""
    script = (
        "import sys; from exporter.cli.main import main; "
        "sys.exit(main(['plan', '--model', 'llama-3.1-8b', '--gpu', 'h100', '--json']))"
    )
    producer = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert producer.stdout is not None
    producer.stdout.readline()
    producer.stdout.close()
    _, err = producer.communicate(timeout=30)
    assert b"Traceback" not in err
