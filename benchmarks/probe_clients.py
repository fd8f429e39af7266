r"""The probe's built-in load client against vLLM's own (``vllm bench serve``), at the same rate.

Run from the repository root (vLLM's client needs its environment, ``make deps``)::

    .venv/bin/python benchmarks/probe_clients.py                 # the simulated vLLM, ~2 min
    .venv/bin/python benchmarks/probe_clients.py --target http://127.0.0.1:8000 \
        --model tiny --tokenizer ~/.cache/vllm-headroom/models/llama-...

Both clients send the same trace: the same requests (prompt token ids, ``max_tokens`` with
``ignore_eos``) at the same arrival times (a Poisson schedule at ``--rate``), against the same
target: by default the simulated vLLM of ``exporter.testing.simload`` serving completions over
HTTP in its own process (its answers cost the same whoever asks), or a real vLLM. Each client runs
in a process of its own, in interleaved rounds (built-in, vLLM's, built-in, vLLM's...) so that
both see the same machine load. Per client it reports:

- **CPU per request**: user + system CPU time of the client's process while it sends and waits
  for the trace, over the requests completed (the built-in client measures its own
  ``time.process_time``; vLLM's is read from ``/proc`` when it prints that it starts sending,
  and from ``wait4`` when it exits);
- **send lateness**: how long after its scheduled time each request was sent, both counted from
  the first request (p50 and p99);
- **start-up**: wall time from starting the client's process to its first request;
- requests completed and the client's own p50 time to first token.

The named peer is vLLM's client; ratios are the built-in client's figure over the peer's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from exporter.sweep.drivers import (
    BENCH_SNIPPET,
    BENCH_START_MARKER,
    HttpxDriver,
    bench_arguments,
    trace_lines,
)
from exporter.sweep.plan import Load, Mode, arrival_offsets
from exporter.sweep.shape import RequestShape

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
SIM_MODEL = "simulated/llama-3.1-8b"
BUILTIN = "built-in (httpx)"
PEER = "vLLM bench serve"

SIM_SERVER = """
import sys
from exporter.sim import Scenario, SimEngineConfig
from exporter.testing.simload import SimCompletionsServer
scenario = Scenario(engine=SimEngineConfig(max_num_seqs=1024))
with SimCompletionsServer(scenario, speed=float(sys.argv[1])) as server:
    print(server.url, flush=True)
    sys.stdin.read()
"""


@dataclass(frozen=True, slots=True)
class Setup:
    """What both clients are pointed at."""

    target: str
    model: str
    python: str
    tokenizer: str
    trace_path: Path


def _trace(args: argparse.Namespace) -> list[str]:
    offsets = arrival_offsets(args.rate, args.seconds, seed=0)
    shapes = [RequestShape(args.prompt_tokens, args.output_tokens)] * len(offsets)
    return trace_lines(shapes, offsets, first_index=0)


def _lateness(starts: list[float], scheduled: list[float]) -> list[float]:
    """Each send's delay past its schedule, both counted from the first request."""
    sent, planned = sorted(starts), sorted(scheduled)
    return [max(0.0, (s - sent[0]) - (o - planned[0])) for s, o in zip(sent, planned, strict=False)]


def _summary(lateness: list[float], ttfts: list[float], cpu_s: float, done: int) -> dict[str, Any]:
    ordered = sorted(lateness) or [0.0]
    return {
        "completed": done,
        "cpu_s": cpu_s,
        "cpu_ms_per_request": 1000 * cpu_s / done if done else None,
        "lateness_p50_ms": 1000 * ordered[len(ordered) // 2],
        "lateness_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
    }


def run_builtin(target: str, model: str, trace_path: Path) -> dict[str, Any]:
    """The built-in client over the trace (in this process, which does nothing else)."""
    trace = [json.loads(line) for line in trace_path.read_text().splitlines()]
    offsets = [t["timestamp"] for t in trace]
    shapes = [RequestShape(t["input_length"], t["output_length"]) for t in trace]

    async def go() -> dict[str, Any]:
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=64)
        async with httpx.AsyncClient(trust_env=False, limits=limits) as http:
            driver = HttpxDriver(target, model, client=http, clock=time.monotonic)
            cpu0 = time.process_time()
            await driver.start(Load(Mode.RATE, 1.0), shapes, offsets=offsets)
            while not driver.sending_done:
                await asyncio.sleep(0.05)
            results = await driver.finish(drain_s=600, abort=asyncio.Event())
            cpu = time.process_time() - cpu0
        ok = [r for r in results if r.ok]
        summary = _summary(
            _lateness([r.start_s for r in results], offsets),
            [t for r in ok if (t := r.ttft_s) is not None],
            cpu,
            len(ok),
        )
        # CLOCK_MONOTONIC is the machine's: the parent subtracts its own start time.
        summary["first_request_monotonic"] = min(r.start_s for r in results)
        return summary

    return asyncio.run(go())


def _builtin_round(setup: Setup) -> dict[str, Any]:
    born = time.monotonic()
    own = subprocess.run(
        [sys.executable, __file__, "--run-builtin", str(setup.trace_path),
         "--target", setup.target, "--model", setup.model],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    mine: dict[str, Any] = json.loads(own.stdout)
    mine["startup_s"] = mine.pop("first_request_monotonic") - born
    return mine


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _vllm_round(setup: Setup) -> dict[str, Any]:
    """vLLM's client over the trace, as the probe runs it (its module, a timed_trace)."""
    trace = [json.loads(line) for line in setup.trace_path.read_text().splitlines()]
    workdir = setup.trace_path.parent
    argv = bench_arguments(
        base_url=setup.target,
        model=setup.model,
        tokenizer=setup.tokenizer,
        dataset=setup.trace_path,
        count=len(trace),
        result_dir=workdir,
        result_name="bench.json",
        concurrency=None,
        seed=0,
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    born = time.monotonic()
    process = subprocess.Popen(
        [setup.python, "-c", BENCH_SNIPPET, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    cpu_at_start = started = None
    tail: list[str] = []
    for line in process.stdout or ():
        tail = [*tail[-30:], line.rstrip()]
        if cpu_at_start is None and BENCH_START_MARKER in line:
            cpu_at_start, started = _proc_cpu(process.pid), time.monotonic()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0 or cpu_at_start is None or started is None:
        raise SystemExit("vLLM's client failed:\n" + "\n".join(tail))
    document = json.loads((workdir / "bench.json").read_text())
    ttfts = [t for t, e in zip(document["ttfts"], document["errors"], strict=False) if t and not e]
    summary = _summary(
        _lateness(document["start_times"], [t["timestamp"] for t in trace]),
        ttfts,
        usage.ru_utime + usage.ru_stime - cpu_at_start,
        int(document["completed"]),
    )
    summary["startup_s"] = started - born
    return summary


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if r[key] is not None]
    return statistics.median(values) if values else None


def _report(results: dict[str, list[dict[str, Any]]]) -> None:
    peer = results[PEER]
    peer_cpu, peer_late = _median(peer, "cpu_ms_per_request"), _median(peer, "lateness_p99_ms")
    for name, rounds in results.items():
        cpu = _median(rounds, "cpu_ms_per_request")
        late = _median(rounds, "lateness_p99_ms")
        ratio = ""
        if name != PEER and cpu and peer_cpu:
            ratio = f"  ({cpu / peer_cpu:.2f}x the peer's CPU"
            ratio += f", {late / peer_late:.2f}x its p99 lateness)" if late and peer_late else ")"
        print(
            f"  {name:18} CPU {cpu or 0:6.2f} ms/request  send lateness p50 "
            f"{_median(rounds, 'lateness_p50_ms') or 0:6.2f} ms p99 {late or 0:7.2f} ms  "
            f"start-up {_median(rounds, 'startup_s') or 0:5.1f} s  TTFT p50 "
            f"{_median(rounds, 'ttft_p50_ms') or 0:6.1f} ms  completed "
            f"{_median(rounds, 'completed') or 0:.0f}{ratio}"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--target", help="a running vLLM (default: the simulated one)")
    parser.add_argument("--model", default=SIM_MODEL)
    parser.add_argument("--tokenizer", help="a tokenizer directory (default: the tiny model)")
    parser.add_argument("--vllm-python", help="vLLM's python (default: the e2e venv's)")
    parser.add_argument("--rate", type=float, default=40.0, help="requests/s (40)")
    parser.add_argument("--seconds", type=float, default=15.0, help="trace length (15)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed", type=float, default=10.0, help="the simulation's speed (10)")
    parser.add_argument("--run-builtin", metavar="TRACE", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    """Run the comparison (or, with --run-builtin, one built-in client run)."""
    args = _parser().parse_args()
    if args.run_builtin:
        print(json.dumps(run_builtin(args.target, args.model, Path(args.run_builtin))))
        return 0
    sys.path.insert(0, str(ROOT))
    from tests.e2e.harness import tiny_model, vllm_venv  # noqa: PLC0415 - needs ROOT on the path

    server = None
    target = args.target
    if target is None:
        server = subprocess.Popen(
            [sys.executable, "-c", SIM_SERVER, str(args.speed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        target = server.stdout.readline().strip() if server.stdout is not None else ""
    lines = _trace(args)
    results: dict[str, list[dict[str, Any]]] = {BUILTIN: [], PEER: []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            setup = Setup(
                target=target,
                model=args.model,
                python=args.vllm_python or str(vllm_venv() / "bin" / "python"),
                tokenizer=args.tokenizer or str(tiny_model("llama")),
                trace_path=Path(tmp) / "trace.jsonl",
            )
            setup.trace_path.write_text("\n".join(lines) + "\n")
            for round_ in range(args.rounds):
                results[BUILTIN].append(_builtin_round(setup))
                results[PEER].append(_vllm_round(setup))
                print(f"round {round_ + 1}: {results[BUILTIN][-1]} | {results[PEER][-1]}")
    finally:
        if server is not None and server.stdin is not None:
            server.stdin.close()
            server.wait(timeout=30)
    print(
        f"\n{len(lines)} requests of {args.prompt_tokens} + {args.output_tokens} tokens at "
        f"{args.rate:g} req/s for {args.seconds:g} s against "
        f"{'the simulated vLLM' if args.target is None else args.target}, median of "
        f"{args.rounds} rounds:"
    )
    _report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
