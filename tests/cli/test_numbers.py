"""Specification of the number flags' type (exporter.cli.numbers): what is taken, what is refused.

Each table row is one input class against one kind of range; the refusals are the exact line
argparse prints after ``argument --flag:``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from exporter.cli.main import main
from exporter.cli.numbers import NO_CAP, SEED, Bounded, figure, positive, shown, whole
from exporter.core.exact import MAX_EXACT_WHOLE
from exporter.errors import quoted

#: A wait: above 0 (0 is no wait at all), at most a day.
WAIT = positive("seconds", 86_400.0, "30")
#: A window that may be 0 (none), at most a day.
WINDOW = Bounded("seconds", 0.0, 86_400.0, "3600")
#: A range whose ends are not whole numbers.
INTERVAL = Bounded("seconds", 0.05, 60.0, "1")
#: A count from 1 to 2**53.
COUNT = whole("sequences", 1, "256")
#: A cap that may be 0, with another way out than a number.
CAP = whole("requests", 0, "1024", otherwise=NO_CAP)

TAKEN = [
    # both ends, where included; just inside where not
    (WAIT, "86400", 86_400.0),
    (WAIT, "5e-324", 5e-324),
    (WINDOW, "0", 0.0),
    (WINDOW, "86400", 86_400.0),
    (INTERVAL, "0.05", 0.05),
    (INTERVAL, "60", 60.0),
    (COUNT, "1", 1),
    (COUNT, "9007199254740992", MAX_EXACT_WHOLE),
    (CAP, "0", 0),
    (SEED, "-9007199254740992", -MAX_EXACT_WHOLE),
    (SEED, "9007199254740992", MAX_EXACT_WHOLE),
    # what float() and int() read besides plain digits
    (WAIT, "1e3", 1000.0),
    (WAIT, ".5", 0.5),
    (WAIT, "5.", 5.0),
    (WAIT, "+2", 2.0),
    (WAIT, "1_000", 1000.0),
    (WAIT, "1_000.5", 1000.5),
    (COUNT, "1_024", 1024),
    (COUNT, "+7", 7),
    (COUNT, "007", 7),
    # spaces around the value
    (WAIT, " 5 ", 5.0),
    (WAIT, "\t5\n", 5.0),
    (COUNT, " 8 ", 8),
    # negative zero is zero
    (WINDOW, "-0", 0.0),
    (WINDOW, "-0.0", 0.0),
    (CAP, "-0", 0),
]


@pytest.mark.parametrize(("bounded", "text", "value"), TAKEN)
def test_values_in_range_are_taken(bounded: Bounded, text: str, value: float) -> None:
    """The number comes back: an int for a whole number, a float otherwise, never -0.0."""
    taken = bounded(text)
    assert taken == value
    assert type(taken) is (int if bounded.whole else float)
    assert math.copysign(1.0, taken) == 1.0 or taken < 0


#: What each kind of range says after the quoted value.
WAIT_SAYS = "is not a finite number of seconds above 0 and at most 86,400; give e.g. 30"
WINDOW_SAYS = "is not a finite number of seconds from 0 to 86,400; give e.g. 3600"
INTERVAL_SAYS = "is not a finite number of seconds from 0.05 to 60; give e.g. 1"
COUNT_SAYS = "is not a whole number of sequences from 1 to 2**53; give e.g. 256"
CAP_SAYS = "is not a whole number of requests from 0 to 2**53; give e.g. 1024, or " + NO_CAP
SEED_SAYS = "is not a whole number from -2**53 to 2**53; give e.g. 0"

REFUSED = [
    # just outside either end
    (WAIT, "0", f"'0' {WAIT_SAYS}"),
    (WAIT, "-0.0", f"'-0.0' {WAIT_SAYS}"),
    (WAIT, "86400.00001", f"'86400.00001' {WAIT_SAYS}"),
    (WINDOW, "-1e-9", f"'-1e-9' {WINDOW_SAYS}"),
    (INTERVAL, "0.049", f"'0.049' {INTERVAL_SAYS}"),
    (INTERVAL, "60.001", f"'60.001' {INTERVAL_SAYS}"),
    (COUNT, "0", f"'0' {COUNT_SAYS}"),
    (COUNT, "9007199254740993", f"'9007199254740993' {COUNT_SAYS}"),
    (CAP, "-1", f"'-1' {CAP_SAYS}"),
    (SEED, "-9007199254740993", f"'-9007199254740993' {SEED_SAYS}"),
    # not finite: NaN turns a limit off, infinity never ends a wait
    (WAIT, "nan", f"'nan' {WAIT_SAYS}"),
    (WAIT, "NaN", f"'NaN' {WAIT_SAYS}"),
    (WAIT, "inf", f"'inf' {WAIT_SAYS}"),
    (WAIT, "-inf", f"'-inf' {WAIT_SAYS}"),
    (WAIT, "Infinity", f"'Infinity' {WAIT_SAYS}"),
    (WAIT, "1e400", f"'1e400' {WAIT_SAYS}"),
    (WINDOW, "-1e400", f"'-1e400' {WINDOW_SAYS}"),
    (COUNT, "nan", f"'nan' {COUNT_SAYS}"),
    (COUNT, "inf", f"'inf' {COUNT_SAYS}"),
    # a whole number is digits: no fraction, exponent or other base
    (COUNT, "1.5", f"'1.5' {COUNT_SAYS}"),
    (COUNT, "8.0", f"'8.0' {COUNT_SAYS}"),
    (COUNT, "1e3", f"'1e3' {COUNT_SAYS}"),
    (COUNT, "0x10", f"'0x10' {COUNT_SAYS}"),
    (COUNT, "0b1", f"'0b1' {COUNT_SAYS}"),
    (WAIT, "0x10", f"'0x10' {WAIT_SAYS}"),
    # not numbers at all
    (WAIT, "", f"'' {WAIT_SAYS}"),
    (WAIT, "   ", f"'   ' {WAIT_SAYS}"),
    (WAIT, "many", f"'many' {WAIT_SAYS}"),
    (WAIT, "5s", f"'5s' {WAIT_SAYS}"),
    (WAIT, "1,000", f"'1,000' {WAIT_SAYS}"),
    (WAIT, "1 000", f"'1 000' {WAIT_SAYS}"),
    (COUNT, "", f"'' {COUNT_SAYS}"),
    (COUNT, "eight", f"'eight' {COUNT_SAYS}"),
    (COUNT, "True", f"'True' {COUNT_SAYS}"),
    # underscores only between digits, as in Python
    (COUNT, "_1", f"'_1' {COUNT_SAYS}"),
    (COUNT, "1__0", f"'1__0' {COUNT_SAYS}"),
    (COUNT, "1_", f"'1_' {COUNT_SAYS}"),
    # digits of other scripts, which int() and float() would read
    (COUNT, "\u0663", f"'\u0663' {COUNT_SAYS}"),
    (WAIT, "\uff15", f"'\uff15' {WAIT_SAYS}"),
    # a line break or an escape sequence is quoted, not printed
    (COUNT, "1\n2", f"'1\\n2' {COUNT_SAYS}"),
    (WAIT, "\x1b[2J", f"'\\x1b[2J' {WAIT_SAYS}"),
    # long text: refused unread (int() stops at 4,300 digits), quoted in 40 characters
    (COUNT, "9" * 41, f"'{'9' * 40}' (the first 40 of 41 characters) {COUNT_SAYS}"),
    (COUNT, "9" * 5000, f"'{'9' * 40}' (the first 40 of 5,000 characters) {COUNT_SAYS}"),
    (WAIT, "1" * 101, f"'{'1' * 40}' (the first 40 of 101 characters) {WAIT_SAYS}"),
]


@pytest.mark.parametrize(("bounded", "text", "message"), REFUSED)
def test_values_out_of_range_are_refused_in_one_line(
    bounded: Bounded, text: str, message: str
) -> None:
    """The refusal quotes the value, says what the flag takes, and gives an example."""
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        bounded(text)
    assert str(refused.value) == message
    assert "\n" not in str(refused.value)


def test_a_hundred_characters_are_still_read() -> None:
    """The longest text read is 100 characters, spaces around it left out first."""
    assert WAIT("0." + "0" * 97 + "1") == 1e-98
    assert COUNT(" " * 200 + "8" + " " * 200) == 8


@pytest.mark.parametrize(
    ("bounded", "value", "accepted"),
    [
        (WAIT, 30.0, True),
        (WAIT, 30, True),
        (WAIT, 0.0, False),
        (WAIT, math.nan, False),
        (WAIT, math.inf, False),
        (WAIT, 10**400, False),  # an int past every float: compared, never converted
        (WAIT, True, False),
        (COUNT, 1, True),
        (COUNT, 1.0, False),
        (COUNT, 1.5, False),
        (COUNT, MAX_EXACT_WHOLE + 1, False),
        (COUNT, False, False),
        (CAP, 0, True),
    ],
)
def test_accepts_checks_values_built_without_the_parser(
    bounded: Bounded, value: float, accepted: bool
) -> None:
    """The same range for a value already parsed (a namespace built in code)."""
    assert bounded.accepts(value) is accepted


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (0.0, "0"),
        (0.05, "0.05"),
        (60.0, "60"),
        (86_400.0, "86,400"),
        (1e6, "1,000,000"),
        (2.0**30, "1,073,741,824"),
        (MAX_EXACT_WHOLE, "2**53"),
        (-MAX_EXACT_WHOLE, "-2**53"),
    ],
)
def test_bounds_are_written_as_people_read_them(value: float, written: str) -> None:
    """Thousands separated, no trailing ``.0``, 2**53 by its name."""
    assert figure(value) == written


def test_quoting_keeps_40_characters() -> None:
    """40 characters are quoted whole; past them the rest is counted."""
    assert quoted("x" * 40) == repr("x" * 40)
    assert quoted("x" * 45) == f"{'x' * 40!r} (the first 40 of 45 characters)"


def test_a_value_built_without_the_parser_is_shown_as_text_is() -> None:
    """Quoted as text is; an int too long for str() (4,300 digits) by its size, never a raise."""
    assert shown(float("nan")) == "'nan'"
    assert shown("x" * 50) == quoted("x" * 50)
    assert shown(2**53 + 1) == "'9007199254740993'"
    assert shown(10**5000) == "an integer of 16,610 bits"


def test_refusal_names_what_it_is_given() -> None:
    """A value checked after parsing is refused in the same words, named as the caller says."""
    assert COUNT.refusal("--max-num-seqs 0") == f"--max-num-seqs 0 {COUNT_SAYS}"


def test_a_range_is_a_value() -> None:
    """Ranges are frozen: a table of flags cannot be changed by a caller."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        COUNT.high = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["check", "capture.prom", "--timeout", "nan"],
            "argument --timeout: 'nan' is not a finite number of seconds above 0 and at most "
            "86,400; give e.g. 5",
        ),
        (
            ["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "0"],
            "argument --tp: '0' is not a whole number of GPUs from 1 to 2**53; give e.g. 2",
        ),
        (
            ["probe", "--target", "http://127.0.0.1:9", "--step-seconds", "1e400"],
            "argument --step-seconds: '1e400' is not a finite number of seconds above 0 and at "
            "most 86,400; give e.g. 30",
        ),
        (
            ["demo", "--every", "0"],
            "argument --every: '0' is not a finite number of seconds above 0 and at most 86,400; "
            "give e.g. 10",
        ),
        (
            ["probe", "--target", "http://127.0.0.1:9", "--max-requests", "9" * 5000],
            f"argument --max-requests: '{'9' * 40}' (the first 40 of 5,000 characters) is not a "
            "whole number of requests from 1 to 1,000,000; give e.g. 5000",
        ),
    ],
)
def test_every_command_refuses_a_bad_number_in_one_line_exit_2(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end: the parser's one line (command, flag, refusal, --help), exit 2, nothing run."""
    command = argv[0]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"vllm-headroom {command}: error: {line} (see vllm-headroom {command} --help)\n"
    )
