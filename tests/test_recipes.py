"""Specification of the deployer recipes (helm/examples/): the sidecar in each owner's own spec.

Each recipe deploys vLLM the way that deployer's users do, with the vllm-headroom sidecar in the
owner's own spec (values of its chart, its custom resource, or the manifest itself), never a
patch that a controller or the next upgrade reverts; the chart, in shape ``sidecar``, adds the
monitoring objects from the recipe's ``headroom-values.yaml``:

- ``plain-deployment``: a Deployment and Service as kept in a repository;
- ``production-stack``: vLLM production-stack's chart, whose engine pod has no field for an extra
  container, with a Helm post-renderer (``kubectl kustomize``) that adds the sidecar to the
  Deployment Helm applies;
- ``kserve``: an InferenceService whose predictor carries the sidecar container;
- ``llm-d``: llm-d's model service chart with prefill and decode disaggregated, the sidecar a
  second container of ``decode.containers`` (polling vLLM's own port behind llm-d's routing
  proxy) and of ``prefill.containers``, each role with a headroom release of its own.

Each install wires vLLM's ``--max-num-seqs`` and the GPU's memory into the sidecar (and lets it
read vLLM's command line), scales the workload the deployer itself would scale (KEDA or an HPA,
with the deployer's own autoscaler off), has exactly one PodDisruptionBudget (the deployer's, or
the chart's where the deployer makes none), and leaves the sidecar no way to vLLM's secrets or
GPUs: its own non-root UID, no GPU, ``NVIDIA_VISIBLE_DEVICES=void``.

The deployers' charts and KServe's CRD are rendered and checked for real, offline, from copies in
``tests/fixtures/deployers/`` (README there: sources and commits). Rendered Kubernetes objects are
validated with kubernetes-validate (strict) like the chart's; the InferenceService against
KServe's own CRD schema, made strict; KServe's predictor Deployment is assembled as KServe's
predictor reconciler does (runtime container merged with ``predictor.model``, then the
predictor's own containers appended) and validated too.

The sidecar in each recipe must be the chart's rendering of the recipe's ``headroom-values.yaml``:
when the chart changes, these tests name the recipe to re-render. With ``networkPolicy.enabled``
the chart's NetworkPolicy is evaluated as Kubernetes does against the owner's own pod: every port
the deployer's pod serves admits the clients each deployer documents, the exporter's only
Prometheus.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gzip
import json
import os
import re
import subprocess
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest
import yaml

from exporter.gpu.visibility import is_vllm_server
from exporter.service.settings import DEFAULT_PORT
from exporter.vllm.launch import parse_launch_flags
from tests.test_helm import (
    CHART,
    REPO,
    Manifest,
    Peer,
    admits,
    container,
    env_of,
    load_yaml,
    notes_chart,  # noqa: F401 (a fixture, requested by name below)
    of_kind,
    only,
    render,
    served_ports,
    strategic_merge,
    validate_manifest,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

EXAMPLES = REPO / "helm" / "examples"
FIXTURES = REPO / "tests" / "fixtures" / "deployers"
PRODUCTION_STACK_CHART = FIXTURES / "vllm-stack-0.1.12.tgz"
LLM_D_CHART = FIXTURES / "llm-d-modelservice-v0.4.12.tgz"
KSERVE_CRD = FIXTURES / "serving.kserve.io_inferenceservices.yaml.gz"
KSERVE_RUNTIME = FIXTURES / "kserve-vllmserver.yaml"
NAMESPACE = "inference"

RECIPES = ["plain-deployment", "production-stack", "kserve", "llm-d"]
SIDECAR = "vllm-headroom"

#: One GPU's memory as NVML reports it, by the GPU feature discovery label nvidia.com/gpu.product
#: the recipes schedule on (tests/fixtures/nvml/h100-vllm-72gib.json).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY = {"NVIDIA-H100-80GB-HBM3": 85_520_809_984}


@dataclasses.dataclass(frozen=True)
class Install:
    """One headroom release of a recipe, and the workload (by the deployer's name) it serves."""

    recipe: str
    workload: str
    values: str = "headroom-values.yaml"
    #: Whether this release scales its workload (llm-d's prefill pods are not scaled on headroom).
    autoscaled: bool = True

    @property
    def release(self) -> str:
        """The release name the recipe's README installs it as."""
        return (
            f"{self.recipe}-headroom"
            if self.values == "headroom-values.yaml"
            else (f"{self.recipe}-{self.values.removesuffix('-headroom-values.yaml')}-headroom")
        )


#: The deployers' own workload names: KServe's predictor Deployment <isvc>-predictor,
#: production-stack's <release>-<model>-deployment-vllm, llm-d's <release>-<chart>-decode and
#: -prefill, the plain Deployment's own.
INSTALLS = [
    Install("plain-deployment", "llama3"),
    Install("production-stack", "vllm-llama3-deployment-vllm"),
    Install("kserve", "llama3-predictor"),
    Install("llm-d", "llama3-llm-d-modelservice-decode"),
    Install("llm-d", "llama3-llm-d-modelservice-prefill", "prefill-headroom-values.yaml", False),
]
INSTALL_IDS = [
    "plain-deployment",
    "production-stack",
    "kserve",
    "llm-d-decode",
    "llm-d-prefill",
]


def _run(*argv: str | Path, env: Mapping[str, str] | None = None) -> str:
    """A command's output (Helm's symlink notices dropped from its errors); cached per command."""
    return _run_cached(tuple(str(a) for a in argv), tuple(sorted((env or {}).items())))


@functools.cache
def _run_cached(argv: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=120,
        env={**os.environ, **dict(env)},
    )
    errors = [line for line in done.stderr.splitlines() if "found symbolic link" not in line]
    assert done.returncode == 0, "\n".join(errors)
    return done.stdout


def _documents(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def headroom(helm: Path, install: Install, *sets: str) -> list[Manifest]:
    """The chart rendered with the install's headroom values (shape sidecar), plus ``sets``."""
    values = EXAMPLES / install.recipe / install.values
    return _documents(
        _run(helm, "template", install.release, CHART, "-n", NAMESPACE, "-f", values, *sets)
    )


def chart_patch(helm: Path, install: Install, key: str = "patch.yaml") -> dict[str, Any]:
    """The chart's sidecar patch for the install (``patch.yaml`` or ``kustomize-patch.yaml``)."""
    configmap = next(
        m for m in of_kind(headroom(helm, install), "ConfigMap") if key in m.get("data", {})
    )
    patch: dict[str, Any] = yaml.safe_load(configmap["data"][key])
    return patch


def chart_pod(helm: Path, install: Install) -> dict[str, Any]:
    """The pod spec fields the chart adds: the sidecar container, its volumes, the process flag."""
    spec: dict[str, Any] = chart_patch(helm, install)["spec"]["template"]["spec"]
    return spec


# ------------------------------------------------------------------------- owners' specs


def kserve_schema() -> dict[str, Any]:
    """KServe's InferenceService v1beta1 schema, strict: unknown fields fail."""
    crd = yaml.safe_load(gzip.decompress(KSERVE_CRD.read_bytes()))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    schema: dict[str, Any] = _strict(version["schema"]["openAPIV3Schema"])
    return schema


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that rejects fields it does not declare."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in strict
        and "additionalProperties" not in strict
        and not strict.get("x-kubernetes-preserve-unknown-fields")
    ):
        strict["additionalProperties"] = False
    return strict


#: The fields of ``predictor.model`` that KServe reads itself; the rest are container fields
#: merged over the runtime's container (MergeRuntimeContainers in KServe's predictor reconciler).
_KSERVE_MODEL_ONLY = {"modelFormat", "runtime", "storageUri", "runtimeVersion", "protocolVersion"}
#: The predictor's fields that are KServe's own (ComponentExtensionSpec and the model); the rest
#: are PodSpec fields (PredictorSpec inlines PodSpec), which KServe puts in the pod.
_KSERVE_PREDICTOR_ONLY = {
    "model",
    "containers",
    "volumes",
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "scaleMetricType",
    "autoScaling",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
    "workerSpec",
}


def kserve_predictor_deployment(isvc: Manifest) -> Manifest:
    """The predictor Deployment KServe builds in Standard mode, as its reconciler assembles it.

    The runtime's kserve-container with ``predictor.model``'s container fields merged over it
    (args appended), then ``predictor.containers``; the runtime's volumes, then the predictor's;
    the labels KServe puts on predictor pods. The storage initializer's model mount is added to
    kserve-container by KServe's pod webhook, after the Deployment, and is left out.
    """
    runtime = yaml.safe_load(KSERVE_RUNTIME.read_text())["spec"]
    predictor = isvc["spec"]["predictor"]
    model = {k: v for k, v in predictor["model"].items() if k not in _KSERVE_MODEL_ONLY}
    base = copy.deepcopy(runtime["containers"][0])
    merged = strategic_merge(base, {k: v for k, v in model.items() if k != "args"})
    merged["args"] = [*base.get("args", []), *model.get("args", [])]
    merged["image"] = "vllm/vllm-openai:v0.32.0"  # KServe's config replaces vllmserver:replace
    name = isvc["metadata"]["name"]
    labels = {"serving.kserve.io/inferenceservice": name, "component": "predictor"}
    pod_fields = {k: v for k, v in predictor.items() if k not in _KSERVE_PREDICTOR_ONLY}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name}-predictor", "namespace": isvc["metadata"]["namespace"]},
        "spec": {
            "selector": {"matchLabels": {"app": f"isvc.{name}-predictor"}},
            "template": {
                "metadata": {"labels": {"app": f"isvc.{name}-predictor", **labels}},
                "spec": {
                    **pod_fields,
                    "containers": [merged, *predictor.get("containers", [])],
                    "volumes": [*runtime.get("volumes", []), *predictor.get("volumes", [])],
                },
            },
        },
    }


def owner_objects(helm: Path, kubectl: Path, recipe: str) -> list[Manifest]:
    """What the owner applies for the recipe: every Kubernetes object (KServe: its Deployment)."""
    here = EXAMPLES / recipe
    if recipe == "plain-deployment":
        return _documents((here / "deployment.yaml").read_text())
    if recipe == "production-stack":
        return _documents(
            _run(
                *(helm, "template", "vllm", PRODUCTION_STACK_CHART, "-n", NAMESPACE),
                *("-f", here / "values.yaml", "--post-renderer", here / "post-render.sh"),
                env={"KUBECTL": str(kubectl)},
            )
        )
    if recipe == "kserve":
        return [kserve_predictor_deployment(load_yaml(here / "inferenceservice.yaml"))]
    if recipe == "llm-d":
        return _documents(
            _run(
                helm, "template", "llama3", LLM_D_CHART, "-n", NAMESPACE, "-f", here / "values.yaml"
            )
        )
    raise AssertionError(recipe)


def owner(helm: Path, kubectl: Path, install: Install) -> tuple[list[Manifest], Manifest]:
    """What the owner applies for the install's recipe, and the workload by the deployer's name."""
    objects = owner_objects(helm, kubectl, install.recipe)
    return objects, only(objects, "Deployment", install.workload)


def vllm_container(pod: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's container of a pod spec: the one that is not the sidecar and requests the GPUs."""
    found = [
        c
        for c in pod["containers"]
        if c["name"] != SIDECAR
        and any("gpu" in r for r in c.get("resources", {}).get("limits", {}))
    ]
    assert len(found) == 1, [c["name"] for c in pod["containers"]]
    container: dict[str, Any] = found[0]
    return container


def listening_port(vllm: Mapping[str, Any]) -> int:
    """The port vLLM serves on, from its command line (``--port N`` or ``--port=N``)."""
    args = [str(a) for a in [*vllm.get("command", []), *vllm.get("args", [])]]
    for i, arg in enumerate(args):
        if arg == "--port":
            return int(args[i + 1])
        if arg.startswith("--port="):
            return int(arg.removeprefix("--port="))
    raise AssertionError(f"no --port in {args}")


def vllm_argv(vllm: Mapping[str, Any]) -> list[str]:
    """vLLM's command line as /proc/<pid>/cmdline shows it (command, then args)."""
    return [str(a) for a in [*vllm.get("command", []), *vllm.get("args", [])]]


def gpu_product(pod: Mapping[str, Any]) -> str:
    """The GPU product the pod is scheduled on: its nodeSelector, or its required node affinity."""
    if GPU_PRODUCT_LABEL in pod.get("nodeSelector", {}):
        return str(pod["nodeSelector"][GPU_PRODUCT_LABEL])
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    products = {
        value
        for term in required["nodeSelectorTerms"]
        for expression in term["matchExpressions"]
        if expression["key"] == GPU_PRODUCT_LABEL and expression["operator"] == "In"
        for value in expression["values"]
    }
    assert len(products) == 1, products
    return str(products.pop())


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether matchLabels ``selector`` selects a pod with ``labels``."""
    return selector.items() <= labels.items()


def effective_uid(pod: Mapping[str, Any], item: Mapping[str, Any]) -> int | None:
    """The UID a container runs as, if the spec says (else the image's, often root)."""
    uid = item.get("securityContext", {}).get("runAsUser")
    if uid is None:
        uid = pod.get("securityContext", {}).get("runAsUser")
    return None if uid is None else int(uid)


# ==================================================================================== tests


@pytest.mark.e2e
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_object_the_owner_applies_validates(helm: Path, kubectl: Path, recipe: str) -> None:
    """Every Kubernetes object the recipe's owner applies validates (strict, oldest and newest)."""
    # Here, not at the top: tests.test_autoscaling imports this module's _strict.
    from tests.test_autoscaling import keda_schema

    objects = owner_objects(helm, kubectl, recipe)
    assert objects
    for manifest in objects:
        validate_manifest(manifest)
    for install in (i for i in INSTALLS if i.recipe == recipe):
        for manifest in headroom(helm, install):
            if manifest["kind"] == "ScaledObject":
                jsonschema.validate(manifest, keda_schema())
            else:
                validate_manifest(manifest)


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_the_sidecar_is_the_charts_in_the_owners_own_spec(
    helm: Path, kubectl: Path, install: Install
) -> None:
    """vLLM's workload holds the chart's sidecar container, with every volume it mounts."""
    _, workload = owner(helm, kubectl, install)
    pod = workload["spec"]["template"]["spec"]
    sidecar = container(pod, SIDECAR)
    expected = chart_pod(helm, install)
    (reference,) = expected["containers"]
    hint = (
        f"re-render {install.recipe}'s sidecar from its {install.values} (helm/examples/README.md)"
    )
    for key in ("image", "args", "ports", "volumeMounts", "securityContext", "livenessProbe"):
        assert sidecar[key] == reference[key], f"{key}: {hint}"
    assert env_of(reference).items() <= env_of(sidecar).items(), hint
    derived = {e["name"]: e["valueFrom"] for e in reference.get("env", []) if "valueFrom" in e}
    given = {e["name"]: e.get("valueFrom") for e in sidecar.get("env", [])}
    for name, source in derived.items():  # the memory limit, the pod's name, the node's IP...
        assert given.get(name) == source, f"{name}: {hint}"
    assert "readinessProbe" not in sidecar
    assert "startupProbe" not in sidecar
    for kind in ("requests", "limits"):
        # llm-d adds an explicit nvidia.com/gpu "0" (see test_llm_d_gives_the_sidecar_no_gpu).
        assert reference["resources"][kind].items() <= sidecar["resources"][kind].items(), hint
    volumes = {v["name"]: v for v in pod["volumes"]}
    for volume in expected["volumes"]:
        assert volumes[volume["name"]] == volume, hint
    for mount in sidecar["volumeMounts"]:
        assert mount["name"] in volumes, mount
    assert pod.get("shareProcessNamespace", False) == expected.get("shareProcessNamespace", False)
    # The kubelet pulls and starts containers in order: vLLM never waits for the sidecar's image.
    names = [c["name"] for c in pod["containers"]]
    assert names.index(vllm_container(pod)["name"]) < names.index(SIDECAR), names


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_the_sidecar_polls_vllm_itself(helm: Path, kubectl: Path, install: Install) -> None:
    """The sidecar's target is vLLM's own port on loopback (behind llm-d's proxy too)."""
    _, workload = owner(helm, kubectl, install)
    pod = workload["spec"]["template"]["spec"]
    target = env_of(container(pod, SIDECAR))["HEADROOM_TARGET"]
    assert target == f"http://127.0.0.1:{listening_port(vllm_container(pod))}"


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_the_sidecar_reaches_no_secret_and_no_gpu_of_vllms(
    helm: Path, kubectl: Path, install: Install
) -> None:
    """Another non-root UID than vLLM's (environ unreadable), no GPU, no secret, nothing added."""
    _, workload = owner(helm, kubectl, install)
    pod = workload["spec"]["template"]["spec"]
    sidecar = container(pod, SIDECAR)
    env = env_of(sidecar)
    sidecar_uid = effective_uid(pod, sidecar)
    # None: the image's user, root for vLLM's images (production-stack, KServe, llm-d).
    vllm_uid = effective_uid(pod, vllm_container(pod)) or 0
    assert sidecar_uid is not None
    assert sidecar_uid not in {0, vllm_uid}
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    assert sidecar["securityContext"]["allowPrivilegeEscalation"] is False
    assert sidecar["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Only its own memory limit and, for gpu.source=dcgm, its pod's name, namespace, node and
    # node IP come from elsewhere (the downward API, no secret).
    downward = {"metadata.name", "metadata.namespace", "spec.nodeName", "status.hostIP"}
    assert all(
        (
            set(e["valueFrom"]) == {"resourceFieldRef"}
            and e["valueFrom"]["resourceFieldRef"]["containerName"] == sidecar["name"]
        )
        or (
            set(e["valueFrom"]) == {"fieldRef"}
            and e["valueFrom"]["fieldRef"]["fieldPath"] in downward
        )
        for e in sidecar.get("env", [])
        if "valueFrom" in e
    )
    # The runbook VllmHeadroomGpuForeignMemory: never NVIDIA_VISIBLE_DEVICES=all on vLLM nodes.
    assert env["HEADROOM_GPU_DISCOVERY"] == "none"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    requested = [r for r in sidecar["resources"]["limits"] if "gpu" in r]
    assert all(str(sidecar["resources"]["limits"][r]) == "0" for r in requested)


#: Recipes whose deployers run on the GPU Operator, which ships dcgm-exporter with its pod mapping.
DCGM_RECIPES = frozenset({"production-stack", "kserve", "llm-d"})


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_gpu_memory_comes_from_dcgm_exporter_where_the_gpu_operator_runs(
    helm: Path, kubectl: Path, install: Install
) -> None:
    """The GPU Operator's recipes read the node's dcgm-exporter; the URL's NODE_IP comes first."""
    _, workload = owner(helm, kubectl, install)
    sidecar = container(workload["spec"]["template"]["spec"], SIDECAR)
    env = env_of(sidecar)
    if install.recipe not in DCGM_RECIPES:
        assert "HEADROOM_GPU_SOURCE" not in env
        return
    assert env["HEADROOM_GPU_SOURCE"] == "dcgm"
    assert env["HEADROOM_DCGM_URL"] == "http://$(NODE_IP):9400/metrics"
    refs = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in sidecar["env"]
        if "fieldRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "NODE_IP": "status.hostIP",
        "HEADROOM_POD_NAME": "metadata.name",
        "HEADROOM_POD_NAMESPACE": "metadata.namespace",
        "HEADROOM_NODE_NAME": "spec.nodeName",
    }
    names = [e["name"] for e in sidecar["env"]]
    assert names.index("NODE_IP") < names.index("HEADROOM_DCGM_URL")


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_max_num_seqs_and_gpu_memory_are_wired(helm: Path, kubectl: Path, install: Install) -> None:
    """The sidecar is told vLLM's --max-num-seqs and the GPU's memory, and can read the former."""
    _, workload = owner(helm, kubectl, install)
    pod = workload["spec"]["template"]["spec"]
    vllm = vllm_container(pod)
    env = env_of(container(pod, SIDECAR))
    argv = vllm_argv(vllm)
    # What the sidecar reads in /proc/<pid>/cmdline, parsed as it parses it.
    assert is_vllm_server(argv), argv
    flags = parse_launch_flags(argv)
    assert flags.max_num_seqs is not None, f"{install.recipe}: vLLM runs with a default"
    assert int(env["HEADROOM_MAX_NUM_SEQS"]) == flags.max_num_seqs
    assert flags.listen_port == listening_port(vllm)
    assert pod["shareProcessNamespace"] is True
    # vLLM reads --gpu_memory_utilization (production-stack's spelling) as the same flag.
    assert any(a.replace("_", "-").startswith("--gpu-memory-utilization") for a in argv), argv
    assert int(env["HEADROOM_GPU_MEMORY_BYTES"]) == GPU_MEMORY[gpu_product(pod)]


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["keda", "hpa"])
@pytest.mark.parametrize(
    "install", [i for i in INSTALLS if i.autoscaled], ids=[i for i in INSTALL_IDS if "pre" not in i]
)
def test_autoscaling_scales_what_the_deployer_scales(
    helm: Path, kubectl: Path, install: Install, kind: str
) -> None:
    """The ScaledObject or HPA targets the deployer's workload and counts exactly its pods."""
    objects, workload = owner(helm, kubectl, install)
    rendered = headroom(helm, install, "--set", f"autoscaling.kind={kind}")
    scaler = only(rendered, "ScaledObject" if kind == "keda" else "HorizontalPodAutoscaler")
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": workload["apiVersion"],
        "kind": workload["kind"],
        "name": workload["metadata"]["name"],
    }
    if kind == "keda":
        query = scaler["spec"]["triggers"][0]["metadata"]["query"]
    else:
        validate_manifest(scaler)
        rule = only(rendered, "PrometheusRule", f"{install.release}-vllm-headroom-autoscaling")[
            "spec"
        ]["groups"][0]["rules"][0]
        query = rule["expr"]
        # The HPA reads the series recorded for this workload, by its name.
        selector = scaler["spec"]["metrics"][0]["external"]["metric"]["selector"]
        assert selector["matchLabels"] == {"headroom_deployment": workload["metadata"]["name"]}
        assert rule["labels"] == selector["matchLabels"]
    (pods,) = set(re.findall(r'pod=~"([^"]+)"', query))
    name = workload["metadata"]["name"]
    # A Deployment's pods: <name>-<pod-template-hash>-<5 characters>.
    assert re.fullmatch(pods, f"{name}-5d8f9c7b6d-x7k2p")
    others = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    for other in (o for o in others if o != name):
        assert not re.fullmatch(pods, f"{other}-5d8f9c7b6d-x7k2p"), other
    # No second autoscaler on the same workload: the deployer's own is off.
    assert not of_kind(objects, "HorizontalPodAutoscaler")
    assert not of_kind(objects, "ScaledObject")
    if install.recipe == "kserve":
        isvc = load_yaml(EXAMPLES / "kserve" / "inferenceservice.yaml")
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    if install.recipe == "plain-deployment":
        # A replicas field would reset the autoscaler's count at every kubectl apply.
        assert "replicas" not in workload["spec"]


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_one_disruption_budget_covers_the_pods(helm: Path, kubectl: Path, install: Install) -> None:
    """Exactly one PodDisruptionBudget selects the pods: the deployer's, else the chart's."""
    objects, workload = owner(helm, kubectl, install)
    labels = workload["spec"]["template"]["metadata"]["labels"]
    budgets = [
        pdb
        for pdb in of_kind([*objects, *headroom(helm, install)], "PodDisruptionBudget")
        if selects(pdb["spec"]["selector"]["matchLabels"], labels)
    ]
    assert len(budgets) == 1, [b["metadata"]["name"] for b in budgets]
    (budget,) = budgets
    # Never one that hangs every node drain.
    assert budget["spec"].get("maxUnavailable") == 1
    made_by_the_chart = budget in headroom(helm, install)
    assert made_by_the_chart is (install.recipe != "production-stack")


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_the_pod_monitor_scrapes_the_owners_pods(
    helm: Path, kubectl: Path, install: Install
) -> None:
    """The install's PodMonitor selects its pods by ports they have, for kube-prometheus-stack."""
    _, workload = owner(helm, kubectl, install)
    template = workload["spec"]["template"]
    monitor = only(headroom(helm, install), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert selects(monitor["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    ports = {p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])}
    endpoints = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    assert endpoints[0] == "headroom"
    assert set(endpoints) <= ports, (endpoints, ports)
    vllm_port = next(
        p for p in vllm_container(template["spec"])["ports"] if p.get("name") == endpoints[1]
    )
    assert vllm_port["containerPort"] == listening_port(vllm_container(template["spec"]))


# ------------------------------------------------------------------ the NetworkPolicy

#: kube-prometheus-stack's Prometheus, in namespace monitoring (which the chart's default
#: networkPolicy.metricsFrom admits to the exporter's port).
PROMETHEUS = Peer("monitoring", {"app.kubernetes.io/name": "prometheus"})
#: A pod of vLLM's namespace that is no client of anything in the pod.
STRANGER = Peer(NAMESPACE, {"app": "stranger"})


def clients(helm: Path, kubectl: Path, install: Install) -> dict[int, list[Peer]]:
    """Each port of vLLM's pod, other than the exporter's, and who connects to it.

    As each deployer documents them; a port the deployer's pod declares must be here (the test
    fails on a new one), and some are used without being declared (P/D transfer).
    """
    objects, workload = owner(helm, kubectl, install)
    recipe = install.recipe
    if recipe == "plain-deployment":
        # deployment.yaml: its Service's port 8000 -> targetPort http, vLLM's --port 8000.
        return {8000: [Peer(NAMESPACE, {"app": "chat-frontend"}), PROMETHEUS]}
    if recipe == "production-stack":
        # vllm-stack 0.1.12 (tests/fixtures/deployers/): the router sends every request to the
        # engine Service's port 8000 (container-port, vLLM's --port); the engine pod also
        # declares zmq-port 55555 and ucx-port 9999 (deployment-vllm-multi.yaml) for LMCache's
        # KV transfer between the stack's engines.
        router = only(objects, "Deployment", "vllm-deployment-router")
        router_pod = Peer(NAMESPACE, router["spec"]["template"]["metadata"]["labels"])
        engine = Peer(NAMESPACE, workload["spec"]["template"]["metadata"]["labels"])
        return {8000: [router_pod, PROMETHEUS], 55555: [engine], 9999: [engine]}
    if recipe == "kserve":
        # kserve-vllmserver (config/runtimes/kserve-vllmserver.yaml): vLLM's OpenAI server with
        # --port=8080, requests and /metrics both; in Standard mode the predictor Service sends
        # the ingress gateway's traffic there.
        return {8080: [Peer("istio-system", {"app": "istio-ingressgateway"}), PROMETHEUS]}
    if recipe == "llm-d":
        # llm-d-modelservice v0.4.12 (_helpers.tpl, routingProxy and vllmPort): the routing
        # proxy listens on routing.servicePort 8000, where the gateway sends what the endpoint
        # picker chose, and forwards to vLLM on routing.proxy.targetPort 8200, whose /metrics
        # the endpoint picker and the PodMonitor read. Prefill and decode pods (the model's
        # labels, llm-d.ai/role prefill or decode) transfer KV with vLLM's NixlConnector: its
        # side channel VLLM_NIXL_SIDE_CHANNEL_PORT (vLLM's envs.py: 5600 by default) and UCX,
        # whose TCP transport picks its ports at run time (40000 stands for one).
        gateway = Peer(NAMESPACE, {"gateway.networking.k8s.io/gateway-name": "llm-d-gateway"})
        picker = Peer(NAMESPACE, {"inferencepool": "llama3-epp"})
        labels = workload["spec"]["template"]["metadata"]["labels"]
        prefill = Peer(NAMESPACE, {**labels, "llm-d.ai/role": "prefill"})
        if not install.autoscaled:
            # The prefill pod: no proxy in front of vLLM (routing.servicePort 8000, named
            # metrics), which the decode pods' routing proxy sends each prompt to, the endpoint
            # picker and Prometheus scrape; the decode pods pull its KV over NIXL and UCX.
            decode = Peer(NAMESPACE, {**labels, "llm-d.ai/role": "decode"})
            return {8000: [decode, picker, PROMETHEUS], 5600: [decode], 40000: [decode]}
        return {
            8000: [gateway, picker],
            8200: [picker, PROMETHEUS],
            5600: [prefill],
            40000: [prefill],
        }
    raise AssertionError(recipe)


#: The peers a site would put in networkPolicy.vllmFrom to restrict vLLM to its clients.
def _front_door(recipe: str, ports: Mapping[int, list[Peer]]) -> list[Peer]:
    serving = {"plain-deployment": 8000, "production-stack": 8000, "kserve": 8080, "llm-d": 8000}
    return [peer for peer in ports[serving[recipe]] if peer != PROMETHEUS]


def _peer_rule(peer: Peer) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": peer.namespace}},
        "podSelector": {"matchLabels": dict(peer.labels)},
    }


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_the_network_policy_never_cuts_vllm_off(
    helm: Path, kubectl: Path, install: Install
) -> None:
    """With the policy on, every port of vLLM's pod admits its clients, the exporter's Prometheus.

    The policy selects the owner's pods (the deployer's own rendering), whose named ports it
    resolves; every port the pod declares has its clients admitted, vLLM's from anyone (vllmFrom
    is empty by default), and the exporter's port admits Prometheus and no stranger.
    """
    _, workload = owner(helm, kubectl, install)
    template = workload["spec"]["template"]
    policy = only(headroom(helm, install, "--set", "networkPolicy.enabled=true"), "NetworkPolicy")
    validate_manifest(policy)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    ports = clients(helm, kubectl, install)
    assert served_ports(pod) - {DEFAULT_PORT} <= set(ports), (served_ports(pod), set(ports))
    for port, peers in ports.items():
        for peer in peers:
            assert admits(policy, pod, peer, port), (port, peer)
    assert admits(policy, pod, STRANGER, listening_port(vllm_container(pod)))
    assert admits(policy, pod, PROMETHEUS, DEFAULT_PORT)
    assert not admits(policy, pod, STRANGER, DEFAULT_PORT)


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_vllm_restricted_to_its_clients_keeps_them_and_prometheus(
    helm: Path, kubectl: Path, install: Install
) -> None:
    """networkPolicy.vllmFrom set to the deployer's front door: its clients still pass, no stranger.

    Prometheus keeps vLLM's /metrics, the P/D and LMCache peers their transfer ports, and a
    stranger reaches no port of the pod.
    """
    _, workload = owner(helm, kubectl, install)
    pod = workload["spec"]["template"]["spec"]
    ports = clients(helm, kubectl, install)
    front = json.dumps([_peer_rule(peer) for peer in _front_door(install.recipe, ports)])
    manifests = headroom(
        helm,
        install,
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        f"networkPolicy.vllmFrom={front}",
    )
    policy = only(manifests, "NetworkPolicy")
    for port, peers in ports.items():
        for peer in peers:
            assert admits(policy, pod, peer, port), (port, peer)
    for port in {*served_ports(pod), *ports}:
        assert not admits(policy, pod, STRANGER, port), port


# ------------------------------------------------------------------------- per deployer


@pytest.mark.e2e
def test_production_stack_patch_is_the_charts(helm: Path) -> None:
    """The post-renderer's patch is the chart's kustomize-patch.yaml for headroom-values.yaml."""
    checked_in = load_yaml(EXAMPLES / "production-stack" / "vllm-headroom-patch.yaml")
    assert checked_in == chart_patch(helm, INSTALLS[1], "kustomize-patch.yaml"), (
        "re-render helm/examples/production-stack/vllm-headroom-patch.yaml (README.md there)"
    )


@pytest.mark.e2e
def test_production_stack_post_renderer_touches_only_the_engine(helm: Path, kubectl: Path) -> None:
    """Only the engine Deployment changes: the sidecar added behind vLLM, the default container."""
    objects, engine = owner(helm, kubectl, INSTALLS[1])
    plain = _documents(
        _run(
            *(helm, "template", "vllm", PRODUCTION_STACK_CHART, "-n", NAMESPACE),
            *("-f", EXAMPLES / "production-stack" / "values.yaml"),
        )
    )

    def key(m: Manifest) -> tuple[str, str]:
        return (m["kind"], m["metadata"]["name"])

    assert sorted(map(key, objects)) == sorted(map(key, plain))
    changed = [key(m) for m in objects if m != next(p for p in plain if key(p) == key(m))]
    assert changed == [key(engine)]
    # The first container is kubectl's default, and the kubelet starts (and pulls) in order.
    assert [c["name"] for c in engine["spec"]["template"]["spec"]["containers"]] == [
        "vllm",
        SIDECAR,
    ]


@pytest.mark.e2e
def test_production_stack_values_are_the_stacks_own(helm: Path) -> None:
    """The recipe's values use fields production-stack's chart reads (each renders a difference)."""
    values = load_yaml(EXAMPLES / "production-stack" / "values.yaml")
    (model,) = values["servingEngineSpec"]["modelSpec"]
    engine = only(
        _documents(
            _run(
                *(helm, "template", "vllm", PRODUCTION_STACK_CHART, "-n", NAMESPACE),
                *("-f", EXAMPLES / "production-stack" / "values.yaml"),
            )
        ),
        "Deployment",
        f"vllm-{model['name']}-deployment-vllm",
    )
    vllm = container(engine["spec"]["template"]["spec"], "vllm")
    assert vllm["image"] == f"{model['repository']}:{model['tag']}"
    assert model["modelURL"] in vllm["command"]
    assert "--max-model-len" in vllm["command"]
    assert {e["name"] for e in vllm["env"]} >= {"HF_TOKEN", "VLLM_API_KEY", "HF_HOME"}


@pytest.mark.e2e
def test_kserve_inference_service_matches_kserves_crd() -> None:
    """The InferenceService validates against KServe's CRD schema, made strict."""
    schema = kserve_schema()
    isvc = load_yaml(EXAMPLES / "kserve" / "inferenceservice.yaml")
    jsonschema.validate(isvc, schema)
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    misspelt = copy.deepcopy(isvc)
    misspelt["spec"]["predictor"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, schema)


@pytest.mark.e2e
def test_kserve_runtime_serves_vllm_on_the_sidecars_target() -> None:
    """kserve-vllmserver's container is vLLM's OpenAI server on the port the sidecar polls."""
    runtime = yaml.safe_load(KSERVE_RUNTIME.read_text())
    (serving,) = runtime["spec"]["containers"]
    assert serving["name"] == "kserve-container"
    assert serving["command"][-1] == "vllm.entrypoints.openai.api_server"
    assert "--port=8080" in serving["args"]
    isvc = load_yaml(EXAMPLES / "kserve" / "inferenceservice.yaml")
    assert isvc["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    assert isvc["spec"]["predictor"]["model"]["modelFormat"]["name"] == "vLLM"


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS[3:], ids=INSTALL_IDS[3:])
def test_llm_d_gives_the_sidecar_no_gpu_and_no_secret(
    helm: Path, kubectl: Path, install: Install
) -> None:
    """llm-d gives every container the role's GPUs unless told: the sidecar says 0, no token."""
    _, pod_owner = owner(helm, kubectl, install)
    pod = pod_owner["spec"]["template"]["spec"]
    sidecar = container(pod, SIDECAR)
    for kind in ("requests", "limits"):
        assert sidecar["resources"][kind]["nvidia.com/gpu"] == "0"
    # No secret: the only values from elsewhere are the downward API's (gpu.source=dcgm's pod
    # fields, the container's own memory limit).
    downward = ({"fieldRef"}, {"resourceFieldRef"})
    assert all(set(e["valueFrom"]) in downward for e in sidecar["env"] if "valueFrom" in e)
    assert sidecar["command"] == ["vllm-headroom"]


@pytest.mark.e2e
def test_llm_d_roles_each_have_their_own_figures(helm: Path, kubectl: Path) -> None:
    """Decode polls vLLM behind the routing proxy, prefill vLLM directly; each its own pods."""
    decode_install, prefill_install = INSTALLS[3:]
    _, decode = owner(helm, kubectl, decode_install)
    _, prefill = owner(helm, kubectl, prefill_install)
    proxy = next(
        c
        for c in decode["spec"]["template"]["spec"]["initContainers"]
        if c["name"] == "routing-proxy"
    )
    assert proxy["restartPolicy"] == "Always"
    assert "--port=8000" in proxy["args"]
    assert "--vllm-port=8200" in proxy["args"]
    assert "initContainers" not in prefill["spec"]["template"]["spec"]
    targets = {
        role: env_of(container(w["spec"]["template"]["spec"], SIDECAR))["HEADROOM_TARGET"]
        for role, w in (("decode", decode), ("prefill", prefill))
    }
    assert targets == {"decode": "http://127.0.0.1:8200", "prefill": "http://127.0.0.1:8000"}
    # Each release watches its role's pods only, and only decode is scaled on headroom.
    for install, mine, theirs in (
        (decode_install, decode, prefill),
        (prefill_install, prefill, decode),
    ):
        monitor = only(headroom(helm, install), "PodMonitor")
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selects(selector, mine["spec"]["template"]["metadata"]["labels"])
        assert not selects(selector, theirs["spec"]["template"]["metadata"]["labels"])
    assert of_kind(headroom(helm, decode_install), "ScaledObject")
    assert not of_kind(headroom(helm, prefill_install), "ScaledObject")
    # One copy of the dashboards per Grafana.
    dashboards = [
        i
        for i in (decode_install, prefill_install)
        if load_yaml(EXAMPLES / "llm-d" / i.values)["dashboards"]["enabled"]
    ]
    assert dashboards == [decode_install]


@pytest.mark.e2e
def test_plain_deployment_runs_vllm_as_the_chart_does(helm: Path) -> None:
    """The plain recipe's vLLM is the chart's vllm shape's: non-root, read-only, same probes."""
    deployment = only(
        _documents((EXAMPLES / "plain-deployment" / "deployment.yaml").read_text()), "Deployment"
    )
    shape = only(
        _documents(
            _run(
                *(helm, "template", "llama3", CHART, "-n", NAMESPACE),
                *("--set", "vllm.model=meta-llama/Llama-3.1-8B-Instruct"),
            )
        ),
        "Deployment",
    )
    mine, reference = (
        container(d["spec"]["template"]["spec"], "vllm") for d in (deployment, shape)
    )
    for key in ("securityContext", "startupProbe", "livenessProbe", "readinessProbe", "command"):
        assert mine[key] == reference[key], key
    assert (
        deployment["spec"]["template"]["spec"]["securityContext"]
        == shape["spec"]["template"]["spec"]["securityContext"]
    )


@pytest.mark.e2e
@pytest.mark.parametrize("install", INSTALLS, ids=INSTALL_IDS)
def test_notes_say_what_each_install_scales_and_reads(
    helm: Path, request: pytest.FixtureRequest, install: Install
) -> None:
    """NOTES.txt names the workload scaled, the figures given, and what the sidecar cannot read."""
    values = EXAMPLES / install.recipe / install.values
    chart = request.getfixturevalue("notes_chart")
    notes = only(render(helm, values, chart=chart), "ConfigMap", "notes-render")
    text = " ".join(notes["data"]["notes"].split())
    settings = load_yaml(values)["exporter"]["settings"]
    assert f"max_num_seqs: {settings['max_num_seqs']} (exporter.settings" in text
    assert f"One GPU's memory: {settings['gpu_memory_bytes']} bytes" in text
    assert "never vLLM's environment (HF_TOKEN, VLLM_API_KEY)" in text
    assert "NVIDIA_VISIBLE_DEVICES=void, never all" in text
    scaled = f"replicas of Deployment/{install.workload} on the model's p95 headroom"
    assert (scaled in text) is install.autoscaled, text


def test_every_recipe_is_listed_and_documented() -> None:
    """helm/examples/ holds exactly these recipes, each in the README and docs/kubernetes.md."""
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()) == sorted(RECIPES)
    readme = (EXAMPLES / "README.md").read_text()
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    for recipe in RECIPES:
        assert f"({recipe}/)" in readme, recipe
        assert f"helm/examples/{recipe}" in docs, recipe
        assert (EXAMPLES / recipe / "headroom-values.yaml").is_file()


def test_recipe_headroom_values_pin_the_image() -> None:
    """Each recipe's headroom values name a registry image and tag (none pretends to exist)."""
    for install in INSTALLS:
        image = load_yaml(EXAMPLES / install.recipe / install.values)["exporter"]["image"]
        assert re.fullmatch(r"registry\.example\.com/vllm-headroom", image["repository"])
        assert image["tag"]
