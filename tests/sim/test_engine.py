"""The simulated vLLM V1 engine: block accounting, scheduling, preemption, metrics consistency."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sim import families
from exporter.sim.engine import SimMetrics, Simulation
from exporter.sim.scenario import (
    Scenario,
    SimEngineConfig,
    SimModel,
    default_scenario,
    num_gpu_blocks,
)
from exporter.sim.traffic import (
    Arrival,
    LengthDistribution,
    ScriptedArrivals,
    SharedPrefix,
    TrafficPhase,
    TrafficProfile,
)

PER_REQUEST = (
    families.PROMPT_TOKENS,
    families.GENERATION_TOKENS,
    families.MAX_NUM_GENERATION_TOKENS,
    families.PARAMS_N,
    families.PARAMS_MAX_TOKENS,
    families.TIME_PER_OUTPUT_TOKEN,
    families.E2E_LATENCY,
    families.QUEUE_TIME,
    families.INFERENCE_TIME,
    families.PREFILL_TIME,
    families.DECODE_TIME,
    families.NUM_PREEMPTIONS,
    families.PREFILL_KV_COMPUTED,
)

# A tiny model: 2 layers x 2 KV heads x head_dim 64 x 2 (K, V) x 2 bytes = 1,024 bytes per token.
TINY_MODEL = SimModel(
    served_name="simulated/tiny",
    num_layers=2,
    num_kv_heads=2,
    head_dim=64,
    num_parameters=1e8,
    weights_bytes=200_000_000,
)


def phase(
    rate: float,
    *,
    duration: float = 60.0,
    prompt: tuple[int, int] = (16, 200),
    output: tuple[int, int] = (1, 200),
    name: str = "calm",
) -> TrafficPhase:
    """A phase with log-normal lengths spread over the given ranges."""
    return TrafficPhase(
        name=name,
        duration_s=duration,
        arrivals_per_s=rate,
        prompt_tokens=LengthDistribution(
            median=math.sqrt(prompt[0] * prompt[1]), sigma=0.8, minimum=prompt[0], maximum=prompt[1]
        ),
        output_tokens=LengthDistribution(
            median=math.sqrt(output[0] * output[1]), sigma=0.8, minimum=output[0], maximum=output[1]
        ),
        max_tokens=output[1],
    )


def tiny(
    *phases: TrafficPhase,
    blocks: int = 64,
    block_size: int = 16,
    max_model_len: int = 512,
    max_num_seqs: int = 32,
    max_num_batched_tokens: int = 256,
    prefix_caching: bool = True,
) -> Scenario:
    """A small scenario (``blocks`` blocks of the tiny model) that runs fast in tests."""
    engine = SimEngineConfig(
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_cache_memory_bytes=blocks * block_size * TINY_MODEL.bytes_per_token,
        enable_prefix_caching=prefix_caching,
    )
    profile = TrafficProfile(phases=phases or (phase(20.0),), repeat=True)
    return Scenario(model=TINY_MODEL, engine=engine, traffic=profile)


def overloaded() -> Scenario:
    """Long requests arriving much faster than 64 blocks can hold them: constant preemption."""
    return tiny(phase(30.0, prompt=(64, 300), output=(20, 200)))


SYSTEM = SharedPrefix("system", tokens=64, fraction=1.0)


def arrival(
    t: float, prompt: int, output: int, *, prefix: SharedPrefix | None = None, n: int = 1
) -> Arrival:
    """A scripted request that stops by itself after ``output`` tokens (prefix included)."""
    return Arrival(
        time=t,
        prompt_tokens=prompt,
        output_tokens=output,
        max_tokens=1000,
        finished_reason="stop",
        n=n,
        shared_prefix=prefix,
    )


def assert_pool_consistent(sim: Simulation) -> None:
    """Every invariant of the paged block pool at one moment."""
    state = sim.state()
    block_size = sim.scenario.engine.block_size
    referenced = {block for r in state.running for block in r.block_ids}
    assert 0 <= state.blocks_used <= state.num_gpu_blocks - 1
    assert len(referenced) == state.blocks_used  # a shared block is held once
    assert sum(r.blocks for r in state.running) >= state.blocks_used
    for request in state.running:
        assert request.blocks == len(request.block_ids) == len(set(request.block_ids))
        assert request.blocks == -(-request.computed_tokens // block_size)
        assert 0 < request.computed_tokens <= request.prompt_tokens + request.generated_tokens
        assert request.cached_tokens % block_size == 0
        assert request.cached_tokens < request.prompt_tokens
    for request in state.waiting:
        assert request.blocks == 0
    assert len(state.running) <= sim.scenario.engine.max_num_seqs


def counters(m: SimMetrics) -> list[float]:
    """Every cumulative value of a metrics snapshot, flattened in a fixed order."""
    values: list[float] = [
        m.num_preemptions,
        m.prompt_tokens,
        m.generation_tokens,
        m.prefix_cache_queries,
        m.prefix_cache_hits,
        m.prompt_tokens_cached,
        *(m.request_success[r] for r in families.FINISHED_REASONS),
    ]
    for name in sorted(m.histograms):
        h = m.histograms[name]
        values.extend((*h.cumulative, h.count, h.sum))
    return values


# -- block accounting ------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    blocks=st.integers(40, 120),
    block_size=st.sampled_from([1, 4, 16, 32]),
    rate=st.floats(1.0, 40.0),
    budget=st.integers(16, 512),
    seqs=st.integers(1, 64),
    prefix_caching=st.booleans(),
    prefix=st.sampled_from([None, SharedPrefix("s", 40, 0.5), SharedPrefix("s", 200, 0.9)]),
    n=st.sampled_from([1, 1, 3]),
)
def test_block_accounting_never_exceeds_the_pool(
    *,
    seed: int,
    blocks: int,
    block_size: int,
    rate: float,
    budget: int,
    seqs: int,
    prefix_caching: bool,
    prefix: SharedPrefix | None,
    n: int,
) -> None:
    """Blocks held never exceed blocks - 1, each counted once, ceil(computed / size) a request."""
    traffic = phase(rate, prompt=(1, 300), output=(1, 200))
    scenario = tiny(
        dataclasses.replace(traffic, shared_prefix=prefix, n=n),
        blocks=max(blocks, -(-512 // block_size) + 1),
        block_size=block_size,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        prefix_caching=prefix_caching,
    )
    sim = Simulation(scenario, seed=seed)
    for t in range(1, 21):
        sim.advance_to(t * 0.5)
        assert_pool_consistent(sim)


def test_usage_ratio_is_blocks_held_over_usable_blocks() -> None:
    """kv_cache_usage is blocks held by running requests over num_gpu_blocks - 1 (null block)."""
    sim = Simulation(overloaded(), seed=3)
    seen_full = False
    for t in range(1, 41):
        sim.advance_to(t * 0.25)
        state, m = sim.state(), sim.metrics()
        assert m.kv_cache_usage == pytest.approx(state.blocks_used / (state.num_gpu_blocks - 1))
        seen_full |= state.blocks_used == state.num_gpu_blocks - 1
    assert seen_full, "an overloaded pool should fill every usable block"


def test_pool_is_empty_once_all_requests_finished() -> None:
    """When the last request finishes every block is free again and usage is zero."""
    sim = Simulation(
        tiny(), arrivals=ScriptedArrivals([arrival(0.0, 100, 30), arrival(0.01, 50, 10)])
    )
    sim.advance_to(60.0)
    m = sim.metrics()
    assert m.request_success["stop"] == 2
    assert sim.state().blocks_used == 0
    assert m.kv_cache_usage == 0.0


# -- scheduling ------------------------------------------------------------------------------


def test_newest_running_request_is_preempted_to_the_front_of_the_queue() -> None:
    """Out of blocks, the newest running request is preempted, freed and queued first."""
    # 8 blocks of 16 tokens, 7 usable. Three 32-token prompts take 2 blocks each; after their
    # first token each needs a third block: A takes the last free one, B must preempt C.
    scripted = [arrival(0.0, 32, 30), arrival(0.0, 32, 30), arrival(0.0, 32, 30)]
    sim = Simulation(tiny(blocks=8, max_model_len=64), arrivals=ScriptedArrivals(scripted))
    assert sim.step()
    first = sim.state()
    assert [r.request_id for r in first.running] == [0, 1, 2]
    assert first.blocks_used == 6
    assert sim.step()
    second = sim.state()
    assert [r.request_id for r in second.running] == [0, 1]
    assert [r.blocks for r in second.running] == [3, 3]
    assert [r.request_id for r in second.waiting] == [2]
    preempted = second.waiting[0]
    assert (preempted.preemptions, preempted.blocks, preempted.computed_tokens) == (1, 0, 0)
    assert preempted.generated_tokens == 1  # kept: recompute, not restart
    assert sim.metrics().num_preemptions == 1
    assert_pool_consistent(sim)


def test_preempted_requests_queue_ahead_of_older_waiting_ones() -> None:
    """Each preempted request goes to the front of the queue, before requests never scheduled."""
    # 7 usable blocks: A, B, C (2 blocks each) and D (1 block) fill the pool in step one. In
    # step two A preempts D and B preempts C: the queue becomes C, D.
    scripted = [arrival(0.0, 32, 30), arrival(0.0, 32, 30), arrival(0.0, 32, 30)]
    scripted.append(arrival(0.0, 16, 5))
    sim = Simulation(tiny(blocks=8, max_model_len=64), arrivals=ScriptedArrivals(scripted))
    sim.step()
    assert sim.state().blocks_used == 7
    sim.step()
    state = sim.state()
    assert [r.request_id for r in state.running] == [0, 1]
    assert [r.request_id for r in state.waiting] == [2, 3]
    assert sim.metrics().num_preemptions == 2


def test_no_admission_in_a_step_that_preempted() -> None:
    """Like vLLM V1, a step that had to preempt admits nothing, even a request that would fit."""
    # Token budget 32, no prefix cache: B's prompt (80 tokens) is prefilled in chunks and fills
    # the pool with A; B's second output token needs a sixth block, B preempts itself. Its first
    # chunk would fit in the blocks it just freed, but it waits for the next step.
    scenario = tiny(blocks=8, max_model_len=112, max_num_batched_tokens=32, prefix_caching=False)
    scripted = [arrival(0.0, 16, 60), arrival(0.0, 80, 30)]
    sim = Simulation(scenario, arrivals=ScriptedArrivals(scripted))
    for _ in range(20):
        sim.step()
        if sim.metrics().num_preemptions:
            break
    state = sim.state()
    assert sim.metrics().num_preemptions == 1
    assert [r.request_id for r in state.running] == [0]
    assert [r.request_id for r in state.waiting] == [1]
    assert state.num_gpu_blocks - 1 - state.blocks_used >= 2  # room for a 31-token chunk
    sim.step()
    assert [r.request_id for r in sim.state().running] == [0, 1]


@pytest.mark.parametrize(("prefix_caching", "computed"), [(True, 16 + 40), (False, 40)])
def test_preempted_request_reuses_its_cached_prefix(prefix_caching: bool, computed: int) -> None:
    """With prefix caching, a re-admitted request skips the full blocks still in the cache."""
    # 5 usable blocks, token budget 40. Step 1: A's 16-token prompt, B's first 24-token chunk.
    # Step 2: B's next chunk needs two blocks, one is free: B (newest) preempts itself with one
    # full block cached; A finishes. Step 3: B is re-admitted and computes a 40-token chunk, on
    # top of its 16 cached tokens when prefix caching is on.
    scenario = tiny(
        blocks=6, max_model_len=80, max_num_batched_tokens=40, prefix_caching=prefix_caching
    )
    scripted = [arrival(0.0, 16, 2), arrival(0.0, 64, 5)]
    sim = Simulation(scenario, arrivals=ScriptedArrivals(scripted))
    sim.step()
    sim.step()
    assert sim.metrics().num_preemptions == 1
    assert sim.metrics().request_success["stop"] == 1
    sim.step()
    (b,) = sim.state().running
    assert b.computed_tokens == computed
    assert sim.metrics().prefix_cache_queries == 16 + 64  # counted once per request
    assert_pool_consistent(sim)


def test_prefill_is_chunked_by_the_token_budget() -> None:
    """A prompt longer than max_num_batched_tokens is prefilled over several steps."""
    sim = Simulation(
        tiny(max_num_batched_tokens=64), arrivals=ScriptedArrivals([arrival(0.0, 150, 3)])
    )
    sim.step()
    assert sim.state().running[0].computed_tokens == 64
    assert sim.metrics().generation_tokens == 0
    sim.step()
    assert sim.state().running[0].computed_tokens == 128
    sim.step()  # the last 22 prompt tokens: the first output token comes out
    assert sim.state().running[0].generated_tokens == 1
    assert sim.metrics().prompt_tokens == 150


def test_max_num_seqs_caps_the_running_batch() -> None:
    """No more than max_num_seqs requests run at once, however many wait and blocks are free."""
    scripted = [arrival(0.0, 16, 50) for _ in range(10)]
    sim = Simulation(tiny(max_num_seqs=3), arrivals=ScriptedArrivals(scripted))
    for _ in range(20):
        sim.step()
        assert len(sim.state().running) <= 3
    state = sim.state()
    assert len(state.running) == 3
    assert len(state.waiting) == 7
    assert state.num_gpu_blocks - 1 - state.blocks_used > 7 * 2  # room for all the waiting


# -- prefix caching: shared prefixes and parallel sampling -----------------------------------


def test_prefix_hits_are_whole_blocks_of_the_prefix_and_never_the_last_token() -> None:
    """A hit stops at the prefix's last full block and always leaves the prompt's last token."""
    odd = SharedPrefix("odd", tokens=40, fraction=1.0)  # two full blocks of 16, then 8 tokens
    scripted = [
        arrival(0.0, 74, 50, prefix=SYSTEM),  # the first computes the 64-token prefix
        arrival(0.0, 74, 50, prefix=SYSTEM),  # 4 whole blocks: 64 tokens
        arrival(0.0, 64, 50, prefix=SYSTEM),  # the prompt is the prefix: 3 blocks, not 4
        arrival(0.0, 100, 50, prefix=odd),
        arrival(0.0, 100, 50, prefix=odd),  # 2 blocks: the prefix's partial block is not shared
        arrival(0.0, 100, 50),  # no prefix: nothing to hit
    ]
    sim = Simulation(tiny(max_num_batched_tokens=1024), arrivals=ScriptedArrivals(scripted))
    sim.step()
    assert [r.cached_tokens for r in sim.state().running] == [0, 64, 48, 0, 32, 0]
    m = sim.metrics()
    assert m.prefix_cache_hits == 64 + 48 + 32
    assert m.prefix_cache_queries == 74 + 74 + 64 + 100 + 100 + 100
    assert_pool_consistent(sim)


def test_concurrent_sharers_hold_the_prefix_once() -> None:
    """Four requests on one 64-token prefix reference its 4 blocks once: 8 blocks used, not 20."""

    def after_first_step(prefix: SharedPrefix | None) -> Simulation:
        scripted = [arrival(0.0, 80, 30, prefix=prefix) for _ in range(4)]
        sim = Simulation(tiny(max_num_batched_tokens=512), arrivals=ScriptedArrivals(scripted))
        sim.step()
        return sim

    shared, unshared = after_first_step(SYSTEM), after_first_step(None)
    running = shared.state().running
    assert len({r.block_ids[:4] for r in running}) == 1  # the same four blocks in every sharer
    assert [r.blocks for r in running] == [5, 5, 5, 5]
    assert shared.state().blocks_used == 4 + 4 * 1
    assert unshared.state().blocks_used == 4 * 5
    assert shared.metrics().kv_cache_usage == pytest.approx(8 / 63)
    assert unshared.metrics().kv_cache_usage == pytest.approx(20 / 63)
    assert_pool_consistent(shared)


def test_a_prefix_nobody_references_stays_cached_as_free_blocks_until_handed_out() -> None:
    """Once its last sharer ends the prefix counts as free yet still hits; reuse evicts its end."""
    first = arrival(0.0, 80, 2, prefix=SYSTEM)
    later = arrival(5.0, 80, 2, prefix=SYSTEM)
    # 11 usable blocks: a 150-token request (10 blocks) must take most of the freed prefix.
    filler = arrival(1.0, 150, 2)

    def later_cached_tokens(scripted: list[Arrival]) -> int:
        sim = Simulation(tiny(blocks=12, max_model_len=160), arrivals=ScriptedArrivals(scripted))
        sim.advance_to(4.0)
        assert sim.metrics().kv_cache_usage == 0.0  # every block is free, cached or not
        sim.step()
        (request,) = sim.state().running
        return request.cached_tokens

    assert later_cached_tokens([first, later]) == 64
    # The filler took blocks from the head of the free queue; the prefix's blocks were freed
    # last first, so its end went first and its first block still hits.
    assert later_cached_tokens([first, filler, later]) == 16


def test_prefill_computes_only_the_tokens_the_cache_did_not_supply() -> None:
    """With a 32-token budget a 74-token prompt takes 3 steps; after a 64-token hit, one."""
    scripted = [arrival(0.0, 74, 3, prefix=SYSTEM), arrival(1.0, 74, 3, prefix=SYSTEM)]
    sim = Simulation(tiny(max_num_batched_tokens=32), arrivals=ScriptedArrivals(scripted))
    for _ in range(3):
        sim.step()
    assert sim.metrics().generation_tokens == 1
    while sim.metrics().request_success["stop"] < 1:
        sim.step()
    sim.step()  # the second request: 10 tokens to compute, and its first token comes out
    (second,) = sim.state().running
    assert (second.cached_tokens, second.computed_tokens, second.generated_tokens) == (64, 74, 1)
    while sim.step():
        pass
    m = sim.metrics()
    assert m.prompt_tokens == 2 * 74
    assert m.prompt_tokens_cached == m.prefix_cache_hits == 64
    assert m.histograms[families.PREFILL_KV_COMPUTED].sum == 74 + 10


def test_n_samples_run_as_sequences_that_share_the_prompt() -> None:
    """n = 3 runs three sequences on one prompt's blocks; n is observed once, when all end."""
    scripted = [arrival(0.0, 64, 5, n=3)]
    sim = Simulation(tiny(max_num_batched_tokens=512), arrivals=ScriptedArrivals(scripted))
    sim.step()
    state = sim.state()
    assert [r.prompt_id for r in state.running] == [0, 0, 0]
    # The last token is recomputed: 3 of the prompt's 4 blocks are shared, each sample has one.
    assert [r.cached_tokens for r in state.running] == [0, 48, 48]
    assert state.blocks_used == 4 + 2 * 1
    assert_pool_consistent(sim)
    while sim.step():
        pass
    m = sim.metrics()
    assert m.request_success["stop"] == 3  # vLLM V1 counts every sample as a request
    assert m.prompt_tokens == 3 * 64
    assert m.prefix_cache_hits == 2 * 48
    assert m.histograms[families.PROMPT_TOKENS].count == 3
    n = m.histograms[families.PARAMS_N]
    assert (n.count, n.sum) == (1, 3)
    longest = m.histograms[families.MAX_NUM_GENERATION_TOKENS]
    assert (longest.count, longest.sum) == (1, 5)


def test_request_completes_at_its_output_length() -> None:
    """A request finishes after generating exactly its output length, then frees its blocks."""
    sim = Simulation(tiny(), arrivals=ScriptedArrivals([arrival(0.0, 10, 5)]))
    steps = 0
    while sim.step():
        steps += 1
    m = sim.metrics()
    assert steps == 5  # one prefill step yielding the first token, then four decode steps
    assert (m.generation_tokens, m.prompt_tokens, m.request_success["stop"]) == (5, 10, 1)
    assert m.histograms[families.GENERATION_TOKENS].sum == 5
    assert m.histograms[families.INTER_TOKEN_LATENCY].count == 4
    assert m.num_requests_running == m.num_requests_waiting == 0


def test_preempted_request_recomputes_and_still_finishes() -> None:
    """A preempted request comes back, recomputes, finishes, and its preemption is recorded."""
    scripted = [arrival(0.0, 32, 30), arrival(0.0, 32, 30), arrival(0.0, 32, 30)]
    sim = Simulation(tiny(blocks=8, max_model_len=64), arrivals=ScriptedArrivals(scripted))
    while sim.step():
        assert_pool_consistent(sim)
    m = sim.metrics()
    assert m.request_success["stop"] == 3
    assert m.generation_tokens == 90
    assert m.prompt_tokens == 96  # recomputation is not counted as prompt tokens again
    hist = m.histograms[families.NUM_PREEMPTIONS]
    assert hist.sum == m.num_preemptions >= 1


# -- traffic: burst and calm -----------------------------------------------------------------


def test_default_short_phase_fills_max_num_seqs_while_the_pool_stays_mostly_free() -> None:
    """The demo's first minute: about 256 short requests run, more queue, the pool is 80 % free."""
    sim = Simulation(default_scenario(), seed=0)
    sim.advance_to(50.0)
    m = sim.metrics()
    slots = default_scenario().engine.max_num_seqs
    # Sequences that finished in the last step leave their slot empty until the next one.
    assert slots - 8 <= m.num_requests_running <= slots
    assert m.num_requests_waiting > 100
    assert m.kv_cache_usage < 0.2


def test_default_agents_hold_their_system_prompt_once() -> None:
    """In the agents phase most prompt tokens hit the cache and sharers hold far fewer blocks."""
    sim = Simulation(default_scenario(), seed=0)
    sim.advance_to(150.0)
    before = sim.metrics()
    assert before.prefix_cache_hits == 0  # nothing shared before the agents arrive
    sim.advance_to(205.0)
    m, state = sim.metrics(), sim.state()
    hits = m.prefix_cache_hits - before.prefix_cache_hits
    queries = m.prefix_cache_queries - before.prefix_cache_queries
    assert hits > 0.7 * queries
    referenced = sum(r.blocks for r in state.running)
    assert referenced > 3 * state.blocks_used


def test_default_burst_preempts_and_the_calm_after_it_drains() -> None:
    """No preemption before the burst, some after it, none once the calm has drained the queue."""
    sim = Simulation(default_scenario(), seed=0)
    sim.advance_to(210.0)  # short, chat and agents
    assert sim.metrics().num_preemptions == 0
    peak = 0.0
    for t in range(215, 301, 5):
        sim.advance_to(float(t))
        peak = max(peak, sim.metrics().kv_cache_usage)
    assert peak > 0.98
    assert sim.metrics().num_preemptions > 0
    sim.advance_to(330.0)  # the end of the calm phase: the cycle starts again
    drained = sim.metrics()
    assert drained.num_requests_waiting == 0
    sim.advance_to(540.0)  # the next burst starts at 540 s
    assert sim.metrics().num_preemptions == drained.num_preemptions


def test_chat_traffic_alone_never_preempts() -> None:
    """Five minutes of the default chat traffic alone never runs out of blocks."""
    default = default_scenario()
    (chat,) = (p for p in default.traffic.phases if p.name == "chat")
    scenario = dataclasses.replace(default, traffic=TrafficProfile(phases=(chat,), repeat=True))
    sim = Simulation(scenario, seed=1)
    sim.advance_to(300.0)
    m = sim.metrics()
    assert m.num_preemptions == 0
    assert sum(m.request_success.values()) > 1000


def test_simulation_costs_well_under_five_percent_of_a_core() -> None:
    """Five simulated minutes of the default scenario (burst included) take under 15 s of CPU."""
    sim = Simulation(default_scenario(), seed=2)
    start = time.process_time()
    sim.advance_to(300.0)
    assert time.process_time() - start < 0.05 * 300.0


# -- metrics ---------------------------------------------------------------------------------


def test_counters_and_buckets_never_decrease() -> None:
    """Every counter, bucket, count and sum is monotonic over an overloaded run."""
    sim = Simulation(overloaded(), seed=5)
    previous = counters(sim.metrics())
    for t in range(1, 41):
        sim.advance_to(t * 0.5)
        current = counters(sim.metrics())
        assert all(c >= p for c, p in zip(current, previous, strict=True))
        previous = current
    assert sim.metrics().num_preemptions > 0


def test_histograms_are_consistent_with_the_counters() -> None:
    """Per-request histograms count finished requests; buckets are cumulative; sums add up."""
    sim = Simulation(overloaded(), seed=7)
    sim.advance_to(15.0)
    m = sim.metrics()
    finished = sum(m.request_success.values())
    assert finished > 0
    assert m.num_preemptions > 0
    for name, h in m.histograms.items():
        assert all(b <= a for b, a in zip(h.cumulative, h.cumulative[1:], strict=False)), name
        assert h.cumulative[-1] == h.count, name
        assert math.isinf(h.bounds[-1]), name
    for name in PER_REQUEST:
        assert m.histograms[name].count == finished, name
    ttft = m.histograms[families.TIME_TO_FIRST_TOKEN]
    assert finished <= ttft.count <= finished + m.num_requests_running + m.num_requests_waiting
    # Every generated token but each request's first is an inter-token latency sample.
    assert m.histograms[families.INTER_TOKEN_LATENCY].count == m.generation_tokens - ttft.count
    # Each step observes the prompt tokens of first tokens plus the tokens generated.
    iteration = m.histograms[families.ITERATION_TOKENS]
    assert iteration.sum == m.prompt_tokens + m.generation_tokens
    assert m.histograms[families.NUM_PREEMPTIONS].sum <= m.num_preemptions
    assert m.histograms[families.PROMPT_TOKENS].sum <= m.prompt_tokens
    assert m.histograms[families.GENERATION_TOKENS].sum <= m.generation_tokens


def test_latency_histograms_fit_together() -> None:
    """Queue + prefill + decode time sum to the end-to-end latency over finished requests."""
    sim = Simulation(overloaded(), seed=11)
    sim.advance_to(10.0)
    h = sim.metrics().histograms
    parts = h[families.QUEUE_TIME].sum + h[families.PREFILL_TIME].sum + h[families.DECODE_TIME].sum
    assert parts == pytest.approx(h[families.E2E_LATENCY].sum)
    inference = h[families.INFERENCE_TIME].sum
    assert inference == pytest.approx(h[families.PREFILL_TIME].sum + h[families.DECODE_TIME].sum)


# -- determinism -----------------------------------------------------------------------------


def test_same_seed_gives_the_same_run_and_another_seed_does_not() -> None:
    """Two simulations with one seed agree exactly; a different seed gives different traffic."""
    a, b, c = (Simulation(overloaded(), seed=s) for s in (42, 42, 43))
    for sim in (a, b, c):
        sim.advance_to(8.0)
    assert a.metrics() == b.metrics()
    assert a.state() == b.state()
    assert a.metrics() != c.metrics()


@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.floats(0.0, 6.0, allow_nan=False), max_size=12))
def test_slicing_time_does_not_change_the_run(cuts: list[float]) -> None:
    """Advancing through any intermediate targets ends exactly where one jump does."""
    whole = Simulation(overloaded(), seed=9)
    whole.advance_to(6.0)
    sliced = Simulation(overloaded(), seed=9)
    for t in sorted(cuts):
        sliced.advance_to(t)
    sliced.advance_to(6.0)
    assert sliced.metrics() == whole.metrics()


def test_advance_moves_past_the_previous_target() -> None:
    """advance(dt) continues from the last target, so steps of dt add up like advance_to."""
    a = Simulation(overloaded(), seed=4)
    for _ in range(8):
        a.advance(0.5)
    b = Simulation(overloaded(), seed=4)
    b.advance_to(4.0)
    assert a.metrics() == b.metrics()
    assert a.now >= 4.0


def test_idle_engine_waits_for_the_next_arrival() -> None:
    """With nothing to do the clock jumps to the target and step() reports a spent script."""
    sim = Simulation(tiny(), arrivals=ScriptedArrivals([arrival(5.0, 10, 2)]))
    sim.advance_to(4.0)
    assert sim.now == 4.0
    assert sim.metrics().generation_tokens == 0
    assert sim.step()
    assert sim.now > 5.0
    while sim.step():
        pass
    assert sim.metrics().request_success["stop"] == 1


def test_num_gpu_blocks_includes_the_null_block() -> None:
    """The engine reports vLLM's num_gpu_blocks, but never lets requests hold the null block."""
    scenario = overloaded()
    sim = Simulation(scenario, seed=0)
    assert sim.num_gpu_blocks == num_gpu_blocks(scenario) == 64
    sim.advance_to(5.0)
    assert sim.state().blocks_used <= 63


@pytest.mark.parametrize("target", [math.inf, math.nan])
def test_non_finite_target_is_refused(target: float) -> None:
    """Advancing to an infinite or NaN time raises instead of looping forever."""
    with pytest.raises(ValueError, match="finite"):
        Simulation(overloaded()).advance_to(target)
