"""A simulated vLLM V1 engine for ``vllm-headroom demo``: no GPU, no vLLM, same ``/metrics``.

- :mod:`exporter.sim.scenario`: what is simulated (model, GPU, engine settings, KV pool sizing).
- :mod:`exporter.sim.traffic`: the traffic profile (short requests, chat, agents sharing a
  system prompt, a burst of long documents, calm) and its seeded arrivals.
- :mod:`exporter.sim.timing`: how long an engine step takes (a two-term roofline).
- :mod:`exporter.sim.engine`: the engine itself: paged blocks counted by reference, prefix
  caching, the scheduler under ``max_num_seqs``, ``n > 1`` sampling, recompute preemption.
- :mod:`exporter.sim.families`: vLLM 0.32.0's metric families (names, HELP, buckets).
- :mod:`exporter.sim.exposition`: renders the engine's metrics as vLLM's ``/metrics`` text.

The HTTP server that serves it in real time is :mod:`exporter.sim.server`. Typical use::

    sim = Simulation(default_scenario(), seed=0)
    sim.advance_to(90.0)                      # simulated seconds
    payload = render(sim.metrics(), sim.scenario, started_at=time.time())
"""

from exporter.sim.engine import EngineState, RequestView, SimMetrics, Simulation
from exporter.sim.exposition import cache_config_labels, render
from exporter.sim.scenario import (
    SIM_MODEL_DIR,
    Scenario,
    ScenarioError,
    SimEngineConfig,
    SimGpu,
    SimModel,
    default_scenario,
)
from exporter.sim.traffic import (
    Arrival,
    LengthDistribution,
    ScriptedArrivals,
    SharedPrefix,
    TrafficPhase,
    TrafficProfile,
    default_profile,
)

__all__ = [
    "SIM_MODEL_DIR",
    "Arrival",
    "EngineState",
    "LengthDistribution",
    "RequestView",
    "Scenario",
    "ScenarioError",
    "ScriptedArrivals",
    "SharedPrefix",
    "SimEngineConfig",
    "SimGpu",
    "SimMetrics",
    "SimModel",
    "Simulation",
    "TrafficPhase",
    "TrafficProfile",
    "cache_config_labels",
    "default_profile",
    "default_scenario",
    "render",
]
