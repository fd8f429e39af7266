"""The traffic a simulated vLLM receives: phases of Poisson arrivals with log-normal lengths.

A :class:`TrafficProfile` is plain data: a sequence of phases (short requests, chat, agents
sharing a system prompt, a burst of long documents...), each with an arrival rate, prompt and
output length distributions, the requests' ``max_tokens`` and ``n``, and optionally a
:class:`SharedPrefix`: a system prompt that a fraction of the phase's requests start with, which
vLLM's prefix cache then holds once for all of them. By default the sequence repeats, so a demo
that runs for an hour sees every phase once per cycle.

:class:`ArrivalSource` turns a profile into a deterministic stream of requests from one seed. Within
a phase the arrival rate is constant, so drawing exponential gaps and restarting the draw at each
phase boundary is an exact non-homogeneous Poisson process (the exponential is memoryless).
"""

from __future__ import annotations

import dataclasses
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
class SharedPrefix:
    """A system prompt of ``tokens`` tokens that a ``fraction`` of a phase's requests start with.

    A sharing request's prompt is this prefix followed by its own drawn prompt. The name tells
    prefixes apart: requests of two phases that name the same prefix share its cached blocks.
    """

    name: str
    tokens: int
    #: Probability that a request of the phase starts with the prefix (0 to 1).
    fraction: float


@dataclass(frozen=True, slots=True)
class TrafficPhase:
    """A stretch of time with constant arrival rate and one request mix."""

    name: str
    duration_s: float
    arrivals_per_s: float
    #: The request's own prompt (after the shared prefix, for requests that have one).
    prompt_tokens: LengthDistribution
    #: The length at which each response would end by itself (its end-of-sequence token).
    output_tokens: LengthDistribution
    #: The requests' ``max_tokens`` parameter: longer natural outputs finish with ``length``.
    max_tokens: int
    #: The requests' ``n``: samples generated from one prompt (each one a sequence).
    n: int = 1
    shared_prefix: SharedPrefix | None = None


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
    #: The ``n`` parameter: samples of the prompt, each generating ``output_tokens`` tokens.
    n: int = 1
    #: The system prompt the prompt starts with, if any (its first ``prefix_tokens`` tokens).
    shared_prefix: SharedPrefix | None = None

    @property
    def prefix_tokens(self) -> int:
        """Prompt tokens that are the shared prefix (0 without one; never beyond the prompt)."""
        prefix = self.shared_prefix
        return 0 if prefix is None else min(prefix.tokens, self.prompt_tokens)


def default_profile() -> TrafficProfile:
    """Return the demo's traffic: a 330 s cycle of five phases, repeated.

    Each phase makes another limit bind (with the default scenario's ``max_num_seqs`` of 256):

    - ``short`` (60 s): a flood of short requests (90/s, prompts around 150 tokens, answers
      around 100), a little more than the engine finishes. Their p95 context fits the KV pool
      some 500 times, so the scheduler binds first: 256 run, the rest queue, and the KV cache
      stays seven-eighths free.
    - ``chat`` (90 s): chat-like traffic (5/s, prompts around 1,500 tokens, answers around 300)
      that keeps the pool 10 to 30 % full. Once its long tail makes up the window's p95, the KV
      pool is the binding limit (70 to 90 sequences).
    - ``agents`` (60 s): 90 % of the requests (8/s) start with one 4,000-token system prompt
      before their own 400 or so, which vLLM's prefix cache holds once for all of them: some 45
      sequences of 4,600 tokens hold about 35,000 tokens, and the ceiling counting shared blocks
      once is about twice the one counting none shared.
    - ``burst`` (30 s): a wave of long-document requests (3.5/s, prompts around 5,000 tokens,
      answers around 800) arriving faster than the engine can finish them: the running requests
      come to hold every block, their next decode tokens need blocks that do not exist, and
      vLLM's recompute preemption starts.
    - ``calm`` (90 s): chat again; the queue drains and preemptions stop well before its end.
    """
    chat_prompt = LengthDistribution(median=1500, sigma=0.8, minimum=8, maximum=8000)
    chat_output = LengthDistribution(median=300, sigma=0.8, minimum=1, maximum=4000)
    short = TrafficPhase(
        name="short",
        duration_s=60.0,
        arrivals_per_s=90.0,
        prompt_tokens=LengthDistribution(median=150, sigma=0.5, minimum=8, maximum=500),
        output_tokens=LengthDistribution(median=100, sigma=0.5, minimum=1, maximum=400),
        max_tokens=256,
    )
    chat = TrafficPhase(
        name="chat",
        duration_s=90.0,
        arrivals_per_s=5.0,
        prompt_tokens=chat_prompt,
        output_tokens=chat_output,
        max_tokens=1024,
    )
    agents = TrafficPhase(
        name="agents",
        duration_s=60.0,
        arrivals_per_s=8.0,
        prompt_tokens=LengthDistribution(median=400, sigma=0.6, minimum=8, maximum=4000),
        output_tokens=LengthDistribution(median=250, sigma=0.6, minimum=1, maximum=2000),
        max_tokens=1024,
        shared_prefix=SharedPrefix(name="agent-system-prompt", tokens=4000, fraction=0.9),
    )
    burst = TrafficPhase(
        name="burst",
        duration_s=30.0,
        arrivals_per_s=3.5,
        prompt_tokens=LengthDistribution(median=5000, sigma=0.35, minimum=1000, maximum=12000),
        output_tokens=LengthDistribution(median=800, sigma=0.4, minimum=100, maximum=4000),
        max_tokens=2048,
    )
    calm = dataclasses.replace(chat, name="calm", duration_s=90.0)
    return TrafficProfile(phases=(short, chat, agents, burst, calm), repeat=True)


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
        own = phase.prompt_tokens.sample(self._rng)
        natural = phase.output_tokens.sample(self._rng)
        prefix = phase.shared_prefix
        # Drawn only for phases with a prefix, so that streams of other profiles stay the same.
        if prefix is not None and self._rng.random() >= prefix.fraction:
            prefix = None
        prompt = min(own + (prefix.tokens if prefix else 0), self._max_model_len - 1)
        cap = min(phase.max_tokens, self._max_model_len - prompt)
        output, reason = (natural, "stop") if natural <= cap else (cap, "length")
        return Arrival(t, prompt, output, phase.max_tokens, reason, phase.n, prefix)
