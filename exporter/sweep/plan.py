"""The sweep plan: which load levels, for how long, what each step sends, and when to stop.

A sweep runs one **baseline** (a few requests one at a time: the single-request latency, and a
warm-up) and then **steps** of rising load, each held for ``step_seconds``:

- ``rate`` mode (open loop, the default): requests arrive at random (Poisson-like) at the step's
  rate, whatever the server does: what users do. Overload shows as growing queues and preemption;
- ``concurrency`` mode (closed loop): ``N`` clients each send their next request when the previous
  one finishes. Overload shows as requests waiting; the load never runs away.

Levels are given (``--levels``) or chosen from the ceiling and the baseline (:func:`auto_levels`):
in concurrency mode, fractions of the ceiling from a quarter to twice; in rate mode, a geometric
grid (factor sqrt 2) under ``ceiling / single-request latency``, the rate at which the ceiling
would fill if latency never grew with load (it does, so the knee lies below). The sweep stops
``past_knee`` steps after the first step that breaks a limit, at the last level, or when the
total time or request budget would be exceeded.

Pure: plain values in, plain values out; the seeded generators are local to each call.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from exporter.errors import UsageError, quoted

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.sweep.shape import RequestShape, TrafficShape

#: Fractions of the ceiling the automatic concurrency levels cover.
CONCURRENCY_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
#: The automatic rate grid: ``r_max x 2^(k/2)`` for these ``k`` (1/16 of r_max up to sqrt 2 x).
RATE_EXPONENTS = tuple(range(-8, 2))
#: The most requests one sweep may send (``--max-requests``): the step's requests are built
#: before it starts, so this bounds the memory they take.
MAX_TOTAL_REQUESTS = 1_000_000
#: Concurrency levels when the ceiling is unknown.
FALLBACK_CONCURRENCY = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class Mode(StrEnum):
    """How a step applies load."""

    #: Open loop: Poisson arrivals at a rate (requests per second).
    RATE = "rate"
    #: Closed loop: a fixed number of requests in flight.
    CONCURRENCY = "concurrency"


@dataclass(frozen=True, slots=True)
class Load:
    """One step's load: a rate (requests/s) or a number of concurrent requests."""

    mode: Mode
    level: float

    def describe(self) -> str:
        """``2.5 req/s`` or ``8 concurrent``."""
        if self.mode == Mode.RATE:
            return f"{self.level:g} req/s"
        return f"{self.level:g} concurrent"

    @property
    def concurrency(self) -> int:
        """Clients of a concurrency step."""
        return max(1, round(self.level))


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """Everything the runner needs to know about the steps, and the bounds on the whole sweep."""

    mode: Mode
    #: Load levels in ascending order; ``()`` means "choose after the baseline".
    levels: tuple[float, ...]
    step_seconds: float = 30.0
    #: The first part of each step that is not measured (the load ramping up).
    settle_seconds: float = 5.0
    #: Steps to run after the first one that breaks a limit (to show the growth).
    past_knee: int = 1
    max_total_seconds: float = 900.0
    max_total_requests: int = 5000
    #: How long a step's requests in flight may take to finish once it stops sending.
    drain_seconds: float = 60.0
    #: Requests of the baseline (one at a time).
    baseline_requests: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value in (
            ("--step-seconds", self.step_seconds),
            ("--max-duration", self.max_total_seconds),
            ("--drain-seconds", self.drain_seconds),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{name} is {value}; give a positive number of seconds")
        if not 0 <= self.settle_seconds < self.step_seconds:
            raise UsageError(
                f"--settle-seconds {self.settle_seconds:g} must be at least 0 and below "
                f"--step-seconds {self.step_seconds:g}"
            )
        if not 1 <= self.max_total_requests <= MAX_TOTAL_REQUESTS:
            raise UsageError(
                f"--max-requests is {self.max_total_requests}; give 1 to {MAX_TOTAL_REQUESTS:,}"
            )
        if self.past_knee < 0:
            raise UsageError(f"--past-knee is {self.past_knee}; give 0 or more")
        if self.baseline_requests < 1:
            raise UsageError(f"--baseline-requests is {self.baseline_requests}; give at least 1")


def parse_levels(text: str, mode: Mode) -> tuple[float, ...]:
    """``--levels 1,2,4``: positive numbers (whole ones in concurrency mode), sorted, unique.

    Read as every number flag is (``exporter.cli.numbers``): ASCII only (``float()`` alone
    reads full-width and other scripts' digits), and a bad level quoted in 40 characters.
    """
    levels: set[float] = set()
    for part in text.split(","):
        word = part.strip()
        try:
            value = float(word) if word.isascii() else math.nan
        except ValueError:
            value = math.nan
        whole = value.is_integer() if math.isfinite(value) else False
        if not (math.isfinite(value) and value > 0) or (mode == Mode.CONCURRENCY and not whole):
            kind = "whole numbers of requests" if mode == Mode.CONCURRENCY else "requests/s"
            raise UsageError(
                f"--levels has {quoted(word)}; give positive {kind} separated by commas, e.g. 1,2,4"
            )
        levels.add(value)
    return tuple(sorted(levels))


def _round3(value: float) -> float:
    """Three significant digits: levels people can read and type again."""
    if value <= 0:
        return value
    digits = 2 - math.floor(math.log10(value))
    return round(value, digits)


def auto_levels(
    mode: Mode, *, ceiling: float | None, single_latency_s: float | None
) -> tuple[float, ...]:
    """The levels of a sweep nobody gave levels to (see the module docstring).

    Concurrency levels are whole and at least 1. Rate levels need both the ceiling and the
    single-request latency; without them :class:`UsageError` asks for ``--levels``.
    """
    if mode == Mode.CONCURRENCY:
        if ceiling is None or ceiling < 1:
            return FALLBACK_CONCURRENCY
        return tuple(sorted({float(max(1, round(ceiling * f))) for f in CONCURRENCY_FRACTIONS}))
    if ceiling is None or ceiling < 1 or not single_latency_s or single_latency_s <= 0:
        raise UsageError(
            "cannot choose request rates without the target's KV capacity and a baseline "
            "latency; give --levels (requests/s, e.g. 0.5,1,2,4)"
        )
    top = ceiling / single_latency_s
    return tuple(sorted({_round3(top * 2 ** (k / 2)) for k in RATE_EXPONENTS}))


def next_step(levels: Sequence[float], outcomes: Sequence[bool], *, past_knee: int) -> int | None:
    """Index of the next level to run given the steps' outcomes so far (True: within limits).

    Levels run in order; after the first failing step, ``past_knee`` more run, then none.
    """
    index = len(outcomes)
    if index >= len(levels):
        return None
    failed = [i for i, ok in enumerate(outcomes) if not ok]
    if failed and index - failed[0] > past_knee:
        return None
    return index


def arrival_count(rate: float, duration_s: float) -> int:
    """Requests of a rate step: ``rate x duration``, rounded, at least 1."""
    return max(1, round(rate * duration_s))


def arrival_offsets(rate: float, duration_s: float, *, seed: int) -> tuple[float, ...]:
    """Seconds from the step's start at which requests arrive, at ``rate`` on average.

    A Poisson process conditioned on its count: exactly ``round(rate x duration)`` arrivals at
    sorted uniform times. The gaps are as bursty as Poisson arrivals, but a short step cannot draw
    a third fewer requests than its rate by chance and read as a lower load.
    """
    # Reproducible on purpose: a seeded schedule, nothing secret (hence no S311).
    rng = random.Random(f"arrivals:{seed}:{rate!r}")  # noqa: S311
    count = arrival_count(rate, duration_s)
    return tuple(sorted(rng.uniform(0.0, duration_s) for _ in range(count)))


def draw_requests(shape: TrafficShape, count: int, *, seed: int) -> tuple[RequestShape, ...]:
    """``count`` request shapes from the pool: seeded permutations of it, one after another.

    A permutation rather than independent draws: a step that sends as many requests as the pool
    holds sends every shape once, so even short steps see the whole distribution.
    """
    pool = list(shape.requests)
    # Reproducible on purpose (hence no S311).
    rng = random.Random(f"draw:{seed}")  # noqa: S311
    out: list[RequestShape] = []
    while len(out) < count:
        rng.shuffle(pool)
        out.extend(pool[: count - len(out)])
    return tuple(out)
