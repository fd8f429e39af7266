"""Specification of scripts/sync_chart_files.py: the chart's copies of the dashboards.

``make docs`` runs it so that helm/vllm-headroom/files/ holds real files identical to
dashboards/*.json (its rule file is generated, tests/test_alerts_generate.py); ``--check`` is what
the chart tests assert on the repository. These run it on a small stand-in repository in a
temporary directory.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

SCRIPT = paths.REPO / "scripts" / "sync_chart_files.py"
FILES = "helm/vllm-headroom/files"


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script on ``root`` (``--root``), its output captured."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A stand-in repository: rules, two dashboards, a chart whose files/ has its own note."""
    (tmp_path / "alerts").mkdir()
    (tmp_path / "alerts" / "vllm-headroom.rules.yml").write_text("groups: []\n")
    (tmp_path / "alerts" / "other.yml").write_text("not embedded\n")
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "a.json").write_text('{"uid": "a"}\n')
    (tmp_path / "dashboards" / "b.json").write_text('{"uid": "b"}\n')
    (tmp_path / FILES).mkdir(parents=True)
    (tmp_path / FILES / "notes.txt").write_text("the chart's own\n")
    return tmp_path


def test_sync_writes_real_copies_that_check_accepts(repo: Path) -> None:
    """A sync copies each dashboard, nothing else (no rule file); --check then passes."""
    assert run(repo).returncode == 0
    assert (repo / FILES / "dashboards" / "b.json").read_text() == '{"uid": "b"}\n'
    assert not (repo / FILES / "alerts").exists()
    assert (repo / FILES / "notes.txt").read_text() == "the chart's own\n"
    done = run(repo, "--check")
    assert (done.returncode, done.stderr) == (0, "")


def test_check_names_a_missing_or_different_copy(repo: Path) -> None:
    """--check exits 1 naming a copy that is missing and one that differs, and writes nothing."""
    run(repo)
    (repo / FILES / "dashboards" / "a.json").unlink()
    (repo / FILES / "dashboards" / "b.json").write_text('{"uid": "old"}\n')
    done = run(repo, "--check")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"chart files: {FILES}/dashboards/a.json is missing: run make docs",
        f"chart files: {FILES}/dashboards/b.json differs from its source: run make docs",
    ]
    assert not (repo / FILES / "dashboards" / "a.json").exists()


def test_a_copy_whose_source_is_gone_is_named_then_removed(repo: Path) -> None:
    """A dashboard copy left from a renamed dashboard fails --check; a sync removes it."""
    run(repo)
    (repo / "dashboards" / "b.json").unlink()
    done = run(repo, "--check")
    assert done.returncode == 1
    assert f"{FILES}/dashboards/b.json has no source any more" in done.stderr
    assert run(repo).returncode == 0
    assert not (repo / FILES / "dashboards" / "b.json").exists()
    assert run(repo, "--check").returncode == 0


def test_a_link_in_place_of_copies_is_refused_then_replaced(repo: Path) -> None:
    """Links under files/ fail --check; a sync drops them and copies the dashboards."""
    run(repo)
    for copy_path in (repo / FILES / "dashboards").iterdir():
        copy_path.unlink()
    (repo / FILES / "dashboards").rmdir()
    for name in ("alerts", "dashboards"):
        (repo / FILES / name).symlink_to(f"../../../{name}")
    done = run(repo, "--check")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"chart files: {FILES}/{name} is a link: the chart must hold a real copy: run make docs"
        for name in ("alerts", "dashboards")
    ]
    assert run(repo).returncode == 0
    assert not (repo / FILES / "alerts").exists()
    assert (repo / FILES / "dashboards" / "a.json").read_text() == '{"uid": "a"}\n'
    assert (repo / "alerts" / "other.yml").exists()
    assert run(repo, "--check").returncode == 0


def test_a_missing_source_is_one_line(tmp_path: Path) -> None:
    """Without dashboards the script says which glob matched nothing, exit 2, no traceback."""
    done = run(tmp_path, "--check")
    assert done.returncode == 2
    assert done.stderr.startswith("chart files: error: ")
    assert "dashboards/*.json matches nothing" in done.stderr
    assert "Traceback" not in done.stderr
