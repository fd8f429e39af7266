"""Specification of the Helm chart (helm/vllm-headroom) and of the Dockerfile.

The chart is rendered by the real, pinned Helm 3 binary (``scripts/e2e/install-helm.sh``, which
``make deps`` runs): when it is missing these tests fail in CI (``CI=true``) and skip elsewhere,
naming the install command. Every rendered object is validated: Kubernetes kinds with
kubernetes-validate (strict: unknown fields fail) against the oldest Kubernetes the chart
supports and the newest the package ships. No PyPI or npm package ships prometheus-operator's
CRD OpenAPI schemas in a form these tests can use without side effects, so its kinds
(PodMonitor, ServiceMonitor, PrometheusRule, ScrapeConfig) are checked structurally: against
the subset of their CRD fields the chart writes (``CRD_STRUCTURE``), unknown fields, wrong
types and bad enums failing. The rules the chart renders (scoped per release, under promtool)
and the AlertmanagerConfig are tests/test_helm_rules.py's; the dashboards' ConfigMaps carry
``dashboards/*.json`` byte for byte.

No Docker engine runs here, so the Dockerfile is parsed and its properties asserted, and its
build step (``pip wheel --no-deps``) is run for real.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, latest_version

import exporter
from alerts.generate import CHART_COPY, generate
from exporter.core.exact import MAX_EXACT_WHOLE
from exporter.service.allowlist import AllowlistError, parse_allowlist
from exporter.service.fleet import parse_gpu_params
from exporter.service.settings import DEFAULT_PORT, Settings, load_settings
from tests import paths

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

REPO = paths.REPO
CHART = REPO / "helm" / "vllm-headroom"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RULES_FILE = REPO / "alerts" / "vllm-headroom.rules.yml"
#: The chart's rule file: the same rules with selector markers (alerts/generate.py).
CHART_RULES_FILE = REPO / CHART_COPY
DASHBOARDS = REPO / "dashboards"
DASHBOARDS_JSON = sorted(DASHBOARDS.glob("*.json"))
DOCKERFILE = REPO / "Dockerfile"

RELEASE = "rel"
NAMESPACE = "inference"

THRESHOLD_GROUP = "vllm-headroom-thresholds"
THRESHOLD_PREFIX = "headroom:threshold:"

#: Exporter settings the chart wires from its own values; every other one is accepted in
#: exporter.settings (values.schema.json), and the two lists together are all of Settings.
CHART_OWNED_SETTINGS = frozenset(
    {
        "listen_address",
        "port",
        "tls_cert_file",
        "tls_key_file",
        "mode",
        "target",
        "bearer_token",
        "model",
        "hf_home",
        "model_roots",
        "gpu_discovery",
        "gpus",
        "gpu_source",
        "dcgm_url",
        "pod_name",  # the downward API, with gpu.source=dcgm
        "pod_namespace",
        "node_name",
        "proc_root",
        "probe_allowlist",
        "log_level",
        "log_format",
        "memory_limit_bytes",  # the container's memory limit, through the downward API
    }
)

Manifest = dict[str, Any]


class RenderError(Exception):
    """helm template failed; the message is Helm's stderr without its symlink notices."""


def _helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, check=False, cwd=REPO, timeout=120
    )


def _quiet(stderr: str) -> str:
    # Helm notes each symlink it follows ("walk.go: found symbolic link..."): expected here.
    return "\n".join(line for line in stderr.splitlines() if "found symbolic link" not in line)


@functools.cache
def _template_text(helm: Path, chart: Path, values: tuple[str, ...], sets: tuple[str, ...]) -> str:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    for path in values:
        args += ["--values", path]
    for item in sets:
        flag, _, value = item.partition(" ")
        args += [flag, value]
    done = _helm_run(helm, *args)
    if done.returncode != 0:
        raise RenderError(_quiet(done.stderr).strip())
    return done.stdout


def render(
    helm: Path,
    *values: Path,
    sets: Sequence[str] = (),
    chart: Path = CHART,
) -> list[Manifest]:
    """Render the chart; ``sets`` are ``"--set a=b"``-style flag and value pairs."""
    text = _template_text(helm, chart, tuple(str(v) for v in values), tuple(sets))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_error(helm: Path, *values: Path, sets: Sequence[str] = ()) -> str:
    """Render values that must fail; return Helm's error text."""
    with pytest.raises(RenderError) as caught:
        render(helm, *values, sets=sets)
    return str(caught.value)


def ci(name: str) -> Path:
    """One of the chart's ci/*-values.yaml files."""
    path = CHART / "ci" / f"{name}-values.yaml"
    assert path.is_file(), path
    return path


def load_yaml(path: Path) -> Any:
    """A YAML file's content."""
    return yaml.safe_load(path.read_text())


# --------------------------------------------------------------------- manifest accessors


def only(manifests: Sequence[Manifest], kind: str, name: str | None = None) -> Manifest:
    """The one manifest of ``kind`` (and ``name``)."""
    found = [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} named {name}: {[m['kind'] for m in manifests]}"
    return found[0]


def of_kind(manifests: Sequence[Manifest], kind: str) -> list[Manifest]:
    """Every manifest of ``kind``."""
    return [m for m in manifests if m["kind"] == kind]


def container(pod_spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A container of a pod spec by name."""
    found: list[dict[str, Any]] = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(found) == 1, [c["name"] for c in pod_spec["containers"]]
    return found[0]


def env_of(spec: Mapping[str, Any]) -> dict[str, str]:
    """A container's plain environment variables (valueFrom ones are left out)."""
    return {e["name"]: e["value"] for e in spec.get("env", []) if "value" in e}


def pod_specs(manifests: Sequence[Manifest]) -> list[tuple[str, dict[str, Any]]]:
    """Every pod spec the chart renders: workloads' templates and bare pods."""
    specs: list[tuple[str, dict[str, Any]]] = []
    for m in manifests:
        if m["kind"] in {"Deployment", "StatefulSet", "DaemonSet"}:
            specs.append((f"{m['kind']}/{m['metadata']['name']}", m["spec"]["template"]["spec"]))
        elif m["kind"] == "Pod":
            specs.append((f"Pod/{m['metadata']['name']}", m["spec"]))
    return specs


def sidecar_patch(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The strategic-merge patch of the sidecar shape's ConfigMap."""
    configmap = only(manifests, "ConfigMap", f"{RELEASE}-vllm-headroom-sidecar-patch")
    patch: dict[str, Any] = yaml.safe_load(configmap["data"]["patch.yaml"])
    return patch


def sidecar_pod(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The pod spec that holds the sidecar: the vLLM Deployment's, or the patch's."""
    deployments = of_kind(manifests, "Deployment")
    if deployments:
        spec: dict[str, Any] = deployments[0]["spec"]["template"]["spec"]
        return spec
    patched: dict[str, Any] = sidecar_patch(manifests)["spec"]["template"]["spec"]
    return patched


def strategic_merge(base: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge as the patch needs it: named list items merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value) if key in base else value
        return merged
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in [*base, *patch])
    ):
        by_name = {item["name"]: item for item in base}
        for item in patch:
            by_name[item["name"]] = strategic_merge(by_name.get(item["name"], {}), item)
        return list(by_name.values())
    return patch


# ------------------------------------------------------------------ NetworkPolicy semantics


@dataclass(frozen=True)
class Peer:
    """A pod that opens a connection: its namespace's name and its own labels."""

    namespace: str
    labels: Mapping[str, str]


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # no policy here uses matchExpressions
    return dict(selector.get("matchLabels") or {}).items() <= dict(labels).items()


def _peer_matches(rule_peer: Mapping[str, Any], peer: Peer, namespace: str) -> bool:
    """A NetworkPolicyPeer: a podSelector alone means pods of the policy's own namespace."""
    assert "ipBlock" not in rule_peer, rule_peer
    namespaces = rule_peer.get("namespaceSelector")
    if namespaces is None:
        in_namespace = peer.namespace == namespace
    else:
        in_namespace = _selects(namespaces, {"kubernetes.io/metadata.name": peer.namespace})
    pods = rule_peer.get("podSelector")
    return in_namespace and (pods is None or _selects(pods, peer.labels))


def named_ports(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """The pod's container ports by name (a NetworkPolicy's named ports resolve against them)."""
    containers = [*pod_spec["containers"], *pod_spec.get("initContainers", [])]
    return {
        p["name"]: p["containerPort"] for c in containers for p in c.get("ports", []) if "name" in p
    }


def served_ports(pod_spec: Mapping[str, Any]) -> set[int]:
    """Every TCP port a container of the pod declares (restartable init containers included)."""
    containers = [
        *pod_spec["containers"],
        *(c for c in pod_spec.get("initContainers", []) if c.get("restartPolicy") == "Always"),
    ]
    return {
        p["containerPort"]
        for c in containers
        for p in c.get("ports", [])
        if p.get("protocol", "TCP") == "TCP"
    }


def admits(policy: Manifest, pod_spec: Mapping[str, Any], peer: Peer, port: int) -> bool:
    """Whether ``policy`` lets ``peer`` open a TCP connection to ``port`` of a pod it selects.

    Kubernetes' semantics (networking.k8s.io/v1): a selected pod accepts a connection some
    ingress rule allows; a rule without ports allows every port, one without from every peer.
    """
    named = named_ports(pod_spec)
    namespace = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress", []):
        ports_ok = not rule.get("ports") or any(
            entry.get("protocol", "TCP") == "TCP"
            and (
                "port" not in entry
                or (
                    named.get(entry["port"]) == port
                    if isinstance(entry["port"], str)
                    else entry["port"] <= port <= entry.get("endPort", entry["port"])
                )
            )
            for entry in rule["ports"]
        )
        peers_ok = not rule.get("from") or any(
            _peer_matches(item, peer, namespace) for item in rule["from"]
        )
        if ports_ok and peers_ok:
            return True
    return False


# ------------------------------------------------------------------------ validation


def _supported_kube_versions() -> list[str]:
    chart = load_yaml(CHART / "Chart.yaml")
    floor = re.match(r">=\s*(\d+\.\d+)", chart["kubeVersion"])
    assert floor, chart["kubeVersion"]
    oldest = floor.group(1)
    assert oldest in {".".join(v.split(".")[:2]) for v in all_versions()}, oldest
    return [oldest, latest_version()]


def _object(properties: Mapping[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": dict(properties),
        "required": list(required),
    }


_STR: dict[str, Any] = {"type": "string"}
_STR_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
# The CRDs' duration pattern (monitoring.coreos.com Duration).
_DURATION: dict[str, Any] = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    r"(([0-9]+)ms)?)$",
}
#: Relabeling actions as the CRDs accept them (either case).
_ACTIONS = [
    *("replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep"),
    *("lowercase", "uppercase", "keepequal", "dropequal"),
    *("Replace", "Keep", "Drop", "HashMod", "LabelMap", "LabelDrop", "LabelKeep"),
    *("Lowercase", "Uppercase", "KeepEqual", "DropEqual"),
]
_RELABELINGS: dict[str, Any] = {
    "type": "array",
    "items": _object(
        {
            "sourceLabels": {"type": "array", "items": _STR},
            "separator": _STR,
            "targetLabel": _STR,
            "regex": _STR,
            "modulus": {"type": "integer"},
            "replacement": _STR,
            "action": {"enum": _ACTIONS},
        }
    ),
}
_SELECTOR = _object({"matchLabels": _STR_MAP, "matchExpressions": {"type": "array"}})
_NAMESPACE_SELECTOR = _object(
    {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _STR}}
)
_ENDPOINT_FIELDS: dict[str, Any] = {
    "port": _STR,
    "path": {"type": "string", "pattern": "^/"},
    "scheme": {"enum": ["http", "https"]},
    "interval": _DURATION,
    "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"},
    "params": {"type": "object"},
    "relabelings": _RELABELINGS,
    "metricRelabelings": _RELABELINGS,
}
_METADATA = _object(
    {"name": _STR, "namespace": _STR, "labels": _STR_MAP, "annotations": _STR_MAP}, ["name"]
)


def _custom_resource(spec: dict[str, Any]) -> dict[str, Any]:
    return _object(
        {"apiVersion": _STR, "kind": _STR, "metadata": _METADATA, "spec": spec},
        ["apiVersion", "kind", "metadata", "spec"],
    )


#: The fields of prometheus-operator's CRDs (v0.80 and later) that the chart writes, with the
#: CRDs' types and enums; checked once against the CRD-generated models of
#: cloudcoil.models.prometheus_operator 0.80.1 (not a dependency: it installs a pytest plugin).
CRD_STRUCTURE: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "PodMonitor"): _custom_resource(
        _object(
            {
                "selector": _SELECTOR,
                "namespaceSelector": _NAMESPACE_SELECTOR,
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {**_ENDPOINT_FIELDS, "portNumber": {"type": "integer"}}, ["port", "path"]
                    ),
                },
            },
            ["selector", "podMetricsEndpoints"],
        )
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _custom_resource(
        _object(
            {
                "selector": _SELECTOR,
                "namespaceSelector": _NAMESPACE_SELECTOR,
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {**_ENDPOINT_FIELDS, "targetPort": {"type": ["string", "integer"]}},
                        ["port", "path"],
                    ),
                },
            },
            ["selector", "endpoints"],
        )
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _custom_resource(
        _object(
            {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "query_offset": _DURATION,
                            "limit": {"type": "integer"},
                            "partial_response_strategy": _STR,
                            "rules": {
                                "type": "array",
                                "items": _object(
                                    {
                                        "record": _STR,
                                        "alert": _STR,
                                        "expr": {"type": ["string", "integer"]},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": _STR_MAP,
                                        "annotations": _STR_MAP,
                                    },
                                    ["expr"],
                                ),
                            },
                        },
                        ["name"],
                    ),
                }
            },
            ["groups"],
        )
    ),
    ("monitoring.coreos.com/v1alpha1", "ScrapeConfig"): _custom_resource(
        _object(
            {
                "scrapeInterval": _DURATION,
                "scrapeTimeout": _DURATION,
                "metricsPath": {"type": "string", "pattern": "^/"},
                "params": {"type": "object"},
                "scheme": {"enum": ["HTTP", "HTTPS"]},
                "relabelings": _RELABELINGS,
                "metricRelabelings": _RELABELINGS,
                "kubernetesSDConfigs": {
                    "type": "array",
                    "items": _object(
                        {
                            "role": {
                                "enum": [
                                    "Pod",
                                    "Endpoints",
                                    "Ingress",
                                    "Service",
                                    "Node",
                                    "EndpointSlice",
                                ]
                            },
                            "namespaces": _object(
                                {
                                    "names": {"type": "array", "items": _STR},
                                    "ownNamespace": {"type": "boolean"},
                                }
                            ),
                            "selectors": {
                                "type": "array",
                                "items": _object(
                                    {"role": _STR, "label": _STR, "field": _STR}, ["role"]
                                ),
                            },
                        },
                        ["role"],
                    ),
                },
            }
        )
    ),
}


def validate_manifest(manifest: Manifest) -> None:
    """Validate one object: Kubernetes kinds strictly against two versions, CRDs structurally."""
    key = (manifest["apiVersion"], manifest["kind"])
    if key[0].startswith("monitoring.coreos.com/"):
        assert key in CRD_STRUCTURE, f"no structure for {key}"
        jsonschema.validate(manifest, CRD_STRUCTURE[key])
        return
    for version in _supported_kube_versions():
        kubernetes_validate.validate(manifest, version, strict=True)


# ================================================================================== chart


def test_chart_app_version_is_the_package_version() -> None:
    """The chart deploys the image tag of the package it ships with (appVersion)."""
    assert load_yaml(CHART / "Chart.yaml")["appVersion"] == exporter.__version__


def test_ci_values_cover_every_shape() -> None:
    """Each shape of the chart has at least one ci/*-values.yaml that lint and template run."""
    shapes = {load_yaml(path)["shape"] for path in CI_VALUES}
    assert shapes == {"vllm", "sidecar", "fleet"}


def test_the_chart_holds_no_links() -> None:
    """Nothing in helm/vllm-headroom is a symbolic link: a copy of the folder alone is the chart."""
    found = [
        Path(folder, name).relative_to(CHART)
        for folder, dirs, names in os.walk(CHART)
        for name in [*dirs, *names]
        if Path(folder, name).is_symlink()
    ]
    assert found == []


def test_the_chart_embeds_its_rule_file_and_copies_of_the_dashboards() -> None:
    """files/ holds the generated rule file and every dashboard byte for byte (make docs)."""
    assert CHART_RULES_FILE.read_text(encoding="utf-8") == generate()[CHART_COPY], "run make docs"
    copies = {path: CHART / "files" / "dashboards" / path.name for path in DASHBOARDS_JSON}
    assert len(copies) == 2
    for source, copy_path in copies.items():
        assert copy_path.read_bytes() == source.read_bytes(), f"{copy_path}: run make docs"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "sync_chart_files.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.e2e
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_lint_strict_passes(helm: Path, values: Path) -> None:
    """helm lint --strict passes each ci values file with no silent fail() (lint hides them)."""
    done = _helm_run(helm, "lint", "--strict", str(CHART), "--values", str(values))
    output = done.stdout + _quiet(done.stderr)
    assert done.returncode == 0, output
    assert "Fail:" not in output, output
    assert "[WARNING]" not in output, output
    assert "[ERROR]" not in output, output


@pytest.mark.e2e
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_rendered_object_validates(helm: Path, values: Path) -> None:
    """Every object rendered from a ci values file validates against its schema."""
    manifests = render(helm, values)
    assert manifests
    for manifest in manifests:
        validate_manifest(manifest)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("kind", "path", "bad"),
    [
        ("Deployment", ("spec", "template", "spec", "containers", 0), {"imagePullPolcy": "Always"}),
        ("Service", ("spec", "ports", 0), {"port": "eighty"}),
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0), {"scrapeTimout": "10s"}),
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0), {"scheme": "ftp"}),
        ("PrometheusRule", ("spec", "groups", 0), {"rules": [{"record": "x"}]}),
    ],
)
def test_validation_rejects_what_the_api_server_would(
    helm: Path, kind: str, path: tuple[str | int, ...], bad: dict[str, Any]
) -> None:
    """A misspelt field, a wrong type or a bad enum in a rendered object fails validation."""
    manifest = copy.deepcopy(only(render(helm, ci("vllm")), kind))
    validate_manifest(manifest)
    target: Any = manifest
    for step in path:
        target = target[step]
    target.update(bad)
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(manifest)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "sets",
    [
        ("--set fleet.discovery.kind=PodMonitor",),
        (
            "--set fleet.discovery.kind=none",
            "--set vllmMetrics.enabled=false",
            "--set vllmMetrics.job=vllm",
        ),
        (
            "--set podMonitor.enabled=true",
            "--set podMonitor.labels.release=kube-prometheus-stack",
            "--set serviceMonitor.enabled=false",
            "--set networkPolicy.metricsFrom=null",
        ),
    ],
    ids=["podmonitor-discovery", "no-discovery", "podmonitor-open-metrics"],
)
def test_fleet_variants_validate(helm: Path, sets: tuple[str, ...]) -> None:
    """The fleet shape's other discovery kinds and monitors render valid objects."""
    for manifest in render(helm, ci("fleet"), sets=sets):
        validate_manifest(manifest)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("--set gpu.discovery=none", "--set vllm.modelVolume.type=emptyDir"),
        ("--set vllm.apiKey.secretName=", "--set vllm.hfToken.secretName="),
    ],
    ids=["defaults", "no-gpu-emptydir", "no-secrets"],
)
def test_vllm_variants_validate(helm: Path, sets: tuple[str, ...]) -> None:
    """The vllm shape renders valid objects from its bare minimum and without GPU or secrets."""
    minimal = ("--set vllm.model=Qwen/Qwen3-0.6B",)
    for manifest in render(helm, sets=(*minimal, *sets)):
        validate_manifest(manifest)


@pytest.fixture(scope="module")
def packaged_chart(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart as ``helm package`` writes it (the archive a chart repository serves)."""
    out = tmp_path_factory.mktemp("package")
    done = _helm_run(helm, "package", str(CHART), "--destination", str(out))
    assert done.returncode == 0, done.stderr
    assert "symbolic link" not in done.stderr
    (archive,) = out.glob("vllm-headroom-*.tgz")
    return archive


@pytest.fixture(scope="module")
def copied_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """helm/vllm-headroom copied alone, as a user would (``cp -r``, links left as links)."""
    copy_dir = tmp_path_factory.mktemp("copy") / "vllm-headroom"
    subprocess.run(["cp", "-r", str(CHART), str(copy_dir)], check=True, timeout=30)
    return copy_dir


@pytest.mark.e2e
def test_package_holds_the_rules_and_dashboards_and_no_python(packaged_chart: Path) -> None:
    """The packaged chart carries the rule file and each dashboard byte for byte, and no code."""
    with tarfile.open(packaged_chart) as tar:
        members = {m.name: m for m in tar.getmembers()}
        expected = {f"vllm-headroom/files/alerts/{RULES_FILE.name}": CHART_RULES_FILE}
        expected |= {f"vllm-headroom/files/dashboards/{p.name}": p for p in DASHBOARDS_JSON}
        for name, source in expected.items():
            assert members[name].isfile(), name
            extracted = tar.extractfile(members[name])
            assert extracted is not None
            assert extracted.read() == source.read_bytes(), name
        assert not [m.name for m in members.values() if m.name.endswith(".py") or m.issym()]


@pytest.mark.e2e
@pytest.mark.parametrize("shape", ["vllm", "sidecar"])
@pytest.mark.parametrize("chart", ["packaged_chart", "copied_chart"])
def test_packaged_and_copied_charts_render_as_the_repositorys(
    helm: Path, request: pytest.FixtureRequest, shape: str, chart: str
) -> None:
    """helm template of the package and of a lone copy of the folder equals the in-repo chart's.

    Both shapes' ci values render the rules and the dashboards, every embedded file.
    """
    path: Path = request.getfixturevalue(chart)
    assert render(helm, ci(shape), chart=path) == render(helm, ci(shape))


# ------------------------------------------------------------------------ secure by default


@pytest.mark.e2e
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_container_is_locked_down(helm: Path, values: Path) -> None:
    """Every container runs non-root, read-only, unprivileged, seccomp'd, with limits."""
    manifests = render(helm, values)
    specs = pod_specs(manifests)
    if load_yaml(values)["shape"] == "sidecar":
        specs.append(("patch", sidecar_patch(manifests)["spec"]["template"]["spec"]))
    assert specs
    for where, spec in specs:
        pod_security = spec.get("securityContext", {})
        if where != "patch":
            assert spec["automountServiceAccountToken"] is False, where
            assert pod_security["runAsNonRoot"] is True, where
            assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert not spec.get("hostNetwork"), where
        assert not spec.get("hostPID"), where
        assert not [v for v in spec.get("volumes", []) if "hostPath" in v], where
        for item in spec["containers"]:
            security = item["securityContext"]
            label = f"{where}: {item['name']}"
            assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True, label
            uid = security.get("runAsUser", pod_security.get("runAsUser"))
            assert isinstance(uid, int), label
            assert uid > 0, label
            assert security["readOnlyRootFilesystem"] is True, label
            assert security["allowPrivilegeEscalation"] is False, label
            assert security.get("privileged", False) is False, label
            assert security["capabilities"] == {"drop": ["ALL"]}, label
            seccomp = security.get("seccompProfile", pod_security.get("seccompProfile"))
            assert seccomp == {"type": "RuntimeDefault"}, label
            resources = item["resources"]
            assert resources["requests"]["memory"], label
            assert resources["limits"]["memory"], label
            assert resources["requests"]["cpu"], label


@pytest.mark.e2e
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_exporter_probes_and_resources(helm: Path, values: Path) -> None:
    """The exporter is probed on /-/healthy (never /-/ready) and asks for no GPU."""
    manifests = render(helm, values)
    shape = load_yaml(values)["shape"]
    spec = sidecar_pod(manifests) if shape != "fleet" else pod_specs(manifests)[0][1]
    sidecar = container(spec, "vllm-headroom")
    assert sidecar["ports"] == [
        {"name": "headroom", "containerPort": DEFAULT_PORT, "protocol": "TCP"}
    ]
    probes = ("livenessProbe", "readinessProbe") if shape == "fleet" else ("livenessProbe",)
    for probe in probes:
        assert sidecar[probe]["httpGet"] == {"path": "/-/healthy", "port": "headroom"}, probe
    resources = sidecar["resources"]
    assert not [r for r in [*resources["requests"], *resources["limits"]] if "gpu" in r]
    assert resources["limits"]["cpu"]
    assert resources["limits"]["memory"]


@pytest.mark.e2e
def test_vllm_container_probes_health_and_requests_gpus(helm: Path) -> None:
    """vLLM is probed on /health (startup, liveness, readiness) and alone requests the GPUs."""
    deployment = only(render(helm, ci("vllm")), "Deployment")
    vllm = container(deployment["spec"]["template"]["spec"], "vllm")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert vllm["args"][:5] == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "0.0.0.0",  # noqa: S104 - vLLM listens on the pod network; asserting that it does
        "--port",
        "8000",
    ]
    assert vllm["command"] == ["vllm", "serve"]
    assert {"name": "models", "mountPath": "/models"} in vllm["volumeMounts"]


# ------------------------------------------------------------- the sidecar never takes vLLM down

#: Every shape, as the ci values render it and from its bare defaults: (values files, --set flags).
EVERY_SHAPE = [
    *(pytest.param((path,), (), id=path.name) for path in CI_VALUES),
    pytest.param((), ("--set vllm.model=Qwen/Qwen3-0.6B",), id="vllm-defaults"),
    pytest.param(
        (),
        ("--set shape=sidecar", "--set sidecar.podSelector.app=vllm"),
        id="sidecar-defaults",
    ),
    pytest.param(
        (),
        (
            "--set shape=fleet",
            "--set fleet.allowlist={10.0.0.0/8}",
            "--set fleet.discovery.kind=none",
        ),
        id="fleet-defaults",
    ),
]

#: The peak resident memory of the exporter at the worst cases the defaults allow, and its steady
#: memory after the largest answers, both measured in docs/reliability.md ("Memory at the
#: documented worst cases", "Memory over a long run").
RELIABILITY_DOC = REPO / "docs" / "reliability.md"
STEADY_AFTER_LARGE_ANSWERS_MIB = 106.3

_QUANTITY = re.compile(r"^([0-9.]+)(m|Ki|Mi|Gi|k|M|G)?$")
_FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
_FACTORS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30})


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity (``500m``, ``256Mi``, ``2``) as a number."""
    found = _QUANTITY.match(str(value))
    assert found, value
    return float(found.group(1)) * _FACTORS[found.group(2)]


def measured_worst_cases_mib() -> list[float]:
    """The peak RSS column of reliability.md's table of worst cases, in MiB."""
    text = RELIABILITY_DOC.read_text()
    section = text.split("### Memory at the documented worst cases", 1)[1].split("\n## ", 1)[0]
    peaks = [float(m) for m in re.findall(r"^\|[^|\n]+\| ([0-9.]+) MiB \|", section, re.M)]
    assert len(peaks) >= 4, section
    return peaks


def rendered_shape(
    helm: Path, values: tuple[Path, ...], sets: tuple[str, ...], *, chart: Path = CHART
) -> tuple[str, list[Manifest]]:
    """The shape and the objects of one EVERY_SHAPE case."""
    shape = "vllm"
    for path in values:
        shape = load_yaml(path).get("shape", shape)
    for item in sets:
        if item.startswith("--set shape="):
            shape = item.removeprefix("--set shape=")
    return shape, render(helm, *values, sets=sets, chart=chart)


def exporter_pod(shape: str, manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The pod spec holding the exporter: the fleet's own, or vLLM's (rendered or patched)."""
    return pod_specs(manifests)[0][1] if shape == "fleet" else sidecar_pod(manifests)


@pytest.mark.e2e
@pytest.mark.parametrize(("values", "sets"), EVERY_SHAPE)
def test_the_sidecar_never_gates_vllms_readiness(
    helm: Path, values: tuple[Path, ...], sets: tuple[str, ...]
) -> None:
    """Beside vLLM the sidecar has no readiness or startup probe: only its own tolerant liveness."""
    shape, manifests = rendered_shape(helm, values, sets)
    spec = exporter_pod(shape, manifests)
    exporter = container(spec, "vllm-headroom")
    assert not spec.get("readinessGates")
    assert "startupProbe" not in exporter
    if shape == "fleet":
        # Its own Deployment and Service, no vLLM in the pod: readiness is its own business.
        assert [c["name"] for c in spec["containers"]] == ["vllm-headroom"]
        assert exporter["readinessProbe"]["httpGet"]["path"] == "/-/healthy"
        assert exporter["args"] == ["serve"]
    else:
        assert "readinessProbe" not in exporter
        # Nor does it exit on a bad setting: a container backing off is unready, and so the pod.
        assert exporter["args"] == ["serve", "--on-start-error=wait"]
    if shape == "vllm":
        # The kubelet pulls and starts containers in order: vLLM never waits for the sidecar.
        assert [c["name"] for c in spec["containers"]] == ["vllm", "vllm-headroom"]
    if shape != "fleet":
        # A disk-backed emptyDir over its sizeLimit gets the whole pod evicted; a tmpfs of that
        # size refuses the write instead, charged to the sidecar's own memory limit.
        (tmp,) = [v for v in spec["volumes"] if v["name"] == "vllm-headroom-tmp"]
        assert tmp["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}
    liveness = exporter["livenessProbe"]
    assert liveness["httpGet"] == {"path": "/-/healthy", "port": "headroom"}
    # A restart needs two minutes of failed checks, and the first check waits out a slow start
    # (the exporter answers /-/healthy about 0.5 s after it starts on an idle machine).
    grace = (
        liveness.get("initialDelaySeconds", 0)
        + liveness["periodSeconds"] * liveness["failureThreshold"]
    )
    assert grace >= 120, liveness
    assert liveness["initialDelaySeconds"] >= 30, liveness
    assert liveness["timeoutSeconds"] >= 5, liveness


@pytest.mark.e2e
@pytest.mark.parametrize(("values", "sets"), EVERY_SHAPE)
def test_the_exporter_is_bounded_above_its_measured_worst_cases(
    helm: Path, values: tuple[Path, ...], sets: tuple[str, ...]
) -> None:
    """The exporter requests and limits CPU and memory; the limit clears every measured peak."""
    shape, manifests = rendered_shape(helm, values, sets)
    resources = container(exporter_pod(shape, manifests), "vllm-headroom")["resources"]
    for kind in ("requests", "limits"):
        assert set(resources[kind]) == {"cpu", "memory"}, resources
    limit_mib = quantity(resources["limits"]["memory"]) / 2**20
    assert limit_mib >= 1.25 * max(measured_worst_cases_mib()), limit_mib
    assert quantity(resources["requests"]["memory"]) / 2**20 >= STEADY_AFTER_LARGE_ANSWERS_MIB
    assert quantity(resources["requests"]["cpu"]) <= quantity(resources["limits"]["cpu"]) <= 1


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("--set exporter.resources.limits.memory=null",), "memory is required"),
        (("--set exporter.resources.requests=null",), "requests is required"),
    ],
)
def test_an_unbounded_exporter_is_refused(helm: Path, sets: tuple[str, ...], message: str) -> None:
    """Removing the exporter's requests or limits fails at render time."""
    error = render_error(helm, sets=("--set vllm.model=m", *sets))
    assert message in error, error


@pytest.fixture(scope="module")
def next_chart_version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart with version and appVersion bumped, as the next release has them."""
    copy_dir = tmp_path_factory.mktemp("next") / "vllm-headroom"
    shutil.copytree(CHART, copy_dir, symlinks=False)
    chart_yaml = copy_dir / "Chart.yaml"
    text = chart_yaml.read_text()
    bumped = re.sub(r"(?m)^version: .*$", "version: 9.8.7", text)
    bumped = re.sub(r"(?m)^appVersion: .*$", 'appVersion: "9.8.7"', bumped)
    assert bumped != text
    chart_yaml.write_text(bumped)
    return copy_dir


def pod_templates(manifests: Sequence[Manifest]) -> dict[str, str]:
    """Every pod template (workloads' and the sidecar patch's), as canonical JSON text."""
    templates = {
        f"{m['kind']}/{m['metadata']['name']}": m["spec"]["template"]
        for m in manifests
        if m["kind"] in {"Deployment", "StatefulSet", "DaemonSet"}
    }
    for m in of_kind(manifests, "ConfigMap"):
        if m["metadata"]["name"].endswith("-sidecar-patch"):
            templates["patch"] = yaml.safe_load(m["data"]["patch.yaml"])["spec"]["template"]
    return {where: json.dumps(body, sort_keys=True) for where, body in templates.items()}


@pytest.mark.e2e
@pytest.mark.parametrize(("values", "sets"), EVERY_SHAPE)
def test_a_chart_upgrade_that_changes_no_pod_restarts_none(
    helm: Path, next_chart_version: Path, values: tuple[Path, ...], sets: tuple[str, ...]
) -> None:
    """The next chart version renders every pod template byte for byte the same (image pinned)."""
    pinned = (*sets, "--set exporter.image.tag=0.1.0")
    _, before = rendered_shape(helm, values, pinned)
    _, after = rendered_shape(helm, values, pinned, chart=next_chart_version)
    assert pod_templates(before)
    assert pod_templates(after) == pod_templates(before)
    # The bump itself is seen: the objects' own labels name the new chart version.
    labels = [m["metadata"]["labels"]["helm.sh/chart"] for m in after]
    assert labels
    assert set(labels) == {"vllm-headroom-9.8.7"}
    for template in pod_templates(after).values():
        assert "helm.sh/chart" not in template
        assert "9.8.7" not in template


@pytest.mark.e2e
def test_an_unpinned_sidecar_image_follows_the_app_version_and_nothing_else(
    helm: Path, next_chart_version: Path
) -> None:
    """With exporter.image.tag empty, a new appVersion changes the sidecar's image, and only it."""
    sets = ("--set vllm.model=Qwen/Qwen3-0.6B",)
    before = json.loads(
        pod_templates(render(helm, sets=sets))[f"Deployment/{RELEASE}-vllm-headroom"]
    )
    after = json.loads(
        pod_templates(render(helm, sets=sets, chart=next_chart_version))[
            f"Deployment/{RELEASE}-vllm-headroom"
        ]
    )
    assert container(after["spec"], "vllm-headroom")["image"] == "vllm-headroom:9.8.7"
    container(after["spec"], "vllm-headroom")["image"] = "vllm-headroom:0.1.0"
    assert after == before


@pytest.mark.e2e
def test_no_disruption_budget_unless_asked(helm: Path) -> None:
    """The vllm shape renders no PodDisruptionBudget by default."""
    for values in CI_VALUES:
        assert not of_kind(render(helm, values), "PodDisruptionBudget"), values.name


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "budget"),
    [
        ((), {"maxUnavailable": 1}),
        (("--set vllm.podDisruptionBudget.maxUnavailable=50%",), {"maxUnavailable": "50%"}),
        (
            (
                "--set vllm.replicas=3",
                "--set vllm.podDisruptionBudget.maxUnavailable=null",
                "--set vllm.podDisruptionBudget.minAvailable=2",
            ),
            {"minAvailable": 2},
        ),
    ],
    ids=["default", "percent", "min-available"],
)
def test_disruption_budget_selects_the_vllm_pods(
    helm: Path, sets: tuple[str, ...], budget: dict[str, Any]
) -> None:
    """vllm.podDisruptionBudget selects exactly the vLLM pods and lets a broken one be evicted."""
    manifests = render(
        helm, ci("vllm"), sets=("--set vllm.podDisruptionBudget.enabled=true", *sets)
    )
    pdb = only(manifests, "PodDisruptionBudget")
    validate_manifest(pdb)
    spec = dict(pdb["spec"])
    selector = spec.pop("selector")["matchLabels"]
    assert spec == {**budget, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    deployment = only(manifests, "Deployment")
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sets", "strategy"),
    [
        ((), {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}),
        (("--set vllm.strategy.type=Recreate",), {"type": "Recreate"}),
        (
            (
                "--set vllm.replicas=4",
                "--set vllm.strategy.rollingUpdate.maxSurge=1",
                "--set vllm.strategy.rollingUpdate.maxUnavailable=0",
            ),
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        ),
    ],
    ids=["default-no-extra-gpu", "recreate", "surge-one"],
)
def test_rollout_strategy_is_configurable(
    helm: Path, sets: tuple[str, ...], strategy: dict[str, Any]
) -> None:
    """vllm.strategy renders a valid Deployment strategy; Recreate drops rollingUpdate."""
    deployment = only(render(helm, ci("vllm"), sets=sets), "Deployment")
    validate_manifest(deployment)
    assert deployment["spec"]["strategy"] == strategy


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("values", "sets"),
    [(("vllm",), ()), (("sidecar",), ()), ((), ("--set vllm.model=m",))],
    ids=["vllm-ci", "sidecar-default", "vllm-default"],
)
def test_gpu_discovery_defaults_to_no_gpu_in_every_shape(
    helm: Path, values: tuple[str, ...], sets: tuple[str, ...]
) -> None:
    """No GPU reaches the sidecar unless listed (runbook GpuForeignMemory); it shares processes."""
    spec = sidecar_pod(render(helm, *(ci(v) for v in values), sets=sets))
    env = env_of(container(spec, "vllm-headroom"))
    assert env["HEADROOM_GPU_DISCOVERY"] == "none"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    # For vLLM's command line (max_num_seqs); its UID keeps vLLM's environment out of reach.
    assert spec["shareProcessNamespace"] is True


# ------------------------------------------------------------------------------- wiring


@pytest.mark.e2e
@pytest.mark.parametrize(("port", "expected"), [((), 8000), (("--set vllm.port=9000",), 9000)])
def test_sidecar_targets_vllm_in_its_pod(helm: Path, port: tuple[str, ...], expected: int) -> None:
    """The sidecar polls vLLM on loopback at vLLM's own port, whatever that port is."""
    spec = sidecar_pod(render(helm, ci("vllm"), sets=port))
    vllm = container(spec, "vllm")
    assert vllm["ports"][0]["containerPort"] == expected
    assert vllm["args"][vllm["args"].index("--port") + 1] == str(expected)
    env = env_of(container(spec, "vllm-headroom"))
    assert env["HEADROOM_TARGET"] == f"http://127.0.0.1:{expected}"
    assert env["HEADROOM_MODE"] == "sidecar"


@pytest.mark.e2e
def test_sidecar_reads_the_model_volume_read_only(helm: Path) -> None:
    """The sidecar mounts vLLM's model volume read-only and looks in the same HF cache."""
    spec = sidecar_pod(render(helm, ci("vllm")))
    sidecar = container(spec, "vllm-headroom")
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in sidecar["volumeMounts"]
    vllm_env = env_of(container(spec, "vllm"))
    env = env_of(sidecar)
    assert env["HEADROOM_HF_HOME"] == vllm_env["HF_HOME"] == "/models/huggingface"
    assert env["HEADROOM_MODEL"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert env["HEADROOM_MODEL_ROOTS"] == "/models"


@pytest.mark.e2e
def test_api_key_reaches_the_sidecar_as_a_secret_file(helm: Path) -> None:
    """vLLM's API key is VLLM_API_KEY for vLLM and a bearer-token file for the sidecar."""
    spec = sidecar_pod(render(helm, ci("vllm")))
    vllm = container(spec, "vllm")
    api_key = [e for e in vllm["env"] if e["name"] == "VLLM_API_KEY"]
    assert api_key[0]["valueFrom"]["secretKeyRef"] == {"name": "vllm-api-key", "key": "key"}
    sidecar = container(spec, "vllm-headroom")
    assert "HEADROOM_BEARER_TOKEN" not in {e["name"] for e in sidecar["env"]}
    mount = [m for m in sidecar["volumeMounts"] if m["name"] == "vllm-headroom-secrets"]
    assert mount == [
        {
            "name": "vllm-headroom-secrets",
            "mountPath": "/run/secrets/vllm-headroom",
            "readOnly": True,
        }
    ]
    volume = next(v for v in spec["volumes"] if v["name"] == "vllm-headroom-secrets")
    assert volume["secret"]["items"] == [{"key": "key", "path": "HEADROOM_BEARER_TOKEN"}]


@pytest.mark.e2e
def test_the_sidecar_cannot_read_vllms_environment(helm: Path) -> None:
    """Shared processes, but the sidecar's own non-root UID: vLLM's environ stays closed."""
    deployment = only(render(helm, ci("vllm")), "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["shareProcessNamespace"] is True
    sidecar = container(spec, "vllm-headroom")
    vllm = container(spec, "vllm")
    pod_uid = spec["securityContext"]["runAsUser"]
    sidecar_uid = sidecar["securityContext"]["runAsUser"]
    assert sidecar_uid not in {0, vllm["securityContext"].get("runAsUser", pod_uid)}
    # CAP_SYS_PTRACE would reopen it: nothing is added.
    assert sidecar["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # vLLM's secrets are in vLLM's environment only; the sidecar has its token as a file.
    assert {"HF_TOKEN", "VLLM_API_KEY"} <= {e["name"] for e in vllm["env"]}
    # Only its own memory limit comes from elsewhere (the downward API, no secret).
    assert all(
        set(e["valueFrom"]) == {"resourceFieldRef"}
        and e["valueFrom"]["resourceFieldRef"]["containerName"] == sidecar["name"]
        for e in sidecar["env"]
        if "valueFrom" in e
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    "sets",
    [
        ("--set exporter.securityContext.runAsUser=65532",),
        ("--set vllm.securityContext.runAsUser=65533",),
        ("--set exporter.securityContext.runAsUser=0",),
    ],
    ids=["sidecar-as-vllm", "vllm-as-sidecar", "sidecar-as-root"],
)
def test_one_uid_for_vllm_and_the_sidecar_is_refused(helm: Path, sets: tuple[str, ...]) -> None:
    """One UID (or root) would let the sidecar read vLLM's environment: the chart refuses it."""
    values = [arg for one in sets for arg in one.split(" ", 1)]
    done = _helm_run(helm, "template", "t", str(CHART), "--set", "vllm.model=m", *values)
    assert done.returncode != 0
    assert "would let the sidecar read vLLM's environment (HF_TOKEN, VLLM_API_KEY)" in done.stderr


@pytest.mark.e2e
def test_gpu_discovery_uuids_gives_and_watches_exactly_those(helm: Path) -> None:
    """gpu.discovery=uuids: the sidecar is given and watches exactly the listed GPUs."""
    uuids = load_yaml(ci("vllm-uuids"))["gpu"]["uuids"]
    env = env_of(container(sidecar_pod(render(helm, ci("vllm-uuids"))), "vllm-headroom"))
    assert env["HEADROOM_GPU_DISCOVERY"] == "settings"
    assert env["HEADROOM_GPUS"] == env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)


@pytest.mark.e2e
def test_gpu_discovery_none_injects_nothing(helm: Path) -> None:
    """gpu.discovery=none: the runtime injects nothing and the exporter reads no GPU."""
    spec = sidecar_pod(render(helm, ci("vllm"), sets=("--set gpu.discovery=none",)))
    env = env_of(container(spec, "vllm-headroom"))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["HEADROOM_GPU_DISCOVERY"] == "none"
    assert "NVIDIA_DRIVER_CAPABILITIES" not in env


def field_refs(spec: Mapping[str, Any]) -> dict[str, str]:
    """A container's downward-API variables: name to fieldPath."""
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in spec.get("env", [])
        if "fieldRef" in e.get("valueFrom", {})
    }


@pytest.mark.e2e
@pytest.mark.parametrize("values", ["vllm", "sidecar"])
def test_gpu_source_dcgm_gives_the_sidecar_its_node_its_pod_and_no_gpu(
    helm: Path, values: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """gpu.source=dcgm: the node's dcgm-exporter URL, the pod's identity, still no GPU."""
    sidecar = container(
        sidecar_pod(render(helm, ci(values), sets=("--set gpu.source=dcgm",))), "vllm-headroom"
    )
    env = env_of(sidecar)
    assert env["HEADROOM_GPU_SOURCE"] == "dcgm"
    assert env["HEADROOM_DCGM_URL"] == "http://$(NODE_IP):9400/metrics"
    assert env["HEADROOM_GPU_DISCOVERY"] == "none"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "NVIDIA_DRIVER_CAPABILITIES" not in env
    assert field_refs(sidecar) == {
        "NODE_IP": "status.hostIP",
        "HEADROOM_POD_NAME": "metadata.name",
        "HEADROOM_POD_NAMESPACE": "metadata.namespace",
        "HEADROOM_NODE_NAME": "spec.nodeName",
    }
    # Kubernetes expands $(NODE_IP) only from a variable defined earlier in the list.
    names = [e["name"] for e in sidecar["env"]]
    assert names.index("NODE_IP") < names.index("HEADROOM_DCGM_URL")
    assert not [r for r in sidecar["resources"].get("limits", {}) if "gpu" in r]
    # What the kubelet hands the exporter: the settings accept it.
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("HEADROOM_"):
            monkeypatch.delenv(name)
    given = {**env, "HEADROOM_POD_NAME": "llama-0", "HEADROOM_POD_NAMESPACE": "inference"}
    for name, value in given.items():
        if name.startswith("HEADROOM_"):
            monkeypatch.setenv(name, value.replace("$(NODE_IP)", "10.0.3.7"))
    settings = load_settings(secrets_dir=tmp_path)
    assert settings.gpu_source.value == "dcgm"
    assert settings.dcgm_url == "http://10.0.3.7:9400/metrics"


@pytest.mark.e2e
def test_gpu_source_dcgm_with_uuids_reads_those_gpus_and_is_given_none(helm: Path) -> None:
    """gpu.source=dcgm with gpu.discovery=uuids: those GPUs, picked in dcgm-exporter's answer."""
    uuids = load_yaml(ci("vllm-uuids"))["gpu"]["uuids"]
    spec = sidecar_pod(render(helm, ci("vllm-uuids"), sets=("--set gpu.source=dcgm",)))
    env = env_of(container(spec, "vllm-headroom"))
    assert env["HEADROOM_GPU_DISCOVERY"] == "settings"
    assert env["HEADROOM_GPUS"] == ",".join(uuids)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


@pytest.mark.e2e
def test_gpu_source_none_reads_no_gpu(helm: Path) -> None:
    """gpu.source=none: nothing injected, nothing read, whatever gpu.discovery says."""
    spec = sidecar_pod(render(helm, ci("vllm-uuids"), sets=("--set gpu.source=none",)))
    env = env_of(container(spec, "vllm-headroom"))
    assert env["HEADROOM_GPU_SOURCE"] == "none"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "HEADROOM_GPUS" not in env


@pytest.mark.e2e
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_never_every_gpu_by_accident(helm: Path, values: Path) -> None:
    """No exporter reads every GPU it sees, nor is given every GPU of the node."""
    manifests = render(helm, values)
    specs = [spec for _, spec in pod_specs(manifests)]
    if load_yaml(values)["shape"] == "sidecar":
        specs.append(sidecar_patch(manifests)["spec"]["template"]["spec"])
    for spec in specs:
        for item in spec["containers"]:
            if item["name"] != "vllm-headroom":
                continue
            env = env_of(item)
            assert env["HEADROOM_GPU_DISCOVERY"] in {"settings", "none"}
            assert env.get("NVIDIA_VISIBLE_DEVICES") != "all"


@pytest.mark.e2e
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_the_exporter_accepts_the_environment_the_chart_gives_it(
    helm: Path, values: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The exporter's own settings accept every HEADROOM_* variable the chart renders."""
    manifests = render(helm, values)
    shape = load_yaml(values)["shape"]
    spec = pod_specs(manifests)[0][1] if shape == "fleet" else sidecar_pod(manifests)
    env = env_of(container(spec, "vllm-headroom"))
    monkeypatch.chdir(tmp_path)  # no stray .env file
    for name in list(os.environ):
        if name.startswith("HEADROOM_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("HEADROOM_"):
            monkeypatch.setenv(name, value)
    settings = load_settings(secrets_dir=tmp_path)
    for name, value in load_yaml(values).get("exporter", {}).get("settings", {}).items():
        assert getattr(settings, name) == value, name
    assert settings.mode.value == ("fleet" if shape == "fleet" else "sidecar")
    assert settings.port == DEFAULT_PORT
    if shape == "fleet":
        assert settings.probe_allowlist == load_yaml(values)["fleet"]["allowlist"]
    else:
        assert settings.target == "http://127.0.0.1:8000"


@pytest.mark.e2e
def test_pod_monitor_scrapes_the_sidecar_and_vllm(helm: Path) -> None:
    """The PodMonitor scrapes the sidecar's /metrics and vLLM's own /metrics."""
    manifests = render(helm, ci("vllm"))
    monitor = only(manifests, "PodMonitor")
    deployment = only(manifests, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    endpoints = [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]]
    assert endpoints == [("headroom", "/metrics"), ("http", "/metrics")]
    ports = {
        p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert {"headroom", "http"} <= ports


@pytest.mark.e2e
def test_service_monitor_scrapes_through_the_service(helm: Path) -> None:
    """The ServiceMonitor selects the chart's Service, whose ports reach both containers."""
    manifests = render(helm, ci("vllm-uuids"))
    monitor = only(manifests, "ServiceMonitor")
    service = only(manifests, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    endpoints = [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]]
    assert endpoints == [("headroom", "/metrics"), ("http", "/metrics")]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["headroom"]["port"] == DEFAULT_PORT
    assert ports["headroom"]["targetPort"] == "headroom"
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.e2e
def test_sidecar_shape_selects_the_foreign_pods(helm: Path) -> None:
    """In the sidecar shape the monitors and the policy select the other chart's pods."""
    manifests = render(helm, ci("sidecar"))
    selector = load_yaml(ci("sidecar"))["sidecar"]["podSelector"]
    monitor = only(manifests, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == selector
    ports = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    assert ports == ["headroom", load_yaml(ci("sidecar"))["vllmMetrics"]["portName"]]
    assert only(manifests, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"] == selector
    assert not of_kind(manifests, "Deployment")
    assert not of_kind(manifests, "Pod")


@pytest.mark.e2e
def test_sidecar_patch_turns_a_plain_vllm_deployment_into_a_valid_one(helm: Path) -> None:
    """The sidecar patch turns a plain vLLM Deployment into a valid one with the sidecar."""
    manifests = render(helm, ci("sidecar"))
    plain = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"model": "llama3"}},
            "template": {
                "metadata": {"labels": {"model": "llama3", "helm-release-name": "vllm"}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct"],
                            "ports": [{"name": "container-port", "containerPort": 8000}],
                            "volumeMounts": [{"name": "vllm-storage", "mountPath": "/data"}],
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ],
                    "volumes": [
                        {"name": "vllm-storage", "persistentVolumeClaim": {"claimName": "models"}}
                    ],
                },
            },
        },
    }
    patched = strategic_merge(plain, sidecar_patch(manifests))
    validate_manifest(patched)
    spec = patched["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["vllm", "vllm-headroom"]
    # production-stack's vLLM runs as root: the sidecar (65533) sees its command line, not its
    # environment, and no GPU.
    assert spec["shareProcessNamespace"] is True
    assert env_of(container(spec, "vllm-headroom"))["HEADROOM_GPU_DISCOVERY"] == "none"
    assert {v["name"] for v in spec["volumes"]} == {
        "vllm-storage",
        "vllm-headroom-tmp",
        "vllm-headroom-secrets",
    }
    sidecar = container(spec, "vllm-headroom")
    assert {"name": "vllm-storage", "mountPath": "/data", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    assert env_of(sidecar)["HEADROOM_HF_HOME"] == "/data"
    # vLLM's root is read only inside the volume the sidecar mounts.
    assert env_of(sidecar)["HEADROOM_MODEL_ROOTS"] == "/data"
    reference = container(sidecar_pod(render(helm, ci("vllm"))), "vllm-headroom")
    for key in ("image", "securityContext", "livenessProbe", "resources", "ports", "args"):
        assert sidecar[key] == reference[key], key
    assert "readinessProbe" not in sidecar


@pytest.mark.e2e
def test_fleet_scrape_config_sends_each_vllm_pod_through_probe(helm: Path) -> None:
    """The fleet ScrapeConfig sends every vLLM pod through /probe on the exporter's Service."""
    manifests = render(helm, ci("fleet"))
    values = load_yaml(ci("fleet"))
    service = only(manifests, "Service")
    assert service["spec"]["sessionAffinity"] == "ClientIP"  # one replica's windows per scraper
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["headroom"]
    probe = only(manifests, "ScrapeConfig", f"{RELEASE}-vllm-headroom-probe")["spec"]
    assert probe["metricsPath"] == "/probe"
    (sd,) = probe["kubernetesSDConfigs"]
    assert sd["namespaces"]["names"] == values["fleet"]["discovery"]["namespaces"]
    assert sd["selectors"] == [{"role": "Pod", "label": "app.kubernetes.io/name=vllm"}]
    relabel = probe["relabelings"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_container_port_number"],
        "regex": "8000",
        "action": "keep",
    } in relabel
    assert {
        "sourceLabels": ["__address__"],
        "targetLabel": "__param_target",
        "replacement": "http://$1",
    } in relabel
    assert relabel[-1] == {
        "targetLabel": "__address__",
        "replacement": f"{service['metadata']['name']}.{NAMESPACE}.svc:{port}",
    }
    # prometheus-operator's shards hash the pod's address, not the Service's, as for the direct
    # scrape: one pod's two jobs on one shard, the pods spread (docs/kubernetes.md).
    shard_key = {"sourceLabels": ["__address__"], "targetLabel": "__tmp_hash"}
    assert relabel.index(shard_key) < len(relabel) - 1
    direct = only(manifests, "ScrapeConfig", f"{RELEASE}-vllm-headroom-vllm")["spec"]
    assert direct["metricsPath"] == "/metrics"
    assert not [r for r in direct["relabelings"] if r.get("targetLabel") == "__address__"]
    exporter_env = env_of(container(pod_specs(manifests)[0][1], "vllm-headroom"))
    assert exporter_env["HEADROOM_MODE"] == "fleet"
    assert exporter_env["HEADROOM_PROBE_ALLOWLIST"] == ",".join(values["fleet"]["allowlist"])
    assert exporter_env["NVIDIA_VISIBLE_DEVICES"] == "void"


#: A vLLM pod as Prometheus's Kubernetes discovery labels it (role pod, one container port).
DISCOVERED_POD = {
    "__address__": "10.244.3.17:8000",
    "__meta_kubernetes_pod_container_port_number": "8000",
    "__meta_kubernetes_pod_phase": "Running",
    "__meta_kubernetes_namespace": "inference",
    "__meta_kubernetes_pod_name": "llama-70b-5c8d-qw7zt",
    "__meta_kubernetes_pod_host_ip": "10.0.3.7",
}


def relabel(labels: Mapping[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabelling, as far as the chart uses it: replace (the default) and keep.

    Source values joined by ``;``, the regex anchored, ``$1`` expanded; None when dropped.
    """
    out = dict(labels)
    for rule in rules:
        value = ";".join(out.get(name, "") for name in rule.get("sourceLabels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if match is None:
                return None
            continue
        assert action == "replace", rule
        if match is not None:
            out[rule["targetLabel"]] = match.expand(
                rule.get("replacement", "$1").replace("$1", r"\1")
            )
    return out


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("kind", "host_ip", "dcgm"),
    [
        ("ScrapeConfig", "10.0.3.7", "http://10.0.3.7:9400/metrics"),
        ("PodMonitor", "10.0.3.7", "http://10.0.3.7:9400/metrics"),
        ("ScrapeConfig", "fd00:3::7", "http://[fd00:3::7]:9400/metrics"),
        ("PodMonitor", "fd00:3::7", "http://[fd00:3::7]:9400/metrics"),
    ],
)
def test_fleet_discovery_names_each_pods_gpus_with_gpu_source_dcgm(
    helm: Path, kind: str, host_ip: str, dcgm: str
) -> None:
    """gpu.source=dcgm: each probe carries the pod, its namespace and its node's dcgm-exporter.

    The relabelling applied to a discovered pod (on an IPv4 or an IPv6 node) gives the
    parameters the exporter admits, and the exporter is told gpu_source=dcgm; without it, no
    such parameter is sent.
    """
    sets = (f"--set fleet.discovery.kind={kind}", "--set gpu.source=dcgm")
    manifests = render(helm, ci("fleet"), sets=sets)
    if kind == "ScrapeConfig":
        rules = only(manifests, kind, f"{RELEASE}-vllm-headroom-probe")["spec"]["relabelings"]
    else:
        monitor = only(manifests, kind, f"{RELEASE}-vllm-headroom-probe")["spec"]
        rules = monitor["podMetricsEndpoints"][0]["relabelings"]
    scraped = relabel({**DISCOVERED_POD, "__meta_kubernetes_pod_host_ip": host_ip}, rules)
    assert scraped is not None
    params = {k.removeprefix("__param_"): v for k, v in scraped.items() if k.startswith("__param_")}
    assert params == {
        "target": "http://10.244.3.17:8000",
        "pod": "llama-70b-5c8d-qw7zt",
        "namespace": "inference",
        "dcgm": dcgm,
    }
    request = parse_gpu_params(params)
    assert request is not None
    assert request.url == dcgm
    exporter_env = env_of(container(pod_specs(manifests)[0][1], "vllm-headroom"))
    assert exporter_env["HEADROOM_GPU_SOURCE"] == "dcgm"
    assert "HEADROOM_DCGM_URL" not in exporter_env
    assert exporter_env["NVIDIA_VISIBLE_DEVICES"] == "void"
    plain = render(helm, ci("fleet"), sets=sets[:1])
    assert "__param_dcgm" not in json.dumps(plain)
    assert "HEADROOM_GPU_SOURCE" not in env_of(container(pod_specs(plain)[0][1], "vllm-headroom"))


@pytest.mark.e2e
def test_the_fleet_exporter_accepts_its_environment_with_gpu_source_dcgm(
    helm: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fleet exporter's HEADROOM_* variables with gpu.source=dcgm load as fleet + dcgm."""
    manifests = render(helm, ci("fleet"), sets=("--set gpu.source=dcgm",))
    env = env_of(container(pod_specs(manifests)[0][1], "vllm-headroom"))
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("HEADROOM_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("HEADROOM_"):
            monkeypatch.setenv(name, value)
    settings = load_settings(secrets_dir=tmp_path)
    assert (settings.mode.value, settings.gpu_source.value) == ("fleet", "dcgm")


@pytest.mark.e2e
def test_fleet_pod_monitor_variant_rewrites_the_address(helm: Path) -> None:
    """The fleet PodMonitor variant scrapes /probe through the Service and /metrics direct."""
    manifests = render(helm, ci("fleet"), sets=("--set fleet.discovery.kind=PodMonitor",))
    monitor = only(manifests, "PodMonitor", f"{RELEASE}-vllm-headroom-probe")["spec"]
    probe, direct = monitor["podMetricsEndpoints"]
    assert (probe["port"], probe["path"]) == ("http", "/probe")
    assert probe["relabelings"][-1]["targetLabel"] == "__address__"
    shard_key = {"sourceLabels": ["__address__"], "targetLabel": "__tmp_hash"}
    assert probe["relabelings"].index(shard_key) < len(probe["relabelings"]) - 1
    assert (direct["port"], direct["path"]) == ("http", "/metrics")
    assert monitor["namespaceSelector"] == {"matchNames": ["inference", "inference-canary"]}
    assert not of_kind(manifests, "ScrapeConfig")


@pytest.mark.e2e
def test_network_policy_limits_metrics_but_keeps_vllm_open(helm: Path) -> None:
    """The NetworkPolicy limits who reaches the exporter and keeps vLLM's port open."""
    manifests = render(helm, ci("vllm"))
    policy = only(manifests, "NetworkPolicy")["spec"]
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    metrics, vllm = policy["ingress"]
    assert metrics["ports"] == [{"port": DEFAULT_PORT, "protocol": "TCP"}]
    assert metrics["from"][0] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    test_pod = only(manifests, "Pod")
    assert (
        metrics["from"][1]["podSelector"]["matchLabels"].items()
        <= test_pod["metadata"]["labels"].items()
    )
    assert vllm == {"ports": [{"port": 8000, "protocol": "TCP"}]}


@pytest.mark.e2e
def test_network_policy_lets_prometheus_reach_vllm_when_vllm_is_restricted(helm: Path) -> None:
    """Restricting vLLM's port to some clients still lets Prometheus scrape vLLM's /metrics."""
    gateway = {"podSelector": {"matchLabels": {"app": "gateway"}}}
    sets = (f"--set-json networkPolicy.vllmFrom=[{json.dumps(gateway)}]",)
    _, vllm = only(render(helm, ci("vllm"), sets=sets), "NetworkPolicy")["spec"]["ingress"]
    monitoring = load_yaml(CHART / "values.yaml")["networkPolicy"]["metricsFrom"]
    assert vllm["from"] == [gateway, *monitoring]


@pytest.mark.e2e
@pytest.mark.parametrize("values", ["vllm", "vllm-uuids"])
def test_network_policy_admits_every_port_of_the_charts_own_pod(helm: Path, values: str) -> None:
    """Shape vllm: every port the pod serves stays open, the exporter's to Prometheus alone."""
    manifests = render(helm, ci(values), sets=("--set networkPolicy.enabled=true",))
    policy = only(manifests, "NetworkPolicy")
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    prometheus = Peer("monitoring", {"app.kubernetes.io/name": "prometheus"})
    stranger = Peer(NAMESPACE, {"app": "stranger"})
    assert served_ports(pod) == {8000, DEFAULT_PORT}
    assert admits(policy, pod, stranger, 8000)
    assert admits(policy, pod, prometheus, 8000)
    assert admits(policy, pod, prometheus, DEFAULT_PORT)
    assert not admits(policy, pod, stranger, DEFAULT_PORT)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("target", "port"),
    [
        ("http://127.0.0.1:8080", 8080),
        ("http://localhost:8200/", 8200),
        ("http://[::1]:9000", 9000),
        ("http://localhost", 80),
        ("https://localhost", 443),
    ],
)
def test_network_policy_admits_vllm_on_the_port_the_sidecar_polls(
    helm: Path, target: str, port: int
) -> None:
    """Shape sidecar: vLLM's port is sidecar.target's, so no second setting can disagree with it."""
    sets = (
        "--set shape=sidecar",
        "--set sidecar.podSelector.app=vllm",
        f"--set sidecar.target={target}",
        "--set networkPolicy.enabled=true",
        "--set-json networkPolicy.extraIngress=[]",
    )
    policy = only(render(helm, sets=sets), "NetworkPolicy")
    validate_manifest(policy)
    pod = {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": port}]}]}
    anyone = Peer("elsewhere", {"app": "client"})
    assert admits(policy, pod, anyone, port)
    assert not admits(policy, pod, anyone, DEFAULT_PORT)


@pytest.mark.e2e
def test_helm_test_pod_checks_the_exporter_through_its_service(helm: Path) -> None:
    """The helm test pod runs the exporter's image against the Service's exporter port."""
    manifests = render(helm, ci("vllm"))
    pod = only(manifests, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    check = container(pod["spec"], "check")
    sidecar = container(sidecar_pod(manifests), "vllm-headroom")
    assert check["image"] == sidecar["image"]
    service = only(manifests, "Service")["metadata"]["name"]
    assert check["args"][-1] == f"http://{service}.{NAMESPACE}.svc:{DEFAULT_PORT}"
    assert "/-/healthy" in check["args"][0]
    assert "headroom_build_info" in check["args"][0]
    assert not of_kind(render(helm, ci("sidecar")), "Pod")


# --------------------------------------------------------------------------------- conventions

#: Every example value set under helm/: the chart's ci values and each recipe's headroom values.
EXAMPLE_VALUES = [*CI_VALUES, *sorted((REPO / "helm" / "examples").glob("*/*headroom-values.yaml"))]

#: What a default kube-prometheus-stack (chart 88.5.3, values.yaml) selects: every
#: PodMonitor, ServiceMonitor, PrometheusRule and ScrapeConfig labelled release=<its release>
#: in any namespace (*SelectorNilUsesHelmValues: true, *NamespaceSelector: {}), and dashboards
#: in ConfigMaps labelled grafana_dashboard="1" in any namespace (searchNamespace: ALL). The
#: examples assume the release is named kube-prometheus-stack (docs/kubernetes.md).
KUBE_PROMETHEUS_STACK_RELEASE = "kube-prometheus-stack"
SELECTED_BY_RELEASE = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "ScrapeConfig"}


def _example_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}" if path.parent.parent.name == "examples" else path.name


@pytest.mark.e2e
@pytest.mark.parametrize("values", EXAMPLE_VALUES, ids=_example_id)
def test_every_example_is_picked_up_by_a_default_kube_prometheus_stack(
    helm: Path, values: Path
) -> None:
    """Each example's monitors and rules carry release: kube-prometheus-stack, dashboards theirs."""
    manifests = render(helm, values)
    selected = [m for m in manifests if m["kind"] in SELECTED_BY_RELEASE]
    assert selected, values
    for manifest in selected:
        labels = manifest["metadata"].get("labels", {})
        assert labels.get("release") == KUBE_PROMETHEUS_STACK_RELEASE, manifest["metadata"]["name"]
    for configmap in of_kind(manifests, "ConfigMap"):
        if configmap["metadata"]["name"].endswith("-sidecar-patch"):
            continue
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


def documented_installs() -> list[list[str]]:
    """The ``helm install`` commands of docs/kubernetes.md that install the chart by --set alone."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    commands = []
    for block in re.findall(r"```console\n(.*?)```", text, re.DOTALL):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if not line.startswith("helm install "):
                continue
            argv = shlex.split(line)
            if "helm/vllm-headroom" in argv and "-f" not in argv:
                commands.append(argv)
    return commands


@pytest.mark.e2e
def test_the_documented_installs_are_picked_up_by_a_default_kube_prometheus_stack(
    helm: Path,
) -> None:
    """docs/kubernetes.md's install commands label every monitor and rule release: <its name>."""
    commands = documented_installs()
    assert len(commands) >= 2, commands
    for argv in commands:
        sets = [
            f"{flag} {value}"
            for flag, value in itertools.pairwise(argv)
            if flag in {"--set", "--set-json", "--set-string"}
        ]
        selected = [m for m in render(helm, sets=sets) if m["kind"] in SELECTED_BY_RELEASE]
        assert selected, argv
        for manifest in selected:
            labels = manifest["metadata"].get("labels", {})
            assert labels.get("release") == KUBE_PROMETHEUS_STACK_RELEASE, (argv, manifest["kind"])


@pytest.mark.e2e
@pytest.mark.parametrize("values", EXAMPLE_VALUES, ids=_example_id)
def test_no_container_asks_for_every_gpu(helm: Path, values: Path) -> None:
    """Never NVIDIA_VISIBLE_DEVICES=all (runbook GpuForeignMemory); void on a sidecar, no GPU."""
    manifests = render(helm, values)
    specs = [spec for _, spec in pod_specs(manifests)]
    if load_yaml(values)["shape"] == "sidecar":
        specs.append(sidecar_patch(manifests)["spec"]["template"]["spec"])
    assert specs
    for spec in specs:
        for item in [*spec["containers"], *spec.get("initContainers", [])]:
            env = env_of(item)
            assert env.get("NVIDIA_VISIBLE_DEVICES") != "all", item["name"]
            if item["name"] == "vllm-headroom" and env["HEADROOM_GPU_DISCOVERY"] == "none":
                assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
            if item["name"] != "vllm-headroom":
                # vLLM gets its GPUs from the device plugin; the test pod needs none.
                assert "NVIDIA_VISIBLE_DEVICES" not in env, item["name"]


# ---------------------------------------------------------------------- rules, dashboards


# The PrometheusRule (the rule file with the values applied, scoped per release, under
# promtool) and the monitors' jobs: tests/test_helm_rules.py.


@pytest.mark.e2e
def test_dashboards_are_the_files_byte_for_byte(helm: Path) -> None:
    """One ConfigMap per dashboards/*.json carries it byte for byte, labelled for Grafana."""
    maps = [m for m in render(helm, ci("vllm")) if m["kind"] == "ConfigMap"]
    files = sorted(DASHBOARDS.glob("*.json"))
    assert len(maps) == len(files)
    carried = {name: text for m in maps for name, text in m["data"].items()}
    assert carried == {path.name: path.read_text() for path in files}
    uids = {json.loads(text)["uid"] for text in carried.values()}
    assert {"vllm-headroom-fleet", "vllm-headroom-instance"} <= uids
    for configmap in maps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "vLLM"}


@pytest.mark.e2e
def test_dashboard_label_folder_and_namespace_are_configurable(helm: Path) -> None:
    """The dashboards' label, its value, the folder annotation and the namespace follow values."""
    sets = (
        "--set dashboards.label=grafana_dashboard_vllm",
        "--set dashboards.labelValue=yes",
        "--set dashboards.folderAnnotation=k8s-sidecar-target-directory",
        "--set dashboards.folder=/tmp/dashboards/vllm",
        "--set dashboards.namespace=monitoring",
    )
    for configmap in [m for m in render(helm, ci("vllm"), sets=sets) if m["kind"] == "ConfigMap"]:
        meta = configmap["metadata"]
        assert meta["labels"]["grafana_dashboard_vllm"] == "yes"
        assert "grafana_dashboard" not in meta["labels"]
        assert meta["annotations"] == {"k8s-sidecar-target-directory": "/tmp/dashboards/vllm"}
        assert meta["namespace"] == "monitoring"


# ----------------------------------------------------------------------------- bad values


BAD_VALUES = [
    pytest.param((), "vllm.model is required with shape=vllm", id="missing-model"),
    pytest.param(
        ("--set shape=daemonset",), 'shape must be one of the following: "vllm"', id="unknown-shape"
    ),
    pytest.param(
        ("--set unknownKey=1",), "Additional property unknownKey is not allowed", id="unknown-key"
    ),
    pytest.param(
        ("--set vllm.model=m", "--set exporter.port=http"),
        "exporter.port: Invalid type. Expected: integer, given: string",
        id="wrong-type-port",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set-string podMonitor.enabled=yes"),
        "podMonitor.enabled: Invalid type. Expected: boolean, given: string",
        id="wrong-type-bool",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set-json vllm.resources=[]"),
        "vllm.resources: Invalid type. Expected: object, given: array",
        id="wrong-type-object",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set vllm.modlVolume.type=pvc"),
        "Additional property modlVolume is not allowed",
        id="misspelt-nested-key",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set vllm.modelVolume.type=nfs"),
        "vllm.modelVolume.type must be one of the following",
        id="unknown-volume-type",
    ),
    pytest.param(
        ("--set vllm.model=/opt/models/llama",),
        "is a path outside vllm.modelVolume.mountPath",
        id="model-path-outside-volume",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set vllm.modelVolume.type=existingClaim"),
        "needs vllm.modelVolume.existingClaim",
        id="existing-claim-unnamed",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set shape=fleet"),
        "fleet.allowlist is required with shape=fleet",
        id="fleet-without-allowlist",
    ),
    pytest.param(
        ("--set shape=fleet", "--set fleet.allowlist={http://10.0.0.0/8}"),
        'fleet.allowlist entry "http://10.0.0.0/8": give a host, IP or CIDR without a scheme',
        id="allowlist-url",
    ),
    pytest.param(
        ("--set shape=fleet", "--set fleet.allowlist={10.0.0.0/33}"),
        'fleet.allowlist entry "10.0.0.0/33": not a valid CIDR network',
        id="allowlist-bad-cidr",
    ),
    pytest.param(
        ("--set shape=fleet", "--set fleet.allowlist={vllm_pods!}"),
        "not a host name, *.suffix pattern, IP address or CIDR network",
        id="allowlist-bad-host",
    ),
    pytest.param(
        ("--set shape=fleet", "--set fleet.allowlist={10.0.0.1:99999}"),
        "port must be a number from 1 to 65535",
        id="allowlist-bad-port",
    ),
    pytest.param(
        ("--set shape=fleet", "--set fleet.allowlist={10.0.0.0/8}"),
        "fleet.discovery.podSelector is required",
        id="fleet-without-selector",
    ),
    pytest.param(
        ("--set shape=sidecar",), "sidecar.podSelector is required", id="sidecar-without-selector"
    ),
    pytest.param(
        (
            "--set shape=sidecar",
            "--set sidecar.podSelector.app=vllm",
            "--set serviceMonitor.enabled=true",
        ),
        "use podMonitor.enabled=true",
        id="sidecar-with-servicemonitor",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set gpu.discovery=uuids"),
        "gpu.discovery=uuids needs gpu.uuids",
        id="uuids-missing",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set gpu.discovery=uuids", "--set gpu.uuids={nvidia0}"),
        "gpu.uuids.0: Does not match pattern",
        id="uuids-malformed",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set gpu.discovery=process"),
        "gpu.discovery=process is no longer offered",
        id="process-discovery",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set gpu.source=dcgm-exporter"),
        "gpu.source: gpu.source must be one of the following",
        id="gpu-source-unknown",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set gpu.source=dcgm", "--set gpu.dcgm.url=node:9400"),
        "gpu.dcgm.url: Does not match pattern",
        id="dcgm-url-not-http",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set gpu.source=nvml"),
        "gpu.source=nvml needs gpu.discovery=uuids",
        id="nvml-without-uuids",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set gpu.source=dcgm",
            "--set gpu.discovery=uuids",
            "--set gpu.uuids={MIG-4f1b9f5e-3c2a-5b8e-9d0f-1a2b3c4d5e6f}",
        ),
        "never by MIG UUID",
        id="dcgm-with-mig-uuid",
    ),
    pytest.param(
        (
            "--set shape=fleet",
            "--set fleet.allowlist={10.0.0.0/8}",
            "--set gpu.source=dcgm",
            "--set gpu.dcgm.url=http://dcgm.gpu.svc:9400/metrics",
        ),
        "gpu.dcgm.url must hold $(NODE_IP) with shape=fleet",
        id="dcgm-in-fleet-mode-not-per-node",
    ),
    pytest.param(
        (
            "--set shape=fleet",
            "--set fleet.allowlist={10.0.0.0/8}",
            "--set gpu.source=dcgm",
            "--set gpu.uuids={GPU-b5c6d7e8-f9a0-4b1c-8d2e-3f4a5b6c7d03}",
        ),
        "gpu.uuids does not fit shape=fleet",
        id="dcgm-in-fleet-mode-with-uuids",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set exporter.settings.mode=fleet"),
        "Additional property mode is not allowed",
        id="setting-owned-by-the-chart",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set exporter.settings.poll_interval_seconds=2"),
        "poll_timeout_seconds (3) must not exceed poll_interval_seconds (2)",
        id="poll-timeout-over-interval",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set prometheusRule.enabled=true",
            "--set prometheusRule.labels.release=kps",
            "--set prometheusRule.alerts.VllmNoSuchAlert.enabled=false",
        ),
        "prometheusRule.alerts.VllmNoSuchAlert: no alert of that name",
        id="unknown-alert",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set prometheusRule.enabled=true",
            "--set prometheusRule.labels.release=kps",
            "--set prometheusRule.thresholds.no_such=1",
        ),
        "prometheusRule.thresholds.no_such: no threshold of that name",
        id="unknown-threshold",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set prometheusRule.alerts.X.severity=page"),
        "severity must be one of the following",
        id="bad-severity",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set prometheusRule.alerts.X.for=10min"),
        "Does not match pattern",
        id="bad-duration",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set prometheusRule.thresholds.x=high"),
        "Does not match pattern",
        id="threshold-not-a-number",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set vllm.podDisruptionBudget.enabled=true",
            "--set vllm.podDisruptionBudget.maxUnavailable=0",
        ),
        "would allow no eviction at all with 1 replica(s), and every node drain would hang",
        id="pdb-blocks-every-drain",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set vllm.replicas=2",
            "--set vllm.podDisruptionBudget.enabled=true",
            "--set vllm.podDisruptionBudget.maxUnavailable=null",
            "--set vllm.podDisruptionBudget.minAvailable=2",
        ),
        "would allow no eviction at all with 2 replica(s)",
        id="pdb-min-available-all-replicas",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set vllm.podDisruptionBudget.enabled=true",
            "--set vllm.podDisruptionBudget.minAvailable=1",
        ),
        "set either minAvailable or maxUnavailable, not both",
        id="pdb-both-bounds",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set vllm.strategy.rollingUpdate.maxUnavailable=0"),
        "maxSurge and maxUnavailable are both 0, so a rollout could never replace a pod",
        id="rollout-that-cannot-move",
    ),
    pytest.param(
        (
            "--set shape=sidecar",
            "--set sidecar.podSelector.app=vllm",
            "--set networkPolicy.enabled=true",
        ),
        "networkPolicy.enabled=true with shape=sidecar needs networkPolicy.extraIngress",
        id="policy-on-foreign-pods-without-their-ports",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set networkPolicy.enabled=true",
            '--set-json networkPolicy.extraIngress=[{"ports":[{"port":9000},{"port":"headroom"}]}]',
        ),
        "networkPolicy.extraIngress[0] admits everyone to every port or to the exporter's (8742)",
        id="extra-rule-opening-the-exporter",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set networkPolicy.enabled=true",
            '--set-json networkPolicy.extraIngress=[{"ports":[{"port":8000,"endPort":9000}]}]',
        ),
        "networkPolicy.extraIngress[0] admits everyone",
        id="extra-range-over-the-exporter",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set podMonitor.enabled=true"),
        "podMonitor.labels is empty, so a Prometheus that selects by label never loads the "
        "PodMonitor: set podMonitor.labels.release=",
        id="pod-monitor-without-labels",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set serviceMonitor.enabled=true"),
        "serviceMonitor.labels is empty",
        id="service-monitor-without-labels",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set prometheusRule.enabled=true"),
        "prometheusRule.labels is empty, so a Prometheus that selects by label never loads the "
        "PrometheusRule",
        id="rule-without-labels",
    ),
    pytest.param(
        (
            "--set shape=fleet",
            "--set fleet.allowlist={10.0.0.0/8}",
            "--set fleet.discovery.podSelector.app=vllm",
        ),
        "fleet.discovery.labels is empty, so a Prometheus that selects by label never loads the "
        "ScrapeConfig",
        id="scrape-config-without-labels",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set podMonitor.enabled=true",
            "--set podMonitor.labels.release=kps",
            "--set serviceMonitor.enabled=true",
            "--set serviceMonitor.labels.release=kps",
        ),
        "podMonitor.enabled and serviceMonitor.enabled are both true",
        id="two-monitors",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set vllmMetrics.job=vllm"),
        "vllmMetrics.job=vllm names another scrape of vLLM's /metrics, but "
        "vllmMetrics.enabled=true",
        id="vllm-scraped-twice",
    ),
    pytest.param(
        (
            "--set vllm.model=m",
            "--set prometheusRule.enabled=true",
            "--set prometheusRule.labels.release=kps",
            "--set vllmMetrics.enabled=false",
        ),
        "vllmMetrics.enabled=false needs vllmMetrics.job",
        id="vllm-series-from-nowhere",
    ),
    pytest.param(
        ("--set vllm.model=m", "--set vllm.strategy.type=BlueGreen"),
        "vllm.strategy.type must be one of the following",
        id="unknown-strategy",
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("sets", "message"), BAD_VALUES)
def test_bad_values_fail_at_render_time_with_a_clear_message(
    helm: Path, sets: tuple[str, ...], message: str
) -> None:
    """A bad value stops helm template with a short message naming the value and the fix."""
    error = render_error(helm, sets=sets)
    assert message in error, error
    assert "goroutine" not in error
    assert len(error.splitlines()) <= 6, error


GOOD_ALLOWLIST = [
    "10.0.0.0/8",
    "10.244.1.7",
    "fd00::/8",
    "::1",
    "[fd00::1]:8000",
    "vllm.inference.svc.cluster.local",
    "*.inference.svc.cluster.local",
    "vllm-0.vllm:8000",
    "10.0.0.0/16:8000",
    "VLLM.Example.com.",
]
BAD_ALLOWLIST = [
    "http://vllm:8000",
    "10.0.0.0/33",
    "fd00::/129",
    "10.0.0.0/8/8",
    "vllm_0",
    "a..b",
    "*",
    "vllm:0",
    "vllm:http",
    "[fd00::1]x",
]


@pytest.mark.e2e
def test_allowlist_check_accepts_what_the_exporter_accepts(helm: Path) -> None:
    """Entries the exporter's allowlist parser accepts render, all at once."""
    parse_allowlist(GOOD_ALLOWLIST)
    sets = (
        "--set shape=fleet",
        "--set fleet.discovery.kind=none",
        f"--set-json fleet.allowlist={json.dumps(GOOD_ALLOWLIST)}",
    )
    deployment = only(render(helm, sets=sets), "Deployment")
    env = env_of(container(deployment["spec"]["template"]["spec"], "vllm-headroom"))
    assert env["HEADROOM_PROBE_ALLOWLIST"].split(",") == GOOD_ALLOWLIST


@pytest.mark.e2e
@pytest.mark.parametrize("entry", BAD_ALLOWLIST)
def test_allowlist_check_rejects_what_the_exporter_rejects(helm: Path, entry: str) -> None:
    """An entry the exporter would refuse at start fails the render instead."""
    with pytest.raises(AllowlistError):
        parse_allowlist([entry])
    sets = (
        "--set shape=fleet",
        "--set fleet.discovery.kind=none",
        f"--set-json fleet.allowlist={json.dumps([entry])}",
    )
    assert f"fleet.allowlist entry {json.dumps(entry)}" in render_error(helm, sets=sets)


def test_schema_settings_are_the_exporter_settings_the_chart_does_not_wire() -> None:
    """exporter.settings takes exactly the exporter settings the chart does not wire."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    accepted = set(schema["properties"]["exporter"]["properties"]["settings"]["properties"])
    assert accepted | CHART_OWNED_SETTINGS == set(Settings.model_fields)
    assert not accepted & CHART_OWNED_SETTINGS


@pytest.mark.e2e
def test_poll_check_uses_the_exporter_defaults(helm: Path) -> None:
    """The render-time poll timeout check uses the exporter's own defaults."""
    interval = Settings.model_fields["poll_interval_seconds"].default
    timeout = Settings.model_fields["poll_timeout_seconds"].default
    model = "--set vllm.model=m"
    render(helm, sets=(model, f"--set exporter.settings.poll_interval_seconds={timeout}"))
    render(helm, sets=(model, f"--set exporter.settings.poll_timeout_seconds={interval}"))
    render_error(helm, sets=(model, f"--set exporter.settings.poll_timeout_seconds={interval + 1}"))


@pytest.mark.e2e
def test_context_window_check_uses_the_exporter_default(helm: Path) -> None:
    """A longest context window shorter than the window fails the render, not the sidecar.

    The exporter refuses to start so (its default window, 600 s, counts when only the longest
    is given): ``helm install`` would succeed and the sidecar crash-loop.
    """
    window = Settings.model_fields["context_window_seconds"].default
    model = "--set vllm.model=m"
    longest = "--set exporter.settings.context_max_window_seconds"
    render(helm, sets=(model, f"{longest}={window:g}"))
    render(
        helm, sets=(model, f"{longest}=300", "--set exporter.settings.context_window_seconds=300")
    )
    assert "must not be shorter than context_window_seconds (600)" in render_error(
        helm, sets=(model, f"{longest}=300")
    )


@pytest.fixture(scope="module")
def notes_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart that renders NOTES.txt into a ConfigMap (helm template skips it)."""
    copy_dir = tmp_path_factory.mktemp("notes") / "vllm-headroom"
    shutil.copytree(CHART, copy_dir, symlinks=False)
    shutil.copy(CHART / "templates" / "NOTES.txt", copy_dir / "files" / "notes.txt")
    (copy_dir / "templates" / "notes-render.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-render\n"
        'data:\n  notes: {{ tpl (.Files.Get "files/notes.txt") . | quote }}\n'
    )
    return copy_dir


@pytest.mark.e2e
def test_notes_say_where_gpu_memory_comes_from(helm: Path, notes_chart: Path) -> None:
    """NOTES.txt names the GPU source, and with dcgm where its failures are counted."""
    notes = only(
        render(helm, ci("vllm"), sets=("--set gpu.source=dcgm",), chart=notes_chart),
        "ConfigMap",
        "notes-render",
    )
    text = notes["data"]["notes"]
    assert "gpu.source=dcgm" in text
    assert "http://$(NODE_IP):9400/metrics" in text
    assert 'headroom_source_errors_total{source="dcgm"}' in text
    default = only(render(helm, ci("vllm"), chart=notes_chart), "ConfigMap", "notes-render")
    assert "set gpu.source=dcgm" in default["data"]["notes"]
    fleet = only(
        render(helm, ci("fleet"), sets=("--set gpu.source=dcgm",), chart=notes_chart),
        "ConfigMap",
        "notes-render",
    )["data"]["notes"]
    assert "&dcgm=http://<its node IP>:9400/metrics" in fleet
    assert "fleet.allowlist must also allow the nodes' addresses" in fleet


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            "vllm",
            [
                "port-forward svc/rel-vllm-headroom 8742:8742",
                "helm test rel",
                "PodMonitor labels: release=kube-prometheus-stack (your Prometheus must select",
                "A default kube-prometheus-stack selects monitors and rules labelled release=",
                "PrometheusRule labels: release=kube-prometheus-stack",
                "NetworkPolicy: port 8742 (the exporter) from networkPolicy.metricsFrom; vLLM's "
                "port 8000 from anyone",
                '503 "vllm-headroom did not start: <the setting and the fix>"',
                "logs deploy/rel-vllm-headroom -c vllm-headroom",
            ],
        ),
        (
            "sidecar",
            [
                "-o jsonpath='{.data.patch\\.yaml}'",
                "NOT running until it is in the spec of the workload's owner",
                "helm/examples/",
                "logs <vllm-pod> -c vllm-headroom",
                "vLLM's port 8000 and container-port from anyone; 1 rule(s) of "
                "networkPolicy.extraIngress",
            ],
        ),
        (
            "fleet",
            [
                "/probe reaches only 10.244.0.0/16",
                "ScrapeConfig/rel-vllm-headroom-probe",
                "ServiceMonitor labels: release=kube-prometheus-stack",
                "ScrapeConfig labels: release=kube-prometheus-stack",
            ],
        ),
    ],
)
def test_notes_say_what_was_installed_and_how_to_reach_it(
    helm: Path, notes_chart: Path, values: str, says: list[str]
) -> None:
    """NOTES.txt names what each shape installed and how to reach the exporter."""
    notes = only(render(helm, ci(values), chart=notes_chart), "ConfigMap", "notes-render")
    text = notes["data"]["notes"]
    assert f"shape={values}" in text
    for phrase in says:
        assert phrase in text, text


# ============================================================================== Dockerfile


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages as (INSTRUCTION, arguments), with ARG defaults substituted."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and "=" in rest and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        if instruction == "FROM":
            rest = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest)
            stages.append([])
        assert stages or instruction == "ARG", line
        if stages:
            stages[-1].append((instruction, " ".join(rest.split())))
    return stages


def test_dockerfile_builds_a_wheel_and_installs_only_it() -> None:
    """The build stage makes the wheel; the final stage installs from wheels alone."""
    build, final = dockerfile_stages()
    assert build[0] == ("FROM", "python:3.11-slim-bookworm AS build")
    build_runs = " ".join(rest for instruction, rest in build if instruction == "RUN")
    assert "pip wheel --no-deps --wheel-dir /wheels ." in build_runs
    final_runs = " ".join(rest for instruction, rest in final if instruction == "RUN")
    assert "from=build" in final_runs
    assert "--no-index" in final_runs
    assert "--find-links=/wheels vllm-headroom" in final_runs
    assert not [rest for instruction, rest in final if instruction in {"COPY", "ADD"}]


def test_dockerfile_pins_its_base_and_runs_as_the_charts_non_root_user() -> None:
    """The base is pinned and the image runs as the chart's pod UID on the exporter's port."""
    stages = dockerfile_stages()
    for stage in stages:
        image = stage[0][1].split()[0]
        name, _, tag = image.rpartition(":")
        assert name, image
        assert tag not in {"", "latest"}, image
        assert "slim" in tag, image
    final = stages[-1]
    (user,) = [rest for instruction, rest in final if instruction == "USER"]
    uid, _, gid = user.partition(":")
    values = load_yaml(CHART / "values.yaml")
    assert int(uid) == values["podSecurityContext"]["runAsUser"]
    assert int(gid) == values["podSecurityContext"]["runAsGroup"]
    # Beside vLLM (the pod's UID) the chart runs the exporter under a UID of its own.
    assert values["exporter"]["securityContext"]["runAsUser"] not in {0, int(uid)}
    assert values["exporter"]["securityContext"]["runAsGroup"] == int(gid)
    assert ("EXPOSE", str(DEFAULT_PORT)) in final
    assert values["exporter"]["port"] == DEFAULT_PORT
    (healthcheck,) = [rest for instruction, rest in final if instruction == "HEALTHCHECK"]
    assert "/-/healthy" in healthcheck
    assert ("ENTRYPOINT", '["vllm-headroom"]') in final
    assert ("CMD", '["serve"]') in final


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    """.dockerignore excludes everything but the files the Dockerfile copies, which exist."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    included = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for instruction, rest in dockerfile_stages()[0]:
        if instruction == "COPY":
            copied.update(rest.split()[:-1])
    assert copied == included == {"pyproject.toml", "README.md", "exporter"}
    assert all((REPO / name).exists() for name in copied)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the Dockerfile's build stage makes (pip wheel --no-deps), built for real."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("vllm_headroom-*.whl")
    return built


def test_wheel_holds_the_package_its_data_and_the_command(wheel: Path) -> None:
    """The wheel carries the package, its data files and the command, at the chart's version."""
    assert wheel.name == f"vllm_headroom-{exporter.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist = f"vllm_headroom-{exporter.__version__}.dist-info"
        entry_points = archive.read(f"{dist}/entry_points.txt").decode()
    package = REPO / "exporter"
    shipped = {
        p.relative_to(REPO).as_posix()
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert shipped <= names
    assert "exporter/py.typed" in names
    assert "vllm-headroom = exporter.cli.main:main" in entry_points


def test_wheel_installed_alone_runs(wheel: Path, tmp_path: Path) -> None:
    """The wheel installed alone into a directory imports from there and runs the CLI."""
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    script = (
        "import sys, exporter; from exporter.cli.main import main; "
        "print(exporter.__file__); sys.exit(main(['plan', '--model', 'llama-3.1-8b', "
        "'--gpu', 'h100-80gb', '--json']))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    first, _, rest = run.stdout.partition("\n")
    assert Path(first).is_relative_to(target)
    assert json.loads(rest)


@pytest.mark.e2e
@pytest.mark.parametrize(("values", "sets"), EVERY_SHAPE)
def test_the_memory_limit_setting_is_the_container_s_own_limit(
    helm: Path, values: tuple[Path, ...], sets: tuple[str, ...]
) -> None:
    """Every shape passes the exporter container's memory limit as memory_limit_bytes."""
    shape, manifests = rendered_shape(helm, values, sets)
    exporter = container(exporter_pod(shape, manifests), "vllm-headroom")
    env = {entry["name"]: entry for entry in exporter["env"]}
    assert env["HEADROOM_MEMORY_LIMIT_BYTES"]["valueFrom"]["resourceFieldRef"] == {
        "containerName": "vllm-headroom",
        "resource": "limits.memory",
    }


#: Release names Helm takes, and the base name of the objects they make (None: refused).
RELEASE_NAMES = [
    ("llama", "llama-vllm-headroom"),
    ("llama3.1", "llama3-1-vllm-headroom"),  # a Service's name may not hold a dot
    ("my.vllm-headroom.prod", "my-vllm-headroom-prod"),
    ("1llama", None),  # nor start with a digit
]


@pytest.mark.e2e
@pytest.mark.parametrize(("release", "base"), RELEASE_NAMES)
def test_every_object_name_is_one_kubernetes_takes(
    helm: Path, release: str, base: str | None
) -> None:
    """Names from the release are DNS-1035 labels, or the render fails in one line naming why."""
    done = _helm_run(
        helm, "template", release, str(CHART), "--namespace", NAMESPACE, "--set", "vllm.model=x/y"
    )
    if base is None:
        assert done.returncode != 0
        assert "not a DNS-1035 label" in done.stderr
        assert "fullnameOverride" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    manifests = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    label = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        assert len(name) <= 63, name
        assert label.fullmatch(name), (manifest["kind"], name)
    services = [m["metadata"]["name"] for m in manifests if m["kind"] == "Service"]
    assert base in services


def _setting_bounds(name: str) -> tuple[float, float]:
    """(lowest, highest) the exporter takes for a number setting; 2**53 where it has no top."""
    low, high = -math.inf, float(MAX_EXACT_WHOLE)
    for rule in Settings.model_fields[name].metadata:
        low = max(low, getattr(rule, "ge", -math.inf), getattr(rule, "gt", -math.inf))
        high = min(high, getattr(rule, "le", math.inf), getattr(rule, "lt", math.inf))
    return low, high


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name, node in json.loads((CHART / "values.schema.json").read_text())["properties"][
            "exporter"
        ]["properties"]["settings"]["properties"].items()
        if {"number", "integer"}
        & set(node["type"] if isinstance(node["type"], list) else [node["type"]])
    ),
)
def test_a_number_setting_the_schema_takes_is_one_the_exporter_starts_with(name: str) -> None:
    """exporter.settings' numbers are bounded as the exporter bounds them at start-up.

    Otherwise ``helm install`` succeeds and the sidecar refuses to start (a tensor_parallel_size
    of 2048, a max_response_bytes of 2 GiB). Where the exporter has no top, the schema stops at
    2**53: Helm holds numbers as float64, so a larger whole number is not the one given (and
    past 2**63 it renders as -9223372036854775808).
    """
    node = json.loads((CHART / "values.schema.json").read_text())["properties"]["exporter"][
        "properties"
    ]["settings"]["properties"][name]
    low, high = _setting_bounds(name)
    schema_low = node.get("minimum", node.get("exclusiveMinimum", -math.inf))
    assert schema_low >= low, (name, schema_low, low)
    assert node.get("maximum", math.inf) <= high, (name, node.get("maximum"), high)


def _string_settings() -> list[str]:
    """exporter.settings' numbers that may also be strings (``--set`` gives 0.5 as "0.5")."""
    nodes = json.loads((CHART / "values.schema.json").read_text())["properties"]["exporter"][
        "properties"
    ]["settings"]["properties"]
    return sorted(
        name for name, node in nodes.items() if "string" in node["type"] and "minimum" in node
    )


@pytest.mark.e2e
@pytest.mark.parametrize("name", _string_settings())
def test_a_number_setting_given_as_text_is_bounded_as_a_number(helm: Path, name: str) -> None:
    """A value --set gives as text ("0.04") is held to the same range as the number 0.04.

    The schema's minimum and maximum apply to numbers only: without the render's own check,
    ``--set exporter.settings.poll_interval_seconds=0.04`` installed a sidecar that refused to
    start.
    """
    low, high = _setting_bounds(name)
    sets = ("--set vllm.model=m", *_BESIDE.get(name, ()))
    for value in (low, high):
        render(helm, sets=(*sets, f"--set exporter.settings.{name}={value:g}"))
    # text with a fraction: --set keeps it a string (a whole number it makes an integer)
    for text in ([f"{low * 0.8:g}"] if low > 0 else []) + [f"{high:g}.5"]:
        error = render_error(helm, sets=(*sets, f"--set exporter.settings.{name}={text}"))
        assert f"exporter.settings.{name} ({text})" in error


#: What the settings tried as text need beside them to be taken at both ends of their range
#: (the poll timeout within the interval, the longest context window at least the window).
_BESIDE: dict[str, tuple[str, ...]] = {
    "poll_interval_seconds": ("--set exporter.settings.poll_timeout_seconds=0.01",),
    "poll_timeout_seconds": ("--set exporter.settings.poll_interval_seconds=86400",),
    "context_max_window_seconds": ("--set exporter.settings.context_window_seconds=0.1",),
}


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("memory", "taken"),
    [
        ("32Mi", True),
        ("33554432", True),
        ("256Mi", True),
        ("0.5Gi", True),
        ("31Mi", False),
        ("33554431", False),
        ("32M", False),  # 32,000,000 bytes: under 32 MiB
        ("0.03Gi", False),
    ],
)
def test_an_exporter_memory_limit_under_the_exporters_least_fails_the_render(
    helm: Path, memory: str, taken: bool
) -> None:
    """The sidecar reads its memory limit and refuses one under 32 MiB at start-up.

    So does the render: ``helm install`` with ``exporter.resources.limits.memory=16Mi``
    succeeded and the sidecar then crash-looped on memory_limit_bytes.
    """
    least = _setting_bounds("memory_limit_bytes")[0]
    assert least == 32 * 1024 * 1024
    sets = ("--set vllm.model=m", f"--set-string exporter.resources.limits.memory={memory}")
    if taken:
        render(helm, sets=sets)
    else:
        error = render_error(helm, sets=sets)
        assert f"exporter.resources.limits.memory ({memory}) is under 32Mi" in error
