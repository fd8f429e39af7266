"""The simulated scenario: KV pool sizing as vLLM does it, validation, the model's config.json."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from exporter.errors import UsageError
from exporter.sim.scenario import (
    SIM_MODEL_DIR,
    Scenario,
    ScenarioError,
    SimEngineConfig,
    SimModel,
    default_scenario,
    kv_budget_bytes,
    kv_cache_max_concurrency,
    kv_cache_size_tokens,
    num_gpu_blocks,
    validate,
)
from exporter.sim.traffic import LengthDistribution, SharedPrefix, TrafficPhase, TrafficProfile

GIB = 1024**3


def test_default_model_costs_128_kib_per_token() -> None:
    """Llama 3.1 8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 bytes."""
    assert default_scenario().model.bytes_per_token == 131_072


def test_default_budget_is_a_realistic_h100_pool() -> None:
    """At utilization 0.92 the KV budget is 52-60 GB: tens of thousands of 16-token blocks."""
    scenario = default_scenario()
    budget = kv_budget_bytes(scenario)
    assert 52e9 <= budget <= 60e9
    blocks = num_gpu_blocks(scenario)
    block_bytes = 16 * scenario.model.bytes_per_token
    assert blocks * block_bytes <= budget < (blocks + 1) * block_bytes
    assert 20_000 <= blocks <= 40_000


def test_budget_subtracts_weights_and_overhead_from_the_utilized_memory() -> None:
    """Budget = memory x utilization - weights - activation peak - non-torch memory."""
    scenario = default_scenario()
    heavier = dataclasses.replace(scenario.model, weights_bytes=scenario.model.weights_bytes + GIB)
    more_weights = dataclasses.replace(scenario, model=heavier)
    assert kv_budget_bytes(scenario) - kv_budget_bytes(more_weights) == pytest.approx(GIB, abs=1)
    lower = dataclasses.replace(
        scenario, engine=dataclasses.replace(scenario.engine, gpu_memory_utilization=0.82)
    )
    drop = kv_budget_bytes(scenario) - kv_budget_bytes(lower)
    assert drop == pytest.approx(0.1 * scenario.gpu.memory_bytes, abs=1)


def test_kv_cache_memory_bytes_replaces_the_budget() -> None:
    """--kv-cache-memory-bytes is used exactly, like vLLM (the 0.32 capture: 1 MiB, 8 blocks)."""
    tiny = SimModel(num_layers=2, num_kv_heads=2, head_dim=64)
    scenario = Scenario(
        model=tiny,
        engine=SimEngineConfig(block_size=128, max_model_len=512, kv_cache_memory_bytes=1 << 20),
    )
    assert tiny.bytes_per_token == 1024
    assert kv_budget_bytes(scenario) == 1 << 20
    assert num_gpu_blocks(scenario) == 8
    assert kv_cache_size_tokens(scenario) == 1024
    assert kv_cache_max_concurrency(scenario) == 2.0


def test_capacity_follows_vllm_definitions() -> None:
    """Size in tokens is blocks x block_size; max concurrency is blocks over blocks per request."""
    scenario = default_scenario()
    blocks = num_gpu_blocks(scenario)
    engine = scenario.engine
    assert kv_cache_size_tokens(scenario) == blocks * engine.block_size
    per_request = math.ceil(engine.max_model_len / engine.block_size)
    assert kv_cache_max_concurrency(scenario) == blocks / per_request
    assert kv_cache_max_concurrency(scenario) * engine.max_model_len == pytest.approx(
        kv_cache_size_tokens(scenario)
    )


def test_default_scenario_is_valid() -> None:
    """The demo's scenario passes validation."""
    validate(default_scenario())


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"block_size": 0}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"max_model_len": 10_000_000}, "usable blocks"),
        ({"kv_cache_memory_bytes": 1000}, "usable blocks"),
    ],
)
def test_scenarios_vllm_would_refuse_are_rejected(change: dict[str, object], fragment: str) -> None:
    """A configuration vLLM would not start with raises a one-line ScenarioError (a UsageError)."""
    scenario = default_scenario()
    bad = dataclasses.replace(scenario, engine=dataclasses.replace(scenario.engine, **change))  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=fragment) as excinfo:
        validate(bad)
    assert isinstance(excinfo.value, UsageError)
    assert "\n" not in str(excinfo.value)


def _phase(duration: float, rate: float, prompt_min: int, max_tokens: int) -> TrafficPhase:
    lengths = LengthDistribution(10, 0.1, 1, 20)
    prompt = LengthDistribution(10, 0.1, prompt_min, 20)
    return TrafficPhase("p", duration, rate, prompt, lengths, max_tokens)


@pytest.mark.parametrize(
    "bad_phase",
    [
        _phase(0.0, 1.0, 1, 5),
        _phase(5.0, -1.0, 1, 5),
        _phase(5.0, 1.0, 30, 5),
        _phase(5.0, 1.0, 1, 0),
        dataclasses.replace(_phase(5.0, 1.0, 1, 5), n=0),
        dataclasses.replace(_phase(5.0, 1.0, 1, 5), shared_prefix=SharedPrefix("s", 0, 0.5)),
        dataclasses.replace(_phase(5.0, 1.0, 1, 5), shared_prefix=SharedPrefix("s", 64, 1.5)),
        dataclasses.replace(_phase(5.0, 1.0, 1, 5), shared_prefix=SharedPrefix("", 64, 0.5)),
    ],
)
def test_broken_traffic_profiles_are_rejected(bad_phase: TrafficPhase) -> None:
    """No duration, negative rates, empty lengths, max_tokens or n 0, or a bad prefix: refused."""
    scenario = dataclasses.replace(default_scenario(), traffic=TrafficProfile(phases=(bad_phase,)))
    with pytest.raises(ScenarioError, match="traffic phase 'p'"):
        validate(scenario)


def test_empty_traffic_profile_is_rejected() -> None:
    """A profile without phases is refused."""
    scenario = dataclasses.replace(default_scenario(), traffic=TrafficProfile(phases=()))
    with pytest.raises(ScenarioError, match="no phases"):
        validate(scenario)


def test_sim_model_config_matches_the_simulated_model() -> None:
    """The config.json served as the model root describes exactly the model being simulated."""
    config = json.loads((SIM_MODEL_DIR / "config.json").read_text())
    model = default_scenario().model
    assert config["num_hidden_layers"] == model.num_layers
    assert config["num_key_value_heads"] == model.num_kv_heads
    assert config["head_dim"] == model.head_dim
    assert config["hidden_size"] // config["num_attention_heads"] == model.head_dim
    assert config["torch_dtype"] == "bfloat16"
    assert model.kv_dtype_bytes == 2
    layers, kv_heads = config["num_hidden_layers"], config["num_key_value_heads"]
    per_token = 2 * layers * kv_heads * config["head_dim"] * 2
    assert per_token == model.bytes_per_token
    assert config["max_position_embeddings"] >= default_scenario().engine.max_model_len


def test_sim_model_weights_index_gives_the_weight_size() -> None:
    """The safetensors index carries the bf16 weight size, close to what the engine subtracts."""
    index = json.loads((SIM_MODEL_DIR / "model.safetensors.index.json").read_text())
    total = index["metadata"]["total_size"]
    weights = default_scenario().model.weights_bytes
    assert total == pytest.approx(weights, rel=0.01)
    assert total == pytest.approx(2 * default_scenario().model.num_parameters, rel=0.01)
