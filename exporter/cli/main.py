"""The ``vllm-headroom`` command line: one subcommand per module, errors as one line.

Each subcommand lives in its own module (``plan``, ``check``, ``serve``, ``demo``, ``probe``
beside this one), which exposes ``NAME``, ``HELP``, ``DESCRIPTION``, ``add_arguments(parser)`` and
``run(args) -> int``. This module is the frame: it builds the parsers (whose errors are one
line), wires the commands in, and turns :class:`~exporter.errors.UsageError` into one line on
stderr and exit code 2. Command modules never import it back.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from exporter import __version__
from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "vllm-headroom"

#: Exit code for bad input (flags, settings, files), as argparse uses it.
EXIT_USAGE = 2


class _CommandModule(Protocol):
    NAME: str
    HELP: str
    DESCRIPTION: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the problem and pointing at --help."""

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: message (see prog --help)`` and exit with code 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _command_modules() -> list[_CommandModule]:
    # Imported here so that `vllm-headroom --version` does not pay for every subcommand.
    from exporter.cli import (  # noqa: PLC0415 (lazy on purpose, see above)
        check,
        demo,
        plan,
        probe,
        serve,
    )

    return [plan, check, serve, demo, probe]


def build_parser() -> OneLineParser:
    """Build the top-level parser with every subcommand registered."""
    parser = OneLineParser(
        prog=PROG,
        description=(
            "KV-cache capacity and real-traffic headroom for vLLM: plan a deployment, check a "
            "running server, or serve derived gauges as a Prometheus exporter."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=OneLineParser
    )
    for module in _command_modules():
        command = subparsers.add_parser(
            module.NAME, help=module.HELP, description=module.DESCRIPTION
        )
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


#: What ``serve`` does with a signal before its event loop handles them (as it does after).
_EARLY_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def _hold_signals_while_serving_starts(argv: Sequence[str]) -> dict[int, Any]:
    """Handle ``serve``'s signals from its first instant as it does once running.

    SIGHUP is ignored (nothing to reload), SIGTERM and SIGINT are a clean exit 0. Importing and
    checking the settings take a second, and a SIGHUP then (a terminal closing, a supervisor's
    reload) killed it; the event loop installs the running handlers later. Returns the handlers
    replaced, which ``main`` puts back when it returns (tests call it in their own process).
    """
    if not argv or argv[0] != "serve":
        return {}
    if threading.current_thread() is not threading.main_thread():
        return {}  # tests run main() in threads; signals belong to the main thread

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in _EARLY_SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return previous


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    previous = _hold_signals_while_serving_starts(list(sys.argv[1:] if argv is None else argv))
    try:
        return _main(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = run(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `vllm-headroom plan --json | head`: the reader left; that is not an error of ours.
        _silence_stdout()
        return 141
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    import os  # noqa: PLC0415 - only on this rare path

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
