"""Reading the vLLM server's command line from ``/proc`` (the shell of :mod:`exporter.vllm.launch`).

In a sidecar the vLLM server shares the pod's process namespace (the same requirement as GPU
discovery). Its command line says the scheduler flags a user gave; several vLLM servers in one
namespace are told apart by ``--port``, matched against the target's port.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from exporter.gpu.visibility import scan_processes, vllm_process_tree
from exporter.vllm.launch import parse_launch_flags

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.vllm.launch import LaunchFlags


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
        candidates = [parse_launch_flags(p.argv) for p in processes if p.pid in roots]
        return choose_launch(candidates, target_port(self.target))
