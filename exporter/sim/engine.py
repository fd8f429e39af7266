"""A steppable, deterministic simulation of one vLLM V1 engine: paged KV blocks and its scheduler.

What it models, after vLLM V1's ``Scheduler`` and ``KVCacheManager``:

- **Paged KV blocks.** The pool has ``num_gpu_blocks`` blocks of ``block_size`` tokens; one is
  vLLM's reserved null block, so running requests can hold at most ``num_gpu_blocks - 1``. A request
  holds exactly ``ceil(computed_tokens / block_size)`` blocks: a new block is allocated each time it
  crosses a block boundary. ``kv_cache_usage_perc`` is ``1 - free / (num_gpu_blocks - 1)``, vLLM's
  own formula.
- **Continuous batching.** Each step first schedules the running requests in admission order (one
  token each while decoding, the rest of the prompt in chunks while prefilling), then, if nothing
  was preempted, admits waiting requests first-come first-served while the token budget
  (``max_num_batched_tokens``), ``max_num_seqs`` and free blocks allow. Prefill is chunked.
- **Recompute preemption.** When a running request needs a block and none is free, the newest
  running request is preempted: its blocks are freed, its progress is dropped, and it goes back to
  the front of the waiting queue, to recompute its prompt and the tokens it already generated.
  With prefix caching on (vLLM V1's default) its full blocks stay cached in the free queue until
  they are reused, so on re-admission it recomputes only what was evicted meanwhile.
- **Completion.** A request finishes when it has generated its output length; its blocks are freed.

Checked against reality: replaying the load of the real 0.32.0 capture (12 requests of 101 + 380
tokens into its 1,024-token pool) reproduces every count vLLM reported, 15 preemptions and 2,044
engine steps included (``tests/test_sim_exposition.py``).

Time is simulated: a step lasts what :func:`exporter.sim.timing.step_duration_s` says, idle time
jumps to the next arrival, and nothing here reads a clock, sleeps, logs or does I/O. Given the same
scenario and seed the run is identical, however the caller slices time (``advance_to(10)`` equals
``advance_to(4); advance_to(10)``).

The metrics follow vLLM V1's definitions (``vllm/v1/metrics/stats.py``): prompt tokens are counted
when a request produces its first token (recomputation after a preemption is not counted again),
inter-token latency is observed per generated token after the first, per-request histograms are
observed when a request finishes, ``iteration_tokens_total`` once per step.

The engine keeps mutable state internally because copying hundreds of requests per step into new
frozen values would cost more CPU than the demo may spend; what it hands out (:class:`EngineState`,
:class:`SimMetrics`) is frozen plain data.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.core.snapshot import Histogram
from exporter.sim import families
from exporter.sim.scenario import num_gpu_blocks, validate
from exporter.sim.timing import step_duration_s
from exporter.sim.traffic import ArrivalSource

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.sim.scenario import Scenario
    from exporter.sim.traffic import Arrival, ArrivalStream


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request inside the engine, as plain data (for inspection and tests)."""

    request_id: int
    prompt_tokens: int
    output_tokens: int
    #: Tokens generated so far.
    generated_tokens: int
    #: Tokens whose KV is computed (and held in blocks) right now.
    computed_tokens: int
    blocks: int
    preemptions: int


@dataclass(frozen=True, slots=True)
class EngineState:
    """The engine's state at one moment: the pool and the two queues."""

    now_s: float
    #: Name of the traffic phase in force (``None`` after a one-shot profile ended).
    phase: str | None
    #: vLLM's ``num_gpu_blocks``: the null block included.
    num_gpu_blocks: int
    blocks_used: int
    running: tuple[RequestView, ...]
    waiting: tuple[RequestView, ...]


@dataclass(frozen=True, slots=True)
class SimMetrics:
    """Everything the simulated engine counts, in vLLM's units, at one moment.

    Counters are cumulative since the start; ``histograms`` is keyed by vLLM family name
    (see :mod:`exporter.sim.families`).
    """

    now_s: float
    num_requests_running: int
    num_requests_waiting: int
    #: ``vllm:kv_cache_usage_perc``: 0 to 1, over ``num_gpu_blocks - 1``.
    kv_cache_usage: float
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    #: ``vllm:prefix_cache_queries_total``: prompt tokens looked up at first scheduling.
    prefix_cache_queries: int
    #: ``vllm:request_success_total`` by ``finished_reason``; every reason present.
    request_success: Mapping[str, int]
    histograms: Mapping[str, Histogram]


class _HistogramRecorder:
    """A cumulative histogram being filled: per-bucket counts and a running sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is the +Inf bucket
        self.total = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are "<= le": the first bound >= value.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> Histogram:
        cumulative = tuple(float(c) for c in itertools.accumulate(self.counts))
        return Histogram(
            bounds=(*self.bounds, math.inf),
            cumulative=cumulative,
            count=cumulative[-1],
            sum=self.total,
        )


class _Segment:
    """A run of free blocks in the pool's LRU order; ``owner`` still finds its prefix cached."""

    __slots__ = ("count", "owner")

    def __init__(self, owner: _Request | None, count: int) -> None:
        self.owner = owner
        self.count = count


class _BlockPool:
    """Free KV blocks in vLLM's eviction order (least recently freed first).

    Only the number of blocks matters, except for one thing vLLM's prefix cache gives a preempted
    request: its full blocks stay cached while they sit in the free queue, so when it is scheduled
    again it recomputes only what was evicted meanwhile. vLLM frees a request's blocks tail first,
    so eviction eats a preempted request's cached prefix from its end and the prefix stays usable.
    Finished requests' blocks are plain free blocks here (random prompts never hit them).
    """

    __slots__ = ("free", "queue")

    def __init__(self, usable_blocks: int) -> None:
        self.free = usable_blocks
        self.queue: deque[_Segment] = deque([_Segment(None, usable_blocks)])

    def take(self, n: int) -> None:
        """Hand out ``n`` free blocks (``n <= free``), evicting from the head of the queue."""
        self.free -= n
        queue = self.queue
        while n > 0:
            head = queue[0]
            used = min(head.count, n)
            head.count -= used
            n -= used
            if head.count == 0:
                queue.popleft()
                if head.owner is not None:
                    head.owner.cached = None

    def give_back(self, n: int, owner: _Request | None = None) -> _Segment | None:
        """Return ``n`` blocks to the tail of the queue; cached for ``owner`` if given."""
        self.free += n
        if n == 0:
            return None
        tail = self.queue[-1] if self.queue else None
        if owner is None and tail is not None and tail.owner is None:
            tail.count += n  # merge plain runs: keeps the queue short
            return tail
        segment = _Segment(owner, n)
        self.queue.append(segment)
        return segment

    def reclaim(self, segment: _Segment, n: int) -> None:
        """Take back ``n`` cached blocks of ``segment`` for its owner (a prefix-cache hit)."""
        self.free -= n
        segment.count -= n
        # What is left of the run stays free but no longer counts as the owner's cache.
        segment.owner = None


class _Request:
    """A request's mutable progress inside the engine."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached",
        "computed",
        "finished",
        "first_token_at",
        "generated",
        "last_token_at",
        "preemptions",
        "request_id",
        "scheduled_at",
    )

    def __init__(self, request_id: int, arrival: Arrival) -> None:
        self.request_id = request_id
        self.arrival = arrival
        self.generated = 0
        self.computed = 0
        self.blocks = 0
        #: Its cached prefix blocks in the free queue after a preemption (prefix caching on).
        self.cached: _Segment | None = None
        self.finished = False
        self.preemptions = 0
        self.scheduled_at = -1.0
        self.first_token_at = -1.0
        self.last_token_at = -1.0

    def view(self) -> RequestView:
        return RequestView(
            request_id=self.request_id,
            prompt_tokens=self.arrival.prompt_tokens,
            output_tokens=self.arrival.output_tokens,
            generated_tokens=self.generated,
            computed_tokens=self.computed,
            blocks=self.blocks,
            preemptions=self.preemptions,
        )


class Simulation:
    """One simulated vLLM V1 engine receiving the scenario's traffic.

    Requests come from the scenario's traffic profile drawn with ``seed``, unless ``arrivals``
    gives another stream (a :class:`~exporter.sim.traffic.ScriptedArrivals` in tests). Raises
    :class:`~exporter.sim.scenario.ScenarioError` if vLLM would refuse the scenario.
    """

    def __init__(
        self, scenario: Scenario, *, seed: int = 0, arrivals: ArrivalStream | None = None
    ) -> None:
        validate(scenario)
        self.scenario = scenario
        self.num_gpu_blocks = num_gpu_blocks(scenario)
        # The null block is never handed to a request.
        self._usable_blocks = self.num_gpu_blocks - 1
        self._pool = _BlockPool(self._usable_blocks)
        self._prefix_caching = scenario.engine.enable_prefix_caching
        self._arrivals: ArrivalStream = (
            ArrivalSource(scenario.traffic, max_model_len=scenario.engine.max_model_len, seed=seed)
            if arrivals is None
            else arrivals
        )
        self._ids = itertools.count()
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._now = 0.0
        self._horizon = 0.0
        self._preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._prefix_cache_queries = 0
        self._success = dict.fromkeys(families.FINISHED_REASONS, 0)
        self._histograms = {
            family.name: _HistogramRecorder(family.bounds)
            for family in families.histogram_families(scenario.engine.max_model_len)
        }

    @property
    def now(self) -> float:
        """Simulated seconds since the engine started (may run past the last target by a step)."""
        return self._now

    def advance(self, dt: float) -> None:
        """Simulate ``dt`` more seconds past the previous target time."""
        self.advance_to(self._horizon + dt)

    def advance_to(self, t: float) -> None:
        """Simulate until time ``t``: run every engine step that starts before ``t``.

        A step that starts before ``t`` completes, so :attr:`now` may end slightly past ``t``; the
        next call continues from there. Earlier or equal targets do nothing; a non-finite one
        raises :class:`ValueError`.
        """
        if not math.isfinite(t):
            raise ValueError(f"simulation target time must be finite, not {t}")
        if not t > self._horizon:
            return
        self._horizon = t
        while self._now < t:
            self._admit_arrivals()
            if self._running or self._waiting:
                self._step()
            else:
                self._now = min(self._arrivals.next_time, t)

    def step(self) -> bool:
        """Run exactly one engine step; an idle engine first jumps to the next arrival.

        Returns ``False`` (and does nothing) when the engine is idle and no request will ever
        arrive. Steps taken this way also move the target of :meth:`advance` along.
        """
        self._admit_arrivals()
        if not (self._running or self._waiting):
            next_time = self._arrivals.next_time
            if math.isinf(next_time):
                return False
            self._now = max(self._now, next_time)
            self._admit_arrivals()
        self._step()
        self._horizon = max(self._horizon, self._now)
        return True

    def _admit_arrivals(self) -> None:
        for arrival in self._arrivals.pop_due(self._now):
            self._waiting.append(_Request(next(self._ids), arrival))

    def state(self) -> EngineState:
        """Return the pool and queues as plain data."""
        return EngineState(
            now_s=self._now,
            phase=None if (p := self.scenario.traffic.phase_at(self._now)) is None else p.name,
            num_gpu_blocks=self.num_gpu_blocks,
            blocks_used=self._usable_blocks - self._pool.free,
            running=tuple(r.view() for r in self._running),
            waiting=tuple(r.view() for r in self._waiting),
        )

    def metrics(self) -> SimMetrics:
        """Return every counter, gauge and histogram as plain data."""
        return SimMetrics(
            now_s=self._now,
            num_requests_running=len(self._running),
            num_requests_waiting=len(self._waiting),
            kv_cache_usage=1.0 - self._pool.free / self._usable_blocks,
            num_preemptions=self._preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            prefix_cache_queries=self._prefix_cache_queries,
            request_success=dict(self._success),
            histograms={name: h.snapshot() for name, h in self._histograms.items()},
        )

    # -- one engine step ---------------------------------------------------------------------

    def _step(self) -> None:
        budget = self.scenario.engine.max_num_batched_tokens
        scheduled: list[tuple[_Request, int]] = []
        budget, preempted = self._schedule_running(scheduled, budget)
        if not preempted:  # vLLM V1 admits no new request in a step that had to preempt
            self._schedule_waiting(scheduled, budget)
        if scheduled:
            self._execute(scheduled)
        elif not preempted:
            # Cannot happen: with nothing running, the head of the queue always fits.
            raise RuntimeError("simulated scheduler made no progress")

    def _schedule_running(
        self, scheduled: list[tuple[_Request, int]], budget: int
    ) -> tuple[int, bool]:
        """Schedule running requests in admission order; preempt the newest when out of blocks."""
        block_size = self.scenario.engine.block_size
        running = self._running
        pool = self._pool
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            total = request.arrival.prompt_tokens + request.generated
            new = min(total - request.computed, budget)
            needed = -(-(request.computed + new) // block_size) - request.blocks
            while needed > pool.free:
                victim = running.pop()  # the newest running request
                self._preempt(victim)
                preempted = True
                if victim is request:
                    return budget, preempted
            pool.take(needed)
            request.blocks += needed
            scheduled.append((request, new))
            budget -= new
            i += 1
        return budget, preempted

    def _schedule_waiting(self, scheduled: list[tuple[_Request, int]], budget: int) -> None:
        """Admit waiting requests first come, first served while budget, seats and blocks allow."""
        engine = self.scenario.engine
        block_size = engine.block_size
        running = self._running
        waiting = self._waiting
        pool = self._pool
        while waiting and budget > 0 and len(running) < engine.max_num_seqs:
            request = waiting[0]
            total = request.arrival.prompt_tokens + request.generated
            # A preempted request finds what is left of its prefix in the cache; at least the
            # last token is always recomputed (vLLM needs its logits).
            segment = request.cached
            hit_blocks = 0 if segment is None else min(segment.count, (total - 1) // block_size)
            hit = hit_blocks * block_size
            new = min(total - hit, budget)
            needed = -(-(hit + new) // block_size)  # hit blocks included: they are free now
            if needed > pool.free:
                return  # the head of the queue blocks the rest
            waiting.popleft()
            if segment is not None:
                pool.reclaim(segment, hit_blocks)
                request.cached = None
            pool.take(needed - hit_blocks)
            request.blocks = needed
            request.computed = hit
            if request.scheduled_at < 0:
                request.scheduled_at = self._now
                self._prefix_cache_queries += request.arrival.prompt_tokens
            running.append(request)
            scheduled.append((request, new))
            budget -= new

    def _preempt(self, request: _Request) -> None:
        pool = self._pool
        if self._prefix_caching:
            # Tail first, as vLLM frees: the partial last block, then the full (cached) ones.
            full = request.computed // self.scenario.engine.block_size
            pool.give_back(request.blocks - full)
            request.cached = pool.give_back(full, owner=request)
        else:
            pool.give_back(request.blocks)
        request.blocks = 0
        request.computed = 0
        request.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(request)

    def _execute(self, scheduled: list[tuple[_Request, int]]) -> None:
        tokens = 0
        context = 0
        for request, new in scheduled:
            tokens += new
            context += request.computed + new
        end = self._now + step_duration_s(
            self.scenario.gpu, self.scenario.model, scheduled_tokens=tokens, context_tokens=context
        )

        hist = self._histograms
        ttft = hist[families.TIME_TO_FIRST_TOKEN]
        itl = hist[families.INTER_TOKEN_LATENCY]
        iteration_prompt = 0
        iteration_generated = 0
        finished = False
        for request, new in scheduled:
            request.computed += new
            arrival = request.arrival
            if request.computed < arrival.prompt_tokens + request.generated:
                continue  # a prefill chunk that did not reach the end of the prompt yet
            request.generated += 1
            iteration_generated += 1
            if request.first_token_at < 0:
                request.first_token_at = end
                iteration_prompt += arrival.prompt_tokens
                ttft.observe(end - arrival.time)
            else:
                itl.observe(end - request.last_token_at)
            request.last_token_at = end
            if request.generated >= arrival.output_tokens:
                self._finish(request, end)
                finished = True

        self._prompt_tokens += iteration_prompt
        self._generation_tokens += iteration_generated
        hist[families.ITERATION_TOKENS].observe(iteration_prompt + iteration_generated)
        if finished:
            self._running = [r for r in self._running if not r.finished]
        self._now = end

    def _finish(self, request: _Request, end: float) -> None:
        self._pool.give_back(request.blocks)
        request.blocks = 0
        request.finished = True
        arrival = request.arrival
        self._success[arrival.finished_reason] += 1
        hist = self._histograms
        generated = request.generated
        decode_s = end - request.first_token_at
        hist[families.PROMPT_TOKENS].observe(arrival.prompt_tokens)
        hist[families.GENERATION_TOKENS].observe(generated)
        hist[families.MAX_NUM_GENERATION_TOKENS].observe(generated)
        hist[families.PARAMS_N].observe(1)
        hist[families.PARAMS_MAX_TOKENS].observe(arrival.max_tokens)
        hist[families.E2E_LATENCY].observe(end - arrival.time)
        hist[families.QUEUE_TIME].observe(request.scheduled_at - arrival.time)
        hist[families.INFERENCE_TIME].observe(end - request.scheduled_at)
        hist[families.PREFILL_TIME].observe(request.first_token_at - request.scheduled_at)
        hist[families.DECODE_TIME].observe(decode_s)
        hist[families.TIME_PER_OUTPUT_TOKEN].observe(
            decode_s / (generated - 1) if generated > 1 else 0.0
        )
        hist[families.NUM_PREEMPTIONS].observe(request.preemptions)
        # No prefix-cache hits in the simulation: every prompt token is computed.
        hist[families.PREFILL_KV_COMPUTED].observe(arrival.prompt_tokens)
