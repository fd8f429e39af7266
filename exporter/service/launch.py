"""Reading the vLLM server's command line from ``/proc`` (the shell of :mod:`exporter.vllm.launch`).

In a sidecar the vLLM server shares the pod's process namespace (the same requirement as GPU
discovery). Its command line says the scheduler flags a user gave; several vLLM servers in one
namespace are told apart by ``--port``, matched against the target's port. A ``--config`` YAML
file is read through the server's own root and working directory under ``/proc/<pid>``, which
needs the permissions that reading its environment does (the same user, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import yaml

from exporter.boundedread import FileReadError, read_bounded
from exporter.gpu.visibility import scan_processes, vllm_process_tree
from exporter.vllm.launch import config_arguments, parse_launch_flags

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.gpu.visibility import ProcessEntry
    from exporter.vllm.launch import LaunchFlags

#: A vLLM config file is a few lines; anything larger is not read.
MAX_CONFIG_BYTES = 1024 * 1024
#: Time allowed to read it (a file on a stalled mount must not hold the files thread).
CONFIG_TIMEOUT_S = 2.0


def target_port(url: str) -> int | None:
    """The port of a target URL (80/443 when the URL names none); None when unreadable."""
    try:
        parts = urlsplit(url)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def choose_launch(candidates: list[LaunchFlags], port: int | None) -> LaunchFlags | None:
    """The server listening on ``port``, else the only one, else None.

    With one server and no port match it is still the one (a Service in front may map another
    port to vLLM's); with several and no single match, which one is the target cannot be told.
    """
    matching = [flags for flags in candidates if port is not None and flags.listen_port == port]
    if len(matching) == 1:
        return matching[0]
    if not matching and len(candidates) == 1:
        return candidates[0]
    return None


@dataclass(frozen=True, slots=True)
class ProcessLaunchSource:
    """The flags of the vLLM server behind ``target``, from the process table in ``proc_root``."""

    proc_root: Path
    target: str

    def read(self) -> LaunchFlags | None:
        """Blocking ``/proc`` reads (run in a thread). None when no vLLM server is visible."""
        processes = scan_processes(self.proc_root)
        roots = set(vllm_process_tree(processes, exclude=os.getpid()).roots)
        servers = [p for p in processes if p.pid in roots]
        candidates = [parse_launch_flags(p.argv) for p in servers]
        chosen = choose_launch(candidates, target_port(self.target))
        if chosen is None or chosen.config_file is None:
            return chosen
        process = servers[next(i for i, c in enumerate(candidates) if c is chosen)]
        config, problem = self._read_config(process, chosen.config_file)
        return parse_launch_flags(process.argv, config=config, config_problem=problem)

    def _read_config(self, process: ProcessEntry, name: str) -> tuple[list[str], str | None]:
        """The config file's flags, or why they could not be read."""
        base = self.proc_root / str(process.pid)
        path = base / "root" / name.lstrip("/") if name.startswith("/") else base / "cwd" / name
        try:
            # Bounded in size and time, regular files only: a FIFO would block the thread.
            text = read_bounded(
                path, max_bytes=MAX_CONFIG_BYTES, timeout_s=CONFIG_TIMEOUT_S, regular_only=True
            )
        except FileReadError as exc:
            if exc.too_large:
                return [], f"larger than {MAX_CONFIG_BYTES} bytes"
            return [], f"cannot read it ({exc})"
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            return [], f"not YAML ({str(exc).splitlines()[0]})"
        except RecursionError:
            return [], "not YAML (nested too deeply)"
        words = config_arguments(document)
        if words is None:
            return [], "not a mapping of flags"
        return words, None
