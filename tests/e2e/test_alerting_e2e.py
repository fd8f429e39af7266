"""The page a real preemption incident raises, through a real Prometheus and Alertmanager.

The reference vLLM (tiny Llama, 1,024-token KV pool) and the real sidecar, scraped every 5 s by
a real Prometheus under the job and target labels the Helm chart's monitors give them (release
``e2e`` in namespace ``llm``, pod ``llm-0``), evaluating the rules the chart renders for that
release (scope release, ``alertLabels`` team, ``runbookUrl`` and ``grafanaUrl``). Prometheus
sends to Debian's Alertmanager running the shipped example, ``alerts/alertmanager/
vllm-headroom.yml``, with its receivers pointed at a webhook receiver in this test, which also
serves the runbooks that the alerts link to.

Three changes to the rules, each one a Helm value makes:

- VllmHeadroomLow's ``for`` is 0s instead of 15m, so that a ticket of the same pod fires during
  the burst and the inhibition has something to mute (its 15 minutes would outlast the burst; on
  two busy cores its condition flips too often to last even 30 s, as a CI run showed). It fires
  before the page does; the ticket route's ``group_wait`` of 5 minutes holds it until the page
  mutes it, and it resolves with the burst (no request running), before that wait ends.
- The page's ``keep_firing_for`` is 30s instead of 5m, and the TTFT SLO page is disabled. The 5
  minutes exist for that SLO page alone: they keep the preemption page active, so that the SLO
  page joins the model's open page group while the SLO's 5-minute window still holds the
  burst's slow first tokens. Here they only delayed the resolved notification by 5 minutes of
  CI time (the SLO page was not raised on the development machine; on a slower one it could be,
  and would then page a second time once a 30 s ``keep_firing_for`` ended). That overlap is
  proven with the shipped durations by promtool (``tests/test_alerts.py``,
  ``test_the_capacity_page_outlasts_the_slow_first_tokens_it_caused``) and the grouping in a
  real Alertmanager by ``tests/test_alertmanager.py``.

The scenario, once for the module: idle, with three requests that never preempt (448 + 32 tokens) so
that the sidecar knows a p95 context before the burst; a burst of 8 concurrent 128 + 352-token
requests for 120 s (vLLM preempts several times a second); drain; the page resolves. The tests
check: exactly one page for the incident, with model, namespace, pod and team labels and links that
work; the lower-severity alerts of the pod inhibited; resolved after the burst. The measured time
from the first preemption to the page at the webhook is printed (``-s``) and written in
docs/alerting.md. How soon the page may come depends on what Prometheus saw, which the test reads
back: once the spike branch's condition held for a minute the page follows within an evaluation
and the route's group_wait; if it held from the start, within 150 s of the first preemption; if
vLLM on a slow machine preempted below the spike rate for a moment (the ``for`` restarts), the
sustained branch pages within its 2-minute window, its ``for`` and the same delivery.

A stalled engine, in the minutes the page takes to resolve (no extra CI time): as soon as the
burst has drained, a second burst of three concurrent requests of 32 + 200 tokens (together six
of the pool's seven blocks: never preempts) starts, and once vLLM runs at least two of them and
has generated tokens its EngineCore process is stopped (SIGSTOP) mid-burst while the API server
keeps answering ``/health`` and ``/metrics``. VllmHeadroomEngineStalled must fire in Prometheus
within 3 minutes and reach the pager; then the engine resumes (SIGCONT) and the alert resolves.
The engine is always resumed on the way out: the vLLM server is shared by the session.

"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pytest
import yaml

from exporter.testing.processes import wait_until
from tests import paths
from tests.alertmanager import AlertmanagerServer, Notification, Receiver, example_config
from tests.e2e import lanes
from tests.e2e.harness import (
    REFERENCE_MODEL_NAME,
    BackgroundBurst,
    PrometheusServer,
    ScrapeJob,
    VllmServer,
    burst,
    loopback_client,
    sample_value,
    start_sidecar,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

T = TypeVar("T")

ROOT = paths.REPO
CHART = ROOT / "helm" / "vllm-headroom"
DASHBOARDS = ROOT / "dashboards"

RELEASE, NAMESPACE, POD = "e2e", "llm", "llm-0"
FULLNAME = f"{RELEASE}-vllm-headroom"
VLLM_JOB, EXPORTER_JOB = f"{NAMESPACE}/{FULLNAME}-vllm", f"{NAMESPACE}/{FULLNAME}-exporter"
GRAFANA = "https://grafana.example.com"
PAGE_ALERT = "VllmHeadroomPreemptionSpike"
TICKET_ALERT = "VllmHeadroomLow"
SCRAPE_S = 5.0
#: In scripts/test.sh's main lane this module starts beside phase 1's unit tests: its servers
#: start and its idle minute passes while they run, and the burst waits for them to end
#: (tests/e2e/lanes.py). Other tests with a vLLM wait before their fixtures (tests/e2e/conftest.py).
WAITS_FOR_THE_UNIT_TESTS = True
BURST = {"concurrency": 8, "prompt_tokens": 128, "output_tokens": 352}
BURST_SECONDS = 120.0
SLO_PAGE_ALERT = "VllmHeadroomTtftBudgetBurn"
STALL_ALERT = "VllmHeadroomEngineStalled"
#: The burst in flight when the engine stops: three requests of 232 tokens (two blocks each,
#: six of the pool's seven together), so that it never preempts.
STALL_BURST = {"concurrency": 3, "prompt_tokens": 32, "output_tokens": 200}
STALL_REQUESTS = 3
#: The engine stops once it runs this many of them: mid-burst, not one request alone.
STALL_RUNNING_AT_STOP = 2
#: The acceptance: a stalled engine pages within 3 minutes (Prometheus firing).
STALL_PAGE_S = 180.0
#: The page's keep_firing_for here (5 minutes in the shipped rules; see the module docstring).
KEEP_FIRING_S = 30.0
#: After the burst: the sustained branch holds while the 2m rate stays up (2 minutes), the
#: page's keep_firing_for, then the page route's group_interval (1m) before the resolved
#: notification, plus slack for a slow machine.
RESOLVE_TIMEOUT_S = 420.0
#: The spike branch's condition, as the rule writes it (its 1-minute rate and ratio against the
#: thresholds the rules record), for the pod of the scenario.
SPIKE_CONDITION = (
    f'headroom:vllm_preemptions:rate1m{{pod="{POD}"}}'
    " >= scalar(headroom:threshold:preemptions_per_second_spike)"
    f' and headroom:vllm_preemptions_per_finished_request:ratio_rate1m{{pod="{POD}"}}'
    " >= scalar(headroom:threshold:preemptions_per_finished_request)"
)
#: The page's `for`.
PAGE_FOR_S = 60.0
#: From the moment the rules fire (the condition held for the `for`) to the webhook: an
#: evaluation interval, the `for` rounded to evaluations, the route's 10 s group_wait and
#: delivery, with slack for a loaded machine.
FIRE_TO_WEBHOOK_S = 45.0
#: When the spike branch holds from the start: its minute of `for` after the 1-minute rate has
#: filled, plus FIRE_TO_WEBHOOK_S (79 to 103 s measured; docs/alerting.md).
SPIKE_PAGE_S = 150.0
#: When it does not (vLLM on a slow machine preempts below the spike rate for a moment, which
#: restarts the `for`): the sustained branch's 2 minutes of the 2-minute rate, its `for` and
#: FIRE_TO_WEBHOOK_S. A CI run paged this way after 194 s.
SUSTAINED_PAGE_S = 2 * 60.0 + PAGE_FOR_S + FIRE_TO_WEBHOOK_S


# ------------------------------------------------------------------------- the servers


@dataclass(frozen=True, slots=True)
class LabelledJob(ScrapeJob):
    """A scrape job whose targets carry labels, as the chart's monitors give them."""

    labels: Mapping[str, str] = field(default_factory=dict)

    def to_config(self) -> dict[str, Any]:
        """The job with ``labels`` on its static targets."""
        config = ScrapeJob.to_config(self)
        config["static_configs"][0]["labels"] = dict(self.labels)
        return config


def render_rules(helm: Path, receiver_url: str, workdir: Path) -> Path:
    """The chart's PrometheusRule for release e2e in namespace llm, as a rule file."""
    values = {
        "vllm": {"servedModelName": REFERENCE_MODEL_NAME},
        "prometheusRule": {
            "enabled": True,
            "alertLabels": {"team": "inference"},
            "runbookUrl": f"{receiver_url}/runbooks/{{alertname}}.md",
            "grafanaUrl": GRAFANA,
            "alerts": {
                TICKET_ALERT: {"for": "0s"},
                PAGE_ALERT: {"keepFiringFor": f"{KEEP_FIRING_S:g}s"},
                SLO_PAGE_ALERT: {"enabled": False},
            },
        },
    }
    values_path = workdir / "values.yaml"
    values_path.write_text(yaml.safe_dump(values))
    done = _run(
        [
            str(helm),
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--values",
            str(CHART / "ci" / "vllm-values.yaml"),
            "--values",
            str(values_path),
            "--show-only",
            "templates/prometheusrule.yaml",
        ]
    )
    [rule] = [d for d in yaml.safe_load_all(done) if d]
    path = workdir / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


# ------------------------------------------------------------------------- the scenario


@dataclass(slots=True)
class Stall:
    """The stalled-engine phase: what was seen, when (monotonic seconds)."""

    stopped: float = 0.0
    #: vLLM's running + waiting requests when the engine was stopped (its frozen gauges).
    held_requests: float = 0.0
    #: Of those, running.
    held_running: float = 0.0
    #: /health status codes the API server answered while the engine was stopped.
    health_while_stopped: set[int] = field(default_factory=set)
    fired: float | None = None
    fired_labels: dict[str, str] = field(default_factory=dict)
    paged: float | None = None
    resumed: float | None = None
    resolved: float | None = None
    #: The stall alert's states in Prometheus before the engine was stopped (idle, the burst).
    before_stop: set[str] = field(default_factory=set)
    #: Whether the request held by the stopped engine completed after it resumed.
    request_completed: bool = False


@dataclass(slots=True)
class Incident:
    """What the scenario observed."""

    receiver_url: str
    burst_start: float = 0.0
    first_preemption: float = 0.0
    burst_end: float = 0.0
    resolved_at: float | None = None
    page_notifications: list[Notification] = field(default_factory=list)
    ticket_notifications: list[Notification] = field(default_factory=list)
    #: Alertmanager's view of the pod's other alerts while the page fired: name -> states.
    others_in_alertmanager: dict[str, set[str]] = field(default_factory=dict)
    #: Alerts Prometheus had firing at some point during the incident: name -> labels.
    firing_in_prometheus: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Every state each alert had in Prometheus during the incident (pending, firing).
    states_in_prometheus: dict[str, set[str]] = field(default_factory=dict)
    #: The stalled engine: when it was stopped, when its alert fired in Prometheus and reached
    #: the pager, when it was resumed and when the alert left Prometheus (monotonic seconds).
    stall: Stall = field(default_factory=Stall)
    #: Looks that vLLM, Prometheus or Alertmanager did not answer in time (skipped, not fatal).
    missed_looks: list[str] = field(default_factory=list)
    #: Unix seconds minus monotonic seconds, to place Prometheus's samples on the scenario's clock.
    wall_offset: float = 0.0
    #: Monotonic seconds at which Prometheus found the spike branch's condition true, from the
    #: first preemption to the first page (a range query, one point per scrape interval).
    spike_condition_true: list[float] = field(default_factory=list)

    @property
    def first_page(self) -> Notification:
        """The first notification that reached the pager with a firing alert."""
        return next(n for n in self.page_notifications if n.alerts("firing"))

    @property
    def spike_to_webhook_s(self) -> float:
        """Seconds from the first preemption seen on vLLM to the page at the webhook."""
        return self.first_page.t - self.first_preemption

    @property
    def spike_held_from(self) -> float | None:
        """The first time the spike condition then held for the page's `for` (None: never).

        A point per scrape interval; a run of consecutive points spanning the `for` is a
        minute the rule saw the spike without a break.
        """
        points = self.spike_condition_true
        start = 0
        for i in range(1, len(points) + 1):
            if i == len(points) or points[i] - points[i - 1] > 1.5 * SCRAPE_S:
                if points[i - 1] - points[start] >= PAGE_FOR_S:
                    return points[start]
                start = i
        return None


def engine_core_pid(vllm: VllmServer) -> int:
    """The pid of vLLM's EngineCore process, in the API server's process group.

    vLLM titles it ``VLLM::EngineCore`` (setproctitle), which shows in its ``cmdline``.
    """
    leader = vllm.pid
    assert leader is not None, "vLLM is not running"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != leader:
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        if b"EngineCore" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no EngineCore process in vLLM's process group {leader}")


class StalledEngine:
    """Stop vLLM's engine mid-request, watch the stall page fire, resume it, watch it resolve."""

    def __init__(self, vllm: VllmServer, stall: Stall) -> None:
        self.vllm = vllm
        self.stall = stall
        self.pid: int | None = None
        self.load: BackgroundBurst | None = None

    def _sample(self, name: str) -> float:
        return sample_value(self.vllm.metrics_text(), name) or 0.0

    def _wait_for_the_burst_running(self, before: float) -> bool:
        """Until one scrape shows the burst running and tokens generated since ``before``.

        Tokens alone are not enough: the previous request's last tokens can be counted just
        after its answer arrived, before the new requests reached the engine (a loaded CI run
        stopped an idle engine three times so). False if the burst ended before it was seen
        running (its requests are short on a fast machine): the caller starts another. A
        timeout says what was seen, and a failed burst raises its own error.
        """
        assert self.load is not None
        seen: dict[str, float] = {"running_max": 0.0, "waiting_max": 0.0, "scrapes": 0.0}

        def generating() -> bool | None:
            text = self.vllm.metrics_text()
            running = sample_value(text, "vllm:num_requests_running") or 0.0
            waiting = sample_value(text, "vllm:num_requests_waiting") or 0.0
            tokens = sample_value(text, "vllm:generation_tokens_total") or 0.0
            seen["scrapes"] += 1
            seen["running_max"] = max(seen["running_max"], running)
            seen["waiting_max"] = max(seen["waiting_max"], waiting)
            seen["tokens"] = tokens - before
            if running >= STALL_RUNNING_AT_STOP and tokens > before:
                return True
            if self.load is not None and self.load.done():
                self.load.result()  # raises the burst's own error, if it failed
                return None  # finished before it was seen running: try again
            return False

        deadline = time.monotonic() + 60.0
        while True:
            state = generating()
            if state is True:
                return True
            if state is None:
                return False
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"the burst the engine will hold was not seen running in 60 s: {seen} "
                    f"(burst done: {self.load.done()})"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """Start a small burst and stop the engine (SIGSTOP) once it runs and generates.

        Should the burst finish before it is seen running, or between the tokens seen and the
        signal (vLLM then holds no request), let it complete and try again, up to six times (a
        loaded CI run missed three in a row; each costs a few seconds).
        """
        self.pid = engine_core_pid(self.vllm)
        for _ in range(6):
            before = self._sample("vllm:generation_tokens_total")
            self.load = BackgroundBurst(
                self.vllm.base_url, REFERENCE_MODEL_NAME, count=STALL_REQUESTS, **STALL_BURST
            )
            if not self._wait_for_the_burst_running(before):
                with self.load:
                    self.load.result(timeout_s=120.0)
                continue
            os.kill(self.pid, signal.SIGSTOP)
            self.stall.stopped = time.monotonic()
            text = self.vllm.metrics_text()
            self.stall.held_running = sample_value(text, "vllm:num_requests_running") or 0.0
            self.stall.held_requests = self.stall.held_running + (
                sample_value(text, "vllm:num_requests_waiting") or 0.0
            )
            if self.stall.held_requests > 0:
                break
            os.kill(self.pid, signal.SIGCONT)
            with self.load:
                self.load.result(timeout_s=120.0)
        with loopback_client(self.vllm.base_url) as client:
            self.stall.health_while_stopped.add(client.get("/health", timeout=10.0).status_code)

    def watch(self, prometheus: PrometheusServer, receiver: Receiver) -> None:
        """One look: fired in Prometheus, paged, resumed once paged, resolved in Prometheus."""
        stall, now = self.stall, time.monotonic()
        states = {
            a["state"]: a["labels"]
            for a in prometheus.alerts()
            if a["labels"]["alertname"] == STALL_ALERT
        }
        if stall.fired is None and "firing" in states:
            stall.fired, stall.fired_labels = now, dict(states["firing"])
        if stall.paged is None:
            paged = [
                n.t
                for n in receiver.received("/page")
                if any(a["labels"]["alertname"] == STALL_ALERT for a in n.alerts("firing"))
            ]
            stall.paged = paged[0] if paged else None
        # Resume once paged, or past the 3 minutes and a page route's group_interval: the
        # assertions say what was missing; vLLM is shared and must not stay stopped.
        if stall.paged is not None or now - stall.stopped > STALL_PAGE_S + 60.0:
            self.resume()
        if stall.resumed is not None and stall.resolved is None and not states:
            stall.resolved = now

    def resume(self) -> None:
        """SIGCONT the engine (once), so that the held request completes."""
        if self.pid is not None and self.stall.resumed is None:
            os.kill(self.pid, signal.SIGCONT)
            self.stall.resumed = time.monotonic()

    def done(self) -> bool:
        """Resumed and resolved, or given up (resumed without the alert ever firing)."""
        return self.stall.resolved is not None or (
            self.stall.resumed is not None and self.stall.fired is None
        )

    def finish(self) -> None:
        """Resume if still stopped, and wait for the held request."""
        self.resume()
        if self.load is not None:
            with self.load:
                completed = len(self.load.result(timeout_s=120.0))
                self.stall.request_completed = completed == STALL_REQUESTS
            self.load = None


def _preemptions(vllm: VllmServer) -> float:
    return sample_value(vllm.metrics_text(), "vllm:num_preemptions_total") or 0.0


def _look(incident: Incident, what: str, look: Callable[[], T]) -> T | None:
    """``look()``, or None when its server did not answer in time.

    Under the burst vLLM busy-polls both cores: its ``/metrics`` (and, on a loaded CI machine,
    Prometheus's or Alertmanager's API) can take longer than the client's timeout. One missed
    look only delays what the scenario notices; it is recorded and the next look tries again.
    """
    try:
        return look()
    except httpx.TransportError as exc:
        incident.missed_looks.append(f"{what}: {exc!r}")
        return None


def _watch(
    incident: Incident,
    receiver: Receiver,
    alertmanager: AlertmanagerServer,
    prometheus: PrometheusServer,
) -> None:
    """One look at Alertmanager and Prometheus while the page fires."""
    page_fired = any(n.alerts("firing") for n in receiver.received("/page"))
    for alert in prometheus.alerts():
        name = alert["labels"]["alertname"]
        incident.states_in_prometheus.setdefault(name, set()).add(alert["state"])
        if alert["state"] == "firing":
            incident.firing_in_prometheus.setdefault(alert["labels"]["alertname"], alert["labels"])
    held = alertmanager.alerts()
    # Inhibition holds while the page is active: after it resolves, a ticket still true is
    # the ticket's to send.
    page_active = any(
        a["labels"]["alertname"] == PAGE_ALERT and a["status"]["state"] == "active" for a in held
    )
    if not (page_fired and page_active):
        return
    for alert in held:
        name = alert["labels"]["alertname"]
        # The stalled engine is an incident of its own, paged (its phase overlaps this wait).
        if name not in {PAGE_ALERT, STALL_ALERT} and alert["labels"].get("pod") in {POD, None}:
            incident.others_in_alertmanager.setdefault(name, set()).add(alert["status"]["state"])


def _run_incident(
    vllm: VllmServer,
    prometheus_factory: Callable[..., PrometheusServer],
    helm: Path,
    workdir: Path,
) -> Iterator[Incident]:
    receiver = Receiver()
    incident = Incident(receiver_url=receiver.url)
    alertmanager = AlertmanagerServer(example_config(receiver.url), workdir / "alertmanager")
    # vLLM busy-polls both cores under the burst and its API server answers slowly: a poll
    # every 3 s with 3 s to answer keeps the sidecar's figures (and VllmHeadroomLow) steady.
    sidecar, sidecar_url = start_sidecar(
        vllm.base_url,
        log_path=workdir / "sidecar-alerting.log",
        poll_interval_s=3,
        model=vllm.model_dir,
    )
    stalled = StalledEngine(vllm, incident.stall)
    try:
        alertmanager.start()
        rules = render_rules(helm, receiver.url, workdir)
        labels = {"namespace": NAMESPACE, "pod": POD}
        prometheus = prometheus_factory(
            [
                LabelledJob(VLLM_JOB, [vllm.metrics_url], labels=labels),
                LabelledJob(EXPORTER_JOB, [f"{sidecar_url}/metrics"], labels=labels),
            ],
            rule_files=[rules],
            scrape_interval_s=SCRAPE_S,
            evaluation_interval_s=SCRAPE_S,
            alertmanagers=[f"127.0.0.1:{alertmanager.port}"],
        )
        prometheus.wait_for_targets_up(VLLM_JOB)
        prometheus.wait_for_targets_up(EXPORTER_JOB)
        # A p95 context for the sidecar's headroom figures (448 + 32 tokens never preempt), then
        # a minute of flat counters: the rates have a baseline.
        burst(
            vllm.base_url,
            REFERENCE_MODEL_NAME,
            concurrency=1,
            prompt_tokens=448,
            output_tokens=32,
            count=3,
        )
        time.sleep(12 * SCRAPE_S)
        assert not [a for a in prometheus.alerts() if a["state"] == "firing"], "firing when idle"
        # The burst takes both cores: not before the unit tests beside this lane have ended (the
        # counters stay flat meanwhile, so the minute before the burst is still a flat one).
        lanes.wait_for_unit_tests()
        assert not [a for a in prometheus.alerts() if a["state"] == "firing"], "firing when idle"

        before = _preemptions(vllm)
        incident.wall_offset = time.time() - time.monotonic()
        incident.burst_start = time.monotonic()
        with BackgroundBurst(
            vllm.base_url, REFERENCE_MODEL_NAME, duration_s=BURST_SECONDS, **BURST
        ) as load:
            while not load.done():
                if not incident.first_preemption:
                    now = _look(incident, "vLLM /metrics", lambda: _preemptions(vllm))
                    if now is not None and now > before:
                        incident.first_preemption = time.monotonic()
                _look(
                    incident, "alerts", lambda: _watch(incident, receiver, alertmanager, prometheus)
                )
                time.sleep(0.5 if not incident.first_preemption else 2.0)
            load.result(timeout_s=300.0)
        incident.burst_end = time.monotonic()
        incident.stall.before_stop = set(incident.states_in_prometheus.get(STALL_ALERT, set()))
        stalled.stop()
        # What follows waits on the rules' durations with the engine stopped: the modules of
        # the beside lane (tests/e2e/lanes.py) run meanwhile.
        lanes.main_lane_quiet()

        def resolved() -> bool:
            _look(incident, "alerts", lambda: _watch(incident, receiver, alertmanager, prometheus))
            _look(incident, "stall", lambda: stalled.watch(prometheus, receiver))
            if incident.resolved_at is None and any(
                a["labels"]["alertname"] == PAGE_ALERT
                for n in receiver.received("/page")
                for a in n.alerts("resolved")
            ):
                incident.resolved_at = time.monotonic()
            return incident.resolved_at is not None and stalled.done()

        wait_until(
            resolved,
            timeout_s=RESOLVE_TIMEOUT_S,
            what="the page resolved, the stalled engine paged and resolved",
            interval_s=2.0,
        )
        stalled.finish()
        incident.page_notifications = receiver.received("/page")
        incident.spike_condition_true = _spike_condition_true(incident, prometheus)
        incident.ticket_notifications = receiver.received("/ticket")
        yield incident
    finally:
        stalled.resume()
        sidecar.stop()
        alertmanager.stop()
        receiver.stop()
        lanes.main_lane_quiet()  # the next tests with a vLLM wait for the beside lane's end


def _spike_condition_true(incident: Incident, prometheus: PrometheusServer) -> list[float]:
    """When Prometheus found the spike branch true, from the first preemption to the first page."""
    pages = [n for n in incident.page_notifications if n.alerts("firing")]
    if not pages or not incident.first_preemption:
        return []
    offset = incident.wall_offset
    series = prometheus.query_range(
        SPIKE_CONDITION,
        start=incident.first_preemption + offset,
        end=pages[0].t + offset,
        step_s=SCRAPE_S,
    )
    return sorted(float(t) - offset for s in series for t, _ in s["values"])


@pytest.fixture(scope="module")
def incident(
    vllm_server: VllmServer,
    prometheus_factory: Callable[..., PrometheusServer],
    helm: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Incident]:
    """The scenario, run once for the tests below."""
    yield from _run_incident(
        vllm_server, prometheus_factory, helm, tmp_path_factory.mktemp("alerting")
    )


# ----------------------------------------------------------------------------- the tests


def test_one_page_reaches_the_pager_for_the_incident(incident: Incident) -> None:
    """Every notification to the pager is the one preemption alert of the one pod, one group."""
    pages = incident.page_notifications
    assert pages, "no page reached the webhook"
    assert {n.body["groupKey"] for n in pages} == {pages[0].body["groupKey"]}
    # The stalled engine later in the run is the same model's: its page joins the same group.
    alerts = [a for n in pages for a in n.body["alerts"] if a["labels"]["alertname"] != STALL_ALERT]
    assert {a["labels"]["alertname"] for a in alerts} == {PAGE_ALERT}
    assert {a["fingerprint"] for a in alerts} == {alerts[0]["fingerprint"]}
    assert incident.first_page.t >= incident.first_preemption > incident.burst_start
    held_from = incident.spike_held_from
    branch = (
        "the spike branch"
        if held_from is not None
        and incident.first_page.t <= held_from + PAGE_FOR_S + FIRE_TO_WEBHOOK_S
        else "the sustained branch (the spike condition broke within its minute of `for`)"
    )
    print(
        f"\nspike-to-webhook: {incident.spike_to_webhook_s:.0f} s from vLLM's first preemption "
        f"to the page at the webhook ({SCRAPE_S:g} s scrape and evaluation intervals), by "
        f"{branch}; {len(incident.missed_looks)} look(s) not answered in time"
    )
    if held_from is not None:
        # The rules saw a minute of spike: the page follows it by an evaluation and the
        # route's group_wait, whichever branch got there first.
        assert incident.first_page.t <= held_from + PAGE_FOR_S + FIRE_TO_WEBHOOK_S
    if held_from is not None and held_from - incident.first_preemption <= 2 * SCRAPE_S + 30.0:
        assert incident.spike_to_webhook_s < SPIKE_PAGE_S
    assert incident.spike_to_webhook_s < SUSTAINED_PAGE_S


def test_the_page_carries_the_routing_labels(incident: Incident) -> None:
    """model_name, namespace, pod, severity, the team from values and the release."""
    [alert] = incident.first_page.alerts("firing")
    labels = alert["labels"]
    assert labels["model_name"] == REFERENCE_MODEL_NAME
    assert labels["namespace"] == NAMESPACE
    assert labels["pod"] == POD
    assert labels["severity"] == "critical"
    assert labels["team"] == "inference"
    assert labels["headroom_release"] == f"{NAMESPACE}/{FULLNAME}"
    assert labels["job"] == VLLM_JOB
    assert "<no value>" not in alert["annotations"]["description"]
    assert "Evidence: KV cache" in alert["annotations"]["description"]


def test_the_page_links_open_the_runbook_and_the_dashboard(incident: Incident) -> None:
    """runbook_url answers with the alert's runbook; dashboard_url is Grafana's, absolute."""
    [alert] = incident.first_page.alerts("firing")
    runbook = alert["annotations"]["runbook_url"]
    assert runbook == f"{incident.receiver_url}/runbooks/{PAGE_ALERT}.md"
    with loopback_client(incident.receiver_url) as client:
        response = client.get(runbook.removeprefix(incident.receiver_url))
    assert response.status_code == 200
    assert response.text.startswith(f"# {PAGE_ALERT}\n")
    dashboard = alert["annotations"]["dashboard_url"]
    uid = "vllm-headroom-instance"
    assert dashboard.startswith(f"{GRAFANA}/d/{uid}?var-model={REFERENCE_MODEL_NAME}")
    assert f"var-namespace={NAMESPACE}" in dashboard
    assert json.loads((DASHBOARDS / f"{uid}.json").read_text())["uid"] == uid


def test_the_lower_severity_alerts_of_the_pod_are_inhibited(incident: Incident) -> None:
    """The ticket of the same pod fired in Prometheus, was suppressed, and was never sent."""
    observed = (incident.states_in_prometheus, incident.others_in_alertmanager)
    assert TICKET_ALERT in incident.firing_in_prometheus, observed
    assert incident.firing_in_prometheus[TICKET_ALERT]["pod"] == POD
    states = incident.others_in_alertmanager.get(TICKET_ALERT, set())
    assert states == {"suppressed"}, incident.others_in_alertmanager
    for notification in incident.ticket_notifications:
        names = {a["labels"]["alertname"] for a in notification.alerts("firing")}
        assert TICKET_ALERT not in names
    for name, seen in incident.others_in_alertmanager.items():
        assert seen == {"suppressed"}, (name, seen)


def test_the_page_resolves_after_the_burst(incident: Incident) -> None:
    """A resolved notification for the page follows the burst's end."""
    resolved = [
        n
        for n in incident.page_notifications
        if any(a["labels"]["alertname"] == PAGE_ALERT for a in n.alerts("resolved"))
    ]
    assert resolved
    assert resolved[0].t > incident.burst_end
    assert incident.resolved_at is not None
    print(
        f"\nresolved: {resolved[0].t - incident.burst_end:.0f} s after the burst ended"
        f" (keep_firing_for {KEEP_FIRING_S:g} s)"
    )


def test_a_stalled_engine_pages_within_3_minutes(incident: Incident) -> None:
    """EngineCore stopped mid-burst, the API server still answering: the page fires in 3 min."""
    stall = incident.stall
    assert stall.before_stop == set(), "the stall alert was raised before the engine stopped"
    assert stall.held_running >= STALL_RUNNING_AT_STOP, "the engine stopped outside the burst"
    assert stall.health_while_stopped == {200}
    assert stall.fired is not None, "VllmHeadroomEngineStalled never fired"
    assert stall.fired_labels["pod"] == POD
    assert stall.fired_labels["model_name"] == REFERENCE_MODEL_NAME
    assert stall.fired_labels["severity"] == "critical"
    assert stall.paged is not None, "the stall page never reached the pager"
    print(
        f"\nstall-to-firing: {stall.fired - stall.stopped:.0f} s from SIGSTOP to firing in "
        f"Prometheus, {stall.paged - stall.stopped:.0f} s to the page at the webhook"
        f" ({SCRAPE_S:g} s scrape and evaluation intervals)"
    )
    assert stall.fired - stall.stopped < STALL_PAGE_S


def test_the_stall_page_resolves_when_the_engine_resumes(incident: Incident) -> None:
    """After SIGCONT the held requests complete and the alert leaves Prometheus."""
    stall = incident.stall
    assert stall.resumed is not None
    assert stall.resolved is not None, "VllmHeadroomEngineStalled still active after SIGCONT"
    assert stall.resolved > stall.resumed
    assert stall.request_completed
    print(f"\nstall resolved: {stall.resolved - stall.resumed:.0f} s after SIGCONT")
