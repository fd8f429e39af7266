"""``vllm-headroom demo``: the sidecar against a SIMULATED vLLM, with no vLLM and no GPU.

A simulated vLLM V1 engine (``exporter.sim``: paged KV blocks, prefix caching, continuous
batching under ``max_num_seqs``, recompute preemption) serves vLLM-format ``/metrics`` on
loopback; the real sidecar (``serve``) polls it over HTTP, with a simulated GPU standing in for
NVML. Its traffic (:func:`exporter.sim.traffic.default_profile`) cycles through phases that make
each limit bind in turn: short requests fill the scheduler's 256 slots while the KV cache stays
mostly free, chat makes the KV pool the limit, agents sharing a system prompt lift the ceiling
that counts shared blocks once, and a burst of long documents overflows the pool into
preemptions. Everything is labelled a simulation: the model id, the vLLM version (``+sim``), the
GPU's name and the console lines. The demo prints the derived figures as it goes, read back from
the sidecar's own ``/metrics`` like Prometheus would, the binding limit and the shared-prefix
ceiling included.

Two settings differ from a real deployment's, on purpose. ``max_num_seqs`` is given to the
sidecar (``headroom_max_num_seqs{origin="setting"}``): there is no vLLM process whose command
line it could read, as for a vLLM in a container the sidecar cannot see into, and the
simulated engine runs with ``--max-num-seqs 256`` where vLLM's default on this H100 is 1,024.
The context window looks back 60 simulated seconds instead of 600, and does not reach further
back when it holds fewer than ``context_min_requests`` requests, so that each phase of a minute
or so shows in the p95 context while it lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli.logsetup import configure_logging
from exporter.cli.numbers import SEED, Bounded, positive, whole
from exporter.service.app import Components, serve, server_url
from exporter.service.settings import DEFAULT_PORT, load_settings
from exporter.sim import Simulation, default_scenario
from exporter.sim.gpu import simulated_gpu_source
from exporter.sim.scenario import SIM_MODEL_DIR, kv_budget_bytes
from exporter.sim.server import SimServer

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from exporter.service.httpserver import ExporterServer
    from exporter.sim.traffic import TrafficProfile

#: Simulated seconds the p95 context looks back over (the sidecar's default is 600).
CONTEXT_WINDOW_SIM_S = 60.0

NAME = "demo"
HELP = "run the sidecar against a built-in SIMULATED vLLM (no vLLM, no GPU needed)"
DESCRIPTION = (
    "Start a simulated vLLM engine (Llama-3.1-8B-like on one simulated H100, "
    "--max-num-seqs 256; traffic in phases: short requests that fill max_num_seqs, chat "
    "that fills the KV cache, agents sharing a system prompt, a burst that causes "
    "preemptions) and the vllm-headroom sidecar polling it over HTTP. Open the sidecar's "
    "/metrics while it runs. Nothing here is a real vLLM or a real GPU."
)


#: The demo's number flags and their ranges: a NaN or 0 interval would spin, a NaN duration
#: never end, a port past 65,535 fail only once the sidecar's settings are read.
NUMBER_FLAGS: dict[str, Bounded] = {
    "port": whole("", 0, str(DEFAULT_PORT), high=65_535),
    "speed": positive("simulated seconds per second", 1_000.0, "5"),
    "duration": Bounded("seconds", 0.0, 7 * 86_400.0, "75"),
    "seed": SEED,
    "every": positive("seconds", 86_400.0, "10"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``demo``; every number is checked as it is read (one line when bad)."""
    parser.add_argument(
        "--port",
        type=NUMBER_FLAGS["port"],
        default=DEFAULT_PORT,
        help=f"sidecar port (default {DEFAULT_PORT}; 0: any free port)",
    )
    parser.add_argument(
        "--listen-address", default="127.0.0.1", help="sidecar address (default 127.0.0.1)"
    )
    parser.add_argument(
        "--speed",
        type=NUMBER_FLAGS["speed"],
        default=1.0,
        help=(
            "simulated seconds per real second (default 1; one traffic cycle is 330 s "
            "simulated, the burst starts at 210 s)"
        ),
    )
    parser.add_argument(
        "--duration",
        type=NUMBER_FLAGS["duration"],
        default=0.0,
        help="stop after this many real seconds (default: run until Ctrl-C)",
    )
    parser.add_argument(
        "--seed", type=NUMBER_FLAGS["seed"], default=0, help="traffic seed (default 0)"
    )
    parser.add_argument(
        "--every",
        type=NUMBER_FLAGS["every"],
        default=10.0,
        help="print a status line every N seconds",
    )


@dataclass(slots=True)
class DemoTally:
    """What the demo saw, for the closing summary."""

    max_preemptions_per_second: float = 0.0
    min_available_sequences: float | None = None
    max_waiting: float = 0.0
    #: Limits that bound the p95 ceiling, in the order seen (each change of limit).
    limits: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DemoStatus:
    """The headline figures of the sidecar's exposition (engine "0")."""

    #: Gauge values by short name (``ceiling``, ``available``, ``effective``...).
    values: dict[str, float]
    #: The limit that binds the p95 ceiling (``headroom_p95_ceiling_limited_by``), if known.
    limit: str | None = None

    def get(self, key: str) -> float | None:
        """The value of one figure, or None when the sidecar does not export it (yet)."""
        return self.values.get(key)


#: The one-hot family naming the limit that binds the p95 ceiling.
_LIMIT_FAMILY = "headroom_p95_ceiling_limited_by"


def read_status(text: str) -> DemoStatus:
    """The headline figures of the sidecar's exposition (engine "0")."""
    wanted = {
        "headroom_kv_capacity_tokens": "capacity",
        "headroom_kv_capacity_predicted_tokens": "predicted",
        "headroom_kv_used_tokens": "used",
        "headroom_kv_usable_tokens": "usable",
        "headroom_context_length_p95_tokens": "p95",
        "headroom_p95_ceiling_sequences": "ceiling",
        "headroom_p95_effective_ceiling_sequences": "effective",
        "headroom_p95_available_sequences": "available",
        "headroom_preemptions_per_second": "preemptions",
        "headroom_requests_running": "running",
        "headroom_requests_waiting": "waiting",
    }
    values: dict[str, float] = {}
    limit = None
    for family in text_string_to_metric_families(text):
        short = wanted.get(family.name)
        for sample in family.samples:
            if sample.labels.get("engine") != "0":
                continue
            if short:
                values[short] = sample.value
            elif family.name == _LIMIT_FAMILY and sample.value == 1.0:
                limit = sample.labels.get("limit")
    return DemoStatus(values, limit)


def status_line(
    simulated_s: float, speed: float, status: DemoStatus, *, phase: str | None = None
) -> str:
    """One console line of the demo (labelled a simulation), with the traffic phase if given.

    ``simulated_s`` is the simulation's own clock, not the wall clock times ``speed``: a
    simulation starved of CPU falls behind, and its line must name the phase it is in.
    """

    def get(key: str) -> str:
        value = status.get(key)
        return "-" if value is None else f"{value:,.0f}"

    rate = status.get("preemptions")
    # The sidecar measures real seconds; the simulation runs `speed` times faster.
    per_sim_second = None if rate is None else rate / speed
    where = f"t={simulated_s:6.0f}s" + ("" if phase is None else f" {phase:<6}")
    return (
        f"[simulation {where}] running {get('running'):>4} waiting "
        f"{get('waiting'):>4} | KV {get('used'):>8}/{get('usable')} tokens | p95 context "
        f"{get('p95'):>6} | headroom {get('available'):>4}/{get('ceiling')} p95 sequences, "
        f"bound by {status.limit or '-'}, {get('effective')} with shared prefixes | "
        f"preemptions/s {'-' if per_sim_second is None else f'{per_sim_second:.2f}'}"
    )


async def _report(
    url: str,
    *,
    every: float,
    speed: float,
    traffic: TrafficProfile,
    simulated_seconds: Callable[[], float],
    tally: DemoTally,
    stop: asyncio.Event,
) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)
            try:
                text = (await http.get(f"{url}/metrics", timeout=5)).text
            except httpx.HTTPError:
                continue
            status = read_status(text)
            # The simulation's time, not the wall clock's: under CPU contention it lags.
            simulated_s = simulated_seconds()
            phase = traffic.phase_at(simulated_s)
            line = status_line(
                simulated_s, speed, status, phase=None if phase is None else phase.name
            )
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            tally.max_preemptions_per_second = max(
                tally.max_preemptions_per_second, (status.get("preemptions") or 0.0) / speed
            )
            tally.max_waiting = max(tally.max_waiting, status.get("waiting") or 0.0)
            if status.limit is not None and tally.limits[-1:] != [status.limit]:
                tally.limits.append(status.limit)
            available = status.get("available")
            if available is not None:
                low = tally.min_available_sequences
                tally.min_available_sequences = available if low is None else min(low, available)


async def demo(
    *,
    port: int,
    listen_address: str,
    speed: float,
    duration: float,
    seed: int,
    every: float,
) -> int:
    """Run the simulation and the sidecar until Ctrl-C or ``duration``; return the exit code."""
    scenario = default_scenario()
    simulation = Simulation(scenario, seed=seed)
    sim = SimServer(simulation, speed=speed)
    sim_url = sim.start("127.0.0.1", 0)
    # The windows and the poll cadence follow simulated time, so the figures read as on a real
    # server whatever the speed.
    poll = max(0.5, 5.0 / speed)
    settings = load_settings(
        {
            "target": sim_url,
            "port": port,
            "listen_address": listen_address,
            "poll_interval_seconds": poll,
            "poll_timeout_seconds": min(poll, 3.0),
            "context_window_seconds": max(10.0, CONTEXT_WINDOW_SIM_S / speed),
            # Each phase's own requests, however few: never reach back into the phase before.
            "context_min_requests": 0,
            "rate_window_seconds": max(poll * 2, 60.0 / speed),
            # Each phase's figures as it runs: a minute's phase is no place to let them stand.
            "context_refresh_seconds": 0.0,
            # No vLLM process to read --max-num-seqs from: say it, as for a hidden container.
            "max_num_seqs": scenario.engine.max_num_seqs,
            # The simulated vLLM reports the bundled model directory as its root.
            "model_roots": [SIM_MODEL_DIR],
        }
    )
    stop = asyncio.Event()
    tally = DemoTally()
    reporter: asyncio.Task[None] | None = None

    def started(server: ExporterServer) -> None:
        nonlocal reporter
        url = server_url(server)
        budget = kv_budget_bytes(scenario) / 1024**3
        sys.stdout.write(
            "vllm-headroom demo: a SIMULATED vLLM (no real vLLM, no real GPU)\n"
            f"  simulated vLLM  {sim_url}  (model simulated/llama-3.1-8b on a simulated "
            f"H100, KV budget {budget:.1f} GiB, speed x{speed:g})\n"
            f"  sidecar         {url}/metrics   (landing page {url}/)\n"
            f"  the simulated engine runs at most {scenario.engine.max_num_seqs} sequences "
            "(--max-num-seqs). Every 330 simulated\n"
            "  seconds its traffic goes through short requests (max_num_seqs binds), chat (the\n"
            "  KV cache binds), agents sharing a system prompt (held once: a higher ceiling\n"
            "  with shared prefixes) and, at 210 s, a burst that overflows the KV cache into\n"
            "  preemptions. Watch the status lines below, or e.g.\n"
            f"    curl -s {url}/metrics | grep -E 'headroom_(p95|preemptions|kv_used)'\n"
            "  Ctrl-C stops it.\n"
        )
        sys.stdout.flush()
        reporter = asyncio.create_task(
            _report(
                url,
                every=every,
                speed=speed,
                traffic=scenario.traffic,
                simulated_seconds=lambda: sim.simulated_seconds,
                tally=tally,
                stop=stop,
            )
        )

    if duration > 0:
        asyncio.get_running_loop().call_later(duration, stop.set)
    try:
        code = await serve(
            settings,
            components=Components(gpu_source=lambda _s: simulated_gpu_source(scenario)),
            started=started,
            stop=stop,
        )
    finally:
        stop.set()
        if reporter is not None:
            await reporter
        sim.stop()
    low = tally.min_available_sequences
    sys.stdout.write(
        "demo finished (simulation): highest preemption rate "
        f"{tally.max_preemptions_per_second:.2f}/s, most requests waiting "
        f"{tally.max_waiting:.0f}, lowest headroom "
        f"{'-' if low is None else f'{low:.0f}'} p95 sequences, bound by "
        f"{', then '.join(tally.limits) or '-'}\n"
    )
    return code


def run(args: argparse.Namespace) -> int:
    """Entry point of ``demo``."""
    configure_logging(level="warning", fmt="console" if sys.stderr.isatty() else "json")
    return asyncio.run(
        demo(
            port=args.port,
            listen_address=args.listen_address,
            speed=args.speed,
            duration=args.duration,
            seed=args.seed,
            every=args.every,
        )
    )
