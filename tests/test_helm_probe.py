"""Specification of the chart's probe Job (``probe:`` values, docs/probe.md "In Kubernetes").

Rendered by the pinned Helm binary as tests/test_helm.py renders the chart (skipped without it,
failing under ``CI=true``). The Job runs ``vllm-headroom probe`` against the release's own vLLM
Service once, bounded and never retried, keeping its JSON report in its log and on a volume. Its
arguments are parsed by the CLI's own parser, so the chart never renders a flag the command lacks,
and its command line is run for real against the simulated vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exporter.cli import probe as probe_command
from exporter.cli.main import build_parser
from exporter.cli.numbers import Bounded
from exporter.sim import Scenario, SimEngineConfig
from exporter.testing.simload import SimCompletionsServer
from tests.test_helm import (
    CHART,
    NAMESPACE,
    RELEASE,
    ci,
    container,
    load_yaml,
    of_kind,
    only,
    render,
    render_error,
    sidecar_pod,
    validate_manifest,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tests.test_helm import Manifest

MODEL = "--set vllm.model=Qwen/Qwen3-0.6B"
#: The least the probe needs: enabled, and a traffic shape.
ENABLED = (MODEL, "--set probe.enabled=true", "--set probe.shape.fromTarget=true")
SERVICE_URL = f"http://{RELEASE}-vllm-headroom.{NAMESPACE}.svc:8000"
POD_NAME = "rel-vllm-headroom-probe-0123abcd-xyz12"
#: A values file with every probe value given (floats need a file: --set makes them strings).
FULL_VALUES: dict[str, Any] = {
    "vllm": {"model": "Qwen/Qwen3-0.6B"},
    "probe": {
        "enabled": True,
        "sendLoadWhileServing": True,
        "mode": "rate",
        "levels": [0.5, 1, 2.5, 4],
        "stepSeconds": 20,
        "settleSeconds": 5,
        "pastKnee": 2,
        "maxDurationSeconds": 600,
        "maxRequests": 2000,
        "drainSeconds": 30,
        "baselineRequests": 5,
        "seed": 7,
        "model": "qwen",
        "maxNumSeqs": 64,
        "shape": {"from": "http://vllm.prod.svc:8000", "windowSeconds": 300, "samples": 100},
        "limits": {
            "maxPreemptionsPerRequest": 0.05,
            "maxWaiting": 1,
            "ttftP95Seconds": 2,
            "tpotP95Seconds": 0.1,
            "stopPreemptions": 40,
            "stopWaiting": 20,
        },
        "report": {"format": "html"},
    },
}


def job(manifests: Sequence[Manifest]) -> Manifest:
    """The one probe Job."""
    return only(manifests, "Job")


def probe_container(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The Job's probe container."""
    return container(job(manifests)["spec"]["template"]["spec"], "probe")


def cli_args(manifests: Sequence[Manifest], pod_name: str = POD_NAME) -> list[str]:
    """The probe's command line after ``vllm-headroom``, with $(POD_NAME) as Kubernetes sets it."""
    return [arg.replace("$(POD_NAME)", pod_name) for arg in probe_container(manifests)["args"]]


def flag(args: Sequence[str], name: str) -> str:
    """The value after ``name`` in ``args``."""
    assert args.count(name) == 1, (name, args)
    return args[args.index(name) + 1]


@pytest.fixture(scope="module")
def full_values(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FULL_VALUES as a values file."""
    path = tmp_path_factory.mktemp("probe") / "probe-values.yaml"
    path.write_text(json.dumps(FULL_VALUES))
    return path


# ======================================================================== the values' ranges

#: Each number value of ``probe:`` and the flag the Job passes it to (templates/_probe.tpl).
NUMBER_VALUES = {
    "stepSeconds": "--step-seconds",
    "settleSeconds": "--settle-seconds",
    "pastKnee": "--past-knee",
    "maxDurationSeconds": "--max-duration",
    "maxRequests": "--max-requests",
    "drainSeconds": "--drain-seconds",
    "baselineRequests": "--baseline-requests",
    "seed": "--seed",
    "maxNumSeqs": "--max-num-seqs",
    "shape.promptTokens": "--prompt-tokens",
    "shape.outputTokens": "--output-tokens",
    "shape.samples": "--shape-samples",
    "shape.windowSeconds": "--shape-window",
    "limits.maxPreemptionsPerRequest": "--max-preemptions-per-request",
    "limits.maxWaiting": "--max-waiting",
    "limits.ttftP95Seconds": "--ttft-p95",
    "limits.tpotP95Seconds": "--tpot-p95",
    "limits.stopPreemptions": "--stop-preemptions",
    "limits.stopWaiting": "--stop-waiting",
}


def probe_flag_type(option: str) -> Bounded:
    """The argparse type ``vllm-headroom probe`` reads ``option`` with."""
    subparsers = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    parser = subparsers.choices["probe"]
    action = next(a for a in parser._actions if option in a.option_strings)
    assert isinstance(action.type, Bounded), option
    return action.type


def test_every_number_value_is_passed_to_a_flag_the_table_names() -> None:
    """NUMBER_VALUES is the template's list: a new number value needs its range checked here."""
    template = (CHART / "templates" / "_probe.tpl").read_text()
    for path, option in NUMBER_VALUES.items():
        assert f"$p.{path}" in template, path
        assert f'"{option}"' in template, option


@pytest.mark.parametrize(("path", "option"), NUMBER_VALUES.items())
def test_the_schema_takes_exactly_what_the_probe_flag_takes(path: str, option: str) -> None:
    """A value the schema accepts is never refused by the Job's probe, and the reverse.

    Otherwise ``helm install`` succeeds and the Job fails on its first line, after the release
    looked healthy (a drainSeconds of 0, a shape.samples past the probe's cap).
    """
    bounded = probe_flag_type(option)
    schema = json.loads((CHART / "values.schema.json").read_text())
    node = schema["properties"]["probe"]
    for key in path.split("."):
        node = node["properties"][key]
    kinds = {node["type"]} if isinstance(node["type"], str) else set(node["type"])
    assert kinds - {"null"} == ({"integer"} if bounded.whole else {"number"})
    if bounded.above:
        assert (node.get("exclusiveMinimum"), node.get("minimum")) == (bounded.low, None)
    else:
        assert (node.get("minimum"), node.get("exclusiveMinimum")) == (bounded.low, None)
    assert node.get("maximum") == bounded.high


# ================================================================================ rendering


@pytest.mark.e2e
@pytest.mark.parametrize("values", ["vllm", "vllm-uuids", "sidecar", "fleet"])
def test_no_probe_unless_enabled(helm: Path, values: str) -> None:
    """Off by default: no Job, no claim, in every shape."""
    manifests = render(helm, ci(values))
    assert not of_kind(manifests, "Job")
    assert not [m for m in of_kind(manifests, "PersistentVolumeClaim") if "probe" in str(m)]
    assert load_yaml(CHART / "values.yaml")["probe"]["enabled"] is False


@pytest.mark.e2e
def test_the_job_probes_the_releases_own_service_with_the_sidecars_image(helm: Path) -> None:
    """The Job targets the vLLM Service's port with the exporter image, the built-in client."""
    manifests = render(helm, sets=ENABLED)
    service = only(manifests, "Service")
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "http"]
    args = cli_args(manifests)
    assert args[0] == "probe"
    assert (
        flag(args, "--target")
        == (f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port}")
        == SERVICE_URL
    )
    assert flag(args, "--client") == "builtin"
    assert "--json" in args
    # The refusal of a target serving traffic stays on unless asked.
    assert "--i-know-this-sends-load" not in args
    sidecar = container(sidecar_pod(manifests), "vllm-headroom")
    spec = job(manifests)["spec"]["template"]["spec"]
    for item in [*spec["initContainers"], *spec["containers"]]:
        assert item["image"] == sidecar["image"], item["name"]
        assert item["imagePullPolicy"] == sidecar["imagePullPolicy"]
    (wait,) = spec["initContainers"]
    assert wait["args"][1:] == [f"{SERVICE_URL}/health", "1800"]


@pytest.mark.e2e
def test_the_jobs_args_are_the_values(helm: Path, full_values: Path) -> None:
    """Every probe value becomes its flag, and the CLI parses them back to the same values."""
    manifests = render(helm, full_values)
    args = cli_args(manifests)
    parsed = build_parser().parse_args(args)
    assert parsed.target == SERVICE_URL
    assert parsed.confirmed is True
    assert parsed.mode == "rate"
    assert parsed.levels == "0.5,1,2.5,4"
    assert (parsed.step_seconds, parsed.settle_seconds, parsed.past_knee) == (20, 5, 2)
    assert (parsed.max_duration, parsed.max_requests, parsed.drain_seconds) == (600, 2000, 30)
    assert (parsed.baseline_requests, parsed.seed) == (5, 7)
    assert (parsed.model, parsed.max_num_seqs) == ("qwen", 64)
    assert parsed.shape_from == "http://vllm.prod.svc:8000"
    assert (parsed.shape_window, parsed.shape_samples) == (300, 100)
    assert parsed.prompt_tokens is None
    assert parsed.output_tokens is None
    assert (parsed.max_preemptions_per_request, parsed.max_waiting) == (0.05, 1)
    assert (parsed.ttft_p95, parsed.tpot_p95) == (2, 0.1)
    assert (parsed.stop_preemptions, parsed.stop_waiting) == (40, 20)
    assert parsed.client == "builtin"
    assert parsed.json is True
    assert parsed.report == f"/reports/{POD_NAME}.html"
    # The command's own checks of its flags (run before any request) pass too.
    probe_command._check_flags(parsed)
    plan = probe_command._plan(parsed)
    assert plan.levels == (0.5, 1, 2.5, 4)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "sets",
    [
        ENABLED,
        (*ENABLED, "--set probe.mode=concurrency", "--set probe.levels={1,2,4,8}"),
        (
            MODEL,
            "--set probe.enabled=true",
            "--set probe.shape.promptTokens=1500",
            "--set probe.shape.outputTokens=300",
            "--set probe.report.format=png",
            "--set vllm.args={--max-num-seqs=32}",
        ),
        (*ENABLED, "--set probe.shape.windowSeconds=600", "--set probe.limits.maxWaiting=0"),
    ],
    ids=["defaults", "concurrency", "explicit-lengths-png", "window"],
)
def test_every_rendered_command_line_is_accepted_by_the_cli(
    helm: Path, sets: tuple[str, ...]
) -> None:
    """The real parser and the command's flag checks accept what the chart renders."""
    args = cli_args(render(helm, sets=sets))
    parsed = build_parser().parse_args(args)
    probe_command._check_flags(parsed)
    probe_command._plan(parsed)


@pytest.mark.e2e
def test_max_num_seqs_follows_vllms_args(helm: Path) -> None:
    """--max-num-seqs comes from vllm.args (both spellings) unless probe.maxNumSeqs says."""
    for spelling in ("{--max-num-seqs,48}", "{--max-num-seqs=48}"):
        args = cli_args(render(helm, sets=(*ENABLED, f"--set vllm.args={spelling}")))
        assert flag(args, "--max-num-seqs") == "48"
    args = cli_args(
        render(
            helm, sets=(*ENABLED, "--set vllm.args={--max-num-seqs,48}", "--set probe.maxNumSeqs=8")
        )
    )
    assert flag(args, "--max-num-seqs") == "8"
    assert "--max-num-seqs" not in cli_args(render(helm, sets=ENABLED))


@pytest.mark.e2e
def test_the_job_is_bounded_and_never_retried(helm: Path) -> None:
    """backoffLimit 0, a deadline above the sweep's bounds, bounded resources, no GPU."""
    manifests = render(helm, sets=ENABLED)
    spec = job(manifests)["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # Wait for vLLM 1800 + the sweep 900 + its drain 60 + 300.
    assert spec["activeDeadlineSeconds"] == 3060
    assert "ttlSecondsAfterFinished" not in spec
    for item in [
        *spec["template"]["spec"]["initContainers"],
        *spec["template"]["spec"]["containers"],
    ]:
        resources = item["resources"]
        for part in ("requests", "limits"):
            assert set(resources[part]) == {"cpu", "memory"}, item["name"]
    bounded = job(
        render(
            helm,
            sets=(
                *ENABLED,
                "--set probe.activeDeadlineSeconds=1200",
                "--set probe.ttlSecondsAfterFinished=86400",
                "--set probe.waitForVllmSeconds=60",
            ),
        )
    )["spec"]
    assert (bounded["activeDeadlineSeconds"], bounded["ttlSecondsAfterFinished"]) == (1200, 86400)
    assert (
        job(render(helm, sets=(*ENABLED, "--set probe.waitForVllmSeconds=60")))["spec"][
            "activeDeadlineSeconds"
        ]
        == 60 + 900 + 60 + 300
    )


@pytest.mark.e2e
def test_the_job_is_locked_down_like_the_sidecar(helm: Path) -> None:
    """Non-root 65533 (the sidecar's), read-only root, no capabilities, seccomp, no SA token."""
    manifests = render(helm, sets=ENABLED)
    pod = job(manifests)["spec"]["template"]["spec"]
    sidecar = container(sidecar_pod(manifests), "vllm-headroom")
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for item in [*pod["initContainers"], *pod["containers"]]:
        security = item["securityContext"]
        assert security == sidecar["securityContext"], item["name"]
        assert security["runAsUser"] == 65533
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork")
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    # Writable only where it writes: the reports and /tmp.
    mounts = {m["mountPath"] for m in container(pod, "probe")["volumeMounts"]}
    assert mounts == {"/reports", "/tmp"}


@pytest.mark.e2e
def test_reports_go_to_an_emptydir_and_the_log_without_persistence(helm: Path) -> None:
    """Without persistence the reports volume is an emptyDir and no claim is rendered."""
    manifests = render(helm, sets=ENABLED)
    volumes = {v["name"]: v for v in job(manifests)["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["reports"]
    assert not of_kind(manifests, "PersistentVolumeClaim")
    script = probe_container(manifests)["command"][2]
    assert 'cat "${json}"' in script


@pytest.mark.e2e
def test_reports_persist_on_a_new_claim_kept_after_the_release(helm: Path) -> None:
    """persistence.enabled: the chart's claim (kept on uninstall) is mounted at the reports."""
    manifests = render(
        helm,
        sets=(
            *ENABLED,
            "--set probe.report.persistence.enabled=true",
            "--set probe.report.persistence.size=5Gi",
            "--set probe.report.persistence.storageClassName=standard",
        ),
    )
    claim = only(manifests, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == f"{RELEASE}-vllm-headroom-probe-reports"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "standard"
    volumes = {v["name"]: v for v in job(manifests)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["reports"]["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    for manifest in manifests:
        validate_manifest(manifest)


@pytest.mark.e2e
def test_reports_persist_on_an_existing_claim(helm: Path) -> None:
    """persistence.existingClaim: mounted, and no claim rendered."""
    manifests = render(
        helm,
        sets=(
            *ENABLED,
            "--set probe.report.persistence.enabled=true",
            "--set probe.report.persistence.existingClaim=reports",
        ),
    )
    assert not of_kind(manifests, "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in job(manifests)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["reports"]["persistentVolumeClaim"] == {"claimName": "reports"}


@pytest.mark.e2e
@pytest.mark.parametrize(
    "sets",
    [
        ENABLED,
        (
            *ENABLED,
            "--set probe.report.persistence.enabled=true",
            "--set networkPolicy.enabled=true",
        ),
        (
            *ENABLED,
            "--set probe.ttlSecondsAfterFinished=3600",
            "--set probe.nodeSelector.pool=cpu",
            "--set probe.image.repository=registry.example/vllm-headroom-report",
            "--set probe.image.tag=0.1.0",
        ),
    ],
    ids=["defaults", "persistence-policy", "ttl-image-node"],
)
def test_every_probe_variant_validates(helm: Path, sets: tuple[str, ...]) -> None:
    """Every object of each probe variant validates against Kubernetes' schemas (strict)."""
    manifests = render(helm, sets=sets)
    assert of_kind(manifests, "Job")
    for manifest in manifests:
        validate_manifest(manifest)


@pytest.mark.e2e
def test_the_full_values_validate(helm: Path, full_values: Path) -> None:
    """The values file giving every probe value renders valid objects."""
    for manifest in render(helm, full_values):
        validate_manifest(manifest)


@pytest.mark.e2e
def test_an_image_of_its_own_for_the_probe(helm: Path) -> None:
    """probe.image, when given, replaces the sidecar's image in the Job only."""
    manifests = render(
        helm,
        sets=(
            *ENABLED,
            "--set probe.image.repository=registry.example/vllm-headroom-report",
            "--set probe.image.tag=0.1.0-report",
            "--set probe.image.pullPolicy=Always",
        ),
    )
    probe = probe_container(manifests)
    assert probe["image"] == "registry.example/vllm-headroom-report:0.1.0-report"
    assert probe["imagePullPolicy"] == "Always"
    assert container(sidecar_pod(manifests), "vllm-headroom")["image"] != probe["image"]


@pytest.mark.e2e
def test_the_jobs_name_follows_what_it_runs(helm: Path) -> None:
    """A changed probe value or run makes a new Job (no immutable-field upgrade); others do not."""

    def name(*extra: str) -> str:
        return str(job(render(helm, sets=(*ENABLED, *extra)))["metadata"]["name"])

    first = name()
    assert first.startswith(f"{RELEASE}-vllm-headroom-probe-")
    assert len(first) <= 63
    assert (
        name(
            "--set podMonitor.enabled=true", "--set podMonitor.labels.a=b", "--set vllm.replicas=1"
        )
        == first
    )
    assert name("--set probe.stepSeconds=10") != first
    assert name("--set probe.run=2") != first


@pytest.mark.e2e
def test_a_network_policy_lets_the_probe_reach_vllm(helm: Path) -> None:
    """With vLLM's port restricted, the policy admits the probe's pod to it."""
    manifests = render(
        helm,
        sets=(
            *ENABLED,
            "--set networkPolicy.enabled=true",
            "--set networkPolicy.vllmFrom[0].podSelector.matchLabels.app=gateway",
        ),
    )
    _, vllm = only(manifests, "NetworkPolicy")["spec"]["ingress"]
    pod_labels = job(manifests)["spec"]["template"]["metadata"]["labels"]
    selectors = [
        peer["podSelector"]["matchLabels"] for peer in vllm["from"] if "podSelector" in peer
    ]
    assert any(
        s.items() <= pod_labels.items() and s.get("app.kubernetes.io/component") == "probe"
        for s in selectors
    )


BAD_VALUES = [
    (("--set shape=sidecar", "--set sidecar.podSelector.app=v"), "needs shape=vllm"),
    (
        (
            "--set shape=fleet",
            "--set fleet.allowlist={10.0.0.0/8}",
            "--set fleet.discovery.kind=none",
        ),
        "needs shape=vllm",
    ),
    (("--set vllm.replicas=2",), "needs one vLLM replica"),
    (("--set autoscaling.kind=keda",), "needs one vLLM replica"),
    (("--set vllm.apiKey.secretName=key",), "sends no API key"),
    (("--set probe.shape.fromTarget=false",), "needs a traffic shape"),
    (("--set probe.shape.promptTokens=100",), "promptTokens and outputTokens together"),
    (("--set probe.shape.from=http://prod:8000",), "give one traffic shape"),
    (
        ("--set probe.mode=concurrency", "--set-json probe.levels=[1,2.5]"),
        "whole numbers of requests",
    ),
    (("--set probe.activeDeadlineSeconds=600",), "is below probe.maxDurationSeconds"),
    (("--set probe.shape.from=prod:8000",), "probe.shape.from"),
    (("--set probe.report.format=pdf",), "probe.report.format"),
    (("--set probe.resources.limits=null",), "probe.resources"),
    (("--set probe.stepSeconds=0",), "probe.stepSeconds"),
    # past 2**63 Helm renders a whole float as -9223372036854775808: a negative deadline, a
    # level the probe refuses; past 2**53 it is not the number given
    (("--set-json probe.waitForVllmSeconds=1e20",), "probe.waitForVllmSeconds"),
    (("--set-json probe.levels=[1e20]",), "probe.levels"),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("sets", "message"), BAD_VALUES)
def test_invalid_probe_values_fail_at_render_time_in_one_line(
    helm: Path, sets: tuple[str, ...], message: str
) -> None:
    """Combinations the Job cannot run are refused by a one-line fail or the schema."""
    error = render_error(helm, sets=(*ENABLED, *sets))
    assert message in error, error
    if "execution error" in error:
        (line,) = [line for line in error.splitlines() if "execution error" in line]
        assert message in line


# ================================================================================ running it


def job_probe(helm: Path, *sets: str) -> dict[str, Any]:
    """The probe container the chart renders for a 2-then-4-client sweep of 100-token prompts."""
    manifests = render(
        helm,
        sets=(
            MODEL,
            "--set probe.enabled=true",
            "--set probe.shape.promptTokens=100",
            "--set probe.mode=concurrency",
            "--set probe.levels={2,4}",
            "--set probe.baselineRequests=1",
            *sets,
        ),
    )
    return probe_container(manifests)


def simulated_vllm() -> SimCompletionsServer:
    """The simulated vLLM the Job's command runs against: 128 usable blocks of 16 tokens."""
    return SimCompletionsServer(
        Scenario(
            engine=SimEngineConfig(
                block_size=16, max_model_len=1024, kv_cache_memory_bytes=129 * 16 * 131_072
            )
        ),
        speed=4.0,
    )


def job_args(probe: dict[str, Any], url: str) -> list[str]:
    """The probe container's args with the vLLM Service's URL replaced by ``url``."""
    return [url if arg == SERVICE_URL else arg for arg in probe["args"]]


def job_env(reports: Path) -> dict[str, str]:
    """The environment the Job gives the container, with this Python's vllm-headroom first."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "POD_NAME": POD_NAME,
        "REPORT_DIR": str(reports),
    }


@pytest.mark.e2e
def test_the_rendered_command_runs_the_probe_and_keeps_its_report(
    helm: Path, tmp_path: Path
) -> None:
    """The Job's command line, run as is against the simulated vLLM, keeps the JSON and logs it."""
    probe = job_probe(
        helm,
        "--set probe.shape.outputTokens=156",
        "--set probe.stepSeconds=2",
        "--set probe.settleSeconds=0",
        "--set probe.maxDurationSeconds=60",
    )
    reports = tmp_path / "reports"
    reports.mkdir()
    with simulated_vllm() as sim:
        url = sim.url
        done = subprocess.run(
            [*probe["command"], *job_args(probe, url)],
            capture_output=True,
            text=True,
            check=False,
            env=job_env(reports),
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    saved = reports / f"{POD_NAME}.json"
    document = json.loads(saved.read_text())
    assert document["target"]["url"] == url
    assert document["levels"] == [2, 4]
    # The log (stdout) is the same document: kubectl logs keeps it without a volume.
    assert json.loads(done.stdout) == document
    assert "exit 0" in done.stderr
    assert str(saved) in done.stderr


@pytest.mark.e2e
def test_sigterm_to_the_jobs_shell_reaches_the_probe_which_reports(
    helm: Path, tmp_path: Path
) -> None:
    """Kubernetes stops a Job with SIGTERM to PID 1, the shell: it passes it on.

    The probe then cancels its requests and reports what it measured (interrupted), and the
    shell keeps the report and exits with the probe's 143, before the pod's grace period ends.
    """
    probe = job_probe(
        helm,
        "--set probe.shape.outputTokens=600",
        "--set probe.stepSeconds=60",
        "--set probe.maxDurationSeconds=600",
    )
    reports = tmp_path / "reports"
    reports.mkdir()
    with simulated_vllm() as sim:
        shell = subprocess.Popen(
            [*probe["command"], *job_args(probe, sim.url)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**job_env(reports), "PYTHONUNBUFFERED": "1"},
        )
        assert shell.stderr is not None
        for line in shell.stderr:
            if line.startswith("probe: step 1/"):
                break
        shell.send_signal(signal.SIGTERM)
        out, err = shell.communicate(timeout=30)
        assert sim.running_and_waiting() == (0, 0)
    assert shell.returncode == 143, err
    document = json.loads((reports / f"{POD_NAME}.json").read_text())
    assert document["interrupted"] is True
    assert document["ended"] == "interrupted"
    assert json.loads(out) == document
    assert "exit 143" in err
