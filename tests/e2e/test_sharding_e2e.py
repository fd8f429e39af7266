"""Past one machine: two scrape shards, one store, the shipped rules evaluated once, globally.

The recipe of docs/kubernetes.md ("Past one machine"), with Debian's real components: eight fake
vLLM pods (``exporter.testing.fakevllm``, vLLM 0.32's exposition) in namespace ``llm``; two
fleet-mode exporters (``python -m exporter serve``), one per shard, as the chart's replicas are;
two Prometheus servers in agent mode, each keeping the pods whose ``hashmod`` of namespace and pod
name is its shard number, and remote-writing to one VictoriaMetrics; vmalert evaluating the
chart's rules for release ``e2e`` in namespace ``llm`` on VictoriaMetrics, and sending to Debian's
Alertmanager running the shipped example, whose receivers are a webhook in this test.

Each shard's scrape jobs are the chart's own fleet ScrapeConfigs (``helm template``, shape
fleet), turned into Prometheus ``scrape_configs``: the same relabelling, led by the two sharding
rules of the recipe; static targets carry the ``__meta_kubernetes_*`` labels Kubernetes
discovery would give them, and the probe job's last rule points at the shard's own exporter
instead of the Service.

One pod, ``llm-0``, preempts 2 times a second while finishing 10 requests a second; the other
seven neither preempt nor fail. The page's ``for`` is 5 s instead of a minute (a Helm value, as
in test_alerting_e2e.py). Debian's vmalert (1.79) predates ``keep_firing_for`` (vmalert 1.90):
it refuses the field, so the test drops it from the rendered file (docs say so).

The tests check: each shard scraped exactly its half (the split the hash gives, 4 and 4; disjoint,
together all 8 pods, for both jobs); VictoriaMetrics holds every series once, with one scraper's
samples (a pod both shards scraped would have one series, its labels being the same, with
twice the samples: letting both shards keep every pod fails this test and the first, 40 samples
for 20); the page reaches the pager once, for llm-0, with the label set the single-Prometheus
page carries (test_alerting_e2e.py). Apart, in 6 s: prometheus-operator's own sharding rules
appended to the chart's jobs keep each pod's probe on the shard of its direct scrape.
Alertmanager's group_wait is 1 s (the shipped 10 s for pages, 5 minutes for tickets, would only
add waiting). About 55 s on two cores.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from exporter.testing.fakevllm import FakeVllm, VllmState, render_metrics
from exporter.testing.processes import ExporterProcess, wait_until
from tests import paths
from tests.alertmanager import AlertmanagerServer, Notification, Receiver, example_config
from tests.e2e.harness import (
    REFERENCE_MODEL_NAME,
    ToolServer,
    fleet_scrape_configs,
    free_port,
    helm_binary,
    prometheus_agent,
    prometheus_binary,
    victoria_metrics,
    victoria_metrics_binary,
)
from tests.tools import require

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

CHART = paths.REPO / "helm" / "vllm-headroom"
RELEASE, NAMESPACE = "e2e", "llm"
FULLNAME = f"{RELEASE}-vllm-headroom"
VLLM_JOB, EXPORTER_JOB = f"{NAMESPACE}/{FULLNAME}-vllm", f"{NAMESPACE}/{FULLNAME}-exporter"
#: vLLM's port as the chart's discovery keeps it (``fleet.discovery.portNumber``).
VLLM_PORT = 8000
PAGE_ALERT = "VllmHeadroomPreemptionSpike"
SHARDS = 2
PODS = [f"{NAMESPACE}-{i}" for i in range(8)]
INCIDENT_POD = "llm-0"
SCRAPE_S = 1.0
#: From start to the page at the webhook: the shards' first remote writes (about 10 s), the
#: 1-minute rate's two samples, the rule chain's evaluations (records on records, each read back
#: from the store), the `for` of 5 s and Alertmanager's group_wait of 1 s (measured: 37 to 47 s).
PAGE_TIMEOUT_S = 90.0
#: The window whose samples are counted, well inside the time every shard has been writing.
SAMPLE_WINDOW_S = 20.0


# ------------------------------------------------------------------------- the recipe


def hashmod(value: str, shards: int = SHARDS) -> int:
    """Prometheus's ``hashmod`` of a relabelling's joined source labels: the shard that keeps it.

    The low 8 bytes of the MD5 of ``value``, big-endian, modulo the shard count
    (prometheus/model/relabel); the test's expectation, computed independently of Prometheus.
    """
    digest = hashlib.md5(value.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % shards


def operator_sharding_rules(shard: int, shards: int = SHARDS) -> list[dict[str, Any]]:
    """What prometheus-operator's ``spec.shards`` appends to every job's relabelling.

    Its generated configuration (for shard ``shard``): ``__tmp_hash`` is ``__address__`` unless
    a relabelling set it, then hashed; a target is kept by its shard (or by every shard when
    ``__tmp_disable_sharding`` is set).
    """
    return [
        {
            "source_labels": ["__address__", "__tmp_hash"],
            "target_label": "__tmp_hash",
            "regex": "(.+);",
            "replacement": "$1",
            "action": "replace",
        },
        {
            "source_labels": ["__tmp_hash"],
            "target_label": "__tmp_hash",
            "modulus": shards,
            "action": "hashmod",
        },
        {
            "source_labels": ["__tmp_hash", "__tmp_disable_sharding"],
            "regex": f"{shard};|.+;.+",
            "action": "keep",
        },
    ]


def helm_template(helm: Path, values: dict[str, Any], workdir: Path, template: str) -> list[Any]:
    """The chart's documents of ``template`` for release e2e in namespace llm, shape fleet."""
    values_path = workdir / f"values-{template.replace('/', '-')}"
    values_path.write_text(yaml.safe_dump(values))
    argv = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    argv += ["--values", str(CHART / "ci" / "fleet-values.yaml"), "--values", str(values_path)]
    argv += ["--show-only", template]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


CHART_VALUES: dict[str, Any] = {
    "fleet": {
        "allowlist": ["127.0.0.0/8"],
        "discovery": {"namespaces": [NAMESPACE], "portNumber": VLLM_PORT},
    },
    "prometheusRule": {
        "alertLabels": {"team": "inference"},
        "alerts": {PAGE_ALERT: {"enabled": True, "for": "5s"}},
    },
}


def vmalert_rule_file(rule_crs: Sequence[dict[str, Any]], target: Path) -> Path:
    """The chart's PrometheusRule as a rule file vmalert 1.79 loads: no ``keep_firing_for``.

    Groups run at vmalert's evaluation interval (their own, the 5-minute budget group's, would
    first run long after the test ends).
    """
    [rule] = rule_crs
    groups = rule["spec"]["groups"]
    for group in groups:
        group.pop("interval", None)
        for each in group["rules"]:
            each.pop("keep_firing_for", None)
    target.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return target


# ------------------------------------------------------------------------- the servers


def fake_payload(preempting: bool, started: float) -> Any:
    """A fake vLLM's /metrics by the clock (not by requests: two jobs read it)."""

    def payload(_served: int) -> bytes:
        seconds = time.monotonic() - started
        if preempting:
            state = VllmState(finished=12 + int(10 * seconds), preemptions=15 + int(2 * seconds))
        else:
            state = VllmState(finished=12 + int(2 * seconds), preemptions=15)
        return render_metrics(replace(state, model=REFERENCE_MODEL_NAME))

    return payload


@dataclass(slots=True)
class Fleet:
    """What the scenario observed."""

    receiver_url: str
    #: pod name -> the shard the hash puts it in (the test's own computation).
    expected_shard: dict[str, int]
    #: shard -> {job -> the pods of its active targets}, from each agent's targets API.
    scraped: dict[int, dict[str, set[str]]] = field(default_factory=dict)
    #: shard -> targets whose last scrape failed (job, pod, error).
    unhealthy: dict[int, list[tuple[str, str, str]]] = field(default_factory=dict)
    #: VictoriaMetrics: series per (job, pod) of up, and of vLLM's preemption counter.
    up_series: dict[tuple[str, str], int] = field(default_factory=dict)
    preemption_series: dict[tuple[str, str], int] = field(default_factory=dict)
    #: VictoriaMetrics: samples of each up series in the last SAMPLE_WINDOW_S (a pod scraped by
    #: both shards has one series, the labels being the same, with twice the samples).
    up_samples: dict[tuple[str, str], int] = field(default_factory=dict)
    pages: list[Notification] = field(default_factory=list)
    #: vmalert's active alerts of the page's name, when the page arrived.
    page_alerts_in_vmalert: list[dict[str, Any]] = field(default_factory=list)
    seconds_to_page: float = 0.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Run the two shards, VictoriaMetrics, vmalert and Alertmanager until the page arrives."""
    helm = require(helm_binary)
    require(prometheus_binary)  # the shards are Prometheus agents
    vm_binaries = {
        tool: require(functools.partial(victoria_metrics_binary, tool))
        for tool in ("victoria-metrics", "vmalert")
    }
    workdir = tmp_path_factory.mktemp("sharding")
    discovery = helm_template(helm, CHART_VALUES, workdir, "templates/fleet-discovery.yaml")
    rules = helm_template(helm, CHART_VALUES, workdir, "templates/prometheusrule.yaml")
    rule_file = vmalert_rule_file(rules, workdir / "rules.yml")

    started = time.monotonic()
    fakes = {pod: FakeVllm(payload=fake_payload(pod == INCIDENT_POD, started)) for pod in PODS}
    receiver = Receiver()
    servers: list[ToolServer] = []
    exporters: list[ExporterProcess] = []
    alertmanager = AlertmanagerServer(
        example_config(receiver.url, group_wait="1s"), workdir / "alertmanager"
    )
    try:
        alertmanager.start()
        vm = victoria_metrics(
            workdir,
            # Samples are searchable at once (default: 30 s late) and never served from
            # a cache filled before they arrived: the rules chain records on records.
            extra=("-search.latencyOffset=0s", "-search.disableCache"),
            log_name="victoria-metrics.log",
        )
        servers.append(vm.start())
        targets = {pod: fake.url.removeprefix("http://") for pod, fake in fakes.items()}
        agents: list[ToolServer] = []
        for shard in range(SHARDS):
            exporter = ExporterProcess(
                {"HEADROOM_MODE": "fleet", "HEADROOM_PROBE_ALLOWLIST": "127.0.0.0/8"}
            )
            exporters.append(exporter)
            config = {
                "global": {"scrape_interval": f"{SCRAPE_S:g}s"},
                "scrape_configs": fleet_scrape_configs(
                    discovery,
                    {pod: (NAMESPACE, address) for pod, address in targets.items()},
                    shard=(shard, SHARDS),
                    exporter_address=exporter.url.removeprefix("http://"),
                    port_number=VLLM_PORT,
                    interval_s=SCRAPE_S,
                ),
                "remote_write": [
                    {
                        "url": f"{vm.url}/api/v1/write",
                        "queue_config": {"batch_send_deadline": "1s"},
                    }
                ],
            }
            config_path = workdir / f"shard-{shard}.yml"
            config_path.write_text(json.dumps(config, indent=2))
            agent = prometheus_agent(config_path, workdir=workdir, name=f"shard-{shard}")
            servers.append(agent.start())
            agents.append(agent)
        vmalert_port = free_port()
        vmalert = ToolServer(
            [
                str(vm_binaries["vmalert"]),
                f"-rule={rule_file}",
                f"-datasource.url={vm.url}",
                f"-remoteWrite.url={vm.url}",
                "-remoteWrite.flushInterval=1s",
                f"-notifier.url={alertmanager.client.base_url}",
                "-evaluationInterval=1s",
                "-rule.resendDelay=1s",
                # Prometheus adds no such label: without it the alert's labels are the same.
                "-disableAlertgroupLabel",
                f"-httpListenAddr=127.0.0.1:{vmalert_port}",
            ],
            port=vmalert_port,
            log_path=workdir / "vmalert.log",
            ready_path="/-/healthy",
        )
        servers.append(vmalert.start())

        fleet = Fleet(
            receiver_url=receiver.url,
            expected_shard={pod: hashmod(f"{NAMESPACE};{pod}") for pod in PODS},
        )

        def paged() -> list[Notification]:
            return [
                n
                for n in receiver.received("/page")
                if any(a["labels"]["alertname"] == PAGE_ALERT for a in n.alerts("firing"))
            ]

        wait_until(paged, timeout_s=PAGE_TIMEOUT_S, what=f"{PAGE_ALERT} at the webhook")
        fleet.seconds_to_page = time.monotonic() - started
        fleet.page_alerts_in_vmalert = [
            a
            for a in vmalert.get_json("/api/v1/alerts")["data"]["alerts"]
            if a["name"] == PAGE_ALERT
        ]
        for shard, agent in enumerate(agents):
            active = agent.get_json("/api/v1/targets")["data"]["activeTargets"]
            jobs: dict[str, set[str]] = {}
            for target in active:
                jobs.setdefault(target["labels"]["job"], set()).add(target["labels"]["pod"])
            fleet.scraped[shard] = jobs
            fleet.unhealthy[shard] = [
                (t["labels"]["job"], t["labels"]["pod"], t["lastError"])
                for t in active
                if t["health"] != "up"
            ]
        for expr, into in (
            ("count by (job, pod) (up)", fleet.up_series),
            ("count by (job, pod) (vllm:num_preemptions_total)", fleet.preemption_series),
            (f"count_over_time(up[{SAMPLE_WINDOW_S:g}s])", fleet.up_samples),
        ):
            for row in vm.query(expr):
                into[(row["metric"]["job"], row["metric"]["pod"])] = int(row["value"][1])
        # A few more evaluations: a second page for the same incident would come now.
        time.sleep(5.0)
        fleet.pages = paged()
        yield fleet
    finally:
        for server in reversed(servers):
            server.stop()
        for exporter in exporters:
            exporter.close()
        alertmanager.stop()
        receiver.stop()
        for fake in fakes.values():
            fake.close()


# ----------------------------------------------------------------------------- the tests


def test_each_shard_scrapes_its_half_of_the_pods(fleet: Fleet) -> None:
    """Disjoint halves (4 and 4, as the hash splits these names), together every pod, per job."""
    for job in (VLLM_JOB, EXPORTER_JOB):
        halves = [fleet.scraped[shard].get(job, set()) for shard in range(SHARDS)]
        for shard, half in enumerate(halves):
            expected = {pod for pod, s in fleet.expected_shard.items() if s == shard}
            assert half == expected, (job, shard)
            assert len(half) == len(PODS) // SHARDS
        assert set.union(*halves) == set(PODS)
        assert not set.intersection(*halves)
    assert fleet.unhealthy == {shard: [] for shard in range(SHARDS)}


def test_the_store_holds_every_series_once(fleet: Fleet) -> None:
    """One up series per pod and job, one preemption counter per pod: no shard wrote another's."""
    pairs = {(job, pod) for job in (VLLM_JOB, EXPORTER_JOB) for pod in PODS}
    assert fleet.up_series == dict.fromkeys(pairs, 1)
    assert fleet.preemption_series == {(VLLM_JOB, pod): 1 for pod in PODS}
    # One scraper's samples: one a second (20 in the window), not two scrapers' 40.
    per_scraper = SAMPLE_WINDOW_S / SCRAPE_S
    assert set(fleet.up_samples) == pairs
    assert all(per_scraper / 2 <= n <= per_scraper * 1.5 for n in fleet.up_samples.values()), (
        fleet.up_samples
    )


def test_the_global_evaluator_pages_once_for_the_incident(fleet: Fleet) -> None:
    """One alert, one group, one pod: the preempting one."""
    print(f"\nsharded page: {fleet.seconds_to_page:.0f} s from start to the webhook")
    alerts = [a for n in fleet.pages for a in n.alerts("firing")]
    assert {a["labels"]["alertname"] for a in alerts} == {PAGE_ALERT}
    assert {a["fingerprint"] for a in alerts} == {alerts[0]["fingerprint"]}
    assert {n.body["groupKey"] for n in fleet.pages} == {fleet.pages[0].body["groupKey"]}
    assert [a["labels"]["pod"] for a in fleet.page_alerts_in_vmalert] == [INCIDENT_POD]


def test_the_page_carries_the_single_prometheus_labels(fleet: Fleet) -> None:
    """The labels test_alerting_e2e.py checks on the single-Prometheus page: same values."""
    labels = fleet.pages[0].alerts("firing")[0]["labels"]
    assert labels["model_name"] == REFERENCE_MODEL_NAME
    assert labels["namespace"] == NAMESPACE
    assert labels["pod"] == INCIDENT_POD
    assert labels["severity"] == "critical"
    assert labels["team"] == "inference"
    assert labels["headroom_release"] == f"{NAMESPACE}/{FULLNAME}"
    assert labels["job"] == VLLM_JOB
    # Nothing a shard or the evaluator adds (a shard or replica label would split the alert).
    assert set(labels) == {
        "alertname",
        "model_name",
        "namespace",
        "pod",
        "instance",
        "job",
        "severity",
        "team",
        "headroom_release",
    }


def test_operator_shards_keep_each_pods_probe_beside_its_vllm_scrape(tmp_path: Path) -> None:
    """prometheus-operator's own sharding of the chart's jobs: each pod's two jobs on one shard.

    The operator hashes ``__address__`` after the chart's relabelling, which rewrites it to the
    exporter for every probe; the chart's ``__tmp_hash`` (the pod's address) is hashed instead.
    Two Prometheus agents with the operator's rules appended: each keeps the probes and the
    direct scrapes of the pods whose address hashes to it.
    """
    helm = require(helm_binary)
    require(prometheus_binary)  # the shards are Prometheus agents
    discovery = helm_template(helm, CHART_VALUES, tmp_path, "templates/fleet-discovery.yaml")
    fakes = {pod: FakeVllm() for pod in PODS}
    agents: list[ToolServer] = []
    try:
        addresses = {pod: fake.url.removeprefix("http://") for pod, fake in fakes.items()}
        for shard in range(SHARDS):
            jobs = fleet_scrape_configs(
                discovery,
                {pod: (NAMESPACE, address) for pod, address in addresses.items()},
                exporter_address="127.0.0.1:9",  # never reached
                port_number=VLLM_PORT,
                interval_s=SCRAPE_S,
            )
            for job in jobs:
                job["relabel_configs"] += operator_sharding_rules(shard)
            config = {"scrape_configs": jobs}  # nothing to send: the targets are what counts
            config_path = tmp_path / f"operator-shard-{shard}.yml"
            config_path.write_text(json.dumps(config))
            agent = prometheus_agent(config_path, workdir=tmp_path, name=f"operator-shard-{shard}")
            agents.append(agent.start())

        def kept() -> list[dict[str, set[str]]]:
            by_shard: list[dict[str, set[str]]] = []
            for agent in agents:
                jobs: dict[str, set[str]] = {}
                for target in agent.get_json("/api/v1/targets")["data"]["activeTargets"]:
                    jobs.setdefault(target["labels"]["job"], set()).add(target["labels"]["pod"])
                by_shard.append(jobs)
            total = sum(len(pods) for jobs in by_shard for pods in jobs.values())
            return by_shard if total == 2 * len(PODS) else []

        by_shard = wait_until(kept, timeout_s=30.0, what="both jobs' targets on the two shards")
    finally:
        for agent in agents:
            agent.stop()
        for fake in fakes.values():
            fake.close()
    for shard, kept_jobs in enumerate(by_shard):
        expected = {pod for pod, address in addresses.items() if hashmod(address) == shard}
        assert kept_jobs.get(EXPORTER_JOB, set()) == expected, (shard, addresses)
        assert kept_jobs.get(VLLM_JOB, set()) == expected, (shard, addresses)
