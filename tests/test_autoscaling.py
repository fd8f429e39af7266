"""Specification of autoscaling on headroom: the chart's ScaledObject, HPA and their policy.

With ``autoscaling.kind`` ``keda`` or ``hpa`` (shape ``vllm``) the chart scales vLLM's replicas on
one metric, the replicas the model needs (``vllm-headroom.autoscaling.replicasNeeded``), summed
over the pods of the release's vLLM Deployment::

    demand      = sum(p95 ceiling - p95 available) + sum(requests waiting)   (p95 sequences)
    per replica = sum(p95 ceiling) / replicas reporting one
    needed      = max((demand + reserveSequences) / per replica,
                      demand / per replica / (1 - reserveRatio))

with an AverageValue target of 1 per replica, so the HorizontalPodAutoscaler (KEDA's, or the
chart's own on prometheus-adapter's external metric) wants ``ceil(needed)`` replicas: more when
headroom is short, fewer only when the replicas left keep the reserve.

What this proves, offline:

- the PromQL the chart renders (KEDA's query, the recording rule prometheus-adapter serves, the
  adapter's own query over it) computes exactly :func:`replicas_needed` (promtool evaluates them);
- the policy holds when recorded headroom series are replayed through the Kubernetes HPA
  algorithm (:func:`hpa_sync`, a model of pkg/controller/podautoscaler: the 10% tolerance, the
  stabilization windows, the scaling policies, the chart's default behavior): the simulator's
  demo traffic with its long-document burst, and a real vLLM 0.32 burst
  (``tests/fixtures/vllm-cpu/burst``), each through the exporter's own derivations;
- the rendered ScaledObject validates against KEDA's CRD, the HPA with kubernetes-validate, the
  adapter rule against prometheus-adapter's configuration types (``tests/fixtures/autoscaling``);
- scaling to zero (KEDA, with a wake trigger) trips no availability alert of
  ``alerts/vllm-headroom.rules.yml``, while a vLLM left without its sidecar still does.

The replays are open-loop: the recorded demand (sequences in use and requests waiting) is the
model's, whatever the replica count, and each replica's p95 ceiling is the recorded one.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
import subprocess
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter.core.ceiling import RunningLimit
from exporter.core.derive import Sample, WindowSettings, derive_target, next_sample
from exporter.core.reasons import MaxNumSeqsSource
from exporter.sim.engine import Simulation
from exporter.sim.exposition import render as render_sim_metrics
from exporter.sim.scenario import Scenario
from exporter.sim.traffic import default_profile
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths
from tests.test_helm import (
    CHART,
    NAMESPACE,
    RELEASE,
    RULES_FILE,
    Manifest,
    load_yaml,
    only,
    render,
    render_error,
    validate_manifest,
)
from tests.test_recipes import _strict

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from pathlib import Path

FIXTURES = paths.FIXTURES / "autoscaling"
KEDA_CRD = FIXTURES / "keda.sh_scaledobjects.yaml"
ADAPTER_CONFIG_GO = FIXTURES / "prometheus-adapter-config.go"
BURST = paths.VLLM_CPU / "burst"

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEPLOYMENT = f"{RELEASE}-vllm-headroom"
RECORD = "headroom:model_replicas_needed:p95_reserve"
WAKE = (
    '--set-json autoscaling.keda.wakeTriggers=[{"type":"cron","metadata":{"timezone":"UTC",'
    '"start":"0 8 * * *","end":"0 18 * * *","desiredReplicas":"1"}}]'
)
BASE = (f"--set vllm.model={MODEL}",)
KEDA = (*BASE, "--set autoscaling.kind=keda")
KEDA_TO_ZERO = (*KEDA, "--set autoscaling.minReplicas=0", WAKE)
HPA = (*BASE, "--set autoscaling.kind=hpa", "--set prometheusRule.labels.release=kps")
#: Every shape of the autoscaling objects: (case, --set flags).
KINDS = [("keda", KEDA), ("keda-to-zero", KEDA_TO_ZERO), ("hpa", HPA)]

#: What the chart's values.yaml sets (read from it, so a change there is replayed here).
DEFAULTS = load_yaml(CHART / "values.yaml")["autoscaling"]


# ==================================================================================== policy


@dataclass(frozen=True, slots=True)
class FleetReading:
    """The model's replicas at one moment, as the query sums them."""

    t: float
    #: Sums over every replica and engine of the p95 ceiling and the p95 headroom (sequences).
    ceiling: float
    available: float
    #: Requests waiting in the replicas' queues.
    waiting: float
    #: Replicas reporting a p95 ceiling.
    reporting: int = 1

    @property
    def demand(self) -> float:
        """p95 sequences in use, plus the requests waiting for one."""
        return self.ceiling - self.available + self.waiting

    @property
    def per_replica(self) -> float:
        """One replica's p95 ceiling."""
        return self.ceiling / self.reporting


def replicas_needed(
    reading: FleetReading | None,
    *,
    reserve_sequences: float,
    reserve_ratio: float,
    gated: bool = False,
) -> float | None:
    """The chart's metric, in the PromQL's order of operations; None where the query is empty."""
    if reading is None or reading.reporting == 0 or reading.ceiling <= 0:
        return None
    per_replica = reading.ceiling / reading.reporting
    demand = reading.ceiling - reading.available + reading.waiting
    by_sequences = (demand + reserve_sequences) / per_replica
    by_ratio = demand / per_replica / (1 - reserve_ratio)
    needed = by_sequences if by_sequences >= by_ratio else by_ratio
    return needed * (1.0 if demand > 0 else 0.0) if gated else needed


def keeps_the_reserve(
    replicas: int, reading: FleetReading, *, reserve_sequences: float, reserve_ratio: float
) -> bool:
    """Whether ``replicas`` replicas hold the reading's demand and still keep the reserve."""
    capacity = replicas * reading.per_replica
    headroom = capacity - reading.demand
    slack = 1e-9 * max(1.0, capacity)
    return headroom + slack >= reserve_sequences and headroom + slack >= reserve_ratio * capacity


# ============================================================================ the HPA algorithm


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """One HPAScalingPolicy: Pods or Percent per period."""

    kind: str
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction of an HPA's behavior."""

    window_s: float
    select: str
    policies: tuple[ScalingPolicy, ...]

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, default: ScalingRules) -> ScalingRules:
        """HPAScalingRules as Kubernetes defaults them: each omitted field takes the default's."""
        spec = spec or {}
        policies = tuple(
            ScalingPolicy(p["type"], int(p["value"]), float(p["periodSeconds"]))
            for p in spec.get("policies", [])
        )
        return cls(
            window_s=float(spec.get("stabilizationWindowSeconds", default.window_s)),
            select=spec.get("selectPolicy", default.select),
            policies=policies or default.policies,
        )


#: Kubernetes' defaults (pkg/apis/autoscaling/v2/defaults.go; the controller's 5-minute
#: downscale stabilization): up at once by 4 pods or 100% per 15 s, down by 100% per 15 s.
DEFAULT_UP = ScalingRules(
    0.0, "Max", (ScalingPolicy("Pods", 4, 15.0), ScalingPolicy("Percent", 100, 15.0))
)
DEFAULT_DOWN = ScalingRules(300.0, "Max", (ScalingPolicy("Percent", 100, 15.0),))


@dataclass(frozen=True, slots=True)
class Hpa:
    """An autoscaling/v2 HPA on one external metric with an AverageValue target."""

    min_replicas: int
    max_replicas: int
    up: ScalingRules = DEFAULT_UP
    down: ScalingRules = DEFAULT_DOWN
    target: float = 1.0
    #: The controller's --horizontal-pod-autoscaler-tolerance.
    tolerance: float = 0.1

    @classmethod
    def from_spec(cls, min_replicas: int, max_replicas: int, behavior: Mapping[str, Any]) -> Hpa:
        """The HPA an object's minReplicas, maxReplicas and behavior describe."""
        return cls(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            up=ScalingRules.from_spec(behavior.get("scaleUp"), DEFAULT_UP),
            down=ScalingRules.from_spec(behavior.get("scaleDown"), DEFAULT_DOWN),
        )


@dataclass(frozen=True, slots=True)
class HpaState:
    """What the controller remembers between syncs."""

    replicas: int
    #: (time, unstabilized recommendation).
    recommendations: tuple[tuple[float, int], ...] = ()
    #: (time, replicas added) and (time, replicas removed).
    up_events: tuple[tuple[float, int], ...] = ()
    down_events: tuple[tuple[float, int], ...] = ()


def _changed_within(events: Iterable[tuple[float, int]], now: float, period_s: float) -> int:
    return sum(change for t, change in events if t > now - period_s)


def _limit(hpa: Hpa, state: HpaState, now: float, *, up: bool) -> int:
    """calculateScaleUpLimitWithScalingRules / calculateScaleDownLimitWithBehaviors."""
    rules = hpa.up if up else hpa.down
    current = state.replicas
    if rules.select == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        added = _changed_within(state.up_events, now, policy.period_s)
        removed = _changed_within(state.down_events, now, policy.period_s)
        start = current - added + removed
        if policy.kind == "Pods":
            proposals.append(start + policy.value if up else start - policy.value)
        elif up:
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
        else:
            proposals.append(int(start * (1 - policy.value / 100)))
    # Max picks the largest change: the highest limit up, the lowest down; Min the other way.
    most = max if up else min
    least = min if up else max
    return (most if rules.select == "Max" else least)(proposals)


def hpa_sync(hpa: Hpa, state: HpaState, now: float, usage: float | None) -> HpaState:
    """One sync of the HPA controller; ``usage`` is the metric, None when it cannot be read.

    The replica proposal of GetExternalPerPodMetricReplicas (the metric in thousandths, as
    Quantity.MilliValue rounds it up; no change within the tolerance), then
    stabilizeRecommendationWithBehaviors and convertDesiredReplicasWithBehaviorRate.
    """
    current = state.replicas
    if current > hpa.max_replicas or current < hpa.min_replicas:
        return _scaled(state, now, min(max(current, hpa.min_replicas), hpa.max_replicas))
    if usage is None:
        # FailedGetExternalMetric: ScalingActive false, nothing changes, nothing is recorded.
        return state
    usage_milli = math.ceil(usage * 1000 - 1e-9)
    target_milli = round(hpa.target * 1000)
    proposal = current
    if abs(1.0 - usage_milli / (target_milli * current)) > hpa.tolerance:
        proposal = math.ceil(usage_milli / target_milli)
    keep = max(hpa.up.window_s, hpa.down.window_s)
    earlier = [(t, r) for t, r in state.recommendations if t > now - keep]
    up_bound = min([proposal, *(r for t, r in earlier if t > now - hpa.up.window_s)])
    down_bound = max([proposal, *(r for t, r in earlier if t > now - hpa.down.window_s)])
    stabilized = min(max(current, up_bound), down_bound)
    desired = stabilized
    if stabilized > current:
        allowed = min(hpa.max_replicas, max(current, _limit(hpa, state, now, up=True)))
        desired = min(stabilized, allowed)
    elif stabilized < current:
        allowed = max(hpa.min_replicas, min(current, _limit(hpa, state, now, up=False)))
        desired = max(stabilized, allowed)
    state = replace(state, recommendations=(*earlier, (now, proposal)))
    return _scaled(state, now, desired)


def _scaled(state: HpaState, now: float, desired: int) -> HpaState:
    change = desired - state.replicas
    if change > 0:
        return replace(state, replicas=desired, up_events=(*state.up_events, (now, change)))
    if change < 0:
        return replace(state, replicas=desired, down_events=(*state.down_events, (now, -change)))
    return state


@dataclass(frozen=True, slots=True)
class Decision:
    """One sync of a replay: what the metric said and what the HPA did."""

    t: float
    reading: FleetReading | None
    needed: float | None
    before: int
    after: int


def replay(
    readings: Sequence[FleetReading],
    hpa: Hpa,
    *,
    needed: Callable[[FleetReading | None], float | None],
    sync_s: float = 15.0,
    scrape_s: float = 0.0,
) -> list[Decision]:
    """The HPA's syncs over a recorded series, reading the latest scrape at each sync.

    ``scrape_s``: Prometheus' scrape interval (0: it holds every reading).
    """
    scraped = _scrapes(readings, scrape_s) if scrape_s else list(readings)
    state = HpaState(replicas=hpa.min_replicas)
    decisions = []
    t = readings[0].t + sync_s
    while t <= readings[-1].t:
        latest = [r for r in scraped if r.t <= t]
        reading = latest[-1] if latest else None
        value = needed(reading)
        after = hpa_sync(hpa, state, t, value)
        decisions.append(Decision(t, reading, value, state.replicas, after.replicas))
        state = after
        t += sync_s
    return decisions


def _scrapes(readings: Sequence[FleetReading], scrape_s: float) -> list[FleetReading]:
    kept: list[FleetReading] = []
    for reading in readings:
        if not kept or reading.t >= kept[-1].t + scrape_s - 1e-9:
            kept.append(reading)
    return kept


# ------------------------------------------------------------------ the algorithm, by itself


def test_hpa_holds_within_the_tolerance_and_scales_outside_it() -> None:
    """At 4 replicas 4.3 needed is within 10%: no change; 4.5 adds one; 2.5 removes one, later."""
    hpa = Hpa(min_replicas=1, max_replicas=10)
    at_four = HpaState(replicas=4)
    assert hpa_sync(hpa, at_four, 15.0, 4.3).replicas == 4
    assert hpa_sync(hpa, at_four, 15.0, 4.5).replicas == 5
    assert hpa_sync(hpa, at_four, 15.0, 3.7).replicas == 4
    # Down: the 300 s window still holds the 4 recommended a minute ago; 5 minutes on it does not.
    held = HpaState(replicas=4, recommendations=((-60.0, 4),))
    assert hpa_sync(hpa, held, 0.0, 2.5).replicas == 4
    assert hpa_sync(hpa, held, 230.0, 2.5).replicas == 4
    assert hpa_sync(hpa, held, 300.0, 2.5).replicas == 3


def test_hpa_rate_limits_follow_the_policies() -> None:
    """Up by at most 4 pods or 100% per 15 s (the larger); down by the chart's 1 pod per 120 s."""
    hpa = Hpa.from_spec(1, 40, DEFAULTS["behavior"])
    assert hpa.down == ScalingRules(600.0, "Max", (ScalingPolicy("Pods", 1, 120.0),))
    assert hpa.up == DEFAULT_UP
    assert hpa_sync(hpa, HpaState(replicas=2), 0.0, 30.0).replicas == 6  # 2 + 4 > 2 x 2
    assert hpa_sync(hpa, HpaState(replicas=10), 0.0, 30.0).replicas == 20  # 100% > 4 pods
    recent = HpaState(replicas=10, down_events=((-100.0, 1),))
    assert hpa_sync(hpa, recent, 0.0, 2.0).replicas == 10  # one removed 100 s ago
    assert hpa_sync(hpa, recent, 30.0, 2.0).replicas == 9
    assert hpa_sync(hpa, HpaState(replicas=3), 0.0, None).replicas == 3  # no metric: hold


# ================================================================================ the replays


def _engine_reading(
    t: float, samples: Sequence[Sample], limit: RunningLimit | None
) -> FleetReading | None:
    (engine,) = derive_target(samples, windows=WindowSettings(), running_limit=limit).engines
    if engine.p95_ceiling_sequences is None or engine.p95_available_sequences is None:
        return None
    return FleetReading(
        t=t,
        ceiling=engine.p95_ceiling_sequences,
        available=engine.p95_available_sequences,
        waiting=engine.requests_waiting or 0.0,
    )


def readings_from_payloads(
    payloads: Iterable[tuple[float, bytes]], limit: RunningLimit | None = None
) -> list[FleetReading]:
    """What the sidecar reports for each ``/metrics`` payload, through its own derivations."""
    window = WindowSettings().context_seconds
    samples: list[Sample] = []
    readings = []
    for t, payload in payloads:
        samples.append(
            next_sample(samples[-1] if samples else None, t, parse_vllm_metrics(payload))
        )
        samples = [s for s in samples if s.t >= t - window - 60.0]
        reading = _engine_reading(t, samples, limit)
        if reading is not None:
            readings.append(reading)
    return readings


@pytest.fixture(scope="module")
def simulated() -> list[FleetReading]:
    """The demo's traffic once through (short, chat, agents, the burst, calm), then 20 idle min.

    The simulated Llama-3.1-8B on an H100 (max_num_seqs 256), polled every 5 s.
    """
    scenario = Scenario(traffic=replace(default_profile(), repeat=False))
    simulation = Simulation(scenario, seed=7)
    cycle = scenario.traffic.cycle_s

    def payloads() -> Iterable[tuple[float, bytes]]:
        t = 5.0
        while t <= cycle + 1200.0:
            simulation.advance_to(t)
            yield t, render_sim_metrics(simulation.metrics(), scenario, started_at=0.0)
            t += 5.0

    limit = RunningLimit(scenario.engine.max_num_seqs, MaxNumSeqsSource.COMMAND_LINE)
    return readings_from_payloads(payloads(), limit)


@pytest.fixture(scope="module")
def real_burst() -> list[FleetReading]:
    """Real vLLM 0.32 (CPU, the reference pool) through a preempting burst, then 20 idle min.

    The recording's last (idle) payload stands for the minutes after it.
    """
    index = json.loads((BURST / "index.json").read_text())
    entries = [(s["monotonic_s"], (BURST / s["file"]).read_bytes()) for s in index["samples"]]
    start, end = entries[0][0], entries[-1][0]
    assert index["samples"][-1]["phase"] == "idle-after"
    idle = [(end + k, entries[-1][1]) for k in range(5, 1201, 5)]
    return [replace(r, t=r.t - start) for r in readings_from_payloads([*entries, *idle])]


def _needed_for(reserve_sequences: float, reserve_ratio: float, *, gated: bool = False) -> Any:
    def needed(reading: FleetReading | None) -> float | None:
        return replicas_needed(
            reading, reserve_sequences=reserve_sequences, reserve_ratio=reserve_ratio, gated=gated
        )

    return needed


def assert_the_policy_holds(
    decisions: Sequence[Decision],
    hpa: Hpa,
    *,
    reserve_sequences: float,
    reserve_ratio: float,
) -> None:
    """Short headroom adds replicas; a removal keeps the reserve for what runs and waits then."""
    for d in decisions:
        if d.needed is None:
            assert d.after == d.before, d
            continue
        if d.needed > (1 + hpa.tolerance) * d.before and d.before < hpa.max_replicas:
            assert d.after > d.before, f"headroom short at {d.t:.0f} s and nothing added: {d}"
        if d.after < d.before:
            assert d.reading is not None
            assert keeps_the_reserve(
                d.after,
                d.reading,
                reserve_sequences=reserve_sequences,
                reserve_ratio=reserve_ratio,
            ), f"removal at {d.t:.0f} s leaves too little headroom: {d}"
            # Nothing in the stabilization window asked for more than what is left (within the
            # tolerance, where the HPA keeps the count it had).
            window = [e for e in decisions if d.t - hpa.down.window_s < e.t <= d.t and e.needed]
            assert all(e.needed <= (1 + hpa.tolerance) * d.after for e in window if e.needed), d


def reversals(decisions: Sequence[Decision]) -> int:
    """How often the replica count turned from rising to falling or back."""
    moves = [d.after - d.before for d in decisions if d.after != d.before]
    return sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))


def test_the_simulated_burst_scales_out_and_back_keeping_the_reserve(
    simulated: list[FleetReading],
) -> None:
    """The demo's traffic at the chart's defaults: up for the floods, down to 1 only once idle."""
    reserve = (DEFAULTS["reserveSequences"], DEFAULTS["reserveRatio"])
    hpa = Hpa.from_spec(DEFAULTS["minReplicas"], 8, DEFAULTS["behavior"])
    decisions = replay(
        simulated, hpa, needed=_needed_for(*reserve), scrape_s=30.0
    )  # the chart's podMonitor.interval
    assert_the_policy_holds(decisions, hpa, reserve_sequences=reserve[0], reserve_ratio=reserve[1])
    peak = max(d.after for d in decisions)
    # The flood of short requests queues hundreds beyond max_num_seqs 256: several replicas.
    assert peak >= 3, peak
    # The long-document burst alone (replayed from the quiet agents phase on, at one replica):
    # the p95 ceiling falls to some 95 sequences, requests queue, and a second replica comes.
    quiet = [r for r in simulated if r.t >= 180.0]
    alone = replay(quiet, hpa, needed=_needed_for(*reserve), scrape_s=30.0)
    assert_the_policy_holds(alone, hpa, reserve_sequences=reserve[0], reserve_ratio=reserve[1])
    added = [d for d in alone if d.after > d.before]
    assert added, "the burst added no replica"
    assert all(210.0 <= d.t <= 300.0 for d in added), added  # during the burst phase
    assert max(d.after for d in alone) == 2
    assert alone[-1].after == hpa.min_replicas
    assert decisions[-1].after == hpa.min_replicas
    # Down one replica at a time, only after the 10-minute window: one turn, no flapping.
    assert reversals(decisions) <= 1, [
        (d.t, d.before, d.after) for d in decisions if d.after != d.before
    ]
    last_up = max(d.t for d in decisions if d.after > d.before)
    first_down = min(d.t for d in decisions if d.after < d.before)
    assert first_down - last_up >= hpa.down.window_s


def test_the_real_vllm_burst_scales_out_and_back_keeping_the_reserve(
    real_burst: list[FleetReading],
) -> None:
    """Real vLLM: its one-sequence p95 ceiling overflows with 6 waiting; replicas follow."""
    # The reference pool holds one 480-token sequence: reserve one sequence per replica's worth.
    reserve_sequences, reserve_ratio = 1.0, DEFAULTS["reserveRatio"]
    hpa = Hpa.from_spec(1, 12, DEFAULTS["behavior"])
    decisions = replay(real_burst, hpa, needed=_needed_for(reserve_sequences, reserve_ratio))
    assert_the_policy_holds(
        decisions, hpa, reserve_sequences=reserve_sequences, reserve_ratio=reserve_ratio
    )
    during = [d for d in decisions if d.reading is not None and d.reading.waiting > 0]
    assert during, "the burst queued requests"
    assert max(d.after for d in decisions) >= 5
    assert decisions[-1].after == 1
    assert reversals(decisions) <= 1


def test_scale_to_zero_goes_idle_after_the_cooldown_and_never_while_busy(
    simulated: list[FleetReading],
) -> None:
    """KEDA's trigger is active exactly while requests run or wait; zero only after cooldown."""
    gated = _needed_for(DEFAULTS["reserveSequences"], DEFAULTS["reserveRatio"], gated=True)
    cooldown = float(DEFAULTS["keda"]["cooldownPeriod"])
    active = []
    for reading in simulated:
        value = gated(reading)
        assert value is not None
        assert (value > 0) == (reading.demand > 0), reading
        if value > 0:
            active.append(reading.t)
    assert active
    # KEDA scales to zero once no trigger was active for cooldownPeriod: never between two
    # active moments of the traffic, only after the last one (the 20 idle minutes).
    assert max(b - a for a, b in itertools.pairwise(active)) < cooldown
    assert simulated[-1].t - active[-1] >= cooldown
    # With no replica there is nothing to read: KEDA's query is empty, the wake trigger decides.
    assert gated(None) is None


# ============================================================================ the rendered PromQL


def rendered(helm: Path, sets: Sequence[str]) -> list[Manifest]:
    """The chart with autoscaling values."""
    return render(helm, sets=sets)


def keda_query(manifests: Sequence[Manifest]) -> str:
    """The headroom trigger's query of the ScaledObject."""
    triggers = only(manifests, "ScaledObject")["spec"]["triggers"]
    (headroom,) = [t for t in triggers if t.get("name") == "headroom"]
    query: str = headroom["metadata"]["query"]
    return query


def adapter_rule(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """prometheus-adapter's external rule, from the ConfigMap's config.yaml."""
    configmap = only(manifests, "ConfigMap", f"{DEPLOYMENT}-prometheus-adapter")
    (rule,) = yaml.safe_load(configmap["data"]["config.yaml"])["externalRules"]
    values = yaml.safe_load(configmap["data"]["values.yaml"])
    assert values == {"rules": {"external": [rule]}}
    result: dict[str, Any] = rule
    return result


def adapter_query(rule: Mapping[str, Any], namespace: str, selector: Mapping[str, str]) -> str:
    """The query prometheus-adapter sends for an HPA (metricsQuery.BuildExternal's template).

    LabelMatchers: the HPA's selector, then the HPA's namespace (namespaced rules).
    """
    matchers = [f'{k}="{v}"' for k, v in selector.items()]
    matchers.append(f'namespace="{namespace}"')
    template: str = rule["metricsQuery"]
    series: str = rule["name"]["matches"].strip("^$")
    return template.replace("<<.Series>>", series).replace("<<.LabelMatchers>>", ",".join(matchers))


#: Situations the query must get right: (name, {pod suffix: (ceiling, available, waiting)}).
SITUATIONS: list[tuple[str, dict[str, tuple[float, float, float]]]] = [
    ("two replicas, headroom short", {"x2x7k": (90.0, 4.0, 7.0), "m4q9z": (94.0, 11.0, 0.0)}),
    ("two replicas, half used", {"x2x7k": (90.0, 50.0, 0.0), "m4q9z": (94.0, 41.0, 0.0)}),
    ("idle", {"x2x7k": (93.0, 93.0, 0.0)}),
    ("one replica, queue growing", {"x2x7k": (256.0, 0.0, 445.0)}),
]


def _fleet(situation: Mapping[str, tuple[float, float, float]]) -> FleetReading:
    return FleetReading(
        t=0.0,
        ceiling=sum(c for c, _, _ in situation.values()),
        available=sum(a for _, a, _ in situation.values()),
        waiting=sum(w for _, _, w in situation.values()),
        reporting=len(situation),
    )


def _series(name: str, replica: str, value: float, *, pod: str | None = None) -> dict[str, str]:
    """One input series of a sidecar in pod ``<Deployment>-5d8f7b9c4-<replica>`` (engine 0)."""
    pod = pod or f"{DEPLOYMENT}-5d8f7b9c4-{replica}"
    labels = (
        f'namespace="{NAMESPACE}",pod="{pod}",instance="{replica}:8742",'
        f'model_name="{MODEL}",engine="0"'
    )
    return {"series": f"{name}{{{labels}}}", "values": f"{value!r}x10"}


def promtool_test(
    promtool: Path, tmp_path: Path, rule_files: Sequence[Path], tests: Sequence[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    """Run ``promtool test rules`` on one generated unit-test file."""
    unit = tmp_path / "unit.yml"
    unit.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(p) for p in rule_files],
                "evaluation_interval": "1m",
                "tests": list(tests),
            },
            width=100_000,
        )
    )
    return subprocess.run(
        [str(promtool), "test", "rules", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.e2e
def test_the_rendered_promql_computes_the_policy(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """KEDA's query, the recording rule and the adapter's query equal replicas_needed, exactly."""
    reserve = {
        "reserve_sequences": DEFAULTS["reserveSequences"],
        "reserve_ratio": DEFAULTS["reserveRatio"],
    }
    plain, gated = keda_query(rendered(helm, KEDA)), keda_query(rendered(helm, KEDA_TO_ZERO))
    hpa_objects = rendered(helm, HPA)
    groups = only(hpa_objects, "PrometheusRule")["spec"]["groups"]
    rules = tmp_path / "autoscaling.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}, width=100_000))
    hpa = only(hpa_objects, "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    served = adapter_query(
        adapter_rule(hpa_objects),
        NAMESPACE,
        metric["external"]["metric"]["selector"]["matchLabels"],
    )
    model_labels = f'namespace="{NAMESPACE}",model_name="{MODEL}"'
    deployment_label = f'headroom_deployment="{DEPLOYMENT}"'
    tests = []
    for name, situation in SITUATIONS:
        series = [
            s
            for instance, (ceiling, available, waiting) in situation.items()
            for s in (
                _series("headroom_p95_ceiling_sequences", instance, ceiling),
                _series("headroom_p95_available_sequences", instance, available),
                _series("headroom_requests_waiting", instance, waiting),
            )
        ]
        # Another Deployment's pod (its name extends this one's), which must not count.
        other = f"{DEPLOYMENT}-canary-6c9d8f7b5-qx2lm"
        series.append(_series("headroom_p95_ceiling_sequences", "x", 500.0, pod=other))
        fleet = _fleet(situation)
        value = replicas_needed(fleet, **reserve)
        zero_or_value = replicas_needed(fleet, gated=True, **reserve)
        assert value is not None
        assert zero_or_value is not None
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": plain,
                        "eval_time": "5m",
                        "exp_samples": [{"labels": f"{{{model_labels}}}", "value": value}],
                    },
                    {
                        "expr": gated,
                        "eval_time": "5m",
                        "exp_samples": [{"labels": f"{{{model_labels}}}", "value": zero_or_value}],
                    },
                    {
                        "expr": RECORD,
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": f"{RECORD}{{{model_labels},{deployment_label}}}",
                                "value": value,
                            }
                        ],
                    },
                    {
                        "expr": served,
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": f'{{namespace="{NAMESPACE}",{deployment_label}}}',
                                "value": value,
                            }
                        ],
                    },
                ],
            }
        )
    # A replica that reports no p95 ceiling yet (no request finished): nothing, so the HPA holds.
    tests.append(
        {
            "name": "no ceiling yet",
            "interval": "1m",
            "input_series": [_series("headroom_requests_waiting", "x2x7k", 3.0)],
            "promql_expr_test": [
                {"expr": q, "eval_time": "5m", "exp_samples": []} for q in (plain, gated, RECORD)
            ],
        }
    )
    done = promtool_test(promtool, tmp_path, [rules], tests)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    # The idle case is 0 when gated and the reserve alone otherwise: the two differ.
    idle = _fleet(dict(SITUATIONS)["idle"])
    assert replicas_needed(idle, gated=True, **reserve) == 0.0
    assert (replicas_needed(idle, **reserve) or 0.0) > 0.0


@pytest.mark.e2e
def test_a_wrong_expectation_fails_promtool(helm: Path, promtool: Path, tmp_path: Path) -> None:
    """The comparison above is not blind: one replica more than the policy says fails it."""
    query = keda_query(rendered(helm, KEDA))
    situation = dict(SITUATIONS)["two replicas, headroom short"]
    value = replicas_needed(
        _fleet(situation),
        reserve_sequences=DEFAULTS["reserveSequences"],
        reserve_ratio=DEFAULTS["reserveRatio"],
    )
    assert value is not None
    series = [
        s
        for instance, (c, a, w) in situation.items()
        for s in (
            _series("headroom_p95_ceiling_sequences", instance, c),
            _series("headroom_p95_available_sequences", instance, a),
            _series("headroom_requests_waiting", instance, w),
        )
    ]
    labels = f'{{namespace="{NAMESPACE}",model_name="{MODEL}"}}'
    test = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            {
                "expr": query,
                "eval_time": "5m",
                "exp_samples": [{"labels": labels, "value": value + 1}],
            }
        ],
    }
    done = promtool_test(promtool, tmp_path, [], [test])
    assert done.returncode != 0, done.stdout


# ================================================================================== the objects


def keda_schema() -> dict[str, Any]:
    """KEDA's ScaledObject v1alpha1 schema, strict: unknown fields fail."""
    crd = load_yaml(KEDA_CRD)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = _strict(version["schema"]["openAPIV3Schema"])
    return schema


_GO_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.MULTILINE | re.DOTALL)
_GO_FIELD = re.compile(r'^\s+\w+\s+([\w.\[\]*]+)\s+`json:"[^"]*" yaml:"([^,"]+)', re.MULTILINE)


def adapter_schema() -> dict[str, Any]:
    """prometheus-adapter's MetricsDiscoveryConfig as a strict JSON schema, from its Go structs."""
    source = ADAPTER_CONFIG_GO.read_text()
    structs = {
        name: {tag: kind for kind, tag in _GO_FIELD.findall(body)}
        for name, body in _GO_STRUCT.findall(source)
    }

    def of(kind: str) -> dict[str, Any]:
        kind = kind.lstrip("*")
        if kind.startswith("[]"):
            return {"type": "array", "items": of(kind[2:])}
        if kind.startswith("map[string]"):
            return {"type": "object", "additionalProperties": of(kind.removeprefix("map[string]"))}
        if kind in structs:
            return {
                "type": "object",
                "additionalProperties": False,
                "properties": {tag: of(k) for tag, k in structs[kind].items()},
            }
        return {"string": {"type": "string"}, "bool": {"type": "boolean"}}.get(
            kind,
            {"type": "string"},  # pmodel.Duration: "5m"
        )

    assert {"MetricsDiscoveryConfig", "DiscoveryRule", "ResourceMapping", "NameMapping"} <= set(
        structs
    )
    return of("MetricsDiscoveryConfig")


@pytest.mark.e2e
@pytest.mark.parametrize(("case", "sets"), KINDS, ids=[k for k, _ in KINDS])
def test_lint_strict_passes_with_autoscaling(helm: Path, case: str, sets: tuple[str, ...]) -> None:
    """helm lint --strict passes each autoscaling kind (no warning, no hidden fail())."""
    args = [arg for item in sets for arg in item.split(" ", 1)]
    done = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for word in ("Fail:", "[WARNING]", "[ERROR]"):
        assert word not in output, output


@pytest.mark.e2e
@pytest.mark.parametrize(("case", "sets"), KINDS, ids=[k for k, _ in KINDS])
def test_every_autoscaling_object_validates(helm: Path, case: str, sets: tuple[str, ...]) -> None:
    """ScaledObject against KEDA's CRD; HPA, ConfigMap, PrometheusRule and the rest as always."""
    manifests = rendered(helm, sets)
    for manifest in manifests:
        if manifest["kind"] == "ScaledObject":
            jsonschema.validate(manifest, keda_schema())
        else:
            validate_manifest(manifest)
    kinds = {m["kind"] for m in manifests}
    if case.startswith("keda"):
        assert "ScaledObject" in kinds
        assert not kinds & {"HorizontalPodAutoscaler", "PrometheusRule"}
    else:
        assert {"HorizontalPodAutoscaler", "PrometheusRule"} <= kinds
        assert "ScaledObject" not in kinds
        jsonschema.validate({"externalRules": [adapter_rule(manifests)]}, adapter_schema())


@pytest.mark.e2e
def test_the_schemas_are_not_blind(helm: Path) -> None:
    """A misspelt ScaledObject field, adapter field or HPA field fails its schema."""
    scaled = copy.deepcopy(only(rendered(helm, KEDA), "ScaledObject"))
    scaled["spec"]["cooldownPeriods"] = 60
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda_schema())
    trigger = copy.deepcopy(only(rendered(helm, KEDA), "ScaledObject"))
    trigger["spec"]["triggers"][0]["metadata"]["threshold"] = 1  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(trigger, keda_schema())
    rule = {**adapter_rule(rendered(helm, HPA)), "metricQuery": "x"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"externalRules": [rule]}, adapter_schema())
    hpa = copy.deepcopy(only(rendered(helm, HPA), "HorizontalPodAutoscaler"))
    hpa["spec"]["metrics"][0]["external"]["target"]["averageValues"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(hpa)


@pytest.mark.e2e
def test_the_adapter_rule_serves_the_recorded_series(helm: Path) -> None:
    """The rule selects the recording rule's series by name, namespace and Deployment label."""
    manifests = rendered(helm, HPA)
    rule = adapter_rule(manifests)
    (group,) = only(manifests, "PrometheusRule")["spec"]["groups"]
    (record,) = group["rules"]
    assert record["record"] == RECORD
    assert re.fullmatch(rule["name"]["matches"], RECORD)
    assert rule["seriesQuery"].startswith(f"{RECORD}{{")
    assert rule["resources"] == {"overrides": {"namespace": {"resource": "namespace"}}}
    hpa = only(manifests, "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert metric["external"]["metric"]["selector"]["matchLabels"] == record["labels"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    # Only the fields prometheus-adapter's metricsQuery template documents.
    documented = re.search(
        r"MetricsQuery specifies.*?MetricsQuery string", ADAPTER_CONFIG_GO.read_text(), re.S
    )
    assert documented
    for field in re.findall(r"<<(\.\w+)>>", rule["metricsQuery"]):
        assert f"`{field}`" in documented.group(0), field


@pytest.mark.e2e
@pytest.mark.parametrize(("case", "sets"), KINDS, ids=[k for k, _ in KINDS])
def test_the_autoscaler_owns_the_replicas_and_scales_the_vllm_deployment(
    helm: Path, case: str, sets: tuple[str, ...]
) -> None:
    """No replicas in the Deployment (an upgrade must not reset them); the target is it."""
    manifests = rendered(helm, sets)
    deployment = only(manifests, "Deployment")
    assert "replicas" not in deployment["spec"]
    scaler = only(
        manifests, "ScaledObject" if case.startswith("keda") else "HorizontalPodAutoscaler"
    )
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    behavior = (
        scaler["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        if case.startswith("keda")
        else scaler["spec"]["behavior"]
    )
    assert behavior == DEFAULTS["behavior"]
    assert "replicas" in only(render(helm, sets=BASE), "Deployment")["spec"]


@pytest.mark.e2e
def test_keda_scales_to_zero_only_with_a_wake_trigger_and_holds_on_no_data(helm: Path) -> None:
    """minReplicaCount 0 with the wake triggers after the headroom one; no data is an error."""
    scaled = only(rendered(helm, KEDA_TO_ZERO), "ScaledObject")["spec"]
    assert scaled["minReplicaCount"] == 0
    assert scaled["cooldownPeriod"] == DEFAULTS["keda"]["cooldownPeriod"]
    headroom, wake = scaled["triggers"]
    assert headroom["type"] == "prometheus"
    assert headroom["metadata"]["ignoreNullValues"] == "false"
    assert headroom["metadata"]["activationThreshold"] == "0"
    assert headroom["metadata"]["threshold"] == "1"
    assert headroom["metricType"] == "AverageValue"
    assert wake["type"] == "cron"
    assert "> bool 0" in headroom["metadata"]["query"]
    assert "> bool 0" not in keda_query(rendered(helm, KEDA))


def _deployment_pod(name: str, template_hash: str = "5d8f9c7b6d", suffix: str = "x7k2p") -> str:
    """The name Kubernetes gives a Deployment's pod: its ReplicaSet's, then 5 random characters.

    The part before them is cut at 58 characters (``maxGeneratedNameLength`` of
    k8s.io/apiserver's names.SimpleNameGenerator), the hash's dash first.
    """
    return f"{name}-{template_hash}-"[:58] + suffix


#: Deployment names whose pods' names Kubernetes cuts: by nothing, the dash, part of the hash,
#: all of it, and a name longer than the cut itself.
LONG_DEPLOYMENTS = [
    "llama",
    "llama-3-1-70b-instruct-production-vllm-head",
    "llama-3-1-70b-instruct-production-vllm-headroom",
    "llama-3-1-70b-instruct-production-vllm-headroom-with-extra",
    "a" * 60,
]


@pytest.mark.e2e
@pytest.mark.parametrize("name", LONG_DEPLOYMENTS, ids=lambda n: f"{len(n)}-chars")
def test_the_pods_of_a_long_named_deployment_are_still_counted(helm: Path, name: str) -> None:
    """A pod name cut at 58 characters before its random end still matches the scaler's regex."""
    manifests = rendered(
        helm,
        (
            "--set shape=sidecar",
            "--set sidecar.podSelector.app=vllm",
            f"--set sidecar.workload.name={name}",
            "--set autoscaling.kind=keda",
        ),
    )
    (regex,) = set(re.findall(r'pod=~"([^"]+)"', keda_query(manifests)))
    for template_hash in ("5d8f9c7b6d", "7c5ddbdf54", "6b9f8d"):
        pod = _deployment_pod(name, template_hash)
        assert len(pod) <= 63
        assert re.fullmatch(regex, pod), (pod, regex)
    assert not re.fullmatch(regex, f"{name}x-{'5d8f9c7b6d'}-x7k2p"[:63]), regex


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("kind", "api_version", "pods", "not_pods"),
    [
        (
            "Deployment",
            "apps/v1",
            ["vllm-5d8f9c7b6d-x7k2p"],
            ["vllm-0", "vllm-prefill-5d8f9-x7k2p"],
        ),
        ("StatefulSet", "apps/v1", ["vllm-0", "vllm-12"], ["vllm-5d8f9c7b6d-x7k2p", "vllm-0-1"]),
        (
            "LeaderWorkerSet",
            "leaderworkerset.x-k8s.io/v1",
            ["vllm-0", "vllm-0-1", "vllm-3-12"],
            ["vllm-5d8f9c7b6d-x7k2p", "vllm-prefill-0"],
        ),
    ],
)
def test_shape_sidecar_scales_the_workload_it_names(
    helm: Path, kind: str, api_version: str, pods: list[str], not_pods: list[str]
) -> None:
    """In shape sidecar the scaler targets sidecar.workload and counts the pods it names so."""
    manifests = rendered(
        helm,
        (
            "--set shape=sidecar",
            "--set sidecar.podSelector.app=vllm",
            "--set sidecar.workload.name=vllm",
            f"--set sidecar.workload.kind={kind}",
            f"--set sidecar.workload.apiVersion={api_version}",
            "--set autoscaling.kind=keda",
        ),
    )
    scaled = only(manifests, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": api_version,
        "kind": kind,
        "name": "vllm",
    }
    (regex,) = set(re.findall(r'pod=~"([^"]+)"', keda_query(manifests)))
    assert all(re.fullmatch(regex, pod) for pod in pods), regex
    assert not any(re.fullmatch(regex, pod) for pod in not_pods), regex


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ((*KEDA, "--set autoscaling.minReplicas=0"), "needs autoscaling.keda.wakeTriggers"),
        (
            (*HPA, "--set autoscaling.minReplicas=0"),
            "a HorizontalPodAutoscaler keeps at least 1 replica",
        ),
        (
            (*HPA, "--set autoscaling.minReplicas=3", "--set autoscaling.maxReplicas=2"),
            "autoscaling.maxReplicas (2) is below autoscaling.minReplicas (3)",
        ),
        ((*HPA, "--set autoscaling.reserveRatio=1"), "autoscaling.reserveRatio"),
        ((*BASE, "--set autoscaling.kind=knative"), "autoscaling.kind"),
        (
            (
                "--set shape=sidecar",
                "--set sidecar.podSelector.app=vllm",
                "--set autoscaling.kind=keda",
            ),
            "autoscaling.kind=keda with shape=sidecar needs sidecar.workload.name",
        ),
        (
            (
                "--set shape=fleet",
                "--set fleet.allowlist={10.0.0.0/8}",
                "--set fleet.discovery.podSelector.app=vllm",
                "--set autoscaling.kind=hpa",
            ),
            "autoscaling.kind=hpa does not fit shape=fleet",
        ),
        (
            (
                "--set shape=sidecar",
                "--set sidecar.podSelector.app=vllm",
                "--set sidecar.workload.name=vllm",
                "--set sidecar.workload.kind=LeaderWorkerSet",
                "--set autoscaling.kind=keda",
            ),
            "kind LeaderWorkerSet has apiVersion leaderworkerset.x-k8s.io/v1, not apps/v1",
        ),
        (
            (
                "--set shape=sidecar",
                "--set sidecar.podSelector.app=vllm",
                "--set sidecar.podDisruptionBudget.enabled=true",
                "--set sidecar.podDisruptionBudget.maxUnavailable=0",
            ),
            "sidecar.podDisruptionBudget: maxUnavailable 0 would allow no eviction at all",
        ),
        (
            (
                *HPA,
                "--set autoscaling.minReplicas=2",
                "--set vllm.podDisruptionBudget.enabled=true",
                "--set vllm.podDisruptionBudget.maxUnavailable=null",
                "--set vllm.podDisruptionBudget.minAvailable=2",
            ),
            "a minAvailable below autoscaling.minReplicas",
        ),
        (
            (*BASE, "--set autoscaling.kind=hpa"),
            "prometheusRule.labels is empty, so a Prometheus that selects by label never loads "
            "the PrometheusRule of autoscaling.kind=hpa",
        ),
    ],
    ids=[
        "zero-without-wake",
        "zero-with-hpa",
        "max-below-min",
        "ratio-one",
        "unknown-kind",
        "sidecar-without-workload",
        "fleet-shape",
        "workload-api-version",
        "sidecar-pdb-blocks",
        "pdb-blocks-at-min",
        "hpa-rule-unlabelled",
    ],
)
def test_autoscaling_values_that_cannot_work_are_refused(
    helm: Path, sets: tuple[str, ...], message: str
) -> None:
    """Each impossible combination fails at render time with one line naming the value."""
    error = render_error(helm, sets=sets)
    assert message in error, error


@pytest.mark.e2e
def test_the_autoscaling_rule_passes_promtool(helm: Path, promtool: Path, tmp_path: Path) -> None:
    """The recording rule group the chart adds for prometheus-adapter is valid for promtool."""
    groups = only(rendered(helm, HPA), "PrometheusRule")["spec"]["groups"]
    rules = tmp_path / "autoscaling.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}, width=100_000))
    done = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    labels = only(rendered(helm, HPA), "PrometheusRule")["metadata"]["labels"]
    assert labels["release"] == "kps"  # picked up where the alerting rules are


# ================================================================================ scale to zero


def _availability_test(present: Sequence[str], gone: Sequence[str]) -> dict[str, Any]:
    """10 minutes with every series, then only ``present`` for 50 more; alerts at 60 minutes."""
    series = [{"series": s, "values": "1x10"} for s in gone]
    series += [{"series": s, "values": "1x60"} for s in present]
    return {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            {
                "expr": 'count by (alertname) (ALERTS{alertstate="firing"})',
                "eval_time": "60m",
                "exp_samples": [],
            }
        ],
    }


POD = f'namespace="{NAMESPACE}",pod="{DEPLOYMENT}-5d8f-abcde"'
VLLM_SERIES = [
    f'vllm:num_requests_running{{job="vllm",instance="10.0.0.7:8000",{POD},model_name="{MODEL}"}}',
    f'up{{job="vllm",instance="10.0.0.7:8000",{POD}}}',
]
SIDECAR_SERIES = [
    f'headroom_target_up{{job="headroom",instance="10.0.0.7:8742",{POD}}}',
    f'headroom_build_info{{job="headroom",instance="10.0.0.7:8742",{POD},mode="sidecar",version="0.1.0"}}',
    f'up{{job="headroom",instance="10.0.0.7:8742",{POD}}}',
]


@pytest.mark.e2e
def test_scaling_to_zero_trips_no_availability_alert(promtool: Path, tmp_path: Path) -> None:
    """vLLM and its sidecar both gone (scaled to zero): no alert of the rule file fires."""
    done = promtool_test(
        promtool, tmp_path, [RULES_FILE], [_availability_test([], [*VLLM_SERIES, *SIDECAR_SERIES])]
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.e2e
def test_a_vllm_without_its_sidecar_still_alerts(promtool: Path, tmp_path: Path) -> None:
    """The same rules do fire when vLLM stays scraped and only the sidecar goes."""
    test = _availability_test(VLLM_SERIES, SIDECAR_SERIES)
    done = promtool_test(promtool, tmp_path, [RULES_FILE], [test])
    assert done.returncode != 0
    assert "VllmHeadroomExporterAbsent" in done.stdout + done.stderr
