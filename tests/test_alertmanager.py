"""The shipped Alertmanager example, run in a real Alertmanager: one page per incident.

Debian's Alertmanager 0.25 runs ``alerts/alertmanager/vllm-headroom.yml`` with its receivers
pointed at a webhook receiver in this test; the alerts are posted to its API as Prometheus would
send them, with the labels the Helm chart gives them (namespace, pod, model_name,
headroom_release, job, instance). One change to the example: every route's ``group_wait`` is 1 s
instead of 10 s (pages) and 5 minutes (tickets), so that the first notification of every group
arrives in seconds; grouping, routes, inhibitions and the other timings are the shipped ones (a
group's second notification waits for its ``group_interval``, a minute or more, so what arrives
here is one notification per group). Each incident lives in its own namespace, so that all of
them run side by side in one Alertmanager, posted at once.

Before the example grouped its pages per model, one model's incident on 20 pods sent 20 pages,
and one pod's preemption muted the whole model's TTFT SLO page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from exporter.testing.processes import wait_until
from tests.alertmanager import AlertmanagerServer, Notification, Receiver, example_config
from tests.e2e.harness import alertmanager_binary
from tests.tools import require

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PAGE, TICKET, SLACK = "/page", "/ticket", "/slack"
SPIKE = "VllmHeadroomPreemptionSpike"
SATURATED = "VllmHeadroomKvCacheSaturated"
FOREIGN_GPU = "VllmHeadroomGpuForeignMemory"
TTFT_SLO = "VllmHeadroomTtftBudgetBurn"
LOW = "VllmHeadroomLow"
FLEET_LOW = "VllmHeadroomFleetLow"
FLEET_PODS = 24
#: After the last expected group arrived: time for any unexpected one to arrive too (every group
#: waits the same 1 s, so they all come together).
SETTLE_S = 3.0


def alert(
    name: str, severity: str, namespace: str, model: str, release: str = "r", **labels: str
) -> dict[str, Any]:
    """One firing alert labelled as the chart's rules label it, in release ``release``."""
    return {
        "labels": {
            "alertname": name,
            "severity": severity,
            "namespace": namespace,
            "model_name": model,
            "headroom_release": f"{namespace}/{release}-vllm-headroom",
            "team": "inference",
            **labels,
        },
        "annotations": {"summary": name},
    }


def on_pod(
    name: str, severity: str, namespace: str, model: str, i: int, **more: str
) -> dict[str, Any]:
    """An alert about pod ``<model>-<i>``, scraped as the chart's vLLM job scrapes it."""
    return alert(
        name,
        severity,
        namespace,
        model,
        pod=f"{model}-{i}",
        job=f"{namespace}/r-vllm-headroom-vllm",
        instance=f"10.0.{i // 250}.{i % 250}:8000",
        **more,
    )


def capacity_incident(namespace: str, model: str, pods: int, **more: str) -> list[dict[str, Any]]:
    """PreemptionSpike and KvCacheSaturated on each of ``pods`` pods of one model."""
    return [
        on_pod(name, "critical", namespace, model, i, **more)
        for i in range(pods)
        for name in (SPIKE, SATURATED)
    ]


#: namespace -> the alerts of its incident, all posted at once.
INCIDENTS: dict[str, list[dict[str, Any]]] = {
    "one-pod": capacity_incident("one-pod", "llama", 1),
    "fleet": capacity_incident("fleet", "llama", FLEET_PODS),
    # Two models of one release, and the first model in a second release: three incidents.
    "two-models": [
        *capacity_incident("two-models", "llama", 3),
        *capacity_incident("two-models", "qwen", 3),
        *capacity_incident("two-models", "llama", 2, headroom_release="two-models/s-vllm-headroom"),
    ],
    # The model's incident on three pods, and another process on one pod's GPU.
    "pod-local": [
        *capacity_incident("pod-local", "llama", 3),
        on_pod(FOREIGN_GPU, "critical", "pod-local", "llama", 1, gpu="0", memory="foreign"),
    ],
    # Pod 0 preempts; pod 1's KV cache is full (no preemption there); pods 0 and 2 have low
    # headroom; the model's TTFT SLO burns; the model's fleet headroom is low.
    "inhibition": [
        on_pod(SPIKE, "critical", "inhibition", "llama", 0),
        on_pod(SATURATED, "critical", "inhibition", "llama", 0),
        on_pod(SATURATED, "critical", "inhibition", "llama", 1),
        on_pod(LOW, "warning", "inhibition", "llama", 0, engine="0"),
        on_pod(LOW, "warning", "inhibition", "llama", 2, engine="0"),
        alert(TTFT_SLO, "critical", "inhibition", "llama"),
        alert(FLEET_LOW, "warning", "inhibition", "llama"),
    ],
    # Not ours: the user's own tree handles it.
    "foreign": [
        {
            "labels": {
                "alertname": "KubePodCrashLooping",
                "severity": "critical",
                "namespace": "foreign",
                "pod": "web-0",
            }
        },
        {
            "labels": {
                "alertname": "CPUThrottlingHigh",
                "severity": "warning",
                "namespace": "foreign",
                "pod": "web-0",
            }
        },
    ],
}
#: namespace -> how many page notification groups its incident is.
PAGES = {"one-pod": 1, "fleet": 1, "two-models": 3, "pod-local": 2, "inhibition": 1, "foreign": 0}


@dataclass(frozen=True, slots=True)
class Delivered:
    """What reached the receiver, and Alertmanager's state of every alert, after one round."""

    notifications: list[Notification]
    states: dict[tuple[str, str, str], str]

    def to(self, path: str, namespace: str) -> list[Notification]:
        """The notifications sent to ``path`` about ``namespace``'s alerts."""
        return [
            n
            for n in self.notifications
            if n.path == path and n.body["commonLabels"].get("namespace") == namespace
        ]

    def rendered(self, namespace: str) -> list[dict[str, Any]]:
        """The page templates as rendered for ``namespace``'s pages (Slack attachments)."""
        return [
            attachment
            for n in self.notifications
            if n.path == SLACK
            for attachment in n.body["attachments"]
            if f"({namespace}/" in attachment["title"]
        ]

    def state(self, namespace: str, name: str, pod: str = "") -> str:
        """Alertmanager's state of one alert: active or suppressed."""
        return self.states[(namespace, name, pod)]


def _firing(notifications: list[Notification]) -> list[dict[str, Any]]:
    return [a for n in notifications for a in n.alerts("firing")]


def _pods(notification: Notification) -> set[str]:
    return {a["labels"].get("pod", "") for a in notification.alerts("firing")} - {""}


@pytest.fixture(scope="module")
def delivered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Delivered]:
    """Every incident posted at once to the example; the notifications of their first round."""
    require(alertmanager_binary)
    receiver = Receiver()
    workdir: Path = tmp_path_factory.mktemp("alertmanager")
    config = example_config(receiver.url, group_wait="1s")
    # The shipped templates, as a pager would use them: Slack's payload carries them rendered.
    [page] = [r for r in config["receivers"] if r["name"] == "vllm-headroom-page"]
    page["slack_configs"] = [
        {
            "api_url": f"{receiver.url}{SLACK}",
            "channel": "#pages",
            "title": '{{ template "vllm-headroom.page.title" . }}',
            "text": '{{ template "vllm-headroom.page.text" . }}',
            "fields": [{"title": "pods", "value": '{{ template "vllm-headroom.page.pods" . }}'}],
        }
    ]
    server = AlertmanagerServer(config, workdir)
    try:
        server.start()
        server.post([a for incident in INCIDENTS.values() for a in incident])
        expected = sum(PAGES.values())
        wait_until(
            lambda: (
                len(receiver.received(PAGE)) >= expected
                and len(receiver.received(SLACK)) >= expected
            ),
            timeout_s=30.0,
            what=f"{expected} page notifications",
        )
        time.sleep(SETTLE_S)
        states = {
            (
                a["labels"]["namespace"],
                a["labels"]["alertname"],
                a["labels"].get("pod", ""),
            ): a["status"]["state"]
            for a in server.alerts()
        }
        yield Delivered(list(receiver.notifications), states)
    finally:
        server.stop()
        receiver.stop()


@pytest.mark.parametrize("namespace", ["one-pod", "fleet"])
def test_one_models_incident_is_one_page_listing_its_pods(
    delivered: Delivered, namespace: str
) -> None:
    """One pod or 24: one page notification, whose alerts name every pod of the incident."""
    pods = len(INCIDENTS[namespace]) // 2
    [page] = delivered.to(PAGE, namespace)
    assert _pods(page) == {f"llama-{i}" for i in range(pods)}
    assert page.body["groupLabels"] == {
        "namespace": namespace,
        "model_name": "llama",
        "headroom_release": f"{namespace}/r-vllm-headroom",
    }


def test_the_page_templates_name_the_model_once_and_list_every_pod(delivered: Delivered) -> None:
    """The shipped templates: title with the model and release, every pod, one line per alert."""
    [fleet] = delivered.rendered("fleet")
    assert fleet["title"] == (
        f"[FIRING:{FLEET_PODS}] llama (fleet/r-vllm-headroom): VllmHeadroomPreemptionSpike"
    )
    [pods] = [f["value"] for f in fleet["fields"] if f["title"] == "pods"]
    assert set(pods.split(", ")) == {f"llama-{i}" for i in range(FLEET_PODS)}
    lines = fleet["text"].splitlines()
    assert len(lines) == FLEET_PODS
    assert all(line.startswith(f"- {SPIKE} on llama-") for line in lines)
    [mixed] = delivered.rendered("inhibition")
    assert mixed["title"] == "[FIRING:3] llama (inhibition/r-vllm-headroom): several alerts"
    assert f"- {TTFT_SLO}: {TTFT_SLO}" in mixed["text"].splitlines()


def test_the_saturation_page_of_a_preempting_pod_is_muted(delivered: Delivered) -> None:
    """Each pod's preemption page carries its KV usage: that pod's saturation alert is not sent."""
    [page] = delivered.to(PAGE, "fleet")
    assert {a["labels"]["alertname"] for a in page.alerts("firing")} == {SPIKE}
    assert len(page.alerts("firing")) == FLEET_PODS
    assert delivered.state("fleet", SATURATED, "llama-7") == "suppressed"


def test_two_models_or_two_releases_are_two_pages(delivered: Delivered) -> None:
    """Per model and release: llama and qwen of release r, and llama of release s, three pages."""
    pages = delivered.to(PAGE, "two-models")
    got = {
        (n.body["groupLabels"]["model_name"], n.body["groupLabels"]["headroom_release"]): _pods(n)
        for n in pages
    }
    assert len(pages) == 3
    assert got == {
        ("llama", "two-models/r-vllm-headroom"): {"llama-0", "llama-1", "llama-2"},
        ("qwen", "two-models/r-vllm-headroom"): {"qwen-0", "qwen-1", "qwen-2"},
        ("llama", "two-models/s-vllm-headroom"): {"llama-0", "llama-1"},
    }


def test_a_pod_local_problem_is_its_own_page(delivered: Delivered) -> None:
    """Another process on one pod's GPU pages for that pod alone, beside the model's page."""
    pages = delivered.to(PAGE, "pod-local")
    by_name = {frozenset(a["labels"]["alertname"] for a in n.alerts("firing")): n for n in pages}
    assert set(by_name) == {frozenset({SPIKE}), frozenset({FOREIGN_GPU})}
    assert _pods(by_name[frozenset({FOREIGN_GPU})]) == {"llama-1"}
    assert _pods(by_name[frozenset({SPIKE})]) == {"llama-0", "llama-1", "llama-2"}


def test_a_pods_page_mutes_the_tickets_of_that_pod_only(delivered: Delivered) -> None:
    """Pod 0's page mutes pod 0's low-headroom ticket; pod 2's and the model's tickets are sent."""
    assert delivered.state("inhibition", LOW, "llama-0") == "suppressed"
    assert delivered.state("inhibition", LOW, "llama-2") == "active"
    assert delivered.state("inhibition", FLEET_LOW) == "active"
    tickets = _firing(delivered.to(TICKET, "inhibition"))
    sent = {(a["labels"]["alertname"], a["labels"].get("pod", "")) for a in tickets}
    assert sent == {(LOW, "llama-2"), (FLEET_LOW, "")}


def test_one_pod_in_trouble_does_not_mute_the_models_slo_page(delivered: Delivered) -> None:
    """Pod 0 preempts: the model's TTFT SLO page is not muted, and joins the model's one page."""
    [page] = delivered.to(PAGE, "inhibition")
    sent = {(a["labels"]["alertname"], a["labels"].get("pod", "")) for a in page.alerts("firing")}
    assert sent == {(SPIKE, "llama-0"), (SATURATED, "llama-1"), (TTFT_SLO, "")}
    assert delivered.state("inhibition", SATURATED, "llama-0") == "suppressed"
    assert delivered.state("inhibition", TTFT_SLO) == "active"


def test_alerts_that_are_not_ours_reach_neither_our_pager_nor_our_tickets(
    delivered: Delivered,
) -> None:
    """A foreign critical and a foreign warning take the user's default route, not ours."""
    assert not delivered.to(PAGE, "foreign")
    assert not delivered.to(TICKET, "foreign")
    assert delivered.state("foreign", "KubePodCrashLooping", "web-0") == "active"


@pytest.mark.parametrize("namespace", sorted(PAGES))
def test_each_incident_sends_as_many_pages_as_it_is(delivered: Delivered, namespace: str) -> None:
    """One page notification per model and release, plus one per pod-local problem."""
    assert len(delivered.to(PAGE, namespace)) == PAGES[namespace]
