"""The image is real: the Dockerfile built with podman, its own entrypoint run against real vLLM.

``scripts/image/build.sh`` builds the repository's Dockerfile with ``podman build --isolation
chroot --format docker`` on a base it makes with debootstrap (the Debian release of the
Dockerfile's default base, plus Python: no registry needed) and reuses the image while its inputs
are unchanged (about a minute cold, a fraction of a second warm). ``podman run`` is not permitted
on these machines (crun cannot set RLIMIT_NOFILE), so the test does a runtime's job by hand:
``podman create`` + ``podman mount`` give the container's root filesystem, and the image's own
ENTRYPOINT + CMD run in a chroot of it as the image's USER (65532:65532) with the image's ENV, in
sidecar mode against the session's real vLLM (on the host's network, as a pod shares one).

Root only (debootstrap, podman's storage, chroot): for any other user the module skips with that
reason, under CI too; CI runs as root and runs it. Root without podman or debootstrap fails under
``CI=true`` and skips elsewhere, naming the install command, like every e2e tool.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from exporter.testing.processes import wait_until
from tests.e2e.harness import (
    REPO_ROOT,
    MissingResourceError,
    ProcessGroup,
    cache_config_labels,
    free_port,
    loopback_client,
    sample_value,
)
from tests.tools import require

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.e2e.harness import VllmServer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (debootstrap, podman)")

BUILD = REPO_ROOT / "scripts" / "image" / "build.sh"
TOOLS_INSTALL = "bash scripts/image/install-tools.sh  (or: make deps, as root)"
#: A cold build: debootstrap (about 45 s here), the import and the build (about 10 s).
BUILD_TIMEOUT_S = 900
#: The image's user: the chart's runAsUser / runAsGroup.
IMAGE_USER = "65532:65532"
#: Where an unprivileged process may write in any Debian root filesystem (sticky, 1777).
STICKY_DIRS = {"tmp", "var/tmp", "run/lock", "dev/shm"}


@dataclass(frozen=True, slots=True)
class Image:
    """A built image: its reference and its config (``podman image inspect``'s ``Config``)."""

    ref: str
    config: dict[str, Any]
    #: HEALTHCHECK (podman reports it beside Config; kept only in the docker format).
    healthcheck: dict[str, Any]
    manifest_type: str

    @property
    def env(self) -> dict[str, str]:
        """The image's ENV as a mapping."""
        return dict(item.split("=", 1) for item in self.config.get("Env") or [])


def _tool(name: str) -> str:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    found = shutil.which(name, path=path)
    if found is None:
        raise MissingResourceError(name, TOOLS_INSTALL)
    return found


def _image_tools() -> dict[str, str]:
    return {name: _tool(name) for name in ("podman", "debootstrap", "chroot")}


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True, **kwargs)


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    """podman, debootstrap and chroot (fails in CI / skips locally when absent)."""
    return require(_image_tools)


@pytest.fixture(scope="module")
def image(tools: dict[str, str], e2e_logs: Path) -> Image:
    """The repository's image, built by scripts/image/build.sh (or reused: same inputs)."""
    log_path = e2e_logs / "image-build.log"
    started = time.monotonic()
    with log_path.open("w") as log:
        done = subprocess.run(
            ["bash", str(BUILD)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        log.write(f"\n[test_image] build.sh took {time.monotonic() - started:.1f}s\n")
    if done.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-8:])
        pytest.fail(f"scripts/image/build.sh failed (exit {done.returncode}):\n{tail}")
    ref = done.stdout.strip().splitlines()[-1]
    [inspected] = json.loads(_run([tools["podman"], "image", "inspect", ref]).stdout)
    return Image(
        ref=ref,
        config=inspected["Config"],
        healthcheck=inspected.get("Healthcheck") or inspected["Config"].get("Healthcheck") or {},
        manifest_type=inspected.get("ManifestType", ""),
    )


@pytest.fixture(scope="module")
def rootfs(tools: dict[str, str], image: Image) -> Iterator[Path]:
    """The root filesystem of a container created from the image, mounted; removed afterwards."""
    podman = tools["podman"]
    container = _run([podman, "create", image.ref]).stdout.strip()
    try:
        mounted = Path(_run([podman, "mount", container]).stdout.strip())
        try:
            yield mounted
        finally:
            _run([podman, "umount", container])
    finally:
        # podman rm logs a harmless error about healthcheck timers when systemd is absent.
        subprocess.run([podman, "rm", "--force", container], capture_output=True, check=False)


def _as_image_user(tools: dict[str, str], rootfs: Path, argv: list[str]) -> list[str]:
    """``argv`` run inside the container's root filesystem as the image's user."""
    return [tools["chroot"], f"--userspec={IMAGE_USER}", str(rootfs), *argv]


@dataclass(frozen=True, slots=True)
class Sidecar:
    """The image's entrypoint running in the chroot: its URL, process and environment."""

    url: str
    group: ProcessGroup
    env: dict[str, str]


@pytest.fixture(scope="module")
def sidecar(
    tools: dict[str, str],
    image: Image,
    rootfs: Path,
    vllm_server: VllmServer,
    e2e_logs: Path,
) -> Iterator[Sidecar]:
    """The image's ENTRYPOINT + CMD as 65532 in the chroot, watching the session's vLLM."""
    port = free_port()
    env = image.env | {
        "HEADROOM_TARGET": vllm_server.base_url,
        "HEADROOM_GPU_DISCOVERY": "none",
        "HEADROOM_LISTEN_ADDRESS": "127.0.0.1",
        "HEADROOM_PORT": str(port),
        "HEADROOM_POLL_INTERVAL_SECONDS": "1",
        "HEADROOM_POLL_TIMEOUT_SECONDS": "1",
    }
    argv = [*image.config["Entrypoint"], *(image.config.get("Cmd") or [])]
    group = ProcessGroup(
        _as_image_user(tools, rootfs, argv), log_path=e2e_logs / "image-sidecar.log", env=env
    )
    with group:
        yield Sidecar(url=f"http://127.0.0.1:{port}", group=group, env=env)


def test_the_image_is_configured_as_the_chart_expects(image: Image, rootfs: Path) -> None:
    """USER 65532, port 8742, the health check (docker format), the entrypoint, Debian's release."""
    config = image.config
    assert config["User"] == IMAGE_USER
    assert "8742/tcp" in config["ExposedPorts"]
    assert config["Entrypoint"] == ["vllm-headroom"]
    assert config["Cmd"] == ["serve"]
    assert config.get("WorkingDir", "/") == "/"
    assert image.manifest_type == "application/vnd.docker.distribution.manifest.v2+json"
    health = image.healthcheck["Test"]
    assert health[0] == "CMD"
    assert "/-/healthy" in " ".join(health)
    # The base is the Debian release of the Dockerfile's default base (python:3.11-slim-<release>).
    release = (REPO_ROOT / "Dockerfile").read_text().split("ARG PYTHON_IMAGE=", 1)[1].split()[0]
    os_release = (rootfs / "etc" / "os-release").read_text()
    assert f"VERSION_CODENAME={release.rsplit('-', 1)[1]}" in os_release.splitlines()


def test_the_entrypoint_serves_real_vllm_metrics_as_65532(
    tools: dict[str, str], image: Image, rootfs: Path, sidecar: Sidecar, vllm_server: VllmServer
) -> None:
    """As 65532 the image's command reports vLLM up and its KV capacity; its health check passes."""
    [cache_config] = cache_config_labels(vllm_server.metrics_text())
    # What vLLM says its KV cache holds (the same figure test_sidecar_e2e.py checks).
    capacity = int(
        cache_config.get("kv_cache_size_tokens")
        or int(cache_config["num_gpu_blocks"]) * int(cache_config["block_size"])
    )
    with loopback_client(sidecar.url) as client:

        def ready() -> str:
            if not sidecar.group.running():
                log = sidecar.group.log_path.read_text().splitlines()[-5:]
                pytest.fail("the image's sidecar exited:\n" + "\n".join(log))
            try:
                text = client.get("/metrics").text
            except httpx.TransportError:
                return ""
            up = sample_value(text, "headroom_target_up")
            return text if up == 1.0 and sample_value(text, "headroom_kv_capacity_tokens") else ""

        try:
            text = wait_until(ready, timeout_s=60, what="the image's sidecar reporting vLLM up")
        except TimeoutError:
            log = sidecar.group.log_path.read_text().splitlines()[-5:]
            pytest.fail("the image's sidecar never reported vLLM up:\n" + "\n".join(log))
    assert sample_value(text, "headroom_kv_capacity_tokens") == float(capacity)
    assert sample_value(text, "headroom_build_info", mode="sidecar") == 1.0

    pid = sidecar.group.pid
    assert pid is not None
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    ids = {line.split(":")[0]: line.split()[1:] for line in status if line[:4] in {"Uid:", "Gid:"}}
    assert ids == {"Uid": ["65532"] * 4, "Gid": ["65532"] * 4}

    # The image's own HEALTHCHECK command (exec form: ["CMD", argv...]), as the runtime runs it.
    health = subprocess.run(
        _as_image_user(tools, rootfs, image.healthcheck["Test"][1:]),
        env=sidecar.env,
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    assert health.returncode == 0, health.stderr


def test_the_root_filesystem_is_not_writable_by_65532(
    tools: dict[str, str], image: Image, rootfs: Path
) -> None:
    """No file of the image belongs to 65532 or is writable by it outside the sticky temp dirs."""
    offenders = []
    for dirpath, dirnames, filenames in os.walk(rootfs):
        here = Path(dirpath)
        if here == rootfs:
            dirnames[:] = [d for d in dirnames if d not in {"proc", "sys", "dev"}]
        for name in dirnames + filenames:
            path = here / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                continue
            relative = path.relative_to(rootfs).as_posix()
            sticky_dir = relative in STICKY_DIRS and info.st_mode & stat.S_ISVTX
            world_writable = info.st_mode & stat.S_IWOTH and not sticky_dir
            group_writable = info.st_gid == 65532 and info.st_mode & stat.S_IWGRP
            if info.st_uid == 65532 or world_writable or group_writable:
                offenders.append(relative)
    assert offenders == []

    # The same seen from inside, as the image's user: the package, its command, /etc and / refuse.
    probe = (
        "import os, exporter\n"
        "for d in (os.path.dirname(exporter.__file__), '/usr/local/bin', '/etc', '/'):\n"
        "    try:\n"
        "        open(os.path.join(d, '.probe'), 'x').close()\n"
        "        print('writable', d)\n"
        "    except PermissionError:\n"
        "        print('refused', d)\n"
    )
    done = _run(_as_image_user(tools, rootfs, ["python", "-c", probe]), env=image.env, timeout=30)
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    assert all(line.startswith("refused ") for line in lines), lines
