"""Specification of `vllm-headroom demo`: the sidecar against the simulated vLLM."""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

from exporter.cli.demo import DemoStatus, demo, read_status, status_line
from exporter.gpu.model import ALL_GPUS
from exporter.sim import default_scenario
from exporter.sim.gpu import SimulatedGpuReader

if TYPE_CHECKING:
    import pytest


def test_the_demo_runs_the_sidecar_against_the_simulation_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A short fast demo prints simulation-labelled status lines from the sidecar's /metrics."""
    code = asyncio.run(
        demo(port=0, listen_address="127.0.0.1", speed=20, duration=6, seed=1, every=1.5)
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "SIMULATED vLLM" in out
    lines = [line for line in out.splitlines() if line.startswith("[simulation")]
    assert lines, out
    assert "KV" in lines[-1]
    assert "/456,480 tokens" in lines[-1]  # the usable pool read back from the sidecar
    # The first minute is short requests: the scheduler's 256 slots bind, not the KV cache.
    assert any(
        "short" in line and "/256 p95 sequences, bound by max_num_seqs" in line for line in lines
    ), out
    assert "demo finished (simulation)" in out


def test_the_simulated_gpu_holds_what_vllm_claims_and_is_named_a_simulation() -> None:
    """The stand-in GPU's vLLM process holds total x utilization plus its CUDA context."""
    scenario = default_scenario()
    (reading,) = SimulatedGpuReader(scenario).read(ALL_GPUS).gpus
    claimed = math.floor(scenario.gpu.memory_bytes * scenario.engine.gpu_memory_utilization)
    assert "simulated" in reading.name
    assert reading.reserved_bytes is not None
    assert reading.total_bytes - reading.reserved_bytes == scenario.gpu.memory_bytes
    assert reading.processes is not None
    assert reading.processes[0].used_bytes is not None
    assert reading.processes[0].used_bytes > claimed
    assert reading.allocated_bytes == reading.processes[0].used_bytes


def test_status_lines_read_engine_0_figures_and_show_rates_per_simulated_second() -> None:
    """The console line reads our own exposition; rates divide by the speed-up."""
    text = (
        "# TYPE headroom_p95_available_sequences gauge\n"
        'headroom_p95_available_sequences{engine="0",model_name="m"} 3.0\n'
        'headroom_p95_available_sequences{engine="1",model_name="m"} 9.0\n'
        "# TYPE headroom_preemptions_per_second gauge\n"
        'headroom_preemptions_per_second{engine="0",model_name="m"} 10.0\n'
    )
    status = read_status(text)
    assert status == DemoStatus({"available": 3.0, "preemptions": 10.0})
    line = status_line(10.0, 5.0, status)  # 10 simulated seconds, 5 times real time
    assert line.startswith("[simulation t=    10s]")
    assert "preemptions/s 2.00" in line
    assert "bound by -" in line  # no limit exported yet


def test_status_lines_name_the_binding_limit_and_the_shared_prefix_ceiling() -> None:
    """The limit flagged 1 in the one-hot family and the effective ceiling reach the line."""
    text = (
        "# TYPE headroom_p95_ceiling_sequences gauge\n"
        'headroom_p95_ceiling_sequences{engine="0",model_name="m"} 78.0\n'
        "# TYPE headroom_p95_effective_ceiling_sequences gauge\n"
        'headroom_p95_effective_ceiling_sequences{engine="0",model_name="m"} 166.0\n'
        "# TYPE headroom_p95_ceiling_limited_by gauge\n"
        'headroom_p95_ceiling_limited_by{engine="0",limit="kv_cache",model_name="m"} 1.0\n'
        'headroom_p95_ceiling_limited_by{engine="0",limit="max_num_seqs",model_name="m"} 0.0\n'
        'headroom_p95_ceiling_limited_by{engine="1",limit="max_num_seqs",model_name="m"} 1.0\n'
    )
    status = read_status(text)
    assert status.limit == "kv_cache"
    line = status_line(200.0, 5.0, status, phase="agents")
    assert line.startswith("[simulation t=   200s agents]")
    assert "/78 p95 sequences, bound by kv_cache, 166 with shared prefixes |" in line
