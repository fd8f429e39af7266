"""Number flags of every command: one argparse type, one range check, one form of refusal.

``float()`` alone takes ``nan``, ``inf`` and ``1e400`` (infinity), and ``int()`` any size:
a NaN limit turns its check off (``x >= nan`` is never true), an infinite wait hangs, a count
past 2**53 is no longer exact as a float. So each number flag is a :class:`Bounded`, and a
value it refuses is one line naming what it must be and an example::

    argument --timeout: 'nan' is not a finite number of seconds above 0 and at most 600; give e.g. 5

What a value may look like, on purpose:

- Spaces (and tabs, newlines) around it are ignored, as ``int()`` and ``float()`` do.
- Underscores between digits are taken (``1_000``), as ``int()`` and ``float()`` and so vLLM's
  own flags take them: a flag copied from a vLLM command line means the same here.
- Only ASCII: other scripts' digits (``٣``, full-width ``５``), which ``int()`` reads, are refused.
- A whole number is decimal digits with an optional sign: ``8.0``, ``1e3`` and ``0x10`` are
  refused. A finite number is what ``float()`` reads (``.5``, ``1e-3``), but never NaN nor
  infinite; ``-0.0`` is 0.
- Text longer than :data:`LONGEST_TEXT` is refused unread (no number in range needs it; a
  4,300-digit ``int()`` is quadratic), and a refusal shows at most
  :data:`exporter.errors.SHOWN_CHARS` of it (:func:`exporter.errors.quoted`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from exporter.core.exact import MAX_EXACT_WHOLE
from exporter.errors import quoted

#: Longest text read as a number: more than any number in range needs to be written.
LONGEST_TEXT = 100
#: The way out of a queue cap's refusal: vLLM has none unless it is given.
NO_CAP = "leave it out for no cap"


def shown(value: object) -> str:
    """A value built without the parser, as a refusal shows it: :func:`quoted`, or an int by size.

    ``str()`` of an int past 4,300 digits raises ValueError; past :data:`LONGEST_TEXT` digits
    none would be shown anyway.
    """
    if isinstance(value, int) and value.bit_length() > 4 * LONGEST_TEXT:
        return f"an integer of {value.bit_length():,} bits"
    return quoted(str(value))


def figure(value: float) -> str:
    """A bound as a message writes it: ``86,400``, ``0.05``, ``2**53``."""
    if abs(value) == MAX_EXACT_WHOLE:
        return "-2**53" if value < 0 else "2**53"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,g}"


@dataclass(frozen=True, slots=True)
class Bounded:
    """An argparse type: a finite (or ``whole``) number from ``low`` to ``high``.

    ``low`` is excluded when ``above``; ``high`` is always included. A refusal says what the
    flag takes and ``give e.g. example``, then ``otherwise`` when there is another way out
    (``leave it out for no cap``).
    """

    unit: str
    low: float
    high: float
    example: str
    above: bool = False
    whole: bool = False
    otherwise: str = ""

    def accepts(self, value: float) -> bool:
        """Whether ``value`` is in range: never NaN, infinite, a bool, or a fraction if whole."""
        if isinstance(value, bool) or (self.whole and not isinstance(value, int)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        low_ok = value > self.low if self.above else value >= self.low
        return low_ok and value <= self.high

    def describe(self) -> str:
        """What the flag takes: ``a finite number of seconds above 0 and at most 3,600``."""
        kind = "a whole number" if self.whole else "a finite number"
        of = f" of {self.unit}" if self.unit else ""
        if self.above:
            return f"{kind}{of} above {figure(self.low)} and at most {figure(self.high)}"
        return f"{kind}{of} from {figure(self.low)} to {figure(self.high)}"

    def refusal(self, what: str) -> str:
        """The one line refusing ``what`` (a quoted value, or a flag and its value)."""
        advice = f"give e.g. {self.example}"
        if self.otherwise:
            advice = f"{advice}, or {self.otherwise}"
        return f"{what} is not {self.describe()}; {advice}"

    def __call__(self, text: str) -> float:
        """Parse one flag's value (an ``int`` when ``whole``) or raise ArgumentTypeError."""
        value = self.parse(text)
        if value is None or not self.accepts(value):
            raise argparse.ArgumentTypeError(self.refusal(quoted(text)))
        return value

    def parse(self, text: str) -> float | None:
        """The number ``text`` writes, in range or not; None when it writes none."""
        number = text.strip()
        if len(number) > LONGEST_TEXT or not number.isascii():
            return None
        try:
            if self.whole:
                return int(number, 10)
            return float(number) + 0.0  # -0.0 + 0.0 is 0.0: no negative zero comes back
        except ValueError:  # not a number (int()'s digit limit raises it too)
            return None


def whole(
    unit: str,
    low: int,
    example: str,
    *,
    high: int = MAX_EXACT_WHOLE,
    otherwise: str = "",
) -> Bounded:
    """A whole-number flag from ``low`` to ``high``.

    By default at most 2**53: past it a count is not exact as a float, and no setting comes near.
    """
    return Bounded(unit, low, high, example, whole=True, otherwise=otherwise)


def positive(unit: str, high: float, example: str) -> Bounded:
    """A finite-number flag above 0 and at most ``high`` (a size, a wait, a limit)."""
    return Bounded(unit, 0.0, high, example, above=True)


#: A random seed: any whole number a float holds exactly, either side of 0.
SEED = whole("", -MAX_EXACT_WHOLE, "0")
