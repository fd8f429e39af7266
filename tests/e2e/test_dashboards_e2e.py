"""Every dashboard query, run by a real Prometheus against real series, returns data.

Two set-ups. The full path (:func:`test_every_panel_query_returns_data_after_a_real_burst`): a
real vLLM (CPU) serving the reference tiny model, our real sidecar (``vllm-headroom serve``, no
NVML here) and a real Prometheus with the rule file; after a burst that preempts, every panel
query returns data except those documented as needing NVML, vLLM V0, or a state the burst does
not create. The replay (the other tests) needs no vLLM and covers both vLLM generations:
Prometheus scrapes two pairs of loopback targets, each pair on its own host as a sidecar and
its vLLM would be in one pod:

- ``127.0.0.1``: our sidecar's golden exposition, and a real vLLM 0.32 (V1) replayed from the
  burst recorded in ``tests/fixtures/vllm-cpu/burst/`` (one payload per scrape, from idle through
  15 preemptions to idle), so rates and latency quantiles are real;
- ``127.0.0.2``: the same sidecar exposition, and the real vLLM 0.6 (V0) capture with its
  counters and histograms growing by 10 % per scrape, so the old metric names are exercised.

It loads the real rule file (recording rules included) with the SLO objectives stated, as a
user with an SLO states them (unstated, the SLO panels are empty by design). Then every panel
query of both dashboards is expanded as Grafana's Prometheus data source would expand it and
evaluated: each must return a finite value for at least one host, except the panels documented in
``docs/dashboards.md`` as depending on state (firing alerts, a day of history, errors). The
variables' queries must list the instances, and the hidden ``host`` variable's regex must find
the host that matches the sidecar to its vLLM.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import TYPE_CHECKING, Any

import pytest

from dashboards.templating import expand
from exporter.testing.fakevllm import FakeVllm
from exporter.testing.processes import wait_until
from tests import paths
from tests.e2e.harness import (
    REFERENCE_MODEL_NAME,
    PrometheusServer,
    ScrapeJob,
    VllmServer,
    burst,
    rule_file_for_test,
    start_sidecar,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

ROOT = paths.REPO
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "alerts" / "vllm-headroom.rules.yml"
SIDECAR = ROOT / "tests" / "golden" / "exposition" / "sidecar.prom"
BURST = ROOT / "tests" / "fixtures" / "vllm-cpu" / "burst"
CAPTURES = paths.CAPTURES
V0_CAPTURE = CAPTURES / "04_v0.6.4-0.6.6_V0_test-fixture.prom"
V1_HOST, V0_HOST = "127.0.0.1", "127.0.0.2"

#: Panel queries that may rightly return nothing here, and why (also in docs/dashboards.md).
STATE_DEPENDENT = {
    ("vllm-headroom-fleet", "Firing alerts", "A"): "only while an alert fires",
    ("vllm-headroom-instance", "Firing alerts", "A"): "only while an alert fires",
    ("vllm-headroom-fleet", "p95 context vs a day earlier", "A"): "needs a day of history",
    ("vllm-headroom-instance", "Context length of finished requests", "E"): "a day of history",
    ("vllm-headroom-instance", "Source errors by reason", "B"): "only while reads fail",
}
#: Queries that need what the CPU-only full path lacks: NVML (GPU memory), or vLLM V0.
NEEDS_GPU_OR_V0 = {
    ("vllm-headroom-fleet", "Instances by model", "J"): "GPU memory needs NVML",
    ("vllm-headroom-instance", "GPU memory per GPU", "A"): "needs NVML",
    ("vllm-headroom-instance", "GPU memory per GPU", "B"): "needs NVML",
    ("vllm-headroom-instance", "GPU memory per GPU", "C"): "needs NVML",
    ("vllm-headroom-instance", "GPU memory per GPU", "D"): "needs NVML",
    ("vllm-headroom-instance", "GPU memory per GPU", "E"): "needs NVML",
    ("vllm-headroom-instance", "GPU memory per GPU", "F"): "needs NVML",
    ("vllm-headroom-instance", "Foreign GPU memory", "A"): "needs NVML",
    ("vllm-headroom-instance", "Unexplained GPU memory", "A"): "needs NVML",
    ("vllm-headroom-instance", "Free GPU memory", "A"): "needs NVML",
    ("vllm-headroom-instance", "Running and waiting requests", "C"): "swapped is V0 only",
}
#: Queries that need a KV connector, which vLLM's CPU build cannot run (both offload connectors
#: need CUDA): proven on the replayed pod, whose payloads carry the lines one writes.
NEEDS_KV_CONNECTOR = {
    ("vllm-headroom-instance", "Running and waiting requests", "D"): "a connector that loads KV",
    ("vllm-headroom-instance", "Predicted vs actual KV capacity", "C"): "an offload pool's size",
}
#: What SimpleCPUOffloadConnector adds to an engine's families (written from vLLM's source).
OFFLOAD_LINES = (
    ROOT / "tests" / "fixtures" / "vllm-offload" / "kv-offload-0.32.0-written-from-source.prom"
)
#: The harness's reference burst: 8 x 480 tokens into a 1,024-token pool preempt for sure.
BURST_LOAD = {"concurrency": 8, "prompt_tokens": 128, "output_tokens": 352}
VENV_BIN = ROOT / ".venv" / "bin"

#: Queries that must return data on the V0 host: the old names really work.
V0_PROOF = {
    ("KV-cache usage", "B"),  # gpu_cache_usage_perc
    ("Inter-token latency", "B"),  # time_per_output_token_seconds
    ("Running and waiting requests", "B"),  # num_requests_waiting without a reason
    ("Running and waiting requests", "C"),  # num_requests_swapped
    ("Preemptions per finished request", "A"),  # counters without an engine label
}


def _replay(files: Sequence[Path], extra: bytes = b"") -> Callable[[int], bytes]:
    """One recorded payload (and ``extra``) per scrape, then the last for ever (back to idle)."""
    payloads = [path.read_bytes() + extra for path in files]
    return lambda n: payloads[min(n, len(payloads) - 1)]


_GROWING = re.compile(
    r"^(vllm:\w+(?:_total|_bucket|_sum|_count)(?:\{[^}]*\})?) ([0-9.e+]+)$", re.MULTILINE
)


def _growing(path: Path) -> Callable[[int], bytes]:
    """The capture with every counter and histogram series grown by 10 % per scrape."""
    text = path.read_text(encoding="utf-8")

    def payload(n: int) -> bytes:
        factor = 1 + 0.1 * n
        return _GROWING.sub(lambda m: f"{m[1]} {float(m[2]) * factor!r}", text).encode()

    return payload


@pytest.fixture(scope="module")
def prometheus(
    prometheus_factory: Callable[..., PrometheusServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PrometheusServer, dict[str, str], float]]:
    """Prometheus scraping both pods; yields it, host -> sidecar instance, and the start time."""
    servers: list[FakeVllm] = []
    pods = {
        V1_HOST: _replay(sorted(BURST.glob("*.prom")), OFFLOAD_LINES.read_bytes()),
        V0_HOST: _growing(V0_CAPTURE),
    }
    sidecars: dict[str, str] = {}
    vllms: list[str] = []
    for host, vllm_payload in pods.items():
        for payload, into in ((lambda _: SIDECAR.read_bytes(), "sidecar"), (vllm_payload, "vllm")):
            pod_server = FakeVllm(host=host, payload=payload)
            servers.append(pod_server)
            address = f"{host}:{pod_server.port}"
            if into == "sidecar":
                sidecars[host] = address
            else:
                vllms.append(f"http://{address}/metrics")
    try:
        started = time.time()
        jobs = [
            ScrapeJob("headroom", [f"http://{a}/metrics" for a in sidecars.values()]),
            ScrapeJob("vllm", vllms),
        ]
        rules = rule_file_for_test(RULES, tmp_path_factory.mktemp("rules") / "rules.yml")
        server = prometheus_factory(jobs, rule_files=[rules])
        server.wait_for_targets_up("headroom")
        server.wait_for_targets_up("vllm")
        # Enough scrapes for the whole burst to be replayed and 10 s rate windows to fill.
        wait_until(
            lambda: server.query('count_over_time(vllm:num_requests_running{engine="0"}[1m]) > 14'),
            timeout_s=60,
            what="15 scrapes of the replayed vLLM",
        )
        yield server, sidecars, started
    finally:
        for payload_server in servers:
            payload_server.close()


def _boards() -> dict[str, dict[str, Any]]:
    return {
        uid: json.loads((DASHBOARDS / f"{uid}.json").read_text(encoding="utf-8"))
        for uid in ("vllm-headroom-fleet", "vllm-headroom-instance")
    }


def _values(uid: str, sidecar: str, host: str) -> dict[str, str | list[str]]:
    """What Grafana would put in each variable, for the fleet (All) or one instance."""
    values: dict[str, str | list[str]] = {
        "cluster": ".*",
        "job": ".*",
        "namespace": ".*",
        "model": ".*",
        "instance": ".*",
        "engine": ".*",
        "__rate_interval": "10s",
        "__interval": "1s",
        "__range": "5m",
    }
    if uid == "vllm-headroom-instance":
        values |= {"instance": sidecar, "host": [host]}
    return values


def _empty_queries(
    server: PrometheusServer,
    sidecars: dict[str, str],
    start: float,
    allowed: dict[tuple[str, str, str], str],
) -> tuple[list[str], set[tuple[str, str]]]:
    """Queries without a finite value on any pod (less ``allowed``), and what the V0 pod had."""
    empty = []
    v0_data = set()
    for uid, board in _boards().items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                key = (uid, panel["title"], target["refId"])
                hosts = {
                    host: _run(server, target, expand(target["expr"], _values(uid, s, host)), start)
                    for host, s in sidecars.items()
                }
                if hosts.get(V0_HOST):
                    v0_data.add(key[1:])
                if not any(hosts.values()) and key not in allowed:
                    empty.append(f"{key}: {target['expr']}")
    return empty, v0_data


def _finite(result: list[dict[str, Any]]) -> bool:
    samples = [s.get("value") for s in result] + [v for s in result for v in s.get("values", [])]
    return any(v is not None and math.isfinite(float(v[1])) for v in samples)


def _run(server: PrometheusServer, target: dict[str, Any], expr: str, start: float) -> bool:
    if target["instant"]:
        return _finite(server.query(expr))
    return _finite(server.query_range(expr, start=start, end=time.time(), step_s=1.0))


def test_every_panel_query_returns_data(
    prometheus: tuple[PrometheusServer, dict[str, str], float],
) -> None:
    """Each query of each panel gives a finite value on at least one pod (or is documented)."""
    server, sidecars, started = prometheus
    empty, v0_data = _empty_queries(server, sidecars, started, STATE_DEPENDENT)
    assert not empty, "\n".join(empty)
    assert v0_data >= V0_PROOF, V0_PROOF - v0_data


def test_annotation_queries_are_valid_promql(
    prometheus: tuple[PrometheusServer, dict[str, str], float],
) -> None:
    """The restart annotation's query evaluates without error (no restarts: it marks nothing)."""
    server, sidecars, _ = prometheus
    for uid, board in _boards().items():
        for annotation in board["annotations"]["list"]:
            server.query(expand(annotation["expr"], _values(uid, sidecars[V1_HOST], V1_HOST)))


def test_variables_list_the_pods_and_host_finds_their_vllm(
    prometheus: tuple[PrometheusServer, dict[str, str], float],
) -> None:
    """label_values() queries list both sidecars; the host regex turns each into its host."""
    server, sidecars, _ = prometheus
    board = _boards()["vllm-headroom-instance"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    for name in ("job", "model", "instance", "host", "engine"):  # cluster: absent here
        query = re.fullmatch(r"label_values\((.*), (\w+)\)", variables[name]["query"])
        assert query, name
        selector, label = query.groups()
        values: dict[str, str | list[str]] = {
            "cluster": ".*",
            "job": ".*",
            "namespace": ".*",
            "model": ".*",
        }
        values["instance"] = sidecars[V0_HOST] if name == "host" else ".*"
        found = {s["metric"].get(label) for s in server.query(expand(selector, values))} - {None}
        assert found, name
        if name == "instance":
            assert found == set(sidecars.values())
        if name == "host":
            pattern = variables["host"]["regex"].strip("/")
            hosts = [re.match(pattern, value) for value in found]
            assert {m[1] for m in hosts if m} == {V0_HOST}


@pytest.fixture
def sidecar(vllm_server: VllmServer, tiny_llama: Path, e2e_logs: Path) -> Iterator[str]:
    """Our real sidecar (the installed ``vllm-headroom serve``) polling vLLM every 2 seconds."""
    group, url = start_sidecar(
        vllm_server.base_url,
        log_path=e2e_logs / "sidecar-dashboards.log",
        poll_interval_s=2,
        model=tiny_llama,
        json_logs=True,
        entry=[str(VENV_BIN / "vllm-headroom")],
    )
    try:
        yield url.removeprefix("http://")
    finally:
        group.stop()


def test_every_panel_query_returns_data_after_a_real_burst(
    vllm_server: VllmServer,
    sidecar: str,
    prometheus_factory: Callable[..., PrometheusServer],
    tmp_path: Path,
) -> None:
    """Real vLLM, sidecar and Prometheus: after a preempting burst every query has data."""
    server = prometheus_factory(
        [
            ScrapeJob("headroom", [f"http://{sidecar}/metrics"]),
            ScrapeJob("vllm", [vllm_server.metrics_url]),
        ],
        rule_files=[rule_file_for_test(RULES, tmp_path / "rules.yml")],
    )
    server.wait_for_targets_up("headroom")
    server.wait_for_targets_up("vllm")
    started = time.time()
    # Long enough for several sidecar polls to catch sequences running (one 8-request wave
    # can finish between two polls on a fast machine).
    burst(vllm_server.base_url, REFERENCE_MODEL_NAME, duration_s=8.0, **BURST_LOAD)
    # The sidecar polls every 2 s and Prometheus scrapes every second: let both catch up.
    wait_until(
        lambda: server.query("headroom_context_window_requests > 0"),
        timeout_s=30,
        what="the burst's requests in the sidecar's window",
    )
    time.sleep(3)
    allowed = STATE_DEPENDENT | NEEDS_GPU_OR_V0 | NEEDS_KV_CONNECTOR
    empty, _ = _empty_queries(server, {V1_HOST: sidecar}, started, allowed)
    assert not empty, "\n".join(empty)
    # Not just any data: the preemption panel shows the burst's preemptions, both figures.
    board = _boards()["vllm-headroom-instance"]
    [panel] = [p for p in board["panels"] if p["title"] == "Preemption rate"]
    values = _values("vllm-headroom-instance", sidecar, V1_HOST)
    for target in panel["targets"]:
        series = server.query_range(
            expand(target["expr"], values), start=started, end=time.time(), step_s=1.0
        )
        finite = [float(v[1]) for s in series for v in s["values"] if math.isfinite(float(v[1]))]
        peak = max(finite, default=0.0)
        assert peak > 0, target["legendFormat"]
