"""A cluster's policy scanner passes: checkov over every shape, a recipe and the Dockerfile.

checkov 3.3.30 runs from its own cached virtual environment (``scripts/e2e/install-checkov.sh``,
which ``make deps`` runs; missing, these tests fail in CI and skip elsewhere), offline
(``--skip-download``: no Prisma Cloud). One run scans every case: each chart rendering in a
namespace of its own, so that checkov's graph checks (a NetworkPolicy selecting a pod) never
match objects of another case, plus the plain Deployment recipe and the Dockerfile.

A finding the chart keeps on purpose carries checkov's skip annotation on its object
(``checkov.io/skipN: CKV_..=reason``; ``# checkov:skip=`` in the Dockerfile), rendered only while
the finding holds and naming the value that removes it. The scan must report no failure at all,
and every skip must have a reason and be listed in docs/kubernetes.md ("Policy scanners"), which
lists nothing else.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from tests.test_helm import (
    CHART,
    CI_VALUES,
    DOCKERFILE,
    REPO,
)

if TYPE_CHECKING:
    from pathlib import Path

DOCS = REPO / "docs" / "kubernetes.md"
PLAIN_RECIPE = REPO / "helm" / "examples" / "plain-deployment"

#: Every shape of the chart, as the ci values and the bare defaults render it, and the variants
#: whose objects differ in what checkov checks: (case name, values files, --set flags).
CASES: list[tuple[str, tuple[Path, ...], tuple[str, ...]]] = [
    *((path.stem, (path,), ()) for path in CI_VALUES),
    ("vllm-defaults", (), ("--set", "vllm.model=Qwen/Qwen3-0.6B")),
    (
        "vllm-hardened",
        (),
        (
            *("--set", "vllm.model=Qwen/Qwen3-0.6B", "--set", "networkPolicy.enabled=true"),
            *("--set", "vllm.podDisruptionBudget.enabled=true", "--set", "vllm.replicas=2"),
            *("--set", f"exporter.image.digest=sha256:{'0' * 64}"),
            *("--set", f"vllm.image.digest=sha256:{'1' * 64}"),
            *("--set", "exporter.image.pullPolicy=Always", "--set", "vllm.image.pullPolicy=Always"),
            *("--set", "vllm.resources.limits.cpu=8", "--set", "tests.enabled=false"),
        ),
    ),
    (
        "vllm-autoscaling",
        (),
        (
            *("--set", "vllm.model=Qwen/Qwen3-0.6B", "--set", "autoscaling.kind=hpa"),
            *("--set", "prometheusRule.labels.release=kube-prometheus-stack"),
        ),
    ),
    (
        "vllm-probe",
        (),
        (
            *("--set", "vllm.model=Qwen/Qwen3-0.6B", "--set", "probe.enabled=true"),
            *("--set", "probe.shape.fromTarget=true"),
            *("--set", "probe.report.persistence.enabled=true"),
        ),
    ),
    ("sidecar-defaults", (), ("--set", "shape=sidecar", "--set", "sidecar.podSelector.app=vllm")),
    (
        "fleet-defaults",
        (),
        (
            *("--set", "shape=fleet", "--set", "fleet.allowlist={10.0.0.0/8}"),
            *("--set", "fleet.discovery.kind=none"),
        ),
    ),
]


def scan(helm: Path, checkov: Path, workdir: Path) -> dict[str, dict[str, Any]]:
    """checkov's JSON report per framework, over every case (rendered into ``workdir``)."""
    for number, (name, values, sets) in enumerate(CASES):
        args = [str(helm), "template", "rel", str(CHART), "--namespace", f"case{number}"]
        for path in values:
            args += ["--values", str(path)]
        done = subprocess.run(
            [*args, *sets], capture_output=True, text=True, check=False, timeout=120
        )
        assert done.returncode == 0, done.stderr
        (workdir / f"{name}.yaml").write_text(done.stdout)
    # The plain recipe as applied: its Deployment and the chart's objects for it (its policy).
    shutil.copy(PLAIN_RECIPE / "deployment.yaml", workdir / "recipe-plain-deployment.yaml")
    done = subprocess.run(
        [
            *(str(helm), "template", "llama3-headroom", str(CHART), "--namespace", "inference"),
            *("--values", str(PLAIN_RECIPE / "headroom-values.yaml")),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (workdir / "recipe-plain-headroom.yaml").write_text(done.stdout)
    shutil.copy(DOCKERFILE, workdir / "Dockerfile")
    done = subprocess.run(
        [
            *(str(checkov), "--directory", str(workdir), "--framework", "kubernetes", "dockerfile"),
            *("--skip-download", "--output", "json", "--compact"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    # checkov exits 1 when something fails; the report says what, and is checked below.
    assert done.returncode in {0, 1}, done.stderr[-3000:]
    reports = json.loads(done.stdout)
    return {report["check_type"]: report for report in reports}


@pytest.fixture(scope="module")
def reports(
    helm: Path, checkov: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """The one checkov run of this module."""
    return scan(helm, checkov, tmp_path_factory.mktemp("checkov"))


def documented_skips() -> dict[str, str]:
    """The table of docs/kubernetes.md's "Policy scanners" section: check id -> where."""
    section = DOCS.read_text().split("### Policy scanners", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(CKV2?_[A-Z0-9]+_[0-9]+)` \| ([^|]+) \|", section, re.MULTILINE)
    assert rows, section
    return dict(rows)


@pytest.mark.e2e
def test_checkov_finds_nothing_unskipped(reports: dict[str, dict[str, Any]]) -> None:
    """No rendered shape, recipe or the Dockerfile has a finding without a skip and its reason."""
    assert set(reports) == {"kubernetes", "dockerfile"}
    for report in reports.values():
        summary = report["summary"]
        assert summary["parsing_errors"] == 0, summary
        failed = [
            f"{f['check_id']} {f['file_path']} {f['resource']}: {f['check_name']}"
            for f in report["results"]["failed_checks"]
        ]
        assert not failed, "\n".join(failed)
    # Everything was scanned: each case's workloads, the recipe and the Dockerfile.
    files = {r["file_path"] for r in reports["kubernetes"]["results"]["passed_checks"]}
    expected = {f"/{name}.yaml" for name, _, _ in CASES if "sidecar" not in name}
    assert expected | {"/recipe-plain-deployment.yaml"} <= files
    assert reports["dockerfile"]["summary"]["passed"] > 50


@pytest.mark.e2e
def test_every_skip_has_a_reason_and_is_documented(reports: dict[str, dict[str, Any]]) -> None:
    """Each skipped check carries a reason, and docs/kubernetes.md lists exactly those checks."""
    skipped = [s for r in reports.values() for s in r["results"].get("skipped_checks", [])]
    assert skipped
    for skip in skipped:
        reason = skip["check_result"].get("suppress_comment", "")
        assert len(reason) > 20, skip
    assert {s["check_id"] for s in skipped} == set(documented_skips())


@pytest.mark.e2e
def test_a_hardened_rendering_needs_fewer_skips(reports: dict[str, dict[str, Any]]) -> None:
    """Skips follow the values: pinned digests, Always, a CPU limit and the policy remove theirs."""
    skipped = {
        s["check_id"]
        for s in reports["kubernetes"]["results"]["skipped_checks"]
        if s["file_path"] == "/vllm-hardened.yaml"
    }
    assert skipped == {"CKV_K8S_9"}, skipped


@pytest.mark.e2e
def test_checkov_fails_what_the_skips_do_not_cover(
    helm: Path, checkov: Path, tmp_path: Path
) -> None:
    """Without its skip annotations the vLLM Deployment fails: the scan is not blind."""
    rendered = subprocess.run(
        [str(helm), "template", "rel", str(CHART), "--set", "vllm.model=m", "-n", "bare"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "bare.yaml").write_text(re.sub(r"(?m)^\s*checkov\.io/skip\d+: .*\n", "", rendered))
    done = subprocess.run(
        [
            *(str(checkov), "--file", str(tmp_path / "bare.yaml"), "--framework", "kubernetes"),
            *("--skip-download", "--output", "json", "--compact", "--quiet"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    failed = {f["check_id"] for f in json.loads(done.stdout)["results"]["failed_checks"]}
    assert {"CKV_K8S_9", "CKV_K8S_11", "CKV_K8S_43"} <= failed, failed
