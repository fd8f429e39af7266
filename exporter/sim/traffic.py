"""The traffic a simulated vLLM receives: phases of Poisson arrivals with log-normal lengths.

A :class:`TrafficProfile` is plain data: a sequence of phases (calm, burst, calm...), each with an
arrival rate, prompt and output length distributions and the requests' ``max_tokens``. By default
the sequence repeats, so a demo that runs for an hour sees a burst every cycle.

:class:`ArrivalSource` turns a profile into a deterministic stream of requests from one seed. Within
a phase the arrival rate is constant, so drawing exponential gaps and restarting the draw at each
phase boundary is an exact non-homogeneous Poisson process (the exponential is memoryless).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Token counts drawn from a log-normal distribution and clipped to ``[minimum, maximum]``."""

    median: float
    #: Standard deviation of the underlying normal (0.5 is a factor of about 1.65 either way).
    sigma: float
    minimum: int
    maximum: int

    def sample(self, rng: random.Random) -> int:
        """Draw one length from ``rng``."""
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        return min(self.maximum, max(self.minimum, round(value)))


@dataclass(frozen=True, slots=True)
class TrafficPhase:
    """A stretch of time with constant arrival rate and one request mix."""

    name: str
    duration_s: float
    arrivals_per_s: float
    prompt_tokens: LengthDistribution
    #: The length at which each response would end by itself (its end-of-sequence token).
    output_tokens: LengthDistribution
    #: The requests' ``max_tokens`` parameter: longer natural outputs finish with ``length``.
    max_tokens: int


@dataclass(frozen=True, slots=True)
class TrafficProfile:
    """Phases played in order; repeated forever when ``repeat`` is true, else silence after."""

    phases: tuple[TrafficPhase, ...]
    repeat: bool = True

    @property
    def cycle_s(self) -> float:
        """Length of one pass through all phases, in seconds."""
        return sum(phase.duration_s for phase in self.phases)

    def phase_at(self, t: float) -> TrafficPhase | None:
        """Return the phase in force at simulated time ``t`` (``None`` once a one-shot ends)."""
        cycle = self.cycle_s
        if t < 0 or cycle <= 0 or (not self.repeat and t >= cycle):
            return None
        offset = math.fmod(t, cycle)
        for phase in self.phases:
            if offset < phase.duration_s:
                return phase
            offset -= phase.duration_s
        return self.phases[-1]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as it reaches the engine."""

    time: float
    prompt_tokens: int
    #: Output tokens this request will generate before it finishes.
    output_tokens: int
    max_tokens: int
    #: ``stop`` (ended by itself) or ``length`` (cut at ``max_tokens`` or ``max_model_len``).
    finished_reason: str


def default_profile() -> TrafficProfile:
    """Return the demo's traffic: 60 s calm, a 30 s burst of long requests, 210 s calm; repeat.

    Calm is chat-like traffic (5 requests/s, prompts around 1,500 tokens, answers around 300)
    that keeps the default scenario's pool 10 to 20 % full. The burst is a wave of long-document
    requests (4/s, prompts around 5,000 tokens, answers around 800) arriving faster than the
    engine can finish them: about half a minute in, the running requests hold every block, their
    next decode tokens need blocks that do not exist, and vLLM's recompute preemption starts.
    The calm that follows drains the queue within a minute or two and preemptions stop.
    """
    calm = TrafficPhase(
        name="calm",
        duration_s=60.0,
        arrivals_per_s=5.0,
        prompt_tokens=LengthDistribution(median=1500, sigma=0.8, minimum=8, maximum=8000),
        output_tokens=LengthDistribution(median=300, sigma=0.8, minimum=1, maximum=4000),
        max_tokens=1024,
    )
    burst = TrafficPhase(
        name="burst",
        duration_s=30.0,
        arrivals_per_s=4.0,
        prompt_tokens=LengthDistribution(median=5000, sigma=0.35, minimum=1000, maximum=12000),
        output_tokens=LengthDistribution(median=800, sigma=0.4, minimum=100, maximum=4000),
        max_tokens=2048,
    )
    calm_after = TrafficPhase(
        name="calm",
        duration_s=210.0,
        arrivals_per_s=calm.arrivals_per_s,
        prompt_tokens=calm.prompt_tokens,
        output_tokens=calm.output_tokens,
        max_tokens=calm.max_tokens,
    )
    return TrafficProfile(phases=(calm, burst, calm_after), repeat=True)


class ArrivalStream(Protocol):
    """Where an engine's requests come from: the time of the next one, and those now due."""

    @property
    def next_time(self) -> float:
        """Time of the next arrival (``inf`` when there are no more)."""
        ...

    def pop_due(self, now: float) -> list[Arrival]:
        """Remove and return every arrival at or before ``now``, in order."""
        ...


class ScriptedArrivals:
    """A fixed list of arrivals, for tests and scripted scenarios (sorted by time on entry)."""

    def __init__(self, arrivals: Iterable[Arrival]) -> None:
        self._queue = deque(sorted(arrivals, key=lambda a: a.time))

    @property
    def next_time(self) -> float:
        """Time of the next arrival (``inf`` when the script is spent)."""
        return self._queue[0].time if self._queue else math.inf

    def pop_due(self, now: float) -> list[Arrival]:
        """Remove and return every arrival at or before ``now``, in order."""
        due: list[Arrival] = []
        while self._queue and self._queue[0].time <= now:
            due.append(self._queue.popleft())
        return due


class ArrivalSource:
    """A deterministic stream of :class:`Arrival` drawn from a profile and a seed.

    Owns its random generator; nothing else draws from it, so the stream depends only on the
    profile, ``max_model_len`` and the seed, never on how the engine handles the requests.
    """

    def __init__(self, profile: TrafficProfile, *, max_model_len: int, seed: int) -> None:
        self._profile = profile
        self._max_model_len = max_model_len
        # Reproducible on purpose: a seeded simulation, nothing secret (hence no S311).
        self._rng = random.Random(seed)  # noqa: S311
        self._phase_index = 0
        self._phase_start = 0.0
        self._cursor = 0.0
        # A profile whose every phase is silent would make _draw() spin through phases forever.
        silent = all(phase.arrivals_per_s <= 0 for phase in profile.phases)
        self._next: Arrival | None = None if silent else self._draw()

    @property
    def next_time(self) -> float:
        """Time of the next arrival (``inf`` when the profile has ended)."""
        return math.inf if self._next is None else self._next.time

    def pop_due(self, now: float) -> list[Arrival]:
        """Remove and return every arrival at or before ``now``, in order."""
        due: list[Arrival] = []
        while self._next is not None and self._next.time <= now:
            due.append(self._next)
            self._next = self._draw()
        return due

    def _draw(self) -> Arrival | None:
        phases = self._profile.phases
        while True:
            if self._phase_index >= len(phases):
                if not self._profile.repeat or self._profile.cycle_s <= 0:
                    return None
                self._phase_index = 0
            phase = phases[self._phase_index]
            phase_end = self._phase_start + phase.duration_s
            if phase.arrivals_per_s > 0:
                t = self._cursor + self._rng.expovariate(phase.arrivals_per_s)
                if t < phase_end:
                    self._cursor = t
                    return self._request(t, phase)
            # No arrival left in this phase: restart the (memoryless) draw at its end.
            self._cursor = self._phase_start = phase_end
            self._phase_index += 1

    def _request(self, t: float, phase: TrafficPhase) -> Arrival:
        prompt = min(phase.prompt_tokens.sample(self._rng), self._max_model_len - 1)
        natural = phase.output_tokens.sample(self._rng)
        cap = min(phase.max_tokens, self._max_model_len - prompt)
        if natural <= cap:
            return Arrival(t, prompt, natural, phase.max_tokens, "stop")
        return Arrival(t, prompt, cap, phase.max_tokens, "length")
