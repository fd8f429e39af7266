"""A steppable, deterministic simulation of one vLLM V1 engine: paged KV blocks and its scheduler.

What it models, after vLLM V1's ``Scheduler``, ``KVCacheManager`` and ``BlockPool``:

- **Paged KV blocks.** The pool has ``num_gpu_blocks`` blocks of ``block_size`` tokens; one is
  vLLM's reserved null block, so running requests can hold at most ``num_gpu_blocks - 1``. A request
  references exactly ``ceil(computed_tokens / block_size)`` blocks: a new block is allocated each
  time it crosses a block boundary. Blocks are counted by reference: one that several requests
  reference is held once. ``kv_cache_usage_perc`` is ``1 - free / (num_gpu_blocks - 1)``, vLLM's
  own formula, where free blocks include cached ones nobody references.
- **Prefix caching** (``enable_prefix_caching``, vLLM V1's default). Every full block is cached
  under a key that stands for vLLM's chained block hash (:data:`BlockKey`) when it is allocated.
  A request being admitted looks up its leading full blocks and takes every one found up to the
  first miss, never its last token (vLLM needs its logits): at most ``(tokens - 1) //
  block_size`` whole blocks. It references those blocks instead of computing them, so N
  concurrent requests that start with the same prompt prefix hold its blocks once. A block whose
  last reference is dropped stays cached in the free queue, least recently freed first, until it
  is handed out again. What can hit: a shared system prompt (a traffic phase's
  :class:`~exporter.sim.traffic.SharedPrefix`), the prompt of a request's other samples (``n >
  1``), and a preempted request's own blocks; two unrelated prompts never share a block.
- **Parallel sampling.** A request with ``n > 1`` runs as ``n`` requests of its own (as in V1),
  queued together; each generates the request's output length, and all but the first usually
  find the prompt's full blocks in the cache.
- **Continuous batching.** Each step first schedules the running requests in admission order (one
  token each while decoding, the rest of the prompt in chunks while prefilling), then, if nothing
  was preempted, admits waiting requests first-come first-served while the token budget
  (``max_num_batched_tokens``), ``max_num_seqs`` and free blocks allow. Prefill is chunked and
  computes only the tokens the prefix cache did not supply.
- **Recompute preemption.** When a running request needs a block and none is free, the newest
  running request is preempted: its references are dropped, its progress is lost, and it goes
  back to the front of the waiting queue, to recompute its prompt and the tokens it already
  generated. Its full blocks stay cached until they are reused, so on re-admission it recomputes
  only what was evicted meanwhile.
- **Completion.** A request finishes when it has generated its output length; its references are
  dropped.

Checked against reality: replaying the load of the real 0.32.0 capture (12 requests of 101 + 380
tokens into its 1,024-token pool) reproduces every count vLLM reported, 15 preemptions and 2,044
engine steps included (``tests/sim/test_exposition.py``).

Time is simulated: a step lasts what :func:`exporter.sim.timing.step_duration_s` says, idle time
jumps to the next arrival, and nothing here reads a clock, sleeps, logs or does I/O. Given the same
scenario and seed the run is identical, however the caller slices time (``advance_to(10)`` equals
``advance_to(4); advance_to(10)``).

The metrics follow vLLM V1's definitions (``vllm/v1/metrics/stats.py``): prompt tokens are counted
when a request produces its first token (recomputation after a preemption is not counted again),
and so are its cached prompt tokens; prefix-cache queries and hits are counted when a request is
first admitted (lookups after a preemption are not); inter-token latency is observed per
generated token after the first; per-request histograms are observed when a request (a sample)
finishes, except ``request_params_n`` and ``request_max_num_generation_tokens``, observed once
per request when its last sample finishes; ``iteration_tokens_total`` once per step.

The engine keeps mutable state internally because copying hundreds of requests per step into new
frozen values would cost more CPU than the demo may spend; what it hands out (:class:`EngineState`,
:class:`SimMetrics`) is frozen plain data.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.core.snapshot import Histogram
from exporter.sim import families
from exporter.sim.scenario import num_gpu_blocks, validate
from exporter.sim.timing import step_duration_s
from exporter.sim.traffic import ArrivalSource

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from exporter.sim.scenario import Scenario
    from exporter.sim.traffic import Arrival, ArrivalStream


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request (one sample of it, when ``n > 1``) inside the engine, as plain data."""

    request_id: int
    #: The ``request_id`` of the request's first sample: its ``n`` samples share it.
    prompt_id: int
    prompt_tokens: int
    output_tokens: int
    #: Tokens generated so far.
    generated_tokens: int
    #: Tokens whose KV is computed (and held in blocks) right now.
    computed_tokens: int
    #: Blocks it references: ``ceil(computed_tokens / block_size)``, shared ones included.
    blocks: int
    #: The ids of those blocks, in token order (shared blocks have the same id in every sharer).
    block_ids: tuple[int, ...]
    #: Prompt tokens found in the prefix cache at its first admission (whole blocks).
    cached_tokens: int
    preemptions: int


@dataclass(frozen=True, slots=True)
class EngineState:
    """The engine's state at one moment: the pool and the two queues."""

    now_s: float
    #: Name of the traffic phase in force (``None`` after a one-shot profile ended).
    phase: str | None
    #: vLLM's ``num_gpu_blocks``: the null block included.
    num_gpu_blocks: int
    #: Blocks referenced by running requests, each counted once however many share it.
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
    #: ``vllm:prefix_cache_hits_total``: of those, tokens found in the cache (whole blocks).
    prefix_cache_hits: int
    #: ``vllm:prompt_tokens_cached_total``: the hits of requests that produced a first token,
    #: counted then, with :attr:`prompt_tokens`.
    prompt_tokens_cached: int
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


#: What a full block's KV is identified by, as vLLM's chained block hash does: two blocks with
#: one key hold the same tokens after the same tokens. ``("prefix", name, j)``: block ``j`` of a
#: shared system prompt; ``("prompt", prompt_id, j)``: block ``j`` of one request's prompt (its
#: ``n`` samples share it); ``("own", request_id, j)``: anything else, one sample's own tokens.
BlockKey = tuple[str, str | int, int]


class _BlockPool:
    """The usable KV blocks: reference counts, the free queue and the prefix cache, as vLLM's.

    A running request references its blocks; a block held by several (a shared prefix) is
    counted once. A full block is cached under its :data:`BlockKey` when it is allocated, and
    stays cached when its last reference is dropped: it joins the tail of the free queue (it is
    free: ``kv_cache_usage_perc`` does not count it) until the head of the queue reaches it and it
    is handed out again, which evicts it. References are dropped last block first, as vLLM frees,
    so eviction eats a cached prompt from its end and what is left of it stays a usable prefix.
    """

    __slots__ = ("cached", "free_queue", "key_of", "refs")

    def __init__(self, usable_blocks: int) -> None:
        self.refs = [0] * usable_blocks
        self.key_of: list[BlockKey | None] = [None] * usable_blocks
        # Insertion order is eviction order (least recently freed first); O(1) at both ends.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(usable_blocks))
        self.cached: dict[BlockKey, int] = {}

    @property
    def free(self) -> int:
        """Blocks no running request references (cached ones included)."""
        return len(self.free_queue)

    def allocate(self, n: int) -> list[int]:
        """Hand out ``n`` free blocks (``n <= free``) from the head, evicting their cached KV."""
        queue, refs, key_of = self.free_queue, self.refs, self.key_of
        blocks: list[int] = []
        for _ in range(n):
            block, _ = queue.popitem(last=False)
            key = key_of[block]
            if key is not None:
                del self.cached[key]
                key_of[block] = None
            refs[block] = 1
            blocks.append(block)
        return blocks

    def lookup(self, keys: Iterable[BlockKey]) -> list[int]:
        """Return the cached blocks of ``keys`` up to the first key that is not cached."""
        cached = self.cached
        hits: list[int] = []
        for key in keys:
            block = cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Iterable[int]) -> None:
        """Add a reference to cached blocks a request hit (taking free ones off the queue)."""
        refs = self.refs
        for block in blocks:
            if refs[block] == 0:
                del self.free_queue[block]
            refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop a reference to each block, the last first; unreferenced ones become free."""
        refs, queue = self.refs, self.free_queue
        for block in reversed(blocks):
            refs[block] -= 1
            if refs[block] == 0:
                queue[block] = None

    def cache(self, block: int, key: BlockKey) -> None:
        """Cache a newly full block under ``key``, unless another block already holds that KV.

        vLLM keeps such duplicates (two requests that computed the same prefix at once) under
        one hash; here the first stays the one found, and the duplicate is an uncached block.
        """
        if key not in self.cached:
            self.cached[key] = block
            self.key_of[block] = key


class _Parent:
    """The ``n`` samples of one request: how many are still running, the longest output."""

    __slots__ = ("max_generated", "remaining")

    def __init__(self, n: int) -> None:
        self.remaining = n
        self.max_generated = 0


class _Request:
    """A request's (one sample's) mutable progress inside the engine."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached_tokens",
        "computed",
        "finished",
        "first_token_at",
        "generated",
        "last_token_at",
        "parent",
        "preemptions",
        "prefix_blocks",
        "prefix_name",
        "prompt_blocks",
        "prompt_id",
        "registered",
        "request_id",
        "scheduled_at",
    )

    def __init__(
        self,
        request_id: int,
        arrival: Arrival,
        *,
        block_size: int,
        prompt_id: int,
        parent: _Parent | None,
    ) -> None:
        self.request_id = request_id
        self.arrival = arrival
        self.prompt_id = prompt_id
        self.parent = parent
        prefix = arrival.shared_prefix
        self.prefix_name = "" if prefix is None else prefix.name
        self.prefix_blocks = arrival.prefix_tokens // block_size
        self.prompt_blocks = arrival.prompt_tokens // block_size
        self.generated = 0
        self.computed = 0
        #: Block ids it references, in token order: ``ceil(computed / block_size)`` of them.
        self.blocks: list[int] = []
        #: How many of its leading blocks were full and offered to the prefix cache.
        self.registered = 0
        #: Prompt tokens found in the prefix cache when it was first scheduled.
        self.cached_tokens = 0
        self.finished = False
        self.preemptions = 0
        self.scheduled_at = -1.0
        self.first_token_at = -1.0
        self.last_token_at = -1.0

    def block_key(self, j: int) -> BlockKey:
        """The prefix-cache key of its ``j``-th full block (see :data:`BlockKey`)."""
        if j < self.prefix_blocks:
            return ("prefix", self.prefix_name, j)
        if j < self.prompt_blocks:
            return ("prompt", self.prompt_id, j)
        return ("own", self.request_id, j)

    def view(self) -> RequestView:
        return RequestView(
            request_id=self.request_id,
            prompt_id=self.prompt_id,
            prompt_tokens=self.arrival.prompt_tokens,
            output_tokens=self.arrival.output_tokens,
            generated_tokens=self.generated,
            computed_tokens=self.computed,
            blocks=len(self.blocks),
            block_ids=tuple(self.blocks),
            cached_tokens=self.cached_tokens,
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
        self._prefix_cache_hits = 0
        self._prompt_tokens_cached = 0
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
        block_size = self.scenario.engine.block_size
        for arrival in self._arrivals.pop_due(self._now):
            # vLLM V1 runs a request's n samples as n requests of their own, queued together;
            # they share the prompt's blocks through the prefix cache.
            parent = _Parent(arrival.n) if arrival.n > 1 else None
            prompt_id = -1
            for _ in range(arrival.n):
                request_id = next(self._ids)
                prompt_id = request_id if prompt_id < 0 else prompt_id
                self._waiting.append(
                    _Request(
                        request_id,
                        arrival,
                        block_size=block_size,
                        prompt_id=prompt_id,
                        parent=parent,
                    )
                )

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
            prefix_cache_hits=self._prefix_cache_hits,
            prompt_tokens_cached=self._prompt_tokens_cached,
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
        caching = self._prefix_caching
        running = self._running
        pool = self._pool
        preempted = False
        i = 0
        # The hottest loop of the simulation (every running request, every step): kept lean.
        while i < len(running) and budget > 0:
            request = running[i]
            total = request.arrival.prompt_tokens + request.generated
            new = min(total - request.computed, budget)
            end = request.computed + new
            needed = -(-end // block_size) - len(request.blocks)
            if needed:
                while needed > pool.free:
                    victim = running.pop()  # the newest running request
                    self._preempt(victim)
                    preempted = True
                    if victim is request:
                        return budget, preempted
                request.blocks += pool.allocate(needed)
            if caching and end // block_size > request.registered:
                self._cache_full_blocks(request, end)
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
            hits = self._cache_hits(request, total)
            hit = len(hits) * block_size
            new = min(total - hit, budget)
            fresh = -(-(hit + new) // block_size) - len(hits)
            # Hit blocks nobody references sit in the free queue: taking them uses free blocks.
            evictable = sum(1 for block in hits if pool.refs[block] == 0)
            if fresh + evictable > pool.free:
                return  # the head of the queue blocks the rest
            waiting.popleft()
            pool.touch(hits)
            request.blocks = hits + pool.allocate(fresh)
            request.registered = len(hits)
            request.computed = hit
            self._cache_full_blocks(request, hit + new)
            if request.scheduled_at < 0:
                # vLLM counts the lookup of a request's first admission only (not after a
                # preemption), at admission.
                request.scheduled_at = self._now
                request.cached_tokens = hit
                self._prefix_cache_queries += request.arrival.prompt_tokens
                self._prefix_cache_hits += hit
            running.append(request)
            scheduled.append((request, new))
            budget -= new

    def _cache_hits(self, request: _Request, total: int) -> list[int]:
        """The request's leading full blocks found in the prefix cache, as vLLM looks them up.

        At least the last token is always recomputed (vLLM needs its logits), so the hit stops
        at the last full block before it: ``(total - 1) // block_size`` blocks at most.
        """
        if not self._prefix_caching:
            return []
        most = (total - 1) // self.scenario.engine.block_size
        return self._pool.lookup(request.block_key(j) for j in range(most))

    def _cache_full_blocks(self, request: _Request, tokens: int) -> None:
        """Offer the blocks that ``tokens`` fill to the prefix cache, as vLLM does at allocation.

        Cached at scheduling, before the step computes them: a request admitted later in the
        same step already hits them, as in vLLM.
        """
        full = tokens // self.scenario.engine.block_size
        if full <= request.registered or not self._prefix_caching:
            return
        pool = self._pool
        blocks = request.blocks
        for j in range(request.registered, full):
            pool.cache(blocks[j], request.block_key(j))
        request.registered = full

    def _preempt(self, request: _Request) -> None:
        # Its full blocks stay cached in the free queue (prefix caching on, vLLM V1's default),
        # so on re-admission it recomputes only what was evicted meanwhile.
        self._pool.release(request.blocks)
        request.blocks = []
        request.registered = 0
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
        iteration_cached = 0
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
                iteration_cached += request.cached_tokens
                ttft.observe(end - arrival.time)
            else:
                itl.observe(end - request.last_token_at)
            request.last_token_at = end
            if request.generated >= arrival.output_tokens:
                self._finish(request, end)
                finished = True

        self._prompt_tokens += iteration_prompt
        self._prompt_tokens_cached += iteration_cached
        self._generation_tokens += iteration_generated
        hist[families.ITERATION_TOKENS].observe(iteration_prompt + iteration_generated)
        if finished:
            self._running = [r for r in self._running if not r.finished]
        self._now = end

    def _finish(self, request: _Request, end: float) -> None:
        self._pool.release(request.blocks)
        request.blocks = []
        request.finished = True
        arrival = request.arrival
        self._success[arrival.finished_reason] += 1
        hist = self._histograms
        generated = request.generated
        decode_s = end - request.first_token_at
        hist[families.PROMPT_TOKENS].observe(arrival.prompt_tokens)
        hist[families.GENERATION_TOKENS].observe(generated)
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
        hist[families.PREFILL_KV_COMPUTED].observe(arrival.prompt_tokens - request.cached_tokens)
        # ``n`` and the longest output are observed once per request, when its last sample ends.
        parent = request.parent
        if parent is None:
            hist[families.MAX_NUM_GENERATION_TOKENS].observe(generated)
            hist[families.PARAMS_N].observe(1)
            return
        parent.remaining -= 1
        parent.max_generated = max(parent.max_generated, generated)
        if parent.remaining == 0:
            hist[families.MAX_NUM_GENERATION_TOKENS].observe(parent.max_generated)
            hist[families.PARAMS_N].observe(arrival.n)
