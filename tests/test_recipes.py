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
- ``llm-d``: llm-d's model service chart, the sidecar a second container of ``decode.containers``,
  polling vLLM's own port behind llm-d's routing proxy.

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

from exporter.service.settings import DEFAULT_PORT
from tests.test_helm import (
    CHART,
    REPO,
    Manifest,
    Peer,
    admits,
    container,
    env_of,
    load_yaml,
    of_kind,
    only,
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


def headroom(helm: Path, recipe: str, *flags: str) -> list[Manifest]:
    """The chart rendered with the recipe's headroom-values.yaml (shape sidecar), and ``flags``."""
    values = EXAMPLES / recipe / "headroom-values.yaml"
    return _documents(
        _run(helm, "template", f"{recipe}-headroom", CHART, "-n", NAMESPACE, "-f", values, *flags)
    )


def chart_patch(helm: Path, recipe: str, key: str = "patch.yaml") -> dict[str, Any]:
    """The chart's sidecar patch for the recipe (``patch.yaml`` or ``kustomize-patch.yaml``)."""
    configmap = next(
        m for m in of_kind(headroom(helm, recipe), "ConfigMap") if key in m.get("data", {})
    )
    patch: dict[str, Any] = yaml.safe_load(configmap["data"][key])
    return patch


def chart_pod(helm: Path, recipe: str) -> dict[str, Any]:
    """The pod spec fields the chart adds: the sidecar container, its volumes, the process flag."""
    spec: dict[str, Any] = chart_patch(helm, recipe)["spec"]["template"]["spec"]
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
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name}-predictor", "namespace": isvc["metadata"]["namespace"]},
        "spec": {
            "selector": {"matchLabels": {"app": f"isvc.{name}-predictor"}},
            "template": {
                "metadata": {"labels": {"app": f"isvc.{name}-predictor", **labels}},
                "spec": {
                    "containers": [merged, *predictor.get("containers", [])],
                    "volumes": [*runtime.get("volumes", []), *predictor.get("volumes", [])],
                },
            },
        },
    }


def owner(helm: Path, kubectl: Path, recipe: str) -> tuple[list[Manifest], Manifest]:
    """What the owner applies for the recipe (every Kubernetes object) and vLLM's workload."""
    here = EXAMPLES / recipe
    if recipe == "plain-deployment":
        objects = _documents((here / "deployment.yaml").read_text())
        return objects, only(objects, "Deployment")
    if recipe == "production-stack":
        objects = _documents(
            _run(
                *(helm, "template", "vllm", PRODUCTION_STACK_CHART, "-n", NAMESPACE),
                *("-f", here / "values.yaml", "--post-renderer", here / "post-render.sh"),
                env={"KUBECTL": str(kubectl)},
            )
        )
        return objects, only(objects, "Deployment", "vllm-llama3-deployment-vllm")
    if recipe == "kserve":
        isvc = load_yaml(here / "inferenceservice.yaml")
        deployment = kserve_predictor_deployment(isvc)
        return [deployment], deployment
    if recipe == "llm-d":
        objects = _documents(
            _run(
                helm, "template", "llama3", LLM_D_CHART, "-n", NAMESPACE, "-f", here / "values.yaml"
            )
        )
        return objects, only(objects, "Deployment", "llama3-llm-d-modelservice-decode")
    raise AssertionError(recipe)


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
    objects, _ = owner(helm, kubectl, recipe)
    assert objects
    for manifest in objects:
        validate_manifest(manifest)
    for manifest in headroom(helm, recipe):
        validate_manifest(manifest)


@pytest.mark.e2e
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_sidecar_is_the_charts_in_the_owners_own_spec(
    helm: Path, kubectl: Path, recipe: str
) -> None:
    """vLLM's workload holds the chart's sidecar container, with every volume it mounts."""
    _, workload = owner(helm, kubectl, recipe)
    pod = workload["spec"]["template"]["spec"]
    sidecar = container(pod, SIDECAR)
    expected = chart_pod(helm, recipe)
    (reference,) = expected["containers"]
    hint = f"re-render {recipe}'s sidecar from its headroom-values.yaml (helm/examples/README.md)"
    for key in ("image", "args", "ports", "volumeMounts", "securityContext", "livenessProbe"):
        assert sidecar[key] == reference[key], f"{key}: {hint}"
    assert env_of(reference).items() <= env_of(sidecar).items(), hint
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
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_sidecar_polls_vllm_itself(helm: Path, kubectl: Path, recipe: str) -> None:
    """The sidecar's target is vLLM's own port on loopback (behind llm-d's proxy too)."""
    _, workload = owner(helm, kubectl, recipe)
    pod = workload["spec"]["template"]["spec"]
    target = env_of(container(pod, SIDECAR))["HEADROOM_TARGET"]
    assert target == f"http://127.0.0.1:{listening_port(vllm_container(pod))}"


@pytest.mark.e2e
@pytest.mark.parametrize("recipe", RECIPES)
def test_gpu_discovery_fits_how_the_owner_runs_vllm(helm: Path, kubectl: Path, recipe: str) -> None:
    """process only where vLLM runs as the sidecar's non-root UID; otherwise none, never all."""
    _, workload = owner(helm, kubectl, recipe)
    pod = workload["spec"]["template"]["spec"]
    sidecar = container(pod, SIDECAR)
    env = env_of(sidecar)
    vllm_uid = effective_uid(pod, vllm_container(pod))
    if env["HEADROOM_GPU_DISCOVERY"] == "auto":
        assert pod["shareProcessNamespace"] is True
        assert vllm_uid == effective_uid(pod, sidecar) == 65532
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    else:
        # vLLM runs as root (the images' default): its environment is not readable.
        assert vllm_uid in {None, 0}
        assert env["HEADROOM_GPU_DISCOVERY"] == "none"
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert "shareProcessNamespace" not in pod
    requested = [r for r in sidecar["resources"]["limits"] if "gpu" in r]
    assert all(str(sidecar["resources"]["limits"][r]) == "0" for r in requested)


@pytest.mark.e2e
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_pod_monitor_scrapes_the_owners_pods(helm: Path, kubectl: Path, recipe: str) -> None:
    """The recipe's PodMonitor selects vLLM's pods by ports they have, for kube-prometheus-stack."""
    _, workload = owner(helm, kubectl, recipe)
    template = workload["spec"]["template"]
    monitor = only(headroom(helm, recipe), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    )
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


def clients(helm: Path, kubectl: Path, recipe: str) -> dict[int, list[Peer]]:
    """Each port of vLLM's pod, other than the exporter's, and who connects to it.

    As each deployer documents them; a port the deployer's pod declares must be here (the test
    fails on a new one), and some are used without being declared (P/D transfer).
    """
    objects, workload = owner(helm, kubectl, recipe)
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
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_network_policy_never_cuts_vllm_off(helm: Path, kubectl: Path, recipe: str) -> None:
    """With the policy on, every port of vLLM's pod admits its clients, the exporter's Prometheus.

    The policy selects the owner's pods (the deployer's own rendering), whose named ports it
    resolves; every port the pod declares has its clients admitted, vLLM's from anyone (vllmFrom
    is empty by default), and the exporter's port admits Prometheus and no stranger.
    """
    _, workload = owner(helm, kubectl, recipe)
    template = workload["spec"]["template"]
    policy = only(headroom(helm, recipe, "--set", "networkPolicy.enabled=true"), "NetworkPolicy")
    validate_manifest(policy)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    ports = clients(helm, kubectl, recipe)
    assert served_ports(pod) - {DEFAULT_PORT} <= set(ports), (served_ports(pod), set(ports))
    for port, peers in ports.items():
        for peer in peers:
            assert admits(policy, pod, peer, port), (port, peer)
    assert admits(policy, pod, STRANGER, listening_port(vllm_container(pod)))
    assert admits(policy, pod, PROMETHEUS, DEFAULT_PORT)
    assert not admits(policy, pod, STRANGER, DEFAULT_PORT)


@pytest.mark.e2e
@pytest.mark.parametrize("recipe", RECIPES)
def test_vllm_restricted_to_its_clients_keeps_them_and_prometheus(
    helm: Path, kubectl: Path, recipe: str
) -> None:
    """networkPolicy.vllmFrom set to the deployer's front door: its clients still pass, no stranger.

    Prometheus keeps vLLM's /metrics, the P/D and LMCache peers their transfer ports, and a
    stranger reaches no port of the pod.
    """
    _, workload = owner(helm, kubectl, recipe)
    pod = workload["spec"]["template"]["spec"]
    ports = clients(helm, kubectl, recipe)
    front = json.dumps([_peer_rule(peer) for peer in _front_door(recipe, ports)])
    manifests = headroom(
        helm,
        recipe,
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
    assert checked_in == chart_patch(helm, "production-stack", "kustomize-patch.yaml"), (
        "re-render helm/examples/production-stack/vllm-headroom-patch.yaml (README.md there)"
    )


@pytest.mark.e2e
def test_production_stack_post_renderer_touches_only_the_engine(helm: Path, kubectl: Path) -> None:
    """Only the engine Deployment changes: the sidecar added behind vLLM, the default container."""
    objects, engine = owner(helm, kubectl, "production-stack")
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
def test_llm_d_gives_the_sidecar_no_gpu_and_no_secret(helm: Path, kubectl: Path) -> None:
    """llm-d gives every container the decode GPUs unless told: the sidecar says 0, and no token."""
    _, decode = owner(helm, kubectl, "llm-d")
    pod = decode["spec"]["template"]["spec"]
    sidecar = container(pod, SIDECAR)
    for kind in ("requests", "limits"):
        assert sidecar["resources"][kind]["nvidia.com/gpu"] == "0"
    assert not [e for e in sidecar["env"] if "valueFrom" in e]
    assert sidecar["command"] == ["vllm-headroom"]
    proxy = next(c for c in pod["initContainers"] if c["name"] == "routing-proxy")
    assert proxy["restartPolicy"] == "Always"
    assert "--port=8000" in proxy["args"]
    assert "--vllm-port=8200" in proxy["args"]
    assert env_of(sidecar)["HEADROOM_TARGET"].endswith(":8200")


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
    for recipe in RECIPES:
        image = load_yaml(EXAMPLES / recipe / "headroom-values.yaml")["exporter"]["image"]
        assert re.fullmatch(r"registry\.example\.com/vllm-headroom", image["repository"])
        assert image["tag"]
